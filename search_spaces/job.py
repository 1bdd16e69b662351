"""A training job: the model, the cluster and the training settings, independent of the layout."""

from __future__ import annotations

from dataclasses import dataclass

from search_spaces.cluster import ClusterSpec
from search_spaces.layout import TrainingSpec
from search_spaces.model import ModelSpec

__all__ = ["Job"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec

    @property
    def world_size(self) -> int:
        return self.cluster.world_size
