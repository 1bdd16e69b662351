"""`python -m autotune [search] --model mixtral --nodes 4`: search the layouts and print the best.

Prints the ranked layouts (tokens/s per GPU, MFU, memory per GPU and headroom, what dominates the
step time), the Pareto front, and the winner as Megatron-Bridge overrides and Megatron-LM
arguments; `--json` prints one object instead. Every run writes a folder (docs/output-files.md).

Exit codes: 0 a layout was found; 1 no layout fits (the closest ones and what ruled them out are
printed); 2 bad input, or a result folder that cannot be used or written; 130 interrupted by Ctrl-C, 143 by
SIGTERM (what finished is printed and kept, with the command that resumes it).
Ray, Optuna and rich are imported inside `run`, so `--help` stays instant.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from search_spaces.units import GIB

__all__ = ["add_arguments", "run", "render", "explain_impossible", "memory_hints"]



def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("search")
    g.add_argument("--trials", type=int, default=64,
                   help="measured trials with a measuring backend (default 64); with the analytic backend the "
                        "whole space is scored and this many of its top layouts are kept in trials.csv, with the "
                        "Pareto front's and your --layouts beside them")
    g.add_argument("--strategy", default=None, metavar="NAME",
                   help="measured-stage strategy: guided (default: the analytic front corrected by the "
                        "measurements), tpe (Optuna), front (the analytic ranking), or module:Class")
    g.add_argument("--measured-stage", action="store_true",
                   help="run the measured stage on Ray Tune even with the analytic backend (its trials then carry "
                        "the model's figures; to watch them in the dashboard)")
    g.add_argument("--headroom-gib", type=float, default=None,
                   help="GPU memory kept free per GPU beyond the memory model's own allowance (CUDA context, "
                        "NCCL, the allocator's reserve); a layout above capacity minus this is infeasible. "
                        "Default: none kept, and the pick leaves the memory model's error (3.7%% of its peak) free "
                        "when some layout does; given, this is the margin (0: take the fastest that fits)")
    g.add_argument("--backend", choices=("auto", "analytic", "megatron"), default="auto",
                   help="analytic cost models, or megatron-core profiling jobs (default auto = analytic: real jobs "
                        "start only with --backend megatron, also where GPUs are visible)")
    g.add_argument("--output", metavar="DIR", default=None,
                   help="output folder, empty or new (default autotune_runs/<model>-<nodes>n-<time>-<random>)")
    g.add_argument("--force", action="store_true",
                   help="move a non-empty --output folder aside (to DIR.old-<time>) instead of refusing it")
    g.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    g.add_argument("--resume", metavar="DIR", default=None,
                   help="continue an interrupted search in DIR without rerunning finished trials")
    g.add_argument("--address", default=None,
                   help="run on an existing Ray cluster ('auto', HOST:PORT or ray://HOST:PORT); default: a local "
                        "Ray with every port on 127.0.0.1")
    g.add_argument("--layout", "--compare", dest="layouts", action="append", default=[], metavar="LAYOUT",
                   help="also evaluate this layout, e.g. a recipe's 'tp=2,pp=4,ep=8,sp=true' (repeatable)")
    g.add_argument("--no-baseline", dest="baseline", action="store_false",
                   help="do not add NVIDIA's published layout for this model, GPU and GPU count (default: added "
                        "under 'Your layouts', and measured first, when Bridge's performance tables have one)")
    g.add_argument("--exhaustive-threshold", type=int, default=None, metavar="N",
                   help="evaluate the whole feasible space when it has at most N layouts (default: the trial budget)")
    g.add_argument("--top", type=int, default=10, help="rows of the ranked table (default 10)")
    from autotune.ui.commands import add_calibration_argument

    add_calibration_argument(g)
    g.add_argument("--wide", action="store_true",
                   help="every column of the tables, however wide (default: the columns that fit COLUMNS)")
    g.add_argument("--tokens", metavar="N", default=None,
                   help="a token budget (1T, 300B, 2.5e12): the training time and GPU-hours of the pick; with a list "
                        "of --nodes or --gpu, per cluster in the what-if table")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--verbose", action="store_true", help="show Ray's and Optuna's own logs")
    from autotune.ui import dashboard

    dashboard.add_arguments(p)


def run(args: argparse.Namespace) -> int:
    from autotune.ui import dashboard

    _check_arguments(args)  # before --dashboard starts Ray
    with dashboard.session(args):  # --dashboard: Ray + dashboard on 127.0.0.1 first, wait for Enter after
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from autotune.outputs.progress import StatusLine

    with StatusLine(enabled=not (args.no_progress or args.json)) as status:
        return _search(args, status)


def _search(args: argparse.Namespace, status: Any) -> int:
    status.update("loading the cost models")
    from autotune.outputs.files import write_outputs
    from autotune.outputs.progress import progress_factory
    from autotune.tuning.driver import run_search
    from autotune.ui import dashboard
    from autotune.ui.commands import job_from_args

    _check_arguments(args)
    t0 = time.perf_counter()
    if _is_what_if(args):
        from autotune.ui.commands.whatif import run_what_if

        status.update("scoring each cluster's whole space with the cost models")
        return run_what_if(args, status)
    if args.model is None:
        if not args.resume:
            raise ValueError("--model is required (a catalog name or a config.json path), or --resume FOLDER.")
        _job_flags_from_folder(args)
    job = job_from_args(args)
    if args.backend == "megatron":
        from autotune.tuning.backends import trainer_entry

        if job.model.is_hybrid:
            trainer_entry("trainers.proxy", "refuse_hybrid")(job.model)
        trainer_entry("trainers.proxy", "refuse_muon")(job.training)
    from autotune.ui.commands import calibration_from_args
    from autotune.ui.commands.space import options_from_args

    calibration = calibration_from_args(args)
    headroom_bytes = None if args.headroom_gib is None else args.headroom_gib * GIB
    result = run_search(
        job, trials=args.trials, seed=args.seed, headroom_bytes=headroom_bytes, force=args.force,
        finish=lambda r: write_outputs(r, str(r.output_dir)),  # best.json, launch files, report: before `completed`
        # trials named in the Ray dashboard when Ray is already connected (--dashboard, --address)
        backend=dashboard.track_search(job, args.backend, headroom_bytes, args.trials, address=args.address,
                                       measured_stage=bool(args.measured_stage)),
        output_dir=args.output, resume=args.resume, compare=args.layouts, space_options=options_from_args(args),
        baseline=getattr(args, "baseline", True),
        exhaustive_threshold=args.exhaustive_threshold, address=args.address, verbose=args.verbose,
        progress=_after_status(status, progress_factory(False if (args.no_progress or args.json) else None)),
        status=status.update, strategy=args.strategy, measured_stage=args.measured_stage or None,
        calibration=calibration,
    )
    status.stop()
    dashboard.report_result(result)  # --dashboard with the analytic search: its records shown there too
    t_out = time.perf_counter()
    if args.json:
        from autotune.outputs.files import result_json

        payload = result_json(result, top=args.top)
        if result.best is None:
            payload["impossible"] = explain_impossible(result, as_text=False)
        print(json.dumps(payload, default=str))
    else:
        render(result, top=args.top, wide=args.wide)
    timings = result.stats.setdefault("timings", {})
    timings["output_s"] = time.perf_counter() - t_out
    timings["total_s"] = time.perf_counter() - t0
    if not args.json:
        print(_timing_line(timings), file=sys.stderr)
    if result.interrupted:
        by = result.stats.get("interrupted_by", "")
        print(f"autotune search: interrupted{' by SIGTERM' if by else ''}; {len(result.records)} finished trials kept "
              f"in {result.output_dir} (continue with --resume {result.output_dir})", file=sys.stderr)
        return 143 if by == "SIGTERM" else 130
    return 0 if result.best is not None else 1


def _is_what_if(args: argparse.Namespace) -> bool:
    """A list of --nodes or of --gpu: one table of the best layout per cluster (`autotune.ui.commands.whatif`)."""
    return isinstance(args.nodes, tuple) or (isinstance(args.gpu, str) and "," in args.gpu)


def _after_status(status: Any, factory: Any) -> Any:
    """The progress factory, ending the status line before the bar takes the terminal."""
    if factory is None:
        return None

    def make(**kwargs: Any) -> Any:
        status.stop()
        return factory(**kwargs)

    return make


def _check_arguments(args: argparse.Namespace) -> None:
    """The search verb's own numbers, before anything runs (ValueError: one line, exit code 2)."""
    import math

    if args.trials < 1:
        raise ValueError(f"--trials must be at least 1, but got {args.trials}.")
    if args.top < 1:
        raise ValueError(f"--top must be at least 1, but got {args.top}.")
    from autotune.tuning.driver import check_seed

    check_seed(args.seed)
    if args.exhaustive_threshold is not None and args.exhaustive_threshold < 0:
        raise ValueError(f"--exhaustive-threshold must be at least 0, but got {args.exhaustive_threshold}.")
    if args.headroom_gib is not None and not (math.isfinite(args.headroom_gib) and args.headroom_gib >= 0):
        raise ValueError(f"--headroom-gib must be a finite number >= 0, but got {args.headroom_gib}.")
    if args.resume and args.output:
        raise ValueError("give --output DIR for a new search or --resume DIR to continue one, not both.")
    if args.resume and args.force:
        raise ValueError("--force moves an --output folder aside; it has no meaning with --resume.")
    if args.address is not None:
        from search_spaces.ray_session import check_address

        check_address(args.address)
    if any(not text.strip() for text in args.layouts):
        raise ValueError("--layout needs a layout such as 'tp=2,pp=4,ep=8', but got an empty one.")
    if args.tokens is not None:
        from autotune.tuning.whatif import parse_tokens

        parse_tokens(args.tokens)
    if _is_what_if(args):
        for flag, given in (("--resume", args.resume), ("--output", args.output), ("--force", args.force),
                            ("--layout", args.layouts), ("--address", args.address),
                            ("--backend megatron", args.backend == "megatron"), ("--dashboard", args.dashboard),
                            ("--measured-stage", args.measured_stage)):
            if given:
                raise ValueError(f"{flag} is for one cluster; the what-if table (a list of --nodes or --gpu) "
                                 f"scores each cluster with the model and writes no folder (--json prints it): give "
                                 f"one --nodes and one --gpu with {flag}.")


