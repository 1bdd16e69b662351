"""Validity rules of a Megatron-Core parallel layout: one small named function per rule.

(Over 600 lines on purpose: the table of the core rules, their fields and sources, sits beside the functions it
names; the pipeline, FSDP and hybrid rules have their own modules.)

Each rule reads a `Job` and a `Layout` and returns a `Violation` (rule name, the fields and values
involved, and a message in megatron-core's own wording) or None. `check(job, layout)` runs them all
and returns every violation; an empty tuple means megatron-core accepts the layout and builds every
pipeline stage and virtual chunk of it (`tests/test_megatron_parity.py` builds them). A violation with
`stricter=True` is a deliberate refusal: megatron-core accepts the layout, and the message says why
autotune does not.

The rules follow the megatron-core release the job targets (`TrainingSpec.megatron_core`, by default the installed
one; `search_spaces/megatron_version.py`): `rules_for(version)` swaps in 0.19's checks where they differ
(`docs/rules.md` has the comparison). Where core has no check of its own, the place where it fails at run time is named.
The pipeline-split rules live in `pipeline_rules.py`.

Keeping TP and EP*ETP inside one node is a search-space choice (`search_spaces/space.py`), not a
validity rule: megatron-core accepts groups that span nodes.
"""

from __future__ import annotations

from functools import lru_cache
from math import gcd

from search_spaces import hybrid_rules
from search_spaces.fsdp_rules import FSDP_RULES, fsdp_rule_checks
from search_spaces.hybrid_rules import HYBRID_RULES
from search_spaces.job import Job
from search_spaces.layout import SPLIT_FIELDS, Layout
from search_spaces.megatron_version import rule_set_for, rules_version
from search_spaces.pipeline_rules import pipeline_rule_checks
from search_spaces.violations import STRICTER, Rule, Violation
from search_spaces.violations import violation as _violation

__all__ = ["Violation", "Rule", "RULES", "RULE_NAMES", "SPLIT_FIELDS", "check", "is_valid", "lcm", "rules_for",
           "ep_overlap_cuda_graphs_refused", "full_recompute_cuda_graphs_refused", "cuda_graph_modules_refused",
           "full_iteration_moe_refused", "te_graphs_moe_recompute_refused"]


def lcm(a: int, b: int) -> int:
    return a * b // gcd(a, b)


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
                      f"(tp({layout.tp}) * pp({layout.pp}) * cp({layout.cp}) * dp({layout.dp}) "
                      f"!= world_size({world})).",
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
                      f"(expert_tensor_parallel_size {etp} * expert_model_parallel_size {ep} "
                      f"* pipeline_model_parallel_size {pp}); "
                      f"this layout needs a multiple of PP * lcm(TP*CP, EP*ETP) "
                      f"= {pp} * lcm({layout.tp}*{layout.cp}, {ep}*{etp}) = {smallest} GPUs.",
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


def qkv_output_width(model) -> int | None:  # noqa: ANN001 (a ModelSpec)
    """Output features of a (non-MLA) attention layer's fused `linear_qkv`: (heads + 2 * query groups) * head dim,
    megatron-core `transformer/attention.py` (SelfAttention: query_projection_size + 2 * kv_projection_size);
    None for MLA, which has no fused QKV projection."""
    if model.mla is not None:
        return None
    return model.head_dim * (model.num_attention_heads + 2 * model.query_groups)


def qkv_divisible_by_tp(job: Job, layout: Layout) -> Violation | None:
    """The fused QKV projection is column-parallel: its output splits over TP (`ColumnParallelLinear`,
    `utils.divide`). Heads and groups that divide by TP give that; with TP > groups (the KV heads replicated,
    `query_groups_vs_tp`) it is a condition of its own: 12 heads, 4 groups of 8 at TP 12 give 160 outputs."""
    width, tp, m = qkv_output_width(job.model), layout.tp, job.model
    if width is None or width % tp == 0:
        return None
    if m.num_attention_heads % tp or m.query_groups % tp == 0 or tp % m.query_groups:
        return None  # heads_divisible_by_tp's or query_groups_vs_tp's (the split fails there first)
    return _violation("qkv_divisible_by_tp", f"{width} is not divisible by {tp} (linear_qkv's output, "
                      f"(num_attention_heads {m.num_attention_heads} + 2 * num_query_groups {m.query_groups}) * "
                      f"kv_channels {m.head_dim}, split over tensor_model_parallel_size {tp}).",
                      qkv_width=width, tp=tp)


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


