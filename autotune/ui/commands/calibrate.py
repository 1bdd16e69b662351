"""`python -m autotune calibrate --log run.log --model llama3-70b --nodes 8 --output my-cluster.yaml`: fit the
throughput model's compute, network and host factors to your own training logs.

Each `--log` is a Megatron-LM or Megatron-Bridge stdout log (`autotune/tuning/training_log.py`); its steady step time
is the median of its iteration lines, warm-up and outliers left out. The job and layout each log ran come from its
arguments block (Megatron-LM) or configuration summary (Megatron-Bridge's non-default values) where it prints one,
else from the flags `estimate` takes (`--model`, `--nodes`,
`--gpu`, `--layout`, `--seq-length`, ...; `--layout` once for every log or once per log, in order); a flag the block
contradicts (another model's log, another layout) is refused. The fit (`autotune/tuning/calibrate.py`) is bounded and
MAP: with fewer logs than factors the prior picks the smallest move that explains them. It prints each log's
error before and after and the factors it moved, and writes the calibration file (`--output`) every verb reads with
`--calibration FILE`. A log that cannot calibrate is one line on stderr and exit code 2.

`calibrate --profile --model deepseek-v3 --nodes 128 --output cluster.yaml` needs no log: it profiles the model's
best candidates for the target cluster (`--top K` of the analytic ranking, or the `--layout`s given) on the GPUs at
hand, one node per candidate (each rank's exact shape: one pipeline stage's layers with the layout's TP, CP and local
experts), times the cluster's collectives, and fits the same factors
(`autotune/tuning/measured_calibration.py`). Without GPUs the same path runs on the CPU proxy and the file is marked
`source: megatron-cpu-proxy` (no verb applies it).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

from search_spaces.layout import CUDA_GRAPH_CHOICES
from search_spaces.units import GIB

__all__ = ["add_arguments", "run"]


# Megatron-LM's argument names (its arguments block) -> our layout fields
LAYOUT_ARGS = {"tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp",
               "virtual_pipeline_model_parallel_size": "vpp", "context_parallel_size": "cp",
               "expert_model_parallel_size": "ep", "expert_tensor_parallel_size": "etp", "micro_batch_size": "mbs",
               "sequence_parallel": "sp", "use_distributed_optimizer": "dist_opt"}
MODEL_ARGS = ("num_layers", "hidden_size", "num_attention_heads")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log", action="append", default=None, metavar="FILE",
                        help="a Megatron-LM or Megatron-Bridge training log (stdout); repeat for several runs")
    parser.add_argument("--profile", action="store_true",
                        help="no log: profile the best candidates for the target cluster on the GPUs at hand (one "
                             "node each, the exact per-rank shapes) and time the collectives, then fit (CPU proxy "
                             "without GPUs)")
    parser.add_argument("--top", type=int, default=3, metavar="K",
                        help="--profile: how many of the analytic ranking's best layouts to profile (default 3; "
                             "--layout instead names them)")
    parser.add_argument("--max-workers", type=int, default=None, metavar="N",
                        help="--profile: ranks at most (default: the cluster's GPUs, or what this machine holds)")
    parser.add_argument("--layout", action="append", default=None, metavar="LAYOUT",
                        help="the layout the log ran, as `estimate` takes it (once for every log, or once per --log in "
                             "order); default: the log's arguments block")
    parser.add_argument("--output", default=None, metavar="YAML",
                        help="write the calibration file here (default: print the fit, write nothing)")
    # unset: the log's arguments block says, else the defaults every verb has
    parser.set_defaults(seq_length=None, global_batch_size=None, precision=None)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Logged:
    log: Any  # TrainingLog
    job: Any  # Job
    layout: Any  # Layout
    step_time_s: float
    lines: int  # iteration lines the median is of
    warnings: tuple[str, ...] = ()  # what was assumed, what the log's throughput says (`_throughput_notes`)


def _value(text: str | None) -> Any:
    """An arguments-block value: None, a bool, an int, a float or the text."""
    if text is None or text == "None":
        return None
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _disagree(path: str, what: str, logged: Any, given: Any, flag: str, where: str = "arguments block") -> ValueError:
    return ValueError(f"--log {path}: its {where} says {what} {logged}, but {flag} says {given}: the log is "
                      f"of another run; give the flags of the run that wrote it.")


def _job_args(args: argparse.Namespace, log: Any) -> tuple[argparse.Namespace, tuple[str, ...]]:
    """`args` with the job settings the log's arguments block gives filled in (and checked against the flags), and
    the settings neither says, taken at their defaults (as the flags that set them: `--seq-length 4096`)."""
    from autotune.ui.request import DEFAULT_GLOBAL_BATCH_SIZE, DEFAULT_SEQ_LENGTH

    out = argparse.Namespace(**vars(args))
    assumed: list[str] = []
    for name, default in (("seq_length", DEFAULT_SEQ_LENGTH), ("global_batch_size", DEFAULT_GLOBAL_BATCH_SIZE)):
        logged = _value(log.argument(name))
        if name == "global_batch_size" and logged is None:
            logged = log.global_batch_size
        given = getattr(args, name)
        if given is not None and logged is not None and logged != given:
            raise _disagree(log.path, name, logged, given, f"--{name.replace('_', '-')}")
        setattr(out, name, given if given is not None else logged if logged is not None else default)
        if given is None and logged is None:
            assumed.append(f"--{name.replace('_', '-')} {default}")
    fp8, fp4 = log.argument("fp8"), log.argument("fp4")  # Megatron-LM's --fp8-format / --fp4-format, Bridge's too
    logged_precision = None if fp8 is None else "bf16" if _value(fp8) is None else "fp8"
    if fp4 is not None and _value(fp4) is not None:
        logged_precision = "fp4"
    if args.precision is not None and logged_precision is not None and args.precision != logged_precision:
        raise _disagree(log.path, "fp4" if logged_precision == "fp4" else "fp8",
                        fp4 if logged_precision == "fp4" else fp8, args.precision, "--precision")
    out.precision = args.precision or logged_precision or "bf16"
    if args.precision is None and logged_precision is None:
        assumed.append("--precision bf16")
    if out.precision == "fp8" and args.fp8_recipe is None and _value(log.argument("fp8_recipe")) is not None:
        out.fp8_recipe = log.argument("fp8_recipe")
    world = _value(log.argument("world_size")) or log.world_size
    if isinstance(world, int) and args.nodes is None and args.cluster is None:
        gpn = args.gpus_per_node or 8
        if world % gpn:
            raise ValueError(f"--log {log.path}: its world size {world} is not a whole number of {gpn}-GPU nodes; "
                             f"give --nodes and --gpus-per-node.")
        out.nodes, out.gpus_per_node = world // gpn, gpn
    elif args.nodes is None and args.cluster is None:
        assumed.append("--nodes 1")
    return out, tuple(assumed)


def _layout_text(log: Any) -> str | None:
    """The log's layout as `parse_layout` text, from its arguments block (None without one)."""
    items = []
    values = {name: _value(log.argument(arg)) for arg, name in LAYOUT_ARGS.items()}
    if values["etp"] == values["tp"]:
        values["etp"] = None  # megatron-core's default (ETP = TP), which a dense model's layout leaves unset
    for name, v in values.items():
        if v is not None:
            items.append(f"{name}={str(v).lower()}")
    granularity = _value(log.argument("recompute_granularity"))
    if granularity is not None:
        items.append(f"recompute={granularity}")
    graphs = _graphs(log)
    if graphs is not None:
        items.append(f"cuda_graphs={graphs}")
    return ",".join(items) or None


