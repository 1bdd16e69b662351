"""Scale a model and a layout down to a CPU proxy job with the same parallel structure.

Pure Python (no torch). The proxy keeps every parallel size of the layout (TP, PP, VPP, CP, EP, ETP,
SP, distributed optimizer, recompute, micro-batch) and shrinks what those sizes only need to divide:

- layers: `pp * vpp` virtual stages of `layers_per_virtual_stage` layers each (megatron-core needs
  `num_layers % (pp * vpp) == 0` for a uniform split); an uneven split (first/last stage layers, or the
  embedding and loss counted as layers) stays uneven in the same way (`proxy_pipeline_split`);
- heads: `tp * heads_per_tp` heads of `head_dim` channels; query groups a multiple of TP;
- FFN and expert FFN: multiples of TP and ETP; experts: a multiple of EP, at least top-k;
- vocabulary: a multiple of 128 * TP (megatron's padding rule, so none is added);
- sequence: a multiple of TP (sequence parallel) and of 2 * CP (the zig-zag split of context parallelism);
- data parallel: as many ranks as `max_workers` allows, keeping the expert-DP size integral;
  the reduction is recorded, never hidden;
- micro-batches per step: enough to fill the pipeline (a multiple of PP, at least 2 * PP with VPP).

On a GPU the same function runs with `scale_model=False`: the model keeps its shape, only DP may shrink.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from math import lcm

from search_spaces.layout import Layout
from search_spaces.model import ModelSpec, MoESpec
from search_spaces.pipeline_layout import compress, parse_stages
from search_spaces.training import TrainingSpec

__all__ = ["ProxyPlan", "plan_proxy", "reduce_data_parallel", "proxy_pipeline_split", "refuse_hybrid", "refuse_muon"]


def refuse_hybrid(model: ModelSpec) -> None:
    """Raise the one-line refusal for a hybrid Mamba model: its `M` layers run mamba_ssm's and causal_conv1d's CUDA
    kernels (megatron-core `ssm/mamba_mixer.py` needs `mamba_ssm`), which a CPU worker cannot run, and the megatron
    backend's jobs build `GPTModel`, not `HybridModel`."""
    if model.is_hybrid:
        raise ValueError(f"{model.name} is a hybrid Mamba model: its Mamba layers need mamba_ssm's and causal_conv1d's "
                         "CUDA kernels, which the CPU proxy cannot run, and the megatron backend builds GPT models "
                         "only; use the analytic backend (the default) for hybrid models.")


def refuse_muon(training: TrainingSpec) -> None:
    """Raise the one-line refusal for a Muon job: the megatron backend's jobs build megatron-core's Adam
    (`trainers/megatron_job.py::wrap_ddp_and_optimizer`), and Muon needs the emerging-optimizers package, which the
    workers do not have, so a measurement would time another optimizer."""
    if training.muon:
        raise ValueError("--optimizer muon: the megatron backend's profiling jobs train with Adam (Muon needs the "
                         "emerging-optimizers package on every worker); use the analytic backend (the default).")


HEAD_DIM = 16
HEADS_PER_TP = 2
FFN_PER_HIDDEN = 2
SEQ_LENGTH = 64
VOCAB_QUANTUM = 128


@dataclass(frozen=True, kw_only=True, slots=True)
class ProxyPlan:
    """What actually runs: the proxy model, the layout on `layout.world_size` workers, and the batch."""

    model: ModelSpec
    layout: Layout
    training: TrainingSpec
    num_microbatches: int
    scaled_model: bool
    dp_reduction: str  # "" when the layout runs at its own DP size

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @property
    def tokens_per_step(self) -> int:
        return self.training.global_batch_size * self.training.seq_length

    def describe(self) -> dict[str, object]:
        m = self.model
        return {
            "proxy_model": m.name, "num_layers": m.num_layers, "hidden_size": m.hidden_size,
            "num_attention_heads": m.num_attention_heads, "num_query_groups": m.query_groups,
            "ffn_hidden_size": m.ffn_hidden_size, "vocab_size": m.vocab_size,
            "num_experts": m.moe.num_experts if m.moe else 0, "topk": m.moe.topk if m.moe else 0,
            "seq_length": self.training.seq_length, "global_batch_size": self.training.global_batch_size,
            "num_microbatches": self.num_microbatches, "world_size": self.world_size,
            "scaled_model": self.scaled_model, "dp_reduction": self.dp_reduction,
        }