# --- precision (transformer_config.py) ----------------------------------------------------------------------
def bf16_layers_within_stage(job: Job, layout: Layout) -> Violation | None:
    """An FP8 run's BF16 edge layers fit in one pipeline stage's share of the layers (megatron-core checks FP8
    runs only; an FP4 run's counts go unchecked)."""
    t = job.training
    if not t.fp8 or not (t.bf16_layers_at_start or t.bf16_layers_at_end):
        return None
    most = job.model.num_layers // layout.pp
    for name, value in (("start", t.bf16_layers_at_start), ("end", t.bf16_layers_at_end)):
        if value > most:
            return _violation("bf16_layers_within_stage",
                              f"num_layers_at_{name}_in_bf16 ({value}) must be between 0 and number of layers per "
                              f"pipeline stage ({most}) (num_layers {job.model.num_layers} // "
                              f"pipeline_model_parallel_size {layout.pp}).", pp=layout.pp,
                              num_layers=job.model.num_layers, bf16_layers=value)
    return None


# --- virtual pipeline (parallel_state.py, pipeline_parallel/schedules.py) ---------------------------------
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
    """A hard error, despite its wording: `MoELayer.forward` raises ValueError in training when the
    attention TP group is larger than 1 and sequence parallelism is off."""
    if not job.model.is_moe or layout.tp == 1 or layout.sp:
        return None
    return _violation("moe_tp_needs_sp", f"a MoE model with tensor_model_parallel_size {layout.tp} needs "
                      "sequence_parallel true, but got sp=false: megatron-core's MoELayer.forward raises "
                      "ValueError in training ('During training, performance may degrade if MoE and tensor "
                      "parallelism are enabled without also enabling sequence parallelism.').",
                      tp=layout.tp, sp=False)


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


def mtp_hidden_divisible_by_tp(job: Job, layout: Layout) -> Violation | None:
    """An MTP layer's `eh_proj` is a ColumnParallelLinear 2h -> h (multi_token_prediction.py): h / TP rows."""
    h, tp = job.model.hidden_size, layout.tp
    if not job.model.mtp_num_layers or h % tp == 0:
        return None
    return _violation("mtp_hidden_divisible_by_tp", f"{h} is not divisible by {tp} (the MTP layer's eh_proj splits "
                      f"hidden_size ({h}) over tensor_model_parallel_size ({tp}); mtp_num_layers "
                      f"{job.model.mtp_num_layers}).", hidden_size=h, tp=tp)


# --- the MoE all-to-all overlap and CUDA graphs (layout switches; transformer_config.py, token_dispatcher.py) ------
def ep_overlap_needs_ep(job: Job, layout: Layout) -> Violation | None:
    if not layout.ep_overlap or layout.ep > 1:
        return None
    return _violation("ep_overlap_needs_ep", "overlap_moe_expert_parallel_comm is only supported with expert model "
                      f"parallelism (expert_model_parallel_size {layout.ep}).", ep=layout.ep, ep_overlap=True)


def ep_overlap_needs_vpp(job: Job, layout: Layout) -> Violation | None:
    if not layout.ep_overlap or layout.pp == 1 or layout.vpp is not None:
        return None
    return _violation("ep_overlap_needs_vpp", "If enabling EP A2A overlap, virtual_pipeline_model_parallel_size must "
                      f"be specified when pipeline_model_parallel_size > 1 (pipeline_model_parallel_size {layout.pp}, "
                      "vpp unset).", pp=layout.pp, vpp=None, ep_overlap=True)


def ep_overlap_no_full_recompute(job: Job, layout: Layout) -> Violation | None:
    if not layout.ep_overlap or layout.recompute != "full":
        return None
    return _violation("ep_overlap_no_full_recompute", "disable full recomputation when enabling "
                      "overlap_moe_expert_parallel_comm (recompute full).", recompute="full", ep_overlap=True)


