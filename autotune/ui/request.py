"""The one request for a job: what the CLI's flags and the Python API's keywords both build, and every verb runs.

    request = JobRequest(model="mixtral", nodes=4)                 # the API: autotune.search("mixtral", nodes=4)
    request = JobRequest.from_args(args)                           # the CLI: python -m autotune --model mixtral ...
    job = request.job()                                            # the same Job from the same inputs

`JobOptions` names the job's parts every API call takes as keywords (`autotune.search`, `estimate`, `profile`,
`make_job`); the CLI's job flags are the same names. A part left out (None) takes the documented default: the
catalog's model, one node of 8 H100 on InfiniBand NDR, `DEFAULT_SEQ_LENGTH`, `DEFAULT_GLOBAL_BATCH_SIZE`, BF16,
and Megatron-Bridge's performance configs for every other training field (`search_spaces/training.py`).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from search_spaces.cluster import ClusterSpec
from search_spaces.job import Job
from search_spaces.model import ModelSpec
from search_spaces.training import TRAINING_FIELDS, training_spec

__all__ = ["JobOptions", "JOB_OPTIONS", "JobRequest", "DEFAULT_SEQ_LENGTH", "DEFAULT_GLOBAL_BATCH_SIZE"]

DEFAULT_SEQ_LENGTH = 4096
DEFAULT_GLOBAL_BATCH_SIZE = 256
CLUSTER_OPTIONS = ("nodes", "gpus_per_node", "gpu", "intra_node", "inter_node")


class JobOptions(TypedDict, total=False):
    """The job's parts by keyword (each optional): the cluster (a `ClusterSpec` or a YAML path, or the parts of one),
    the sequence, batch and precision, and further `TrainingSpec` fields by name in `training`."""

    cluster: ClusterSpec | str | Path | None
    nodes: int | None
    gpus_per_node: int | None
    gpu: Any
    intra_node: Any
    inter_node: Any
    seq_length: int | None
    global_batch_size: int | None
    precision: str | None
    training: Mapping[str, Any] | None


JOB_OPTIONS: tuple[str, ...] = tuple(JobOptions.__annotations__)


@dataclass(frozen=True, kw_only=True)
class JobRequest:
    """A job as asked for: the model (a catalog name, a config.json path or a `ModelSpec`) and its `JobOptions`."""

    model: str | Path | ModelSpec
    cluster: ClusterSpec | str | Path | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    gpu: Any = None
    intra_node: Any = None
    inter_node: Any = None
    seq_length: int | None = None
    global_batch_size: int | None = None
    precision: str | None = None
    training: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "training", dict(self.training or {}))  # a copy: the request does not change

    @classmethod
    def of(cls, model: str | Path | ModelSpec, options: Mapping[str, Any]) -> JobRequest:
        """A request from the API's keywords (`JobOptions`); an unknown keyword is a ValueError naming it."""
        unknown = sorted(set(options) - set(JOB_OPTIONS))
        if unknown:
            raise ValueError(f"unknown job option(s) {unknown}; options are {list(JOB_OPTIONS)}.")
        given = {k: v for k, v in options.items() if v is not None}
        return cls(model=model, **given)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> JobRequest:
        """A request from the CLI's job flags (`--model`, the cluster flags, `--cluster YAML`, the training flags)."""
        training = {name: getattr(args, name, None) for name in TRAINING_FIELDS}
        return cls(model=args.model, cluster=args.cluster, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                   gpu=args.gpu, intra_node=args.intra_node, inter_node=args.inter_node,
                   training={k: v for k, v in training.items() if v is not None})

    def job(self) -> Job:
        """The `Job`: the model resolved (`autotune.ui.models.resolve`), the cluster built or read
        (`autotune.ui.clusters.resolve`), the training spec with the defaults filled in. ValueError (one line) for
        bad input."""
        from autotune.ui import clusters, models

        try:
            spec = models.resolve(self.model)
        except (TypeError, KeyError, AttributeError, OverflowError, ZeroDivisionError) as e:
            # a config.json whose values have the wrong types: bad input, one line
            raise ValueError(f"--model {self.model}: not a usable model config ({type(e).__name__}: {e}).") from None
        cluster = clusters.resolve(self.cluster, **{k: getattr(self, k) for k in CLUSTER_OPTIONS})
        values = {"seq_length": DEFAULT_SEQ_LENGTH, "global_batch_size": DEFAULT_GLOBAL_BATCH_SIZE,
                  "precision": "bf16", **self.training}
        for name in ("seq_length", "global_batch_size", "precision"):
            if getattr(self, name) is not None:
                values[name] = getattr(self, name)
        return Job(model=spec, cluster=cluster, training=training_spec(**values))
