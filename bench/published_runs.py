"""The published runs of bench/data/calibration-runs.csv as autotune specs, for the benchmarks.

One reading of a row serves both the throughput benchmark (bench_throughput.py via throughput_rows.py) and the memory
check (bench_memory_published.py). What the sources leave unsaid is filled in the way the source's own scripts of that
time did:
- micro-batch size 1 and no VPP unless the row gives them; DP from the row, else GPUs / (TP * PP * CP);
- ETP 1 for the ModelZoo rows that leave it empty (the same recipe's other rows publish ETP=1; megatron-core's
  default, ETP = TP, would put EP*ETP = 32 across nodes);
- sequence parallelism as published; empty means on when TP > 1 for the 2024+ sources (mlm-readme-2024,
  moe-modelzoo), off for the 2021 sources (Narayanan 2021 and the GPT-3 example predate SP);
- distributed optimizer as published; empty means on for the 2024+ sources, off for 2021-2022 (not there yet);
- uneven pipeline split where num_layers % (PP * VPP) != 0 (the Qwen3-235B rows: 94 layers on PP 8 x VPP 4 and
  PP 32 x VPP 3): the ModelZoo scripts pass --account-for-embedding-in-pipeline-split
  --account-for-loss-in-pipeline-split, so embedding_loss_split (96 = 8 x 4 x 3 = 32 x 3 x 1); any other row
  would get the split autotune offers (`layout.pipeline_split_for`);
- cluster: 8 GPUs per node; A100 rows on NVLink3 + InfiniBand HDR (Selene), H100 rows on NVLink4 + NDR (EOS);
- GPT-style rows (gelu) are LayerNorm, biased linears, learned positions, tied embeddings (Megatron GPT defaults);
  SwiGLU rows are RMSNorm, no bias, RoPE, untied, with qk_layernorm where the attention column says so.
Recompute is left to each benchmark: the throughput model and the memory model read the ModelZoo's module
recompute lists differently (see their docstrings).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from search_spaces.cluster import ClusterSpec  # noqa: E402
from search_spaces.gpus import get_gpu, get_link  # noqa: E402
from search_spaces.job import Job  # noqa: E402
from search_spaces.layout import Layout, PipelineSplit, Recompute, pipeline_split_for  # noqa: E402
from search_spaces.model import ModelSpec, MoESpec  # noqa: E402
from search_spaces.training import TrainingSpec  # noqa: E402

__all__ = ["CSV_PATH", "MODERN_SOURCES", "int_or", "float_or", "is_modern", "model_of", "job_of", "layout_of"]

CSV_PATH = Path(__file__).resolve().parent / "data" / "calibration-runs.csv"
MODERN_SOURCES = ("mlm-readme-2024", "moe-modelzoo")


def int_or(text: str, default: int | None = None) -> int | None:
    text = (text or "").strip()
    return int(float(text)) if text else default


def float_or(text: str) -> float | None:
    text = (text or "").strip()
    return float(text) if text else None


def is_modern(r: dict[str, str]) -> bool:
    return r["source_id"] in MODERN_SOURCES


def _flag(text: str, default: bool) -> bool:
    text = text.strip().lower()
    if text.startswith("yes"):
        return True
    if text.startswith("no"):
        return False
    return default


def model_of(r: dict[str, str]) -> ModelSpec:
    gated = r["mlp_activation"].strip().lower() == "swiglu"
    moe = None
    if r["num_experts"].strip():
        moe = MoESpec(num_experts=int(r["num_experts"]), topk=int(r["moe_topk"]),
                      expert_ffn_hidden_size=int(r["moe_ffn_hidden_size"]),
                      shared_expert_ffn_hidden_size=int_or(r["shared_expert_ffn"], 0) or 0)
    return ModelSpec(
        name=r["model"], num_layers=int(r["num_layers"]), hidden_size=int(r["hidden_size"]),
        ffn_hidden_size=int(r["ffn_hidden_size"]), num_attention_heads=int(r["num_attention_heads"]),
        num_query_groups=int_or(r["num_query_groups"]), kv_channels=int_or(r["kv_channels"]),
        vocab_size=int(r["vocab_size"]), gated_linear_unit=gated, tied_embeddings=not gated,
        add_bias_linear=not gated, normalization="RMSNorm" if gated else "LayerNorm",
        max_position_embeddings=0 if gated else int(r["seq_len"]), qk_layernorm="qk_layernorm" in r["attention"],
        moe=moe,
    )


def job_of(r: dict[str, str]) -> Job:
    gpu_name = r["gpu_type"].strip().lower()
    a100 = gpu_name.startswith("a100")
    gpus = int(r["num_gpus"])
    cluster = ClusterSpec(nodes=max(gpus // 8, 1), gpus_per_node=min(8, gpus), gpu=get_gpu(gpu_name),
                          intra_node=get_link("nvlink3" if a100 else "nvlink4"),
                          inter_node=get_link("ib-hdr" if a100 else "ib-ndr"))
    training = TrainingSpec(seq_length=int(r["seq_len"]), global_batch_size=int(r["global_batch_size"]),
                            precision="fp8" if r["precision"].strip().upper() == "FP8" else "bf16")
    return Job(model=model_of(r), cluster=cluster, training=training)


def _pipeline_split(r: dict[str, str], pp: int, vpp: int | None) -> PipelineSplit:
    """The published recipe's split when the layers do not divide PP * VPP (see the module docstring)."""
    layers = int(r["num_layers"])
    if layers % (pp * (vpp or 1)) == 0:
        return {}
    if r["source_id"] == "moe-modelzoo":
        return {"embedding_loss_split": True}
    return pipeline_split_for(layers, pp, vpp or 1) or {}


def layout_of(r: dict[str, str], recompute: Recompute) -> Layout:
    """The row's published layout (needs the tp and pp columns) with the benchmark's reading of its recompute."""
    modern = is_modern(r)
    tp, pp, cp = int(r["tp"]), int(r["pp"]), int_or(r["cp"], 1) or 1
    vpp = int_or(r["vpp"])
    vpp = vpp if vpp and vpp > 1 else None
    return Layout(
        **_pipeline_split(r, pp, vpp),
        tp=tp, pp=pp, vpp=vpp, cp=cp, ep=int_or(r["ep"], 1) or 1,
        etp=int_or(r["etp"], 1 if r["source_id"] == "moe-modelzoo" else None),
        dp=int_or(r["dp"]) or int(r["num_gpus"]) // (tp * pp * cp), mbs=int_or(r["micro_batch_size"], 1) or 1,
        sp=_flag(r["sequence_parallel"], modern and tp > 1) and tp > 1,
        dist_opt=_flag(r["distributed_optimizer"], modern), recompute=recompute,
    )