def ep_overlap_cuda_graphs_refused(job: Job, cuda_graphs: str, version: str) -> str | None:
    """Why megatron-core refuses `cuda_graphs` with `overlap_moe_expert_parallel_comm` in `job`, or None. Both
    versions refuse per-layer graphs that capture `moe` or `mlp` (transformer_config.py, 0.16.1 :1897-1906, 0.19.0
    :2738-2746); 0.16.1 also refuses any implementation but Transformer Engine's."""
    if cuda_graphs in ("none", "full_iteration") and not (version < "0.17" and cuda_graphs == "full_iteration"):
        return None
    if cuda_graphs in ("transformer_engine", "local") and {"moe", "mlp"} & set(job.cuda_graph_modules):
        return f"cuda_graph_modules {list(job.cuda_graph_modules)}"
    if version < "0.17" and cuda_graphs != "transformer_engine":
        return f"cuda_graph_impl {cuda_graphs}; megatron-core 0.16.1 asks for transformer_engine"
    return None


def full_recompute_cuda_graphs_refused(cuda_graphs: str) -> bool:
    """Whether megatron-core refuses full recompute with these CUDA graphs: any graphs but full-iteration ones
    (0.16.1 spells them local graphs with the scope `full_iteration`; 0.19 `cuda_graph_impl="full_iteration"`,
    transformer/cuda_graph_config.py:11 and :53-55; both refuse it with Transformer Engine's graphs, 0.16.1
    transformer_config.py:1738-1742, 0.19.2 cuda_graph_config.py:107-111). The check:
    transformer/transformer_config.py `__post_init__`, 0.16.1 :1780-1784, 0.19.2 :2521-2525."""
    return cuda_graphs not in ("none", "full_iteration")


def cuda_graphs_no_full_recompute(job: Job, layout: Layout) -> Violation | None:
    """Full recompute runs only under full-iteration CUDA graphs (`full_recompute_cuda_graphs_refused`)."""
    if layout.recompute != "full" or not full_recompute_cuda_graphs_refused(layout.cuda_graphs):
        return None
    return _violation("cuda_graphs_no_full_recompute", "full recompute is only supported with full iteration CUDA "
                      f"graph. (recompute full; cuda_graph_impl {layout.cuda_graphs}, cuda_graph_modules "
                      f"{list(job.cuda_graph_modules)})", recompute="full", cuda_graphs=layout.cuda_graphs)


def cuda_graph_modules_refused(job: Job, cuda_graphs: str, version: str = "0.19.2") -> str | None:
    """megatron-core's message when per-layer graphs cannot capture the job's `cuda_graph_modules`, whatever the
    layout, or None (transformer_config.py `__post_init__`, 0.19.2 :2478-2520): `moe_preprocess` needs
    `moe_router`; `moe` / `moe_router` exist only in MoE models, `mlp` only where dense layers are; a MoE block that
    is not drop-and-pad (a capacity factor and padding) cannot be captured whole (0.19 only), and the alltoall
    dispatcher's preprocess copies to the host when tokens drop without padding."""
    if cuda_graphs not in ("local", "transformer_engine"):
        return None
    modules, m = set(job.cuda_graph_modules), job.model
    if "moe_preprocess" in modules and "moe_router" not in modules:
        return "moe_preprocess cuda graph is only supported with moe_router cuda graph."
    if not m.is_moe and {"moe", "moe_router"} & modules:
        return "moe cuda graph is only supported for MoE."
    if m.is_moe and m.num_dense_mlp_layers == 0 and "mlp" in modules:
        return "mlp cuda graph is only supported for dense layers, but not found in the model."
    drop_pad = job.training.moe_drop_padded
    if m.is_moe and "moe" in modules and version >= "0.17" and not drop_pad:
        return "moe cuda graph is only supported with drop-padding MoE."
    if (m.is_moe and not drop_pad and "moe_preprocess" in modules and job.moe_dispatcher[0] == "alltoall"
            and job.training.moe_expert_capacity_factor is not None):
        return ("moe_preprocess cuda graph is not supported when there are DtoH copies and synchronizations in the "
                "preprocess step.")
    return None


def te_graphs_moe_recompute_refused(job: Job, cuda_graphs: str) -> bool:
    """Whether megatron-core refuses selective recompute of `moe` under Transformer Engine graphs of the MoE
    router ("moe recompute is not supported with moe_router CUDA graph", transformer_config.py 0.19.2 :2529-2536;
    0.16.1 :1785-1791)."""
    return (cuda_graphs == "transformer_engine" and "moe" in job.training.recompute_modules
            and "moe_router" in job.cuda_graph_modules)


