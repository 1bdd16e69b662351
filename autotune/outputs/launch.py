"""A layout as a training launch: Megatron-Bridge overrides and Megatron-LM arguments.

The two forms follow the mapping in Megatron-Bridge's `docs/megatron-lm-to-megatron-bridge.md`
(`--tensor-model-parallel-size N` is `model.tensor_model_parallel_size=N`, `--micro-batch-size N` is
`train.micro_batch_size=N`, `--use-distributed-optimizer` is `ddp.use_distributed_optimizer` and
`optimizer.use_distributed_optimizer`, `--seq-length N` is `model.seq_length=N dataset.seq_length=N`)
and Megatron-LM's `megatron/training/arguments.py` for the flags themselves. Interleaving is given
as `--num-layers-per-virtual-pipeline-stage` (layers per model chunk), which every Megatron-LM since
the interleaved schedule accepts; newer versions also take `--num-virtual-stages-per-pipeline-rank`.
Full recompute is emitted as megatron's usual `uniform` method over 1 layer.
"""

from __future__ import annotations

from search_spaces.job import Job
from search_spaces.layout import Layout

__all__ = ["bridge_overrides", "megatron_lm_args", "launch_forms", "BRIDGE_PRECISION", "MEGATRON_LM_PRECISION"]

# Megatron-Bridge registered mixed-precision presets (`bridge/training/mixed_precision.py`).
BRIDGE_PRECISION: dict[str, str] = {"bf16": "bf16_mixed", "fp8": "bf16_with_fp8_delayed_scaling_mixed"}
MEGATRON_LM_PRECISION: dict[str, tuple[str, ...]] = {"bf16": ("--bf16",), "fp8": ("--bf16", "--fp8-format", "hybrid")}


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _layers_per_virtual_stage(job: Job, layout: Layout) -> int:
    """Megatron-LM's `--num-layers-per-virtual-pipeline-stage` = L / (PP * VPP) (the rules require it divides)."""
    return job.model.num_layers // (layout.pp * layout.vpp_size)


def _uneven(layout: Layout) -> tuple[int | None, int | None, bool]:
    """megatron-core's uneven pipeline split (first/last stage layers, embedding and loss as layers)."""
    return (getattr(layout, "first_stage_layers", None), getattr(layout, "last_stage_layers", None),
            bool(getattr(layout, "embedding_loss_split", False)))


def bridge_overrides(job: Job, layout: Layout) -> list[str]:
    """Hydra/OmegaConf overrides for a Megatron-Bridge recipe, in `group.field=value` form."""
    is_moe = job.model.moe is not None
    out = [
        f"model.tensor_model_parallel_size={layout.tp}",
        f"model.pipeline_model_parallel_size={layout.pp}",
        f"model.virtual_pipeline_model_parallel_size={layout.vpp if layout.vpp else 'null'}",
        f"model.context_parallel_size={layout.cp}",
    ]
    first, last, embedding_loss = _uneven(layout)
    if first is not None:
        out.append(f"model.num_layers_in_first_pipeline_stage={first}")
    if last is not None:
        out.append(f"model.num_layers_in_last_pipeline_stage={last}")
    if embedding_loss:
        out += ["model.account_for_embedding_in_pipeline_split=true", "model.account_for_loss_in_pipeline_split=true"]
    if is_moe:
        out += [f"model.expert_model_parallel_size={layout.ep}",
                f"model.expert_tensor_parallel_size={layout.expert_tp}"]
    out += [
        f"model.sequence_parallel={_bool(layout.sp)}",
        f"train.micro_batch_size={layout.mbs}",
        f"train.global_batch_size={job.training.global_batch_size}",
        f"model.seq_length={job.training.seq_length}",
        f"dataset.seq_length={job.training.seq_length}",
        f"ddp.use_distributed_optimizer={_bool(layout.dist_opt)}",
        f"optimizer.use_distributed_optimizer={_bool(layout.dist_opt)}",
    ]
    if layout.recompute == "none":
        out.append("model.recompute_granularity=null")
    elif layout.recompute == "selective":
        out.append("model.recompute_granularity=selective")
    else:
        out += ["model.recompute_granularity=full", "model.recompute_method=uniform", "model.recompute_num_layers=1"]
    out.append(f"mixed_precision={BRIDGE_PRECISION[job.training.precision]}")
    return out


def megatron_lm_args(job: Job, layout: Layout) -> list[str]:
    """`pretrain_gpt.py` arguments (flag and value as separate items, ready for a shell line)."""
    is_moe = job.model.moe is not None
    out = ["--tensor-model-parallel-size", str(layout.tp), "--pipeline-model-parallel-size", str(layout.pp)]
    first, last, embedding_loss = _uneven(layout)
    if layout.vpp and (first, last, embedding_loss) == (None, None, False):
        out += ["--num-layers-per-virtual-pipeline-stage", str(_layers_per_virtual_stage(job, layout))]
    elif layout.vpp:  # uneven stages: chunks differ in size, so name the number of chunks instead
        out += ["--num-virtual-stages-per-pipeline-rank", str(layout.vpp)]
    if first is not None:
        out += ["--decoder-first-pipeline-num-layers", str(first)]
    if last is not None:
        out += ["--decoder-last-pipeline-num-layers", str(last)]
    if embedding_loss:
        out += ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
    out += ["--context-parallel-size", str(layout.cp)]
    if is_moe:
        out += ["--expert-model-parallel-size", str(layout.ep), "--expert-tensor-parallel-size", str(layout.expert_tp)]
    if layout.sp:
        out.append("--sequence-parallel")
    out += ["--micro-batch-size", str(layout.mbs), "--global-batch-size", str(job.training.global_batch_size),
            "--seq-length", str(job.training.seq_length)]
    if layout.dist_opt:
        out.append("--use-distributed-optimizer")
    if layout.recompute == "selective":
        out += ["--recompute-granularity", "selective"]
    elif layout.recompute == "full":
        out += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    out += list(MEGATRON_LM_PRECISION[job.training.precision])
    return out


def launch_forms(job: Job, layout: Layout) -> dict[str, str]:
    """Both launch forms as single lines: `{"megatron_bridge": "...", "megatron_lm": "..."}`."""
    return {"megatron_bridge": " ".join(bridge_overrides(job, layout)),
            "megatron_lm": " ".join(megatron_lm_args(job, layout))}
