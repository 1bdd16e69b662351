"""Achieved fractions of peak and host costs: every fitted or assumed constant of the throughput model, in one place.

The throughput model (`autotune/cost/throughput.py`, `layer_time.py`, `moe_time.py`, `comm.py`) derives FLOPs,
bytes, message sizes and kernel counts from the model, the layout and the training recipe; what it cannot derive
is how close real kernels get to the datasheet peaks, and how long the host takes to launch them. Those figures
live here, in `Calibration`, each named with how it was set:

- *fitted*: chosen by `python bench/bench_throughput.py --fit` (coordinate search minimising the mean absolute
  log error of predicted vs published tokens/s per GPU over the fitting rows, see that script) and pasted into
  `DEFAULT_CALIBRATION`;
- *assumed*: set from vendor figures or published measurements, because the published runs cannot separate them
  from the fitted ones (the comment says where the figure comes from).

Peaks themselves (dense BF16 / FP8 FLOP/s, HBM and link bandwidths) are datasheet figures in `search_spaces/gpus.py`.
A GEMM's efficiency depends on its shape: each of M, N, K contributes a saturating factor d / (d + d_half), so thin
matrices (large TP: N or K = h / TP; few rows per expert) run further from peak than square ones, and a memory
roofline (bytes / HBM bandwidth) bounds very small GEMMs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from search_spaces.cluster import GPUSpec

__all__ = [
    "ArchFractions",
    "Calibration",
    "DEFAULT_CALIBRATION",
    "gemm_efficiency",
    "GemmCost",
    "gemm_cost",
    "attention_time_s",
    "memory_bound_time_s",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class ArchFractions:
    """What one GPU generation's kernels and host reach (each fitted per generation, see the module docstring).

    The Ampere figures describe 2021-2022 Megatron-LM runs (no fused attention, no TP overlap); the Hopper and
    Blackwell figures Megatron-Core 0.12-0.16 runs with Transformer Engine, so each describes a software era as
    much as a chip.
    """

    gemm_bf16: float  # fitted: a large, square BF16 GEMM, fraction of dense BF16 peak
    gemm_fp8: tuple[tuple[str, float], ...] = ()  # fitted: (FP8 recipe, fraction of dense FP8 peak) pairs
    attention: float  # fitted: the fused attention core (QK^T, softmax, PV), fraction of dense BF16 peak
    host_op_s: float  # fitted: host time of one framework-level op in a layer's forward (Python + dispatch + launch)

    def gemm(self, precision: str, recipe: str | None) -> float:
        """The fraction of the precision's dense peak a large GEMM reaches."""
        if precision != "fp8":
            return self.gemm_bf16
        for name, fraction in self.gemm_fp8:
            if name == recipe:
                return fraction
        raise ValueError(f"no calibrated FP8 GEMM fraction for recipe {recipe!r} on this GPU generation "
                         f"(calibrated: {', '.join(n for n, _ in self.gemm_fp8) or 'none'}).")


def _arch(**kw: object) -> ArchFractions:
    return ArchFractions(**kw)  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True, slots=True)