def te_graphs_moe_recompute(job: Job, layout: Layout) -> Violation | None:
    if layout.recompute != "selective" or not te_graphs_moe_recompute_refused(job, layout.cuda_graphs):
        return None
    return _violation("te_graphs_moe_recompute", "moe recompute is not supported with moe_router CUDA graph with: "
                      "--cuda-graph-impl transformer_engine. (recompute selective, recompute_modules "
                      f"{list(job.training.recompute_modules)}, cuda_graph_modules {list(job.cuda_graph_modules)})",
                      recompute="selective", cuda_graphs="transformer_engine")


def full_iteration_moe_refused(job: Job, version: str) -> str | None:
    """Why full-iteration CUDA graphs cannot run the job's MoE model, or None. A captured iteration needs static
    token buffers: the alltoall dispatcher copies the per-expert counts to the host every step
    (`MoEAlltoAllTokenDispatcher.preprocess`), which a graph cannot capture. Megatron-Bridge 0.6 runs them with the
    paged stash and a rank capacity factor (`perf_recipes/qwen/common.py::_enable_hybridep_full_iteration_mxfp8`),
    which megatron-core 0.19 allows only with the hybridep or ncclep flex backend ("moe_expert_rank_capacity_factor
    requires moe_flex_dispatcher_backend to be 'hybridep' or 'ncclep'.", transformer_config.py :1692-1697);
    0.16.1 has no paged stash."""
    if not job.model.is_moe:
        return None
    if version < "0.17":
        return "megatron-core 0.16.1 has no MoE paged stash (static token buffers) to capture a dropless MoE model"
    dispatcher, backend = job.moe_dispatcher
    if dispatcher != "flex" or backend not in ("hybridep", "ncclep"):
        return ("moe_expert_rank_capacity_factor requires moe_flex_dispatcher_backend to be 'hybridep' or 'ncclep' "
                f"(the paged stash full-iteration graphs of a MoE model run with; moe_token_dispatcher_type "
                f"{dispatcher}, backend {backend})")
    return None


def _version_checks(version: str):
    """The checks whose condition or wording changed between megatron-core 0.16.1 and 0.19 (docs/rules.md)."""
    def flex_dispatcher_needs_tp_ep(job: Job, layout: Layout) -> Violation | None:
        """The flex dispatcher's DeepEP backend (megatron-core's default `moe_flex_dispatcher_backend`) needs an
        expert group of more than one GPU. 0.16.1 asserts it for every backend, 0.19 for deepep and ncclep."""
        dispatcher, backend = job.moe_dispatcher
        if dispatcher != "flex" or not job.model.is_moe or layout.ep * layout.expert_tp > 1:
            return None
        if version >= "0.17" and backend == "hybridep":  # token_dispatcher.py: 0.19 asserts it for deepep/ncclep
            return None
        name = "Flex token dispatcher" if version < "0.17" else "DeepEP dispatcher"
        return _violation("flex_dispatcher_needs_tp_ep", f"{name} requires TPxEP > 1 (expert_tensor_parallel_size "
                          f"{layout.expert_tp} x expert_model_parallel_size {layout.ep} = "
                          f"{layout.ep * layout.expert_tp}; moe_token_dispatcher_type flex).",
                          ep=layout.ep, etp=layout.expert_tp, moe_token_dispatcher="flex")

    def ep_overlap_recompute_modules(job: Job, layout: Layout) -> Violation | None:
        """0.19 only: `assert "moe" not in self.recompute_modules`."""
        t = job.training
        if version < "0.17" or not layout.ep_overlap or layout.recompute != "selective" \
                or "moe" not in t.recompute_modules:
            return None
        return _violation("ep_overlap_recompute_modules", "disable moe in recompute_modules when enabling "
                          f"overlap_moe_expert_parallel_comm (recompute selective, recompute_modules "
                          f"{list(t.recompute_modules)}).", recompute="selective", ep_overlap=True)

    def ep_overlap_mtp(job: Job, layout: Layout) -> Violation | None:
        """At most one MTP layer; 0.16.1 also needs PP > 1 with one (dropped in 0.19)."""
        mtp = job.model.mtp_num_layers
        if not layout.ep_overlap or not mtp:
            return None
        if mtp > 1:
            text = ("MTP layernum only supports 1 when enabling overlap_moe_expert_parallel_comm." if version < "0.17"
                    else "MTP supports at most one layer when enabling overlap_moe_expert_parallel_comm.")
        elif version < "0.17" and layout.pp == 1:
            text = ("Pipeline model parallel size must be larger than 1 when enabling "
                    "overlap_moe_expert_parallel_comm with MTP layer.")
        else:
            return None
        return _violation("ep_overlap_mtp", f"{text} (mtp_num_layers {mtp}, pipeline_model_parallel_size "
                          f"{layout.pp}).", mtp_num_layers=mtp, pp=layout.pp, ep_overlap=True)

    def ep_overlap_cuda_graphs(job: Job, layout: Layout) -> Violation | None:
        """`ep_overlap_cuda_graphs_refused`, reported on layouts with EP > 1 (without, `ep_overlap_needs_ep`)."""
        why = ep_overlap_cuda_graphs_refused(job, layout.cuda_graphs, version) if layout.ep_overlap else None
        if why is None or layout.ep <= 1:
            return None
        return _violation("ep_overlap_cuda_graphs", "CUDA graph scope on moe and mlp is not supported with "
                          f"overlap_moe_expert_parallel_comm ({why}).", cuda_graphs=layout.cuda_graphs,
                          ep_overlap=True)

    def cuda_graph_modules_supported(job: Job, layout: Layout) -> Violation | None:
        """`cuda_graph_modules_refused` for the layout's per-layer graphs."""
        why = cuda_graph_modules_refused(job, layout.cuda_graphs, version)
        if why is None:
            return None
        return _violation("cuda_graph_modules_supported", f"{why} (cuda_graph_impl {layout.cuda_graphs}, "
                          f"cuda_graph_modules {list(job.cuda_graph_modules)})", cuda_graphs=layout.cuda_graphs)

    def full_iteration_moe(job: Job, layout: Layout) -> Violation | None:
        """`full_iteration_moe_refused`: where a run fails, at capture or in megatron-core's config check."""
        why = full_iteration_moe_refused(job, version) if layout.cuda_graphs == "full_iteration" else None
        if why is None:
            return None
        # megatron-core's config accepts the layout; the run fails when the dispatcher's host copy is captured
        return _violation("full_iteration_moe", f"{STRICTER} full-iteration CUDA graphs of a MoE model need the "
                          f"paged stash: {why}.", stricter=True, cuda_graphs="full_iteration")

    return {fn.__name__: fn for fn in (flex_dispatcher_needs_tp_ep, ep_overlap_recompute_modules, ep_overlap_mtp,
                                        ep_overlap_cuda_graphs, cuda_graph_modules_supported, full_iteration_moe)}


