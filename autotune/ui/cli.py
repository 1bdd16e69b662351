"""`python -m autotune`: the command line.

Verbs: `search` (the default: `python -m autotune --model mixtral --nodes 4`), `space`, `check`,
`estimate`, `smoke`, `calibrate`. Each verb's work lives in `autotune/commands/<verb>.py` and is imported only
when that verb runs, so `--help` imports nothing heavy (no torch, ray or megatron).

Bad input ends with one line on stderr and exit code 2 (argparse's own errors too), never a traceback: so
does a result folder that cannot be used or written (full disk, read-only). A layout that breaks rules is exit
code 1. Ctrl-C is 130, SIGTERM 143 (the search keeps its trials and prints the resume command); a closed
stdout (`space --json | head -1`) ends quietly with 141. Anything unexpected is one line and exit code 1
(`AUTOTUNE_DEBUG=1` shows the traceback).
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from typing import NoReturn

from autotune.ui.request import DEFAULT_GLOBAL_BATCH_SIZE, DEFAULT_SEQ_LENGTH

__all__ = ["main", "build_parser"]

VERBS = {
    "search": "search the feasible space and print the best layouts (the default verb)",
    "space": "print the size of the feasible space, rejections by rule, and a sample",
    "check": "check one layout against every validity rule",
    "estimate": "memory and throughput estimate of one layout (analytic models)",
    "smoke": "run one layout as a short real megatron-core job (CPU proxy here, GPU where present)",
    "calibrate": "fit the throughput model's compute, network and host factors to your own training logs",
}



class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (no usage block): `autotune search: error: ...`, exit code 2; a flag is
    taken only as spelled (no prefixes: `--gpus 8` is refused, never read as `--gpus-per-node 8`)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


def _positive_int(text: str) -> int:
    """A whole number >= 1 in ASCII digits (argparse type)."""
    value = _ascii_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, but got {value}")
    return value


def _count(text: str) -> int:
    """A whole number >= 0 in ASCII digits (argparse type)."""
    value = _ascii_int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, but got {value}")
    return value


def _node_counts(text: str) -> int | tuple[int, ...]:
    """`4`, or `4,8,16` (a what-if over cluster sizes: the search verb only) (argparse type)."""
    if "," not in text:
        return _positive_int(text)
    counts = tuple(_positive_int(part) for part in text.split(","))
    return tuple(dict.fromkeys(counts))


def _ascii_int(text: str) -> int:
    body = text.strip()
    digits = body[1:] if body[:1] in "+-" else body
    if not digits.isascii() or not digits.isdigit() or len(digits) > 18:
        raise argparse.ArgumentTypeError(f"expected a whole number, but got {text!r}")
    return int(body)


def _add_job_options(p: argparse.ArgumentParser, *, model_required: bool = True) -> None:
    g = p.add_argument_group("job")
    g.add_argument("--model", required=model_required,
                   help="catalog name (e.g. mixtral, llama3-70b; see `space --list-models`) or a path to a "
                        "Hugging Face config.json")
    g.add_argument("--nodes", type=_node_counts, default=None,
                   help="number of nodes (default 1); the search verb also takes a list, 4,8,16, for a what-if table")
    g.add_argument("--gpus-per-node", type=_positive_int, default=None, help="GPUs per node (default 8)")
    from search_spaces.gpus import list_gpus  # the catalog: one place for the GPUs

    g.add_argument("--gpu", default=None,
                   help=f"GPU type: {', '.join(g.name for g in list_gpus())} (default h100-sxm, alias h100); the "
                        f"search verb also takes a list, h100,h200, for a what-if table")
    g.add_argument("--intra-node", default=None, help="link inside a node (default: the GPU's NVLink generation)")
    g.add_argument("--inter-node", default=None,
                   help="network between nodes: ib-ndr, ib-hdr, roce-400g, ethernet-100g (default ib-ndr)")
    g.add_argument("--cluster", default=None, metavar="YAML",
                   help="cluster from a YAML file (nodes, gpus_per_node, gpu, intra_node, inter_node); flags "
                        "given explicitly win")
    g.add_argument("--seq-length", type=_positive_int, default=DEFAULT_SEQ_LENGTH,
                   help=f"sequence length (default {DEFAULT_SEQ_LENGTH})")
    g.add_argument("--global-batch-size", type=_positive_int, default=DEFAULT_GLOBAL_BATCH_SIZE,
                   help=f"global batch size in sequences (default {DEFAULT_GLOBAL_BATCH_SIZE})")
    g.add_argument("--precision", choices=("bf16", "fp8", "fp4"), default="bf16",
                   help="training precision (default bf16; fp4: NVFP4, Blackwell only)")
    _add_training_options(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _add_training_options(p: argparse.ArgumentParser) -> None:
    """The training recipe: precision details, overlap and kernel switches (defaults: Megatron-Bridge's
    performance configs; see search_spaces/training.py). Unset flags keep those defaults."""
    from_bridge = "default as Megatron-Bridge's performance configs"
    g = p.add_argument_group("training recipe")
    on_off = argparse.BooleanOptionalAction
    g.add_argument("--fp8-recipe", choices=("delayed", "tensorwise", "mxfp8", "blockwise"), default=None,
                   help="FP8 scaling (with --precision fp8); default tensorwise on Hopper, mxfp8 on Blackwell")
    g.add_argument("--fp8-param-gather", action=on_off, default=None,
                   help="keep FP8 primary weights (with --precision fp8; default on)")
    g.add_argument("--fp8-dot-product-attention", action=on_off, default=None,
                   help="run the attention core in FP8 (with --precision fp8; default off)")
    g.add_argument("--grad-reduce-in-fp32", action=on_off, default=None,
                   help=f"fp32 gradient buffer and reduction (default off, {from_bridge})")
    g.add_argument("--optimizer-moments", choices=("fp32", "bf16"), default=None,
                   help="dtype of Adam's moments (precision-aware optimizer; default fp32)")
    g.add_argument("--optimizer", choices=("adam", "muon"), default=None,
                   help="adam (default) or muon: Newton-Schulz-orthogonalised momentum on the 2-D weights, Adam on "
                        "the rest (megatron-core's emerging optimizers; with dist_opt the layer-wise distributed "
                        "Muon, dist_muon; GPT models only, no Megatron-FSDP)")
    for name, what in (("overlap-grad-reduce", "overlap the DP gradient reduce with backward"),
                       ("overlap-param-gather", "overlap the distributed optimizer's parameter all-gather"),
                       ("tp-comm-overlap", "overlap TP communication with GEMMs (userbuffers)"),
                       ("moe-grouped-gemm", "one grouped GEMM for a rank's experts"),
                       ("moe-permute-fusion", "TE's fused token permutation")):
        g.add_argument(f"--{name}", action=on_off, default=None, help=f"{what} (default on)")
    g.add_argument("--overlap-moe-expert-parallel-comm", "--ep-overlap", dest="ep_overlap", action=on_off,
                   default=None, help="the MoE all-to-all overlap (a layout switch: search tries both unless this "
                                      "fixes it; check/estimate: the value when --layout does not say)")
    g.add_argument("--delay-wgrad-compute", action=on_off, default=None,
                   help="with the all-to-all overlap, delay the weight gradients behind the combine (default on)")
    g.add_argument("--moe-dispatcher", dest="moe_token_dispatcher", choices=("alltoall", "allgather", "flex"),
                   default=None, help="MoE token dispatcher (default: flex with HybridEP on Blackwell, alltoall "
                                      "elsewhere, as Megatron-Bridge 0.6's recipes)")
    g.add_argument("--moe-flex-backend", choices=("deepep", "hybridep", "ncclep"), default=None,
                   help="the flex dispatcher's backend (default hybridep on Blackwell, deepep elsewhere)")
    g.add_argument("--moe-force-balance", dest="moe_router_force_load_balancing", action=on_off, default=None,
                   help="forced balanced routing, as every published MoE benchmark runs (default off: real "
                        "training routes by the learned router)")
    g.add_argument("--moe-rank-capacity-factor", type=float, default=None, metavar="X",
                   help="the paged stash's per-rank token budget of full-iteration graphs of MoE models (default 1.5)")
    g.add_argument("--moe-expert-capacity-factor", type=float, default=None, metavar="X",
                   help="token dropping: each expert keeps at most X times its even share (default: dropless)")
    g.add_argument("--moe-pad-expert-input-to-capacity", action=on_off, default=None,
                   help="with --moe-expert-capacity-factor, pad every expert to its capacity (drop-and-pad)")
    g.add_argument("--cross-entropy-fusion", choices=("te", "native", "none"), default=None,
                   help="fused cross-entropy loss (default te: the bf16 logits are its only copy)")
    g.add_argument("--cuda-graphs", choices=("none", "local", "transformer_engine", "full_iteration"), default=None,
                   help="CUDA graphs (a layout switch: search tries none, transformer_engine and full_iteration "
                        "unless this fixes one; check/estimate: the value when --layout does not say)")
    g.add_argument("--cuda-graph-modules", "--cuda-graph-scope", dest="cuda_graph_modules", default=None,
                   metavar="LIST", help="what per-layer CUDA graphs capture, comma-separated: attn, mlp, moe, "
                                        "moe_router, moe_preprocess (default: attn,moe_router,moe_preprocess for "
                                        "MoE models, the whole layer for dense ones; '' the whole layer)")
    g.add_argument("--recompute-modules", default=None, metavar="LIST",
                   help="what selective recompute recomputes, comma-separated (default core_attn)")
    g.add_argument("--recompute-num-layers", type=_positive_int, default=None, metavar="N",
                   help="full recompute of N layers per chunk (block); default every layer (uniform)")
    g.add_argument("--bf16-layers-at-start", type=_count, default=None, metavar="N",
                   help="with --precision fp8/fp4: keep the first N decoder layers in BF16 (megatron-core "
                        "first_last_layers_bf16 / num_layers_at_start_in_bf16; default 0)")
    g.add_argument("--bf16-layers-at-end", type=_count, default=None, metavar="N",
                   help="... and the last N (num_layers_at_end_in_bf16; Nemotron-3 Super's NVFP4 recipe: 14)")
    g.add_argument("--release", default=None, metavar="TAG",
                   help="the NeMo container (e.g. 26.06) or Megatron-Bridge version (e.g. 0.5.1) your cluster runs: "
                        "the throughput model's per-release kernel factors, and the rule set unless --megatron-core "
                        "says otherwise (default: the newest, 26.08; an unknown one falls back to the nearest, "
                        "with a warning)")
    g.add_argument("--megatron-core", default=None, metavar="VERSION",
                   help="the megatron-core release your cluster runs: 0.19 (default: the installed one) or 0.16.1 "
                        "(older containers); picks the validity rules and what the launch lines are written for "
                        "(Megatron-Bridge 0.6.2 and Megatron-LM core_v0.19.2, or Bridge v0.3.1 and core_v0.16.1)")


def _add_space_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("search space (what is kept inside a node's NVLink domain)")
    g.add_argument("--cross-node-tp", "--allow-cross-node-tp", dest="cross_node_tp", action="store_true",
                   help="let TP and expert-TP groups span nodes (default: they stay inside a node, where NVLink "
                        "carries their per-layer all-reduces); --allow-cross-node-tp is the old name")
    g.add_argument("--min-cp-tokens", type=_count, default=None, metavar="N",
                   help="search CP only while each CP rank keeps at least N tokens of a sequence, seq / CP "
                        "(default 1024: every published CP run keeps 2,048 or more; 0 lifts the limit)")
    g.add_argument("--experts-within-node", action="store_true",
                   help="keep EP*ETP groups inside a node (default: expert parallelism may cross nodes, as NVIDIA's "
                        "DeepSeek-V3 and Qwen3 recipes do)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m autotune",
        description="Find the fastest valid Megatron-Core parallel layout for a model on a GPU cluster.",
        epilog="Without a verb, `search` runs: python -m autotune --model mixtral --nodes 4",
    )
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb, help_text in VERBS.items():
        p = sub.add_parser(verb, help=help_text, description=help_text)
        # search: --resume FOLDER alone reads the job from the folder
        _add_job_options(p, model_required=verb not in ("smoke", "space", "search"))
        module = _command_module(verb, optional=True)
        if module is not None and hasattr(module, "add_arguments"):
            module.add_arguments(p)
        if verb in ("search", "space"):
            _add_space_options(p)
    return parser


def _command_module(verb: str, *, optional: bool = False):
    """A verb's module. Modules keep heavy imports inside functions, so importing them is cheap."""
    try:
        return importlib.import_module(f"autotune.ui.commands.{verb}")
    except ModuleNotFoundError as e:
        if optional and e.name == f"autotune.ui.commands.{verb}":
            return None
        raise


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in VERBS and argv[0] not in ("-h", "--help")):
        argv.insert(0, "search")
    verb = argv[0] if argv[0] in VERBS else "search"
    try:
        return _main(argv)
    except SystemExit as e:  # argparse (exit 2 with its one line), --help (0)
        return e.code if isinstance(e.code, int) else 2
    except KeyboardInterrupt:
        terminated = _sigterm_seen()
        print(f"autotune {verb}: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return 143 if terminated else 130
    except BrokenPipeError:  # `space --json | head -1`: the reader left; say nothing
        _silence_stdout()
        return 128 + signal.SIGPIPE
    except (ValueError, OSError) as e:  # bad input, or a folder that cannot be used or written: one line
        print(f"autotune {verb}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - a bug: still one line, the traceback on request
        if os.environ.get("AUTOTUNE_DEBUG"):
            raise
        print(f"autotune {verb}: internal error: {type(e).__name__}: {_one_line(e)} "
              f"(AUTOTUNE_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1


def _main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    module = _command_module(args.verb, optional=True)
    if module is None:
        parser.error(f"the {args.verb!r} verb is not available in this build")
    if args.verb == "search":
        _sigterm_like_ctrl_c()
    try:
        code = int(module.run(args) or 0)
        sys.stdout.flush()  # a closed pipe shows up here, inside the handler above
        return code
    except RecursionError:
        raise ValueError("the input is too deeply nested to read") from None


def _one_line(e: BaseException) -> str:
    if type(e).__name__ == "OutputError" and isinstance(e, OSError) and e.strerror:
        text = " ".join(str(e.strerror).split())
    else:
        text = " ".join(str(e).split())
    return text[:2000] or type(e).__name__


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not complain about the closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _sigterm_like_ctrl_c() -> None:
    """SIGTERM ends a search the way Ctrl-C does (trials kept, resume command printed, exit 143)."""
    from autotune.tuning import ray_run

    ray_run.terminate_like_ctrl_c()


def _sigterm_seen() -> bool:
    ray_run = sys.modules.get("autotune.tuning.ray_run")
    return bool(ray_run is not None and ray_run.TERMINATED.is_set())


if __name__ == "__main__":
    sys.exit(main())
