"""`python -m autotune smoke --layout "tp=2,pp=2,sp=true"`: one layout as a short real megatron-core job.

Runs on as many Ray workers as the layout's world size (gloo and a CPU-patched megatron-core here,
NCCL where GPUs are), prints the group sizes megatron-core formed (`TP=2 PP=2 DP=1 ...`) and the loss of
every step. Exit code 0 only when every loss is finite and the groups match the layout; 1 otherwise.
The model keeps its shape unless it is too big for CPU workers (then the proxy model of `trainers.proxy`).
"""

from __future__ import annotations

import argparse
import math

__all__ = ["add_arguments", "run"]

DEFAULT_MODEL = "tiny-gpt"
CPU_FULL_MODEL_MAX_PARAMS = 50_000_000  # bigger models run as their proxy on CPU workers


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("smoke")
    g.add_argument("--layout", required=True, help='the layout, e.g. "tp=2,pp=2,sp=true" (dp defaults to 1)')
    g.add_argument("--workers", type=int, default=None,
                   help="worker processes (default: the layout's world size); fewer reduce DP, recorded")
    g.add_argument("--iterations", type=int, default=3, help="training steps (default 3)")
    g.add_argument("--timeout", type=float, default=600.0, help="seconds before the job counts as hung (default 600)")
    g.add_argument("--dtype", choices=("auto", "bf16", "fp32"), default="auto",
                   help="parameter dtype: auto = bf16 on GPU, fp32 on CPU (bf16 matmuls are ~6x slower there)")
    parser.set_defaults(model=DEFAULT_MODEL, seq_length=64, global_batch_size=8)


def _model(name: str | None):
    from search_spaces.catalog import get_model

    return get_model(name or DEFAULT_MODEL)


def _format_groups(groups: dict[str, int]) -> str:
    order = ("tp", "pp", "dp", "cp", "vpp", "ep", "etp", "expert_dp")
    return " ".join(f"{k.upper()}={groups[k]}" for k in order if k in groups)


def run(args: argparse.Namespace) -> int:
    from search_spaces.layout import TrainingSpec, parse_layout

    layout = parse_layout(args.layout)
    workers = args.workers or layout.world_size
    if workers <= 0 or args.iterations <= 0:
        raise ValueError("--workers and --iterations must be positive integers.")
    model = _model(args.model)
    training = TrainingSpec(seq_length=args.seq_length, global_batch_size=args.global_batch_size,
                            precision=args.precision)
    if training.global_batch_size % (layout.mbs * layout.dp):
        raise ValueError(f"global batch size ({training.global_batch_size}) must be a multiple of "
                         f"mbs * dp ({layout.mbs} * {layout.dp}); pass --global-batch-size.")
    return _run_job(args, model, layout, training, workers)


def _run_job(args: argparse.Namespace, model, layout, training, workers: int) -> int:
    from trainers.backend import MegatronBackend, ensure_ray, expected_groups
    from trainers.megatron_job import JobConfig
    from trainers.proxy import plan_proxy
    from trainers.worker_pool import run_pooled, shutdown_pool

    import ray

    started_ray = not ray.is_initialized()
    ensure_ray()

    use_gpu = int(ray.cluster_resources().get("GPU", 0)) >= workers
    scale = not use_gpu and model.total_params > CPU_FULL_MODEL_MAX_PARAMS
    plan = plan_proxy(model, layout, training, max_workers=workers, scale_model=scale,
                      microbatches=layout.num_microbatches(training.global_batch_size))
    dtype = args.dtype if args.dtype != "auto" else ("bf16" if use_gpu else "fp32")
    backend = MegatronBackend(warmup_steps=0, timed_steps=args.iterations, precision=dtype)
    cfg = JobConfig(**{**_fields(backend.job_config(plan)), "warmup_steps": 0, "measure_memory": False})
    device = "GPU (NCCL)" if use_gpu else "CPU (gloo)"
    print(f"smoke: {model.name}{' (proxy)' if scale else ''} layout {plan.layout} on {plan.world_size} workers, "
          f"{device} {dtype}, GBS {plan.training.global_batch_size} MBS {plan.layout.mbs} seq {plan.training.seq_length}, "
          f"{cfg.num_microbatches} micro-batches, {args.iterations} iterations"
          + (f"; {plan.dp_reduction}" if plan.dp_reduction else ""), flush=True)
    try:
        outcome = run_pooled(cfg, world_size=plan.world_size, use_gpu=use_gpu, timeout_s=args.timeout)
    finally:
        if started_ray:  # a caller's Ray (tests, a search) keeps its workers for the next job
            shutdown_pool()
    if outcome.status != "ok":
        print(f"smoke: {outcome.status}: {outcome.reason}")
        return 1
    return _report(outcome.ranks, expected_groups(plan.layout))


def _fields(cfg) -> dict:
    return {name: getattr(cfg, name) for name in cfg.__dataclass_fields__}


def _report(ranks: list[dict], want: dict[str, int]) -> int:
    groups = ranks[0]["groups"]
    print(_format_groups(groups))
    last = min((r for r in ranks if any(x is not None for x in r["losses"])), key=lambda r: r["rank"], default=None)
    losses = [] if last is None else last["losses"]
    steps = [max(t) for t in zip(*(r["step_times_s"] for r in ranks))]
    for i, (loss, step_s) in enumerate(zip(losses, steps), start=1):
        print(f"step {i}: loss {loss:.4f}  time {step_s:.2f} s")
    mismatched = [r["rank"] for r in ranks if r["groups"] != want]
    if mismatched:
        print(f"smoke: FAILED: ranks {mismatched} formed groups {groups}, the layout needs {want}")
        return 1
    if not losses or not all(math.isfinite(x) for x in losses):
        print(f"smoke: FAILED: losses not finite: {losses}")
        return 1
    print(f"smoke: ok (loss at step {len(losses)} is {losses[-1]:.4f}; groups match the layout)")
    return 0