# --- batch (num_microbatches_calculator.py) ---------------------------------------------------------
def global_batch_divisible(job: Job, layout: Layout) -> Violation | None:
    gbs, mbs, dp = job.training.global_batch_size, layout.mbs, layout.dp
    if gbs % (mbs * dp) == 0:
        return None
    return _violation("global_batch_divisible", f"global batch size ({gbs}) is not divisible by micro batch size "
                      f"({mbs}) times data parallel size ({dp})", global_batch_size=gbs, mbs=mbs, dp=dp)


_CORE = "megatron/core/"
_DENSE = frozenset({"tp", "pp", "cp", "dp"})
_SPLIT = SPLIT_FIELDS  # derived from (num_layers, PP, VPP) in the space (`space.pipeline_fields`)
_PIPE = frozenset({"pp", "vpp"}) | SPLIT_FIELDS
_UNEVEN = _CORE + "transformer/transformer_config.py (__post_init__, Uneven PP)"
_PP_LAYOUT = _CORE + "transformer/pipeline_parallel_layer_layout.py (PipelineParallelLayerLayout)"
_EP_OVERLAP = _CORE + "transformer/transformer_config.py (__post_init__, overlap_moe_expert_parallel_comm)"
# (name, fields read, source); the check functions are looked up per megatron-core version
_TABLE: tuple[tuple[str, frozenset[str], str], ...] = (
    ("world_size_divisible", frozenset({"tp", "pp", "cp"}), _CORE + "parallel_state.py (initialize_model_parallel)"),
    ("data_parallel_size_matches", _DENSE,
     _CORE + "parallel_state.py (initialize_model_parallel: data_parallel_size = world_size // model_size)"),
    ("heads_divisible_by_tp", frozenset({"tp"}), _CORE + "transformer/transformer_config.py (__post_init__)"),
    ("query_groups_vs_tp", frozenset({"tp"}), _CORE + "transformer/transformer_config.py (__post_init__)"),
    ("qkv_divisible_by_tp", frozenset({"tp"}),
     _CORE + "transformer/attention.py (SelfAttention.linear_qkv: ColumnParallelLinear, utils.divide)"),
    ("ffn_divisible_by_tp", frozenset({"tp"}),
     _CORE + "tensor_parallel/layers.py (ColumnParallelLinear / RowParallelLinear: utils.divide)"),
    ("shared_expert_ffn_divisible_by_tp", frozenset({"tp"}),
     _CORE + "transformer/moe/shared_experts.py (TP-split MLP: utils.divide)"),
    ("mtp_hidden_divisible_by_tp", frozenset({"tp"}),
     _CORE + "transformer/multi_token_prediction.py (MultiTokenPredictionLayer.eh_proj: utils.divide)"),
    ("sp_needs_tp", frozenset({"tp", "sp"}), _CORE + "model_parallel_config.py (__post_init__)"),
    ("moe_tp_needs_sp", frozenset({"tp", "sp"}), _CORE + "transformer/moe/moe_layer.py (MoELayer.forward)"),
    ("cp_sequence_divisible", frozenset({"cp"}), _CORE + "utils.py (get_batch_on_this_cp_rank)"),
    ("sp_sequence_divisible", frozenset({"tp", "cp", "sp"}),
     _CORE + "tensor_parallel/mappings.py (_split_along_first_dim)"),
    ("vpp_needs_pp", frozenset({"pp", "vpp"}), _CORE + "parallel_state.py (initialize_model_parallel)"),
    ("bf16_layers_within_stage", frozenset({"pp"}),
     _CORE + "transformer/transformer_config.py (__post_init__, first_last_layers_bf16)"),
    ("pipeline_split_exclusive", _SPLIT, _UNEVEN),
    ("pipeline_layout_exclusive", _SPLIT, _CORE + "transformer/transformer_config.py (__post_init__, PP layout)"),
    ("pipeline_split_needs_pp", _PIPE,
     _CORE + "transformer/transformer_config.py (Uneven PP; autotune is stricter: megatron-core lets PP 1 through)"),
    ("layers_divisible_by_pp", _PIPE, _CORE + "transformer/transformer_block.py (get_num_layers_to_build)"),
    ("layers_divisible_by_vpp", _PIPE, _CORE + "transformer/transformer_block.py (get_num_layers_to_build)"),
    ("first_stage_layers_divisible_by_vpp", _PIPE, _UNEVEN),
    ("last_stage_layers_divisible_by_vpp", _PIPE, _UNEVEN),
    ("middle_stages_match", _PIPE, _UNEVEN),
    ("first_last_within_num_layers", _PIPE,
     _UNEVEN + "; autotune is stricter: megatron-core lets a negative middle through"),
    ("middle_layers_divisible", _PIPE, _UNEVEN),
    ("middle_layers_divisible_by_vpp", _PIPE, _UNEVEN),
    ("first_last_vpp_needs_middle_stage", _PIPE,
     _CORE + "transformer/transformer_layer.py (get_transformer_layer_offset: ZeroDivisionError on PP rank 1)"),
    ("embedding_loss_layers_divisible_by_pp", _PIPE, _UNEVEN),
    ("embedding_loss_layers_divisible_by_vpp", _PIPE, _UNEVEN),
    ("pipeline_layout_syntax", _PIPE, _PP_LAYOUT + ", parse_str_to_list"),
    ("pipeline_layout_divisible_by_pp", _PIPE, _PP_LAYOUT + ", __init__"),
    ("pipeline_layout_vpp_matches", _PIPE, _CORE + "transformer/transformer_config.py (__post_init__, PP layout)"),
    ("pipeline_layout_embedding_and_loss", _PIPE, _PP_LAYOUT + ", validate_layer_layout"),
    ("pipeline_layout_decoder_count", _PIPE, _PP_LAYOUT + ", validate_layer_layout"),
    ("pipeline_layout_mtp", _PIPE,
     _PP_LAYOUT + ", validate_layer_layout; transformer/multi_token_prediction.py (get_mtp_num_layers_to_build)"),
    ("ep_needs_moe", frozenset({"ep"}), _CORE + "transformer/transformer_config.py (__post_init__)"),
    ("experts_divisible_by_ep", frozenset({"ep"}), _CORE + "transformer/moe/moe_layer.py (BaseMoELayer.__init__)"),
    ("moe_bias_needs_etp1", frozenset({"tp", "etp"}), _CORE + "transformer/transformer_config.py (__post_init__)"),
    ("expert_ffn_divisible_by_etp", frozenset({"tp", "etp"}),
     _CORE + "transformer/moe/experts.py (SequentialMLP experts: utils.divide)"),
    ("expert_world_size_divisible", frozenset({"tp", "cp", "pp", "ep", "etp"}),
     _CORE + "parallel_state.py (initialize_model_parallel)"),
    ("flex_dispatcher_needs_tp_ep", frozenset({"tp", "ep", "etp"}),
     _CORE + "transformer/moe/token_dispatcher.py (MoEFlexTokenDispatcher.__init__)"),
    ("ep_overlap_needs_ep", frozenset({"ep", "ep_overlap"}), _EP_OVERLAP),
    ("ep_overlap_needs_vpp", frozenset({"pp", "vpp", "ep_overlap"}), _EP_OVERLAP),
    ("ep_overlap_no_full_recompute", frozenset({"recompute", "ep_overlap"}), _EP_OVERLAP),
    ("ep_overlap_recompute_modules", frozenset({"recompute", "ep_overlap"}), _EP_OVERLAP + " (0.19)"),
    ("ep_overlap_mtp", frozenset({"pp", "ep_overlap"}), _EP_OVERLAP),
    ("ep_overlap_cuda_graphs", frozenset({"ep", "ep_overlap", "cuda_graphs"}), _EP_OVERLAP),
    ("cuda_graphs_no_full_recompute", frozenset({"recompute", "cuda_graphs"}),
     _CORE + "transformer/transformer_config.py (__post_init__, CUDA graphs and recompute)"),
    ("cuda_graph_modules_supported", frozenset({"cuda_graphs"}),
     _CORE + "transformer/transformer_config.py (__post_init__, cuda_graph_modules)"),
    ("te_graphs_moe_recompute", frozenset({"recompute", "cuda_graphs"}),
     _CORE + "transformer/transformer_config.py (__post_init__, moe recompute under moe_router graphs)"),
    ("full_iteration_moe", frozenset({"cuda_graphs"}),
     _CORE + "transformer/moe/token_dispatcher.py (the alltoall dispatcher's host copy, no capture); "
     "transformer_config.py (__post_init__, moe_expert_rank_capacity_factor)"),
    *HYBRID_RULES,
    *FSDP_RULES,
    ("global_batch_divisible", frozenset({"mbs", "dp"}),
     _CORE + "num_microbatches_calculator.py (ConstantNumMicroBatchesCalculator)"),
    ("vpp_microbatches", frozenset({"pp", "vpp", "mbs", "dp"}) | SPLIT_FIELDS,
     _CORE + "pipeline_parallel/schedules.py (forward_backward_pipelining_with_interleaving)"),
)