class Calibration:
    """Every constant of the throughput model that is fitted or assumed rather than derived."""

    per_arch: tuple[tuple[str, ArchFractions], ...] = field(default_factory=tuple)  # (GPUSpec.arch, fractions)
    # --- compute ------------------------------------------------------------------------
    gemm_dim_half: float = 96.0  # fitted: a GEMM dimension of this size halves that dimension's efficiency factor
    grouped_gemm_fraction: float = 0.85  # fitted: a grouped (expert) GEMM's throughput relative to one dense GEMM
    hbm_fraction: float = 0.8  # assumed: memory-bound kernels reach 80% of datasheet HBM bandwidth (STREAM-like)
    kernel_gap_s: float = 3e-6  # assumed: GPU idle between two dependent kernels (launch latency, ~2-4 us on H100)
    # --- host ---------------------------------------------------------------------------
    host_backward_ratio: float = 0.5  # assumed: a backward op costs the host half a forward op (C++ autograd
    #   engine, no Python per op; PyTorch autograd design notes)
    host_kernel_s: float = 4e-6  # assumed: host time of one C++-side kernel launch (cudaLaunchKernel ~2-5 us)
    sync_s: float = 3e-5  # assumed: one device-to-host sync (copy + stream sync, ~10-50 us in nsys traces)
    # --- communication ------------------------------------------------------------------
    link_fraction: float = 0.8  # assumed: NCCL bus bandwidth / link bandwidth on large messages (nccl-tests)
    tp_overlap_exposed: float = 0.15  # fitted: share of TP all-gather / reduce-scatter left exposed by TE userbuffers
    ep_overlap_exposed: float = 0.2  # fitted: share of the EP dispatch / combine left exposed with
    #   overlap_moe_expert_parallel_comm (1F1B all-to-all overlap across micro-batches)
    cp_overlap_fraction: float = 0.8  # fitted: share of the attention time that can hide the CP ring exchange
    pp_p2p_exposed: float = 1.0  # fitted: share of pipeline send/recv time on the critical path
    pp_step_host_s: float = 2e-4  # fitted: host time of one pipeline chunk step (post p2p, wait, schedule bookkeeping)
    dp_bucket_params: float = 4e7  # megatron-core DDP default bucket (40M elements, `DistributedDataParallelConfig`):
    #   the last bucket's reduction cannot overlap
    # --- MoE ----------------------------------------------------------------------------
    moe_imbalance: float = 1.2  # assumed: busiest EP rank's tokens / mean with aux-loss routing; published
    #   benchmarks force balanced routing (`moe_router_force_load_balancing`), so they cannot fit it
    # --- per-step fixed cost ------------------------------------------------------------
    step_overhead_s: float = 0.05  # fitted: data loading, logging, optimizer launch, synchronisation per iteration
    # --- uncertainty --------------------------------------------------------------------
    band_dense: tuple[float, float] = (-0.113, 0.104)  # measured: 10th / 90th percentile of log(published /
    band_moe: tuple[float, float] = (-0.215, 0.435)  #   predicted) leaving each model out of the fit (bench --loo)

    def band(self, moe: bool) -> tuple[float, float]:
        """(low, high) log-ratio band around a prediction: tokens/s * exp(low) .. tokens/s * exp(high)."""
        return self.band_moe if moe else self.band_dense

    def arch(self, gpu: GPUSpec) -> ArchFractions:
        """The fractions of `gpu`'s generation (`GPUSpec.arch`)."""
        for name, fractions in self.per_arch:
            if name == gpu.arch:
                return fractions
        raise ValueError(f"Calibration has no fractions for GPU generation {gpu.arch!r} ({gpu.name}); calibrated: "
                         f"{', '.join(n for n, _ in self.per_arch)}.")


DEFAULT_CALIBRATION = Calibration(  # python bench/bench_throughput.py --fit --sweeps 3 --trials 1500 (2026-12-01)
    per_arch=(
        ("ampere", _arch(gemm_bf16=0.822, attention=0.0717, host_op_s=1.2e-5)),
        ("hopper", _arch(gemm_bf16=0.667, gemm_fp8=(("delayed", 0.547), ("tensorwise", 0.547), ("blockwise", 0.547)),
                         attention=0.447, host_op_s=9.74e-5)),
        ("blackwell", _arch(gemm_bf16=0.85, gemm_fp8=(("delayed", 0.58), ("tensorwise", 0.58), ("mxfp8", 0.505),
                                                      ("blockwise", 0.58)),
                            attention=0.268, host_op_s=1.0e-4)),
    ),
    gemm_dim_half=52.9,
    grouped_gemm_fraction=0.618,
    tp_overlap_exposed=0.0012,
    ep_overlap_exposed=1.0,
    cp_overlap_fraction=0.57,
    pp_p2p_exposed=0.95,
    pp_step_host_s=3.43e-4,
    step_overhead_s=0.0206,
)


