"""The one-GPU memory probe's code path, on CPU: `bench/gpu_memory_probe.py --device cpu --layouts tiny`.

The script runs each tiny case (`TINY_CASES`) in a fresh subprocess through `trainers.gpu_probe.probe_rank`:
one rank of an 8-rank world (4 for the DP case), the other ranks emulated by torch's fake process group, two
real training steps of megatron-core's pipeline schedule. Checked against the analytic model for the local
spec (`proxy_memory_assumptions`, with the TrainingSpec the probe reports it built):
- weights, gradients and optimizer bytes exactly (the optimizer holds, beyond the model's count, torch Adam's
  4 B `step` tensor per parameter tensor, reported apart);
- the schedule's passes: every chunk ran M forwards and M backwards per step, over 2 steps;
- the stage megatron-core put the rank on (PP is the outermost rank dimension) and its chunks' layers;
- the saved-tensor peak against the in-flight saved activations (seen: +0.5% to +2.0%);
- the CPU figure is what its label says (static bytes + saved peak), and the script's error is computed from it.
Failures come back as data: megatron-core refusing a layout, a timeout, a rank outside the world; bad input
to the script exits 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.cost.score import estimate_memory_per_stage
from autotune.tuning.measured import proxy_memory_assumptions
from bench.gpu_memory_probe import TINY_CASES, TRANSIENT_TERMS, Case, resolved_rank, run_case
from search_spaces.catalog import get_model
from search_spaces.gpus import build_cluster
from search_spaces.job import Job
from search_spaces.layout import parse_layout
from search_spaces.training import training_spec

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_memory_probe.py"
ACTIVATION_TOLERANCE = 0.05  # seen within +2.0% (RoPE caches, causal mask and router indices are not modelled)


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("probe") / "tiny.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--layouts", "tiny", "--out", str(out),
                           "--budget-s", "1400"],
                          capture_output=True, text=True, timeout=1500, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return {r["case"]["name"]: r for r in json.loads(out.read_text())}


def _estimate(case: Case, result: dict):
    """The analytic model for the probed stage, with the recipe the probe built (in-flight terms without the
    optimizer-step transient, which does not change the activations)."""
    layout = parse_layout(case.layout)
    training = training_spec(**result["training"])
    job = Job(model=get_model(case.model), cluster=build_cluster(nodes=1, gpus_per_node=layout.world_size),
              training=training)
    assumptions = proxy_memory_assumptions(layout)
    stage = estimate_memory_per_stage(job, layout, assumptions)[result["stage"]]
    no_step = replace(job, training=replace(training, precision_aware_optimizer=True))
    terms = dict(estimate_memory_per_stage(no_step, layout, assumptions)[result["stage"]].activation_terms)
    return stage, sum(v for k, v in terms.items() if k not in TRANSIENT_TERMS)


CASE_IDS = [c.name for c in TINY_CASES]


@pytest.mark.parametrize("case", TINY_CASES, ids=CASE_IDS)
def test_static_bytes_equal_the_analytic_model(records, case):
    result = records[case.name]["result"]
    assert result["status"] == "ok", result.get("reason")
    est, _ = _estimate(case, result)
    static = result["static"]
    assert result["spec"] == "local" and result["device"] == "cpu"
    assert (static["weights"], static["gradients"]) == (est.weights_bytes, est.gradients_bytes)
    assert static["optimizer"] - static["optimizer_step_counters"] == est.optimizer_bytes
    assert static["optimizer_step_counters"] > 0  # both steps ran optimizer.step()


@pytest.mark.parametrize("case", TINY_CASES, ids=CASE_IDS)
def test_the_schedule_ran_every_forward_and_backward(records, case):
    result = records[case.name]["result"]
    layout = parse_layout(case.layout)
    m = case.global_batch_size // (layout.mbs * layout.dp)  # e.g. 8 / (1 * 2) = 4 micro-batches per step
    assert result["num_microbatches"] == m
    assert result["passes"] == {"forward": [2 * m] * layout.vpp_size, "backward": [2 * m] * layout.vpp_size,
                                "steps": 2}


@pytest.mark.parametrize("case", TINY_CASES, ids=CASE_IDS)
def test_each_case_reports_its_stage_and_chunks(records, case):
    result = records[case.name]["result"]
    layout = parse_layout(case.layout)
    rank = resolved_rank(case)
    # megatron-core's rank order tp-cp-ep-dp-pp: rank // (world / PP); rank 7 of tp2 x dp2 x pp2 is stage 1
    assert result["stage"] == rank // (layout.world_size // layout.pp)
    counts = layout.chunk_layer_counts(get_model(case.model).num_layers)
    assert result["chunk_layers"] == list(counts[result["stage"]::layout.pp])
    assert result["groups"]["world"] == layout.world_size and result["groups"]["pp"] == layout.pp


@pytest.mark.parametrize("case", TINY_CASES, ids=CASE_IDS)
def test_saved_activations_match_the_in_flight_terms(records, case):
    result = records[case.name]["result"]
    _, inflight = _estimate(case, result)
    assert result["saved_activations_peak"] == pytest.approx(inflight, rel=ACTIVATION_TOLERANCE)


@pytest.mark.parametrize("case", TINY_CASES, ids=CASE_IDS)
def test_the_cpu_figure_is_what_its_label_says(records, case):
    record = records[case.name]
    result, static = record["result"], record["result"]["static"]
    assert result["allocator"] is None and result["peak_label"].startswith("cpu:")
    assert result["peak_bytes"] == (static["weights"] + static["gradients"] + static["optimizer"]
                                    + result["saved_activations_peak"])
    assert record["measured_bytes"] == result["peak_bytes"]
    assert record["error"] == pytest.approx((record["measured_bytes"] - record["predicted_bytes"])
                                            / record["predicted_bytes"])


# --- failures are results -------------------------------------------------------------------------------
def test_a_layout_megatron_refuses_comes_back_failed():
    # 16 heads over TP 3: TransformerConfig's own check
    case = Case(name="bad-tp", model="tiny-gpt", layout="tp=3", seq_length=64, global_batch_size=2)
    result = run_case(case, "cpu", 300)
    assert result["status"] == "failed"
    assert "num_attention_heads" in result["reason"] and result["spec"] == "local"


def test_a_case_past_its_timeout_comes_back_failed():
    case = Case(name="slow", model="tiny-gpt", layout="tp=1", seq_length=64, global_batch_size=2)
    result = run_case(case, "cpu", 1)
    assert result["status"] == "failed" and result["reason"].startswith("timeout")


def test_a_rank_outside_the_world_is_refused_before_building():
    from search_spaces.layout import Layout
    from search_spaces.training import TrainingSpec
    from trainers.gpu_probe import probe_rank

    result = probe_rank(get_model("tiny-gpt"), Layout(tp=2), TrainingSpec(seq_length=64, global_batch_size=2),
                        rank=2, device="cpu")
    assert result["status"] == "failed" and result["reason"] == "rank must be in [0, 2), but got 2."


@pytest.mark.parametrize(("layout_field", "training_field", "value", "words"), [
    ("cuda_graphs", "cuda_graphs", "local", "CUDA graphs"),
    ("ep_overlap", "overlap_moe_expert_parallel_comm", True, "EP all-to-all overlap"),
])
def test_a_switch_the_probe_cannot_run_is_refused_before_building(layout_field, training_field, value, words):
    # the switch sits on the Layout where the search spaces have it there, else on the TrainingSpec
    from dataclasses import fields

    from search_spaces.layout import Layout
    from search_spaces.training import TrainingSpec
    from trainers.gpu_probe import probe_rank

    layout, training = Layout(tp=2), TrainingSpec(seq_length=64, global_batch_size=2)
    if layout_field in {f.name for f in fields(Layout)}:
        layout = replace(layout, **{layout_field: value})
    else:
        training = replace(training, **{training_field: value})
    result = probe_rank(get_model("tiny-moe"), layout, training, rank=0, device="cpu")
    assert result["status"] == "failed" and words in result["reason"] and "spec" not in result


@pytest.mark.parametrize("argv", [["--device", "cpu", "--layouts", "default"], ["--layouts", "huge"],
                                  ["--device", "cpu", "--only", "no-such-case"],
                                  ["--device", "cpu", "--budget-s", "0"]])
def test_bad_input_exits_2(argv):
    done = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2 and "error" in done.stderr and "Traceback" not in done.stderr
