"""Search results: records as CSV rows and back, the Pareto front, best, the output folder."""

import json

from autotune.outputs.files import result_json, write_outputs
from autotune.tuning.answer import SearchResult
from autotune.tuning.results import TrialLog, TrialRecord, pareto_front, read_trials
from search_spaces.catalog import get_model
from search_spaces.gpus import build_cluster
from search_spaces.job import Job
from search_spaces.layout import parse_layout
from search_spaces.measurement import Measurement, Status
from search_spaces.training import TrainingSpec
from search_spaces.units import GIB

CAP = 70 * GIB


def _record(n: int, text: str, tps: float | None, mem_gib: float | None, status: Status = "ok") -> TrialRecord:
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
    assert result.best is not None
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


# --- trials.csv you can trust (issue 14) -----------------------------------------------------------------
import csv as _csv  # noqa: E402

import pytest  # noqa: E402

FP = "0123456789abcdef"


def _job_record(n: int, text: str, job: str = FP) -> TrialRecord:
    r = _record(n, text, 1000.0 + n, 10.0)
    return TrialRecord(number=r.number, origin=r.origin, measurement=r.measurement, feasible=r.feasible,
                       capacity_bytes=r.capacity_bytes, wall_s=r.wall_s, job=job)


def test_every_row_carries_the_job_fingerprint(tmp_path):
    log = TrialLog(tmp_path)
    log.append(_job_record(0, "tp=1,dp=8"))
    log.close()
    with open(tmp_path / "trials.csv") as f:
        assert [row["job"] for row in _csv.DictReader(f)] == [FP]


def test_rows_of_another_job_are_refused(tmp_path):
    log = TrialLog(tmp_path)
    log.append(_job_record(0, "tp=1,dp=8"))
    log.append(_job_record(1, "tp=2,dp=4", job="ffffffffffffffff"))  # a second search wrote here
    log.close()
    with pytest.raises(ValueError, match="line 3 is a trial of another job"):
        read_trials(tmp_path, CAP, job=FP)


def test_a_torn_last_line_is_cut_before_the_next_append(tmp_path):
    log = TrialLog(tmp_path)
    log.append(_job_record(0, "tp=1,dp=8"))
    log.close()
    with open(tmp_path / "trials.csv", "a") as f:
        f.write("1,0123456789abcdef,search,\"tp=2")  # a kill mid-write
    log = TrialLog(tmp_path)  # resume opens the log again: the torn tail goes first
    log.append(_job_record(1, "tp=2,dp=4"))
    log.close()
    back = read_trials(tmp_path, CAP, job=FP)
    assert [(r.number, str(r.layout)) for r in back] == [(0, str(RECORDS[0].layout)),
                                                          (1, str(parse_layout("tp=2,dp=4")))]


@pytest.mark.parametrize("header", ["numbr,job,origin,layout\n", "\x00\x00garbage\n", "number;job;origin\n"])
def test_a_damaged_header_is_an_error_naming_the_file(tmp_path, header):
    (tmp_path / "trials.csv").write_text(header + "0,x,seed,tp=1\n")
    with pytest.raises(ValueError, match="trials.csv: .*header"):
        read_trials(tmp_path, CAP, job=FP)
    with pytest.raises(ValueError, match="trials.csv: .*header"):
        TrialLog(tmp_path)


def test_a_damaged_middle_row_is_an_error_naming_the_line(tmp_path):
    log = TrialLog(tmp_path)
    log.append(_job_record(0, "tp=1,dp=8"))
    log.close()
    with open(tmp_path / "trials.csv", "a") as f:
        f.write("garbage,row\n")
    with pytest.raises(ValueError, match="line 3 is damaged"):
        read_trials(tmp_path, CAP, job=FP)


def test_a_field_over_128_kib_is_read(tmp_path):
    # csv's default field limit is 128 KiB ("field larger than field limit"); a long reason must not crash resume
    m = Measurement(layout=parse_layout("tp=1,dp=8"), status="failed", source="analytic", reason="x" * 200_000)
    log = TrialLog(tmp_path)
    log.append(TrialRecord(number=0, origin="search", measurement=m, feasible=False, capacity_bytes=CAP, job=FP))
    log.close()
    assert len(read_trials(tmp_path, CAP, job=FP)[0].measurement.reason) == 200_000


def test_a_reason_with_newlines_stays_one_line(tmp_path):
    m = Measurement(layout=parse_layout("tp=1,dp=8"), status="failed", source="analytic", reason="a\nb\r\nc")
    log = TrialLog(tmp_path)
    log.append(TrialRecord(number=0, origin="search", measurement=m, feasible=False, capacity_bytes=CAP, job=FP))
    log.close()
    assert len((tmp_path / "trials.csv").read_text().splitlines()) == 2  # header + one row
    assert read_trials(tmp_path, CAP, job=FP)[0].measurement.reason == "a b  c"


def test_a_failed_write_is_an_output_error(tmp_path, monkeypatch):
    from autotune.tuning.run_folder import OutputError

    log = TrialLog(tmp_path)

    def full(*_args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(log._file, "write", full)
    with pytest.raises(OutputError, match="No space left on device"):
        log.append(_job_record(0, "tp=1,dp=8"))


@pytest.mark.parametrize("meta,match", [
    ({"fingerprint": FP, "job": {}, "trials": 4, "seed": 0, "naming": "options", "headroom_bytes": 0.0}, "`mode`"),
    ({"fingerprint": FP, "mode": "search", "trials": 4, "seed": 0, "naming": "options", "headroom_bytes": 0.0},
     "`job`"),
    ({"fingerprint": FP, "job": {}, "mode": "grid", "trials": 4, "seed": 0, "naming": "options",
      "headroom_bytes": 0.0}, "`mode` must be"),
    ([1, 2], "expected a JSON object"),
])
def test_a_damaged_search_json_is_an_error_naming_the_file(tmp_path, meta, match):
    from autotune.tuning.results import read_meta

    (tmp_path / "search.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=match):
        read_meta(tmp_path)
