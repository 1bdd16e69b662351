"""`python -m autotune smoke --layout "tp=2,pp=2,sp=true"`: one layout as a short real megatron-core job.

Runs on as many Ray workers as the layout's world size (gloo and a CPU-patched megatron-core here,
NCCL where GPUs are), prints the group sizes megatron-core formed (`TP=2 PP=2 DP=1 ...`) and the loss of
every step. Exit code 0 only when every loss is finite and the groups match the layout; 1 otherwise.
The model keeps its shape unless it is too big for CPU workers (then the proxy model of `trainers.proxy`).
"""

from __future__ import annotations

import argparse

__all__ = ["add_arguments", "run"]

DEFAULT_MODEL = "tiny-gpt"


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


def run(args: argparse.Namespace) -> int:
    from search_spaces.layout import parse_layout
    from search_spaces.training import TrainingSpec

    layout = parse_layout(args.layout)
    workers = args.workers or layout.world_size
    if workers <= 0 or args.iterations <= 0:
        raise ValueError("--workers and --iterations must be positive integers.")
    model = _model(args.model)
    _refuse_hybrid(model)
    training = TrainingSpec(seq_length=args.seq_length, global_batch_size=args.global_batch_size,
                            precision=args.precision)
    if training.global_batch_size % (layout.mbs * layout.dp):
        raise ValueError(f"global batch size ({training.global_batch_size}) must be a multiple of "
                         f"mbs * dp ({layout.mbs} * {layout.dp}); pass --global-batch-size.")
    return _run_job(args, model, layout, training, workers)


def _refuse_hybrid(model) -> None:
    from autotune.tuning.backends import trainer_entry

    trainer_entry("trainers.proxy", "refuse_hybrid")(model)


def _run_job(args: argparse.Namespace, model, layout, training, workers: int) -> int:
    from autotune.tuning.backends import trainer_entry

    run_smoke = trainer_entry("trainers.smoke", "run_smoke")
    return run_smoke(model, layout, training, workers=workers, iterations=args.iterations, timeout_s=args.timeout,
                     dtype=args.dtype)