def _graphs(log: Any) -> str | None:
    """The log's CUDA graphs as `Layout.cuda_graphs` (None when its arguments block does not say): megatron-core
    0.19's `cuda_graph_impl`; 0.16's `local` with the scope `full_iteration` is full-iteration graphs, and its
    older `enable_cuda_graph` megatron-core's own per-layer ones (`megatron_names`)."""
    impl = _value(log.argument("cuda_graph_impl"))
    scope = str(log.argument("cuda_graph_scope") or log.argument("cuda_graph_modules") or "")
    if impl == "local" and "full_iteration" in scope:
        return "full_iteration"
    if impl in CUDA_GRAPH_CHOICES:
        return str(impl)
    if _value(log.argument("enable_cuda_graph")) is True:
        return "local"
    return None


def _check_against_log(log: Any, job: Any, layout: Any) -> None:
    """Refuse a log whose arguments block describes another model, cluster or layout than the flags."""
    for name in MODEL_ARGS:
        logged = _value(log.argument(name))
        if logged is not None and logged != getattr(job.model, name):
            raise ValueError(f"--log {log.path}: its arguments block says {name} {logged}, but --model "
                             f"{job.model.name} has {getattr(job.model, name)}: the log is of another model.")
    experts = _value(log.argument("num_experts"))
    ours = job.model.moe.num_experts if job.model.moe is not None else None
    if log.argument("num_experts") is not None and experts != ours:
        raise ValueError(f"--log {log.path}: its arguments block says num_experts {experts}, but --model "
                         f"{job.model.name} has {ours}: the log is of another model.")
    world = _value(log.argument("world_size"))
    where = "arguments block"
    if world is None:
        world, where = log.world_size, "`using world size` line"
    if isinstance(world, int) and world != job.world_size:
        raise _disagree(log.path, "world_size", world, job.world_size, "--nodes x --gpus-per-node", where)
    if log.context_parallel_size is not None and log.context_parallel_size != layout.cp:
        raise _disagree(log.path, "context-parallel size", log.context_parallel_size, layout.cp, "--layout",
                        "`using world size` line")
    for arg, name in LAYOUT_ARGS.items():
        logged = _value(log.argument(arg))
        mine = layout.expert_tp if name == "etp" else getattr(layout, name)
        if logged is not None and logged != mine:
            raise _disagree(log.path, arg, logged, mine, "--layout")