def _round_up(value: int, quantum: int) -> int:
    return -(-value // quantum) * quantum


def reduce_data_parallel(layout: Layout, max_workers: int) -> Layout:
    """The layout with the largest DP' <= DP that fits `max_workers` and keeps expert DP integral.

    expert DP = tp * cp * dp / (ep * etp) must be a whole number (megatron-core's parallel folding), so
    DP' steps down until (tp * cp * dp') % (ep * etp) == 0. Raises ValueError when even DP' = 1 does
    not fit: the model-parallel part alone (tp * pp * cp) needs more workers than there are.
    """
    model_parallel = layout.tp * layout.pp * layout.cp
    if model_parallel > max_workers:
        raise ValueError(
            f"tp({layout.tp}) * pp({layout.pp}) * cp({layout.cp}) = {model_parallel} workers are needed, "
            f"but only {max_workers} fit on this machine; raise --max-workers or profile a smaller layout."
        )
    for dp in range(min(layout.dp, max_workers // model_parallel), 0, -1):
        if (layout.tp * layout.cp * dp) % (layout.ep * layout.expert_tp) == 0:
            return replace(layout, dp=dp)
    raise ValueError(
        f"no data-parallel size <= {layout.dp} makes tp*cp*dp a multiple of ep*etp = {layout.ep * layout.expert_tp} "
        f"within {max_workers} workers."
    )


def _proxy_moe(moe: MoESpec, layout: Layout, first_dense: int) -> MoESpec:
    """4 experts (or EP if larger, a multiple of EP either way, never more than the model has), top-k <= 2."""
    experts = max(layout.ep, min(moe.num_experts, _round_up(4, layout.ep)))
    topk = min(moe.topk, 2, experts)
    ffn = _round_up(2 * HEAD_DIM * HEADS_PER_TP, layout.expert_tp * 8)
    shared = _round_up(ffn, layout.tp) if moe.shared_expert_ffn_hidden_size else 0
    return MoESpec(num_experts=experts, topk=topk, expert_ffn_hidden_size=ffn,
                   shared_expert_ffn_hidden_size=shared, first_dense_layers=first_dense,
                   shared_expert_gate=moe.shared_expert_gate)


def proxy_pipeline_split(layout: Layout, layers_per_virtual_stage: int) -> tuple[int, Layout]:
    """(proxy layers, layout with the proxy's split). Keeps the kind of split the layout uses:

    - even: `pp * vpp * k` layers (k = layers per virtual stage);
    - `embedding_loss_split`: (L + 2) spread over the PP * VPP chunks, so L = pp * vpp * max(2, k) - 2;
    - `first_stage_layers` / `last_stage_layers`: middle stages 2 * k * vpp layers, a given first stage the
      same, a given last stage k * vpp (lighter, as autotune's split makes it: it also computes the loss);
    - `pipeline_layout`: the same string with k layers in every chunk that has layers (the embedding, MTP and
      loss stay where they are).
    """
    pp, v, k = layout.pp, layout.vpp_size, layers_per_virtual_stage
    if layout.pipeline_layout is not None:
        stages = [re.sub(r"t+", "t" * k, stage) for stage in parse_stages(layout.pipeline_layout)]
        return sum(s.count("t") for s in stages), replace(layout, pipeline_layout=compress(stages))
    if layout.embedding_loss_split and pp > 1:
        return pp * v * max(2, k) - 2, layout
    first, last = layout.first_stage_layers, layout.last_stage_layers
    if pp == 1 or (first is None and last is None):
        return pp * v * k, replace(layout, first_stage_layers=None, last_stage_layers=None)
    middle = 2 * k * v
    first_p = middle if first is not None else None
    last_p = k * v if last is not None else None
    given = (first is not None) + (last is not None)
    num_layers = (first_p or 0) + (last_p or 0) + (pp - given) * middle
    return num_layers, replace(layout, first_stage_layers=first_p, last_stage_layers=last_p)


def _proxy_model(model: ModelSpec, layout: Layout, num_layers: int) -> ModelSpec:
    tp = layout.tp
    heads = tp * HEADS_PER_TP
    groups = heads if model.query_groups == model.num_attention_heads else tp
    hidden = heads * HEAD_DIM
    first_dense = 0 if model.moe is None or model.moe.first_dense_layers == 0 else 1
    return ModelSpec(
        name=f"{model.name}-proxy",
        num_layers=num_layers,
        hidden_size=hidden,
        ffn_hidden_size=_round_up(FFN_PER_HIDDEN * hidden, tp * 8),
        num_attention_heads=heads,
        num_query_groups=groups,
        kv_channels=HEAD_DIM,
        vocab_size=_round_up(1024, VOCAB_QUANTUM * tp),
        gated_linear_unit=model.gated_linear_unit,
        tied_embeddings=model.tied_embeddings,
        add_bias_linear=model.add_bias_linear,
        add_qkv_bias=model.add_qkv_bias,
        qk_layernorm=model.qk_layernorm,
        normalization=model.normalization,
        max_position_embeddings=0 if model.max_position_embeddings == 0 else 4 * SEQ_LENGTH,
        moe=None if model.moe is None else _proxy_moe(model.moe, layout, first_dense),
        mtp_num_layers=model.mtp_num_layers,
        mla=None,  # MLA proxies run as GQA attention (the local spec's MLA needs fused kernels)
    )


def _seq_length(layout: Layout, base: int) -> int:
    quantum = lcm(layout.tp if layout.sp else 1, 2 * layout.cp if layout.cp > 1 else 1)
    return _round_up(base, quantum)


def _num_microbatches(layout: Layout, wanted: int) -> int:
    """At least PP micro-batches (2 * PP with VPP), a multiple of PP (interleaved schedules need it)."""
    floor = layout.pp * (2 if layout.vpp else 1)
    return _round_up(max(wanted, floor), layout.pp)


def plan_proxy(
    model: ModelSpec,
    layout: Layout,
    training: TrainingSpec,
    *,
    max_workers: int,
    scale_model: bool = True,
    microbatches: int | None = None,
    layers_per_virtual_stage: int = 1,
    seq_length: int = SEQ_LENGTH,
) -> ProxyPlan:
    """The proxy job for `layout`: same parallel structure, a small model, DP as large as fits.

    `microbatches` (default: the layout's own count, capped at 2 * PP or 4) sets micro-batches per step.
    """
    refuse_hybrid(model)
    refuse_muon(training)
    run_layout = reduce_data_parallel(layout, max_workers)
    reduction = "" if run_layout.dp == layout.dp else f"dp {layout.dp} -> {run_layout.dp} (max_workers={max_workers})"
    own = max(1, layout.num_microbatches(training.global_batch_size))
    wanted = microbatches if microbatches is not None else min(own, max(4, 2 * layout.pp))
    nmb = _num_microbatches(run_layout, wanted)
    if scale_model:
        k = layers_per_virtual_stage
        if model.moe is not None and model.moe.first_dense_layers and run_layout.pp * run_layout.vpp_size * k < 2:
            k = 2  # one leading dense layer (as the model has) and at least one MoE layer
        num_layers, run_layout = proxy_pipeline_split(run_layout, k)
        proxy_model = _proxy_model(model, run_layout, num_layers)
        seq = _seq_length(run_layout, seq_length)
    else:
        proxy_model, seq = model, training.seq_length
    # what trainers/megatron_job.py runs: fp32 main grads, megatron's unfused loss, no TE overlap
    proxy_training = TrainingSpec(
        seq_length=seq, global_batch_size=nmb * run_layout.mbs * run_layout.dp, precision="bf16",
        grad_reduce_in_fp32=True, cross_entropy_fusion="none", tp_comm_overlap=False,
    )
    return ProxyPlan(model=proxy_model, layout=run_layout, training=proxy_training, num_microbatches=nmb,
                     scaled_model=scale_model, dp_reduction=reduction)
