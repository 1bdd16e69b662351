"""`python -m autotune estimate --model llama3-70b --nodes 8 --layout "tp=8,pp=4,vpp=5,sp=true"`: one layout, analytic.

Prints the validity verdict, the memory breakdown and the throughput breakdown (rich tables), or with
--json one object: feasible, status, reason, violations, layout (megatron-core names), memory_gib (the device
peak of the most loaded GPU: what must fit, as in `check` and the search), allocated_memory_gib (its part in
PyTorch's allocator, `torch.cuda.max_memory_allocated`), usable_gib, headroom_gib, memory (GiB per term),
step_time_s, tokens_per_s_per_gpu with its band (tokens_per_s_per_gpu_low / _high), tflops_per_gpu, mfu, time
(seconds per term), dominant_time, nearest (for a layout that breaks a rule or does not fit: the nearest layout of
the search space that fits, `check`'s). Exit code 0 when the layout is feasible, 1 when it breaks a rule or runs out
of memory. Out of memory means the device peak above the GPU's memory minus the headroom, the search's default (0: the
memory model counts the CUDA context, NCCL buffers and the allocator's reserve itself) unless --headroom-gib says
otherwise, so estimate, check and the search agree on what fits.
"""

from __future__ import annotations

import argparse
import json

from autotune.ui.commands import add_calibration_argument, add_layout_argument
from search_spaces.megatron_names import megatron_settings
from search_spaces.units import GIB

__all__ = ["add_arguments", "add_headroom_argument", "headroom_bytes", "run", "estimate_object"]



def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_layout_argument(parser)
    add_headroom_argument(parser)
    add_calibration_argument(parser)


def add_headroom_argument(parser: argparse.ArgumentParser) -> None:
    """`--headroom-gib` of estimate and check, with the search's default."""
    parser.add_argument("--headroom-gib", type=float, default=None,
                        help="GiB kept free on each GPU when judging out-of-memory (default 0, as the search: the "
                             "memory model keeps its own allowance)")


def headroom_bytes(args: argparse.Namespace, job) -> float:
    """The headroom asked for, else the search's default (`autotune.tuning.driver.default_headroom_bytes`)."""
    from autotune.tuning.driver import default_headroom_bytes

    if args.headroom_gib is None:
        return default_headroom_bytes(job)
    if not 0 <= args.headroom_gib < job.cluster.gpu.memory_gib:
        raise ValueError(f"`0 <= --headroom-gib < GPU memory` must hold, but got ({args.headroom_gib}, "
                         f"{job.cluster.gpu.memory_gib:.0f} GiB).")
    return args.headroom_gib * GIB


