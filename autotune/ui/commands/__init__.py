"""One module per CLI verb, each with `add_arguments(parser)` (optional) and `run(args) -> int`.

Shared here: turning the job options every verb takes into a `Job`.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

from search_spaces.job import Job
from search_spaces.training import ReleaseFallback

__all__ = ["job_from_args", "add_layout_argument", "layout_from_args", "add_calibration_argument",
           "calibration_from_args", "calibration_line"]


def add_calibration_argument(parser: Any) -> None:
    """`--calibration FILE`: the factors `python -m autotune calibrate` fitted on your logs (search, estimate,
    check)."""
    parser.add_argument("--calibration", default=None, metavar="YAML",
                        help="a calibration file written by `python -m autotune calibrate` (the throughput model's "
                             "compute, network and host factors fitted on your cluster's logs); default: the "
                             "published fit")


def calibration_from_args(args: argparse.Namespace) -> Any:
    """The `CalibrationFile` of `--calibration`, read and validated (None without the flag); ValueError of one line
    for a file that is not one."""
    path = getattr(args, "calibration", None)
    if path is None:
        return None
    from autotune.cost.calibration_file import read_calibration

    return read_calibration(path)


def calibration_line(calibration: Any) -> str:
    """The line naming the calibration a prediction used."""
    if calibration is None:
        return "calibration: the published fit (no --calibration)"
    return f"calibration: {calibration.describe()}"


def add_layout_argument(parser: argparse.ArgumentParser) -> None:
    """`--layout`, the one-layout option of `check` and `estimate`."""
    parser.add_argument(
        "--layout", required=True,
        help='layout as name=value pairs, e.g. "tp=2,pp=4,vpp=2,cp=1,ep=8,etp=1,mbs=1,sp=true,dist_opt=true,'
             'recompute=selective"; megatron-core\'s uneven pipeline split: first_stage_layers=3,last_stage_layers=2 '
             "(num_layers_in_first/last_pipeline_stage), embedding_loss_split=true "
             "(account_for_embedding/loss_in_pipeline_split) or pipeline_layout=Et|(tt|)*30mL "
             "(pipeline_model_parallel_layout; quote it in the shell). Omitted fields take megatron-core's defaults "
             "(1, no VPP, ETP = TP, SP off, no distributed optimizer, no recompute); "
             "dp defaults to world / (tp * pp * cp)",
    )


def job_from_args(args: argparse.Namespace) -> Job:
    """Build the Job from --model, --nodes, --gpus-per-node, --gpu, links, --cluster YAML and training flags.

    Raises ValueError (shown to the user as one line, exit code 2) for unknown names or bad values.
    """
    from autotune.ui.request import JobRequest

    if isinstance(args.nodes, tuple) or (isinstance(args.gpu, str) and "," in args.gpu):
        given = f"--nodes {_text(args.nodes)}" if isinstance(args.nodes, tuple) else f"--gpu {args.gpu}"
        raise ValueError(f"a list ({given}) is the search verb's what-if table; give one value for this command.")
    # Flags left unset are None: a --cluster YAML file fills them, then the documented defaults.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ReleaseFallback)
        job = JobRequest.from_args(args).job()
    for w in caught:
        if issubclass(w.category, ReleaseFallback):
            print(f"autotune: warning: {w.message}", file=sys.stderr)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return job


def _text(value: object) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def layout_from_args(args: argparse.Namespace, job: Job):
    """`--layout` as a Layout, with `--cuda-graphs` / `--ep-overlap` as the values of those switches when the
    layout text does not name them (check, estimate)."""
    from dataclasses import replace

    from search_spaces.layout import parse_layout

    layout = parse_layout(args.layout, world_size=job.world_size)
    named = {item.split("=", 1)[0].strip().lower() for item in args.layout.split(",") if "=" in item}
    switches: dict[str, Any] = {}
    if getattr(args, "cuda_graphs", None) is not None and "cuda_graphs" not in named:
        switches["cuda_graphs"] = args.cuda_graphs
    if getattr(args, "ep_overlap", None) is not None and "ep_overlap" not in named:
        switches["ep_overlap"] = bool(args.ep_overlap)
    return replace(layout, **switches) if switches else layout
