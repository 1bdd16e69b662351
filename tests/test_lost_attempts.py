"""An attempt the cluster lost (an infrastructure failure) is measured once more, recorded as a row of its own marked
`infrastructure (retried)`, said in one line, and not counted against the budget (autotune/tuning/tune_glue.py,
results.counted). No Ray is started: a deterministic fake backend and the recorder on a real trials.csv."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from autotune.tuning.results import TrialLog, counted, read_trials
from search_spaces.catalog import get_model
from search_spaces.gpus import build_cluster
from search_spaces.job import Job
from search_spaces.layout import parse_layout
from search_spaces.measurement import Measurement
from search_spaces.training import TrainingSpec

JOB = Job(model=get_model("tiny-gpt"), cluster=build_cluster(nodes=2, gpus_per_node=2),
          training=TrainingSpec(seq_length=64, global_batch_size=8))
LAYOUT = parse_layout("tp=2,pp=2", world_size=4)
NODES = ["a" * 56, "a" * 56, "b" * 56, "b" * 56]


def _ok() -> Measurement:
    return Measurement(layout=LAYOUT, status="ok", source="megatron-cpu-proxy", memory_bytes=1e9,
                       tokens_per_s_per_gpu=100.0, extra={"worker_nodes": NODES})


def _lost() -> Measurement:
    return Measurement(layout=LAYOUT, status="failed", source="megatron-cpu-proxy",
                       reason="rank 2's worker on node bbbb died: ActorDiedError: its node has died",
                       extra={"failure": "infrastructure", "worker_nodes": NODES})


@dataclass
class Flaky:
    """The cluster loses the first `lose` attempts."""

    lose: int
    calls: int = 0
    name: str = "flaky"

    def evaluate(self, job: Job, layout: Any) -> Measurement:
        self.calls += 1
        return _lost() if self.calls <= self.lose else _ok()


@pytest.mark.parametrize(("lose", "statuses"), [(0, ["ok"]), (1, ["failed", "ok"]), (2, ["failed", "failed"])])
def test_an_infrastructure_failure_is_measured_once_more(lose: int, statuses: list[str]) -> None:
    from autotune.tuning.trial_io import timed_measurements

    got = [m for m, _ in timed_measurements(JOB, Flaky(lose), LAYOUT)]
    assert [m.status for m in got] == statuses
    assert [bool(m.extra.get("retried")) for m in got] == ([True, False] if lose else [False])
    if lose == 2:  # the retry lost too: recorded as the infrastructure's failure, not the layout's
        assert got[-1].extra["failure"] == "infrastructure"


@dataclass
class _Plan:
    capacity_bytes: float = 80 * 1024**3
    fingerprint: str = "0123456789abcdef"
    done: tuple = ()
    notices: list[str] = field(default_factory=list)


def test_a_lost_attempt_is_a_row_of_its_own_said_in_one_line_and_not_counted(tmp_path: Path) -> None:
    from autotune.tuning.trial_io import lost_attempt
    from autotune.tuning.tune_glue import Recorder

    plan = _Plan()
    log = TrialLog(tmp_path)
    progress: list[tuple[int, int]] = []
    recorder = Recorder(plan, log, 1, lambda record, done, total: progress.append((done, total)), plan.notices.append)
    recorder._add(lost_attempt(_lost()), "search", 1.0)
    recorder._add(_ok(), "search", 1.0)
    log.close()
    assert recorder.counted == 1 and progress == [(1, 1)]  # the budget sees one trial
    assert len(plan.notices) == 1 and "\n" not in plan.notices[0]
    assert "infrastructure failure, not the layout's" in plan.notices[0] and "retrying it once" in plan.notices[0]
    rows = read_trials(tmp_path, plan.capacity_bytes, job=plan.fingerprint)
    assert [r.measurement.extra.get("failure") for r in rows] == ["infrastructure", None]
    assert [r.measurement.extra.get("retried") for r in rows] == [True, None]
    assert rows[1].measurement.extra["worker_nodes"] == NODES  # each rank's node, read back from trials.csv
    assert counted(rows) == rows[1:]
    text = (tmp_path / "trials.csv").read_text()
    assert "infrastructure (retried)" in text and text.count("\n") == 3  # header and two rows
