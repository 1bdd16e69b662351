"""Validity rules of the pipeline split: even, uneven first/last stages, the embedding/loss split and
megatron-core's `pipeline_model_parallel_layout` string.

Sources (megatron-core 0.16.1, identical in 0.19.2 unless `rules_for` says otherwise):
`transformer/transformer_config.py` (`__post_init__`, "PP layout" and "Uneven PP"),
`transformer/transformer_block.py` (`get_num_layers_to_build`), `transformer/transformer_layer.py`
(`get_transformer_layer_offset`), `transformer/pipeline_parallel_layer_layout.py`
(`PipelineParallelLayerLayout.__init__`, `validate_layer_layout`) and
`transformer/multi_token_prediction.py` (`get_mtp_num_layers_to_build`).
Each message gives megatron-core's own words, then the fields with their values.
"""

from __future__ import annotations

from typing import TypedDict

from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.pipeline_layout import LayoutSyntaxError, layout_from_chunks, parse_stages
from search_spaces.violations import STRICTER, Violation, violation

__all__ = ["pipeline_rule_checks", "layers_divisible_by_pp_message"]


class _SplitFields(TypedDict):
    """The split fields a violation reports (a TypedDict: its keys cannot collide with `violation`'s `stricter`)."""

    first_stage_layers: int | None
    last_stage_layers: int | None
    embedding_loss_split: bool


def _split_fields(layout: Layout) -> _SplitFields:
    return {"first_stage_layers": layout.first_stage_layers, "last_stage_layers": layout.last_stage_layers,
            "embedding_loss_split": layout.embedding_loss_split}


def _uneven(layout: Layout) -> bool:
    return layout.first_stage_layers is not None or layout.last_stage_layers is not None


def _split_text(layout: Layout) -> str:
    return (f"first_stage_layers={layout.first_stage_layers} (num_layers_in_first_pipeline_stage), "
            f"last_stage_layers={layout.last_stage_layers} (num_layers_in_last_pipeline_stage)")


def _set_split_fields(layout: Layout) -> list[str]:
    """The split fields the layout sets, each as `name=value (megatron-core name)`."""
    out = []
    if layout.first_stage_layers is not None:
        out.append(f"first_stage_layers={layout.first_stage_layers} (num_layers_in_first_pipeline_stage)")
    if layout.last_stage_layers is not None:
        out.append(f"last_stage_layers={layout.last_stage_layers} (num_layers_in_last_pipeline_stage)")
    if layout.embedding_loss_split:
        out.append("embedding_loss_split=true (account_for_embedding_in_pipeline_split and "
                   "account_for_loss_in_pipeline_split)")
    if layout.pipeline_layout is not None:
        out.append(f"pipeline_layout={layout.pipeline_layout} (pipeline_model_parallel_layout)")
    return out


def _classic(layout: Layout) -> bool:
    """No layout string: the first/last or embedding/loss rules apply (megatron-core's `elif` chain)."""
    return layout.pipeline_layout is None


# --- the split options exclude each other ------------------------------------------------------------------
def pipeline_split_exclusive(job: Job, layout: Layout) -> Violation | None:
    """First/last stage layer counts and the embedding/loss split are two ways to split; one at a time."""
    if not (_uneven(layout) and layout.embedding_loss_split):
        return None
    return violation("pipeline_split_exclusive", "num_layers_in_first_pipeline_stage and "
                     "num_layers_in_last_pipeline_stage cannot be set at the same time with "
                     "account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split "
                     f"({_split_text(layout)}, embedding_loss_split=true).", **_split_fields(layout))


def pipeline_layout_exclusive(job: Job, layout: Layout) -> Violation | None:
    if layout.pipeline_layout is None or not (_uneven(layout) or layout.embedding_loss_split):
        return None
    others = [f for f in _set_split_fields(layout) if not f.startswith("pipeline_layout")]
    return violation("pipeline_layout_exclusive", "pipeline_model_parallel_layout cannot be set with other pipeline "
                     f"layout arguments ({'; '.join(others)}; pipeline_layout={layout.pipeline_layout}).",
                     pipeline_layout=layout.pipeline_layout, **_split_fields(layout))


