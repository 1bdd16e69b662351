"""`python -m autotune estimate --model llama3-70b --nodes 8 --layout "tp=4,pp=4,vpp=5"`: one layout, analytic.

Prints the validity verdict, the memory breakdown and the throughput breakdown (rich tables), or with
--json one object: feasible, status, reason, violations, layout (megatron-core names), memory_gib (the predicted
peak allocated, `torch.cuda.max_memory_allocated` of the most loaded GPU), device_memory_gib (plus what the GPU
holds outside PyTorch's allocator: the figure that must fit), memory (GiB per term), step_time_s,
tokens_per_s_per_gpu with its band (tokens_per_s_per_gpu_low / _high), tflops_per_gpu, mfu, time (seconds per
term), dominant_time. Exit code 0 when the layout is feasible, 1 when it breaks a rule or runs out of memory.
"""

from __future__ import annotations

import argparse
import json

from autotune.ui.commands import add_layout_argument

__all__ = ["add_arguments", "run", "estimate_object"]

GIB = 1024**3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_layout_argument(parser)
    parser.add_argument("--headroom-gib", type=float, default=0.0,
                        help="GiB to keep free on each GPU when judging out-of-memory (default 0)")


def estimate_object(measurement) -> dict[str, object]:
    """The --json object of one Measurement."""
    m = measurement
    return {
        "feasible": m.status == "ok",
        "status": m.status,
        "reason": m.reason,
        "violations": list(m.violations),
        "layout": m.layout.to_megatron(),
        "memory_gib": m.allocated_gib,  # peak allocated: what torch.cuda.max_memory_allocated measures
        "device_memory_gib": m.memory_gib,  # + CUDA context, NCCL, userbuffers, allocator reserve: what must fit
        "memory": {k: v / GIB for k, v in m.memory.items()},
        "step_time_s": m.step_time_s,
        "tokens_per_s_per_gpu": m.tokens_per_s_per_gpu,
        # the calibration's band (10th-90th percentile of the leave-one-model-out residuals, docs/throughput-model.md)
        "tokens_per_s_per_gpu_low": m.extra.get("tokens_per_s_per_gpu_low"),
        "tokens_per_s_per_gpu_high": m.extra.get("tokens_per_s_per_gpu_high"),
        "tflops_per_gpu": m.tflops_per_gpu,
        "mfu": m.mfu,
        "time": dict(m.time),
        "dominant_time": m.extra.get("dominant_time"),
    }


def _print_rich(job, m) -> None:
    from rich.console import Console

    console = Console()
    console.print(f"[bold]{job.model.name}[/bold] on {job.cluster.nodes} x {job.cluster.gpus_per_node} "
                  f"{job.cluster.gpu.name}, seq {job.training.seq_length}, GBS {job.training.global_batch_size}, "
                  f"{job.training.precision}")
    console.print(f"layout: {m.layout}")
    verdict = {"ok": "[green]feasible[/green]", "oom": "[red]out of memory[/red]",
               "invalid": "[red]invalid[/red]"}.get(m.status, m.status)
    console.print(f"verdict: {verdict}" + (f" ({m.reason})" if m.reason and m.status != "invalid" else ""))
    for v in m.violations:
        console.print(f"  [red]x[/red] {v}")
    if m.memory:
        console.print(_breakdown(f"memory per GPU: peak allocated {m.allocated_gib:.1f} GiB; {m.memory_gib:.1f} GiB on the "
                                 f"device with the allowance, of {job.cluster.gpu.memory_gib:.1f} GiB",
                                 "GiB", {k: v / GIB for k, v in m.memory.items()}, m.memory_bytes / GIB, ".2f", ".0%"))
    if m.time:
        low, high = m.extra.get("tokens_per_s_per_gpu_low"), m.extra.get("tokens_per_s_per_gpu_high")
        band = f" ({low:,.0f}-{high:,.0f})" if low and high else ""
        console.print(_breakdown(f"step time {m.step_time_s:.3f} s: {m.tokens_per_s_per_gpu:,.0f}{band} tokens/s/GPU, "
                                 f"{m.tflops_per_gpu:.0f} TFLOP/s/GPU, MFU {m.mfu:.1%}",
                                 "seconds", m.time, m.step_time_s, ".4f", ".1%"))
        console.print(f"largest term beyond compute: {m.extra.get('dominant_time')}")


def _breakdown(title: str, unit: str, terms: dict[str, float], total: float, value_spec: str, share_spec: str):
    """A rich table of named terms with their share of the total."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("term")
    table.add_column(unit, justify="right")
    table.add_column("share", justify="right")
    for name, value in terms.items():
        table.add_row(name, format(value, value_spec), format(value / total, share_spec))
    return table


def run(args: argparse.Namespace) -> int:
    from search_spaces.layout import parse_layout

    from autotune.cost.analytic import AnalyticBackend
    from autotune.ui.commands import job_from_args

    if args.headroom_gib < 0:
        raise ValueError(f"`--headroom-gib >= 0` must hold, but got ({args.headroom_gib}).")
    job = job_from_args(args)
    layout = parse_layout(args.layout, world_size=job.world_size)
    m = AnalyticBackend(headroom_bytes=args.headroom_gib * GIB).evaluate(job, layout)
    if args.json:
        print(json.dumps(estimate_object(m), indent=2))
    else:
        _print_rich(job, m)
    return 0 if m.status == "ok" else 1
