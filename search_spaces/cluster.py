"""Immutable GPU, interconnect and cluster specs. Catalog entries live in `gpus.py`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["GPUSpec", "LinkSpec", "ClusterSpec", "Arch", "ARCHES"]

Arch = Literal["ampere", "hopper", "blackwell"]
ARCHES: tuple[str, ...] = ("ampere", "hopper", "blackwell")

GIB = 1024**3


@dataclass(frozen=True, kw_only=True, slots=True)
class GPUSpec:
    """One accelerator. FLOP/s are dense (no sparsity) peaks; `source` names the datasheet."""

    name: str
    memory_bytes: int
    bf16_flops: float
    fp8_flops: float | None  # None: no FP8 tensor cores (A100)
    hbm_bytes_per_s: float
    source: str
    arch: Arch = "hopper"  # the tensor-core generation: which FP8 recipes run, what Transformer Engine caches
    aliases: tuple[str, ...] = ()

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB

    def peak_flops(self, precision: str) -> float:
        """Dense peak for the GEMM precision; FP8 on a GPU without FP8 units is a user error."""
        if precision == "fp8":
            if self.fp8_flops is None:
                raise ValueError(f"GPU {self.name} has no FP8 tensor cores; use --precision bf16.")
            return self.fp8_flops
        return self.bf16_flops


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkSpec:
    """An interconnect as one GPU sees it: unidirectional bandwidth per GPU and one-message latency."""

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float
    source: str
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterSpec:
    """nodes x gpus_per_node GPUs of one type, NVLink-class links inside an NVLink domain, a network between domains.

    `nvlink_domain_gpus` is how many consecutive GPUs share one NVLink fabric: a node's GPUs on HGX/DGX systems
    (None, the default), 72 on a GB200 NVL72 rack of 18 four-GPU nodes. Groups that stay inside a domain use the
    `intra_node` link; only groups that leave it cross `inter_node`."""

    nodes: int
    gpus_per_node: int = 8
    gpu: GPUSpec
    intra_node: LinkSpec
    inter_node: LinkSpec
    nvlink_domain_gpus: int | None = None

    def __post_init__(self) -> None:
        if self.nodes <= 0:
            raise ValueError(f"`nodes > 0` must hold, but got (nodes={self.nodes}).")
        if self.gpus_per_node <= 0:
            raise ValueError(f"`gpus_per_node > 0` must hold, but got (gpus_per_node={self.gpus_per_node}).")
        domain = self.nvlink_domain_gpus
        if domain is not None and (domain <= 0 or domain % self.gpus_per_node):
            raise ValueError(f"the NVLink domain ({domain} GPUs) must be a positive multiple of gpus_per_node "
                             f"({self.gpus_per_node}).")

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def nvlink_domain(self) -> int:
        """GPUs one NVLink fabric connects, capped at the cluster (a node's GPUs unless the spec says more)."""
        return min(self.nvlink_domain_gpus or self.gpus_per_node, self.world_size)

    def link_for_group(self, group_size: int, stride: int = 1) -> LinkSpec:
        """The slowest link a communication group crosses.

        Ranks are laid out tp-cp-ep-dp-pp (TP innermost); a group of `group_size` ranks spaced
        `stride` apart spans `group_size * stride` consecutive ranks, which stays inside one NVLink
        domain when that span is at most `nvlink_domain`.
        """
        if group_size <= 1 or group_size * stride <= self.nvlink_domain:
            return self.intra_node
        return self.inter_node