def _logged_runs(args: argparse.Namespace) -> list[_Logged]:
    from autotune.tuning.training_log import read_log, steady_step_s
    from autotune.ui.commands import job_from_args, layout_from_args
    from search_spaces.rules import check

    layouts = args.layout or []
    if len(layouts) not in (0, 1, len(args.log)):
        raise ValueError(f"give --layout once (for every log) or once per --log ({len(args.log)}), not "
                         f"{len(layouts)} times.")
    out = []
    for i, path in enumerate(args.log):
        log = read_log(path)
        job_args, assumed = _job_args(args, log)
        job = job_from_args(job_args)
        text = layouts[i] if len(layouts) > 1 else layouts[0] if layouts else _layout_text(log)
        if text is None:
            raise ValueError(f"--log {path}: it prints no arguments block, so give the layout it ran with --layout.")
        job_args.layout = text
        layout = layout_from_args(job_args, job)
        _check_against_log(log, job, layout)
        broken = check(job, layout)
        if broken:
            raise ValueError(f"--log {path}: layout {layout} breaks {broken[0].rule}: {broken[0].message}")
        step, lines = steady_step_s(log)
        notes = _throughput_notes(log, job, step, assumed)
        if lines == 1:
            notes.append(f"{path}: its step time is one iteration line (after the warm-up); a fit from one "
                         f"iteration is noisy: log more of them (--log-interval 1, at least 20 iterations)")
        out.append(_Logged(log=log, job=job, layout=layout, step_time_s=step, lines=lines, warnings=tuple(notes)))
    return out


THROUGHPUT_TOLERANCE = 0.15  # logged TFLOP/s vs ours: Megatron-LM versions count causal attention differently
SEQ_LENGTHS = tuple(1 << k for k in range(10, 18))  # 1,024 .. 131,072: what a log's throughput is tried against


