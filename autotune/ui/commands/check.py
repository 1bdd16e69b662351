"""`python -m autotune check --model mixtral --nodes 4 --layout "tp=2,pp=2,ep=8"`: one layout vs every rule.

Says valid (with the derived DP, expert DP, experts per GPU and micro-batches), or lists every
violation with megatron-core's message and exits with code 1; a deliberate refusal (megatron-core would
accept the layout) is marked so. Both name the megatron-core release the verdict is for (`--megatron-core`,
default the installed one; `search_spaces.megatron_version`). A valid layout's peak memory is said beside it, against
the GPU's memory
minus the search's headroom (0 unless --headroom-gib; `estimate` has the breakdown). Exit code 0 when the layout is
valid and fits, 1 when it breaks a rule or does not fit in memory; then the nearest layout of the search space that
fits is suggested (`autotune.tuning.verdicts.nearest_variant`: the fewest fields changed). With --json one object:
valid, layout (megatron-core names plus dp and expert_dp, and `pipeline_model_parallel_layout`), stage_layers,
violations [{rule, fields, message, stricter}], notes, megatron_core {megatron_core_installed, megatron_core_rules,
note}, memory_gib, usable_gib, fits_in_memory, nearest (layout, changes, tokens_per_s_per_gpu, memory_gib, free_gib;
null when the layout fits or nothing does).
"""

from __future__ import annotations

import argparse
import json

from autotune.ui.commands import add_calibration_argument, add_layout_argument
from autotune.ui.commands.estimate import add_headroom_argument, headroom_bytes
from search_spaces.megatron_names import megatron_settings
from search_spaces.units import GIB