def _job_flags_from_folder(args: argparse.Namespace) -> None:
    """`--resume FOLDER` without `--model`: the job flags come from the folder's search.json."""
    from pathlib import Path

    from autotune.tuning.results import read_meta
    from search_spaces.training import TRAINING_FIELDS

    if not Path(args.resume).is_dir():
        raise ValueError(f"--resume {args.resume}: no such folder; give the folder of an earlier search.")
    try:
        meta = read_meta(args.resume)
    except OSError as e:
        raise ValueError(f"cannot read the search in {args.resume!r}: {e}") from None
    if not meta:
        raise ValueError(f"{args.resume!r} holds no autotune search (no search.json); give --model and the job flags.")
    job = meta["job"]
    flags = ("model", "nodes", "gpus_per_node", "gpu", "intra_node", "inter_node", "seq_length",
             "global_batch_size", "precision")
    missing = [f for f in flags if f not in job]
    if missing or not isinstance(job.get("training") or {}, dict):
        raise ValueError(f"{Path(args.resume) / 'search.json'} is damaged: its job lacks {missing or ['training']}; "
                         f"give --model and the job flags.")
    for flag in flags:
        setattr(args, flag, job[flag])
    for flag, value in (job.get("training") or {}).items():  # the recipe's switches, as the search ran them
        if flag in TRAINING_FIELDS:
            setattr(args, flag, value)
    if args.backend == "auto" and meta.get("backend") in ("analytic", "megatron"):
        args.backend = meta["backend"]


