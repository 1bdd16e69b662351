"""Search results: records as CSV rows and back, the Pareto front, best, the output folder."""

import json

from search_spaces.measurement import Measurement
from autotune.outputs.files import result_json, write_outputs
from autotune.tuning.results import SearchResult, TrialLog, TrialRecord, pareto_front, read_trials
from search_spaces.catalog import get_model
from search_spaces.gpus import build_cluster
from search_spaces.job import Job
from search_spaces.layout import parse_layout
from search_spaces.training import TrainingSpec

GIB = 1024**3
CAP = 70 * GIB


def _record(n: int, text: str, tps: float | None, mem_gib: float | None, status: str = "ok") -> TrialRecord:
    m = Measurement(layout=parse_layout(text), status=status, source="analytic",
                    tokens_per_s_per_gpu=tps, memory_bytes=None if mem_gib is None else mem_gib * GIB,
                    memory={"weights": 1.5 * GIB}, time={"compute": 0.25}, mfu=0.4, extra={"dominant_time": "compute"},
                    reason="" if status == "ok" else "it broke")
    feasible = status == "ok" and mem_gib is not None and mem_gib * GIB <= CAP
    return TrialRecord(number=n, origin="search", measurement=m, feasible=feasible, capacity_bytes=CAP, wall_s=0.01)


def _job() -> Job:
    return Job(model=get_model("llama3-8b"), cluster=build_cluster(nodes=1), training=TrainingSpec())


RECORDS = [
    _record(0, "tp=1,dp=8", 1000.0, 60.0),
    _record(1, "tp=2,dp=4,sp=true", 1200.0, 50.0),   # dominates #0
    _record(2, "tp=4,dp=2,sp=true", 900.0, 30.0),    # on the front: least memory
    _record(3, "tp=8,dp=1,sp=true", 1500.0, 80.0),   # fastest but over 70 GiB: infeasible
    _record(4, "tp=2,pp=2,dp=2,sp=true", None, None, status="failed"),
]


def test_pareto_front_keeps_non_dominated_feasible_layouts():
    front = [str(r.layout) for r in pareto_front(RECORDS)]
    assert front == [str(RECORDS[2].layout), str(RECORDS[1].layout)]  # by memory: 30 GiB, then 50 GiB


def test_best_is_fastest_feasible_not_fastest():
    result = SearchResult(job=_job(), records=tuple(RECORDS), capacity_bytes=CAP, headroom_bytes=0, mode="search",
                          backend="analytic", seed=0, space_size=5)
    assert result.best.layout == RECORDS[1].layout  # 1200 tok/s; the 1500 one needs 80 > 70 GiB


def test_closest_misses_are_infeasible_layouts_by_memory():
    result = SearchResult(job=_job(), records=tuple(RECORDS), capacity_bytes=CAP, headroom_bytes=0, mode="search",
                          backend="analytic", seed=0, space_size=5)
    assert [r.layout for r in result.closest_misses()] == [RECORDS[3].layout]


def test_csv_round_trip_keeps_layout_metrics_status_and_reason(tmp_path):
    log = TrialLog(tmp_path)
    for r in RECORDS:
        log.append(r)
    log.close()
    back = read_trials(tmp_path, CAP)
    assert [(b.layout, b.measurement.status, b.measurement.reason, b.feasible) for b in back] == \
        [(r.layout, r.measurement.status, r.measurement.reason, r.feasible) for r in RECORDS]
    assert back[1].measurement.memory_bytes == RECORDS[1].measurement.memory_bytes
    assert back[1].measurement.memory == {"weights": 1.5 * GIB}


def test_a_torn_last_line_is_skipped(tmp_path):
    log = TrialLog(tmp_path)
    log.append(RECORDS[0])
    log.close()
    with open(tmp_path / "trials.csv", "a") as f:
        f.write("1,search,tp=2")  # a kill mid-write
    assert len(read_trials(tmp_path, CAP)) == 1


def test_write_puts_winner_and_both_launch_forms(tmp_path):
    result = SearchResult(job=_job(), records=tuple(RECORDS), capacity_bytes=CAP, headroom_bytes=0, mode="search",
                          backend="analytic", seed=0, space_size=5)
    write_outputs(result, tmp_path)
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["layout"]["tensor_model_parallel_size"] == 2
    assert (tmp_path / "best_megatron_bridge.txt").read_text().startswith("model.tensor_model_parallel_size=2 ")
    assert (tmp_path / "best_megatron_lm.txt").read_text().startswith("--tensor-model-parallel-size 2 ")


def test_to_json_has_best_pareto_and_trials():
    result = SearchResult(job=_job(), records=tuple(RECORDS), capacity_bytes=CAP, headroom_bytes=0, mode="search",
                          backend="analytic", seed=0, space_size=5)
    payload = json.loads(json.dumps(result_json(result), default=str))
    assert payload["best"]["layout"]["pipeline_model_parallel_size"] == 1
    assert set(payload["best"]["launch"]) == {"megatron_bridge", "megatron_lm"}
    assert len(payload["pareto"]) == 2 and len(payload["trials"]) == 5
