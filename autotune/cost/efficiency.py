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

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import lru_cache

from search_spaces.cluster import GPUSpec
from search_spaces.layout import CUDA_GRAPH_CHOICES
from search_spaces.releases import RELEASES

__all__ = [
    "ArchFractions",
    "ReleaseFactors",
    "Calibration",
    "DEFAULT_CALIBRATION",
    "gemm_efficiency",
    "GemmCost",
    "gemm_cost",
    "attention_time_s",
    "memory_bound_time_s",
    "fit_group",
    "MIN_GROUP_ROWS",
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
    gemm_fp4: float | None = None  # fitted: an NVFP4 GEMM (TE NVFP4BlockScaling), fraction of dense FP4 peak
    attention: float  # fitted: the fused attention core (QK^T, softmax, PV), fraction of dense BF16 peak
    host_op_s: float  # fitted: host time of one framework-level op in a layer's forward (Python + dispatch + launch)

    def scaled(self, *, bf16: float = 1.0, fp8: float = 1.0, fp4: float = 1.0, attention: float = 1.0,
               host: float = 1.0) -> ArchFractions:
        """These fractions with each GEMM precision's, the attention core's and the host op's multiplied."""
        return replace(self, gemm_bf16=self.gemm_bf16 * bf16, gemm_fp8=tuple((r, v * fp8) for r, v in self.gemm_fp8),
                       gemm_fp4=None if self.gemm_fp4 is None else self.gemm_fp4 * fp4,
                       attention=self.attention * attention, host_op_s=self.host_op_s * host)

    def gemm(self, precision: str, recipe: str | None) -> float:
        """The fraction of the precision's dense peak a large GEMM reaches."""
        if precision == "fp4":
            if self.gemm_fp4 is None:
                raise ValueError("no calibrated NVFP4 GEMM fraction for this GPU generation (Blackwell's is fitted)")
            return self.gemm_fp4
        if precision != "fp8":
            return self.gemm_bf16
        for name, fraction in self.gemm_fp8:
            if name == recipe:
                return fraction
        raise ValueError(f"no calibrated FP8 GEMM fraction for recipe {recipe!r} on this GPU generation "
                         f"(calibrated: {', '.join(n for n, _ in self.gemm_fp8) or 'none'}).")


@dataclass(frozen=True, kw_only=True, slots=True)
class ReleaseFactors:
    """What one software release's kernels and libraries gain over the reference release (`REFERENCE_RELEASE`) at
    the same layout, which no layout term can show: `dense` multiplies every GEMM's and the attention core's
    fraction of peak, `moe` the expert GEMMs' on top of it (grouped GEMM, fused MoE kernels). None: no published
    rows of that release inform it; the nearest release's value stands in (`Calibration.for_release`)."""

    dense: float | None = None
    moe: float | None = None


MIN_GROUP_ROWS = 3  # a group fewer fitted rows inform counts as unfitted (`Calibration.fitted_groups`)


def fit_group(arch: str, precision: str, moe: bool) -> str:
    """The name of one group of `Calibration.fitted_groups`: "hopper bf16 dense", "blackwell fp8 MoE"."""
    return f"{arch} {precision} {'MoE' if moe else 'dense'}"


REFERENCE_RELEASE = "26.02"  # its factors are 1 by definition: the per-generation fractions describe it
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
    fsdp_offload_exposed: float = 0.0  # fitted (`bench_throughput.py --fit-fsdp`, FSDP rows of the fitting GPUs only):
    #   share of Megatron-FSDP's hidden all-gathers / reduce-scatters and the offload's hidden host copies that
    #   their contention with the GEMMs for SMs and HBM still costs
    sfu_fraction: float = 0.5  # fitted: share of the SFU's exponential rate the fused attention softmax reaches
    softmax_serial: float = 0.5  # fitted: share of the shorter of the matmul and softmax parts not hidden under the
    #   longer one (0: FA3/FA4's ping-pong overlaps them fully; 1: they run one after the other)
    cp_overlap_fraction: float = 0.8  # fitted: share of the attention time that can hide the CP ring exchange
    pp_p2p_exposed: float = 1.0  # fitted: share of pipeline send/recv time on the critical path
    pp_step_host_s: float = 2e-4  # fitted: host time of one pipeline chunk step (post p2p, wait, schedule bookkeeping)
    dp_bucket_params: float = 4e7  # megatron-core DDP default bucket (40M elements, `DistributedDataParallelConfig`):
    #   the last bucket's reduction cannot overlap
    # --- MoE ----------------------------------------------------------------------------
    moe_imbalance: float = 1.2  # assumed: busiest EP rank's tokens / mean with aux-loss routing; published
    #   benchmarks force balanced routing (`moe_router_force_load_balancing`), so they cannot fit it
    # --- hybrid Mamba models ------------------------------------------------------------
    mamba_scan_fraction: float = 0.4544  # fitted on Nemotron rows of H100/B200/GB200 only (never GB300/B300): share of
    #   the FP32 CUDA-core peak (`GPUSpec.fp32_flops`) at which mamba_ssm's fused conv + SSD scan runs its FLOPs
    #   (`mamba_time.py`; bench_throughput --fit-mamba, 11 rows, 2026-12-04). The tiles' FP32 element-wise work
    #   (decay exponentials, masks, scaling) sets the pace, about two CUDA-core operations per counted FLOP
    # --- per-step fixed cost ------------------------------------------------------------
    step_overhead_s: float = 0.05  # fitted: data loading, logging, optimizer launch, synchronisation per iteration
    # --- uncertainty --------------------------------------------------------------------
    band_dense: tuple[float, float] = (-0.1416, 0.1220)  # measured: 10th / 90th percentile of log(published /
    band_moe: tuple[float, float] = (-0.2080, 0.1356)  #   predicted) leaving each model out of the fit (bench --loo,
    #   2026-12-02)
    pair_band: float = 0.1833  # measured (bench/bench_sweeps.py --no-search, 2026-12-07: 13 pairs of 3 H100 MoE
    #   sweeps, |ln| 0.004-0.30): 90th percentile of |ln(predicted / published)| of the tokens/s ratio of two
    #   layouts of one job, over every pair of the published same-job sweeps (bench/bench_sweeps.py prints it): a
    #   predicted gain of one layout over another inside exp(pair_band) - 1 is no measurable gain
    # what the fit saw: "generation precision kind" (kind: dense or MoE) of which at least MIN_GROUP_ROWS fitted rows
    # came from a software release's published table (bench/bench_throughput.py --fit prints it); a prediction of
    # any other group rests on fractions no run of its kind informed, so its band widens
    fitted_groups: tuple[str, ...] = ()
    unfitted_band_factor: float = 2.0  # assumed: an unfitted group's band is this many times the fitted one's (the
    #   release factors alone move one layout 0.8x-1.5x between releases, beyond the fitted band)
    # what the fit saw of CUDA graphs: (GPUSpec.arch, the `Layout.cuda_graphs` settings of its fitted rows) (bench
    # --fit prints it). A graph setting removes host work that the rows without it show only as a residual, so its
    # saving is credited only on a generation where a fitted run used it (`credited_graphs`); None: every setting
    # is credited (a calibration without a record of its rows)
    fitted_graphs: tuple[tuple[str, tuple[str, ...]], ...] | None = None
    # --- software releases --------------------------------------------------------------
    per_release: tuple[tuple[str, ReleaseFactors], ...] = ()  # fitted per release (search_spaces.releases)

    def band(self, moe: bool) -> tuple[float, float]:
        """(low, high) log-ratio band around a prediction: tokens/s * exp(low) .. tokens/s * exp(high)."""
        return self.band_moe if moe else self.band_dense

    def unfitted(self, gpu: GPUSpec, precision: str, moe: bool) -> str | None:
        """Why a prediction of this group is less sure than the band says (None when the fit saw its kind): no
        fitted release row is a run of this GPU generation, precision and kind."""
        group = fit_group(gpu.arch, precision, moe)
        if group in self.fitted_groups:
            return None
        return (f"the fit holds no {group} run of a release's published table (it holds "
                f"{', '.join(self.fitted_groups) or 'none'}), so the band is {self.unfitted_band_factor:g}x as wide")

    def band_for(self, gpu: GPUSpec, precision: str, moe: bool) -> tuple[float, float]:
        """`band(moe)`, widened by `unfitted_band_factor` where `unfitted` says the fit never saw the group."""
        low, high = self.band(moe)
        if fit_group(gpu.arch, precision, moe) in self.fitted_groups:
            return low, high
        return low * self.unfitted_band_factor, high * self.unfitted_band_factor

    def credited_graphs(self, arch: str, graphs: str, offload: bool = False) -> str:
        """The CUDA-graph setting whose time saving a prediction on a GPU generation credits for `graphs`: `graphs`
        itself where a fitted run of that generation used it, else the last fitted setting before it in
        CUDA_GRAPH_CHOICES (none, local, transformer_engine, full_iteration: each removes at least the host work
        of the ones before it, as far as megatron-core's scopes go) that the layout could run (`offload`: no
        per-layer graphs with activation offload, megatron-core "CUDA graphs not supported with CPU offloading",
        `fsdp_rules.offload_cuda_graphs`), else none. An unfitted setting's saving rests on host constants fitted
        where host work was only a residual, so it is never the optimistic extreme: the step is timed as with the
        nearest setting the fit saw, and the band's upper edge keeps the model's own figure."""
        if self.fitted_graphs is None:
            return graphs
        seen = dict(self.fitted_graphs).get(arch, ())
        at = CUDA_GRAPH_CHOICES.index(graphs)
        runnable = [g for g in CUDA_GRAPH_CHOICES[:at + 1] if not (offload and g in ("local", "transformer_engine"))]
        return next((g for g in reversed(runnable) if g in seen), "none")

    def seen_graphs(self, arch: str, graphs: Iterable[str]) -> Calibration:
        """This calibration with `graphs` counted as fitted on generation `arch` (a cluster calibrated on runs that
        used them: `calibrate`)."""
        if self.fitted_graphs is None:
            return self
        seen = dict(self.fitted_graphs)
        have = set(seen.get(arch, ())) | set(graphs)
        seen[arch] = tuple(g for g in CUDA_GRAPH_CHOICES if g in have)
        return replace(self, fitted_graphs=tuple(sorted(seen.items())))

    def uncredited_graphs(self, gpu: GPUSpec, graphs: str, offload: bool = False) -> str | None:
        """Why a layout's CUDA graphs are timed as another setting (None when their saving is credited)."""
        return self.uncredited_graph_settings(gpu, [(graphs, offload)])

    def uncredited_graph_settings(self, gpu: GPUSpec, settings: Iterable[tuple[str, bool]]) -> str | None:
        """Which of `settings` ((CUDA-graph setting, activation offload) pairs: one layout's, or a search's) are
        timed as another setting on `gpu` (`credited_graphs`), and as which, or None when every saving is
        credited."""
        moved: dict[str, set[str]] = {}
        for graphs, offload in settings:
            credited = self.credited_graphs(gpu.arch, graphs, offload)
            if credited != graphs:
                moved.setdefault(graphs, set()).add(credited)
        if not moved:
            return None
        seen = ", ".join(dict(self.fitted_graphs or ()).get(gpu.arch, ())) or "none"
        names = [g for g in CUDA_GRAPH_CHOICES if g in moved]
        timed_as = [c for c in CUDA_GRAPH_CHOICES if any(c in moved[g] for g in names)]
        its = "its" if len(names) == 1 else "their"
        return (f"no fitted {gpu.arch} run uses " + ", ".join(f"cuda_graphs={g}" for g in names)
                + f" (they use {seen}), so {its} time saving is not credited: the step is timed as with "
                + " or ".join(f"cuda_graphs={c}" for c in timed_as)
                + " where that is slower, and the band's upper edge keeps the model's own figure")

    def release_factor(self, release: str, kind: str) -> tuple[float, str]:
        """(factor, the release it was fitted on) of `kind` ("dense" or "moe") for `release`: its own where fitted,
        else the nearest fitted release's (earlier first on a tie), else 1 (the reference release)."""
        if release == REFERENCE_RELEASE:
            return 1.0, release
        names = [r.name for r in RELEASES]
        fitted = {name: getattr(f, kind) for name, f in self.per_release if getattr(f, kind) is not None}
        fitted.setdefault(REFERENCE_RELEASE, 1.0)
        at = names.index(release) if release in names else len(names) - 1
        nearest = min(fitted, key=lambda n: (abs(names.index(n) - at), names.index(n) > at))
        return float(fitted[nearest]), nearest

    def for_release(self, release: str) -> Calibration:
        """This calibration with `release`'s factors applied (cached: equal inputs give the same object, which the
        throughput model's memos key on)."""
        return _for_release(self, release)

    def arch(self, gpu: GPUSpec) -> ArchFractions:
        """The fractions of `gpu`'s generation (`GPUSpec.arch`)."""
        for name, fractions in self.per_arch:
            if name == gpu.arch:
                return fractions
        raise ValueError(f"Calibration has no fractions for GPU generation {gpu.arch!r} ({gpu.name}); calibrated: "
                         f"{', '.join(n for n, _ in self.per_arch)}.")


DEFAULT_CALIBRATION = Calibration(  # bench/bench_throughput.py --fit --sweeps 6 (2026-12-02; no GB300/B300 row)
    per_arch=(
        ('ampere', _arch(gemm_bf16=0.8283, gemm_fp8=(), attention=0.1015, host_op_s=1.2e-05)),
        ('hopper', _arch(gemm_bf16=0.7013, gemm_fp8=(('delayed', 0.5785), ('tensorwise', 0.5785),
                                                     ('blockwise', 0.5785)),
                         attention=0.624, host_op_s=0.0001072)),
        ('blackwell', _arch(gemm_bf16=0.3978, gemm_fp8=(('delayed', 0.5949), ('tensorwise', 0.5949),
                                                        ('mxfp8', 0.5671), ('blockwise', 0.5949)),
                            gemm_fp4=0.7387, attention=0.5551, host_op_s=6.368e-05)),
    ),
    sfu_fraction=0.2476,
    softmax_serial=0.2704,
    gemm_dim_half=170.7,
    grouped_gemm_fraction=0.6482,
    tp_overlap_exposed=0.01852,
    ep_overlap_exposed=0.2197,
    fsdp_offload_exposed=0.4826,  # `bench/bench_throughput.py --fit-fsdp`: 8 FSDP rows, GB200 (7) and H100 (1)
    cp_overlap_fraction=0.3666,
    pp_p2p_exposed=0.0003575,
    pp_step_host_s=0.0008977,
    step_overhead_s=0.01995,
    fitted_groups=('blackwell bf16 MoE', 'blackwell fp4 dense', 'blackwell fp8 MoE', 'blackwell fp8 dense',
                   'hopper bf16 MoE', 'hopper fp8 MoE', 'hopper fp8 dense'),
    fitted_graphs=(('ampere', ('none',)), ('blackwell', ('none', 'local', 'transformer_engine', 'full_iteration')),
                   ('hopper', ('none', 'transformer_engine'))),
    per_release=(
        ('24.07', ReleaseFactors(dense=0.9607)),
        ('25.02', ReleaseFactors(dense=0.861)),
        ('25.04', ReleaseFactors(dense=0.95)),
        ('25.09', ReleaseFactors(dense=0.95, moe=0.8075)),
        ('25.11', ReleaseFactors(moe=1.5)),
        ('26.02.01', ReleaseFactors(moe=0.95)),
        ('26.04', ReleaseFactors(dense=1.06, moe=0.8486)),
        ('26.04.01', ReleaseFactors(moe=0.9063)),
        ('26.06', ReleaseFactors(moe=1.007)),
        ('26.06.01', ReleaseFactors(moe=1.351)),
        ('26.08', ReleaseFactors(moe=1.304)),
    ),
)


@lru_cache(maxsize=64)
def _for_release(cal: Calibration, release: str) -> Calibration:
    dense, _ = cal.release_factor(release, "dense")
    moe, _ = cal.release_factor(release, "moe")
    if dense == 1.0 and moe == 1.0:
        return cal
    per_arch = tuple((name, f.scaled(bf16=dense, fp8=dense, fp4=dense, attention=dense)) for name, f in cal.per_arch)
    return replace(cal, per_arch=per_arch, grouped_gemm_fraction=cal.grouped_gemm_fraction * moe, per_release=())


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


# Two SKUs of one die in a generation, whose datasheet peaks and power limits give the clock-power curve of that die
# (`power_factor`): Blackwell's B200 (1,000 W, 2.25 PFLOP/s BF16 dense) and GB200 (1,200 W, 2.5 PFLOP/s).
POWER_CURVE_GPUS = {"blackwell": ("b200", "gb200")}


@lru_cache(maxsize=64)
def power_factor(gpu: GPUSpec, precision: str = "bf16") -> float:
    """The sustained tensor-core rate at `precision` over what the datasheet peak alone says, from the power limit:
    a dense GEMM at full load runs at the clock the power cap allows. NVIDIA's own ratings of one die under two power
    limits give the curve: B200 and GB200 are the same chip, rated 2.25 and 2.5 PFLOP/s BF16 for 1,000 and 1,200 W,
    so the rate goes as TDP^k with k = ln(2.5 / 2.25) / ln(1.2) = 0.578 (their FP8 and FP4 ratings, 4.5 / 5 and
    9 / 10 PFLOP/s, give the same k). A GPU of that generation sustains the reference B200's rate at that precision
    times (TDP / TDP_ref)^k: the reference's energy per operation, spent under the GPU's own power limit. That is
    1 for B200 and GB200 at every precision by construction (so no fitted row moves); 1.094 for GB300 (rated 2.5
    PFLOP/s BF16 like GB200 but allowed 1,400 W) and 1.057 for B300 (2.25 PFLOP/s, 1,100 W) at BF16 and FP8; and
    below 1 at NVFP4 on Blackwell Ultra, whose datasheet FP4 (15 and 14 PFLOP/s dense against B200's 9) adds
    tensor units per clock but no power to run them at full clock: 9 * 1.4^k / 15 = 0.73 on GB300, 9 * 1.1^k / 14
    = 0.68 on B300. The rate is never above the GPU's BF16 power curve applied to its own peak. It assumes Blackwell
    Ultra's die spends Blackwell's energy per operation. 1 for generations without two such SKUs in the catalog,
    for a GPU without a power figure and for a precision the reference lacks. Nothing here is fitted: the
    exponent and the rates are the datasheets'."""
    from search_spaces.gpus import get_gpu

    pair = POWER_CURVE_GPUS.get(gpu.arch)
    if pair is None or gpu.tdp_watts is None:
        return 1.0
    low, high = (get_gpu(name) for name in pair)
    if low.tdp_watts is None or high.tdp_watts is None:
        return 1.0
    k = math.log(high.bf16_flops / low.bf16_flops) / math.log(high.tdp_watts / low.tdp_watts)
    scale = (gpu.tdp_watts / low.tdp_watts) ** k
    own = scale * low.bf16_flops / gpu.bf16_flops  # the BF16 curve on the GPU's own peak
    try:
        energy = scale * low.peak_flops(precision) / gpu.peak_flops(precision)
    except ValueError:  # the reference (or the GPU) has no units of that precision: the BF16 curve alone
        return own
    return min(own, energy)


# bytes per GEMM operand element: FP8 1; NVFP4 a 4-bit E2M1 value plus one E4M3 scale per 16 (TE
# `tensor/nvfp4_tensor.py`, NVFP4BlockScaling's 1 x 16 blocks)
OPERAND_BYTES = {"fp8": 1.0, "fp4": 0.5 + 1.0 / 16}


@lru_cache(maxsize=256)
def gemm_cost(gpu: GPUSpec, precision: str, recipe: str | None, cal: Calibration) -> GemmCost:
    """The GemmCost of `gpu` at `precision` (FP8: the recipe's fraction of the FP8 peak, 1-byte operands)."""
    fraction = cal.arch(gpu).gemm(precision, recipe)
    return GemmCost(flops_per_s=gpu.peak_flops(precision) * fraction * power_factor(gpu, precision),
                    bytes_per_s=gpu.hbm_bytes_per_s * cal.hbm_fraction,
                    element_bytes=OPERAND_BYTES.get(precision, 2.0),
                    dim_half=cal.gemm_dim_half, gap_s=cal.kernel_gap_s)


# FlashAttention-3 (Shah et al. 2024, arXiv 2407.08608, Sec. 3.1): H100 SXM5 runs 989 TFLOP/s of FP16 matmul but
# 3.9 T exponentials/s, 256 times fewer; the ratio stands in for a GPU whose SFU rate the catalog lacks.
MATMUL_PER_EXP_DEFAULT = 256.0


def attention_time_s(flops: float, exps: float, *, gpu: GPUSpec, cal: Calibration, block_tokens: float,
                     fp8: bool = False) -> float:
    """Fused attention core (cuDNN / FlashAttention): (matmul FLOPs / tensor peak + softmax exponentials / SFU
    rate) / (attention fraction * phi(n)^2).

    Within a tile the softmax's exponentials run on the special-function units while the tensor cores wait for
    them (FlashAttention-3 Sec. 3.1; the ping-pong overlap across tiles that FA3 and FA4 use is what the fitted
    fraction leaves room for), so the two add: at head dim 128 each score costs 512 matmul FLOPs and one exp, and
    Blackwell's 2.25 PFLOP/s BF16 against 5 T exp/s spends nearly as long on the exps as on the matmuls; Blackwell
    Ultra's doubled SFU rate (10.7 T/s) shortens that part, FP8 attention (`fp8_dot_product_attention`, TE's cuDNN
    FP8 kernel) the matmul part only. `block_tokens` n is the length of the query and key blocks one kernel call
    sees (s without CP, s / c per ring step with CP); phi(n) = n / (n + gemm_dim_half), the GEMMs' saturating
    factor, so short blocks run further from peak.
    """
    shape = (block_tokens / (block_tokens + cal.gemm_dim_half)) ** 2
    peak = gpu.peak_flops("fp8") if fp8 else gpu.bf16_flops
    exp_rate = gpu.sfu_exp_per_s or gpu.bf16_flops / MATMUL_PER_EXP_DEFAULT
    matmul_s = flops / (peak * cal.arch(gpu).attention * power_factor(gpu, "fp8" if fp8 else "bf16"))
    exp_s = exps / (exp_rate * cal.sfu_fraction)
    return (max(matmul_s, exp_s) + cal.softmax_serial * min(matmul_s, exp_s)) / shape


def memory_bound_time_s(nbytes: float, *, gpu: GPUSpec, cal: Calibration) -> float:
    """Elementwise kernels (norms, activations, casts, permutations, optimizer): bytes moved / achieved HBM
    bandwidth."""
    return nbytes / (gpu.hbm_bytes_per_s * cal.hbm_fraction)