def gemm_efficiency(m: float, n: float, k: float, dim_half: float) -> float:
    """Shape factor in (0, 1]: prod over d in (M, N, K) of d / (d + d_half).

    A saturating curve: tile quantisation and wave tails cost a roughly constant number of rows or
    columns per dimension, so the loss fades as 1 / d. Multiply by the generation's peak fraction.
    """
    return (m / (m + dim_half)) * (n / (n + dim_half)) * (k / (k + dim_half))


@dataclass(frozen=True, slots=True)
class GemmCost:
    """GEMM timing constants of one (GPU, precision, recipe, calibration), resolved once so timing a GEMM is a few
    multiplies."""

    flops_per_s: float  # dense peak * generation fraction
    bytes_per_s: float  # HBM bandwidth * hbm_fraction
    element_bytes: float  # operand bytes: 1 for FP8, 2 for BF16
    dim_half: float
    gap_s: float  # GPU idle per launched kernel

    def time_s(self, m: float, n: float, k: float, count: float = 1.0, efficiency: float = 1.0) -> float:
        """`count` GEMMs (M x K) @ (K x N): count * max(2MNK / (achieved peak * shape * efficiency), bytes / HBM)
        + one kernel gap per GEMM (a grouped GEMM's `count` GEMMs run as one launch of that many problems, but
        each problem still has its own tail; megatron-core `moe_grouped_gemm` via TE `GroupedLinear`)."""
        if m <= 0 or n <= 0 or k <= 0 or count <= 0:
            return 0.0
        dh = self.dim_half
        shape = (m / (m + dh)) * (n / (n + dh)) * (k / (k + dh))
        compute_s = 2.0 * m * n * k / (self.flops_per_s * shape * efficiency)
        memory_s = self.element_bytes * (m * k + k * n) / self.bytes_per_s + 2.0 * m * n / self.bytes_per_s
        return count * ((compute_s if compute_s > memory_s else memory_s) + self.gap_s)


@lru_cache(maxsize=256)
def gemm_cost(gpu: GPUSpec, precision: str, recipe: str | None, cal: Calibration) -> GemmCost:
    """The GemmCost of `gpu` at `precision` (FP8: the recipe's fraction of the FP8 peak, 1-byte operands)."""
    fraction = cal.arch(gpu).gemm(precision, recipe)
    return GemmCost(flops_per_s=gpu.peak_flops(precision) * fraction,
                    bytes_per_s=gpu.hbm_bytes_per_s * cal.hbm_fraction,
                    element_bytes=1.0 if precision == "fp8" else 2.0,
                    dim_half=cal.gemm_dim_half, gap_s=cal.kernel_gap_s)


def attention_time_s(flops: float, *, gpu: GPUSpec, cal: Calibration, block_tokens: float) -> float:
    """Fused attention core (cuDNN / FlashAttention, BF16 in every published recipe): FLOPs / (BF16 peak *
    attention fraction * phi(n)^2).

    `block_tokens` n is the length of the query and key blocks one kernel call sees (s without CP, s / c per ring
    step with CP); phi(n) = n / (n + gemm_dim_half), the GEMMs' saturating factor, so short blocks run further from
    peak.
    """
    shape = (block_tokens / (block_tokens + cal.gemm_dim_half)) ** 2
    return flops / (gpu.bf16_flops * cal.arch(gpu).attention * shape)


def memory_bound_time_s(nbytes: float, *, gpu: GPUSpec, cal: Calibration) -> float:
    """Elementwise kernels (norms, activations, casts, permutations, optimizer): bytes moved / achieved HBM
    bandwidth."""
    return nbytes / (gpu.hbm_bytes_per_s * cal.hbm_fraction)
