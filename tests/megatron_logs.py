"""Training logs in the exact format Megatron-LM prints them, for the calibrate tests.

The iteration line is `megatron/training/training.py::training_log`'s (megatron-core 0.19.2's Megatron-LM, installed
with it under `megatron/training/`), field by field with its format specs; the arguments block is
`megatron/training/arguments.py::_print_args` (dots to column 48, sorted case-insensitively); the memory line is
`megatron/training/utils/common_utils.py::report_memory`'s. The step times come from the caller: a published
row's tokens/s per GPU turned back into a step time (GBS x seq / (tokens/s per GPU x GPUs)), so a log built from
a published row is a reconstruction of that run's steady iterations, not a log NVIDIA published.

`bridge_summary` is Megatron-Bridge's configuration summary (`src/megatron/bridge/training/config.py::
ConfigContainer.log_non_default_values`, Megatron-Bridge 0.6): the megatron-core configs' non-default values with
their defaults, then every value of the other configs, each line behind a launcher's `[default0]:` prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from search_spaces.megatron_names import megatron_settings

__all__ = ["arguments_block", "iteration_line", "memory_line", "megatron_lm_log", "published_step_s", "logged_tflops",
           "job_arguments", "bridge_summary"]


def arguments_block(arguments: dict[str, Any]) -> str:
    lines = ["------------------------ arguments ------------------------"]
    items = ["  {} {} {}".format(name, "." * (48 - len(name)), value) for name, value in arguments.items()]
    lines += sorted(items, key=lambda x: x.lower())
    lines.append("-------------------- end of arguments ---------------------")
    return "\n".join(lines) + "\n"


def iteration_line(iteration: int, train_iters: int, step_ms: float, *, global_batch_size: int,
                   tflops: float | None = 412.3, loss: float = 7.123456) -> str:
    s = " [2026-12-02 10:11:12.123456]"
    s += f" iteration {iteration:8d}/{train_iters:8d} |"
    s += f" consumed samples: {iteration * global_batch_size:12d} |"
    s += f" elapsed time per iteration (ms): {step_ms:.1f} |"
    if tflops is not None:
        s += f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |"
    s += f" learning rate: {1e-4:.6E} |"
    s += f" global batch size: {global_batch_size:5d} |"
    s += " {}: {:.6E} |".format("lm loss", loss)
    s += f" loss scale: {1.0:.1f} |"
    s += f" grad norm: {1.234:.3f} |"
    s += f" number of skipped iterations: {0:3d} |"
    s += f" number of nan iterations: {0:3d} |"
    return s


def memory_line(iteration: int, max_allocated_mb: float) -> str:
    return (f"[Rank 0] (after {iteration} iterations) memory (MB) | allocated: {max_allocated_mb * 0.8:.2f} | max "
            f"allocated: {max_allocated_mb:.2f} | reserved: {max_allocated_mb * 1.1:.2f} | max reserved: "
            f"{max_allocated_mb * 1.1:.2f}")


def job_arguments(job: Any, layout: Any) -> dict[str, Any]:
    """Megatron-LM's arguments for `job` and `layout` (the ones calibrate reads, plus a few it does not)."""
    m, t = job.model, job.training
    mega = megatron_settings(layout)
    args = {name: mega[name] for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                          "virtual_pipeline_model_parallel_size", "context_parallel_size",
                                          "expert_model_parallel_size", "expert_tensor_parallel_size",
                                          "sequence_parallel", "micro_batch_size", "use_distributed_optimizer",
                                          "recompute_granularity")}
    args.update(num_layers=m.num_layers, hidden_size=m.hidden_size, num_attention_heads=m.num_attention_heads,
                num_experts=None if m.moe is None else m.moe.num_experts, seq_length=t.seq_length,
                global_batch_size=t.global_batch_size, world_size=job.world_size, bf16=True,
                fp8=("hybrid" if t.precision == "fp8" else None),
                fp8_recipe=(t.fp8_recipe or "tensorwise"), log_interval=1, lr=1e-4, seed=1234)
    return args


