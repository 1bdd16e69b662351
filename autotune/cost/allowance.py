"""What no tensor formula counts: fixed workspaces, communication buffers, the CUDA context, fragmentation.

Two kinds, because they show up differently in what a run measures:
- `workspace_terms`: buffers the framework allocates through PyTorch's caching allocator, so they are part of
  `torch.cuda.max_memory_allocated` (the figure Megatron logs as "max allocated"): Transformer Engine's cuBLASLt
  workspaces, full-iteration graphs' static input copies.
- `device_terms`: memory the GPU holds outside what PyTorch counts as allocated: the CUDA context, NCCL's
  communicator buffers, Transformer Engine's userbuffers for TP overlap, DeepEP's and HybridEP's dispatch buffers,
  the CUDA-graph pool that full-iteration graphs hold through the optimizer step (`memory.py`), and the
  caching allocator's reserve over its allocations. These decide whether a layout fits; a
  "max allocated" measurement does not contain them.

Every figure names its source; where a source gives a range the chosen value and the reason are stated here
and in docs/memory-model.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.units import GIB

__all__ = ["AllowanceAssumptions", "workspace_terms", "device_terms", "communicators", "hybridep_buffer_terms",
           "full_iteration_static_input_bytes"]

MIB = 1024**2
BF16 = 2


@dataclass(frozen=True, kw_only=True, slots=True)
class AllowanceAssumptions:
    """The allowance's constants.

    - `cuda_context_bytes`: the CUDA context with lazily loaded kernels (cuBLAS, cuDNN, TE, NCCL modules).
      ~300-400 MiB with CUDA >= 11.7 lazy loading (PyTorch issues #107667, #109888, NVIDIA staff); H100 / B200
      figures are not published, 0.5 GiB is taken.
    - `nccl_channels`, `nccl_buffer_bytes`: NCCL's SIMPLE-protocol buffer (`NCCL_BUFFSIZE`, default 4 MiB,
      nccl `src/init.cc`) per channel and ring peer (2: send and receive); 16 channels. With
      `NCCL_RUNTIME_CONNECT=1` (the default since 2.22) only the protocols a communicator uses are connected;
      NVLink SHARP buffers are not counted because Megatron-Bridge's performance runs set `NCCL_NVLS_ENABLE=0`
      ("Disable NVLink SHARP to save memory", `scripts/performance/utils/executors.py`).
    - `allocator_reserve_bytes`: the caching allocator's peak reserve over its peak allocation (what
      `max_memory_reserved - max_memory_allocated` measures), in four published Megatron-Bridge runs with
      `expandable_segments:True`: Moonlight-16B on 8 H100, ~40 GB reserved vs 36.6 GB allocated (3.4 GB,
      `skills/nemo-mbridge-perf-activation-recompute`); Nemotron-3-Super on 64 H100, 69.3 vs 59.0 GiB (10.3 GiB,
      `examples/model_verification_cards/nemotron-3-super-120b-a12b/card.yaml`); Nemotron-3.5-Lightning on 16 H100,
      73.9 vs 68.5 GiB (5.3 GiB) and on 8 GB200, 162.3 vs 158.2 GiB (4.1 GiB,
      `examples/model_verification_cards/nemotron-3.5-lightning/card.yaml`). The reserve does not grow with
      the allocation (4.1 GiB on the largest); their median, 4.7 GiB, is taken.
    - `deepep_num_sms`: SMs DeepEP's kernels run on (megatron-core `moe_deepep_num_sms` default 20).
    """

    cuda_context_bytes: float = 0.5 * GIB
    nccl_channels: int = 16
    nccl_buffer_bytes: float = 4 * MIB
    allocator_reserve_bytes: float = 4.7 * GIB
    deepep_num_sms: int = 20


DEFAULT_ALLOWANCE = AllowanceAssumptions()

# TE `cpp_extensions/gemm.py::get_cublas_workspace_size_bytes`: 32 MiB + 1 KiB on compute capability >= 9.0
# (4 MiB before); grouped GEMMs run on `get_num_cublas_streams()` = 4 streams with a workspace each
# (`common/util/multi_stream.cpp`).
_TE_WORKSPACE = {"ampere": 4 * MIB, "hopper": 32 * MIB + 1024, "blackwell": 32 * MIB + 1024}
_GROUPED_GEMM_STREAMS = 4
_UB_STREAMS = 3  # TE `cpp_extensions/gemm.py::_NUM_MAX_UB_STREAMS`


def communicators(layout: Layout) -> dict[str, int]:
    """The process groups one rank runs collectives on, by name -> size (size 1 groups omitted): TP, CP,
    the data-parallel reduction group with CP (`intra_dp_cp_group`, dense gradients), EP and expert-DP (MoE),
    ETP when it differs from TP, and the pipeline neighbours (p2p)."""
    groups = {"tp": layout.tp, "cp": layout.cp, "dp_cp": layout.dp * layout.cp}
    if layout.ep > 1 or layout.expert_tp != layout.tp:
        groups.update(ep=layout.ep, expert_dp=layout.expert_dp)
        if layout.expert_tp != layout.tp:
            groups["etp"] = layout.expert_tp
    if layout.pp > 1:
        groups["pp"] = layout.pp
    return {name: size for name, size in groups.items() if size > 1}


def workspace_terms(job: Job, layout: Layout, *, has_output: bool = False) -> dict[str, float]:
    """Buffers allocated through PyTorch's allocator once per process:
    - TE's cuBLASLt workspace, and four more for grouped GEMMs (MoE with `moe_grouped_gemm`); PyTorch's own cuBLAS
      workspace for the GEMMs outside TE (the output layer, the router), the same size on Hopper and newer
      (`CUBLAS_WORKSPACE_CONFIG` default, 32 MiB from sm90);
    - with `tp_comm_overlap`, TE's workspace for the userbuffer GEMMs, one per overlap stream, allocated apart
      from the plain one (`cpp_extensions/gemm.py::get_cublas_workspace(device, ub=True)`:
      `get_cublas_workspace_size_bytes() * _NUM_MAX_UB_STREAMS`, 3);
    - megatron-core's global memory buffer (`utils.GlobalMemoryBuffer`), which megatron's own column-parallel
      linears all-gather their sequence-parallel input into: the output layer on the last stage, s * b / cp x h
      bf16 (`tensor_parallel/layers.py`)."""
    one = _TE_WORKSPACE.get(job.cluster.gpu.arch, 32 * MIB)
    grouped = job.model.moe is not None and job.training.moe_grouped_gemm
    terms: dict[str, float] = {"cublas_workspace": one * (2 + (_GROUPED_GEMM_STREAMS if grouped else 0))}
    if _tp_overlap(job, layout):
        terms["ub_cublas_workspace"] = one * _UB_STREAMS
    if has_output and layout.sp and layout.tp > 1:
        t = job.training
        terms["sp_gather_buffer"] = BF16 * t.seq_length * layout.mbs / layout.cp * job.model.hidden_size
    static_inputs = full_iteration_static_input_bytes(job, layout)
    if static_inputs:
        terms["graph_static_inputs"] = static_inputs
    return terms


def _tp_overlap(job: Job, layout: Layout) -> bool:
    """TP communication overlap is on: `tp_comm_overlap` with TP > 1 and SP (Megatron-Bridge turns it off otherwise,
    `training/comm_overlap.py`)."""
    return bool(job.training.tp_comm_overlap and layout.tp > 1 and layout.sp)


def _userbuffers_bytes(job: Job, layout: Layout) -> float:
    """TE userbuffers for `tp_comm_overlap` (TE `module/base.py::initialize_ub`, megatron
    `training/initialize.py::_initialize_tp_communicators`): 12 buffers of (s * mbs / cp) x h elements, the
    8 all-gather ones in FP8 (1 B) under FP8 and bf16 otherwise; Megatron-Bridge turns the overlap off at TP 1 or
    without SP (`training/comm_overlap.py`). Registered outside PyTorch's allocator."""
    t = job.training
    if not _tp_overlap(job, layout):
        return 0.0
    elements = t.seq_length * layout.mbs / layout.cp * job.model.hidden_size
    all_gather_bytes = 1 if t.fp8 else BF16
    return elements * (8 * all_gather_bytes + 4 * BF16)