def _timing_line(t: dict[str, float]) -> str:
    parts = [f"{name} {t[key]:.1f} s" for name, key in (("total", "total_s"), ("analytic", "analytic_s"),
                                                          ("ray start", "ray_start_s"), ("trials", "search_s"),
                                                          ("output", "output_s")) if key in t]
    return "time: " + ", ".join(parts)


def render(result: Any, *, top: int = 10, console: Any = None, wide: bool = False) -> None:
    """The ranked table, your layouts, the Pareto front and the winner's launch forms (stdout), fitted to the
    terminal width (`autotune.outputs.tables`), all read from `result.answer`; `wide` shows every column."""
    from autotune.outputs.tables import FLAGS_LEGEND, MARKS_LEGEND, make_console, pareto_table, ranked_table
    from autotune.outputs.terms import BOUND_NOTE

    console = console or make_console(wide=wide)
    width = console.width
    answer = result.answer
    j, c = result.job, result.job.cluster
    console.print(f"[bold]{j.model.name}[/] on {c.nodes} x {c.gpus_per_node} {c.gpu.name} "
                  f"({c.gpu.memory_gib:.0f} GiB; {result.capacity_bytes / GIB:.1f} GiB usable after "
                  f"{result.headroom_bytes / GIB:.1f} GiB headroom), seq {j.training.seq_length}, "
                  f"GBS {j.training.global_batch_size}, {j.training.precision}{', Muon' if j.training.muon else ''}, "
                  f"release {j.training.release}")
    _summary_line(console, result)
    if answer.pick is None:
        console.print(explain_impossible(result, as_text=True), markup=False, highlight=False)
        _yours_lines(console, answer)
        return
    moe = j.model.moe is not None
    ranked = list(answer.ranked[:top])
    pick = answer.decision.pick
    title = (f"Best layouts (of {result.space_size:,} scored)" if result.mode == "analytic"
             else f"Best layouts by the model, of the {len(ranked)} the CPU proxy ran" if answer.cpu_proxy
             else f"Best layouts (of {len(result.records)} trials)")
    console.print(ranked_table(ranked, moe=moe, width=width, wide=wide, title=title, tied=answer.decision.tied_layouts,
                               pick=pick, risky={str(r.layout) for r in ranked if answer.inside_error(r)}))
    console.print(f"{FLAGS_LEGEND}; {MARKS_LEGEND}; {BOUND_NOTE}", markup=False, highlight=False, style="dim")
    _decision_lines(console, result)
    if answer.cpu_proxy or any(r.measurement.source == "megatron-cpu-proxy" for r in answer.records):
        console.print("CPU proxy: these layouts ran as a scaled-down model with the same parallel structure on gloo; "
                      "that shows they build and train, not how fast they run on GPUs. The figures, the pick and "
                      "the launch lines are the analytic model's for the real job on this cluster.",
                      markup=False, highlight=False)
    _yours_lines(console, answer)
    front = list(answer.pareto)
    shown = front if wide or len(front) <= 2 * top else [front[0], *_spaced(front[1:], 2 * top - 1)]
    table = pareto_table(shown, moe=moe, width=width, wide=wide, pick=pick)
    if len(shown) < len(front):
        table.title = (f"{table.title}: the pick, then {len(shown) - 1} of its other {len(front) - 1} layouts, "
                       f"fastest first (--wide: all)")
    console.print(table)
    from autotune.outputs.files import launch_of
    from autotune.outputs.launch import launch_header

    launch = launch_of(result)
    best = answer.pick.layout
    console.print("[bold]Winner[/] " + str(best))
    for form in ("megatron_bridge", "megatron_lm"):
        console.print(launch_header(j, form, best) + ":", markup=False, highlight=False)
        console.print(launch[form], markup=False, highlight=False, soft_wrap=True)  # one line: paste-able
    console.print(f"Results: {result.output_dir} (trials.csv, best.json, report.html, study.db)", markup=False,
                  highlight=False, soft_wrap=True)


