"""Achieved fractions of peak: every fitted constant of the throughput model, in one place.

The throughput model (`autotune/cost/throughput.py`) derives FLOPs, bytes and message sizes from the
model and the layout; what it cannot derive is how close real kernels get to the datasheet peaks.
Those fractions live here, in `Calibration`, each named and documented, and nowhere else.

Fitting procedure (reproduce with `python bench/bench_calibration.py --fit`): the constants marked
*fitted* below are chosen by a coordinate search (each constant over a grid, a few sweeps) that
minimises the mean absolute percentage error of predicted vs published tokens/s per GPU over the
trustworthy rows of `/work/shared/data/calibration-runs.csv` (see `bench/bench_calibration.py` for
which rows count and which layout defaults are assumed where a source is silent). The result is
pasted into `DEFAULT_CALIBRATION`. Constants marked *assumed* are set from vendor figures or common
measurements, not fitted (the published runs cannot separate them from the fitted ones).

GEMM efficiency depends on the shape a layout produces: each of M, N, K contributes a saturating
factor d / (d + d_half), so thin matrices (large TP: N or K = h / TP) run further from peak than
square ones, and a memory roofline (bytes / HBM bandwidth) bounds very small GEMMs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from search_spaces.cluster import GPUSpec

__all__ = [
    "GpuFractions",
    "Calibration",
    "DEFAULT_CALIBRATION",
    "gpu_family",
    "gemm_efficiency",
    "GemmCost",
    "gemm_cost",
    "gemm_time_s",
    "attention_time_s",
    "memory_bound_time_s",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuFractions:
    """Fractions of one GPU generation's dense peak reached by large kernels (fitted per generation).

    The A100 figures are fitted on 2021-2022 Megatron-LM runs (no FlashAttention, no TP communication
    overlap), the H100 figures on 2024-2025 Megatron-Core runs (FlashAttention / cuDNN attention,
    `tp_comm_overlap`), so each describes its software era as much as its chip.
    """

    gemm_peak_fraction: float  # fitted: a large, square BF16 GEMM, fraction of dense peak
    attention_peak_fraction: float  # fitted: the attention core (QK^T, softmax, PV), fraction of dense peak
    tp_comm_exposed_fraction: float  # fitted: share of TP all-gather/reduce-scatter not hidden under GEMMs


@dataclass(frozen=True, kw_only=True, slots=True)
class Calibration:
    """Every constant of the throughput model that is fitted or assumed rather than derived."""

    # --- compute ------------------------------------------------------------------------
    per_gpu_family: tuple[tuple[str, GpuFractions], ...] = ()  # (family, fractions) pairs; a tuple keeps this hashable
    default_family: str = "h100"  # GPUs of an unknown family (H200, B200, ...) use this generation's fractions
    gemm_dim_half: float = 96.0  # fitted: a GEMM dimension of this size halves that dimension's factor
    fp8_gemm_speedup_fraction: float = 0.8  # assumed: FP8 GEMMs reach this fraction of the BF16 fraction of peak
    hbm_fraction: float = 0.8  # assumed: memory-bound kernels reach 80% of datasheet HBM bandwidth
    kernel_overhead_s: float = 4e-6  # assumed: fixed cost per GEMM launch (small GEMMs never reach the roofline)
    # --- communication ------------------------------------------------------------------
    link_fraction: float = 0.8  # assumed: NCCL bus bandwidth / link bandwidth for large messages
    ep_comm_exposed_fraction: float = 0.7  # fitted: share of the expert all-to-all not hidden
    pp_p2p_exposed_fraction: float = 1.0  # fitted: share of pipeline send/recv time on the critical path
    cp_overlap_fraction: float = 0.8  # fitted: share of the attention time that can hide the CP ring exchange
    dp_overlap_fraction: float = 0.8  # fitted: share of DP grad reduce / param gather that overlaps (all but the last bucket)
    # --- per-step fixed cost ------------------------------------------------------------
    step_overhead_s: float = 0.0  # fitted: data loading, logging, synchronisation per iteration
    moe_layer_overhead_s: float = 0.0  # fitted: per MoE layer and micro-batch, forward or backward (host syncs, launches)


    def fractions(self, gpu: GPUSpec) -> GpuFractions:
        """The fractions of `gpu`'s family, or of `default_family` for GPUs the data does not cover."""
        family = gpu_family(gpu)
        fallback = None
        for name, fractions in self.per_gpu_family:
            if name == family:
                return fractions
            if name == self.default_family:
                fallback = fractions
        if fallback is None:
            raise ValueError(f"Calibration has no fractions for GPU family {family!r} nor the default {self.default_family!r}.")
        return fallback


@lru_cache(maxsize=64)
def gpu_family(gpu: GPUSpec) -> str:
    """'a100' or 'h100' from a GPU spec's name or aliases; other names map to themselves (lowercase)."""
    names = (gpu.name, *gpu.aliases)
    for family in ("a100", "h100"):
        if any(family in n.lower() for n in names):
            return family
    return gpu.name.lower()


