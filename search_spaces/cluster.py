"""Immutable GPU, interconnect and cluster specs. Catalog entries live in `gpus.py`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from search_spaces.units import GIB

__all__ = ["GPUSpec", "LinkSpec", "ClusterSpec", "Arch", "ARCHES", "MAX_WORLD_SIZE"]

Arch = Literal["ampere", "hopper", "blackwell"]
ARCHES: tuple[str, ...] = ("ampere", "hopper", "blackwell")

_ARCH_CAPABILITY: dict[str, tuple[int, int]] = {"ampere": (8, 0), "hopper": (9, 0), "blackwell": (10, 0)}
MAX_WORLD_SIZE = 2**20  # GPUs in one job: far above the largest clusters (~10^5), and keeps divisor loops instant
MAX_GPUS_PER_NODE = 1024
MAX_MEMORY_BYTES = 2**50  # 1 PiB per GPU
MAX_FLOPS = 1e18  # per GPU, any precision (and SFU operations per second)
MAX_BYTES_PER_S = 1e15
MAX_WATTS = 1e5


def _positive_number(owner: str, name: str, value: object, *, upper: float = math.inf, zero_ok: bool = False) -> None:
    """A finite real number > 0 (>= 0 with `zero_ok`) and at most `upper`; ValueError naming the field otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{owner}: `{name}` must be a number, but got {value!r}.")
    low_ok = value >= 0 if zero_ok else value > 0
    if not (math.isfinite(value) and low_ok and value <= upper):
        bound = ">= 0" if zero_ok else "> 0"
        raise ValueError(f"{owner}: `{name} {bound}` must hold for a finite number"
                         f"{f' at most {upper:.3g}' if upper < math.inf else ''}, but got ({name}={value!r}).")


