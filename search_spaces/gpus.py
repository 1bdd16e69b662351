"""GPU and interconnect catalog, and `build_cluster` (flags > YAML file > defaults).

FLOP/s are dense peaks (NVIDIA datasheets print sparse figures with a footnote; dense is half, except
Blackwell Ultra's FP4, for which NVIDIA prints its own dense figure).
Memory is the HBM size as `nvidia-smi` / torch report it (H100 80GB: 81,559 MiB; GB300: 284,208 MiB),
before the CUDA context and allocator reserve, which the memory model subtracts. Each GPU carries its
product's node shape (8 per HGX/DGX node; 4 per tray and 72 per NVLink domain on GB200/GB300 NVL72),
which `build_cluster` uses as its default. Link bandwidth is per GPU,
unidirectional, in bytes/s (NVLink's "900 GB/s" is bidirectional: 450 GB/s each way). Latency is an
assumed order-of-magnitude per-message cost of one NCCL step on that link, not a datasheet figure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from search_spaces.cluster import ARCHES, ClusterSpec, GPUSpec, LinkSpec
from search_spaces.units import GIB

__all__ = ["get_gpu", "get_link", "list_gpus", "list_links", "default_intra_node", "build_cluster"]

TERA = 1e12
MIB = 1024**2
GB_PER_S = 1e9  # datasheet "GB/s" is decimal
GBIT_PER_S = 1e9 / 8

# --- GPUs ----------------------------------------------------------------------------------
# Shared source text. NVIDIA's datasheets print tensor-core peaks "with sparsity" (a footnote); dense is half of
# that for BF16 and FP8 on every GPU here, and for FP4 on Blackwell, but not for FP4 on Blackwell Ultra, where
# NVIDIA prints dense and sparse figures of its own (15 | 20 PFLOPS on GB300).
_HOPPER_SFU = ("SFU exponentials 4.5e12/s: the Hopper column of the Hopper / Blackwell / Blackwell Ultra table in "
               "NVIDIA's technical blog 'Inside NVIDIA Blackwell Ultra: The Chip Powering the AI Factory Era' "
               "(attention acceleration, SFU EX2: 4.5 / 5 / 10.7 TeraExponentials/s); cross-check from the H100's own "
               "clocks: 132 SMs x 16 MUFU.EX2 per SM per clock (CUDA C++ Programming Guide, arithmetic-instruction "
               "throughput, compute capability 9.0) x 1.98 GHz boost = 4.18e12/s")
_BLACKWELL_SFU = ("SFU exponentials 5e12/s: the Blackwell column of the table in NVIDIA's blog 'Inside NVIDIA "
                  "Blackwell Ultra' (SFU EX2 5 TeraExponentials/s; NVIDIA's blog 'Making Softmax More Efficient with "
                  "NVIDIA Blackwell Ultra' measures 4,943 Gop/s of FP32 exp2 on GB200)")
_ULTRA_SFU = ("SFU exponentials 10.7e12/s: NVIDIA's blog 'Inside NVIDIA Blackwell Ultra' (attention-layer "
              "acceleration: SFU EX2 10.7 TeraExponentials/s, twice Blackwell's 5; 'Making Softmax More Efficient with "
              "NVIDIA Blackwell Ultra' measures 10,024 Gop/s of FP32 exp2 on GB300)")
_PCIE5 = "host link PCIe Gen5 x16, 128 GB/s bidirectional -> 64 GB/s each way"
_HGX_SHAPE = ("node shape: 8 GPUs per HGX/DGX board, the board is the NVLink domain; host memory: the server's, "
              "not fixed by the GPU")
_C2C = ("host link NVLink-C2C to the Grace CPU, 900 GB/s bidirectional -> 450 GB/s each way (NVIDIA quotes it per "
        "superchip of 1 Grace + 2 GPUs and does not say whether the two GPUs share it)")
_NVL72_HOST_AND_SHAPE = ("host memory: up to 17 TB LPDDR5X on the rack's 36 Grace CPUs, up to 480 GB per Grace shared "
                         "by its 2 GPUs -> 240 GB per GPU (17 TB / 72 = 236 GB); node shape: 18 compute trays of "
                         "2 Grace + 4 GPUs, all 72 GPUs on one NVLink switch fabric (the NVL72 datasheets; NVIDIA's "
                         "NVL72 AI Factory reference architecture, compute tray)")

H100_SXM = GPUSpec(
    arch="hopper", name="h100-sxm", device_name="NVIDIA H100 80GB HBM3",
    aliases=("h100", "h100-80gb", "h100-sxm-80gb", "h100-sxm5"),
    memory_bytes=81559 * MIB, bf16_flops=989.4 * TERA, fp8_flops=1978.9 * TERA, hbm_bytes_per_s=3.35e12,
    fp4_flops=None, sfu_exp_per_s=4.5e12, fp32_flops=67 * TERA, tdp_watts=700, host_link_bytes_per_s=64 * GB_PER_S,
    host_memory_bytes=None, gpus_per_node=8, nvlink_domain_gpus=None,
    source="NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): BF16 1,979 TFLOPS and FP8 3,958 TFLOPS with "
           "sparsity (dense half: 989.4 / 1978.9), no FP4, FP32 67 TFLOPS, 80 GB HBM3, 3.35 TB/s, max TDP up to "
           "700 W, "
           f"{_PCIE5}; an '80 GB' H100 shows 81,559 MiB (79.6 GiB) to software (nvidia-smi, "
           f"torch.cuda.mem_get_info); {_HOPPER_SFU}; {_HGX_SHAPE} (DGX H100)",
)
H200 = GPUSpec(
    arch="hopper", name="h200", device_name="NVIDIA H200", aliases=("h200-sxm", "h200-141gb", "h200-sxm-141gb"),
    memory_bytes=141 * GIB, bf16_flops=989.4 * TERA, fp8_flops=1978.9 * TERA, hbm_bytes_per_s=4.8e12,
    fp4_flops=None, sfu_exp_per_s=4.5e12, fp32_flops=67 * TERA, tdp_watts=700, host_link_bytes_per_s=64 * GB_PER_S,
    host_memory_bytes=None, gpus_per_node=8, nvlink_domain_gpus=None,
    source="NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): BF16 1,979 TFLOPS and FP8 3,958 TFLOPS with "
           f"sparsity (dense half), no FP4, FP32 67 TFLOPS, 141 GB HBM3e, 4.8 TB/s, max TDP up to 700 W, {_PCIE5}; "
           f"{_HOPPER_SFU} (H200 is the same GH100 at the same clocks); {_HGX_SHAPE} (DGX H200)",
)
_A100_SFU = ("SFU exponentials 2.44e12/s, derived (NVIDIA publishes no rate for Ampere): 108 SMs x 1.41 GHz boost "
             "(NVIDIA A100 Tensor Core GPU Architecture whitepaper) x 16 MUFU.EX2 per SM per clock (CUDA C++ "
             "Programming Guide, arithmetic-instruction throughput, compute capability 8.0)")
A100_80GB = GPUSpec(
    arch="ampere", name="a100-80gb", device_name="NVIDIA A100-SXM4-80GB",
    aliases=("a100", "a100-sxm", "a100-sxm-80gb", "a100-sxm4-80gb"),
    memory_bytes=80 * GIB, bf16_flops=312 * TERA, fp8_flops=None, hbm_bytes_per_s=2.039e12,
    fp4_flops=None, sfu_exp_per_s=108 * 16 * 1.41e9, fp32_flops=19.5 * TERA, tdp_watts=400,
    host_link_bytes_per_s=32 * GB_PER_S, host_memory_bytes=None, gpus_per_node=8, nvlink_domain_gpus=None,
    source="NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM): BF16 312 TFLOPS dense (624 sparse), "
           "no FP8, no FP4, FP32 19.5 TFLOPS, 80 GB HBM2e, 2,039 GB/s, max TDP 400 W, host link PCIe Gen4 64 GB/s "
           "bidirectional -> "
           f"32 GB/s each way; {_A100_SFU}; {_HGX_SHAPE} (DGX A100)",
)
A100_40GB = GPUSpec(
    arch="ampere", name="a100-40gb", device_name="NVIDIA A100-SXM4-40GB", aliases=("a100-sxm-40gb", "a100-sxm4-40gb"),
    memory_bytes=40 * GIB, bf16_flops=312 * TERA, fp8_flops=None, hbm_bytes_per_s=1.555e12,
    fp4_flops=None, sfu_exp_per_s=108 * 16 * 1.41e9, fp32_flops=19.5 * TERA, tdp_watts=400,
    host_link_bytes_per_s=32 * GB_PER_S, host_memory_bytes=None, gpus_per_node=8, nvlink_domain_gpus=None,
    source="NVIDIA A100 Tensor Core GPU datasheet (A100 40GB SXM): BF16 312 TFLOPS dense (624 sparse), "
           "no FP8, no FP4, FP32 19.5 TFLOPS, 40 GB HBM2, 1,555 GB/s, max TDP 400 W, host link PCIe Gen4 64 GB/s "
           "bidirectional -> "
           f"32 GB/s each way; {_A100_SFU}; {_HGX_SHAPE} (DGX A100)",
)
B200 = GPUSpec(
    arch="blackwell", name="b200", device_name="NVIDIA B200", aliases=("b200-sxm", "hgx-b200", "dgx-b200"),
    memory_bytes=180 * GIB, bf16_flops=2250 * TERA, fp8_flops=4500 * TERA, hbm_bytes_per_s=8e12,
    fp4_flops=9000 * TERA, sfu_exp_per_s=5e12, fp32_flops=75 * TERA, tdp_watts=1000,
    host_link_bytes_per_s=64 * GB_PER_S, host_memory_bytes=None, gpus_per_node=8, nvlink_domain_gpus=None,
    source="NVIDIA DGX B200 / HGX B200 datasheets (8 GPUs): FP16/BF16 36 PFLOPS, FP8 72 PFLOPS and FP4 144 PFLOPS "
           "with sparsity -> 2.25 / 4.5 / 9 PFLOPS dense per GPU (HGX B200 prints FP4 '144 | 72 PFLOPS' sparse | "
           "dense); 1,440 GB HBM3e -> 180 GB, 64 TB/s -> 8 TB/s per GPU (NVIDIA's later per-GPU tables print "
           "7.7 TB/s); max power 1,000 W per GPU (HGX B200 column of the per-GPU table in NVIDIA's Blackwell "
           "technical brief and Blackwell Ultra datasheet, which prints FP32 75 TFLOPS there too; nvidia-smi shows a "
           "1000 W cap); "
           f"{_PCIE5} (PCIe Gen6 comes with Blackwell Ultra); {_BLACKWELL_SFU}; {_HGX_SHAPE}",
)
GB200 = GPUSpec(
    arch="blackwell", name="gb200", device_name="NVIDIA GB200", aliases=("gb200-nvl72", "gb200-nvl"),
    memory_bytes=186 * GIB, bf16_flops=2500 * TERA, fp8_flops=5000 * TERA, hbm_bytes_per_s=8e12,
    fp4_flops=10000 * TERA, sfu_exp_per_s=5e12, fp32_flops=75 * TERA * 2500 / 2250, tdp_watts=1200,
    host_link_bytes_per_s=450 * GB_PER_S, host_memory_bytes=240 * 10**9, gpus_per_node=4, nvlink_domain_gpus=72,
    source="NVIDIA GB200 NVL72 datasheet (72 GPUs): FP16/BF16 360 PFLOPS, FP8 720 PFLOPS and FP4 1,440 PFLOPS with "
           "sparsity -> 2.5 / 5 / 10 PFLOPS dense per GPU (NVIDIA's 'Inside Blackwell Ultra' table: Blackwell NVFP4 "
           "10 | 20 PFLOPS dense | sparse); 13.4 TB HBM3e -> 186 GB, 576 TB/s -> 8 TB/s per GPU; max TDP 1,200 W "
           "(the Blackwell column of that table); FP32 83.3 TFLOPS, derived: B200's 75 (HGX B200 column of the "
           "Blackwell technical brief's per-GPU table) times the BF16 ratings' 2.5 / 2.25, since GB200 is the same "
           "die with the same SMs, whose CUDA cores and tensor cores run at one clock (NVIDIA prints no per-GPU FP32 "
           f"for GB200); {_C2C}; {_BLACKWELL_SFU}; {_NVL72_HOST_AND_SHAPE}",
)
B300 = GPUSpec(
    arch="blackwell", name="b300", device_name="NVIDIA B300 SXM6 AC", compute_capability=(10, 3),
    aliases=("b300-sxm", "b300-sxm6", "hgx-b300", "dgx-b300", "b300-sxm-270gb"),
    memory_bytes=275040 * MIB, bf16_flops=2250 * TERA, fp8_flops=4500 * TERA, hbm_bytes_per_s=7.7e12,
    fp4_flops=14000 * TERA, sfu_exp_per_s=10.7e12, fp32_flops=75 * TERA, tdp_watts=1100,
    host_link_bytes_per_s=128 * GB_PER_S,
    host_memory_bytes=None, gpus_per_node=8, nvlink_domain_gpus=None,
    source="Blackwell Ultra in HGX B300 / DGX B300 (8 GPUs). DGX B300 datasheet: FP8 72 PFLOPS and FP4 144 PFLOPS "
           "with sparsity; HGX B300 column of the per-GPU table in NVIDIA's Blackwell architecture technical brief "
           "(v2.1, table 3) and Blackwell Ultra datasheet: FP16/BF16 4.5 | 2.25 PFLOPS, FP8 9 | 4.5, FP4 18 | 14, "
           "FP32 75 TFLOPS "
           "(sparse | dense: Blackwell Ultra's dense FP4 is not half its sparse figure; NVIDIA's HGX B300 page at "
           "launch printed FP4 144 | 105 PFLOPS per 8 GPUs, 13.1 dense each), 270 GB HBM3e, 7.7 TB/s, 1,100 W "
           "(read through third-party copies of those PDFs, verda.com's 'GB300 NVL72' post among them; the "
           "'Inside Blackwell Ultra' blog gives the full chip's 288 GB, 8 TB/s, 1,400 W); memory 275,040 MiB as "
           "nvidia-smi shows an 'NVIDIA B300 SXM6 AC' (public nvidia-smi logs, 8 GPUs, cap 1100 W; 288 GB of "
           "HBM3e physically; NVIDIA's MLPerf submissions name it 'B300-SXM-270GB'); compute capability 10.3 "
           "(sm_103: NVIDIA Transformer Engine support matrix lists 10.3 for B300 / GB300, torch reports (10, 3)); "
           "host link PCIe Gen6 x16, 256 GB/s bidirectional -> 128 GB/s each way ('Inside Blackwell Ultra'; the "
           "GPU reaches the host through ConnectX-8's PCIe Gen6 switch, so a PCIe Gen5 host CPU such as DGX "
           f"B300's Xeon 6776P caps it at Gen5's 64 GB/s: give a YAML GPU for that); {_ULTRA_SFU}; NVLink 5, "
           f"1.8 TB/s bidirectional; {_HGX_SHAPE}",
)
GB300 = GPUSpec(
    arch="blackwell", name="gb300", device_name="NVIDIA GB300", compute_capability=(10, 3),
    aliases=("gb300-nvl72", "gb300-nvl"),
    memory_bytes=284208 * MIB, bf16_flops=2500 * TERA, fp8_flops=5000 * TERA, hbm_bytes_per_s=8e12,
    fp4_flops=15000 * TERA, sfu_exp_per_s=10.7e12, fp32_flops=80 * TERA, tdp_watts=1400,
    host_link_bytes_per_s=450 * GB_PER_S, host_memory_bytes=240 * 10**9, gpus_per_node=4, nvlink_domain_gpus=72,
    source="NVIDIA GB300 NVL72 datasheet (72 GPUs): FP4 1,440 PFLOPS sparse and 1,080 PFLOPS dense -> 15 PFLOPS "
           "dense per GPU (not half the sparse 20), FP8/FP6 720 PFLOPS and FP16/BF16 360 PFLOPS with sparsity "
           "-> 5 / 2.5 PFLOPS dense per GPU, 20 TB HBM3e and 576 TB/s -> 8 TB/s per GPU; NVIDIA's 'Inside "
           "Blackwell Ultra' blog: 15 PFLOPS dense NVFP4, 288 GB HBM3e, 8 TB/s, max TDP 1,400 W, NVLink 5 1.8 TB/s "
           "bidirectional; FP32 80 TFLOPS (GB300 column of the Blackwell technical brief's per-GPU table, read "
           "through verda.com's copy); memory 284,208 MiB as nvidia-smi shows an 'NVIDIA GB300' (public nvidia-smi "
           "logs, cap 1400 W) and NVIDIA's own MLPerf Training v5.1 system description (Theia, 1x GB300 NVL72: "
           "'284208 MiB'); compute capability 10.3 (sm_103: NVIDIA Transformer Engine support matrix; "
           f"sgl_kernel reports 103 on GB300); {_C2C}; {_ULTRA_SFU}; {_NVL72_HOST_AND_SHAPE}",
)
_GPUS: tuple[GPUSpec, ...] = (H100_SXM, H200, A100_80GB, A100_40GB, B200, GB200, B300, GB300)

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
    "b300": NVLINK5, "gb300": NVLINK5,  # Blackwell Ultra: NVLink 5, 1.8 TB/s per GPU ('Inside Blackwell Ultra')
}

DEFAULT_NODES = 1
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
    """The NVLink generation a catalog GPU (or a `dataclasses.replace` of one, which keeps its name) ships with;
    a GPU given inline in YAML must name its intra_node link."""
    link = _NVLINK_OF_GPU.get(gpu.name)
    if link is None:
        raise ValueError(
            f"GPU {gpu.name!r} is not in the catalog, so its NVLink generation is unknown; "
            f"give intra_node (one of {', '.join(known.name for known in _LINKS)})."
        )
    return link


# --- YAML ------------------------------------------------------------------------------------
_TEXT_KEYS = ("name", "source", "device_name")
_WHOLE_NUMBER_KEYS = ("memory_bytes", "host_memory_bytes", "gpus_per_node", "nvlink_domain_gpus")


def _spec_from_mapping(cls: type, mapping: Mapping[str, Any], where: str):
    """A GPUSpec or LinkSpec from an inline YAML mapping of its fields; numbers may be strings like 989.4e12.

    `null` is accepted where the field may be None (fp8_flops, fp4_flops, device_name, compute_capability, ...);
    a field left out takes the dataclass default (a GPU: 8 GPUs per node, the node its NVLink domain)."""
    allowed = {f.name: f for f in fields(cls)}
    nullable = {f.name for f in fields(cls) if "None" in str(f.type)}
    unknown = sorted(map(str, set(mapping) - set(allowed)))
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; allowed keys are {sorted(allowed)}.")
    values: dict[str, Any] = {"source": f"user-defined in {where}"}
    for key, value in mapping.items():
        if value is None:
            if key not in nullable:
                raise ValueError(f"{where}: `{key}` must be given a value, but got null.")
            values[key] = None
        elif key in _TEXT_KEYS:
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
                raise ValueError(f"{where}: `compute_capability` must be [major, minor] (e.g. [10, 3]), but got "
                                 f"{value!r}.")
            values[key] = tuple(value)
        else:
            values[key] = _yaml_number(value, key, where)
    missing = sorted(
        name for name, f in allowed.items()
        if name not in values and f.default is MISSING and f.default_factory is MISSING
    )
    if missing:
        raise ValueError(f"{where}: missing keys {missing} for an inline {cls.__name__}.")
    try:
        return cls(**values)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None


def _yaml_number(value: Any, key: str, where: str) -> float | int:
    """A finite number from YAML (numbers may be strings like '989.4e12'); byte and GPU counts whole numbers."""
    import math

    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{where}: `{key}` must be a number, but got {value!r}.")
    if isinstance(value, int) and key in _WHOLE_NUMBER_KEYS:
        return value  # exact, however large (the spec checks the range)
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{where}: `{key}` must be a number, but got {value!r}.") from None
    if not math.isfinite(number):
        raise ValueError(f"{where}: `{key}` must be a finite number, but got {value!r}.")
    if key in _WHOLE_NUMBER_KEYS:
        if number != int(number):
            unit = " of bytes" if key.endswith("_bytes") else ""
            raise ValueError(f"{where}: `{key}` must be a whole number{unit}, but got {value!r}.")
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
    (1 node, h100, the GPU's node shape, the GPU's NVLink generation, ib-ndr).

    The YAML holds any of `nodes, gpus_per_node, gpu, intra_node, inter_node`; `gpu` (and the links)
    may be a catalog name or an inline mapping of GPUSpec (LinkSpec) fields. The GPU's node shape
    (`GPUSpec.gpus_per_node`, `GPUSpec.nvlink_domain_gpus`: 4 and 72 for GB200/GB300 NVL72) gives the
    default gpus_per_node and the NVLink domain; an explicit gpus_per_node that does not divide the
    GPU's NVLink domain is a ValueError. An inline GPU must name its intra_node link.
    """
    from_yaml = _read_cluster_yaml(yaml_path) if yaml_path is not None else {}
    where = f"cluster YAML {str(yaml_path)!r}" if yaml_path is not None else "arguments"

    def pick(key: str, explicit: Any, default: Any) -> Any:
        if explicit is not None:
            return explicit
        return from_yaml[key] if from_yaml.get(key) is not None else default

    gpu_value = pick("gpu", gpu, DEFAULT_GPU)
    gpu_spec = _resolve_gpu(gpu_value, where)
    intra = pick("intra_node", intra_node, None)
    if intra is None and isinstance(gpu_value, Mapping):
        # an inline GPU is what its mapping says: a name that matches a catalog GPU brings neither that GPU's
        # NVLink generation nor (below) its node shape
        raise ValueError(f"{where}: the gpu is given inline, so its NVLink generation is unknown; give intra_node "
                         f"(one of {', '.join(known.name for known in _LINKS)}, or an inline link).")
    intra_spec = default_intra_node(gpu_spec) if intra is None else _resolve_link(intra, where, "intra_node")
    # the node shape is the GPU's own (8 per node on HGX/DGX boards, 4 per tray in a 72-GPU NVL72 rack); an explicit
    # gpus_per_node (argument, then the YAML's top-level key) wins over it, as long as it still tiles the GPU's
    # NVLink domain into whole nodes
    gpn = _as_int(pick("gpus_per_node", gpus_per_node, gpu_spec.gpus_per_node), "gpus_per_node")
    domain = gpu_spec.nvlink_domain_gpus
    if domain is not None and domain % gpn:
        raise ValueError(f"gpus_per_node={gpn} does not tile the NVLink domain of GPU {gpu_spec.name!r} "
                         f"({domain} GPUs, {gpu_spec.gpus_per_node} per node) into whole nodes; give a gpus_per_node "
                         f"that divides {domain}, or a GPU without an NVLink domain beyond the node.")
    return ClusterSpec(
        nodes=_as_int(pick("nodes", nodes, DEFAULT_NODES), "nodes"),
        gpus_per_node=gpn,
        nvlink_domain_gpus=domain,
        gpu=gpu_spec,
        intra_node=intra_spec,
        inter_node=_resolve_link(pick("inter_node", inter_node, DEFAULT_INTER_NODE), where, "inter_node"),
    )
