"""Validity rules of a Megatron-Core parallel layout: one small named function per rule.

Each rule reads a `Job` and a `Layout` and returns a `Violation` (rule name, the fields and values
involved, and a message in megatron-core's own wording) or None. `check(job, layout)` runs them all
and returns every violation; an empty tuple means megatron-core accepts the layout.

The rules follow megatron-core 0.16.1 (the file named in each `Rule.source`); where core has no
check of its own, Megatron-LM's `megatron/training/arguments.py` or the place where core would
fail at run time is named instead. `docs/rules.md` lists them with their sources.

Keeping TP and EP*ETP inside one node is a search-space choice (`search_spaces/space.py`), not a
validity rule: megatron-core accepts groups that span nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from math import gcd

from search_spaces.job import Job
from search_spaces.layout import Layout

__all__ = ["Violation", "Rule", "RULES", "RULE_NAMES", "SPLIT_FIELDS", "check", "is_valid", "lcm"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Violation:
    """One broken rule: its name, the fields it read with their values, and megatron-core's message."""

    rule: str
    fields: Mapping[str, object]
    message: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.message}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    """A named rule, the layout fields it reads (`dp` included) and where megatron-core enforces it."""

    name: str
    reads: frozenset[str]
    source: str
    check: Callable[[Job, Layout], Violation | None]


def lcm(a: int, b: int) -> int:
    return a * b // gcd(a, b)


def _violation(rule: str, message: str, **fields: object) -> Violation:
    return Violation(rule=rule, fields=fields, message=message)


# --- world size and the two process grids (parallel_state.initialize_model_parallel) ------------
def world_size_divisible(job: Job, layout: Layout) -> Violation | None:
    """world % (TP * PP * CP) == 0: the dense grid tp-cp-dp-pp tiles the world."""
    world, model_size = job.world_size, layout.tp * layout.pp * layout.cp
    if world % model_size == 0:
        return None
    return _violation("world_size_divisible", f"world_size ({world}) is not divisible by {model_size} "
                      f"(tensor_model_parallel_size {layout.tp} * pipeline_model_parallel_size {layout.pp} "
                      f"* context_parallel_size {layout.cp}).",
                      world_size=world, tp=layout.tp, pp=layout.pp, cp=layout.cp)


def data_parallel_size_matches(job: Job, layout: Layout) -> Violation | None:
    """DP is derived, never set: DP = world / (TP * PP * CP) (32 GPUs, TP2 PP4 CP2: DP 2)."""
    world, model_size = job.world_size, layout.tp * layout.pp * layout.cp
    if world % model_size or layout.dp == world // model_size:
        return None  # a world that does not divide is world_size_divisible's violation
    return _violation("data_parallel_size_matches",
                      f"data_parallel_size must be world_size / (tp * pp * cp) = {world} / {model_size} = "
                      f"{world // model_size}, but got dp={layout.dp} "
                      f"(tp({layout.tp}) * pp({layout.pp}) * cp({layout.cp}) * dp({layout.dp}) != world_size({world})).",
                      world_size=world, tp=layout.tp, pp=layout.pp, cp=layout.cp, dp=layout.dp)


def expert_world_size_divisible(job: Job, layout: Layout) -> Violation | None:
    """world % (ETP * EP * PP) == 0. With the dense grid valid too, the world is a multiple of
    PP * lcm(TP*CP, EP*ETP) (MoE parallel folding, arXiv 2504.14960), and expert DP =
    world / (PP * EP * ETP) = TP*CP*DP / (EP*ETP) is an integer."""
    world, ep, etp, pp = job.world_size, layout.ep, layout.expert_tp, layout.pp
    size = etp * ep * pp
    if world % size == 0 or (layout.ep == 1 and layout.etp is None):
        return None  # EP 1, ETP = TP: TP*PP divides TP*PP*CP, world_size_divisible's business
    smallest = pp * lcm(layout.tp * layout.cp, ep * etp)
    return _violation("expert_world_size_divisible",
                      f"world_size ({world}) is not divisible by expert_tensor_model_pipeline_parallel size ({size}) "
                      f"(expert_tensor_parallel_size {etp} * expert_model_parallel_size {ep} * pipeline_model_parallel_size {pp}); "
                      f"this layout needs a multiple of PP * lcm(TP*CP, EP*ETP) = {pp} * lcm({layout.tp}*{layout.cp}, {ep}*{etp}) "
                      f"= {smallest} GPUs.",
                      world_size=world, tp=layout.tp, cp=layout.cp, pp=pp, ep=ep, etp=etp)


