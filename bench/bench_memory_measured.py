"""Predicted against measured peak memory for public GPU runs (bench/data/measured_memory.csv).

    python bench/bench_memory_measured.py            # one line per run: predicted and measured peak, error
    python bench/bench_memory_measured.py --terms    # plus the predicted breakdown by term
    python bench/bench_memory_measured.py --json     # the rows as JSON (for tests and notes)

Every row is a real run: Megatron-LM's functional-test golden values (`mem-max-allocated-bytes`, i.e.
`torch.cuda.max_memory_allocated`, logged by the last rank = the last pipeline stage) and Megatron-Bridge's
published runs (rank 0's peak allocated). The source of each row is in the CSV. The comparison is like with
like: the model's *allocated* peak (`MemoryEstimate.allocated_bytes`: weights, gradients, optimizer,
activations, workspaces) of the stage the figure was measured on; the device allowance (CUDA context, NCCL,
userbuffers, the allocator's reserve) is not in "max allocated" and is left out here.

Model fields the CSV names follow megatron's defaults where the run's arguments are silent (docs in the CSV
notes); where the source also logs what stays allocated after the optimizer step (`mem-allocated-bytes`), the
static terms (weights + gradients + optimizer + workspaces) are compared with it ("static error"). `spec=local`
rows ran megatron-core's local spec (no Transformer Engine), `attention=unfused` rows
TE's or the local spec's unfused attention (s x s scores kept).

`metric=max_allocated_iter1` rows are Megatron-Bridge's one-time memory line, "(after 1 iterations) memory (GB)":
`training_log` prints it once (`report_memory_flag` is cleared after the first log, Bridge
`training/utils/train_utils.py`), so with `log_interval=1` it is the peak of the first iteration. That peak is not
the run's steady one: Adam's moments are created lazily in the first optimizer step (TE `FusedAdam`), so the first
forward/backward runs without them, and TE per-layer CUDA graphs are captured only at step
`cuda_graph_warmup_steps` (Bridge `training/train.py`; 3 in the Llama 3 SFT recipe), so it runs eagerly. Those
rows are compared with the larger of the two moments of iteration 1 (`first_iteration_estimate`): the eager
forward/backward without the moments, and the first optimizer step with the full state and its transient.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dataclasses  # noqa: E402

from autotune.cost.memory import MemoryAssumptions, MemoryEstimate, _lookups, _optimizer_step_bytes  # noqa: E402
from autotune.cost.score import estimate_memory_per_stage  # noqa: E402
from search_spaces.catalog import get_model  # noqa: E402
from search_spaces.gpus import build_cluster  # noqa: E402
from search_spaces.job import Job  # noqa: E402
from search_spaces.layout import Layout, parse_layout  # noqa: E402
from search_spaces.model import MLASpec, ModelSpec, MoESpec  # noqa: E402
from search_spaces.training import training_spec  # noqa: E402
from search_spaces.units import GIB  # noqa: E402

CSV_PATH = Path(__file__).resolve().parent / "data" / "measured_memory.csv"
UNITS = {"B": 1.0, "GiB": float(GIB), "GB": 1e9}


@dataclass(frozen=True, kw_only=True, slots=True)
class MeasuredRun:
    id: str
    job: Job
    layout: Layout
    assumptions: MemoryAssumptions
    measured_bytes: float
    after_step_bytes: float | None  # `mem-allocated-bytes` after the step: weights, gradients, optimizer, buffers
    stage: str  # "first" or "last": the pipeline stage the figure was measured on
    metric: str  # "max_allocated" (the run's peak) or "max_allocated_iter1" (the peak of the first iteration)
    trust: str
    source: str


class ComparedRow(TypedDict):
    """One run's line of the table (and of --json): predicted against measured, in GiB."""

    id: str
    static_predicted_gib: float
    static_error: float | None
    model: str
    gpu: str
    layout: str
    stage: int
    predicted_gib: float
    measured_gib: float
    error: float
    trust: str
    terms_gib: dict[str, float]
    activation_terms_gib: dict[str, float]


def _model(text: str) -> ModelSpec:
    if not text.startswith("{"):
        return get_model(text)
    fields = json.loads(text)
    if fields.get("moe"):
        fields["moe"] = MoESpec(**fields["moe"])
    if fields.get("mla"):
        fields["mla"] = MLASpec(**fields["mla"])
    return ModelSpec(**fields)


def _assumptions(row: dict[str, str]) -> MemoryAssumptions:
    local = row["spec"] == "local"
    kwargs: dict[str, object] = {"transformer_engine": not local, "flash_attention": row["attention"] != "unfused",
                                 "mla_down_proj_split": local}
    if row["dropout"]:
        kwargs["dropout"] = row["dropout"] == "true"
    if row["attention_score_bytes"]:
        kwargs["attention_score_bytes"] = float(row["attention_score_bytes"])
    return MemoryAssumptions(**kwargs)  # type: ignore[arg-type]