def megatron_lm_log(step_ms: Sequence[float], *, global_batch_size: int, arguments: dict[str, Any] | None = None,
                    max_allocated_mb: float | None = None, first: int = 1, tflops: float | None = None,
                    world_size: int = 64, cp: int = 1) -> str:
    """A whole log: the world line, the arguments block (when given), then one iteration line per step time
    (log_interval 1, each with `tflops`: `logged_tflops` for the job's own), a memory report after the first."""
    if arguments is not None:
        world_size = int(arguments.get("world_size", world_size))
        cp = int(arguments.get("context_parallel_size", cp))
    out = [f"using world size: {world_size}, data-parallel size: 2, context-parallel size: {cp}, hierarchical "
           f"context-parallel sizes: None, tensor-model-parallel size: 1, pipeline-model-parallel size: 1",
           "> initializing torch distributed ..."]
    text = "\n".join(out) + "\n"
    if arguments is not None:
        text += arguments_block(arguments)
    lines = []
    iters = first + len(step_ms) - 1
    for k, ms in enumerate(step_ms):
        lines.append(iteration_line(first + k, iters, ms, global_batch_size=global_batch_size, tflops=tflops))
        if k == 0 and max_allocated_mb is not None:
            lines.append(memory_line(first + k, max_allocated_mb))
    return text + "\n".join(lines) + "\n"


def logged_tflops(job: Any, step_s: float) -> float:
    """What Megatron-LM logs as `throughput per GPU (TFLOP/s/GPU)` for `job` at a step of `step_s`:
    `num_floating_point_operations(args, GBS) / (step * 1e12 * world size)` (`training.py::training_log`)."""
    from autotune.cost.flops import model_flops_per_step

    return model_flops_per_step(job.model, job.training) / (step_s * 1e12 * job.world_size)


def published_step_s(row: Any) -> float:
    """The step time a published row's tokens/s per GPU implies: GBS x seq / (tokens/s/GPU x GPUs)."""
    t = row.job.training
    return t.global_batch_size * t.seq_length / (row.published * row.job.world_size)


# megatron-core's defaults of the fields `bridge_summary` writes (TransformerConfig / DistributedDataParallelConfig)
_MCORE_DEFAULTS = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                   "virtual_pipeline_model_parallel_size": None, "context_parallel_size": 1,
                   "expert_model_parallel_size": 1, "expert_tensor_parallel_size": None, "sequence_parallel": False,
                   "recompute_granularity": None, "num_layers": 1, "hidden_size": 0, "num_attention_heads": 0,
                   "num_moe_experts": None, "fp8": None, "fp8_recipe": "delayed", "use_distributed_optimizer": False}


def bridge_summary(job: Any, layout: Any, prefix: str = "[default0]:") -> str:
    """Megatron-Bridge's configuration summary of `job` and `layout` (module docstring)."""
    a = job_arguments(job, layout)
    model = {name: a[name] for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                        "virtual_pipeline_model_parallel_size", "context_parallel_size",
                                        "expert_model_parallel_size", "expert_tensor_parallel_size",
                                        "sequence_parallel", "recompute_granularity", "num_layers", "hidden_size",
                                        "num_attention_heads", "fp8")}
    model["num_moe_experts"] = a["num_experts"]
    if a["fp8"] is not None:
        model["fp8_recipe"] = a["fp8_recipe"]
    rule = "=" * 70
    lines = ["", rule, "Configuration Summary (Non-Default Values vs Megatron Core)", rule]
    for section, mcore, values in (("optimizer", "OptimizerConfig", {"lr": 1e-4}),
                                   ("ddp", "DistributedDataParallelConfig",
                                    {"use_distributed_optimizer": a["use_distributed_optimizer"]}),
                                   ("model", "TransformerConfig", model)):
        changed = {k: v for k, v in values.items() if v != _MCORE_DEFAULTS.get(k, object())}
        if changed:
            lines.append(f"\n[{section}] Non-default values (vs Mcore {mcore}):")
            lines += [f"  {k}: {v!r}  (Mcore default: {_MCORE_DEFAULTS.get(k)!r})" for k, v in sorted(changed.items())]
    lines += ["\n" + "-" * 70, "Other Configuration Values:", "-" * 70, "\n[train]:"]
    lines += [f"  {k}: {v!r}" for k, v in sorted({"global_batch_size": a["global_batch_size"],
                                                  "micro_batch_size": a["micro_batch_size"],
                                                  "train_iters": 100}.items())]
    lines.append("\n[dataset]:")
    lines += [f"  {k}: {v!r}" for k, v in sorted({"sequence_length": a["seq_length"], "seed": 1234}.items())]
    lines.append("\n" + rule)
    return "\n".join(prefix + line for line in "\n".join(lines).split("\n")) + "\n"