# --- tensor parallelism vs the model's shape (transformer_config.py, tensor_parallel/layers.py) --
def heads_divisible_by_tp(job: Job, layout: Layout) -> Violation | None:
    heads, tp = job.model.num_attention_heads, layout.tp
    if heads % tp == 0:
        return None
    return _violation("heads_divisible_by_tp", f"num_attention_heads ({heads}) must be a multiple of "
                      f"tensor_model_parallel_size ({tp}).", num_attention_heads=heads, tp=tp)


def query_groups_vs_tp(job: Job, layout: Layout) -> Violation | None:
    """megatron-core 0.16.1 accepts TP > groups when TP % groups == 0 (it replicates the KV heads)."""
    groups, tp = job.model.query_groups, layout.tp
    if groups % tp == 0 or tp % groups == 0:
        return None
    return _violation("query_groups_vs_tp", f"num_query_groups ({groups}) must be a multiple or divisor of "
                      f"tensor_model_parallel_size ({tp}).", num_query_groups=groups, tp=tp)


def ffn_divisible_by_tp(job: Job, layout: Layout) -> Violation | None:
    """Dense MLP: linear_fc1/linear_fc2 split ffn_hidden_size over TP (`divide` in tensor_parallel/layers.py)."""
    ffn, tp = job.model.ffn_hidden_size, layout.tp
    if job.model.num_dense_mlp_layers == 0 or ffn % tp == 0:
        return None
    return _violation("ffn_divisible_by_tp", f"{ffn} is not divisible by {tp} "
                      f"(ffn_hidden_size ({ffn}) must be a multiple of tensor_model_parallel_size ({tp})).",
                      ffn_hidden_size=ffn, tp=tp)


def shared_expert_ffn_divisible_by_tp(job: Job, layout: Layout) -> Violation | None:
    """Shared experts are a TP-split MLP of moe_shared_expert_intermediate_size (moe/shared_experts.py)."""
    moe, tp = job.model.moe, layout.tp
    if moe is None or not moe.shared_expert_ffn_hidden_size or moe.shared_expert_ffn_hidden_size % tp == 0:
        return None
    size = moe.shared_expert_ffn_hidden_size
    return _violation("shared_expert_ffn_divisible_by_tp", f"{size} is not divisible by {tp} "
                      f"(moe_shared_expert_intermediate_size ({size}) must be a multiple of "
                      f"tensor_model_parallel_size ({tp})).", moe_shared_expert_intermediate_size=size, tp=tp)


def expert_ffn_divisible_by_etp(job: Job, layout: Layout) -> Violation | None:
    """Each expert's fc1/fc2 split moe_ffn_hidden_size over ETP (moe/experts.py, SequentialMLP)."""
    moe, etp = job.model.moe, layout.expert_tp
    if moe is None or moe.expert_ffn_hidden_size % etp == 0:
        return None
    size = moe.expert_ffn_hidden_size
    return _violation("expert_ffn_divisible_by_etp", f"{size} is not divisible by {etp} "
                      f"(moe_ffn_hidden_size ({size}) must be a multiple of expert_tensor_parallel_size ({etp})).",
                      moe_ffn_hidden_size=size, etp=etp)


# --- pipeline and virtual pipeline (transformer_config.py, transformer_block.py, parallel_state.py) -----
def _split_fields(layout: Layout) -> dict[str, object]:
    return {"first_stage_layers": layout.first_stage_layers, "last_stage_layers": layout.last_stage_layers,
            "embedding_loss_split": layout.embedding_loss_split}


def _uneven(layout: Layout) -> bool:
    return layout.first_stage_layers is not None or layout.last_stage_layers is not None


def pipeline_split_exclusive(job: Job, layout: Layout) -> Violation | None:
    """First/last stage layer counts and the embedding/loss split are two ways to split; one at a time."""
    if not (_uneven(layout) and layout.embedding_loss_split):
        return None
    return _violation("pipeline_split_exclusive", "num_layers_in_first_pipeline_stage and "
                      "num_layers_in_last_pipeline_stage cannot be set at the same time with "
                      "account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split "
                      f"({_split_text(layout)}).", **_split_fields(layout))