def pipeline_split_needs_pp(job: Job, layout: Layout) -> Violation | None:
    """Any split field at PP 1. megatron-core refuses some of these itself ("Mismatch": first or last alone
    short of num_layers, or first + last = num_layers, which leaves -1 middle stages for 0 layers) and accepts
    the rest: the embedding/loss split and first = num_layers (no-ops) and first + last != num_layers (it then
    builds only `last` layers); those autotune refuses deliberately (stricter)."""
    if layout.pp > 1 or not (_uneven(layout) or layout.embedding_loss_split):
        return None
    given = "; ".join(f for f in _set_split_fields(layout) if not f.startswith("pipeline_layout"))
    first, last = layout.first_stage_layers, layout.last_stage_layers
    rest = job.model.num_layers - (first or 0) - (last or 0)
    stages = 1 - (first is not None) - (last is not None)
    if _uneven(layout) and not layout.embedding_loss_split and bool(rest) != bool(stages):
        return violation("pipeline_split_needs_pp", f"Mismatch: {rest} middle layers remaining but {stages} middle PP "
                         f"stages available ({given}, num_layers {job.model.num_layers}, "
                         f"pipeline_model_parallel_size {layout.pp}): with one stage there is nothing to split; "
                         "drop the split or raise pp.", pp=layout.pp, **_split_fields(layout))
    return violation("pipeline_split_needs_pp", f"{given} splits the layers over pipeline stages, but "
                     f"pipeline_model_parallel_size is {layout.pp}: with one stage there is nothing to split. "
                     f"{STRICTER} at pipeline_model_parallel_size 1 megatron-core ignores these fields or, with "
                     "both first and last set, builds only the last stage's layers (get_num_layers_to_build), "
                     "which is not the model asked for; drop the split or raise pp.",
                     stricter=True, pp=layout.pp, **_split_fields(layout))


# --- even split ---------------------------------------------------------------------------------------------
def layers_divisible_by_pp_message(version: str, layers: int, pp: int) -> str:
    """`get_num_layers_to_build`'s assert: 0.19 names the values (`f"{num_layers=} should be ..."`)."""
    if version >= "0.17":
        return f"num_layers={layers} should be divisible by config.pipeline_model_parallel_size={pp}"
    return "num_layers should be divisible by pipeline_model_parallel_size"


def _layers_divisible_by_pp(version: str):
    def layers_divisible_by_pp(job: Job, layout: Layout) -> Violation | None:
        """Even split (no split field set): num_layers % PP == 0."""
        layers, pp = job.model.num_layers, layout.pp
        if _uneven(layout) or layout.embedding_loss_split or not _classic(layout) or layers % pp == 0 \
                or job.model.is_hybrid:  # a hybrid model's split: hybrid_rules.hybrid_layers_split
            return None
        return violation("layers_divisible_by_pp", f"{layers_divisible_by_pp_message(version, layers, pp)} "
                         f"(num_layers {layers}, pipeline_model_parallel_size {pp}); an uneven split "
                         "(first_stage_layers / last_stage_layers, embedding_loss_split, pipeline_layout) may fit.",
                         num_layers=layers, pp=pp)
    return layers_divisible_by_pp


