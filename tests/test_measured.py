"""The megatron backend judged by the real model: rule breakers refused before any worker, "fits" from the
analytic prediction for the real job, corrected term by term by what the run measured."""

import pytest

from autotune.tuning.measured import Predicted, analytic_prediction, corrected_memory
from search_spaces.catalog import get_model
from search_spaces.gpus import build_cluster
from search_spaces.job import Job
from search_spaces.layout import parse_layout
from search_spaces.measurement import Measurement
from search_spaces.training import TrainingSpec
from search_spaces.units import GIB

JOB_70B = Job(model=get_model("llama3-70b"), cluster=build_cluster(nodes=1, gpus_per_node=4), training=TrainingSpec())


class NoWorkers:
    name = "megatron"

    def evaluate(self, job, layout):
        raise AssertionError("a worker was started")


class TinyProxy:
    """What a CPU proxy reports: ok, and a few MiB of memory."""

    name = "megatron"

    def evaluate(self, job, layout):
        return Measurement(layout=layout, status="ok", source="megatron-cpu-proxy", memory_bytes=8 * 1024**2,
                           memory={"weights": 2 * 1024**2, "gradients": 2 * 1024**2, "optimizer": 3 * 1024**2,
                                   "activations": 1024**2}, tokens_per_s_per_gpu=100.0)


def test_a_rule_breaking_layout_is_refused_before_any_worker():
    # the case: llama3-70b on 4 GPUs with tp=3: 4 % 3 != 0 and 64 heads % 3 != 0
    m = Predicted(NoWorkers()).evaluate(JOB_70B, parse_layout("tp=3,pp=1", world_size=4))
    assert m.status == "invalid"
    assert "world_size_divisible" in m.reason and "heads_divisible_by_tp" in m.reason


def test_fits_is_judged_by_the_real_model_not_the_proxy():
    # tp=4 on 4 x 80 GiB: the real 70B job needs ~363 GiB per GPU; the proxy's 8 MiB must not make it "fit"
    layout = parse_layout("tp=4,pp=1", world_size=4)
    m = Predicted(TinyProxy()).evaluate(JOB_70B, layout)
    predicted = analytic_prediction(JOB_70B, layout)["memory_bytes"]
    assert m.memory_bytes is not None
    assert m.memory_bytes == pytest.approx(predicted) and m.memory_bytes > 300 * GIB
    assert m.extra["measured_memory_bytes"] == 8 * 1024**2  # the proxy's own figure is kept beside it


def test_the_proxy_corrects_each_term_within_limits():
    real: dict[str, float] = {"weights": 10 * GIB, "gradients": 20 * GIB, "optimizer": 60 * GIB, "activations": 8 * GIB,
            "overhead": 2 * GIB}
    measured = {"weights": 1.1, "gradients": 2.0, "optimizer": 6.0, "activations": 3.0}
    proxy_predicted = {"weights": 1.0, "gradients": 2.0, "optimizer": 6.0, "activations": 1.0}
    terms, factors = corrected_memory(real, measured, proxy_predicted)
    # weights x 1.1; activations 3.0 / 1.0 = 3 clamped to 2; the rest x 1: 11 + 20 + 60 + 16 + 2 = 109 GiB
    assert factors == pytest.approx({"weights": 1.1, "gradients": 1.0, "optimizer": 1.0, "activations": 2.0})
    assert sum(terms.values()) == pytest.approx(109 * GIB)
