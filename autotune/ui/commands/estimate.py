"""`python -m autotune estimate --model llama3-70b --nodes 8 --layout "tp=8,pp=4,vpp=5,sp=true"`: one layout, analytic.

Prints the validity verdict, the memory breakdown and the throughput breakdown (rich tables), or with
--json one object: feasible, status, reason, violations, layout (megatron-core names), memory_gib, usable_gib,
headroom_gib, memory (GiB per term), step_time_s, tokens_per_s_per_gpu, tflops_per_gpu, mfu, time (seconds per
term), dominant_time. Exit code 0 when the layout is feasible, 1 when it breaks a rule or runs out of memory.
Out of memory means above the GPU's memory minus the headroom, the search's default (5% of the GPU) unless
--headroom-gib says otherwise, so estimate, check and the search agree on what fits.
"""

from __future__ import annotations

import argparse
import json

from autotune.ui.commands import add_layout_argument

__all__ = ["add_arguments", "add_headroom_argument", "headroom_bytes", "run", "estimate_object"]

GIB = 1024**3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_layout_argument(parser)
    add_headroom_argument(parser)


def add_headroom_argument(parser: argparse.ArgumentParser) -> None:
    """`--headroom-gib` of estimate and check, with the search's default."""
    parser.add_argument("--headroom-gib", type=float, default=None,
                        help="GiB kept free on each GPU when judging out-of-memory (default 5%% of the GPU, as the "
                             "search keeps)")


def headroom_bytes(args: argparse.Namespace, job) -> float:
    """The headroom asked for, else the search's default (`autotune.tuning.driver.default_headroom_bytes`)."""
    from autotune.tuning.driver import default_headroom_bytes

    if args.headroom_gib is None:
        return default_headroom_bytes(job)
    if not 0 <= args.headroom_gib < job.cluster.gpu.memory_gib:
        raise ValueError(f"`0 <= --headroom-gib < GPU memory` must hold, but got ({args.headroom_gib}, "
                         f"{job.cluster.gpu.memory_gib:.0f} GiB).")
    return args.headroom_gib * GIB


def estimate_object(measurement, *, usable_bytes: float | None = None,
                    headroom: float | None = None) -> dict[str, object]:
    """The --json object of one Measurement."""
    m = measurement
    return {
        "feasible": m.status == "ok",
        "status": m.status,
        "reason": m.reason,
        "violations": list(m.violations),
        "layout": m.layout.to_megatron(),
        "memory_gib": m.memory_gib,
        "usable_gib": None if usable_bytes is None else usable_bytes / GIB,
        "headroom_gib": None if headroom is None else headroom / GIB,
        "memory": {k: v / GIB for k, v in m.memory.items()},
        "step_time_s": m.step_time_s,
        "tokens_per_s_per_gpu": m.tokens_per_s_per_gpu,
        "tflops_per_gpu": m.tflops_per_gpu,
        "mfu": m.mfu,
        "time": dict(m.time),
        "dominant_time": m.extra.get("dominant_time"),
    }


def _print_rich(job, m, headroom: float) -> None:
    from autotune.outputs.tables import breakdown_table, make_console

    console = make_console()
    gpu = job.cluster.gpu
    console.print(f"[bold]{job.model.name}[/bold] on {job.cluster.nodes} x {job.cluster.gpus_per_node} "
                  f"{gpu.name}, seq {job.training.seq_length}, GBS {job.training.global_batch_size}, "
                  f"{job.training.precision}")
    console.print(f"layout: {m.layout}", markup=False)
    verdict = {"ok": "[green]feasible[/green]", "oom": "[red]out of memory[/red]",
               "invalid": "[red]invalid[/red]"}.get(m.status, m.status)
    console.print(f"verdict: {verdict}")
    if m.reason and m.status != "invalid":
        console.print(f"  {m.reason}", markup=False)
    for v in m.violations:
        console.print(f"  [red]x[/red] {v}")
    usable = (gpu.memory_bytes - headroom) / GIB
    if m.memory:
        console.print(f"[bold]memory per GPU[/bold]: peak {m.memory_gib:.1f} GiB of {usable:.1f} GiB usable "
                      f"({gpu.memory_gib:.0f} GiB minus {headroom / GIB:.1f} GiB headroom)")
        console.print(breakdown_table("GiB", {k: v / GIB for k, v in m.memory.items()}, m.memory_bytes / GIB,
                                      ".2f", ".0%"))
    if m.time:
        console.print(f"[bold]step time[/bold] {m.step_time_s:.3f} s: {m.tokens_per_s_per_gpu:,.0f} tokens/s per "
                      f"GPU, {m.tflops_per_gpu:.0f} TFLOP/s per GPU, MFU {m.mfu:.1%}")
        console.print(breakdown_table("seconds", m.time, m.step_time_s, ".4f", ".1%"))
        console.print(f"largest term beyond compute: {m.extra.get('dominant_time')}")


def run(args: argparse.Namespace) -> int:
    from autotune.cost.analytic import AnalyticBackend
    from autotune.ui.commands import job_from_args
    from search_spaces.layout import parse_layout

    job = job_from_args(args)
    headroom = headroom_bytes(args, job)
    layout = parse_layout(args.layout, world_size=job.world_size)
    m = AnalyticBackend(headroom_bytes=headroom).evaluate(job, layout)
    if args.json:
        print(json.dumps(estimate_object(m, usable_bytes=job.cluster.gpu.memory_bytes - headroom, headroom=headroom),
                         indent=2))
    else:
        _print_rich(job, m, headroom)
    return 0 if m.status == "ok" else 1