def layers_divisible_by_vpp(job: Job, layout: Layout) -> Violation | None:
    """Even split: each virtual stage holds an integer number of layers, num_layers % (PP * VPP) == 0."""
    layers, pp, vpp = job.model.num_layers, layout.pp, layout.vpp_size
    if _uneven(layout) or layout.embedding_loss_split or not _classic(layout) or vpp == 1 or layers % pp \
            or (layers // pp) % vpp == 0 or job.model.is_hybrid:
        return None  # layers % pp is layers_divisible_by_pp's violation
    return violation("layers_divisible_by_vpp", f"num_layers_per_pipeline_rank {layers // pp} should be divisible "
                     f"by vp_size {vpp} (num_layers {layers}, pipeline_model_parallel_size {pp}, "
                     f"virtual_pipeline_model_parallel_size {vpp}).", num_layers=layers, pp=pp, vpp=vpp)


# --- uneven first / last stages ("Uneven PP") ----------------------------------------------------------------
def _stage_layers_divisible_by_vpp(which: str, count: int | None, layout: Layout) -> Violation | None:
    vpp = layout.vpp
    if count is None or vpp is None or count % vpp == 0 or layout.pp == 1 or layout.embedding_loss_split \
            or not _classic(layout):
        return None
    return Violation(rule=f"{which}_stage_layers_divisible_by_vpp",
                     message=f"number of layers at {which} stage: {count} must be "
                     f"divisible by virtual pipeline parallel degree {vpp} ({which}_stage_layers={count} "
                     f"(num_layers_in_{which}_pipeline_stage), vpp={vpp}).",
                     fields={f"{which}_stage_layers": count, "vpp": vpp})


def first_stage_layers_divisible_by_vpp(job: Job, layout: Layout) -> Violation | None:
    return _stage_layers_divisible_by_vpp("first", layout.first_stage_layers, layout)


def last_stage_layers_divisible_by_vpp(job: Job, layout: Layout) -> Violation | None:
    return _stage_layers_divisible_by_vpp("last", layout.last_stage_layers, layout)


def _middle(job: Job, layout: Layout) -> tuple[int, int]:
    """(layers, stages) left for the middle stages once the first/last stage counts are taken."""
    first, last = layout.first_stage_layers, layout.last_stage_layers
    layers = job.model.num_layers - (first or 0) - (last or 0)
    return layers, layout.pp - (first is not None) - (last is not None)


def _uneven_applies(layout: Layout) -> bool:
    return _uneven(layout) and not layout.embedding_loss_split and layout.pp > 1 and _classic(layout)


def middle_stages_match(job: Job, layout: Layout) -> Violation | None:
    """Middle stages and middle layers both present or both absent (PP 2 with first + last = num_layers)."""
    if not _uneven_applies(layout):
        return None
    layers, stages = _middle(job, layout)
    if bool(layers) == bool(stages):
        return None
    return violation("middle_stages_match", f"Mismatch: {layers} middle layers remaining but {stages} middle PP "
                     f"stages available (num_layers {job.model.num_layers}, pipeline_model_parallel_size "
                     f"{layout.pp}, {_split_text(layout)}).",
                     num_layers=job.model.num_layers, pp=layout.pp, **_split_fields(layout))


def first_last_within_num_layers(job: Job, layout: Layout) -> Violation | None:
    """Stricter than megatron-core, whose modulo lets a negative middle through (9 + 9 of 12 layers on PP 4:
    -6 % 2 == 0): it then builds 9 + 0 + 0 + 9 = 18 layers for a 12-layer model."""
    if not _uneven_applies(layout):
        return None
    layers, stages = _middle(job, layout)
    if layers >= 0 or stages <= 0:
        return None
    first, last = layout.first_stage_layers or 0, layout.last_stage_layers or 0
    return violation("first_last_within_num_layers",
                     f"first_stage_layers + last_stage_layers = {first} + {last} = {first + last} exceeds "
                     f"num_layers {job.model.num_layers}, leaving {layers} layers (a negative number) for the "
                     f"{stages} middle stages ({_split_text(layout)}, pipeline_model_parallel_size {layout.pp}). "
                     f"{STRICTER} its check 'number of layers at middle stage: {layers} must be divisible by the "
                     f"middle pipeline model parallel size {stages}' passes ({layers} % {stages} == 0 in Python), "
                     f"but the stages then build {first} + {last} = {first + last} layers of a "
                     f"{job.model.num_layers}-layer model.",
                     stricter=True, num_layers=job.model.num_layers, pp=layout.pp, **_split_fields(layout))


def middle_layers_divisible(job: Job, layout: Layout) -> Violation | None:
    """The middle stages share the rest equally."""
    if not _uneven_applies(layout):
        return None
    layers, stages = _middle(job, layout)
    if stages <= 0 or layers < 0 or layers % stages == 0:
        return None  # a negative rest is first_last_within_num_layers's violation
    return violation("middle_layers_divisible", f"number of layers at middle stage: {layers} must be divisible by "
                     f"the middle pipeline model parallel size {stages} (num_layers {job.model.num_layers}, "
                     f"pipeline_model_parallel_size {layout.pp}, {_split_text(layout)}).",
                     num_layers=job.model.num_layers, pp=layout.pp, **_split_fields(layout))


def middle_layers_divisible_by_vpp(job: Job, layout: Layout) -> Violation | None:
    if not _uneven_applies(layout) or layout.vpp is None:
        return None
    layers, stages = _middle(job, layout)
    if stages <= 0 or layers < 0 or layers % stages or (layers // stages) % layout.vpp == 0:
        return None  # middle_layers_divisible's violation
    return violation("middle_layers_divisible_by_vpp", f"number of layers on each middle pipeline rank: "
                     f"{layers // stages} must be divisible by virtual pipeline parallel degree {layout.vpp} "
                     f"(num_layers {job.model.num_layers}, pipeline_model_parallel_size {layout.pp}, "
                     f"{_split_text(layout)}).",
                     num_layers=job.model.num_layers, pp=layout.pp, vpp=layout.vpp, **_split_fields(layout))


def first_last_vpp_needs_middle_stage(job: Job, layout: Layout) -> Violation | None:
    """megatron-core accepts PP 2 with both first and last set and VPP, then fails to build PP rank 1:
    `get_transformer_layer_offset` (transformer_layer.py, the VPP branch: 0.16.1 :138, 0.19.2 :158) divides by the
    number of middle stages, 0 (ZeroDivisionError; both releases fail so in tests/test_megatron_parity.py, and
    Megatron-LM main has the same code). The same chunks as a layout string build
    (`PipelineParallelLayerLayout.get_layer_offset` counts instead of dividing)."""
    if not _uneven_applies(layout) or layout.vpp is None:
        return None
    first, last = layout.first_stage_layers, layout.last_stage_layers
    if first is None or last is None or layout.pp != 2:
        return None
    v = layout.vpp
    decoders = [(first if c % 2 == 0 else last) // v for c in range(2 * v)]
    equivalent = layout_from_chunks(decoders, job.model.mtp_num_layers)
    return violation("first_last_vpp_needs_middle_stage",
                     f"{_split_text(layout)} with virtual_pipeline_model_parallel_size {v} at "
                     "pipeline_model_parallel_size 2 leaves 0 middle pipeline stages: megatron-core accepts the "
                     "config but cannot build pipeline rank 1, get_transformer_layer_offset "
                     "(transformer/transformer_layer.py) divides by the 0 middle stages (ZeroDivisionError: "
                     "integer division or modulo by zero). Set only one of first_stage_layers / "
                     f"last_stage_layers, or give the same split as pipeline_layout={equivalent}.",
                     pp=layout.pp, vpp=v, first_stage_layers=first, last_stage_layers=last)


# --- the embedding/loss split (account_for_embedding/loss_in_pipeline_split) -----------------------------------
def embedding_loss_layers_divisible_by_pp(job: Job, layout: Layout) -> Violation | None:
    """The embedding and the loss count as one layer each: (num_layers + 2) % PP == 0."""
    if not layout.embedding_loss_split or _uneven(layout) or layout.pp == 1 or not _classic(layout):
        return None
    layers = job.model.num_layers + 2
    if layers % layout.pp == 0:
        return None
    if layout.vpp is None:  # megatron-core words the two branches differently
        head = (f"number of middle layers: {layers} must be divisible by middle pipeline_model_parallel_size "
                f"{layout.pp}")
    else:
        head = (f"num_layers: {layers} after enable account_for_embedding_in_pipeline_split or "
                f"account_for_loss_in_pipeline_split must be divisible by pipeline_model_parallel_size {layout.pp}")
    return violation("embedding_loss_layers_divisible_by_pp", f"{head} (num_layers {job.model.num_layers} + the "
                     f"embedding + the loss = {layers}, embedding_loss_split=true).",
                     num_layers=job.model.num_layers, pp=layout.pp, embedding_loss_split=True)


def embedding_loss_layers_divisible_by_vpp(job: Job, layout: Layout) -> Violation | None:
    if not layout.embedding_loss_split or _uneven(layout) or layout.pp == 1 or layout.vpp is None \
            or not _classic(layout):
        return None
    layers = job.model.num_layers + 2
    if layers % layout.pp or (layers // layout.pp) % layout.vpp == 0:
        return None
    return violation("embedding_loss_layers_divisible_by_vpp", f"number of layers on each pipeline rank: "
                     f"{layers // layout.pp} (after enable account_for_embedding_in_pipeline_split or "
                     "account_for_loss_in_pipeline_split) must be divisible by virtual_pipeline_model_parallel_size "
                     f"{layout.vpp} (num_layers {job.model.num_layers}, pipeline_model_parallel_size {layout.pp}, "
                     "embedding_loss_split=true).",
                     num_layers=job.model.num_layers, pp=layout.pp, vpp=layout.vpp, embedding_loss_split=True)


# --- pipeline_model_parallel_layout (pipeline_parallel_layer_layout.py) -----------------------------------------
def _stages(layout: Layout) -> tuple[str, ...] | None:
    if layout.pipeline_layout is None:
        return None
    try:
        return parse_stages(layout.pipeline_layout)
    except LayoutSyntaxError:
        return None


def pipeline_layout_syntax(job: Job, layout: Layout) -> Violation | None:
    if layout.pipeline_layout is None:
        return None
    try:
        parse_stages(layout.pipeline_layout)
    except LayoutSyntaxError as error:
        return violation("pipeline_layout_syntax", f"{error} (pipeline_layout={layout.pipeline_layout}; nested "
                         "parentheses are not part of the grammar).", pipeline_layout=layout.pipeline_layout)
    return None


def pipeline_layout_divisible_by_pp(job: Job, layout: Layout) -> Violation | None:
    stages = _stages(layout)
    if stages is None or len(stages) % layout.pp == 0:
        return None
    return violation("pipeline_layout_divisible_by_pp", "pipeline_model_parallel_layout must be divisible by "
                     f"pipeline_model_parallel_size (len(layout)={len(stages)}, pipeline_model_parallel_size="
                     f"{layout.pp}; pipeline_layout={layout.pipeline_layout}).",
                     pipeline_layout=layout.pipeline_layout, stages=len(stages), pp=layout.pp)


def pipeline_layout_vpp_matches(job: Job, layout: Layout) -> Violation | None:
    """An explicit VPP must be the layout's stages / PP (`Layout` derives an unset one, as megatron-core does)."""
    stages = _stages(layout)
    if stages is None or len(stages) % layout.pp:
        return None
    detected = len(stages) // layout.pp
    if layout.vpp_size == detected:
        return None
    return violation("pipeline_layout_vpp_matches", "virtual_pipeline_model_parallel_size conflicts with "
                     f"pipeline_model_parallel_layout, (virtual_pipeline_model_parallel_size={layout.vpp}, "
                     f"detected_vpp_size={detected}; pipeline_layout={layout.pipeline_layout} has {len(stages)} "
                     f"stages over pipeline_model_parallel_size {layout.pp}).",
                     pipeline_layout=layout.pipeline_layout, vpp=layout.vpp, detected_vpp=detected, pp=layout.pp)


def pipeline_layout_embedding_and_loss(job: Job, layout: Layout) -> Violation | None:
    stages = _stages(layout)
    if stages is None:
        return None
    flat = "".join(stages)
    if not flat:
        problem = "The first layer must be embedding, but the layout holds no layer"
    elif flat[0] != "E":
        problem = f"The first layer must be embedding, but got {_layer_name(flat[0])}"
    elif flat[-1] != "L":
        problem = f"The last layer must be loss, but got {_layer_name(flat[-1])}"
    elif flat.count("E") != 1:
        problem = f"Embedding must be specified exactly once (got {flat.count('E')})"
    elif flat.count("L") != 1:
        problem = f"Loss must be specified exactly once (got {flat.count('L')})"
    else:
        return None
    return violation("pipeline_layout_embedding_and_loss", f"{problem} (pipeline_layout={layout.pipeline_layout}).",
                     pipeline_layout=layout.pipeline_layout)


def _layer_name(char: str) -> str:
    return {"E": "LayerType.embedding", "L": "LayerType.loss", "t": "LayerType.decoder", "m": "LayerType.mtp"}[char]


def pipeline_layout_decoder_count(job: Job, layout: Layout) -> Violation | None:
    stages = _stages(layout)
    if stages is None:
        return None
    count = sum(s.count("t") for s in stages)
    if count == job.model.num_layers:
        return None
    return violation("pipeline_layout_decoder_count", f"Number of decoder layers {count} must match num_layers "
                     f"{job.model.num_layers} (pipeline_layout={layout.pipeline_layout}).",
                     pipeline_layout=layout.pipeline_layout, decoder_layers=count, num_layers=job.model.num_layers)


def pipeline_layout_mtp(job: Job, layout: Layout) -> Violation | None:
    """`validate_layer_layout`'s MTP checks and `get_mtp_num_layers_to_build`'s assert."""
    stages = _stages(layout)
    if stages is None or len(stages) % layout.pp:
        return None
    mtp, pp = job.model.mtp_num_layers, layout.pp
    flat = "".join(stages)
    vpp = len(stages) // pp
    grid = [[stages[v * pp + p] for v in range(vpp)] for p in range(pp)]  # [pp_rank][vpp_rank]
    if flat.count("m") != mtp:
        problem = (f"Number of mtp layers in layout must match mtp_num_layers (the layout has {flat.count('m')}, "
                   f"the model {mtp})")
    elif "m" in flat and "t" in flat[flat.index("m"):]:
        problem = "decoder layers must be placed before MTP layers"
    elif any("m" in grid[p][v] for p in range(pp) for v in range(vpp - 1)):
        problem = ("Currently we restrict that the MTP should be always in the last virtual pipeline stage of that "
                   "rank")
    elif any("m" in grid[p][-1] and grid[p][-1].count("m") != mtp for p in range(pp)):
        problem = "All of the MTP layers must be in the same one virtual pipeline stage"
    else:
        return None
    return violation("pipeline_layout_mtp", f"{problem} (pipeline_layout={layout.pipeline_layout}, "
                     f"mtp_num_layers {mtp}).", pipeline_layout=layout.pipeline_layout, mtp_num_layers=mtp)


def pipeline_rule_checks(version: str) -> dict[str, object]:
    """Rule name -> check function, for the megatron-core `version` whose messages to use."""
    return {
        "pipeline_split_exclusive": pipeline_split_exclusive,
        "pipeline_layout_exclusive": pipeline_layout_exclusive,
        "pipeline_split_needs_pp": pipeline_split_needs_pp,
        "layers_divisible_by_pp": _layers_divisible_by_pp(version),
        "layers_divisible_by_vpp": layers_divisible_by_vpp,
        "first_stage_layers_divisible_by_vpp": first_stage_layers_divisible_by_vpp,
        "last_stage_layers_divisible_by_vpp": last_stage_layers_divisible_by_vpp,
        "middle_stages_match": middle_stages_match,
        "first_last_within_num_layers": first_last_within_num_layers,
        "middle_layers_divisible": middle_layers_divisible,
        "middle_layers_divisible_by_vpp": middle_layers_divisible_by_vpp,
        "first_last_vpp_needs_middle_stage": first_last_vpp_needs_middle_stage,
        "embedding_loss_layers_divisible_by_pp": embedding_loss_layers_divisible_by_pp,
        "embedding_loss_layers_divisible_by_vpp": embedding_loss_layers_divisible_by_vpp,
        "pipeline_layout_syntax": pipeline_layout_syntax,
        "pipeline_layout_divisible_by_pp": pipeline_layout_divisible_by_pp,
        "pipeline_layout_vpp_matches": pipeline_layout_vpp_matches,
        "pipeline_layout_embedding_and_loss": pipeline_layout_embedding_and_loss,
        "pipeline_layout_decoder_count": pipeline_layout_decoder_count,
        "pipeline_layout_mtp": pipeline_layout_mtp,
    }
