"""One immutable parallel layout, and the training job it runs in.

Short field names inside; `search_spaces.megatron_names.megatron_settings(layout)` is the one boundary that maps
them to megatron-core's `TransformerConfig` / `ModelParallelConfig` names.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Literal, TypedDict

from search_spaces.pipeline_layout import (
    LayoutSyntaxError,
    balanced_layout,
    canonical,
    chunk_counts,
    layout_from_chunks,
    mtp_layout,
    parse_stages,
)

if TYPE_CHECKING:
    pass

__all__ = ["Layout", "Recompute", "CudaGraphs", "CUDA_GRAPH_CHOICES", "RECOMPUTE_CHOICES", "PipelineSplit",
           "parse_layout", "pipeline_split_for", "SPLIT_FIELDS", "SWITCH_FIELDS"]

Recompute = Literal["none", "selective", "full"]
RECOMPUTE_CHOICES: tuple[str, ...] = ("none", "selective", "full")
# megatron-core 0.19 `cuda_graph_impl` (transformer_config.py): none; per-layer graphs of megatron-core ("local") or
# Transformer Engine ("transformer_engine", capturing `TrainingSpec.cuda_graph_modules` of each layer); one graph of
# the whole forward-backward ("full_iteration"; 0.16.1 spells it local graphs with the scope ["full_iteration"])
CudaGraphs = Literal["none", "local", "transformer_engine", "full_iteration"]
CUDA_GRAPH_CHOICES: tuple[str, ...] = ("none", "local", "transformer_engine", "full_iteration")



@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """A Megatron-Core parallel layout. `dp` is explicit so that a layout alone says its world size.

    `vpp=None` means no interleaving (megatron-core's default); `etp=None` means ETP = TP
    (megatron-core's default when `expert_tensor_parallel_size` is unset). `first_stage_layers` /
    `last_stage_layers` are megatron-core's uneven pipeline split (`num_layers_in_first_pipeline_stage`,
    `num_layers_in_last_pipeline_stage`); None means an even split (`stage_layer_counts`).
    `embedding_loss_split` turns on both `account_for_embedding_in_pipeline_split` and
    `account_for_loss_in_pipeline_split`: the embedding and the loss count as one layer each.
    `pipeline_layout` is megatron-core's `pipeline_model_parallel_layout` string (`Et|(tt|)*30mL`,
    grammar in `search_spaces/pipeline_layout.py`): it places every layer itself. As in megatron-core's
    `TransformerConfig.__post_init__`, an unset `vpp` is derived from it (stages / PP, None for 1).

    Besides the sizes, the layout holds the switches the search chooses per layout because they trade memory for
    time or change which sizes win (`SWITCH_FIELDS`): SP, the distributed optimizer, recompute, CUDA graphs
    (`cuda_graphs`, megatron-core's `cuda_graph_impl`) and the MoE all-to-all overlap (`ep_overlap`,
    `overlap_moe_expert_parallel_comm`: megatron-core's 1F1B schedule that hides one micro-batch's dispatch and
    combine under another's compute).

    `fsdp` runs the data-parallel dimension as Megatron-FSDP (megatron-core `use_megatron_fsdp` with
    `data_parallel_sharding_strategy="optim_grads_params"`, ZeRO-3: weights, gradients and optimizer state sharded
    over DP x CP, the experts' over the expert-DP group; every layer an FSDP unit whose weights are all-gathered
    before its forward and backward and whose gradients are reduce-scattered after its backward).
    `offload_layers` is megatron-core's layer-level activation offload (`cpu_offloading_num_layers`, Transformer
    Engine's offload context): the saved activations of that many layers go to host memory during the forward and
    come back for the backward; 0 is off.
    """

    tp: int = 1
    pp: int = 1
    vpp: int | None = None
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    dp: int = 1
    mbs: int = 1
    sp: bool = False
    dist_opt: bool = False
    recompute: Recompute = "none"
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    embedding_loss_split: bool = False
    pipeline_layout: str | None = None
    cuda_graphs: CudaGraphs = "none"
    ep_overlap: bool = False
    fsdp: bool = False
    offload_layers: int = 0

    def _layout_stages(self) -> tuple[str, ...] | None:
        """The layout string's stages, or None when there is no string or it does not parse (the rules say why)."""
        if self.pipeline_layout is None:
            return None
        try:
            return parse_stages(self.pipeline_layout)
        except LayoutSyntaxError:
            return None

    def _layout_chunks(self, char: str) -> tuple[int, ...] | None:
        """Per-chunk counts of `char` from the layout string when it parses into a multiple of PP stages."""
        stages = self._layout_stages()
        if stages is None or len(stages) % self.pp:
            return None
        return chunk_counts(self.pipeline_layout, char)  # type: ignore[arg-type]

    def __post_init__(self) -> None:
        """Each field of the right type and range (ValueError in the rules' wording): sizes are whole numbers
        >= 1, the optional ones None or >= 1, the switches booleans, recompute one of its choices."""
        for name in _SIZE_FIELDS:
            value = getattr(self, name)
            if type(value) is not int or value <= 0:  # the common case costs one test per field
                _check_size(name, value, optional=name in _OPTIONAL_FIELDS)
        for name in _BOOL_FIELDS:
            if type(getattr(self, name)) is not bool:
                raise ValueError(f"layout field {name!r} must be true or false, but got {getattr(self, name)!r}.")
        if type(self.offload_layers) is not int or self.offload_layers < 0:
            raise ValueError(f"layout field 'offload_layers' must be a whole number >= 0 (0: no offload), but got "
                             f"{self.offload_layers!r}.")
        if self.recompute not in RECOMPUTE_CHOICES:
            raise ValueError(f"layout field 'recompute' must be one of {RECOMPUTE_CHOICES}, but got "
                             f"{self.recompute!r}.")
        if self.cuda_graphs not in CUDA_GRAPH_CHOICES:
            raise ValueError(f"layout field 'cuda_graphs' must be one of {CUDA_GRAPH_CHOICES}, but got "
                             f"{self.cuda_graphs!r}.")
        if self.pipeline_layout is not None and not isinstance(self.pipeline_layout, str):
            raise ValueError(f"pipeline_layout must be a string (megatron-core's pipeline_model_parallel_layout), "
                             f"but got {self.pipeline_layout!r}.")
        if self.pipeline_layout is not None:
            # one spelling per split (`Etttt|tttt|tmL` and `Et*4|tttt|tmL` are one layout): the string is kept in
            # `compress`'s form; one megatron-core cannot parse stays as given (the rules say why)
            try:
                object.__setattr__(self, "pipeline_layout", canonical(self.pipeline_layout))
            except LayoutSyntaxError:
                pass
        if self.pipeline_layout is not None and self.vpp is None:  # megatron-core derives VPP from the string
            stages = self._layout_stages()
            if stages is not None and len(stages) % self.pp == 0 and len(stages) > self.pp:
                object.__setattr__(self, "vpp", len(stages) // self.pp)

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def expert_dp(self) -> int:
        """Expert data-parallel size (parallel folding): world / (PP * EP * ETP), floored."""
        return (self.tp * self.cp * self.dp) // (self.ep * self.expert_tp)

    @property
    def vpp_size(self) -> int:
        return self.vpp or 1

    def stage_layer_counts(self, num_layers: int) -> tuple[int, ...]:
        """Transformer layers on each of the PP physical stages, as megatron-core places them.

        Even: num_layers / PP each. Uneven (`transformer_config.py`, "Uneven PP"): the first and/or last stage
        take the given counts and the middle stages share the rest equally. For a layout the rules reject
        (a remainder), the rest is spread one extra layer per stage from the first middle stage on, so that
        callers still get counts that add up to num_layers.
        """
        pp = self.pp
        if self._layout_chunks("t") is not None:
            chunks = self.chunk_layer_counts(num_layers)
            return tuple(sum(chunks[s::pp]) for s in range(pp))
        if pp == 1:
            return (num_layers,)
        if self.embedding_loss_split:
            chunks = self.chunk_layer_counts(num_layers)
            return tuple(sum(chunks[s::pp]) for s in range(pp))
        first, last = self.first_stage_layers, self.last_stage_layers
        middle_stages = pp - (first is not None) - (last is not None)
        rest = num_layers - (first or 0) - (last or 0)
        if middle_stages == 0:
            middle: list[int] = []
        else:
            base, extra = divmod(max(rest, 0), middle_stages)
            middle = [base + (1 if k < extra else 0) for k in range(middle_stages)]
        return tuple(([first] if first is not None else []) + middle + ([last] if last is not None else []))

    def chunk_layer_counts(self, num_layers: int) -> tuple[int, ...]:
        """Layers in each of the PP * VPP model chunks, in model order (chunk c lives on stage c % PP).

        megatron-core splits each stage's layers equally over its VPP chunks (`get_num_layers_to_build`).
        With `pipeline_layout` the counts are the string's `t` per stage (`PipelineParallelLayerLayout
        .get_num_layers_to_build`), whatever they add up to (the rules check that they make num_layers).
        """
        from_layout = self._layout_chunks("t")
        if from_layout is not None:
            return from_layout
        v = self.vpp_size
        if self.embedding_loss_split and self.pp > 1:
            # (L + 2) layers spread evenly over the PP * VPP chunks; the first chunk gives one slot to the
            # embedding and the last chunk one to the loss (`get_num_layers_to_build`).
            n = self.pp * v
            base, extra = divmod(num_layers + 2, n)
            counts = [base + (1 if k < extra else 0) for k in range(n)]
            counts[0] -= 1
            counts[-1] -= 1
            return tuple(counts)
        stages = self.stage_layer_counts(num_layers)
        return tuple(stages[c % self.pp] // v for c in range(self.pp * v))

    def chunk_mtp_counts(self, mtp_layers: int) -> tuple[int, ...]:
        """Multi-token-prediction layers in each model chunk. Without a layout string megatron-core puts
        them all on the last pipeline stage's last virtual chunk (`get_mtp_num_layers_to_build`,
        `transformer/multi_token_prediction.py`); with one, wherever its `m`s are."""
        from_layout = self._layout_chunks("m")
        if from_layout is not None:
            return from_layout
        n = self.pp * self.vpp_size
        return tuple(mtp_layers if c == n - 1 else 0 for c in range(n))

    def num_microbatches(self, global_batch_size: int) -> int:
        """GBS = MBS * DP * num_microbatches (floored; rules check divisibility)."""
        return global_batch_size // (self.mbs * self.dp)

    def short_dict(self) -> dict[str, object]:
        """Field name -> value (flat: every field is a scalar, so no deep copy as `dataclasses.asdict` makes)."""
        return {name: getattr(self, name) for name in _FIELD_NAMES}

    def __str__(self) -> str:
        parts = [f"tp={self.tp}", f"pp={self.pp}"]
        if self.vpp:
            parts.append(f"vpp={self.vpp}")
        parts += [f"cp={self.cp}", f"ep={self.ep}"]
        if self.etp is not None:
            parts.append(f"etp={self.etp}")
        if self.first_stage_layers is not None:
            parts.append(f"first_stage_layers={self.first_stage_layers}")
        if self.last_stage_layers is not None:
            parts.append(f"last_stage_layers={self.last_stage_layers}")
        if self.embedding_loss_split:
            parts.append("embedding_loss_split=true")
        if self.pipeline_layout is not None:
            parts.append(f"pipeline_layout={self.pipeline_layout}")
        parts += [f"dp={self.dp}", f"mbs={self.mbs}", f"sp={str(self.sp).lower()}",
                  f"dist_opt={str(self.dist_opt).lower()}", f"recompute={self.recompute}"]
        if self.cuda_graphs != "none":  # the new switches only when on: older texts (trials.csv) read the same
            parts.append(f"cuda_graphs={self.cuda_graphs}")
        if self.ep_overlap:
            parts.append("ep_overlap=true")
        if self.fsdp:
            parts.append("fsdp=true")
        if self.offload_layers:
            parts.append(f"offload_layers={self.offload_layers}")
        return ",".join(parts)


def _check_size(name: str, value: object, *, optional: bool) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"layout field {name!r} must be a whole number, but got {value!r}.")
    if value <= 0:
        if name in _MEGATRON_SPLIT:
            raise ValueError(f"{_MEGATRON_SPLIT[name]} must be larger than 0, but got ({name}={value}).")
        raise ValueError(f"`{name} > 0`{' (or unset)' if optional else ''} must hold, but got ({name}={value}).")


_SIZE_FIELDS = ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "mbs", "first_stage_layers", "last_stage_layers")
_BOOL_FIELDS = ("sp", "dist_opt", "embedding_loss_split", "ep_overlap", "fsdp")
_MEGATRON_SPLIT = {"first_stage_layers": "num_layers_in_first_pipeline_stage",
                   "last_stage_layers": "num_layers_in_last_pipeline_stage"}
MAX_SIZE = 10**9  # the largest layout size parse_layout reads (far above any cluster)
_FIELD_NAMES = tuple(f.name for f in fields(Layout))
# the fields that say how the layers are split over the pipeline (derived from (num_layers, PP, VPP) in the space)
SPLIT_FIELDS: frozenset[str] = frozenset({"first_stage_layers", "last_stage_layers", "embedding_loss_split",
                                          "pipeline_layout"})
# the per-layout switches (the rest are sizes and the pipeline split)
SWITCH_FIELDS: tuple[str, ...] = ("sp", "dist_opt", "recompute", "cuda_graphs", "ep_overlap", "fsdp",
                                  "offload_layers")
_BOOL = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}
_INT_FIELDS = ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "mbs", "first_stage_layers", "last_stage_layers")
_OPTIONAL_FIELDS = ("vpp", "etp", "first_stage_layers", "last_stage_layers")
_KNOWN = _FIELD_NAMES


