"""The Muon optimizer on one GPU: which weights it owns, the state it keeps, and what its Newton-Schulz step costs.

megatron-core 0.19.2 `optimizer/emerging_optimizers.py` and `optimizer/layer_wise_optimizer.py`:
- Which weights: every 2-D parameter except the embedding and the output layer is Muon's
  (`_is_nonlinear_or_embedding`, `is_managed_by_layer_wise_optimizer`); the rest (embeddings, output layer, norms,
  biases) go to Adam (`muon_scalar_optimizer="adam"`). Here: the GEMM weights of every layer (`placement`'s
  `*_gemm` counts, which `tests/test_muon.py` holds these matrices to) and the router.
- State: Muon keeps one fp32 momentum per weight beside the fp32 master copy, 8 B, where Adam keeps 12
  (emerging_optimizers `OrthogonalizedOptimizer`, its `momentum_buffer`).
- TP: `muon_tp_mode="blockwise"` orthogonalises each rank's shard on its own, so the matrices here are per GPU.
- dist_opt: the layer-wise distributed optimizer. DDP runs without the distributed optimizer (Megatron-LM turns
  `use_distributed_optimizer` off for an emerging optimizer, arguments.py 0.19.2 :1669-1682; Bridge's Muon recipes
  set `ddp.use_distributed_optimizer=False`), so megatron-core takes its legacy path
  (`LayerWiseDistributedOptimizer._shard_params_ping_pong`): every parameter of the group, Adam's embedding and
  output layer included, goes whole to one rank, in order of size, ping-pong over the ranks (0, 1, .., D-1, D-1, ..,
  0, 0, ..), dense ones over DP x CP and experts over the expert-DP group. Each rank updates its own, then
  `allgather_params` receives every other rank's updated bf16 weights into fresh buffers, while the fp32 gradient
  copies of the step are still held. The gradients are all-reduced. Costs here are the busiest rank's: its state,
  its step transient, its Newton-Schulz time. Norms and biases (a few thousand elements each) are spread evenly
  instead of placed one by one.

The step (emerging_optimizers `muon_utils.newton_schulz`, Jordan et al. 2024, "Muon: An optimizer for hidden
layers"): `muon_num_ns_steps=5` quintic iterations per matrix X of m x n (m <= n after the transpose Muon takes):
A = X X^T (an m x m x n GEMM), B = b A + c A A (m x m x m), X = a X + B X (m x n x m), at the BF16 GEMM rate
(`muon_fp32_matmul_prec="medium"`, megatron-core's and Bridge's default). A rank's matrices are updated one after
another, so the step's work tensors are one matrix's X, A and B in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from autotune.cost.efficiency import Calibration, gemm_cost, memory_bound_time_s
from autotune.cost.placement import StageParams
from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.model import ModelSpec, padded_vocab_size

__all__ = ["NS_STEPS", "MUON_STATE_BYTES", "ADAM_STATE_BYTES", "Matrix", "Share", "layer_matrices",
           "stage_matrices", "muon_params", "group_items", "ping_pong", "rank_shares", "state_bytes",
           "step_transient_bytes", "step_s"]

NS_STEPS = 5  # OptimizerConfig.muon_num_ns_steps: megatron-core's default, which Bridge's Muon recipes keep
MUON_STATE_BYTES = 8.0  # fp32 master copy + fp32 momentum per Muon weight
ADAM_STATE_BYTES = 12.0  # fp32 master copy + two fp32 moments (no precision-aware optimizer without dist opt)
Matrix = tuple[int, int, int]  # (rows, columns, how many) on one GPU


def layer_matrices(model: ModelSpec, tp: int, ep: int, etp: int) -> dict[str, tuple[Matrix, ...]]:
    """One GPU's 2-D weights of each layer part: "dense" (a dense layer: attention and MLP), "moe" (a MoE layer's
    attention, router, shared expert and latent projections), "experts" (its local experts), "mtp" (an MTP layer's
    eh_proj; the rest of an MTP layer is a decoder layer). TP splits as `placement` counts them: column-parallel
    rows, row-parallel columns, MLA's down projections duplicated (TE spec). A GQA layer's `linear_qkv` is its Q, K
    and V matrices, as `muon_split_qkv` (megatron-core's default, `emerging_optimizers.py:294-324`) orthogonalises
    them; the layer-wise shares then place the three apart where megatron-core keeps the parameter whole, a small
    imbalance. MLA's projections are not split (megatron-core: "TODO: support MLA")."""
    if model.is_hybrid:
        raise ValueError("Muon's step is not modelled for hybrid Mamba models.")
    h, a = model.hidden_size, model.num_attention_heads
    if model.mla is not None:
        m = model.mla
        qk = m.qk_head_dim + m.qk_pos_emb_head_dim
        q: tuple[Matrix, ...] = ((a * qk // tp, h, 1),) if m.q_lora_rank is None else \
            ((m.q_lora_rank, h, 1), (a * qk // tp, m.q_lora_rank, 1))
        attention = (*q, (m.kv_lora_rank + m.qk_pos_emb_head_dim, h, 1),
                     (a * (m.qk_head_dim + m.v_head_dim) // tp, m.kv_lora_rank, 1), (h, a * m.v_head_dim // tp, 1))
    else:  # `muon_split_qkv=True` (the default): linear_qkv orthogonalised as Q, K and V apart
        d, g = model.head_dim, model.query_groups
        attention = ((a * d // tp, h, 1), (g * d // tp, h, 2), (h, a * d // tp, 1))

    def mlp(ffn: int, split: int, width: int = h, count: int = 1) -> tuple[Matrix, ...]:
        fc1 = 2 * ffn if model.gated_linear_unit else ffn
        return ((fc1 // split, width, count), (width, ffn // split, count))

    out: dict[str, tuple[Matrix, ...]] = {"dense": (*attention, *mlp(model.ffn_hidden_size, tp)),
                                          "moe": (), "experts": (), "mtp": ((h // tp, 2 * h, 1),)}
    moe = model.moe
    if moe is not None:
        dense: list[Matrix] = [*attention, (moe.num_experts, h, 1)]
        if moe.shared_expert_ffn_hidden_size:
            dense += mlp(moe.shared_expert_ffn_hidden_size, tp)
        if moe.latent_size:
            dense += [(moe.latent_size, h, 1), (h, moe.latent_size, 1)]
        out["moe"] = tuple(dense)
        out["experts"] = mlp(moe.expert_ffn_hidden_size, etp, moe.latent_size or h, moe.num_experts // ep)
    return out


def stage_matrices(model: ModelSpec, stage: StageParams, layout: Layout) -> tuple[list[Matrix], list[Matrix]]:
    """(dense, expert) 2-D weights one GPU of `stage` holds, each matrix with its count over the stage's layers."""
    per = layer_matrices(model, layout.tp, layout.ep, layout.expert_tp)
    mtp = min(stage.mtp_layers, 1) if model.mtp_repeated_layer else stage.mtp_layers
    mtp_kind = "moe" if model.moe is not None else "dense"
    dense: list[Matrix] = []
    expert: list[Matrix] = []
    for kind, layers in (("dense", stage.dense_layers), ("moe", stage.moe_layers), ("mtp", mtp),
                         (mtp_kind, mtp)):
        dense += [(r, c, n * layers) for r, c, n in per[kind] if layers]
    for layers in (stage.moe_layers, mtp if model.moe is not None else 0):
        expert += [(r, c, n * layers) for r, c, n in per["experts"] if layers]
    return dense, expert


def muon_params(matrices: list[Matrix]) -> int:
    return sum(r * c * n for r, c, n in matrices)


@dataclass(frozen=True, slots=True)
class Share:
    """What one rank of a layer-wise group updates: its Muon matrices, its Adam elements, and the elements of the
    group's other ranks (what its all-gather receives)."""

    matrices: tuple[tuple[int, int], ...]  # (rows, columns) of each Muon matrix it orthogonalises
    adam: float  # elements of Adam's parameters it updates
    others: float  # elements the group's other ranks update

    @property
    def muon(self) -> int:
        return sum(r * c for r, c in self.matrices)


def _adam_params(model: ModelSpec, stage: StageParams, tp: int) -> list[int]:
    """The word embedding and output layer of one GPU, Adam's (`is_embedding_or_output_parameter`), whole."""
    vocab = padded_vocab_size(model.vocab_size, tp) // tp * model.hidden_size
    whole = [vocab] if stage.has_embedding else []
    if stage.has_output and not (model.tied_embeddings and stage.has_embedding):
        whole.append(vocab)
    return whole


Item = tuple[int, tuple[int, int] | None]  # (elements, the Muon matrix's shape or None for Adam's)


def group_items(model: ModelSpec, stage: StageParams, layout: Layout) -> tuple[tuple[list[Item], float, int], ...]:
    """Per layer-wise group (dense, expert): its parameters placed one by one, the elements spread evenly (norms,
    biases), and its size in ranks (1 without dist_opt)."""
    dense, expert = stage_matrices(model, stage, layout)
    if stage.has_embedding and model.max_position_embeddings:  # learned positions: 2-D, untagged, so Muon's
        dense = [*dense, (model.max_position_embeddings, model.hidden_size, 1)]
    whole = _adam_params(model, stage, layout.tp)
    out = []
    for matrices, adam, total, size in (
            (dense, whole, stage.dense_params_per_gpu, layout.dp * layout.cp if layout.dist_opt else 1),
            (expert, [], stage.expert_params_per_gpu, max(1, layout.expert_dp) if layout.dist_opt else 1)):
        items: list[Item] = [(r * c, (r, c)) for r, c, n in matrices for _ in range(n)] + [(a, None) for a in adam]
        out.append((items, max(0.0, total - sum(numel for numel, _ in items)), size))
    return tuple(out)


def ping_pong(numels: list[int], size: int) -> list[int]:
    """The rank each parameter goes to: megatron-core's `_shard_params_ping_pong`, by size (a stable sort), over
    0, 1, .., size-1, size-1, .., 0 again and again."""
    order = list(range(size)) + list(range(size))[::-1]
    rank = [0] * len(numels)
    for k, index in enumerate(sorted(range(len(numels)), key=lambda i: numels[i])):
        rank[index] = order[k % len(order)]
    return rank


@lru_cache(maxsize=1024)
def rank_shares(model: ModelSpec, stage: StageParams, layout: Layout) -> tuple[tuple[Share, ...], tuple[Share, ...]]:
    """Each rank's share of the (dense, expert) groups (module docstring)."""
    groups = []
    for items, spread, size in group_items(model, stage, layout):
        mats: list[list[tuple[int, int]]] = [[] for _ in range(size)]
        elems = [spread / size] * size
        for (numel, shape), rank in zip(items, ping_pong([numel for numel, _ in items], size), strict=True):
            if shape is None:
                elems[rank] += numel
            else:
                mats[rank].append(shape)
        total = spread + sum(numel for numel, _ in items)
        groups.append(tuple(Share(matrices=tuple(mats[i]), adam=elems[i],
                                  others=total - elems[i] - sum(r * c for r, c in mats[i])) for i in range(size)))
    return groups[0], groups[1]


def state_bytes(model: ModelSpec, stage: StageParams, layout: Layout) -> float:
    """Optimizer state of the busiest rank of each group (8 B per Muon weight, 12 per Adam one)."""
    return sum(max(MUON_STATE_BYTES * s.muon + ADAM_STATE_BYTES * s.adam for s in group)
               for group in rank_shares(model, stage, layout))


def step_transient_bytes(job: Job, layout: Layout, stage: StageParams) -> float:
    """The step's transient on the busiest rank of each group: the fp32 gradient copies of its share (4 B each, none
    with an fp32 grad buffer), held through the step, then the larger of one matrix's Newton-Schulz work tensors
    (X, X X^T and its square in fp32: 4 (m n + 2 m^2) B) and the all-gather's bf16 buffers of the other ranks'
    weights."""
    copy = 0.0 if job.training.grad_reduce_in_fp32 else 4.0
    total = 0.0
    for group in rank_shares(job.model, stage, layout):
        total += max(copy * (s.muon + s.adam) + max(max((4.0 * (r * c + 2 * min(r, c) ** 2) for r, c in s.matrices),
                                                        default=0.0), 2.0 * s.others) for s in group)
    return total


def step_s(job: Job, layout: Layout, stage: StageParams, cal: Calibration, adam_bytes: float,
           muon_bytes: float) -> float:
    """The optimizer step of the busiest rank of each group: its memory-bound update (`adam_bytes` / `muon_bytes`
    moved per element) and the Newton-Schulz iterations of its matrices (module docstring)."""
    gemm = gemm_cost(job.cluster.gpu, "bf16", None, cal)

    def ns(r: int, c: int) -> float:
        m, k = min(r, c), max(r, c)
        return NS_STEPS * (gemm.time_s(m, m, k) + gemm.time_s(m, m, m) + gemm.time_s(m, k, m))

    total = 0.0
    for group in rank_shares(job.model, stage, layout):
        total += max(memory_bound_time_s(adam_bytes * s.adam + muon_bytes * s.muon, gpu=job.cluster.gpu, cal=cal)
                     + sum(ns(r, c) for r, c in s.matrices) for s in group)
    return total