def _spaced(rows: list[Any], n: int) -> list[Any]:
    """n of `rows`, evenly spaced, the first and the last among them."""
    if n <= 1:
        return rows[:n]
    return [rows[round(k * (len(rows) - 1) / (n - 1))] for k in range(n)]


def _yours_lines(console: Any, answer: Any) -> None:
    """"Your layouts": each --layout's verdict (fits or not and by what, tokens/s, change vs the pick, rank)."""
    from autotune.outputs.tables import paragraph, verdict_text

    if not answer.yours:
        return
    console.print("[bold]Your layouts[/]")
    for v in answer.yours:
        style = "" if v.fits else "yellow"
        paragraph(console, f"  {v.layout}: {verdict_text(v)}", style=style or None)


def _summary_line(console: Any, result: Any) -> None:
    s = result.stats
    feasible = sum(r.feasible for r in result.records)
    analytic = s.get("analytic", {})
    if result.mode == "analytic":
        seconds = s.get("timings", {}).get("analytic_s", 0.0)
        what = (f"scored all {result.space_size:,} valid layouts with the cost models in {seconds:.1f} s "
                f"({analytic.get('fits', feasible):,} fit in memory); backend analytic, no profiling; trials.csv "
                f"keeps {len(result.records):,}: the top --trials, the Pareto-optimal ones and your --layouts")
    elif result.mode == "exhaustive":
        what = (f"the feasible space is small ({result.space_size} layouts): measured whole; {feasible} fit in "
                f"memory; backend {result.backend}")
    else:
        rungs = s.get("rungs") or []
        halving = f", successive halving on {'/'.join(map(str, rungs))} timed steps" if len(rungs) > 1 else ""
        what = (f"measured {len(result.records)} of {result.space_size:,} valid layouts on Ray Tune (strategy "
                f"{s.get('strategy', 'guided')}: the analytic front corrected by the measurements{halving}); "
                f"{feasible} fit in memory; backend {result.backend}, seed {result.seed}")
    console.print(what, markup=False, highlight=False)
    c = s.get("calibration")
    if isinstance(c, dict):
        from autotune.cost.calibration_file import describe_summary

        console.print(f"calibration: {describe_summary(c)}", markup=False, highlight=False)
    learned = s.get("measured_calibration")
    if isinstance(learned, dict):
        text = (f"learned from this search's GPU trials: {learned['describe']}; the next search starts calibrated "
                f"with --calibration {learned['file']}" if learned.get("file") else learned.get("reason", ""))
        console.print(text, markup=False, highlight=False)


