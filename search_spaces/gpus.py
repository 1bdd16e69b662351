"""GPU and interconnect catalog, and `build_cluster` (flags > YAML file > defaults).

FLOP/s are dense peaks (NVIDIA datasheets print sparse figures with a footnote; dense is half).
Memory is the nominal HBM size in GiB as `nvidia-smi` reports it (A100 80GB: 81920 MiB), before the
CUDA context and allocator reserve, which the memory model subtracts. Link bandwidth is per GPU,
unidirectional, in bytes/s (NVLink's "900 GB/s" is bidirectional: 450 GB/s each way). Latency is an
assumed order-of-magnitude per-message cost of one NCCL step on that link, not a datasheet figure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from search_spaces.cluster import ARCHES, GIB, ClusterSpec, GPUSpec, LinkSpec

__all__ = ["get_gpu", "get_link", "list_gpus", "list_links", "default_intra_node", "build_cluster"]

TERA = 1e12
MIB = 1024**2
GB_PER_S = 1e9  # datasheet "GB/s" is decimal
GBIT_PER_S = 1e9 / 8

# --- GPUs ----------------------------------------------------------------------------------
H100_SXM = GPUSpec(
    arch="hopper", name="h100-sxm", device_name="NVIDIA H100 80GB HBM3",
    aliases=("h100", "h100-80gb", "h100-sxm-80gb", "h100-sxm5"),
    memory_bytes=81559 * MIB, bf16_flops=989.4 * TERA, fp8_flops=1978.9 * TERA, hbm_bytes_per_s=3.35e12,
    source="NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): BF16 1,979 TFLOPS and FP8 3,958 TFLOPS with "
           "sparsity (dense half: 989.4 / 1978.9), 80 GB HBM3, 3.35 TB/s; an '80 GB' H100 shows 81,559 MiB "
           "(79.6 GiB) to software (nvidia-smi, torch.cuda.mem_get_info)",
)
H200 = GPUSpec(
    arch="hopper", name="h200", device_name="NVIDIA H200", aliases=("h200-sxm", "h200-141gb", "h200-sxm-141gb"),
    memory_bytes=141 * GIB, bf16_flops=989.4 * TERA, fp8_flops=1978.9 * TERA, hbm_bytes_per_s=4.8e12,
    source="NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): BF16 1,979 TFLOPS and FP8 3,958 TFLOPS with "
           "sparsity (dense half), 141 GB HBM3e, 4.8 TB/s",
)
A100_80GB = GPUSpec(
    arch="ampere", name="a100-80gb", device_name="NVIDIA A100-SXM4-80GB",
    aliases=("a100", "a100-sxm", "a100-sxm-80gb", "a100-sxm4-80gb"),
    memory_bytes=80 * GIB, bf16_flops=312 * TERA, fp8_flops=None, hbm_bytes_per_s=2.039e12,
    source="NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM): BF16 312 TFLOPS dense (624 sparse), "
           "no FP8, 80 GB HBM2e, 2,039 GB/s",
)
A100_40GB = GPUSpec(
    arch="ampere", name="a100-40gb", device_name="NVIDIA A100-SXM4-40GB", aliases=("a100-sxm-40gb", "a100-sxm4-40gb"),
    memory_bytes=40 * GIB, bf16_flops=312 * TERA, fp8_flops=None, hbm_bytes_per_s=1.555e12,
    source="NVIDIA A100 Tensor Core GPU datasheet (A100 40GB SXM): BF16 312 TFLOPS dense (624 sparse), "
           "no FP8, 40 GB HBM2, 1,555 GB/s",
)
B200 = GPUSpec(
    arch="blackwell", name="b200", device_name="NVIDIA B200", aliases=("b200-sxm", "hgx-b200", "dgx-b200"),
    memory_bytes=180 * GIB, bf16_flops=2250 * TERA, fp8_flops=4500 * TERA, hbm_bytes_per_s=8e12,
    source="NVIDIA DGX B200 / HGX B200 datasheets (8 GPUs): FP16/BF16 36 PFLOPS and FP8 72 PFLOPS with "
           "sparsity -> 2.25 / 4.5 PFLOPS dense per GPU; 1,440 GB HBM3e -> 180 GB, 64 TB/s -> 8 TB/s per GPU",
)
GB200 = GPUSpec(
    arch="blackwell", name="gb200", device_name="NVIDIA GB200", aliases=("gb200-nvl72", "gb200-nvl"),
    memory_bytes=186 * GIB, bf16_flops=2500 * TERA, fp8_flops=5000 * TERA, hbm_bytes_per_s=8e12,
    source="NVIDIA GB200 NVL72 datasheet (72 GPUs): FP16/BF16 360 PFLOPS and FP8 720 PFLOPS with sparsity "
           "-> 2.5 / 5 PFLOPS dense per GPU; 13.4 TB HBM3e -> 186 GB, 576 TB/s -> 8 TB/s per GPU",
)
_GPUS: tuple[GPUSpec, ...] = (H100_SXM, H200, A100_80GB, A100_40GB, B200, GB200)

# --- links ---------------------------------------------------------------------------------
_LATENCY_SOURCE = "latency: assumed order of one NCCL step (not a datasheet figure)"
NVLINK3 = LinkSpec(
    name="nvlink3", aliases=("nvlink-3", "nvlink3.0"), bandwidth_bytes_per_s=300 * GB_PER_S, latency_s=3e-6,
    source=f"NVIDIA A100 datasheet: NVLink 600 GB/s per GPU bidirectional -> 300 GB/s each way; {_LATENCY_SOURCE}",
)
NVLINK4 = LinkSpec(
    name="nvlink4", aliases=("nvlink-4", "nvlink4.0"), bandwidth_bytes_per_s=450 * GB_PER_S, latency_s=3e-6,
    source=f"NVIDIA H100/H200 datasheets: NVLink 900 GB/s per GPU bidirectional -> 450 GB/s each way; "
           f"{_LATENCY_SOURCE}",
)
NVLINK5 = LinkSpec(
    name="nvlink5", aliases=("nvlink-5", "nvlink5.0"), bandwidth_bytes_per_s=900 * GB_PER_S, latency_s=3e-6,
    source=f"NVIDIA HGX B200 / GB200 NVL72 datasheets: NVLink 1.8 TB/s per GPU bidirectional -> 900 GB/s each way; "
           f"{_LATENCY_SOURCE}",
)
IB_NDR = LinkSpec(
    name="ib-ndr", aliases=("ndr", "infiniband-ndr", "ib-ndr400"), bandwidth_bytes_per_s=400 * GBIT_PER_S,
    latency_s=5e-6,
    source=f"NVIDIA DGX H100 datasheet: 8x ConnectX-7 400 Gb/s InfiniBand NDR per node = 400 Gb/s (50 GB/s) "
           f"per GPU each way; {_LATENCY_SOURCE}",
)
IB_HDR = LinkSpec(
    name="ib-hdr", aliases=("hdr", "infiniband-hdr", "ib-hdr200"), bandwidth_bytes_per_s=200 * GBIT_PER_S,
    latency_s=5e-6,
    source=f"NVIDIA DGX A100 datasheet (as in Selene): 8x ConnectX-6 200 Gb/s InfiniBand HDR per node = 200 Gb/s "
           f"(25 GB/s) per GPU each way; {_LATENCY_SOURCE}",
)
ROCE_400G = LinkSpec(
    name="roce-400g", aliases=("roce", "roce400"), bandwidth_bytes_per_s=400 * GBIT_PER_S, latency_s=8e-6,
    source=f"RoCEv2 with one 400 GbE NIC per GPU (ConnectX-7 / BlueField-3, as in Meta's Llama 3 RoCE clusters, "
           f"arXiv 2407.21783 sec. 3.3) = 50 GB/s per GPU each way; {_LATENCY_SOURCE}",
)
ETHERNET_100G = LinkSpec(
    name="ethernet-100g", aliases=("eth-100g", "ethernet", "100g"), bandwidth_bytes_per_s=100 * GBIT_PER_S / 8,
    latency_s=20e-6,
    source="assumption: one 100 GbE NIC per node (TCP sockets) shared by 8 GPUs = 12.5 Gb/s (1.5625 GB/s) per GPU "
           f"each way; {_LATENCY_SOURCE}",
)
_LINKS: tuple[LinkSpec, ...] = (NVLINK3, NVLINK4, NVLINK5, IB_NDR, IB_HDR, ROCE_400G, ETHERNET_100G)

# The NVLink generation each catalog GPU ships with (the default intra-node link).
_NVLINK_OF_GPU: dict[str, LinkSpec] = {
    "h100-sxm": NVLINK4, "h200": NVLINK4, "a100-80gb": NVLINK3, "a100-40gb": NVLINK3, "b200": NVLINK5, "gb200": NVLINK5,
}

# (GPUs per node, GPUs per NVLink domain) where a GPU ships in a shape other than 8-GPU HGX nodes: GB200 NVL72,
# 18 compute trays of 2 Grace CPUs + 4 Blackwell GPUs on one NVLink switch fabric (NVIDIA GB200 NVL72 datasheet)
_NODE_SHAPE: dict[str, tuple[int, int | None]] = {"gb200": (4, 72)}

DEFAULT_NODES = 1
DEFAULT_GPUS_PER_NODE = 8
DEFAULT_GPU = "h100"
DEFAULT_INTER_NODE = "ib-ndr"
_YAML_KEYS = ("nodes", "gpus_per_node", "gpu", "intra_node", "inter_node")


def list_gpus() -> list[GPUSpec]:
    return list(_GPUS)


def list_links() -> list[LinkSpec]:
    return list(_LINKS)


def _lookup(kind: str, name: str, entries: tuple[GPUSpec, ...] | tuple[LinkSpec, ...]):
    key = name.strip().lower().replace("_", "-")
    for entry in entries:
        if key == entry.name or key in entry.aliases:
            return entry
    known = ", ".join(f"{e.name} ({', '.join(e.aliases)})" if e.aliases else e.name for e in entries)
    raise ValueError(f"Unknown {kind} {name!r}; use one of: {known}.")


def get_gpu(name: str) -> GPUSpec:
    """A catalog GPU by name or alias, case-insensitive (`h100`, `H100-SXM`, `a100-80gb`)."""
    return _lookup("GPU", name, _GPUS)


def get_link(name: str) -> LinkSpec:
    """A catalog interconnect by name or alias, case-insensitive (`nvlink4`, `ib-ndr`, `ethernet-100g`)."""
    return _lookup("link", name, _LINKS)


def default_intra_node(gpu: GPUSpec) -> LinkSpec:
    """The NVLink generation a catalog GPU ships with; a GPU given inline in YAML must name its intra_node link."""
    link = _NVLINK_OF_GPU.get(gpu.name)
    if link is None:
        raise ValueError(
            f"GPU {gpu.name!r} is not in the catalog, so its NVLink generation is unknown; "
            f"give intra_node (one of {', '.join(known.name for known in _LINKS)})."
        )
    return link


# --- YAML ------------------------------------------------------------------------------------
def _spec_from_mapping(cls: type, mapping: Mapping[str, Any], where: str):
    """A GPUSpec or LinkSpec from an inline YAML mapping of its fields; numbers may be strings like 989.4e12."""
    allowed = {f.name: f for f in fields(cls)}
    unknown = sorted(map(str, set(mapping) - set(allowed)))
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; allowed keys are {sorted(allowed)}.")
    values: dict[str, Any] = {"source": f"user-defined in {where}"}
    for key, value in mapping.items():
        if key in ("name", "source", "device_name"):
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise ValueError(f"{where}: `{key}` must be a text, but got {value!r}.")
            values[key] = str(value)
        elif key == "arch":
            if value not in ARCHES:
                raise ValueError(f"{where}: `arch` must be one of {', '.join(ARCHES)}, but got {value!r}.")
            values[key] = value
        elif key == "aliases":
            if not isinstance(value, (list, tuple)) or not all(isinstance(a, str) for a in value):
                raise ValueError(f"{where}: `aliases` must be a list of names, but got {value!r}.")
            values[key] = tuple(a.lower() for a in value)
        elif key == "compute_capability":
            if (not isinstance(value, (list, tuple)) or len(value) != 2
                    or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)):
                raise ValueError(f"{where}: `compute_capability` must be [major, minor] (e.g. [9, 0]), but got "
                                 f"{value!r}.")
            values[key] = tuple(value)
        elif value is None:
            values[key] = None
        else:
            values[key] = _yaml_number(value, key, where)
    missing = sorted(
        name for name, f in allowed.items()
        if name not in values and f.default is MISSING and f.default_factory is MISSING
    )
    if missing:
        raise ValueError(f"{where}: missing keys {missing} for an inline {cls.__name__}.")
    return cls(**values)


def _yaml_number(value: Any, key: str, where: str) -> float | int:
    """A finite number from YAML (numbers may be strings like '989.4e12'); memory_bytes a whole number."""
    import math

    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{where}: `{key}` must be a number, but got {value!r}.")
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{where}: `{key}` must be a number, but got {value!r}.") from None
    if not math.isfinite(number):
        raise ValueError(f"{where}: `{key}` must be a finite number, but got {value!r}.")
    if key == "memory_bytes":
        if number != int(number):
            raise ValueError(f"{where}: `memory_bytes` must be a whole number of bytes, but got {value!r}.")
        return int(number)
    return number


def _read_cluster_yaml(path: str | Path) -> dict[str, Any]:
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"Cannot read cluster YAML {str(path)!r}: {err.strerror or err}.") from None
    except UnicodeDecodeError:
        raise ValueError(f"Cluster YAML {str(path)!r} is not UTF-8 text.") from None
    try:
        data = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError) as err:
        raise ValueError(f"Cluster YAML {str(path)!r} is not valid YAML: {' '.join(str(err).split())}.") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"Cluster YAML {str(path)!r} must be a mapping with keys {list(_YAML_KEYS)}.")
    unknown = sorted(map(str, set(data) - set(_YAML_KEYS)))
    if unknown:
        raise ValueError(f"Cluster YAML {str(path)!r}: unknown keys {unknown}; allowed keys are {list(_YAML_KEYS)}.")
    return data


def _as_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"`{key}` must be a whole number, but got ({key}={value!r}).")
    if value <= 0:
        raise ValueError(f"`{key} > 0` must hold, but got ({key}={value}).")
    return value


def _resolve_gpu(value: Any, where: str) -> GPUSpec:
    if isinstance(value, GPUSpec):
        return value
    if isinstance(value, Mapping):
        return _spec_from_mapping(GPUSpec, value, f"{where} gpu")
    if not isinstance(value, str):
        raise ValueError(f"{where}: `gpu` must be a catalog name or a mapping of GPU fields, but got {value!r}.")
    return get_gpu(value)


def _resolve_link(value: Any, where: str, key: str) -> LinkSpec:
    if isinstance(value, LinkSpec):
        return value
    if isinstance(value, Mapping):
        return _spec_from_mapping(LinkSpec, value, f"{where} {key}")
    if not isinstance(value, str):
        raise ValueError(f"{where}: `{key}` must be a catalog name or a mapping of link fields, but got {value!r}.")
    return get_link(value)


def build_cluster(
    *,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    gpu: str | GPUSpec | None = None,
    intra_node: str | LinkSpec | None = None,
    inter_node: str | LinkSpec | None = None,
    yaml_path: str | Path | None = None,
) -> ClusterSpec:
    """A ClusterSpec: explicit (non-None) arguments win, then the YAML file's keys, then the defaults
    (1 node, 8 GPUs per node, h100, the GPU's NVLink generation, ib-ndr).

    The YAML holds any of `nodes, gpus_per_node, gpu, intra_node, inter_node`; `gpu` (and the links)
    may be a catalog name or an inline mapping of GPUSpec (LinkSpec) fields.
    """
    from_yaml = _read_cluster_yaml(yaml_path) if yaml_path is not None else {}
    where = f"cluster YAML {str(yaml_path)!r}" if yaml_path is not None else "arguments"

    def pick(key: str, explicit: Any, default: Any) -> Any:
        if explicit is not None:
            return explicit
        return from_yaml[key] if from_yaml.get(key) is not None else default

    gpu_spec = _resolve_gpu(pick("gpu", gpu, DEFAULT_GPU), where)
    intra = pick("intra_node", intra_node, None)
    intra_spec = default_intra_node(gpu_spec) if intra is None else _resolve_link(intra, where, "intra_node")
    gpn_default, domain = _NODE_SHAPE.get(gpu_spec.name, (DEFAULT_GPUS_PER_NODE, None))
    gpn = _as_int(pick("gpus_per_node", gpus_per_node, gpn_default), "gpus_per_node")
    return ClusterSpec(
        nodes=_as_int(pick("nodes", nodes, DEFAULT_NODES), "nodes"),
        gpus_per_node=gpn,
        nvlink_domain_gpus=domain if (domain and domain % gpn == 0) else None,
        gpu=gpu_spec,
        intra_node=intra_spec,
        inter_node=_resolve_link(pick("inter_node", inter_node, DEFAULT_INTER_NODE), where, "inter_node"),
    )