def _throughput_notes(log: Any, job: Any, step_s: float, assumed: tuple[str, ...]) -> list[str]:
    """The job against the step time and what the log says it achieved (Megatron-LM's logged TFLOP/s per GPU is
    `num_floating_point_operations(args, GBS) / (step x 1e12 x world size)`, `training.py::training_log`; ours is
    the same formula, `autotune.cost.flops.model_flops_per_step`). Refuses a job whose step would beat the GPU's
    peak, or a logged figure that contradicts a job partly assumed at defaults (naming the sequence length that
    fits it); warns of what was assumed. Returns the warnings."""
    import statistics
    from dataclasses import replace

    from autotune.cost.flops import model_flops_per_step

    def implied_at(training: Any) -> float:  # the TFLOP/s per GPU Megatron-LM would log for this job at that step
        return model_flops_per_step(job.model, training) / (step_s * 1e12 * job.world_size)

    t, gpu = job.training, job.cluster.gpu
    implied = implied_at(t)
    peak = gpu.peak_flops(t.precision) / 1e12
    said = (f"{log.path}: the log does not say {', '.join(a.split()[0] for a in assumed)}; assumed "
            f"{', '.join(assumed)}")
    what = (f"{job.model.name} on {job.world_size} {gpu.name}, seq {t.seq_length}, GBS {t.global_batch_size}, "
            f"{t.precision}" + (f" (assumed: {', '.join(assumed)})" if assumed else ""))
    if implied > peak:
        raise ValueError(f"--log {log.path}: its {step_s:.4g} s step would be {implied:,.0f} TFLOP/s per GPU for "
                         f"{what}, above the {gpu.name}'s {peak:,.0f} TFLOP/s {t.precision} peak: the log ran "
                         f"another job; give the run's flags.")
    if not log.tflops_per_gpu:
        return [f"{said}, and it logs no throughput to check that by (Megatron-LM --log-throughput): give the run's "
                f"flags if it differed"] if assumed else []
    logged = statistics.median(log.tflops_per_gpu)
    if logged > peak * (1 + THROUGHPUT_TOLERANCE):
        raise ValueError(f"--log {log.path}: it logs {logged:,.0f} TFLOP/s per GPU, above the {gpu.name}'s "
                         f"{peak:,.0f} TFLOP/s {t.precision} peak: the log is of another GPU or precision; give "
                         f"the run's --gpu and --precision.")
    if abs(logged / implied - 1) <= THROUGHPUT_TOLERANCE:
        return [f"{said} (its logged {logged:,.0f} TFLOP/s per GPU agrees)"] if assumed else []
    text = (f"--log {log.path}: it logs {logged:,.0f} TFLOP/s per GPU, but {what} at its {step_s:.4g} s step is "
            f"{implied:,.0f} (Megatron-LM's num_floating_point_operations)")
    if any(a.startswith("--seq-length ") for a in assumed):
        fits = [s for s in SEQ_LENGTHS
                if abs(logged / implied_at(replace(t, seq_length=s)) - 1) <= THROUGHPUT_TOLERANCE]
        if fits:
            text += f"; its throughput fits --seq-length {' or '.join(map(str, fits))}"
    if assumed:
        raise ValueError(text + ": the log ran another job; give the run's flags.")
    return [text[len("--log "):] + ": Megatron counted this model's FLOPs otherwise, or the log is of another run"]