__all__ = ["add_arguments", "run", "check_object", "notes", "megatron_fields"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_layout_argument(parser)
    add_headroom_argument(parser)
    add_calibration_argument(parser)


def stage_layers_text(layout, num_layers: int) -> str:
    """Transformer layers per pipeline stage, runs compressed: `3, 4 x 14, 2` (DeepSeek-V3 on PP 16)."""
    runs: list[list[int]] = []
    for count in layout.stage_layer_counts(num_layers):
        if runs and runs[-1][0] == count:
            runs[-1][1] += 1
        else:
            runs.append([count, 1])
    return ", ".join(str(c) if n == 1 else f"{c} x {n}" for c, n in runs)


def notes(job, layout) -> list[str]:
    """Facts worth saying about a layout that are not violations (search-space choices, derived sizes)."""
    out = []
    gpn = job.cluster.gpus_per_node
    if gpn % layout.tp:
        out.append(f"TP={layout.tp} spans nodes ({gpn} GPUs per node): valid, but outside the default search space.")
    if job.model.is_moe and gpn % (layout.ep * layout.expert_tp):
        out.append(f"EP*ETP={layout.ep * layout.expert_tp} spans nodes ({gpn} GPUs per node): valid, but outside "
                   "the default search space.")
    return out


def megatron_fields(layout, training=None) -> dict[str, object]:
    """`megatron_names.megatron_settings(layout, training)` plus the layout string under megatron-core's name (when
    the mapping lacks it)."""
    out = megatron_settings(layout, training)
    out.setdefault("pipeline_model_parallel_layout", layout.pipeline_layout)
    return out


def check_object(job, layout, violations, memory: dict[str, object] | None = None) -> dict[str, object]:
    from search_spaces.megatron_version import version_info

    return {
        "valid": not violations,
        "layout": megatron_fields(layout, job.training),
        "stage_layers": list(layout.stage_layer_counts(job.model.num_layers)),
        "violations": [{"rule": v.rule, "fields": dict(v.fields), "message": v.message, "stricter": v.stricter}
                       for v in violations],
        "notes": notes(job, layout),
        "megatron_core": version_info(job.training.megatron_core),
        **(memory or {"memory_gib": None, "usable_gib": None, "fits_in_memory": None, "host_gib": None,
                     "reason": None}),
    }


def memory_fit(job, layout, headroom: float) -> dict[str, object]:
    """The analytic peak memory per GPU against the GPU's memory minus the headroom, and the offloaded activations
    against the host memory per GPU (`memory.memory_status`, the search's rule; a valid layout only)."""
    from autotune.cost.memory import memory_status, offload_host_bytes
    from autotune.cost.score import estimate_memory

    memory = estimate_memory(job, layout)
    peak, host = memory.total_bytes, offload_host_bytes(job, layout)
    usable = job.cluster.gpu.memory_bytes - headroom
    status, reason = memory_status(job, peak, usable, host, memory.dominant)
    return {"memory_gib": peak / GIB, "usable_gib": usable / GIB, "fits_in_memory": status == "ok",
            "host_gib": host / GIB, "reason": reason}


def run(args: argparse.Namespace) -> int:
    from autotune.ui.commands import calibration_from_args, job_from_args, layout_from_args
    from search_spaces.rules import check

    job = job_from_args(args)
    calibration = calibration_from_args(args)  # the nearest variant's tokens/s: the one figure check predicts
    cal = None if calibration is None else calibration.calibration(job.cluster.gpu)
    headroom = headroom_bytes(args, job)
    layout = layout_from_args(args, job)
    violations = check(job, layout)
    memory = None if violations else memory_fit(job, layout, headroom)
    good = not violations and bool(memory and memory["fits_in_memory"])
    nearest = None
    if not good:
        from autotune.tuning.verdicts import nearest_variant

        nearest = nearest_variant(job, layout, headroom, cal)
    if args.json:
        print(json.dumps({**check_object(job, layout, violations, memory), "nearest": nearest,
                          "calibration": None if calibration is None else calibration.summary()}, default=str))
        return 0 if good else 1
    _print_rich(job, layout, violations, memory)
    if not good:
        if calibration is not None:
            from autotune.ui.commands import calibration_line

            print(calibration_line(calibration))
        from autotune.outputs.tables import print_nearest

        print_nearest(nearest)
    return 0 if good else 1


def _print_rich(job, layout, violations, memory: dict[str, object] | None) -> None:
    from rich.markup import escape

    from autotune.outputs.tables import make_console
    from search_spaces.megatron_version import version_line

    console = make_console()
    console.print(f"[bold]{job.model.name}[/bold] on {job.cluster.nodes} x {job.cluster.gpus_per_node} "
                  f"({job.world_size} GPUs), seq {job.training.seq_length}, GBS {job.training.global_batch_size}")
    console.print(f"layout: {escape(str(layout))}")
    console.print(escape(version_line(job.training.megatron_core)))
    release = f"in megatron-core {job.training.megatron_core}"
    if violations:
        console.print(f"[red]invalid[/red] {release}: {len(violations)} violation{'s' if len(violations) > 1 else ''}")
        for v in violations:
            kind = " (stricter than megatron-core)" if v.stricter else ""
            console.print(f"  [red]x[/red] [bold]{v.rule}[/bold]{kind}: {escape(v.message)}")
    else:
        facts = [f"DP {layout.dp}"]
        if job.model.moe is not None:
            facts.append(f"expert DP {layout.expert_dp}")
            per_gpu = job.model.moe.num_experts // layout.ep
            facts.append(f"{per_gpu} expert{'s' if per_gpu != 1 else ''} per GPU")
        facts.append(f"{layout.num_microbatches(job.training.global_batch_size)} micro-batches per step")
        if layout.pp > 1:
            facts.append(f"layers per stage {stage_layers_text(layout, job.model.num_layers)}")
        console.print(f"[green]valid[/green] {release}: {', '.join(facts)}")
        if memory is not None:
            on_device = float(memory["memory_gib"]) <= float(memory["usable_gib"])  # type: ignore[arg-type]
            device = "fits" if on_device else "[red]does not fit[/red]"
            console.print(f"memory: peak {memory['memory_gib']:.1f} GiB per GPU, {device} in "
                          f"{memory['usable_gib']:.1f} GiB usable (GPU memory minus headroom; `estimate` for the "
                          f"breakdown)")
            if not memory["fits_in_memory"] and on_device:
                console.print(f"[red]does not fit[/red]: {escape(str(memory['reason']))}")
    for note in notes(job, layout):
        console.print(f"  note: {escape(note)}")