def _decision_lines(console: Any, result: Any) -> None:
    """How sure the pick is and why; the memory-margin and pipeline-batch warnings."""
    from autotune.outputs.tables import paragraph
    from autotune.tuning.decision import PROXY

    d = result.answer.decision
    if d.sentence:
        paragraph(console, d.sentence)
    if d.overruled:
        what = ("the GPU measurements overrule it" if d.stage == "measured" else
                "it failed on the CPU proxy" if d.basis == PROXY else "it failed when measured")
        paragraph(console, f"The model's own pick was {d.overruled}; {what}.")
    for warning in d.warnings:
        paragraph(console, "Warning: " + warning + ".", style="yellow")


def explain_impossible(result: Any, *, as_text: bool = True) -> Any:
    """Why nothing fits: the layouts closest to fitting and what ruled each out, plus what to try (the hints
    follow the largest memory term of the closest misses)."""
    cap = result.capacity_bytes / GIB
    if result.space_size == 0:
        from search_spaces.space_report import rejections

        report = rejections(result.job)
        top = sorted(report.rejected_by.items(), key=lambda kv: -kv[1])[:5]
        data: dict[str, Any] = {"reason": "no valid layout exists for this job", "rejected_by": dict(top),
                                "try": _space_hints(result)}
    else:
        rows = [{"layout": str(r.layout), "memory_gib": r.measurement.memory_gib,
                 "over_by_gib": (r.measurement.memory_bytes or 0.0) / GIB - cap,
                 "largest_memory_term": r.measurement.extra.get("dominant_memory") or _largest(r.measurement.memory),
                 "reason": r.measurement.reason or r.measurement.status} for r in result.closest_misses(5)]
        data = {"reason": f"no layout fits in {cap:.1f} GiB per GPU (GPU memory minus headroom)",
                "closest": rows, "try": memory_hints(result, [row["largest_memory_term"] for row in rows])}
    if not as_text:
        return data
    lines = [data["reason"][0].upper() + data["reason"][1:] + "."]
    lines += [f"  ruled out by {rule}: {n} candidates" for rule, n in data.get("rejected_by", {}).items()]
    if data.get("closest"):
        lines.append("Closest to fitting:")
    for row in data.get("closest", []):
        if row["over_by_gib"] <= 0:  # the device fits: its offload overflows the host (`memory.memory_status`)
            lines.append(f"  {row['layout']}: {row['memory_gib']:.1f} GiB; {row['reason']}")
            continue
        lines.append(f"  {row['layout']}: {row['memory_gib']:.1f} GiB, {row['over_by_gib']:.1f} GiB over "
                     f"(largest term: {row['largest_memory_term']})")
    lines.append("Try: " + "; ".join(data["try"]) + ".")
    return "\n".join(lines)