def estimate_object(measurement, *, usable_bytes: float | None = None, headroom: float | None = None,
                    training=None) -> dict[str, object]:
    """The --json object of one Measurement (its layout with what the job's `training` optimizer changes)."""
    m = measurement
    return {
        "feasible": m.status == "ok",
        "status": m.status,
        "reason": m.reason,
        "violations": list(m.violations),
        "layout": megatron_settings(m.layout, training),
        "memory_gib": m.memory_gib,  # the device peak: allocated + CUDA context, NCCL, userbuffers, allocator reserve
        "allocated_memory_gib": m.allocated_gib,  # what torch.cuda.max_memory_allocated measures
        "usable_gib": None if usable_bytes is None else usable_bytes / GIB,
        "headroom_gib": None if headroom is None else headroom / GIB,
        "memory": {k: v / GIB for k, v in m.memory.items()},
        # host memory per GPU of the offloaded activations (0 without offload), held to the host's (`check` too)
        "offload_host_gib": (m.extra.get("offload_host_bytes") or 0.0) / GIB,
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


def _print_rich(job, m, headroom: float, calibration=None, cal=None) -> None:
    from autotune.outputs.tables import breakdown_table, make_console

    console = make_console()
    gpu = job.cluster.gpu
    console.print(f"[bold]{job.model.name}[/bold] on {job.cluster.nodes} x {job.cluster.gpus_per_node} "
                  f"{gpu.name}, seq {job.training.seq_length}, GBS {job.training.global_batch_size}, "
                  f"{job.training.precision}{', Muon' if job.training.muon else ''}, release {job.training.release}")
    console.print(f"layout: {m.layout}", markup=False)
    from autotune.ui.commands import calibration_line

    console.print(calibration_line(calibration), markup=False, highlight=False)
    verdict = {"ok": "[green]feasible[/green]", "oom": "[red]out of memory[/red]",
               "invalid": "[red]invalid[/red]"}.get(m.status, m.status)
    console.print(f"verdict: {verdict}")
    if m.reason and m.status != "invalid":
        console.print(f"  {m.reason}", markup=False)
    for v in m.violations:
        console.print(f"  [red]x[/red] {v}")
    usable = (gpu.memory_bytes - headroom) / GIB
    if m.memory:
        console.print(f"[bold]memory per GPU[/bold]: peak allocated {m.allocated_gib:.1f} GiB; {m.memory_gib:.1f} GiB "
                      f"on the device with the allowance, of {usable:.1f} GiB usable ({gpu.memory_gib:.1f} GiB minus "
                      f"{headroom / GIB:.1f} GiB headroom)")
        console.print(breakdown_table("GiB", {k: v / GIB for k, v in m.memory.items()}, m.memory_bytes / GIB,
                                      ".2f", ".0%"))
        if m.layout.offload_layers:
            from autotune.cost.memory import offload_host_bytes

            host = offload_host_bytes(job, m.layout) / GIB
            have = (f"of the {gpu.host_memory_bytes / GIB:.0f} GiB per GPU the catalog gives" if gpu.host_memory_bytes
                    else "the catalog does not give this GPU's host memory: check the server's")
            console.print(f"activation offload: {m.layout.offload_layers} layers' saved activations wait in host "
                          f"memory, {host:.1f} GiB per GPU ({have})", markup=False, highlight=False)
    if m.time:
        low, high = m.extra.get("tokens_per_s_per_gpu_low"), m.extra.get("tokens_per_s_per_gpu_high")
        band = f" ({low:,.0f}-{high:,.0f})" if low and high else ""
        console.print(f"[bold]step time[/bold] {m.step_time_s:.3f} s: {m.tokens_per_s_per_gpu:,.0f}{band} tokens/s "
                      f"per GPU, {m.tflops_per_gpu:.0f} TFLOP/s per GPU, MFU {m.mfu:.1%} (of the "
                      f"{job.training.precision} dense peak)")
        note = _band_note(job, m.layout, cal)
        if note:
            console.print(f"  band: {note}", markup=False, highlight=False)
        console.print(breakdown_table("seconds", m.time, m.step_time_s, ".4f", ".1%"))
        from autotune.outputs.terms import bound_cell

        console.print(f"largest term beyond compute: {bound_cell(m)} of the step", markup=False, highlight=False)


def _band_note(job, layout, cal=None) -> str | None:
    """Why the tokens/s band is wider than the fitted one (`Calibration.unfitted`) and why the layout's CUDA graphs
    are timed as another setting (`Calibration.uncredited_graphs`), or None."""
    from autotune.cost.efficiency import DEFAULT_CALIBRATION

    cal = DEFAULT_CALIBRATION if cal is None else cal
    notes = (cal.unfitted(job.cluster.gpu, job.training.precision, job.model.is_moe),
             cal.uncredited_graphs(job.cluster.gpu, layout.cuda_graphs, layout.offload_layers > 0))
    return "; ".join(n for n in notes if n) or None


def run(args: argparse.Namespace) -> int:
    from autotune.cost.analytic import AnalyticBackend
    from autotune.cost.efficiency import DEFAULT_CALIBRATION
    from autotune.ui.commands import calibration_from_args, job_from_args, layout_from_args

    job = job_from_args(args)
    calibration = calibration_from_args(args)
    cal = DEFAULT_CALIBRATION if calibration is None else calibration.calibration(job.cluster.gpu)
    headroom = headroom_bytes(args, job)
    layout = layout_from_args(args, job)
    m = AnalyticBackend(headroom_bytes=headroom, calibration=cal).evaluate(job, layout)
    nearest = None
    if m.status != "ok":
        from autotune.tuning.verdicts import nearest_variant

        nearest = nearest_variant(job, layout, headroom, cal)
    if args.json:
        print(json.dumps({**estimate_object(m, usable_bytes=job.cluster.gpu.memory_bytes - headroom,
                                            headroom=headroom, training=job.training), "release": job.training.release,
                          "band_note": _band_note(job, layout, cal), "nearest": nearest,
                          "calibration": None if calibration is None else calibration.summary()}, indent=2))
    else:
        from autotune.outputs.tables import print_nearest

        _print_rich(job, m, headroom, calibration, cal)
        if m.status != "ok":
            print_nearest(nearest)
    return 0 if m.status == "ok" else 1