def _deepep_bytes(job: Job, layout: Layout, a: AllowanceAssumptions) -> float:
    """DeepEP's dispatch/combine buffers (`moe_token_dispatcher="flex"` with the deepep backend; HybridEP has its own,
    `hybridep_buffer_terms`, and NCCL-EP's are not modelled), allocated once per process outside
    PyTorch's allocator (`megatron/core/transformer/moe/fused_a2a.py::get_buffer`, DeepEP `Buffer`). Sized as
    DeepEP's `Config.get_nvl_buffer_size_hint` / `get_rdma_buffer_size_hint` size them: per channel
    (num_sms / 2), per NVLink peer (up to 8) 256 chunked receive tokens of 2h bytes, and per RDMA peer
    (EP / 8 nodes) 128 tokens: an approximation of DeepEP's default `Config(num_sms, 6, 256, 6, 128)`."""
    if job.model.moe is None or job.moe_dispatcher != ("flex", "deepep") or layout.ep <= 1:
        return 0.0
    channels = a.deepep_num_sms // 2
    hidden_bytes = BF16 * job.model.expert_width  # the dispatched width (LatentMoE: its latent size)
    nvl_peers = min(layout.ep, 8)
    rdma_peers = max(1, layout.ep // 8) if layout.ep > 8 else 0
    return channels * hidden_bytes * (nvl_peers * 256 + rdma_peers * 128)


# megatron-core fused_a2a.py HYBRIDEP_TOKEN_ALIGNMENT; DeepEP NUM_OF_TOKENS_PER_CHUNK_COMBINE_API (default 64)
HYBRIDEP_TOKEN_CHUNK = 64


def hybridep_buffer_terms(job: Job, layout: Layout) -> dict[str, float]:
    """HybridEP's buffers (`moe_token_dispatcher="flex"`, `moe_flex_dispatcher_backend="hybridep"`), by name, in
    bytes: allocated once per process by DeepEP's `HybridEPBuffer` (branch hybrid-ep, `deep_ep/hybrid_ep_buffer.py`,
    `csrc/hybrid_ep/buffer/intranode.cu`, `internode_doca.cu`, `extension/allgather.cu`) through its own
    allocator (cuMem / cudaMalloc), outside PyTorch's. megatron-core creates it on the first dispatch
    (`transformer/moe/fused_a2a.py::init_hybrid_ep_buffer`, `HybridEPDispatch.forward`) with the rank's
    input tokens as `max_num_of_tokens_per_rank` (T_r = T / t*, padded to the 64-token chunk,
    `hybrid_ep_pad_num_of_tokens_per_rank`), the hidden size h and the local experts L = E / EP, over the
    MoE group of G = EP x ETP ranks; R = min(G, NVLink domain) ranks per NVLink domain
    (`detect_accessible_ranks`; Bridge's recipes set `NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN` to EP, which is
    R when the group fits a domain), N = G / R domains. With M = T_r R N (the worst case: every token of the
    group to one rank), `use_shared_buffer=True` (dispatch and combine share token and probability buffers):
    - `hybridep_nvl_tokens`: the combine/dispatch token buffer, M h x 2 B (uint16; megatron never dispatches FP8);
    - `hybridep_nvl_probs`: M x L R x 4 B;
    - `hybridep_nvl_scales`: the dispatch scaling-factor buffer, M x h / 128 x 4 B (allocated even without FP8);
    - `hybridep_allgather`: the routing-map all-gather (`CustomAllgather::allocate_ag_buffer`, allocated whatever
      `enable_custom_allgather` says), (L G) x T_r x G bool;
    - `hybridep_rdma` (N > 1, `RDMACoordinator::allocate_dispatch_buffers` / `allocate_combine_buffers`):
      T_r (h x 2 + L G x 4 + h / 128 x 4) for the attention-side dispatch buffers, T_r (N - 1) (h x 2 + L R x 4 +
      h / 128 x 4) for the inter-node group, and 2 T_r (N - 1) (h x 2 + L R x 4) for the combine's reduction
      and group buffers.
    Synchronisation flags (a few KiB) are left out."""
    moe = job.model.moe
    if moe is None or job.moe_dispatcher != ("flex", "hybridep"):
        return {}
    t = job.training
    routed = t.seq_length * layout.mbs // layout.cp // (layout.tp if layout.sp else 1)
    tokens = -(-routed // HYBRIDEP_TOKEN_CHUNK) * HYBRIDEP_TOKEN_CHUNK
    h = job.model.expert_width  # `hidden_dim = moe_latent_size or hidden_size` (token_dispatcher.py:1519-1522)
    local = max(1, moe.num_experts // layout.ep)
    group = layout.ep * layout.expert_tp
    ranks = max(1, min(group, job.cluster.nvlink_domain))
    nodes = -(-group // ranks)
    worst = tokens * ranks * nodes
    scales = h // 128 * 4
    terms = {
        "hybridep_nvl_tokens": float(worst * h * BF16),
        "hybridep_nvl_probs": float(worst * local * ranks * 4),
        "hybridep_nvl_scales": float(worst * scales),
        "hybridep_allgather": float(local * group * tokens * group),
    }
    if nodes > 1:
        rdma = tokens * (h * BF16 + local * group * 4 + scales)
        rdma += tokens * (nodes - 1) * (h * BF16 + local * ranks * 4 + scales)
        rdma += 2 * tokens * (nodes - 1) * (h * BF16 + local * ranks * 4)
        terms["hybridep_rdma"] = float(rdma)
    return terms


def full_iteration_static_input_bytes(job: Job, layout: Layout) -> float:
    """Full-iteration CUDA graphs copy every micro-batch of the step into static buffers before the replay
    (megatron-core `full_cuda_graph.py::StaticBufferLoader`, one dict per micro-batch, kept for the run): tokens,
    labels and position ids (int64) and the loss mask (fp32) of b x s tokens each, 28 B per token (the attention
    mask is None with causal fused attention). Counted on every stage (Megatron-LM's middle stages load none)."""
    if layout.cuda_graphs != "full_iteration":
        return 0.0
    microbatches = max(1, layout.num_microbatches(job.training.global_batch_size))
    return float(microbatches * layout.mbs * job.training.seq_length * (8 + 8 + 8 + 4))


def device_terms(job: Job, layout: Layout, a: AllowanceAssumptions = DEFAULT_ALLOWANCE) -> dict[str, float]:
    """Device memory outside PyTorch's allocated bytes, by name (see the module docstring)."""
    per_communicator = a.nccl_channels * 2 * a.nccl_buffer_bytes
    return {
        "cuda_context": a.cuda_context_bytes,
        "nccl_buffers": per_communicator * len(communicators(layout)),
        "tp_userbuffers": _userbuffers_bytes(job, layout),
        "deepep_buffers": _deepep_bytes(job, layout, a),
        "hybridep_buffers": sum(hybridep_buffer_terms(job, layout).values()),
        "allocator_reserve": a.allocator_reserve_bytes,
    }