def measured_runs(path: Path = CSV_PATH) -> list[MeasuredRun]:
    runs = []
    with path.open() as f:
        for row in csv.DictReader(f):
            gpus = int(row["num_gpus"])
            gpn = min(gpus, 4 if row["gpu"] == "gb200" else 8)
            cluster = build_cluster(nodes=gpus // gpn, gpus_per_node=gpn, gpu=row["gpu"])
            training = training_spec(seq_length=int(row["seq_length"]), global_batch_size=int(row["global_batch_size"]),
                                     **json.loads(row["training"]))
            job = Job(model=_model(row["model"]), cluster=cluster, training=training)
            runs.append(MeasuredRun(
                id=row["id"], job=job, layout=parse_layout(row["layout"], world_size=gpus),
                assumptions=_assumptions(row),
                measured_bytes=float(row["measured"]) * UNITS[row["unit"]], stage=row["measured_stage"],
                metric=row["metric"],
                after_step_bytes=(float(row["measured_after_step_gib"]) * GIB
                                  if row["measured_after_step_gib"] else None),
                trust=row["trust"], source=row["source"]))
    return runs


def predict(run: MeasuredRun) -> MemoryEstimate:
    if run.metric == "max_allocated_iter1":
        return first_iteration_estimate(run)
    stages = estimate_memory_per_stage(run.job, run.layout, run.assumptions)
    return stages[-1] if run.stage == "last" else stages[0]


def first_iteration_estimate(run: MeasuredRun) -> MemoryEstimate:
    """The peak of the first training iteration on the measured stage: the larger of
    - its forward/backward: run eagerly (TE per-layer graphs are captured later, at `cuda_graph_warmup_steps`), with
      the fp32 master weights but without Adam's moments (created in the first optimizer step), and
    - its optimizer step: the full state (moments now allocated) plus the step's transient
      (`memory._optimizer_step_bytes`, the fp32 gradient copies)."""
    job, layout = run.job, run.layout
    pick = -1 if run.stage == "last" else 0
    full = estimate_memory_per_stage(job, layout, run.assumptions)[pick]
    eager_layout = layout if layout.cuda_graphs != "transformer_engine" else dataclasses.replace(layout,
                                                                                                   cuda_graphs="none")
    eager = estimate_memory_per_stage(job, eager_layout, run.assumptions)[pick]
    moment = 2.0 if job.training.moments(layout.dist_opt) == "bf16" else 4.0
    moments = full.optimizer_bytes * 2 * moment / (4.0 + 2 * moment)
    stage_params = _lookups(job, layout, run.assumptions)[0][full.stage]
    step = _optimizer_step_bytes(job, stage_params, layout)
    activations = eager.activations_bytes if eager.phase == "activations" else 0.0
    if activations - moments > step:  # the forward/backward, without the moments
        return dataclasses.replace(eager, optimizer_bytes=full.optimizer_bytes - moments,
                                   activations_bytes=activations, phase="activations")
    return dataclasses.replace(full, activations_bytes=step, phase="optimizer step",
                               activation_terms=(("optimizer_step_fp32_grads", step),))


def compare(runs: list[MeasuredRun]) -> list[ComparedRow]:
    out: list[ComparedRow] = []
    for run in runs:
        est = predict(run)
        error = est.allocated_bytes / run.measured_bytes - 1
        static = est.weights_bytes + est.gradients_bytes + est.optimizer_bytes + est.workspace_bytes
        static_error = None if run.after_step_bytes is None else static / run.after_step_bytes - 1
        out.append({"id": run.id, "static_predicted_gib": static / GIB, "static_error": static_error,
                    "model": run.job.model.name, "gpu": run.job.cluster.gpu.name, "layout": str(run.layout),
                    "stage": est.stage, "predicted_gib": est.allocated_bytes / GIB,
                    "measured_gib": run.measured_bytes / GIB, "error": error, "trust": run.trust,
                    "terms_gib": {k: v / GIB for k, v in est.as_dict().items() if k != "overhead"},
                    "activation_terms_gib": {k: v / GIB for k, v in est.activation_terms}})
    return out


def summary(rows: list[ComparedRow]) -> dict[str, float]:
    errors = [abs(r["error"]) for r in rows]
    return {"rows": len(errors), "mean_abs_error": sum(errors) / len(errors), "max_abs_error": max(errors),
            "mean_signed_error": sum(r["error"] for r in rows) / len(rows)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--terms", action="store_true", help="print each row's predicted breakdown")
    parser.add_argument("--json", action="store_true", help="rows and summary as JSON")
    args = parser.parse_args()
    rows = compare(measured_runs())
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary(rows)}, indent=1))
        return 0
    print(f"{'id':<4} {'model':<22} {'gpu':<8} {'layout':<58} {'stage':>5} {'pred GiB':>9} {'meas GiB':>9} {'error':>7}"
          f"  {'static error':>12}")
    for r in rows:
        static = "" if r["static_error"] is None else f"{r['static_error']:+12.1%}"
        print(f"{r['id']:<4} {str(r['model'])[:22]:<22} {r['gpu']:<8} {str(r['layout'])[:58]:<58} {r['stage']:>5} "
              f"{r['predicted_gib']:9.2f} {r['measured_gib']:9.2f} {r['error']:+7.1%}  {static}")
        if args.terms:
            print("      " + "  ".join(f"{k} {v:.2f}" for k, v in r["terms_gib"].items()))
            print("      " + "  ".join(f"{k} {v:.2f}" for k, v in r["activation_terms_gib"].items() if v))
    for label, subset in (("all rows", rows), ("trust A (exact configs)", [r for r in rows if r["trust"] == "A"])):
        s = summary(subset)
        print(f"{label}: {s['rows']} rows, mean |error| {s['mean_abs_error']:.1%}, worst {s['max_abs_error']:.1%}, "
              f"mean signed {s['mean_signed_error']:+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