DEFAULT_CALIBRATION = Calibration(
    per_gpu_family=(
        ("a100", GpuFractions(gemm_peak_fraction=0.80, attention_peak_fraction=0.10, tp_comm_exposed_fraction=0.8)),
        ("h100", GpuFractions(gemm_peak_fraction=0.68, attention_peak_fraction=0.75, tp_comm_exposed_fraction=0.1)),
    ),
    gemm_dim_half=96.0,
    ep_comm_exposed_fraction=0.4,
    pp_p2p_exposed_fraction=1.0,
    dp_overlap_fraction=0.5,
    moe_layer_overhead_s=2e-3,
    step_overhead_s=0.1,
)


def gemm_efficiency(m: float, n: float, k: float, dim_half: float) -> float:
    """Shape factor in (0, 1]: prod over d in (M, N, K) of d / (d + d_half).

    A saturating curve: tile quantisation and wave tails cost a roughly constant number of rows or
    columns per dimension, so the loss fades as 1 / d. Multiply by the family's peak fraction.
    """
    return (m / (m + dim_half)) * (n / (n + dim_half)) * (k / (k + dim_half))


@dataclass(frozen=True, slots=True)
class GemmCost:
    """GEMM timing constants of one (GPU, precision, calibration), resolved once so timing a GEMM is a few multiplies."""

    flops_per_s: float  # peak * family fraction (* FP8 factor)
    bytes_per_s: float  # HBM bandwidth * hbm_fraction
    element_bytes: float
    dim_half: float
    overhead_s: float

    def time_s(self, m: float, n: float, k: float, count: float = 1.0) -> float:
        """`count` GEMMs (M x K) @ (K x N) in one launch (a grouped GEMM when count > 1, as megatron-core's
        `moe_grouped_gemm` runs the local experts): count * max(2MNK / (achieved peak * shape factor),
        bytes / HBM) + one launch cost."""
        if m <= 0 or n <= 0 or k <= 0 or count <= 0:
            return 0.0
        dh = self.dim_half
        shape = (m / (m + dh)) * (n / (n + dh)) * (k / (k + dh))
        compute_s = 2.0 * m * n * k / (self.flops_per_s * shape)
        memory_s = self.element_bytes * (m * k + k * n + m * n) / self.bytes_per_s
        return count * (compute_s if compute_s > memory_s else memory_s) + self.overhead_s


@lru_cache(maxsize=256)
def gemm_cost(gpu: GPUSpec, precision: str, cal: Calibration) -> GemmCost:
    """The GemmCost of `gpu` at `precision` (FP8 GEMMs: FP8 peak * fp8_gemm_speedup_fraction, 1-byte operands)."""
    fraction = cal.fractions(gpu).gemm_peak_fraction
    if precision == "fp8":
        fraction *= cal.fp8_gemm_speedup_fraction
    return GemmCost(flops_per_s=gpu.peak_flops(precision) * fraction,
                    bytes_per_s=gpu.hbm_bytes_per_s * cal.hbm_fraction,
                    element_bytes=1.0 if precision == "fp8" else 2.0,
                    dim_half=cal.gemm_dim_half, overhead_s=cal.kernel_overhead_s)


def gemm_time_s(m: float, n: float, k: float, *, gpu: GPUSpec, precision: str, cal: Calibration,
                count: float = 1.0) -> float:
    """Time of `count` GEMMs of shape (M x K) @ (K x N): roofline max(FLOPs / achieved peak, bytes / HBM).

    FLOPs = 2*M*N*K (one multiply-add is two FLOPs); achieved peak = peak * family fraction *
    gemm_efficiency(M, N, K); bytes = element size * (M*K + K*N + M*N); plus a fixed launch cost.
    """
    return gemm_cost(gpu, precision, cal).time_s(m, n, k, count)


def attention_time_s(flops: float, *, gpu: GPUSpec, cal: Calibration, block_tokens: float) -> float:
    """Attention core (FlashAttention-style fused kernel, BF16): FLOPs / (peak * attention fraction * phi(n)^2).

    `block_tokens` n is the length of the query and key blocks one kernel call sees (s without CP,
    s / c per ring step with CP); phi(n) = n / (n + gemm_dim_half), the same saturating factor as
    GEMMs, so short blocks (long CP rings on short sequences) run further from peak.
    """
    shape = (block_tokens / (block_tokens + cal.gemm_dim_half)) ** 2
    return flops / (gpu.bf16_flops * cal.fractions(gpu).attention_peak_fraction * shape)


def memory_bound_time_s(nbytes: float, *, gpu: GPUSpec, cal: Calibration) -> float:
    """Elementwise kernels (norms, activations, dropout, optimizer): bytes moved / achieved HBM bandwidth."""
    return nbytes / (gpu.hbm_bytes_per_s * cal.hbm_fraction)
