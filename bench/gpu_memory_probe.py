"""One-GPU memory probe: the measured peak of one rank of a layout against the analytic memory model.

Each case runs `trainers.gpu_probe.probe_rank` in a fresh subprocess (a failure or an out-of-memory cannot
poison the next case), with a timeout per case and a budget for the whole list; the results are written to
`--out` as each case finishes. One rank of the layout runs for real; torch's fake process group emulates the
other ranks (see `trainers/gpu_probe.py`).

The comparison, per case:
- GPU: `torch.cuda.max_memory_allocated` over the second training step against the analytic model's
  `allocated_bytes` (weights + gradients + optimizer + activations + workspace) for that pipeline stage;
- CPU: no allocator peak exists, so the probe's figure is the saved-tensor peak of one step plus the exact
  weights, gradients and optimizer bytes, against the analytic model's same four terms with the activations'
  in-flight tensors only (no transients, no workspace: nothing the saved-tensor hooks see).
The analytic model is evaluated with the TrainingSpec the probe built (`result["training"]`) and with the
assumptions of the layer spec that ran: Transformer Engine's (`DEFAULT_ASSUMPTIONS`, no dropout), or the local
spec's (`proxy_memory_assumptions`: unfused attention and SwiGLU, no dropout; on a GPU with torch's own norms).

    python bench/gpu_memory_probe.py                                # the GPU list, on one H100 / H200
    python bench/gpu_memory_probe.py --device cpu --layouts tiny    # the same code path on tiny models
    python bench/gpu_memory_probe.py --out probe.json --budget-s 470
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from search_spaces.units import GIB

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRANSIENT_TERMS = ("backward_working_set", "recompute_working_set", "loss_transient")


@dataclass(frozen=True, kw_only=True)
class Case:
    """One probe: a catalog model, a layout, the rank to run ("last" = the world's last rank) and the job."""

    name: str
    model: str
    layout: str
    rank: int | str = 0
    seq_length: int
    global_batch_size: int
    training: dict[str, Any] = field(default_factory=dict)  # other TrainingSpec fields
    timeout_s: float = 150.0


# GPU: real catalog models, one rank each, sized for one H100 / H200 (the analytic model with TE puts the
# largest at ~83 GiB allocated). Micro-batches per step are kept to what the peak needs: PP = 1 keeps one
# micro-batch in flight whatever M is; the interleaved 70B stage 0 holds its 46 warm-up forwards once M >= 10.
DEFAULT_CASES = (
    Case(name="llama3-8b-dp8-distopt", model="llama3-8b", layout="tp=1,pp=1,dp=8,dist_opt=true",
         seq_length=4096, global_batch_size=16),
    Case(name="llama3-8b-dp8-distopt-fp32grads", model="llama3-8b", layout="tp=1,pp=1,dp=8,dist_opt=true",
         seq_length=4096, global_batch_size=16, training={"grad_reduce_in_fp32": True}),
    Case(name="llama3-70b-tp4pp8vpp5-first", model="llama3-70b",
         layout="tp=4,pp=8,vpp=5,dp=2,sp=true,dist_opt=true", seq_length=8192, global_batch_size=32),
    Case(name="llama3-70b-tp4pp8vpp5-last", model="llama3-70b", rank="last",
         layout="tp=4,pp=8,vpp=5,dp=2,sp=true,dist_opt=true", seq_length=8192, global_batch_size=32),
    Case(name="mixtral-8x7b-tp2ep8pp4-first", model="mixtral-8x7b",
         layout="tp=2,pp=4,ep=8,etp=1,dp=4,sp=true,dist_opt=true", seq_length=4096, global_batch_size=32),
    Case(name="qwen3-30b-a3b-ep8", model="qwen3-30b-a3b", layout="tp=1,pp=1,ep=8,dp=8,dist_opt=true",
         seq_length=4096, global_batch_size=16),
)
# CPU: the same code path on tiny models (bf16, as the analytic model counts bytes), seq 64.
TINY_CASES = (
    Case(name="tiny-gpt-tp2pp2vpp2-first", model="tiny-gpt", layout="tp=2,pp=2,vpp=2,dp=2,sp=true,dist_opt=true",
         seq_length=64, global_batch_size=8, training={"grad_reduce_in_fp32": True}, timeout_s=300),
    Case(name="tiny-gpt-tp2pp2vpp2-last", model="tiny-gpt", layout="tp=2,pp=2,vpp=2,dp=2,sp=true,dist_opt=true",
         rank="last", seq_length=64, global_batch_size=8, training={"grad_reduce_in_fp32": True}, timeout_s=300),
    Case(name="tiny-moe-tp2ep4pp2-first", model="tiny-moe", layout="tp=2,pp=2,ep=4,etp=1,dp=2,sp=true,dist_opt=true",
         seq_length=64, global_batch_size=8, training={"grad_reduce_in_fp32": True}, timeout_s=300),
    Case(name="tiny-gpt-dp4-bf16grads", model="tiny-gpt", layout="tp=1,pp=1,dp=4,dist_opt=true",
         seq_length=64, global_batch_size=8, timeout_s=300),
)
CASE_LISTS = {"default": DEFAULT_CASES, "tiny": TINY_CASES}


def resolved_rank(case: Case) -> int:
    from search_spaces.layout import parse_layout

    world = parse_layout(case.layout).world_size
    return world - 1 if case.rank == "last" else int(case.rank)


def training_of(case: Case) -> Any:
    from search_spaces.training import training_spec

    return training_spec(seq_length=case.seq_length, global_batch_size=case.global_batch_size, **case.training)


# --- the child: one case -------------------------------------------------------------------------------
def run_in_this_process(case: Case, device: str) -> dict[str, Any]:
    import warnings

    warnings.filterwarnings("ignore")
    from search_spaces.catalog import get_model
    from search_spaces.layout import parse_layout
    from trainers.gpu_probe import probe_rank

    return probe_rank(get_model(case.model), parse_layout(case.layout), training_of(case),
                      rank=resolved_rank(case), device=device)


# --- the parent: every case in a fresh subprocess ----------------------------------------------------
def run_case(case: Case, device: str, timeout_s: float) -> dict[str, Any]:
    """The probe's result for `case`, from a fresh interpreter; a crash or a timeout is a failed result."""
    env = dict(os.environ)
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU path needs a torch that sees no GPU
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # as Megatron-Bridge's runs set it
    with tempfile.TemporaryDirectory(prefix="gpu-probe-") as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, str(Path(__file__).resolve()), "--run-case", json.dumps(asdict(case)),
                   "--device", device, "--result", str(out)]
        start = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=ROOT)
        except subprocess.TimeoutExpired:
            return {"status": "failed", "reason": f"timeout: no result within {timeout_s:.0f} s",
                    "time": {"total_s": time.perf_counter() - start}}
        if out.exists():
            return json.loads(out.read_text())
        return {"status": "failed", "reason": f"the probe process exited with {done.returncode} and no result",
                "stderr_tail": done.stderr[-3000:], "time": {"total_s": time.perf_counter() - start}}


