"""`python -m autotune space --model mixtral --nodes 4`: the feasible space of a job.

Prints the number of valid layouts, how many candidates of the naive product each rule removed (each
candidate counted against the first rule it breaks, see `search_spaces/space.py`), and an evenly
spread sample. With --json: one JSON object per line per valid layout, megatron-core field names as
keys plus `dp` and `expert_dp` (the uneven pipeline split as `num_layers_in_first_pipeline_stage`,
`num_layers_in_last_pipeline_stage`, `account_for_embedding_in_pipeline_split`,
`account_for_loss_in_pipeline_split`, `pipeline_model_parallel_layout`). The summary says which
megatron-core's rules were applied. `--list-models` prints the catalog names.
"""

from __future__ import annotations

import argparse
import json

__all__ = ["add_arguments", "run", "options_from_args", "sample"]

DEFAULT_SAMPLE = 10


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sample", type=int, default=DEFAULT_SAMPLE, metavar="N",
                        help=f"how many layouts to show, evenly spread over the space (default {DEFAULT_SAMPLE})")
    parser.add_argument("--limit", type=int, default=None, metavar="N",
                        help="with --json, print at most N layouts (default: all)")
    parser.add_argument("--list-models", action="store_true", help="print the catalog model names and exit")
    g = parser.add_argument_group("space options")
    g.add_argument("--micro-batch-sizes", type=_int_list, default=None, metavar="LIST",
                   help="micro-batch sizes to search, e.g. 1,2 (default 1,2,4,8)")
    g.add_argument("--max-vpp", type=int, default=None, metavar="N",
                   help="largest virtual pipeline size to search (default: every one that splits the layers, "
                        "evenly or by the one uneven split offered)")
    g.add_argument("--min-pp-for-vpp", type=int, default=None, metavar="N",
                   help="interleave only when PP >= N (default 2, megatron-core; Megatron-LM without "
                        "--overlap-p2p-comm wants 3)")


def options_from_args(args: argparse.Namespace):
    """SpaceOptions from the space flags (missing flags, e.g. on another verb, take the defaults)."""
    from search_spaces.space import SpaceOptions

    kwargs: dict[str, object] = {"tp_within_node": not getattr(args, "cross_node_tp", False),
                                 "expert_within_node": bool(getattr(args, "experts_within_node", False))}
    if getattr(args, "micro_batch_sizes", None):
        kwargs["micro_batch_sizes"] = tuple(args.micro_batch_sizes)
    if getattr(args, "max_vpp", None) is not None:
        kwargs["max_vpp"] = args.max_vpp
    if getattr(args, "min_pp_for_vpp", None) is not None:
        kwargs["min_pp_for_vpp"] = args.min_pp_for_vpp
    if getattr(args, "min_cp_tokens", None) is not None:
        kwargs["min_cp_tokens"] = args.min_cp_tokens
    if getattr(args, "cuda_graphs", None) is not None:  # a fixed switch: search only that value
        kwargs["cuda_graphs"] = (args.cuda_graphs,)
    if getattr(args, "ep_overlap", None) is not None:
        kwargs["ep_overlap"] = (bool(args.ep_overlap),)
    return SpaceOptions(**kwargs)  # type: ignore[arg-type]


def sample(items: list, n: int) -> list:
    """n items evenly spread over `items` (all of them when there are at most n)."""
    if n <= 0:
        return []
    if len(items) <= n:
        return list(items)
    step = (len(items) - 1) / (n - 1) if n > 1 else 0
    return [items[round(i * step)] for i in range(n)]


def run(args: argparse.Namespace) -> int:
    if args.list_models:
        from search_spaces.catalog import model_names

        print("\n".join(model_names()))
        return 0
    if not args.model:
        raise ValueError("space needs --model (a catalog name or a config.json path); see --list-models.")
    if args.sample < 0 or (args.limit is not None and args.limit < 0):
        raise ValueError(f"--sample and --limit must be >= 0, but got ({args.sample}, {args.limit}).")
    from autotune.ui.commands import job_from_args
    from search_spaces.space import feasible_space
    from search_spaces.space_report import rejections

    job = job_from_args(args)
    options = options_from_args(args)
    space = feasible_space(job, options)
    if args.json:
        from autotune.ui.commands.check import megatron_fields

        for i, layout in enumerate(space.layouts()):
            if args.limit is not None and i >= args.limit:
                break
            print(json.dumps(megatron_fields(layout, job.training)))
        return 0
    _print_rich(job, options, space, rejections(job, options), args.sample)
    return 0


def _print_rich(job, options, space, report, n_sample: int) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from search_spaces.megatron_version import version_line

    console = Console()
    console.print(f"[bold]{job.model.name}[/bold] on {job.cluster.nodes} x {job.cluster.gpus_per_node} "
                  f"{job.cluster.gpu.name} ({job.world_size} GPUs), seq {job.training.seq_length}, "
                  f"GBS {job.training.global_batch_size}")
    console.print(escape(version_line(job.training.megatron_core)))
    tp = "TP inside one node" if options.tp_within_node else "TP across nodes allowed"
    ep = "EP*ETP inside one node" if options.expert_within_node else "EP*ETP across nodes allowed"
    settings = sorted({len(v) for v in space.switches.values() if v})
    each = f"{settings[0]}" if len(settings) == 1 else f"{settings[0]} to {settings[-1]}"
    console.print(f"feasible layouts: [bold]{space.size:,}[/bold] ({len(space.shapes):,} parallel shapes, each "
                  f"with the {each} dist_opt x recompute x CUDA-graph settings its overlap, FSDP and offload "
                  f"switches allow; {tp}, {ep})")
    ranges = ", ".join(f"{k} {len(v)}" for k, v in report.dimensions.items())
    console.print(f"candidates: {report.candidates:,} (product of per-dimension ranges: {ranges})")
    table = Table(title="rejected candidates, by the first rule each breaks")
    table.add_column("rule")
    table.add_column("removed", justify="right")
    table.add_column("share", justify="right")
    for rule, count in sorted(report.rejected_by.items(), key=lambda kv: -kv[1]):
        if count:
            table.add_row(rule, f"{count:,}", f"{count / report.candidates:.1%}")
    table.add_row("[green]feasible[/green]", f"{report.feasible:,}", f"{report.feasible / report.candidates:.1%}")
    console.print(table)
    chosen = sample(list(space.layouts()), n_sample) if n_sample else []
    if not chosen:
        return
    table = Table(title=f"sample of {len(chosen)} layouts")
    from autotune.ui.commands.check import stage_layers_text

    for name in ("tp", "cp", "pp", "vpp", "layers/stage", "ep", "etp", "dp", "edp", "mbs", "sp", "dist_opt",
                 "recompute"):
        table.add_column(name, justify="right")
    for layout in chosen:
        table.add_row(*(str(v) for v in (layout.tp, layout.cp, layout.pp, layout.vpp or "-",
                                          stage_layers_text(layout, job.model.num_layers), layout.ep,
                                          layout.etp if layout.etp is not None else "-", layout.dp, layout.expert_dp,
                                          layout.mbs, str(layout.sp).lower(), str(layout.dist_opt).lower(),
                                          layout.recompute)))
    console.print(table)