def parse_layout(text: str, *, world_size: int | None = None) -> Layout:
    """Parse `"tp=2,pp=4,vpp=2,ep=8,sp=true,dist_opt=true,recompute=selective"`.

    Omitted fields take megatron-core's defaults (1, no VPP, ETP = TP, SP off, no distributed
    optimizer, no recompute). When `dp` is omitted and `world_size` is given, dp is derived as
    world / (tp * pp * cp) (floored, at least 1; the rules report a world that does not divide).
    `pipeline_layout=Et|(tt|)*30mL` keeps its case; commas inside it are megatron-core's cosmetic commas
    (`pipeline_layout=Ettt|(tt|)*29,m|L`: the item after the comma has no `=`, so it continues the string).
    Raises ValueError with a message that says what is wrong.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError("a layout needs at least one name=value item, e.g. 'tp=2,pp=4'; got an empty one.")
    values: dict[str, object] = {}
    for item in _items(text):
        key, sep, raw = item.partition("=")
        if key.strip().lower() == "pipeline_layout" and sep:
            if "pipeline_layout" in values:
                raise ValueError("layout field 'pipeline_layout' is given twice.")
            values["pipeline_layout"] = _layout_string(raw)
            continue
        key, raw = key.strip().lower(), raw.strip().lower()
        if not sep or not raw:
            raise ValueError(f"layout item {item!r} is not of the form name=value (e.g. 'tp=2').")
        if key not in _KNOWN:
            raise ValueError(f"unknown layout field {key!r}; known fields: {', '.join(_KNOWN)}.")
        if key in values:
            raise ValueError(f"layout field {key!r} is given twice.")
        if key in _INT_FIELDS:
            if key in _OPTIONAL_FIELDS and raw in ("none", "null"):
                values[key] = None
                continue
            # ASCII digits only: int() would also read '２' (full width), '0_2' and ' +2'
            if not (raw.isascii() and raw.isdigit()) or len(raw) > len(str(MAX_SIZE)):
                raise ValueError(f"layout field {key!r} needs a positive integer (ASCII digits, at most {MAX_SIZE:,}), "
                                 f"but got {raw!r}.")
            number = int(raw)
            if number <= 0 or number > MAX_SIZE:
                raise ValueError(f"layout field {key!r} needs a positive integer (at most {MAX_SIZE:,}), but got "
                                 f"{number}.")
            values[key] = None if key == "vpp" and number == 1 else number
        elif key == "offload_layers":
            if not (raw.isascii() and raw.isdigit()) or len(raw) > len(str(MAX_SIZE)):
                raise ValueError(f"layout field 'offload_layers' needs a whole number >= 0 (ASCII digits), but got "
                                 f"{raw!r}.")
            values[key] = int(raw)
        elif key in _BOOL_FIELDS:
            if raw not in _BOOL:
                raise ValueError(f"layout field {key!r} needs true or false, but got {raw!r}.")
            values[key] = _BOOL[raw]
        elif key == "cuda_graphs":
            if raw not in CUDA_GRAPH_CHOICES:
                raise ValueError(f"layout field 'cuda_graphs' must be one of {CUDA_GRAPH_CHOICES}, but got {raw!r}.")
            values[key] = raw
        else:  # recompute
            if raw not in RECOMPUTE_CHOICES:
                raise ValueError(f"layout field 'recompute' must be one of {RECOMPUTE_CHOICES}, but got {raw!r}.")
            values[key] = raw
    if not values:
        raise ValueError(f"a layout needs at least one name=value item, e.g. 'tp=2,pp=4'; got {text!r}.")
    layout = Layout(**values)  # type: ignore[arg-type]
    if "dp" not in values and world_size is not None:
        layout = replace(layout, dp=max(1, world_size // (layout.tp * layout.pp * layout.cp)))
    return layout


def _items(text: str) -> list[str]:
    """`name=value` items split at commas; a piece without `=` after a pipeline_layout item continues it."""
    items: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        if "=" not in piece and items and items[-1].partition("=")[0].strip().lower() == "pipeline_layout":
            items[-1] += piece
        else:
            items.append(piece)
    return items


def _layout_string(raw: str) -> str | None:
    value = raw.strip()
    if not value:
        raise ValueError("layout field 'pipeline_layout' needs megatron-core's layout string, e.g. "
                         "'pipeline_layout=Et|(tt|)*30mL', but got nothing.")
    return None if value.lower() in ("none", "null") else value


class PipelineSplit(TypedDict, total=False):
    """The Layout fields of an uneven pipeline split (`pipeline_split_for` sets one way to split)."""

    first_stage_layers: int
    last_stage_layers: int
    embedding_loss_split: bool
    pipeline_layout: str


@lru_cache(maxsize=4096)
def pipeline_split_for(num_layers: int, pp: int, vpp: int = 1, *, mtp_layers: int = 0) -> PipelineSplit | None:
    """The uneven pipeline split autotune offers when num_layers % (PP * VPP) != 0, as Layout fields.

    0. For a model with `mtp_layers` MTP layers, the `pipeline_layout` string Megatron-Bridge's DeepSeek-V3
       recipes use wherever it exists (`pipeline_layout.mtp_layout`: the embedding free, a layer and the loss one
       each, an MTP layer two, when that cost splits exactly evenly over the PP * VPP chunks): megatron-core's
       embedding/loss accounting and first/last split do not count the MTP layers, which sit on the last stage.
       DeepSeek-V3's 61 + 2 + 1 = 64: Bridge's PP 8 x VPP 4 `Et|(tt|)*30mL` and its 16-chunk
       `Et*4|(t*4|)*14tmL` (PP 4 x VPP 4, PP 16, PP 8 x VPP 2, PP 2 x VPP 8).
    1. `embedding_loss_split` when (L + 2) splits evenly over PP stages and VPP chunks, megatron's
       `account_for_embedding/loss_in_pipeline_split` (Llama-3.1-405B: 126 + 2 = 128 over PP 8 x VPP 8;
       Qwen3-235B: 94 + 2 = 96 over PP 8 x VPP 4). One slot per chunk is offered too: the first chunk then holds
       only the embedding and the last only the loss (megatron-core builds 0 layers there), as NVIDIA's GB200
       Llama-3.1-405B recipe runs (PP 16 x VPP 8) and the ModelZoo runs Qwen3-235B (PP 32 x VPP 3).
    2. Otherwise `first_stage_layers` / `last_stage_layers`: middle stages get m layers, the smallest multiple
       of VPP that is at least ceil(L / PP); the first and last stages share the remainder, the last (which
       also computes the logits and the loss) taking the smaller half, both multiples of VPP and at least VPP
       (DeepSeek-V3 without its MTP layer, 61 layers over PP 16: 3 + 14 x 4 + 2). Not at PP 2 with VPP:
       megatron-core accepts that split but cannot build PP rank 1 (`rules.first_last_vpp_needs_middle_stage`);
       3. replaces it.
    3. (PP 2 with VPP, where 2. would split) the balanced `pipeline_layout` string instead
       (`pipeline_layout.balanced_layout`, chunks within one slot of each other), or, with under 2 slots per
       chunk, the string of 2.'s chunks.
    Returns None when an even split works, PP == 1, or no such split exists.
    """
    if pp < 2 or num_layers % (pp * vpp) == 0:
        return None
    chunks = pp * vpp
    if mtp_layers:
        layout = mtp_layout(num_layers, pp, vpp, mtp_layers)
        if layout is not None:
            return {"pipeline_layout": layout}
    if (num_layers + 2) % chunks == 0:
        return {"embedding_loss_split": True}
    per_stage = -(-num_layers // pp)
    m = -(-per_stage // vpp) * vpp
    rest = num_layers - (pp - 2) * m
    last = (rest // 2) // vpp * vpp
    first = rest - last
    first_last = not (last < vpp or first < vpp or first % vpp or first > m)
    if first_last and not (pp == 2 and vpp > 1):
        return {"first_stage_layers": first, "last_stage_layers": last}
    if first_last:  # PP 2 with VPP
        layout = balanced_layout(num_layers, pp, vpp, mtp_layers) or layout_from_chunks(
            [(first if c % 2 == 0 else last) // vpp for c in range(chunks)], mtp_layers)
        return {"pipeline_layout": layout}
    return None
