"""A search's result from a seeded sample of the real feasible space, scored by the analytic backend, without Ray
(for the tests of what people read: tables, report)."""

from __future__ import annotations

import random

from autotune.cost.analytic import AnalyticBackend
from autotune.tuning.answer import SearchResult
from autotune.tuning.driver import default_headroom_bytes
from autotune.tuning.results import TrialRecord
from search_spaces.catalog import get_model
from search_spaces.gpus import build_cluster
from search_spaces.job import Job
from search_spaces.space import feasible_space
from search_spaces.training import TrainingSpec


def sampled_result(model: str, nodes: int, *, sample: int = 300, seq: int = 4096, gbs: int = 256) -> SearchResult:
    """What a search of a seeded sample of the space would hold (analytic, the search's default headroom), without
    Ray."""
    job = Job(model=get_model(model), cluster=build_cluster(nodes=nodes),
              training=TrainingSpec(seq_length=seq, global_batch_size=gbs))
    headroom = default_headroom_bytes(job)
    capacity = job.cluster.gpu.memory_bytes - headroom
    layouts = list(feasible_space(job).layouts())
    layouts = random.Random(0).sample(layouts, min(sample, len(layouts)))
    backend = AnalyticBackend(headroom_bytes=headroom)
    records = []
    for i, layout in enumerate(layouts):
        m = backend.evaluate(job, layout)
        records.append(TrialRecord(number=i, origin="search", measurement=m, feasible=m.status == "ok",
                                   capacity_bytes=capacity))
    return SearchResult(job=job, records=tuple(records), capacity_bytes=capacity, headroom_bytes=headroom,
                        mode="search", backend="analytic", seed=0, space_size=len(layouts), output_dir="runs/x")
