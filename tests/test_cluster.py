"""GPU and link catalog lookups, and `build_cluster` precedence: arguments > YAML file > defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from search_spaces.cluster import GIB
from search_spaces.gpus import build_cluster, get_gpu, get_link, list_gpus, list_links


# --- catalog lookups -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("alias", "name"),
    [("h100", "h100-sxm"), ("H100-SXM", "h100-sxm"), ("h100_sxm", "h100-sxm"), ("h200", "h200"),
     ("a100", "a100-80gb"), ("A100-80GB", "a100-80gb"), ("a100-40gb", "a100-40gb"), ("b200", "b200"),
     ("gb200", "gb200")],
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
    ],
)
def test_gpu_datasheet_figures(name, bf16_tflops, fp8_tflops, memory_gib, hbm_tb_per_s) -> None:
    gpu = get_gpu(name)
    assert gpu.bf16_flops == pytest.approx(bf16_tflops * 1e12)
    assert gpu.fp8_flops == (None if fp8_tflops is None else pytest.approx(fp8_tflops * 1e12))
    assert gpu.memory_bytes == memory_gib * GIB
    assert gpu.hbm_bytes_per_s == pytest.approx(hbm_tb_per_s * 1e12)


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


@pytest.mark.parametrize(("gpu", "nvlink"), [("a100", "nvlink3"), ("h200", "nvlink4"), ("b200", "nvlink5")])
def test_intra_node_defaults_to_the_gpus_nvlink(gpu: str, nvlink: str) -> None:
    assert build_cluster(gpu=gpu).intra_node.name == nvlink


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
