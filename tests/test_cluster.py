"""GPU and link catalog lookups, and `build_cluster` precedence: arguments > YAML file > defaults."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from search_spaces.cluster import GPUSpec
from search_spaces.gpus import build_cluster, get_gpu, get_link, list_gpus, list_links
from search_spaces.units import GIB

MIB = 1024**2


# --- catalog lookups -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("alias", "name"),
    [("h100", "h100-sxm"), ("H100-SXM", "h100-sxm"), ("h100_sxm", "h100-sxm"), ("h200", "h200"),
     ("a100", "a100-80gb"), ("A100-80GB", "a100-80gb"), ("a100-40gb", "a100-40gb"), ("b200", "b200"),
     ("gb200", "gb200"), ("gb200-nvl72", "gb200"), ("b300", "b300"), ("B300-SXM", "b300"), ("hgx-b300", "b300"),
     ("dgx_b300", "b300"), ("b300-sxm6", "b300"), ("gb300", "gb300"), ("GB300-NVL72", "gb300"), ("gb300-nvl", "gb300")],
)
def test_gpu_aliases(alias: str, name: str) -> None:
    assert get_gpu(alias).name == name


@pytest.mark.parametrize(
    ("name", "bf16_tflops", "fp8_tflops", "memory_gib", "hbm_tb_per_s"),
    [
        ("h100", 989.4, 1978.9, 81559 / 1024, 3.35),
        ("h200", 989.4, 1978.9, 141, 4.8),
        ("a100-80gb", 312, None, 80, 2.039),
        ("a100-40gb", 312, None, 40, 1.555),
        ("b200", 2250, 4500, 180, 8.0),  # 36 / 72 PFLOPS sparse per 8 GPUs, halved
        ("gb200", 2500, 5000, 186, 8.0),  # 360 / 720 PFLOPS sparse per 72 GPUs, halved
        # HGX B300: 36 / 72 PFLOPS sparse per 8 GPUs, halved; 275,040 MiB in nvidia-smi; 7.7 TB/s per GPU (NVIDIA's
        # HGX B300 per-GPU table)
        ("b300", 2250, 4500, 275040 / 1024, 7.7),
        # GB300 NVL72: 360 / 720 PFLOPS sparse per 72 GPUs, halved; 284,208 MiB in nvidia-smi; 576 TB/s / 72
        ("gb300", 2500, 5000, 284208 / 1024, 8.0),
    ],
)
def test_gpu_datasheet_figures(name, bf16_tflops, fp8_tflops, memory_gib, hbm_tb_per_s) -> None:
    gpu = get_gpu(name)
    assert gpu.bf16_flops == pytest.approx(bf16_tflops * 1e12)
    assert gpu.fp8_flops == (None if fp8_tflops is None else pytest.approx(fp8_tflops * 1e12))
    assert gpu.memory_bytes == memory_gib * GIB
    assert gpu.hbm_bytes_per_s == pytest.approx(hbm_tb_per_s * 1e12)


@pytest.mark.parametrize(
    ("name", "fp4_pflops", "sfu_tera_exp", "tdp_w", "host_gb_per_s", "host_memory_gb", "per_node", "domain",
     "fp32_tflops"),
    [
        # FP32 CUDA-core peaks: H100/H200 67, A100 19.5 (datasheets), B200 / B300 75 and GB300 80 (Blackwell / Blackwell
        # Ultra tech briefs' per-GPU columns); GB200 B200's 75 at GB200's BF16 clock ratio (2.5 / 2.25 PFLOPS)
        # no FP4 on Hopper; SFU: NVIDIA's Hopper figure (4.5 TeraExponentials/s); PCIe Gen5 128 GB/s / 2
        ("h100", None, 4.5, 700, 64, None, 8, None, 67),
        ("h200", None, 4.5, 700, 64, None, 8, None, 67),
        # SFU derived: 108 SMs * 16 EX2 per clock * 1.41 GHz = 2.43648e12; PCIe Gen4 64 GB/s / 2
        ("a100-80gb", None, 2.43648, 400, 32, None, 8, None, 19.5),
        ("a100-40gb", None, 2.43648, 400, 32, None, 8, None, 19.5),
        ("b200", 9, 5, 1000, 64, None, 8, None, 75),  # 144 PFLOPS FP4 sparse / 8 / 2
        # 1,440 PFLOPS FP4 sparse / 72 / 2; NVLink-C2C 900 GB/s / 2; 480 GB LPDDR5X per Grace / 2 GPUs
        ("gb200", 10, 5, 1200, 450, 240, 4, 72, 75 * 2500 / 2250),
        # FP4 14 dense (18 sparse) per HGX B300 GPU as NVIDIA prints it; SFU doubled; PCIe Gen6 256 GB/s / 2
        ("b300", 14, 10.7, 1100, 128, None, 8, None, 75),
        # 1,080 PFLOPS FP4 dense / 72 (the sparse 1,440 / 72 = 20 is not twice it); C2C 900 / 2; 480 GB / 2
        ("gb300", 15, 10.7, 1400, 450, 240, 4, 72, 80),
    ],
)
def test_gpu_datasheet_figures_beyond_gemm(name, fp4_pflops, sfu_tera_exp, tdp_w, host_gb_per_s, host_memory_gb,
                                           per_node, domain, fp32_tflops) -> None:
    gpu = get_gpu(name)
    assert gpu.fp32_flops == pytest.approx(fp32_tflops * 1e12)
    assert gpu.fp4_flops == (None if fp4_pflops is None else pytest.approx(fp4_pflops * 1e15))
    assert gpu.sfu_exp_per_s == pytest.approx(sfu_tera_exp * 1e12)
    assert gpu.tdp_watts == tdp_w
    assert gpu.host_link_bytes_per_s == pytest.approx(host_gb_per_s * 1e9)
    assert gpu.host_memory_bytes == (None if host_memory_gb is None else host_memory_gb * 10**9)
    assert (gpu.gpus_per_node, gpu.nvlink_domain_gpus) == (per_node, domain)


@pytest.mark.parametrize(
    ("name", "device_name", "capability"),
    [("h100", "NVIDIA H100 80GB HBM3", (9, 0)), ("a100", "NVIDIA A100-SXM4-80GB", (8, 0)),
     ("b200", "NVIDIA B200", (10, 0)), ("gb200", "NVIDIA GB200", (10, 0)),
     ("b300", "NVIDIA B300 SXM6 AC", (10, 3)), ("gb300", "NVIDIA GB300", (10, 3))],  # Blackwell Ultra is sm_103
)
def test_gpu_as_torch_reports_it(name: str, device_name: str, capability: tuple[int, int]) -> None:
    gpu = get_gpu(name)
    assert (gpu.torch_device_name, gpu.capability) == (device_name, capability)


def test_blackwell_ultra_is_blackwell_for_the_model() -> None:
    # same tensor-core generation: the model predicts it from its spec sheet, with Blackwell's fitted factors
    assert get_gpu("b300").arch == get_gpu("gb300").arch == "blackwell"


def test_every_catalog_gpu_fills_every_field_its_product_fixes() -> None:
    for gpu in list_gpus():
        assert None not in (gpu.sfu_exp_per_s, gpu.tdp_watts, gpu.host_link_bytes_per_s, gpu.device_name,
                            gpu.fp32_flops), gpu.name
        assert (gpu.fp8_flops is None) == (gpu.arch == "ampere"), gpu.name
        assert (gpu.fp4_flops is None) == (gpu.arch != "blackwell"), gpu.name
        # host memory is the product's only where the product fixes the host (Grace on NVL72 trays)
        assert (gpu.host_memory_bytes is None) == (gpu.nvlink_domain_gpus is None), gpu.name


def test_gpu_spec_is_immutable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_gpu("gb300").gpus_per_node = 8  # type: ignore[misc]


def test_fp4_peak_and_its_absence() -> None:
    assert get_gpu("gb300").peak_flops("fp4") == pytest.approx(15e15)
    with pytest.raises(ValueError, match="GPU h100-sxm has no FP4 tensor cores"):
        get_gpu("h100").peak_flops("fp4")


_GOOD = dict(name="g", memory_bytes=GIB, bf16_flops=1e15, fp8_flops=None, hbm_bytes_per_s=1e12, source="test")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"fp4_flops": 0}, r"GPU 'g': `fp4_flops > 0` must hold .* \(fp4_flops=0\)"),
        ({"fp4_flops": "15e15"}, r"GPU 'g': `fp4_flops` must be a number, but got '15e15'"),
        ({"sfu_exp_per_s": -1.0}, r"`sfu_exp_per_s > 0` must hold"),
        ({"sfu_exp_per_s": float("nan")}, r"`sfu_exp_per_s > 0` must hold for a finite number"),
        ({"tdp_watts": float("inf")}, r"`tdp_watts > 0` must hold for a finite number"),
        ({"tdp_watts": True}, r"`tdp_watts` must be a number, but got True"),
        ({"host_link_bytes_per_s": 0.0}, r"`host_link_bytes_per_s > 0` must hold"),
        ({"host_memory_bytes": 1.5}, r"`host_memory_bytes` must be a whole number of bytes, but got 1.5"),
        ({"host_memory_bytes": 0}, r"`0 < host_memory_bytes <= .*` must hold, but got \(host_memory_bytes=0\)"),
        ({"gpus_per_node": 0}, r"`0 < gpus_per_node <= 1,024` must hold, but got \(gpus_per_node=0\)"),
        ({"gpus_per_node": 4.0}, r"`gpus_per_node` must be a whole number, but got 4.0"),
        ({"gpus_per_node": None}, r"`gpus_per_node` must be a whole number, but got None"),
        ({"nvlink_domain_gpus": -72}, r"`0 < nvlink_domain_gpus <= .*` must hold, but got \(nvlink_domain_gpus=-72\)"),
        ({"gpus_per_node": 4, "nvlink_domain_gpus": 70},
         r"`nvlink_domain_gpus % gpus_per_node == 0` must hold .* \(nvlink_domain_gpus=70, gpus_per_node=4\)"),
        ({"compute_capability": (10,)}, r"`compute_capability` must be \(major, minor\)"),
        ({"device_name": ""}, r"`device_name` must be a non-empty text or None"),
    ],
)
def test_bad_gpu_fields_are_refused_by_name(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GPUSpec(**{**_GOOD, **change})


@pytest.mark.parametrize(
    ("name", "gb_per_s"),
    [("nvlink3", 300), ("nvlink4", 450), ("nvlink5", 900),  # half the bidirectional 600/900/1800 GB/s
     ("ib-ndr", 50), ("ib-hdr", 25), ("roce-400g", 50),  # 400, 200, 400 Gb/s per GPU / 8
     ("ethernet-100g", 1.5625)],  # 100 Gb/s per node / 8 bits / 8 GPUs
)
def test_link_bandwidth_per_gpu_one_way(name: str, gb_per_s: float) -> None:
    assert get_link(name).bandwidth_bytes_per_s == pytest.approx(gb_per_s * 1e9)


def test_every_catalog_entry_names_its_source() -> None:
    assert all(gpu.source for gpu in list_gpus()) and all(link.source for link in list_links())


def test_a100_fp8_is_a_user_error() -> None:
    with pytest.raises(ValueError, match="no FP8 tensor cores; use --precision bf16"):
        get_gpu("a100").peak_flops("fp8")


@pytest.mark.parametrize(("lookup", "name", "known"), [(get_gpu, "v100", "h100-sxm"), (get_link, "nvlink9", "ib-ndr")])
def test_unknown_name_lists_known(lookup, name: str, known: str) -> None:
    with pytest.raises(ValueError, match=rf"Unknown \w+ '{name}'; use one of: .*{known}"):
        lookup(name)


# --- build_cluster ---------------------------------------------------------------------------
def test_defaults() -> None:
    c = build_cluster()
    assert (c.nodes, c.gpus_per_node, c.gpu.name, c.intra_node.name, c.inter_node.name) == (
        1, 8, "h100-sxm", "nvlink4", "ib-ndr")


@pytest.mark.parametrize(("gpu", "nvlink"), [("a100", "nvlink3"), ("h200", "nvlink4"), ("b200", "nvlink5"),
                                            ("gb200", "nvlink5"), ("b300", "nvlink5"), ("gb300", "nvlink5")])
def test_intra_node_defaults_to_the_gpus_nvlink(gpu: str, nvlink: str) -> None:
    assert build_cluster(gpu=gpu).intra_node.name == nvlink


@pytest.mark.parametrize(("gpu", "per_node", "domain"), [("gb300", 4, 72), ("gb200", 4, 72), ("b300", 8, 8),
                                                        ("b200", 8, 8), ("h100", 8, 8)])
def test_node_shape_comes_from_the_gpu(gpu: str, per_node: int, domain: int) -> None:
    c = build_cluster(nodes=18, gpu=gpu)
    assert (c.gpus_per_node, c.nvlink_domain, c.world_size) == (per_node, domain, 18 * per_node)


def test_nvl72_rack_groups_stay_on_nvlink_until_they_leave_the_rack() -> None:
    c = build_cluster(nodes=36, gpu="gb300")  # two racks of 18 four-GPU trays
    assert c.link_for_group(72).name == "nvlink5"  # the whole rack: one NVLink domain across 18 nodes
    assert c.link_for_group(8).name == "nvlink5"  # crosses trays, not the rack
    assert c.link_for_group(2, stride=72).name == "ib-ndr"  # one GPU in each rack


def test_a_replaced_catalog_gpu_keeps_its_shape() -> None:
    # clusters.gpu("gb300", memory_bytes=...) is dataclasses.replace: the product (and its shape) stays
    c = build_cluster(nodes=18, gpu=dataclasses.replace(get_gpu("gb300"), memory_bytes=200 * GIB))
    assert (c.gpus_per_node, c.nvlink_domain, c.intra_node.name) == (4, 72, "nvlink5")


@pytest.mark.parametrize("gpus_per_node", [1, 8, 36, 72])
def test_explicit_gpus_per_node_wins_over_the_gpus_shape_and_keeps_its_domain(gpus_per_node: int) -> None:
    c = build_cluster(nodes=2, gpus_per_node=gpus_per_node, gpu="gb300")
    assert (c.gpus_per_node, c.nvlink_domain_gpus) == (gpus_per_node, 72)


@pytest.mark.parametrize("gpus_per_node", [5, 48, 144])
def test_gpus_per_node_that_breaks_the_nvlink_domain_is_a_clear_error(gpus_per_node: int) -> None:
    with pytest.raises(ValueError, match=rf"gpus_per_node={gpus_per_node} does not tile the NVLink domain of GPU "
                                         r"'gb300' \(72 GPUs, 4 per node\) into whole nodes; give a gpus_per_node "
                                         r"that divides 72"):
        build_cluster(gpus_per_node=gpus_per_node, gpu="gb300")


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


def test_yaml_fills_unset_arguments_and_explicit_arguments_win(tmp_path: Path) -> None:
    path = _yaml(tmp_path, "nodes: 4\ngpus_per_node: 4\ngpu: a100-40gb\ninter_node: ib-hdr\n")
    c = build_cluster(nodes=16, gpus_per_node=None, gpu=None, intra_node=None, inter_node="roce-400g",
                      yaml_path=path)
    # nodes and inter_node from the arguments; gpus_per_node and gpu from the file; intra_node by default
    assert (c.nodes, c.gpus_per_node, c.gpu.name, c.intra_node.name, c.inter_node.name) == (
        16, 4, "a100-40gb", "nvlink3", "roce-400g")
    assert c.world_size == 64  # 16 * 4


def test_yaml_inline_gpu_mapping(tmp_path: Path) -> None:
    # PyYAML reads 900.0e12 without an exponent sign as a string: numbers are coerced
    path = _yaml(tmp_path, (
        "gpu:\n  name: mi300x\n  memory_bytes: 206158430208\n  bf16_flops: 1307.4e12\n"
        "  fp8_flops: 2614.9e12\n  hbm_bytes_per_s: 5.3e+12\n"
        "intra_node: {name: xgmi, bandwidth_bytes_per_s: 64e9, latency_s: 3e-6}\n"))
    c = build_cluster(yaml_path=path)
    assert c.gpu.name == "mi300x" and c.gpu.bf16_flops == pytest.approx(1307.4e12)
    assert c.gpu.memory_gib == 192
    assert c.intra_node.bandwidth_bytes_per_s == pytest.approx(64e9)


def test_yaml_inline_gpu_with_every_field_and_an_nvl72_shape(tmp_path: Path) -> None:
    path = _yaml(tmp_path, (
        "nodes: 18\n"
        "gpu:\n  name: my-gb300\n  arch: blackwell\n  aliases: [Mine]\n  device_name: NVIDIA GB300\n"
        "  compute_capability: [10, 3]\n  memory_bytes: 298013687808\n  bf16_flops: 2.5e+15\n  fp8_flops: 5e15\n"
        "  fp4_flops: '15e15'\n  hbm_bytes_per_s: 8e12\n  sfu_exp_per_s: 10.7e12\n  fp32_flops: 80e12\n"
        "  tdp_watts: 1400\n  host_link_bytes_per_s: 450e9\n  host_memory_bytes: 240000000000\n  gpus_per_node: 4\n"
        "  nvlink_domain_gpus: 72\n  source: my datasheet\n"
        "intra_node: nvlink5\n"))
    c = build_cluster(yaml_path=path)
    g = c.gpu
    assert (g.name, g.aliases, g.arch, g.torch_device_name, g.capability, g.source) == (
        "my-gb300", ("mine",), "blackwell", "NVIDIA GB300", (10, 3), "my datasheet")
    assert (g.memory_bytes, g.host_memory_bytes, g.gpus_per_node, g.nvlink_domain_gpus) == (
        284208 * MIB, 240 * 10**9, 4, 72)
    assert (g.bf16_flops, g.fp8_flops, g.fp4_flops, g.hbm_bytes_per_s) == (2.5e15, 5e15, 15e15, 8e12)
    assert (g.sfu_exp_per_s, g.fp32_flops, g.tdp_watts, g.host_link_bytes_per_s) == (10.7e12, 80e12, 1400, 450e9)
    assert (c.gpus_per_node, c.nvlink_domain, c.world_size) == (4, 72, 72)  # an NVL72 rack from the YAML alone
    assert c.link_for_group(72).name == "nvlink5"


def test_yaml_inline_gpu_nulls_where_a_field_may_be_none(tmp_path: Path) -> None:
    path = _yaml(tmp_path, (
        "gpu: {name: g, memory_bytes: 1073741824, bf16_flops: 1e15, fp8_flops: null, fp4_flops: null, "
        "hbm_bytes_per_s: 1e12, sfu_exp_per_s: null, tdp_watts: null, host_link_bytes_per_s: null, "
        "host_memory_bytes: null, nvlink_domain_gpus: null, device_name: null, compute_capability: null}\n"
        "intra_node: nvlink4\n"))
    g = build_cluster(yaml_path=path).gpu
    assert (g.fp4_flops, g.sfu_exp_per_s, g.host_memory_bytes, g.nvlink_domain_gpus, g.capability) == (
        None, None, None, None, (9, 0))


def test_yaml_gpu_named_like_a_catalog_gpu_gets_only_its_mapping(tmp_path: Path) -> None:
    # an inline gb200 is not the catalog's GB200: no NVL72 shape, no FP4 peak, no Grace memory unless it says so
    path = _yaml(tmp_path, "nodes: 18\ngpu: {name: gb200, memory_bytes: 199715979264, bf16_flops: 2.5e15, "
                           "fp8_flops: 5e15, hbm_bytes_per_s: 8e12}\nintra_node: nvlink5\n")
    c = build_cluster(yaml_path=path)
    assert (c.gpus_per_node, c.nvlink_domain_gpus, c.nvlink_domain) == (8, None, 8)
    assert (c.gpu.fp4_flops, c.gpu.host_memory_bytes, c.gpu.sfu_exp_per_s) == (None, None, None)
    assert c.link_for_group(16).name == "ib-ndr"  # the catalog GB200 would keep 16 on NVLink


def test_yaml_gpu_named_like_a_catalog_gpu_must_name_its_nvlink(tmp_path: Path) -> None:
    path = _yaml(tmp_path, "gpu: {name: gb300, memory_bytes: 1, bf16_flops: 1, fp8_flops: null, hbm_bytes_per_s: 1}\n")
    with pytest.raises(ValueError, match="the gpu is given inline, so its NVLink generation is unknown; "
                                         "give intra_node"):
        build_cluster(yaml_path=path)


def test_yaml_top_level_gpus_per_node_wins_over_the_inline_gpus_shape(tmp_path: Path) -> None:
    path = _yaml(tmp_path, "gpus_per_node: 8\ngpu: {name: g, memory_bytes: 1, bf16_flops: 1, fp8_flops: null, "
                           "hbm_bytes_per_s: 1, gpus_per_node: 4, nvlink_domain_gpus: 72}\nintra_node: nvlink5\n")
    c = build_cluster(yaml_path=path)
    assert (c.gpus_per_node, c.nvlink_domain_gpus) == (8, 72)
    assert build_cluster(gpus_per_node=4, yaml_path=path).gpus_per_node == 4  # and the argument wins over both


def test_inline_gpu_without_intra_node_asks_for_it(tmp_path: Path) -> None:
    path = _yaml(tmp_path, "gpu: {name: x, memory_bytes: 1, bf16_flops: 1, fp8_flops: null, hbm_bytes_per_s: 1}\n")
    with pytest.raises(ValueError, match="give intra_node"):
        build_cluster(yaml_path=path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nodes: 0\n", r"`nodes > 0` must hold, but got \(nodes=0\)"),
        ("gpus_per_node: -8\n", r"`gpus_per_node > 0` must hold"),
        ("nodes: four\n", r"`nodes` must be a whole number, but got \(nodes='four'\)"),
        ("nodes: 2\nnode_count: 3\n", r"unknown keys \['node_count'\]; allowed keys are \['nodes'"),
        ("nodes: [1\n", r"is not valid YAML"),
        ("- 1\n- 2\n", r"must be a mapping with keys"),
        ("gpu: {name: x, flops: 1}\n", r"gpu: unknown keys \['flops'\]"),
        ("gpu: {name: x, memory_bytes: lots}\n", r"`memory_bytes` must be a number"),
        ("gpu: tpu\n", r"Unknown GPU 'tpu'"),
        ("gpu: {name: x, memory_bytes: 1, bf16_flops: 1, fp8_flops: null, hbm_bytes_per_s: 1, gpus_per_node: 4.5}\n"
         "intra_node: nvlink5\n", r"gpu: `gpus_per_node` must be a whole number, but got 4.5"),
        ("gpu: {name: x, memory_bytes: 1, bf16_flops: 1, fp8_flops: null, hbm_bytes_per_s: 1, gpus_per_node: true}\n"
         "intra_node: nvlink5\n", r"gpu: `gpus_per_node` must be a number, but got True"),
        ("gpu: {name: x, memory_bytes: 1, bf16_flops: 1, fp8_flops: null, hbm_bytes_per_s: 1, gpus_per_node: 4, "
         "nvlink_domain_gpus: 70}\nintra_node: nvlink5\n",
         r"gpu: GPU 'x': `nvlink_domain_gpus % gpus_per_node == 0` must hold"),
        ("gpu: {name: x, memory_bytes: 1, bf16_flops: 1, fp8_flops: null, hbm_bytes_per_s: 1, gpus_per_node: null}\n"
         "intra_node: nvlink5\n", r"gpu: `gpus_per_node` must be given a value, but got null"),
        ("gpu: {name: x, memory_bytes: 1, bf16_flops: 1, fp8_flops: null, hbm_bytes_per_s: 1, tdp_watts: hot}\n"
         "intra_node: nvlink5\n", r"gpu: `tdp_watts` must be a number, but got 'hot'"),
        ("gpu: {name: x, memory_bytes: 1, bf16_flops: 1, fp8_flops: null, hbm_bytes_per_s: 1, "
         "host_memory_bytes: 0.5}\nintra_node: nvlink5\n", r"gpu: `host_memory_bytes` must be a whole number"),
        ("gpu: {name: x, memory_bytes: 1, bf16_flops: 1, fp8_flops: null, hbm_bytes_per_s: 1, sfu_exp_per_s: -5}\n"
         "intra_node: nvlink5\n", r"gpu: GPU 'x': `sfu_exp_per_s > 0` must hold"),
        ("gpu: {name: x, memory_bytes: 1, bf16_flops: 1, fp8_flops: null, hbm_bytes_per_s: 1, "
         "compute_capability: 10.3}\nintra_node: nvlink5\n", r"`compute_capability` must be \[major, minor\]"),
        ("gpu: gb300\ngpus_per_node: 5\n", r"gpus_per_node=5 does not tile the NVLink domain of GPU 'gb300'"),
    ],
)
def test_bad_yaml_is_a_clear_value_error(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_cluster(yaml_path=_yaml(tmp_path, text))


def test_unreadable_yaml_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"Cannot read cluster YAML .*missing\.yaml"):
        build_cluster(yaml_path=tmp_path / "missing.yaml")


def test_empty_yaml_means_defaults(tmp_path: Path) -> None:
    assert build_cluster(yaml_path=_yaml(tmp_path, "")) == build_cluster()


@pytest.mark.parametrize("nodes", [0, -1])
def test_nonpositive_nodes_argument(nodes: int) -> None:
    with pytest.raises(ValueError, match=rf"`nodes > 0` must hold, but got \(nodes={nodes}\)"):
        build_cluster(nodes=nodes)


# --- link_for_group ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("group_size", "stride", "link"),
    [(8, 1, "nvlink4"), (2, 4, "nvlink4"), (16, 1, "ib-ndr"), (2, 8, "ib-ndr"), (1, 64, "nvlink4")],
)
def test_link_for_group(group_size: int, stride: int, link: str) -> None:
    # a group spans group_size * stride consecutive ranks: inside one 8-GPU node when <= 8
    assert build_cluster(nodes=4).link_for_group(group_size, stride).name == link