def _whole_number(owner: str, name: str, value: object, *, unit: str = "", upper: int) -> None:
    """An int (not a bool) in [1, upper]; ValueError naming the field otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{owner}: `{name}` must be a whole number{unit}, but got {value!r}.")
    if not 0 < value <= upper:
        raise ValueError(f"{owner}: `0 < {name} <= {upper:,}` must hold, but got ({name}={value!r}).")


def _check_name(owner: str, value: object) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{owner}: `name` must be a non-empty text, but got {value!r}.")


@dataclass(frozen=True, kw_only=True, slots=True)
class GPUSpec:
    """One accelerator as its spec sheet describes it; `source` names the sheet (and any other origin) of every figure.

    FLOP/s are dense (no sparsity) peaks. Bandwidths are bytes/s, in one direction where a link has two. The node
    shape (`gpus_per_node`, `nvlink_domain_gpus`) is the product's: 8 GPUs on one NVLink fabric for HGX/DGX boards,
    4-GPU compute trays in a 72-GPU NVLink rack for GB200/GB300 NVL72. `build_cluster` takes its defaults from it."""

    name: str
    memory_bytes: int
    """HBM as software sees it (`nvidia-smi` total, `torch.cuda.get_device_properties().total_memory`)."""
    bf16_flops: float
    """Dense BF16 tensor-core peak, FLOP/s."""
    fp8_flops: float | None
    """Dense FP8 tensor-core peak, FLOP/s; None where the GPU has no FP8 tensor cores (Ampere)."""
    hbm_bytes_per_s: float
    """Peak HBM bandwidth, bytes/s."""
    source: str
    arch: Arch = "hopper"  # the tensor-core generation: which FP8 recipes run, what Transformer Engine caches
    aliases: tuple[str, ...] = ()
    # as torch reports the device on the node (`torch.cuda.get_device_name`, `get_device_capability`), which
    # megatron-core and Megatron-Bridge test in their checks (e.g. DeepEP on "NVIDIA B200" but not GB200);
    # None: "NVIDIA <NAME>" and the architecture's compute capability
    device_name: str | None = None
    compute_capability: tuple[int, int] | None = None
    fp4_flops: float | None = None
    """Dense NVFP4 tensor-core peak, FLOP/s; None where the GPU has no FP4 tensor cores (Hopper, Ampere)."""
    sfu_exp_per_s: float | None = None
    """Special-function-unit exponentials (MUFU.EX2) per second: what bounds softmax in attention; None: unknown."""
    fp32_flops: float | None = None
    """Dense FP32 peak of the CUDA cores (not the tensor cores), FLOP/s: what bounds Mamba-2's scan; None: unknown."""
    tdp_watts: float | None = None
    """Maximum board/module power (TDP / TGP), watts; None: unknown."""
    host_link_bytes_per_s: float | None = None
    """GPU <-> host bandwidth per direction, bytes/s (PCIe x16 or NVLink-C2C); None: unknown."""
    host_memory_bytes: int | None = None
    """CPU memory per GPU for offloading, bytes (Grace LPDDR5X share); None where the product does not fix the host."""
    gpus_per_node: int = 8
    """GPUs in one node (one OS image) of the product: 8 on HGX/DGX boards, 4 on an NVL72 compute tray."""
    nvlink_domain_gpus: int | None = None
    """GPUs on one NVLink fabric, a multiple of gpus_per_node: 72 on an NVL72 rack; None: the node."""

    def __post_init__(self) -> None:
        owner = f"GPU {self.name!r}"
        _check_name(owner, self.name)
        _whole_number(owner, "memory_bytes", self.memory_bytes, unit=" of bytes", upper=MAX_MEMORY_BYTES)
        _positive_number(owner, "bf16_flops", self.bf16_flops, upper=MAX_FLOPS)
        optional = (("fp8_flops", MAX_FLOPS), ("fp4_flops", MAX_FLOPS), ("sfu_exp_per_s", MAX_FLOPS),
                    ("fp32_flops", MAX_FLOPS), ("tdp_watts", MAX_WATTS), ("host_link_bytes_per_s", MAX_BYTES_PER_S))
        for field_name, upper in optional:
            value = getattr(self, field_name)
            if value is not None:
                _positive_number(owner, field_name, value, upper=upper)
        _positive_number(owner, "hbm_bytes_per_s", self.hbm_bytes_per_s, upper=MAX_BYTES_PER_S)
        if self.host_memory_bytes is not None:
            _whole_number(owner, "host_memory_bytes", self.host_memory_bytes, unit=" of bytes", upper=MAX_MEMORY_BYTES)
        if self.arch not in ARCHES:
            raise ValueError(f"{owner}: `arch` must be one of {', '.join(ARCHES)}, but got {self.arch!r}.")
        _whole_number(owner, "gpus_per_node", self.gpus_per_node, upper=MAX_GPUS_PER_NODE)
        domain = self.nvlink_domain_gpus
        if domain is not None:
            _whole_number(owner, "nvlink_domain_gpus", domain, upper=MAX_WORLD_SIZE)
            if domain % self.gpus_per_node:
                raise ValueError(f"{owner}: `nvlink_domain_gpus % gpus_per_node == 0` must hold (an NVLink domain is "
                                 f"whole nodes), but got (nvlink_domain_gpus={domain}, "
                                 f"gpus_per_node={self.gpus_per_node}).")
        cc = self.compute_capability
        if cc is not None and (not isinstance(cc, tuple) or len(cc) != 2
                               or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in cc)):
            raise ValueError(f"{owner}: `compute_capability` must be (major, minor) whole numbers, but got {cc!r}.")
        if self.device_name is not None and (not isinstance(self.device_name, str) or not self.device_name.strip()):
            raise ValueError(f"{owner}: `device_name` must be a non-empty text or None, but got {self.device_name!r}.")

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB

    @property
    def torch_device_name(self) -> str:
        return self.device_name or f"NVIDIA {self.name.upper()}"

    @property
    def capability(self) -> tuple[int, int]:
        """The CUDA compute capability (major, minor): sm80 Ampere, sm90 Hopper, sm100 Blackwell, sm103 Blackwell
        Ultra (B300/GB300)."""
        return self.compute_capability or _ARCH_CAPABILITY[self.arch]

    def peak_flops(self, precision: str) -> float:
        """Dense peak for the GEMM precision; FP8 (FP4) on a GPU without FP8 (FP4) units is a user error."""
        if precision == "fp8":
            if self.fp8_flops is None:
                raise ValueError(f"GPU {self.name} has no FP8 tensor cores; use --precision bf16.")
            return self.fp8_flops
        if precision == "fp4":
            if self.fp4_flops is None:
                raise ValueError(f"GPU {self.name} has no FP4 tensor cores.")
            return self.fp4_flops
        return self.bf16_flops


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkSpec:
    """An interconnect as one GPU sees it: unidirectional bandwidth per GPU and one-message latency."""

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float
    source: str
    aliases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        owner = f"link {self.name!r}"
        _check_name(owner, self.name)
        _positive_number(owner, "bandwidth_bytes_per_s", self.bandwidth_bytes_per_s, upper=1e15)
        _positive_number(owner, "latency_s", self.latency_s, upper=1.0, zero_ok=True)


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterSpec:
    """nodes x gpus_per_node GPUs of one type, NVLink-class links inside an NVLink domain, a network between domains.

    `nvlink_domain_gpus` is how many consecutive GPUs share one NVLink fabric: a node's GPUs on HGX/DGX systems
    (None, the default), 72 on a GB200 / GB300 NVL72 rack of 18 four-GPU nodes (`build_cluster` takes both from
    the GPU's `GPUSpec.gpus_per_node` / `nvlink_domain_gpus`). Groups that stay inside a domain use the
    `intra_node` link; only groups that leave it cross `inter_node`."""

    nodes: int
    gpus_per_node: int = 8
    gpu: GPUSpec
    intra_node: LinkSpec
    inter_node: LinkSpec
    nvlink_domain_gpus: int | None = None

    def __post_init__(self) -> None:
        for name in ("nodes", "gpus_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"`{name}` must be a whole number, but got ({name}={value!r}).")
            if value <= 0:
                raise ValueError(f"`{name} > 0` must hold, but got ({name}={value}).")
        if self.gpus_per_node > MAX_GPUS_PER_NODE:
            raise ValueError(f"`gpus_per_node <= {MAX_GPUS_PER_NODE}` must hold, but got "
                             f"(gpus_per_node={self.gpus_per_node}).")
        if self.nodes * self.gpus_per_node > MAX_WORLD_SIZE:
            raise ValueError(f"`nodes * gpus_per_node <= {MAX_WORLD_SIZE:,}` GPUs must hold, but got "
                             f"({self.nodes:,} * {self.gpus_per_node} = {self.nodes * self.gpus_per_node:,}).")
        domain = self.nvlink_domain_gpus
        if domain is not None and (isinstance(domain, bool) or not isinstance(domain, int) or domain <= 0
                                   or domain % self.gpus_per_node):
            raise ValueError(f"the NVLink domain ({domain!r} GPUs) must be a positive multiple of gpus_per_node "
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
