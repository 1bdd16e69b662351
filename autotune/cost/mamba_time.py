"""One micro-batch through one Mamba-2 layer on one GPU: GEMMs, the chunked scan, TP and CP traffic, host.

megatron-core 0.19 `ssm/mamba_layer.py` + `ssm/mamba_mixer.py::MambaMixer.forward` on the training path
(`use_mem_eff_path=True`): the norm fused into `in_proj` (TE `LayerNormColumnParallelLinear`), `in_proj`
(h -> 2 d_inner + 2 G N + H, split over TP), the context-parallel all-to-all into head-sharded full sequences
(`mamba_context_parallel.py::pre_conv_ssm`) and back (`post_conv_ssm`), mamba_ssm's fused
`mamba_split_conv1d_scan_combined` (causal conv1d + SiLU over x B C, dt softplus, the SSD chunked scan, the
z gate), the gated RMSNorm (`ExtendedRMSNorm`) and `out_proj` (d_inner -> h, row-parallel), then bias-dropout-add.

Symbols (Dao & Gu 2024, "Transformers are SSMs", arXiv 2405.21060): H heads of head dim P (d_inner = H P), state N,
G groups, chunk Q, conv width K; per GPU H/t heads, G/t groups, rows R = b s / c before the CP all-to-all.
The SSD algorithm (Sec. 6, Listing 1 `ssd_minimal_discrete`) per chunk of Q tokens: (1) the diagonal blocks
(C B^T masked by the decays, Q x Q per group: 2 Q N per token and group; times X: 2 Q P per token and head),
(2) the chunk states B^T X (2 N P per token and head), (3) the inter-chunk recurrence (H P N per chunk, negligible),
(4) the states' output C h (2 N P per token and head): forward FLOPs per token H (2 Q P + 4 N P) + 2 G Q N.
Bytes per token (bf16 in and out, fp32 states): the kernel reads x B C (conv_dim), dt (H) and z (d_inner), writes y
(d_inner), and writes then reads the chunk states H P N x 4 B once per Q tokens; the conv reads and writes x B C.
The scan's time is set by the SMs' CUDA cores, not by HBM or the tensor cores: mamba_ssm's SSD kernels
(`ops/triton/ssd_chunk_scan.py`, `ssd_chunk_state.py`, `ssd_bmm.py`) build each Q x Q and Q x P tile from FP32
element-wise work (the decays exp(dA_cs_m - dA_cs_k), the causal mask, the dt scaling, FP32 accumulation), which
grows with the same tiles as the FLOPs above, so the time is FLOPs / (the GPU's FP32 CUDA-core peak
`GPUSpec.fp32_flops` x `Calibration.mamba_scan_fraction`), the one fitted Mamba constant, never below the bytes at
the achieved HBM bandwidth or the FLOPs at the attention kernels' tensor rate. The published Nano rows say so:
H100 -> B200 raises HBM bandwidth and tensor peaks 2.3-2.4x but the FP32 peak only 1.12x (67 -> 75 TFLOPS), and
a bandwidth-bound scan fitted with one constant predicted the H100 rows 14% slow and the GB200 rows 4% fast,
the CUDA-core-bound scan both within 6% (mean 2.2% and 3.6%); the SFU exponential rate (doubled on Blackwell
Ultra) would predict the held-out GB300 / B300 rows 11-14% fast, the CUDA-core rate keeps them within 9%
(`bench/bench_throughput.py`).
The backward recomputes the conv and the chunk states (mamba_ssm `ssd_combined.py::_mamba_chunk_scan_combined_bwd`,
the mem-eff path saves only `zxbcdt` and the scan output) and runs the gradients of steps 1, 2 and 4: 1 + 2 = 3x
the forward's scan traffic (`SCAN_BACKWARD`); GEMMs 2x as everywhere.
"""

from __future__ import annotations

from autotune.cost.comm import all_to_all_s
from autotune.cost.efficiency import memory_bound_time_s, power_factor
from autotune.cost.layer_time import BF16, Pass, Shape, _tp_collectives_s, _tp_passes, fp8_cast_s, host_s, tp_exposed_s
from search_spaces.cluster import GPUSpec

__all__ = ["mamba_block", "scan_flops_per_token", "scan_bytes_per_token", "fp32_flops", "MAMBA_HOST_OPS",
           "SCAN_BACKWARD"]

FP32 = 4.0
SCAN_BACKWARD = 3.0  # the backward: recompute (1x) + gradients of the diagonal, state and output steps (2x)
# Framework ops per forward (mamba_layer.py, mamba_mixer.py): norm+in_proj, CP hooks, reshapes / rearranges (~6),
# A = -exp(A_log), the fused scan, the gated norm, out_proj, BDA. Only their product with `host_op_s` matters.
MAMBA_HOST_OPS = 14
BF16_PER_FP32_DEFAULT = 989.4 / 67.0  # H100 SXM datasheet: BF16 tensor 989.4 TFLOPS dense, FP32 67 TFLOPS