def rules_for(version: str) -> tuple[Rule, ...]:
    """The rules of megatron-core `version` ("0.16.1", "0.19.2", ...): 0.19's checks for 0.17 and later."""
    return _rules_of(rule_set_for(version))


@lru_cache(maxsize=4)
def _rules_of(version: str) -> tuple[Rule, ...]:
    checks = {name: fn for name, fn in globals().items() if callable(fn) and name in {t[0] for t in _TABLE}}
    checks.update({name: getattr(hybrid_rules, name) for name, _, _ in HYBRID_RULES})
    checks.update(pipeline_rule_checks(version))
    checks.update(fsdp_rule_checks(version))
    checks.update(_version_checks(version))
    return tuple(Rule(name=name, reads=reads, source=source, check=checks[name]) for name, reads, source in _TABLE)


RULES: tuple[Rule, ...] = rules_for(rules_version())
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


def check(job: Job, layout: Layout, rules: tuple[Rule, ...] | None = None, *,
          version: str | None = None) -> tuple[Violation, ...]:
    """Every violation of `layout` in `job`, in rule order; () when megatron-core accepts it.

    `version` picks megatron-core's rules (`rules_for`); default the job's (`job.training.megatron_core`). Raises
    ValueError only for sizes that are not positive
    (bad input, not an infeasible layout).
    """
    _require_positive(layout)
    version = rule_set_for(version) if version else job.training.megatron_core
    if rules is None:
        rules = rules_for(version)
    found = (rule.check(job, layout) for rule in rules)
    return tuple(v for v in found if v is not None)


def is_valid(job: Job, layout: Layout) -> bool:
    return not check(job, layout)