def _provenance(logged: list[_Logged], fit: Any) -> dict[str, Any]:
    import datetime

    import autotune

    logs = []
    for r, before, after in zip(logged, fit.before, fit.after, strict=True):
        t = r.job.training
        logs.append({"path": r.log.path, "model": r.job.model.name, "gpu": r.job.cluster.gpu.name,
                     "nodes": r.job.cluster.nodes, "gpus_per_node": r.job.cluster.gpus_per_node,
                     "layout": str(r.layout), "seq_length": t.seq_length, "global_batch_size": t.global_batch_size,
                     "precision": t.precision, "release": t.release, "iteration_lines": r.lines,
                     "step_time_s": round(r.step_time_s, 6), "predicted_before_s": round(before, 6),
                     "predicted_after_s": round(after, 6), "error_before": round(before / r.step_time_s - 1, 5),
                     "error_after": round(after / r.step_time_s - 1, 5),
                     "logged_tflops_per_gpu": (sorted(r.log.tflops_per_gpu)[len(r.log.tflops_per_gpu) // 2]
                                               if r.log.tflops_per_gpu else None),
                     "logged_max_allocated_gib": (None if r.log.max_allocated_mb is None
                                                  else round(r.log.max_allocated_mb * 2**20 / GIB, 3)),
                     "warnings": list(r.warnings)})
    return {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "autotune_version": autotune.__version__, "relative_to": "DEFAULT_CALIBRATION of that version",
            "bounds": {n: [round(lo, 4), round(hi, 4)] for n, lo, hi in fit.bounds}, "logs": logs}


def _tokens(job: Any, step_s: float) -> float:
    t = job.training
    return t.global_batch_size * t.seq_length / step_s / job.world_size


def run(args: argparse.Namespace) -> int:
    from autotune.cost.calibration_file import FACTORS, CalibrationFile, write_calibration
    from autotune.cost.score import estimate_memory
    from autotune.tuning.calibrate import Run, fit_factors

    if args.profile:
        if args.log:
            raise ValueError("give --log FILE (calibrate from your logs) or --profile (profile the GPUs at hand), "
                             "not both.")
        return _run_profile(args)
    if not args.log:
        raise ValueError("calibrate needs --log FILE (a training log of your cluster) or --profile (profile the GPUs "
                         "at hand).")
    logged = _logged_runs(args)
    fit = fit_factors([Run(job=r.job, layout=r.layout, step_time_s=r.step_time_s, label=r.log.path)
                       for r in logged])
    cal = CalibrationFile(gpu_arch=fit.arch, factors=fit.factors, at_bound=fit.at_bound, precisions=fit.precisions,
                          graphs=fit.graphs,
                          provenance=_provenance(logged, fit), path=args.output or "")
    if args.output:
        write_calibration(args.output, cal)
    if args.json:
        print(json.dumps({"calibration": cal.summary(), "provenance": cal.provenance, "written": bool(args.output)},
                         indent=2))
        return 0
    measured = [r.step_time_s for r in logged]
    print(f"calibrate: {len(logged)} log{'s' if len(logged) != 1 else ''} of {fit.arch} GPUs, {len(FACTORS)} factors "
          f"({', '.join(FACTORS)})" + ("; fewer logs than factors: the prior picks the smallest move that explains "
                                       "them (MAP)" if len(logged) < len(FACTORS) else ""))
    for r, before, after in zip(logged, fit.before, fit.after, strict=True):
        t, c = r.job.training, r.job.cluster
        print(f"{r.log.path}: {r.job.model.name} on {c.nodes} x {c.gpus_per_node} {c.gpu.name}, {r.layout}, seq "
              f"{t.seq_length}, GBS {t.global_batch_size}, {t.precision}, release {t.release}")
        extra = ""
        if r.log.tflops_per_gpu:
            extra += f"; logged {sorted(r.log.tflops_per_gpu)[len(r.log.tflops_per_gpu) // 2]:.1f} TFLOP/s/GPU"
        if r.log.max_allocated_mb is not None:
            predicted = estimate_memory(r.job, r.layout).allocated_bytes / GIB
            extra += (f"; max allocated {r.log.max_allocated_mb * 2**20 / GIB:.1f} GiB (memory model "
                      f"{predicted:.1f} GiB)")
        cut = "; its cut-off last line left out" if r.log.cut_line else ""
        print(f"  measured step {r.step_time_s:.4g} s ({_tokens(r.job, r.step_time_s):,.0f} tokens/s per GPU; median "
              f"of {r.lines} iteration line{'s' if r.lines != 1 else ''}, warm-up and outliers left out{cut}){extra}")
        print(f"  predicted {before:.4g} s ({before / r.step_time_s - 1:+.1%}) before, {after:.4g} s "
              f"({after / r.step_time_s - 1:+.1%}) calibrated")
    bounds = {n: (lo, hi) for n, lo, hi in fit.bounds}
    moved = []
    for name, value in fit.factors:
        lo, hi = bounds[name]
        held = f" (held by its bound {lo:.2f}..{hi:.2f}: the fit wanted further)" if name in fit.at_bound else ""
        moved.append(f"{name} x{value:.3f}{held}")
    print(f"factors: {', '.join(moved)}")
    for r in logged:
        for note in r.warnings:
            print(f"warning: {note}")
    for name in fit.at_bound:
        lo, hi = bounds[name]
        print(f"warning: the fit would push {name} outside {lo:.2f}..{hi:.2f}; it keeps the bound (the logs differ "
              f"from the model by more than this factor explains)")
    mean_before = sum(abs(e) for e in fit.errors(measured, after=False)) / len(measured)
    mean_after = sum(abs(e) for e in fit.errors(measured)) / len(measured)
    print(f"mean |error| of the step time: {mean_before:.1%} before, {mean_after:.1%} calibrated")
    if args.output:
        print(f"wrote {args.output}: give it to any verb with --calibration {args.output}")
    else:
        print("nothing written (--output FILE writes the calibration file)")
    return 0


def _candidates(args: argparse.Namespace, job: Any) -> list[Any]:
    """The layouts to profile: the `--layout`s given (each checked), else the analytic ranking's best `--top`."""
    from autotune.tuning.measured_calibration import top_candidates
    from autotune.ui.commands import layout_from_args
    from search_spaces.rules import check

    if not args.layout:
        return top_candidates(job, args.top)
    out = []
    for text in args.layout:
        layout = layout_from_args(argparse.Namespace(**{**vars(args), "layout": text}), job)
        broken = check(job, layout)
        if broken:
            raise ValueError(f"--layout {layout} breaks {broken[0].rule}: {broken[0].message}")
        out.append(layout)
    return out


def _run_profile(args: argparse.Namespace) -> int:
    import sys

    from autotune.cost.calibration_file import PROXY_SOURCE, write_calibration
    from autotune.tuning.backends import get_backend
    from autotune.tuning.measured_calibration import run_profile
    from autotune.ui.commands import job_from_args
    from autotune.ui.request import DEFAULT_GLOBAL_BATCH_SIZE, DEFAULT_SEQ_LENGTH

    job_args = argparse.Namespace(**vars(args))
    job_args.seq_length = args.seq_length or DEFAULT_SEQ_LENGTH
    job_args.global_batch_size = args.global_batch_size or DEFAULT_GLOBAL_BATCH_SIZE
    job_args.precision = args.precision or "bf16"
    job = job_from_args(job_args)
    candidates = _candidates(args, job)
    if args.max_workers is not None and args.max_workers < 1:
        raise ValueError(f"--max-workers must be at least 1, but got {args.max_workers}.")
    backend: Any = get_backend("megatron")
    backend = backend.inner  # the measuring backend itself (`Predicted` would judge memory by the model)
    if args.max_workers:
        backend = backend.with_options(max_workers=args.max_workers)

    def say(text: str) -> None:
        print(f"calibrate: {text}", file=sys.stderr, flush=True)

    say(f"profiling {len(candidates)} candidate{'s' if len(candidates) != 1 else ''} of {job.model.name} on "
        f"{job.cluster.nodes} x {job.cluster.gpus_per_node} {job.cluster.gpu.name} on the hardware at hand")
    profile = run_profile(job, candidates, backend, say=say)
    proxy = profile.source == PROXY_SOURCE
    summary = profile.summary()
    cal = profile.calibration(job, path=args.output or "")
    if cal is not None and args.output:
        write_calibration(args.output, cal)
    written = cal is not None and bool(args.output)
    if args.json:
        print(json.dumps({**summary, "written": written, "output": args.output}, indent=2))
        return 0 if profile.fit is not None else 2
    hw = profile.hardware
    print(f"calibrate --profile: {hw['nodes']} node(s) x {hw['gpus_per_node']} "
          f"{'GPUs' if hw['use_gpu'] else 'CPU proxy ranks (gloo)'} at hand, for {job.model.name} on "
          f"{job.world_size} {job.cluster.gpu.name}")
    for row in summary["probes"]:
        note = f"; {row['note']}" if row.get("note") else ""
        if row.get("step_time_s"):
            print(f"  {row['candidate']}: probe {row['probe']} ({row['layers']} layers{note}): measured "
                  f"{row['step_time_s']:.4g} s, predicted {row['predicted_before_s']:.4g} s before, "
                  f"{row['predicted_after_s']:.4g} s calibrated")
        else:
            print(f"  {row['candidate']}: not profiled: {row['reason']}")
    for row in summary["collectives"]:
        print(f"  {row['label']}: measured {row['seconds'] * 1e3:.3g} ms, predicted "
              f"{row['predicted_before_s'] * 1e3:.3g} ms before, {row['predicted_after_s'] * 1e3:.3g} ms calibrated")
    if profile.fit is None:
        print(f"nothing fitted: {profile.reason}")
        return 2
    print("factors: " + ", ".join(f"{n} x{v:.3f}{' (held by its bound)' if n in profile.fit.at_bound else ''}"
                                  for n, v in profile.fit.factors))
    if proxy:
        print("CPU proxy: these are gloo and CPU-kernel timings of a scaled-down model, so the factors say nothing of a"
              " GPU cluster; the path ran end to end, and the file (if written) is marked source: megatron-cpu-proxy, "
              "which no verb applies. Run it where Ray sees GPUs.")
    if written:
        print(f"wrote {args.output}" + ("" if proxy else f": give it to any verb with --calibration {args.output}"))
    else:
        print("nothing written (--output FILE writes the calibration file)")
    return 0