# What shrinks each memory term of `autotune.cost.memory.TERMS`, as flags a user can change.
_TERM_HINTS = {
    "activations": "fewer saved activations: a shorter --seq-length, a smaller --global-batch-size, or more "
                   "--recompute-modules (e.g. core_attn,mlp)",
    "optimizer": "a smaller optimizer state per GPU: more GPUs to shard it over (--nodes), or Adam's moments in "
                 "bf16 (--optimizer-moments bf16)",
    "weights": "more GPUs to spread the weights over (--nodes), or GPUs with more memory (--gpu)",
    "gradients": "more GPUs to spread the gradients over (--nodes)",
    "overhead": "a smaller --headroom-gib",
}


def memory_hints(result: Any, terms: list[str]) -> list[str]:
    """What to try, the largest term of the closest misses first, then the general moves."""
    hints = []
    for term in sorted(set(terms), key=lambda t: -terms.count(t)):
        if term in _TERM_HINTS and _TERM_HINTS[term] not in hints:
            hints.append(_TERM_HINTS[term])
    if "gradients" in terms and result.job.training.grad_reduce_in_fp32:
        hints.append("bf16 gradients (--no-grad-reduce-in-fp32)")
    general = ["add nodes (--nodes) or use GPUs with more memory (--gpu)"]
    closest = result.closest_misses(1)
    over = (closest[0].measurement.memory_bytes or 0.0) - result.capacity_bytes if closest else 0.0
    if 0 < over <= result.headroom_bytes:  # the nearest miss would fit in the GPU's whole memory
        hints = [h for h in hints if h != _TERM_HINTS["overhead"]]  # said below, with the figures
        general.append(f"a smaller --headroom-gib (now {result.headroom_bytes / GIB:.1f} GiB; the closest layout is "
                       f"{over / GIB:.1f} GiB over)")
    return hints + [h for h in general if h not in hints] + _space_hints(result)[1:]


def _space_hints(result: Any) -> list[str]:
    return ["a cluster shape the model divides into (--nodes, --gpus-per-node) or another --global-batch-size",
            "allow TP across nodes (--cross-node-tp)"]


def _largest(memory: dict[str, float]) -> str:
    return max(memory, key=memory.get) if memory else "-"  # type: ignore[arg-type]