def assumptions_for(result: dict[str, Any], layout: Any) -> tuple[Any, str]:
    from autotune.cost.memory import DEFAULT_ASSUMPTIONS
    from autotune.tuning.measured import proxy_memory_assumptions

    if result.get("spec") == "transformer_engine":
        return replace(DEFAULT_ASSUMPTIONS, dropout=False), "DEFAULT_ASSUMPTIONS (Transformer Engine), dropout off"
    local = proxy_memory_assumptions(layout)
    if result.get("device") == "cuda":  # no CPU patches on a GPU: torch's own RMSNorm
        return replace(local, torch_rmsnorm=True), "local spec (proxy_memory_assumptions), torch RMSNorm"
    return local, "local spec (proxy_memory_assumptions)"


def _gpu_name(result: dict[str, Any]) -> str:
    name = (result.get("gpu") or "").lower()
    return next((g for g in ("h200", "b200", "gb200", "a100") if g in name), "h100")


def analytic(case: Case, result: dict[str, Any]) -> dict[str, Any] | None:
    """The analytic model for the probed stage, with the recipe and assumptions that ran (None if unknown)."""
    from autotune.cost.score import estimate_memory_per_stage
    from search_spaces.catalog import get_model
    from search_spaces.gpus import build_cluster
    from search_spaces.job import Job
    from search_spaces.layout import parse_layout
    from search_spaces.training import training_spec

    if "training" not in result:
        return None
    layout = parse_layout(case.layout)
    training = training_spec(**result["training"])
    assumptions, assumptions_name = assumptions_for(result, layout)
    world = layout.world_size
    cluster = build_cluster(nodes=math.ceil(world / 8), gpus_per_node=min(world, 8), gpu=_gpu_name(result))
    job = Job(model=get_model(case.model), cluster=cluster, training=training)
    stage = result.get("stage", _stage_of_rank(layout, resolved_rank(case)))
    est = estimate_memory_per_stage(job, layout, assumptions)[stage]
    # in-flight saved tensors alone: the activations term without the transients; with a recipe that has no
    # optimizer-step transient, so that the activation phase is the one reported (activations do not depend on it)
    no_step = replace(training, precision_aware_optimizer=True)
    terms = dict(estimate_memory_per_stage(replace(job, training=no_step), layout, assumptions)[stage].activation_terms)
    inflight = sum(v for k, v in terms.items() if k not in TRANSIENT_TERMS)
    static = est.weights_bytes + est.gradients_bytes + est.optimizer_bytes
    return {
        "assumptions": assumptions_name, "stage": est.stage, "phase": est.phase,
        "weights": est.weights_bytes, "gradients": est.gradients_bytes, "optimizer": est.optimizer_bytes,
        "activations": est.activations_bytes, "workspace": est.workspace_bytes,
        "inflight_saved_activations": inflight, "allocated_bytes": est.allocated_bytes,
        "total_bytes": est.total_bytes, "cpu_comparable_bytes": static + inflight,
    }


