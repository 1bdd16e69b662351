"""The feasible space: every valid layout of a job, built directly, and the choices of each dimension.

Dimensions are chosen in the order `DIMENSIONS`; the options of each depend on the earlier ones:

    tp         divisors of the world; heads, query groups and FFN sizes allow it; inside one node by default
    cp         seq_length % (2*CP) == 0 and TP*CP divides the world; each rank keeps min_cp_tokens by default
    pp         divides world / (TP*CP), and some vpp below splits the layers  -> DP = world / (TP*CP*PP)
    vpp        None, or v >= 2 with PP >= min_pp_for_vpp; num_layers % (PP*v) == 0 (even split) or else
               `pipeline_split_for(num_layers, PP, v)` gives the one uneven split offered for (PP, VPP):
               the embedding/loss split, first/last stage layers, or a `pipeline_layout` string
    ep         dense: 1. MoE: divides num_experts and TP*CP*DP      (EP*ETP inside one node by default)
    etp        dense: None (= TP). MoE: explicit, EP*ETP divides TP*CP*DP; 1 when the model has biases; inside
               one node by default, as TP
    mbs        GBS % (MBS*DP) == 0; with VPP also num_microbatches % PP == 0
    sp         False when TP == 1; True for MoE with TP > 1; both for dense TP > 1 (when the sequence splits)
    ep_overlap SpaceOptions.ep_overlap; True only for MoE with EP > 1, VPP when PP > 1 (and 0.16.1's MTP rules)
    fsdp       SpaceOptions.fsdp; True only with PP 1, no ep_overlap and Adam (`fsdp_rules`)
    offload_layers 0, or SpaceOptions.offload_step, 2x it, ... below num_layers, with PP 1 for a dense GPT model
    dist_opt   SpaceOptions.dist_opt (free; True only with fsdp)
    recompute  SpaceOptions.recompute, less what ep_overlap, offload and the training settings forbid
    cuda_graphs SpaceOptions.cuda_graphs (default: the release's, `cuda_graph_options`), less what the model,
               ep_overlap, offload and recompute forbid
The last three are the layout's switches: which (dist_opt, recompute, cuda_graphs) a shape takes depends only on its
switch context, (ep_overlap, fsdp, offload_layers > 0) (`FeasibleSpace.switches`, `switch_context`).

Every prefix the space offers has at least one valid completion, so a define-by-run search never
reaches a dead end. The search driver builds its Optuna space like this:

    space = feasible_space(job, options)
    values = {}
    for name in DIMENSIONS:
        values[name] = trial.suggest_categorical(param_name, space.choices(name, values))
    layout = space.layout(values)

The uneven split (first_stage_layers / last_stage_layers / embedding_loss_split / pipeline_layout) is not a
dimension: it is fully determined by (num_layers, PP, VPP), so `layout(values)` adds it (`pipeline_fields`).

(Optuna wants a fixed choice list per parameter name, so `param_name` should carry the prefix the
choices depend on, e.g. `space.param_name(name, values)`.)

`space_report.rejections(job, options)` counts, over the naive product of per-dimension ranges
(`SpaceReport.dimensions`), how many candidates each rule removed. Each rejected candidate is
counted once, against the *first* rule it breaks, rules being checked dimension by dimension in
`DIMENSIONS` order (a rule is checked as soon as the fields it reads are chosen; at one
dimension, validity rules in `rules.RULES` order, then the search-space restrictions). The count
is a depth-first walk over valid prefixes only, so it never materialises the product.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from search_spaces.hybrid_rules import mamba_cp_ok, mamba_tp_ok
from search_spaces.job import Job
from search_spaces.layout import (
    CUDA_GRAPH_CHOICES,
    RECOMPUTE_CHOICES,
    Layout,
    PipelineSplit,
    pipeline_split_for,
)
from search_spaces.releases import local_layer_graphs_refused
from search_spaces.rules import (
    Rule,
    Violation,
    cuda_graph_modules_refused,
    ep_overlap_cuda_graphs_refused,
    full_iteration_moe_refused,
    full_recompute_cuda_graphs_refused,
    qkv_output_width,
    te_graphs_moe_recompute_refused,
)

__all__ = ["DIMENSIONS", "SHAPE_DIMENSIONS", "SpaceOptions", "DEFAULT_SPACE", "FeasibleSpace", "SPACE_RULES",
           "feasible_space", "feasible_layouts", "divisors", "dimension_ranges", "space_rules", "pipeline_fields",
           "hybrid_split_for", "vpp_values", "switch_choices", "SWITCH_DIMENSIONS", "CONTEXT_DIMENSIONS", "CONTEXTS",
           "switch_context", "offload_values", "DEFAULT_CUDA_GRAPHS", "cuda_graph_options"]

DIMENSIONS: tuple[str, ...] = ("tp", "cp", "pp", "vpp", "ep", "etp", "mbs", "sp", "ep_overlap", "fsdp",
                                "offload_layers", "dist_opt", "recompute", "cuda_graphs")
SHAPE_DIMENSIONS: tuple[str, ...] = DIMENSIONS[:11]  # the switches after them depend on the switch context alone
SWITCH_DIMENSIONS: tuple[str, ...] = DIMENSIONS[11:]
CONTEXT_DIMENSIONS: tuple[str, ...] = ("ep_overlap", "fsdp", "offload_layers")  # the shape's last three
SwitchContext = tuple[bool, bool, bool]  # (ep_overlap, fsdp, offload_layers > 0)
CONTEXTS: tuple[SwitchContext, ...] = tuple((a, f, o) for a in (False, True) for f in (False, True)
                                            for o in (False, True))


def switch_context(ep_overlap: object, fsdp: object, offload_layers: object) -> SwitchContext:
    """The switch context of a shape: what its (dist_opt, recompute, cuda_graphs) choices depend on."""
    return bool(ep_overlap), bool(fsdp), bool(offload_layers)
# the CUDA graphs the default space searches (SpaceOptions.cuda_graphs None): every kind, less per-layer "local"
# graphs on a release whose Megatron-Bridge refuses them (0.6: `releases.local_layer_graphs_refused`); asked for by
# name (`--cuda-graphs local`), they are offered on any release (Megatron-LM's launcher takes them)
DEFAULT_CUDA_GRAPHS: tuple[str, ...] = CUDA_GRAPH_CHOICES


@dataclass(frozen=True, kw_only=True, slots=True)
class SpaceOptions:
    """Search-space choices (not validity rules): what the generator enumerates.

    tp_within_node: TP groups stay inside one NVLink domain (`ClusterSpec.nvlink_domain` % TP == 0): a node's 8
        GPUs on HGX/DGX systems, the 72 GPUs of a GB200 NVL72 rack (its nodes hold 4). The experts' TP (ETP) too:
        its GEMMs all-gather and reduce-scatter per layer as TP's do.
    expert_within_node: for MoE, EP*ETP groups stay inside one NVLink domain (nvlink_domain % (EP*ETP) == 0).
    min_cp_tokens: CP > 1 only while each CP rank keeps at least this many tokens of a sequence (seq_length / CP;
        0: no limit). Every published run in bench/data keeps 2,048 or more per rank (Bridge's tables 4,096), and
        below that the ring's per-step attention is too small to hide its KV exchange; without the limit most of a
        large MoE space is CP 16 to 1,024 at seq 4,096, which the cost model only ranks last.
    min_pp_for_vpp: interleaving needs PP >= this; 2 is megatron-core's rule, 3 is Megatron-LM's
        training-script rule when --overlap-p2p-comm is off.
    cuda_graphs, ep_overlap, fsdp: the values of these layout switches to search (one value: the switch is fixed);
        cuda_graphs None: the release's own (`cuda_graph_options`).
    offload_step: the layer-level activation offload counts searched are its multiples below num_layers (Bridge's
        Llama FSDP recipes offload 20, 40 and 95 layers); 0 searches no offload.
    max_*: caps on a dimension (None: no cap beyond validity).
    """

    tp_within_node: bool = True
    expert_within_node: bool = True
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    recompute: tuple[str, ...] = RECOMPUTE_CHOICES
    dist_opt: tuple[bool, ...] = (False, True)
    cuda_graphs: tuple[str, ...] | None = None
    ep_overlap: tuple[bool, ...] = (False, True)
    fsdp: tuple[bool, ...] = (False, True)
    offload_step: int = 5
    min_cp_tokens: int = 1024
    min_pp_for_vpp: int = 2
    max_tp: int | None = None
    max_cp: int | None = None
    max_pp: int | None = None
    max_vpp: int | None = None
    max_ep: int | None = None

    def __post_init__(self) -> None:
        if not self.micro_batch_sizes or any(m <= 0 for m in self.micro_batch_sizes):
            raise ValueError(f"micro_batch_sizes must be positive integers, but got {self.micro_batch_sizes}.")
        if not self.recompute or any(r not in RECOMPUTE_CHOICES for r in self.recompute):
            raise ValueError(f"recompute choices must be a non-empty subset of {RECOMPUTE_CHOICES}, "
                             f"but got {self.recompute}.")
        if not self.dist_opt:
            raise ValueError("dist_opt choices must not be empty; use (False,), (True,) or (False, True).")
        if not self.ep_overlap:
            raise ValueError("ep_overlap choices must not be empty; use (False,), (True,) or (False, True).")
        if not self.fsdp:
            raise ValueError("fsdp choices must not be empty; use (False,), (True,) or (False, True).")
        if type(self.offload_step) is not int or self.offload_step < 0:
            raise ValueError(f"`offload_step >= 0` (a whole number; 0: no offload) must hold, but got "
                             f"({self.offload_step!r}).")
        if self.cuda_graphs is not None and (not self.cuda_graphs
                                             or any(g not in CUDA_GRAPH_CHOICES for g in self.cuda_graphs)):
            raise ValueError(f"cuda_graphs choices must be a non-empty subset of {CUDA_GRAPH_CHOICES}, "
                             f"but got {self.cuda_graphs}.")
        if type(self.min_cp_tokens) is not int or self.min_cp_tokens < 0:
            raise ValueError(f"`min_cp_tokens >= 0` (a whole number; 0: no limit) must hold, but got "
                             f"({self.min_cp_tokens!r}).")
        if self.min_pp_for_vpp < 2:
            raise ValueError(f"`min_pp_for_vpp >= 2` must hold (megatron-core), but got ({self.min_pp_for_vpp}).")
        for name in ("max_tp", "max_cp", "max_pp", "max_vpp", "max_ep"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"`{name} >= 1` must hold, but got ({name}={value}).")


# The space the search uses: TP inside a node (its all-reduces need NVLink), expert parallelism free to cross nodes
# (NVIDIA's DeepSeek-V3 recipe runs EP 64 over 8 nodes; Megatron-Bridge `deepseek_v3` perf configs)
DEFAULT_SPACE = SpaceOptions(tp_within_node=True, expert_within_node=False)


def divisors(n: int) -> tuple[int, ...]:
    """Positive divisors of n, ascending."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))


def _capped(values: tuple[int, ...], cap: int | None) -> tuple[int, ...]:
    return values if cap is None else tuple(v for v in values if v <= cap)


# --- search-space restrictions, in the same shape as validity rules (for the rejection report) ----
def _tp_within_node(job: Job, layout: Layout) -> Violation | None:
    domain = job.cluster.nvlink_domain
    if domain % layout.tp:
        return Violation(rule="tp_within_node", fields={"tp": layout.tp, "nvlink_domain": domain},
                         message=f"search space: TP groups stay inside one NVLink domain, but "
                                 f"tensor_model_parallel_size ({layout.tp}) does not divide the NVLink domain "
                                 f"({domain} GPUs); lift with --cross-node-tp.")
    if job.model.is_moe and domain % layout.expert_tp:
        return Violation(rule="tp_within_node", fields={"etp": layout.expert_tp, "nvlink_domain": domain},
                         message=f"search space: expert TP groups stay inside one NVLink domain, as TP's do, but "
                                 f"expert_tensor_parallel_size ({layout.expert_tp}) does not divide the NVLink domain "
                                 f"({domain} GPUs); lift with --cross-node-tp.")
    return None


def _cp_min_tokens(min_tokens: int):
    def cp_min_tokens(job: Job, layout: Layout) -> Violation | None:
        seq = job.training.seq_length
        if layout.cp == 1 or seq // layout.cp >= min_tokens:
            return None
        return Violation(rule="cp_min_tokens", fields={"cp": layout.cp, "seq_length": seq},
                         message=f"search space: each CP rank keeps at least {min_tokens:,} tokens, but seq_length "
                                 f"{seq:,} / context_parallel_size {layout.cp} leaves {seq // layout.cp:,}; lift "
                                 f"with --min-cp-tokens 0.")
    return cp_min_tokens


def _expert_within_node(job: Job, layout: Layout) -> Violation | None:
    domain, size = job.cluster.nvlink_domain, layout.ep * layout.expert_tp
    if not job.model.is_moe or domain % size == 0:
        return None
    return Violation(rule="expert_within_node", fields={"ep": layout.ep, "etp": layout.expert_tp,
                                                        "nvlink_domain": domain},
                     message=f"search space: EP*ETP groups stay inside one NVLink domain, but "
                             f"expert_model_parallel_size ({layout.ep}) * expert_tensor_parallel_size "
                             f"({layout.expert_tp}) does not divide the NVLink domain ({domain} GPUs); lift by leaving "
                             f"out --experts-within-node.")


def _vpp_min_pp(min_pp: int):
    def vpp_min_pp(job: Job, layout: Layout) -> Violation | None:
        if layout.vpp_size == 1 or layout.pp >= min_pp:
            return None
        return Violation(rule="vpp_min_pp", fields={"pp": layout.pp, "vpp": layout.vpp},
                         message=f"search space: interleaving only with pipeline_model_parallel_size >= {min_pp}, "
                                 f"but got {layout.pp}.")
    return vpp_min_pp


def space_rules(job: Job, options: SpaceOptions) -> tuple[Rule, ...]:
    """The search-space restrictions `options` switch on, as rules (checked after the validity rules)."""
    out = []
    if options.tp_within_node:
        reads = frozenset({"tp", "etp"}) if job.model.is_moe else frozenset({"tp"})
        out.append(Rule(name="tp_within_node", reads=reads, check=_tp_within_node, source="search space"))
    if options.min_cp_tokens > 1:
        out.append(Rule(name="cp_min_tokens", reads=frozenset({"cp"}), check=_cp_min_tokens(options.min_cp_tokens),
                        source="search space"))
    if options.expert_within_node and job.model.is_moe:
        out.append(Rule(name="expert_within_node", reads=frozenset({"tp", "ep", "etp"}), check=_expert_within_node,
                        source="search space"))
    if options.min_pp_for_vpp > 2:
        out.append(Rule(name="vpp_min_pp", reads=frozenset({"pp", "vpp"}), check=_vpp_min_pp(options.min_pp_for_vpp),
                        source="search space"))
    return tuple(out)


SPACE_RULES: tuple[str, ...] = ("tp_within_node", "cp_min_tokens", "expert_within_node", "vpp_min_pp")


def dimension_ranges(job: Job, options: SpaceOptions) -> dict[str, tuple[object, ...]]:
    """The naive per-dimension ranges whose product is the candidate set of `space_report.rejections`.

    tp, cp, pp (and ep, etp for MoE): divisors of the world size (under the max_* caps);
    vpp: None or a v >= 2 that splits the layers, evenly or unevenly, for some PP >= 2 of that range (`vpp_values`);
    dense models do not search ep (1) or etp (None).
    """
    world, moe = job.world_size, job.model.is_moe
    world_divisors = divisors(world)
    pps = [pp for pp in _capped(world_divisors, options.max_pp) if pp >= 2]
    m = job.model
    vpps = tuple(sorted({v for pp in pps for v in vpp_values(m.num_layers, pp, mtp_layers=m.mtp_num_layers,
                                                             hybrid=m.is_hybrid) if v is not None}))
    return {
        "tp": _capped(world_divisors, options.max_tp),
        "cp": _capped(world_divisors, options.max_cp),
        "pp": _capped(world_divisors, options.max_pp),
        "vpp": (None, *_capped(vpps, options.max_vpp)),
        "ep": _capped(world_divisors, options.max_ep) if moe else (1,),
        "etp": world_divisors if moe else (None,),
        "mbs": tuple(options.micro_batch_sizes),
        "sp": (False, True),
        "ep_overlap": tuple(options.ep_overlap) if moe else (False,),
        "fsdp": tuple(options.fsdp),
        "offload_layers": offload_values(job, options),
        "dist_opt": tuple(options.dist_opt),
        "recompute": tuple(options.recompute),
        "cuda_graphs": cuda_graph_options(job, options),
    }


OFFLOAD_COUNTS_MAX = 32


def offload_values(job: Job, options: SpaceOptions) -> tuple[int, ...]:
    """The layer-offload counts the space searches: 0, then the multiples of `offload_step` below num_layers
    (`fsdp_rules.offload_layers_lt_num_layers`); only 0 for a hybrid model (`offload_hybrid`) and, a search-space
    choice, for a MoE model: NVIDIA's MoE recipes offload with the fine-grained `offload_modules`, which autotune
    does not model, and layer offload multiplies the largest spaces (`--layout` still checks and estimates it).
    At most OFFLOAD_COUNTS_MAX counts beside 0: the step is `offload_step` x ceil((L - 1) / (offload_step x 32)),
    so at step 5 up to 161 layers keep step 5 and 162 to 321 layers get 10, 20, ..."""
    step = options.offload_step
    if not step or job.model.is_hybrid or job.model.is_moe:
        return (0,)
    layers = job.model.num_layers
    step *= max(1, -(-(layers - 1) // (step * OFFLOAD_COUNTS_MAX)))
    return (0, *range(step, layers, step))


def hybrid_split_for(num_layers: int, pp: int) -> PipelineSplit | None:
    """The uneven split of a hybrid model (no VPP; megatron-core's `select_pipeline_segment` takes only first/last
    stage layers without '|' separators): `pipeline_split_for`'s first/last split at VPP 1, middle stages
    ceil(L / PP) each, the first and last sharing the rest (the last the smaller half). None when PP divides L."""
    if pp < 2 or num_layers % pp == 0:
        return None
    m = -(-num_layers // pp)
    rest = num_layers - (pp - 2) * m
    last = rest // 2
    first = rest - last
    if last < 1 or first > m:
        return None
    return {"first_stage_layers": first, "last_stage_layers": last}


@lru_cache(maxsize=4096)
def _pipeline_fields(num_layers: int, pp: int, vpp: int | None, mtp_layers: int, hybrid: bool) -> PipelineSplit:
    if num_layers % (pp * (vpp or 1)) == 0:
        return {}
    if hybrid:
        return (hybrid_split_for(num_layers, pp) if vpp is None else None) or {}
    return pipeline_split_for(num_layers, pp, vpp or 1, mtp_layers=mtp_layers) or {}


def pipeline_fields(num_layers: int, pp: int, vpp: int | None, mtp_layers: int = 0, *,
                    hybrid: bool = False) -> PipelineSplit:
    """The split fields of (PP, VPP): {} when num_layers splits evenly (or nothing splits: the rules say
    why), else the one uneven split `pipeline_split_for` (a hybrid model: `hybrid_split_for`) offers."""
    return _pipeline_fields(num_layers, pp, vpp, mtp_layers, hybrid).copy()  # a copy: the cached dict is shared


def vpp_values(num_layers: int, pp: int, min_pp_for_vpp: int = 2, *, mtp_layers: int = 0,
               hybrid: bool = False) -> list[int | None]:
    """VPP options of one PP whose layers split, evenly or by `pipeline_split_for` (None: no interleaving); a
    hybrid model has no VPP (`hybrid_rules.hybrid_vpp_needs_pipes`)."""
    if hybrid:
        return [None] if num_layers % pp == 0 or hybrid_split_for(num_layers, pp) is not None else []

    def splits(v: int) -> bool:
        return num_layers % (pp * v) == 0 or pipeline_split_for(num_layers, pp, v, mtp_layers=mtp_layers) is not None
    out: list[int | None] = [None] if splits(1) else []
    if pp >= max(2, min_pp_for_vpp):
        # a chunk holds at least one layer: v <= (num_layers + 2) / PP
        out += [v for v in range(2, (num_layers + 2) // pp + 1) if splits(v)]
    return out


# --- direct construction ---------------------------------------------------------------------------
def _tp_values(job: Job, options: SpaceOptions) -> Iterator[int]:
    m, domain = job.model, job.cluster.nvlink_domain
    for tp in _capped(divisors(job.world_size), options.max_tp):
        if options.tp_within_node and domain % tp:
            continue
        if m.num_attention_heads % tp or (m.query_groups % tp and tp % m.query_groups):
            continue
        if (qkv_output_width(m) or tp) % tp:  # rules.qkv_divisible_by_tp
            continue
        if m.num_dense_mlp_layers and m.ffn_hidden_size % tp:
            continue
        if m.moe is not None and m.moe.shared_expert_ffn_hidden_size and m.moe.shared_expert_ffn_hidden_size % tp:
            continue
        if m.mtp_num_layers and m.hidden_size % tp:
            continue
        if not mamba_tp_ok(job, tp):
            continue
        yield tp


def _shapes(job: Job, options: SpaceOptions) -> Iterator[tuple]:
    """Valid (tp, cp, pp, vpp, ep, etp, mbs, sp, ep_overlap, fsdp, offload_layers), each dimension's options from
    the earlier choices."""
    m, world = job.model, job.world_size
    seq, gbs, layers = job.training.seq_length, job.training.global_batch_size, m.num_layers
    overlaps = tuple(v for v in options.ep_overlap if not v or switch_choices(job, options, True))
    offloads = offload_values(job, options)
    muon = job.training.muon
    for tp in _tp_values(job, options):
        for cp in _capped(divisors(world // tp), options.max_cp):
            if cp > 1 and (seq % (2 * cp) or seq // cp < options.min_cp_tokens) or not mamba_cp_ok(job, tp, cp):
                continue
            sps = _sp_values(job, tp, cp)
            if not sps:
                continue
            for pp in _capped(divisors(world // (tp * cp)), options.max_pp):
                dp = world // (tp * cp * pp)
                for vpp in _capped_vpp(_vpp_options(layers, pp, options, m.mtp_num_layers, m.is_hybrid),
                                       options.max_vpp):
                    for ep, etp in _expert_values(job, options, tp * cp * dp):
                        eps = tuple(v for v in overlaps if not v or _ep_overlap_fits(job, pp, vpp, ep))
                        if not eps:
                            continue
                        for mbs in options.micro_batch_sizes:
                            if gbs % (mbs * dp):
                                continue
                            if vpp is not None and (gbs // (mbs * dp)) % pp:
                                continue
                            for sp in sps:
                                for ep_overlap in eps:
                                    # fsdp_rules: FSDP and offload at PP 1; FSDP without the EP overlap or Muon
                                    fsdps = options.fsdp if pp == 1 and not ep_overlap and not muon else (False,)
                                    for fsdp in dict.fromkeys(fsdps):
                                        for offload in (offloads if pp == 1 else (0,)):
                                            yield (tp, cp, pp, vpp, ep, etp, mbs, sp, ep_overlap, fsdp, offload)


def _ep_overlap_fits(job: Job, pp: int, vpp: int | None, ep: int) -> bool:
    """The EP A2A overlap's shape rules (`rules.ep_overlap_needs_ep`, `_needs_vpp`, `_mtp`): EP > 1, VPP with
    PP > 1, at most one MTP layer, and in 0.16.1 PP > 1 with one."""
    mtp = job.model.mtp_num_layers
    if ep == 1 or (pp > 1 and vpp is None) or mtp > 1 or job.model.is_hybrid:  # hybrid_rules.hybrid_no_ep_overlap
        return False
    return not (mtp and pp == 1 and job.training.megatron_core < "0.17")


@lru_cache(maxsize=256)
def _vpp_options(layers: int, pp: int, options: SpaceOptions, mtp_layers: int = 0,
                 hybrid: bool = False) -> tuple[int | None, ...]:
    return tuple(vpp_values(layers, pp, options.min_pp_for_vpp, mtp_layers=mtp_layers, hybrid=hybrid))


def _capped_vpp(vpps: tuple[int | None, ...], cap: int | None) -> tuple[int | None, ...]:
    return vpps if cap is None else tuple(v for v in vpps if v is None or v <= cap)


def _sp_values(job: Job, tp: int, cp: int) -> tuple[bool, ...]:
    if tp == 1:
        return (False,)
    seq = job.training.seq_length
    splits = seq % cp == 0 and (seq // cp) % tp == 0
    if job.model.is_moe:
        return (True,) if splits else ()
    return (False, True) if splits else (False,)


def _expert_values(job: Job, options: SpaceOptions, dense_group: int) -> Iterator[tuple[int, int | None]]:
    """(ep, etp) pairs with EP*ETP dividing TP*CP*DP (the GPUs of one pipeline stage)."""
    moe = job.model.moe
    if moe is None:
        yield 1, None
        return
    domain = job.cluster.nvlink_domain
    for ep in _capped(divisors(dense_group), options.max_ep):
        if moe.num_experts % ep:
            continue
        for etp in divisors(dense_group // ep):
            if job.model.add_bias_linear and etp != 1:
                break
            if moe.expert_ffn_hidden_size % etp:
                continue
            if options.expert_within_node and domain % (ep * etp) or options.tp_within_node and domain % etp:
                continue
            dispatcher, backend = job.moe_dispatcher
            if dispatcher == "flex" and ep * etp == 1 and not (backend == "hybridep"
                                                                and job.training.megatron_core >= "0.17"):
                continue  # DeepEP (and 0.16.1's every backend) needs TPxEP > 1 (`rules.flex_dispatcher_needs_tp_ep`)
            yield ep, etp


# --- the space as an index of prefixes ---------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class FeasibleSpace:
    """All valid shapes of a job, indexed by prefix; each shape takes the switches of its switch context."""

    job: Job
    options: SpaceOptions
    shapes: tuple[tuple, ...]
    # switch context (ep_overlap, fsdp, offload > 0) -> valid (dist_opt, recompute, graphs)
    switches: Mapping[SwitchContext, tuple[tuple[bool, str, str], ...]]
    _children: Mapping[tuple, tuple] = field(repr=False)

    @property
    def size(self) -> int:
        counts = {k: len(v) for k, v in self.switches.items()}
        return sum(counts.get(switch_context(*shape[-3:]), 0) for shape in self.shapes)

    @property
    def recompute(self) -> tuple[str, ...]:
        """The recompute values some shape takes."""
        return tuple(r for r in RECOMPUTE_CHOICES if any(s[1] == r for v in self.switches.values() for s in v))

    def choices(self, name: str, partial: Mapping[str, object]) -> tuple[object, ...]:
        """The values of dimension `name` that complete to a valid layout, given the earlier dimensions.

        `partial` must hold exactly the dimensions before `name` in DIMENSIONS (extra keys are ignored).
        Raises ValueError for an unknown dimension, a missing earlier one or an invalid prefix.
        """
        if name not in DIMENSIONS:
            raise ValueError(f"unknown dimension {name!r}; dimensions in order: {', '.join(DIMENSIONS)}.")
        if name in SWITCH_DIMENSIONS:
            k = SWITCH_DIMENSIONS.index(name)
            earlier = CONTEXT_DIMENSIONS + SWITCH_DIMENSIONS[:k]
            missing = [d for d in earlier if d not in partial]
            if missing:
                raise ValueError(f"choices for {name!r} need the earlier dimensions {', '.join(missing)} chosen first.")
            chosen = tuple(partial[d] for d in SWITCH_DIMENSIONS[:k])
            combos = self.switches.get(switch_context(*(partial[d] for d in CONTEXT_DIMENSIONS)), ())
            return tuple(dict.fromkeys(s[k] for s in combos if s[:k] == chosen))
        prefix = self._prefix(name, partial)
        if not self.shapes:
            return ()  # an empty space offers nothing, even for the first dimension
        if prefix not in self._children:
            raise ValueError(f"{dict(zip(DIMENSIONS, prefix, strict=False))} is not a prefix of any valid layout; "
                             f"choose each dimension from choices().")
        return self._children[prefix]

    def _prefix(self, name: str, partial: Mapping[str, object]) -> tuple:
        earlier = SHAPE_DIMENSIONS[: SHAPE_DIMENSIONS.index(name)]
        missing = [d for d in earlier if d not in partial]
        if missing:
            raise ValueError(f"choices for {name!r} need the earlier dimensions {', '.join(missing)} chosen first.")
        return tuple(partial[d] for d in earlier)

    def layout(self, values: Mapping[str, object]) -> Layout:
        """The Layout of a full choice of every dimension (dp derived); ValueError if it is not in the space."""
        missing = [d for d in DIMENSIONS if d not in values]
        if missing:
            raise ValueError(f"a layout needs every dimension; missing {', '.join(missing)}.")
        shape = tuple(values[d] for d in SHAPE_DIMENSIONS)
        switch = tuple(values[d] for d in SWITCH_DIMENSIONS)
        if shape[:-1] not in self._children or shape[-1] not in self._children[shape[:-1]] \
                or switch not in self.switches.get(switch_context(*shape[-3:]), ()):
            raise ValueError(f"{dict(values)} is not a layout of this space.")
        return _layout(self.job, shape, switch)

    def param_name(self, name: str, partial: Mapping[str, object]) -> str:
        """A parameter name unique to the prefix the choices of `name` depend on (for Optuna)."""
        if name in SWITCH_DIMENSIONS:  # the switches' choices depend on the context and the switches before them
            context = dict(zip(CONTEXT_DIMENSIONS, switch_context(*(partial.get(d) for d in CONTEXT_DIMENSIONS)),
                               strict=True))
            parts = [f"{d}{context[d]}" for d in CONTEXT_DIMENSIONS if d in partial and (d != "offload_layers"
                                                                                         or context[d])]
            earlier = SWITCH_DIMENSIONS[:SWITCH_DIMENSIONS.index(name)]
            return "_".join([name, *parts, *(f"{d}{partial[d]}" for d in earlier if d in partial)])
        prefix = self._prefix(name, partial)
        return "_".join([name, *(f"{d}{v}" for d, v in zip(SHAPE_DIMENSIONS, prefix, strict=False))])

    def layouts(self) -> Iterator[Layout]:
        for shape in self.shapes:
            for switch in self.switches[switch_context(*shape[-3:])]:
                yield _layout(self.job, shape, switch)


def _layout(job: Job, shape: tuple, switch: tuple) -> Layout:
    tp, cp, pp, vpp, ep, etp, mbs, sp, ep_overlap, fsdp, offload_layers = shape
    dist_opt, recompute, cuda_graphs = switch
    return Layout(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, dp=job.world_size // (tp * cp * pp), mbs=mbs, sp=sp,
                  dist_opt=dist_opt, recompute=recompute, cuda_graphs=cuda_graphs, ep_overlap=ep_overlap, fsdp=fsdp,
                  offload_layers=offload_layers,
                  **pipeline_fields(job.model.num_layers, pp, vpp, job.model.mtp_num_layers,
                                    hybrid=job.model.is_hybrid))


@lru_cache(maxsize=32)
def feasible_space(job: Job, options: SpaceOptions = SpaceOptions()) -> FeasibleSpace:
    """Build (once per job and options) the index of valid shapes."""
    switches = {c: switch_choices(job, options, *c) for c in CONTEXTS}
    shapes = tuple(s for s in _shapes(job, options) if switches[switch_context(*s[-3:])])
    children: dict[tuple, list] = {}
    for shape in shapes:
        for k in range(len(SHAPE_DIMENSIONS)):
            values = children.setdefault(shape[:k], [])
            if shape[k] not in values:
                values.append(shape[k])
    frozen = {prefix: tuple(values) for prefix, values in children.items()}
    return FeasibleSpace(job=job, options=options, shapes=shapes, switches=switches, _children=frozen)


@lru_cache(maxsize=256)
def switch_choices(job: Job, options: SpaceOptions, ep_overlap: bool, fsdp: bool = False,
                   offload: bool = False) -> tuple[tuple[bool, str, str], ...]:
    """The (dist_opt, recompute, cuda_graphs) a shape of switch context (ep_overlap, fsdp, offload) may take, in
    option order: CUDA graphs the model and ep_overlap allow (`rules.cuda_graph_modules_refused`,
    `full_iteration_moe_refused`, `ep_overlap_cuda_graphs_refused`), recompute less what ep_overlap forbids (no
    full; in 0.19 no selective recompute of "moe") and, per graph kind, what graphs forbid
    (`full_recompute_cuda_graphs_refused`, `te_graphs_moe_recompute_refused`); with fsdp only the distributed
    optimizer (`fsdp_rules.fsdp_needs_dist_opt`), with offload no recompute and no CUDA graphs but 0.19's
    full-iteration ones of a dense model (`offload_no_recompute`, `offload_cuda_graphs`)."""
    t, version = job.training, job.training.megatron_core
    out = []
    graphs = cuda_graph_options(job, options)
    dist_opts = tuple(d for d in options.dist_opt if d or not fsdp)
    for cuda_graphs in graphs:
        if offload and cuda_graphs != "none" and not (cuda_graphs == "full_iteration" and version >= "0.17"
                                                      and not job.model.is_moe):
            continue
        if cuda_graph_modules_refused(job, cuda_graphs, version):
            continue
        if cuda_graphs == "full_iteration" and full_iteration_moe_refused(job, version):
            continue
        if ep_overlap and ep_overlap_cuda_graphs_refused(job, cuda_graphs, version):
            continue
        for recompute in options.recompute:
            if offload and recompute != "none":
                continue
            if recompute == "full" and (ep_overlap or full_recompute_cuda_graphs_refused(cuda_graphs)
                                        or (job.model.is_hybrid and t.recompute_num_layers is not None)):
                continue  # the last: hybrid_rules.hybrid_block_recompute
            if recompute == "selective" and "moe" in t.recompute_modules and (
                    (ep_overlap and version >= "0.17") or te_graphs_moe_recompute_refused(job, cuda_graphs)):
                continue
            out += [(dist_opt, recompute, cuda_graphs) for dist_opt in dist_opts]
    return tuple(sorted(out, key=lambda s: (options.dist_opt.index(s[0]), options.recompute.index(s[1]),
                                            graphs.index(s[2]))))


def cuda_graph_options(job: Job, options: SpaceOptions) -> tuple[str, ...]:
    """The CUDA graph kinds the space enumerates: `options.cuda_graphs` when given, else `DEFAULT_CUDA_GRAPHS` less
    per-layer local graphs where the job's release refuses them (`releases.local_layer_graphs_refused`)."""
    if options.cuda_graphs is not None:
        return tuple(options.cuda_graphs)
    refused = local_layer_graphs_refused(job.training.release)
    return tuple(g for g in DEFAULT_CUDA_GRAPHS if not (g == "local" and refused))


def feasible_layouts(job: Job, options: SpaceOptions = SpaceOptions()) -> Iterator[Layout]:
    """Every valid layout of `job` within `options`, built directly (no filtering of a product)."""
    return feasible_space(job, options).layouts()