def pipeline_split_needs_pp(job: Job, layout: Layout) -> Violation | None:
    """Stricter than megatron-core, which at PP 1 accepts first = num_layers and the embedding/loss split
    (no-ops) and even first + last < num_layers (then builds only `last` layers): with one stage there is
    nothing to split."""
    if layout.pp > 1 or not (_uneven(layout) or layout.embedding_loss_split):
        return None
    return _violation("pipeline_split_needs_pp", "an uneven pipeline split (num_layers_in_first_pipeline_stage, "
                      "num_layers_in_last_pipeline_stage, account_for_embedding/loss_in_pipeline_split) needs "
                      f"pipeline_model_parallel_size > 1, but got {layout.pp} ({_split_text(layout)}); drop the split or "
                      "raise PP.",
                      pp=layout.pp, **_split_fields(layout))


def layers_divisible_by_pp(job: Job, layout: Layout) -> Violation | None:
    """Even split (no uneven-split field set): num_layers % PP == 0."""
    layers, pp = job.model.num_layers, layout.pp
    if _uneven(layout) or layout.embedding_loss_split or layers % pp == 0:
        return None
    return _violation("layers_divisible_by_pp", f"num_layers should be divisible by pipeline_model_parallel_size "
                      f"(num_layers {layers}, pipeline_model_parallel_size {pp}); an uneven split "
                      f"(first_stage_layers / last_stage_layers, embedding_loss_split) may fit.",
                      num_layers=layers, pp=pp)