def _stage_of_rank(layout: Any, rank: int) -> int:
    """megatron-core's default order "tp-cp-ep-dp-pp": PP is the outermost dimension."""
    return rank // (layout.world_size // layout.pp)


def compare(case: Case, result: dict[str, Any]) -> dict[str, Any]:
    record: dict[str, Any] = {"case": asdict(case), "rank": resolved_rank(case), "result": result}
    try:
        prediction = analytic(case, result)
    except Exception as e:  # noqa: BLE001 - the measurement is kept whatever the model does
        prediction = {"error": f"{type(e).__name__}: {e}"}
    record["analytic"] = prediction
    if result.get("status") == "ok" and prediction and "allocated_bytes" in prediction:
        key = "allocated_bytes" if result["device"] == "cuda" else "cpu_comparable_bytes"
        record["predicted_bytes"] = prediction[key]
        record["predicted_label"] = ("analytic allocated_bytes" if key == "allocated_bytes" else
                                     "analytic weights + gradients + optimizer + in-flight saved activations")
        record["measured_bytes"] = result["peak_bytes"]
        record["error"] = (result["peak_bytes"] - prediction[key]) / prediction[key]
    return record


def _line(record: dict[str, Any]) -> str:
    case, result, a = record["case"], record["result"], record.get("analytic") or {}
    head = f"{case['name']:<34} rank {record['rank']:>3}"
    if result.get("status") != "ok":
        predicted = f"; predicted {a['allocated_bytes'] / GIB:.1f} GiB allocated" if "allocated_bytes" in a else ""
        return f"{head}  FAILED: {result.get('reason', '')[:160]}{predicted}"
    unit, scale = ("GiB", GIB) if result["device"] == "cuda" else ("MiB", 1024**2)
    s = result["static"]
    pairs = [(t[:4], s[t], a[t]) for t in ("weights", "gradients", "optimizer")]
    if result["device"] == "cuda":  # everything beyond the static bytes at the peak vs activations + workspace
        static_sum = s["weights"] + s["gradients"] + s["optimizer"]
        pairs.append(("rest", record["measured_bytes"] - static_sum, a["activations"] + a["workspace"]))
    else:
        pairs.append(("act", result["saved_activations_peak"], a["inflight_saved_activations"]))
    static = "  ".join(f"{name} {m / scale:.2f}/{p / scale:.2f}" for name, m, p in pairs)
    measured = record["measured_bytes"] / scale
    return (f"{head} stage {result['stage']} {result['spec']:<17} measured {measured:8.2f} {unit}"
            f"  predicted {record['predicted_bytes'] / scale:8.2f}  error {record['error']:+7.1%}"
            f"   [{static} measured/predicted]  {result['time']['total_s']:.0f} s")


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--layouts", choices=tuple(CASE_LISTS), default=None,
                        help="default (real models, needs a GPU) or tiny (tiny models); default: by device")
    parser.add_argument("--out", default=None, help="write every result to this JSON file as it finishes")
    parser.add_argument("--budget-s", type=float, default=470.0, help="wall-clock budget for the whole list")
    parser.add_argument("--only", default=None, help="run only the cases whose name contains this text")
    parser.add_argument("--run-case", help=argparse.SUPPRESS)  # the child: one case as JSON
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.run_case:
        result = run_in_this_process(Case(**json.loads(args.run_case)), args.device)
        Path(args.result).write_text(json.dumps(result))
        return 0
    layouts = args.layouts or ("default" if args.device == "cuda" else "tiny")
    if args.budget_s <= 0:
        print(f"error: --budget-s must be positive, but got {args.budget_s}", file=sys.stderr)
        return 2
    if layouts == "default" and args.device == "cpu":
        print("error: the default list holds real models for one GPU; use --layouts tiny with --device cpu",
              file=sys.stderr)
        return 2
    if args.device == "cuda" and not _cuda_visible():
        print("error: no CUDA device is visible; use --device cpu --layouts tiny to run the code path on CPU",
              file=sys.stderr)
        return 2
    records: list[dict[str, Any]] = []
    deadline = time.monotonic() + args.budget_s
    cases = [c for c in CASE_LISTS[layouts] if args.only is None or args.only in c.name]
    if not cases:
        print(f"error: no case of the {layouts!r} list matches --only {args.only!r}", file=sys.stderr)
        return 2
    for case in cases:
        left = deadline - time.monotonic()
        if left < 20:
            result = {"status": "failed", "reason": f"skipped: the {args.budget_s:.0f} s budget is spent"}
        else:
            result = run_case(case, args.device, min(case.timeout_s, left))
        records.append(compare(case, result))
        print(_line(records[-1]), flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(records, indent=1))
    ok = [r for r in records if "error" in r]
    if ok:
        errors = [abs(r["error"]) for r in ok]
        print(f"{len(ok)} of {len(records)} cases measured: mean |error| {sum(errors) / len(errors):.1%}, "
              f"worst {max(errors):.1%}")
    return 0 if len(ok) == len(records) else 1  # a failed case is data in --out, and exit status 1


if __name__ == "__main__":
    sys.exit(main())