def scan_flops_per_token(x: Shape) -> float:
    """SSD forward FLOPs per token on one GPU (module docstring): H/t (2 Q P + 4 N P) + 2 (G/t) Q N."""
    m, t = x.model.mamba, x.tp
    assert m is not None
    return m.num_heads / t * (2 * m.chunk_size * m.head_dim + 4 * m.state_dim * m.head_dim) \
        + 2 * m.num_groups / t * m.chunk_size * m.state_dim


def scan_bytes_per_token(x: Shape) -> float:
    """Bytes the fused conv + scan moves per token on one GPU (module docstring)."""
    m, t = x.model.mamba, x.tp
    assert m is not None
    conv = 2 * BF16 * m.conv_dim / t  # conv1d reads x B C, writes its output
    scan = BF16 * (m.conv_dim + m.num_heads + 2 * m.d_inner) / t  # x B C, dt, z in; y out
    states = 2 * FP32 * m.num_heads * m.head_dim * m.state_dim / (t * m.chunk_size)
    return conv + scan + states


def fp32_flops(gpu: GPUSpec) -> float:
    """The GPU's FP32 CUDA-core peak (`GPUSpec.fp32_flops`); a GPU that does not give it (a YAML GPU) is taken at
    H100's ratio of BF16 tensor to FP32 CUDA-core peak (989.4 / 67 TFLOPS, the H100 datasheet)."""
    return gpu.fp32_flops or gpu.bf16_flops / BF16_PER_FP32_DEFAULT


def _scan_s(x: Shape, tokens: float) -> float:
    """The fused conv + SSD scan of `tokens` tokens on one GPU: bound by the CUDA cores (module docstring), never
    faster than its bytes at the achieved HBM bandwidth or its FLOPs at the attention kernels' tensor rate."""
    gpu, cal = x.job.cluster.gpu, x.cal
    flops = tokens * scan_flops_per_token(x)
    cores = flops / (fp32_flops(gpu) * cal.mamba_scan_fraction)
    memory = memory_bound_time_s(tokens * scan_bytes_per_token(x), gpu=gpu, cal=cal)
    tensor = flops / (gpu.bf16_flops * cal.arch(gpu).attention * power_factor(gpu))
    return max(cores, memory, tensor)


def mamba_block(x: Shape) -> dict[str, Pass]:
    """Forward, backward and the recomputable parts of one Mamba-2 layer, with its TP and CP communication."""
    m, job, cal = x.model.mamba, x.job, x.cal
    assert m is not None
    t, c, h = x.tp, x.cp, x.model.hidden_size
    rows = x.rows  # b s / c: the GEMMs' rows (SP all-gathers the sequence first)
    in_proj = x.gemm.time_s(rows, m.in_proj_width / t, h)
    out_proj = x.gemm.time_s(rows, h, m.d_inner / t)
    gemms = in_proj + out_proj
    scan = _scan_s(x, rows)  # after the CP all-to-all: b s tokens of H/(t c) heads, the same work per rank
    norm = memory_bound_time_s(BF16 * 2 * x.tokens * h, gpu=job.cluster.gpu, cal=cal)
    gated_norm = memory_bound_time_s(BF16 * 3 * rows * m.d_inner / t, gpu=job.cluster.gpu, cal=cal)
    bda = memory_bound_time_s(BF16 * 3 * x.tokens * h, gpu=job.cluster.gpu, cal=cal)
    elem = norm + gated_norm + bda
    cast = fp8_cast_s(x, rows * (h + m.d_inner / t))
    cf, cb = _tp_passes(x)
    one = _tp_collectives_s(x)
    cp_f = cp_b = 0.0
    if c > 1:  # pre_conv_ssm: zxBCdt to head shards (in_proj width / t), post_conv_ssm: y back (d_inner / t)
        link = job.cluster.link_for_group(c, t)
        per_rank = rows * (m.in_proj_width + m.d_inner) / t * BF16
        cp_f = all_to_all_s(per_rank, c, link, cal)
        cp_b = cp_f  # the gradients travel the same way back
    host = host_s(x, MAMBA_HOST_OPS, "mamba")
    fwd = Pass(compute=gemms + scan + elem + cast, tp_comm=tp_exposed_s(x, cf * one, gemms), cp_comm=cp_f, host=host)
    bwd = Pass(compute=2 * gemms + SCAN_BACKWARD * scan + 2 * elem + cast,
               tp_comm=tp_exposed_s(x, cb * one, 2 * gemms), cp_comm=cp_b, host=cal.host_backward_ratio * host)
    # the norm is fused into in_proj (TE spec: MambaLayer.norm is IdentityOp), so 'layernorm' recompute skips it
    return {"fwd": fwd, "bwd": bwd, "mamba": fwd}