def layers_divisible_by_vpp(job: Job, layout: Layout) -> Violation | None:
    """Even split: each virtual stage holds an integer number of layers, num_layers % (PP * VPP) == 0."""
    layers, pp, vpp = job.model.num_layers, layout.pp, layout.vpp_size
    if _uneven(layout) or layout.embedding_loss_split or vpp == 1 or layers % pp or (layers // pp) % vpp == 0:
        return None  # layers % pp is layers_divisible_by_pp's violation
    return _violation("layers_divisible_by_vpp", f"num_layers_per_pipeline_rank {layers // pp} should be divisible "
                      f"by vp_size {vpp} (num_layers {layers}, pipeline_model_parallel_size {pp}).",
                      num_layers=layers, pp=pp, vpp=vpp)


def _stage_layers_divisible_by_vpp(which: str, count: int | None, layout: Layout) -> Violation | None:
    vpp = layout.vpp
    if count is None or vpp is None or count % vpp == 0 or layout.pp == 1:
        return None
    return _violation(f"{which}_stage_layers_divisible_by_vpp", f"number of layers at {which} stage: {count} must be "
                      f"divisible by virtual pipeline parallel degree {vpp}.",
                      **{f"{which}_stage_layers": count, "vpp": vpp})


def first_stage_layers_divisible_by_vpp(job: Job, layout: Layout) -> Violation | None:
    return _stage_layers_divisible_by_vpp("first", layout.first_stage_layers, layout)


def last_stage_layers_divisible_by_vpp(job: Job, layout: Layout) -> Violation | None:
    return _stage_layers_divisible_by_vpp("last", layout.last_stage_layers, layout)


def _split_text(layout: Layout) -> str:
    return (f"num_layers_in_first_pipeline_stage {layout.first_stage_layers}, "
            f"num_layers_in_last_pipeline_stage {layout.last_stage_layers}")


def _middle(job: Job, layout: Layout) -> tuple[int, int]:
    """(layers, stages) left for the middle stages once the first/last stage counts are taken."""
    first, last = layout.first_stage_layers, layout.last_stage_layers
    layers = job.model.num_layers - (first or 0) - (last or 0)
    return layers, layout.pp - (first is not None) - (last is not None)


def middle_stages_match(job: Job, layout: Layout) -> Violation | None:
    """Middle stages and middle layers both present or both absent (PP 2 with first + last = num_layers)."""
    if not _uneven(layout) or layout.embedding_loss_split or layout.pp == 1:
        return None
    layers, stages = _middle(job, layout)
    if bool(layers) == bool(stages):
        return None
    return _violation("middle_stages_match", f"Mismatch: {layers} middle layers remaining but {stages} middle PP "
                      f"stages available (num_layers {job.model.num_layers}, pipeline_model_parallel_size "
                      f"{layout.pp}, {_split_text(layout)}).", num_layers=job.model.num_layers, pp=layout.pp, **_split_fields(layout))


def middle_layers_divisible(job: Job, layout: Layout) -> Violation | None:
    """The middle stages share the rest equally. Stricter than megatron-core for a negative rest (first + last
    > num_layers), which its modulo lets through."""
    if not _uneven(layout) or layout.embedding_loss_split or layout.pp == 1:
        return None
    layers, stages = _middle(job, layout)
    if stages <= 0 or (layers >= 0 and layers % stages == 0):
        return None
    return _violation("middle_layers_divisible", f"number of layers at middle stage: {layers} must be divisible by "
                      f"the middle pipeline model parallel size {stages} (num_layers {job.model.num_layers}, "
                      f"pipeline_model_parallel_size {layout.pp}, {_split_text(layout)}).",
                      num_layers=job.model.num_layers, pp=layout.pp, **_split_fields(layout))


def middle_layers_divisible_by_vpp(job: Job, layout: Layout) -> Violation | None:
    if not _uneven(layout) or layout.embedding_loss_split or layout.pp == 1 or layout.vpp is None:
        return None
    layers, stages = _middle(job, layout)
    if stages <= 0 or layers < 0 or layers % stages or (layers // stages) % layout.vpp == 0:
        return None  # middle_layers_divisible's violation
    return _violation("middle_layers_divisible_by_vpp", f"number of layers on each middle pipeline rank: "
                      f"{layers // stages} must be divisible by virtual pipeline parallel degree {layout.vpp} "
                      f"(num_layers {job.model.num_layers}, pipeline_model_parallel_size {layout.pp}, "
                      f"{_split_text(layout)}).",
                      num_layers=job.model.num_layers, pp=layout.pp, vpp=layout.vpp, **_split_fields(layout))


def embedding_loss_layers_divisible_by_pp(job: Job, layout: Layout) -> Violation | None:
    """The embedding and the loss count as one layer each: (num_layers + 2) % PP == 0."""
    if not layout.embedding_loss_split or _uneven(layout) or layout.pp == 1:
        return None
    layers = job.model.num_layers + 2
    if layers % layout.pp == 0:
        return None
    return _violation("embedding_loss_layers_divisible_by_pp", f"num_layers: {layers} after enable "
                      "account_for_embedding_in_pipeline_split or account_for_loss_in_pipeline_split must be "
                      f"divisible by pipeline_model_parallel_size {layout.pp} (num_layers {job.model.num_layers}).",
                      num_layers=job.model.num_layers, pp=layout.pp, embedding_loss_split=True)


def embedding_loss_layers_divisible_by_vpp(job: Job, layout: Layout) -> Violation | None:
    if not layout.embedding_loss_split or _uneven(layout) or layout.pp == 1 or layout.vpp is None:
        return None
    layers = job.model.num_layers + 2
    if layers % layout.pp or (layers // layout.pp) % layout.vpp == 0:
        return None
    return _violation("embedding_loss_layers_divisible_by_vpp", f"number of layers on each pipeline rank: "
                      f"{layers // layout.pp} (after enable account_for_embedding_in_pipeline_split or "
                      "account_for_loss_in_pipeline_split) must be divisible by virtual_pipeline_model_parallel_size "
                      f"{layout.vpp} (num_layers {job.model.num_layers}, pipeline_model_parallel_size {layout.pp}).",
                      num_layers=job.model.num_layers, pp=layout.pp, vpp=layout.vpp,
                      embedding_loss_split=True)


def vpp_needs_pp(job: Job, layout: Layout) -> Violation | None:
    """megatron-core needs PP > 1; Megatron-LM's training script also wants PP > 2 unless
    --overlap-p2p-comm (a search-space option here, `SpaceOptions.min_pp_for_vpp`)."""
    if layout.vpp_size == 1 or layout.pp > 1:
        return None
    return _violation("vpp_needs_pp", f"pipeline-model-parallel size should be greater than 1 with interleaved "
                      f"schedule (virtual_pipeline_model_parallel_size {layout.vpp}, "
                      f"pipeline_model_parallel_size {layout.pp}).", pp=layout.pp, vpp=layout.vpp)


def vpp_microbatches(job: Job, layout: Layout) -> Violation | None:
    """Interleaved schedule with microbatch_group_size_per_vp_stage = PP (the default): PP <= M and
    M % PP == 0, M = GBS / (MBS * DP) (schedules.py, forward_backward_pipelining_with_interleaving)."""
    if layout.vpp_size == 1 or layout.pp == 1:
        return None
    gbs, pp = job.training.global_batch_size, layout.pp
    if gbs % (layout.mbs * layout.dp):
        return None  # global_batch_divisible's violation
    m = gbs // (layout.mbs * layout.dp)
    if pp <= m and m % pp == 0:
        return None
    if m < pp:
        message = (f"The number of contiguous micro-batches in a virtual pipeline stage should range in "
                   f"[PP={pp} , M={m}]")
    else:
        message = (f"The remainder of M (the total micro-batches) divided by N (number of contiguous micro-batches "
                   f"in a virtual pipeline stage) should be 0, or larger than or equal to the pipeline-parallel size, "
                   f"but it is {m % pp}.")
    message += (f" (M = global_batch_size {gbs} / (micro_batch_size {layout.mbs} * data_parallel_size {layout.dp}); "
                f"N = pipeline_model_parallel_size {pp} by default; virtual_pipeline_model_parallel_size {layout.vpp})")
    return _violation("vpp_microbatches", message, global_batch_size=gbs, mbs=layout.mbs, dp=layout.dp, pp=pp,
                      vpp=layout.vpp, num_microbatches=m)


# --- sequence and context parallelism ---------------------------------------------------------
def sp_needs_tp(job: Job, layout: Layout) -> Violation | None:
    if not layout.sp or layout.tp > 1:
        return None
    return _violation("sp_needs_tp", "Cannot use sequence parallelism without tensor parallelism "
                      f"(sequence_parallel true, tensor_model_parallel_size {layout.tp}).", sp=True, tp=layout.tp)


def moe_tp_needs_sp(job: Job, layout: Layout) -> Violation | None:
    """Raised by MoELayer.forward in training when the attention TP group is larger than 1."""
    if not job.model.is_moe or layout.tp == 1 or layout.sp:
        return None
    return _violation("moe_tp_needs_sp", "During training, performance may degrade if MoE and tensor parallelism "
                      "are enabled without also enabling sequence parallelism "
                      f"(tensor_model_parallel_size {layout.tp}, sequence_parallel false).", tp=layout.tp, sp=False)


def cp_sequence_divisible(job: Job, layout: Layout) -> Violation | None:
    """CP splits each sequence into 2*CP chunks for load balance (utils.get_batch_on_this_cp_rank)."""
    seq, cp = job.training.seq_length, layout.cp
    if cp == 1 or seq % (2 * cp) == 0:
        return None
    return _violation("cp_sequence_divisible", f"seq_length ({seq}) must be divisible by 2 * context_parallel_size "
                      f"({2 * cp}): the sequence is split into 2*CP chunks.", seq_length=seq, cp=cp)


def sp_sequence_divisible(job: Job, layout: Layout) -> Violation | None:
    """SP scatters each rank's seq_length / CP tokens over TP (tensor_parallel/mappings.py)."""
    seq, cp, tp = job.training.seq_length, layout.cp, layout.tp
    if not layout.sp or tp == 1 or seq % cp or (seq // cp) % tp == 0:
        return None
    return _violation("sp_sequence_divisible", "First dimension of the tensor should be divisible by tensor parallel "
                      f"size (seq_length / context_parallel_size = {seq}/{cp}, tensor_model_parallel_size {tp}).",
                      seq_length=seq, cp=cp, tp=tp, sp=True)


# --- experts (transformer_config.py, moe/moe_layer.py) --------------------------------------------
def ep_needs_moe(job: Job, layout: Layout) -> Violation | None:
    if layout.ep == 1 or job.model.is_moe:
        return None
    return _violation("ep_needs_moe", "num_moe_experts must be non None to use expert-parallel "
                      f"(model {job.model.name!r} is dense, expert_model_parallel_size {layout.ep}).",
                      num_moe_experts=None, ep=layout.ep)


def experts_divisible_by_ep(job: Job, layout: Layout) -> Violation | None:
    """Each GPU holds num_moe_experts / EP experts (8 experts, EP 4: 2 per GPU)."""
    moe, ep = job.model.moe, layout.ep
    if moe is None or moe.num_experts % ep == 0:
        return None
    return _violation("experts_divisible_by_ep", f"num_moe_experts ({moe.num_experts}) must be a multiple of "
                      f"expert_model_parallel_size ({ep}).", num_moe_experts=moe.num_experts, ep=ep)


def moe_bias_needs_etp1(job: Job, layout: Layout) -> Violation | None:
    if not (job.model.is_moe and job.model.add_bias_linear) or layout.expert_tp == 1:
        return None
    return _violation("moe_bias_needs_etp1", "Bias in Moe is only supported when ETP==1 "
                      f"(add_bias_linear true, expert_tensor_parallel_size {layout.expert_tp}).",
                      add_bias_linear=True, etp=layout.expert_tp)


# --- batch (num_microbatches_calculator.py) ---------------------------------------------------------
def global_batch_divisible(job: Job, layout: Layout) -> Violation | None:
    gbs, mbs, dp = job.training.global_batch_size, layout.mbs, layout.dp
    if gbs % (mbs * dp) == 0:
        return None
    return _violation("global_batch_divisible", f"global batch size ({gbs}) is not divisible by micro batch size "
                      f"({mbs}) times data parallel size ({dp})", global_batch_size=gbs, mbs=mbs, dp=dp)


_CORE = "megatron/core/"
_DENSE = frozenset({"tp", "pp", "cp", "dp"})
# the split fields are derived from (num_layers, PP, VPP) in the space (`layout.pipeline_split_for`)
SPLIT_FIELDS: frozenset[str] = frozenset({"first_stage_layers", "last_stage_layers", "embedding_loss_split"})
_SPLIT = SPLIT_FIELDS
_PIPE = frozenset({"pp", "vpp"}) | SPLIT_FIELDS
_UNEVEN = _CORE + "transformer/transformer_config.py (__post_init__, Uneven PP)"
RULES: tuple[Rule, ...] = (
    Rule(name="world_size_divisible", reads=frozenset({"tp", "pp", "cp"}), check=world_size_divisible,
         source=_CORE + "parallel_state.py (initialize_model_parallel)"),
    Rule(name="data_parallel_size_matches", reads=_DENSE, check=data_parallel_size_matches,
         source=_CORE + "parallel_state.py (initialize_model_parallel: data_parallel_size = world_size // model_size)"),
    Rule(name="heads_divisible_by_tp", reads=frozenset({"tp"}), check=heads_divisible_by_tp,
         source=_CORE + "transformer/transformer_config.py (__post_init__)"),
    Rule(name="query_groups_vs_tp", reads=frozenset({"tp"}), check=query_groups_vs_tp,
         source=_CORE + "transformer/transformer_config.py (__post_init__)"),
    Rule(name="ffn_divisible_by_tp", reads=frozenset({"tp"}), check=ffn_divisible_by_tp,
         source=_CORE + "tensor_parallel/layers.py (ColumnParallelLinear / RowParallelLinear: utils.divide)"),
    Rule(name="shared_expert_ffn_divisible_by_tp", reads=frozenset({"tp"}), check=shared_expert_ffn_divisible_by_tp,
         source=_CORE + "transformer/moe/shared_experts.py (TP-split MLP: utils.divide)"),
    Rule(name="sp_needs_tp", reads=frozenset({"tp", "sp"}), check=sp_needs_tp,
         source=_CORE + "model_parallel_config.py (__post_init__)"),
    Rule(name="moe_tp_needs_sp", reads=frozenset({"tp", "sp"}), check=moe_tp_needs_sp,
         source=_CORE + "transformer/moe/moe_layer.py (MoELayer.forward)"),
    Rule(name="cp_sequence_divisible", reads=frozenset({"cp"}), check=cp_sequence_divisible,
         source=_CORE + "utils.py (get_batch_on_this_cp_rank)"),
    Rule(name="sp_sequence_divisible", reads=frozenset({"tp", "cp", "sp"}), check=sp_sequence_divisible,
         source=_CORE + "tensor_parallel/mappings.py (_split_along_first_dim)"),
    Rule(name="vpp_needs_pp", reads=frozenset({"pp", "vpp"}), check=vpp_needs_pp,
         source=_CORE + "parallel_state.py (initialize_model_parallel)"),
    Rule(name="pipeline_split_exclusive", reads=_SPLIT, check=pipeline_split_exclusive,
         source=_UNEVEN),
    Rule(name="pipeline_split_needs_pp", reads=_PIPE, check=pipeline_split_needs_pp,
         source=_CORE + "transformer/transformer_config.py (Uneven PP; autotune is stricter: it lets PP 1 through)"),
    Rule(name="layers_divisible_by_pp", reads=_PIPE, check=layers_divisible_by_pp,
         source=_CORE + "transformer/transformer_block.py (get_num_layers_to_build)"),
    Rule(name="layers_divisible_by_vpp", reads=_PIPE, check=layers_divisible_by_vpp,
         source=_CORE + "transformer/transformer_block.py (get_num_layers_to_build)"),
    Rule(name="first_stage_layers_divisible_by_vpp", reads=_PIPE, check=first_stage_layers_divisible_by_vpp,
         source=_UNEVEN),
    Rule(name="last_stage_layers_divisible_by_vpp", reads=_PIPE, check=last_stage_layers_divisible_by_vpp,
         source=_UNEVEN),
    Rule(name="middle_stages_match", reads=_PIPE, check=middle_stages_match, source=_UNEVEN),
    Rule(name="middle_layers_divisible", reads=_PIPE, check=middle_layers_divisible, source=_UNEVEN),
    Rule(name="middle_layers_divisible_by_vpp", reads=_PIPE, check=middle_layers_divisible_by_vpp, source=_UNEVEN),
    Rule(name="embedding_loss_layers_divisible_by_pp", reads=_PIPE, check=embedding_loss_layers_divisible_by_pp,
         source=_UNEVEN),
    Rule(name="embedding_loss_layers_divisible_by_vpp", reads=_PIPE, check=embedding_loss_layers_divisible_by_vpp,
         source=_UNEVEN),
    Rule(name="ep_needs_moe", reads=frozenset({"ep"}), check=ep_needs_moe,
         source=_CORE + "transformer/transformer_config.py (__post_init__)"),
    Rule(name="experts_divisible_by_ep", reads=frozenset({"ep"}), check=experts_divisible_by_ep,
         source=_CORE + "transformer/moe/moe_layer.py (BaseMoELayer.__init__)"),
    Rule(name="moe_bias_needs_etp1", reads=frozenset({"tp", "etp"}), check=moe_bias_needs_etp1,
         source=_CORE + "transformer/transformer_config.py (__post_init__)"),
    Rule(name="expert_ffn_divisible_by_etp", reads=frozenset({"tp", "etp"}), check=expert_ffn_divisible_by_etp,
         source=_CORE + "transformer/moe/experts.py (SequentialMLP experts: utils.divide)"),
    Rule(name="expert_world_size_divisible", reads=frozenset({"tp", "cp", "pp", "ep", "etp"}),
         check=expert_world_size_divisible, source=_CORE + "parallel_state.py (initialize_model_parallel)"),
    Rule(name="global_batch_divisible", reads=frozenset({"mbs", "dp"}), check=global_batch_divisible,
         source=_CORE + "num_microbatches_calculator.py (ConstantNumMicroBatchesCalculator)"),
    Rule(name="vpp_microbatches", reads=frozenset({"pp", "vpp", "mbs", "dp"}), check=vpp_microbatches,
         source=_CORE + "pipeline_parallel/schedules.py (forward_backward_pipelining_with_interleaving)"),
)
RULE_NAMES: tuple[str, ...] = tuple(r.name for r in RULES)


def _require_positive(layout: Layout) -> None:
    for name in ("tp", "pp", "cp", "ep", "dp", "mbs"):
        if getattr(layout, name) <= 0:
            raise ValueError(f"`{name} > 0` must hold, but got ({name}={getattr(layout, name)}).")
    for name in ("vpp", "etp"):
        value = getattr(layout, name)
        if value is not None and value <= 0:
            raise ValueError(f"`{name} > 0` (or unset) must hold, but got ({name}={value}).")
    for name, megatron in (("first_stage_layers", "num_layers_in_first_pipeline_stage"),
                           ("last_stage_layers", "num_layers_in_last_pipeline_stage")):
        value = getattr(layout, name)
        if value is not None and value <= 0:
            raise ValueError(f"{megatron} must be larger than 0, but got ({name}={value}).")


def check(job: Job, layout: Layout, rules: tuple[Rule, ...] = RULES) -> tuple[Violation, ...]:
    """Every violation of `layout` in `job`, in rule order; () when megatron-core accepts it.

    Raises ValueError only for sizes that are not positive (bad input, not an infeasible layout).
    """
    _require_positive(layout)
    found = (rule.check(job, layout) for rule in rules)
    return tuple(v for v in found if v is not None)


def is_valid(job: Job, layout: Layout) -> bool:
    return not check(job, layout)
