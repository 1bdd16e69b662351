"""Clusters built in code: catalog GPUs and links, or your own `GPUSpec` / `LinkSpec` values.

    >>> from autotune import clusters
    >>> c = clusters.build(nodes=4, gpu="h100")
    >>> c.world_size, c.gpu.name, c.inter_node.name
    (32, 'h100-sxm', 'ib-ndr')
    >>> slow = clusters.build(nodes=4, gpu="h100", inter_node="ethernet-100g")
    >>> slow.inter_node.name
    'ethernet-100g'
    >>> custom = clusters.gpu("h100", memory_bytes=64 * 1024**3)   # an H100 with a 64 GiB budget
    >>> clusters.build(nodes=2, gpu=custom).gpu.memory_gib
    64.0

Defaults match the CLI: 1 node, 8 GPUs per node, H100, the GPU's NVLink generation, InfiniBand NDR.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from search_spaces.cluster import ClusterSpec, GPUSpec, LinkSpec

__all__ = ["build", "from_yaml", "gpu", "link", "gpus", "links", "resolve", "ClusterSpec", "GPUSpec", "LinkSpec"]


def build(
    *,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    gpu: str | GPUSpec | None = None,
    intra_node: str | LinkSpec | None = None,
    inter_node: str | LinkSpec | None = None,
) -> ClusterSpec:
    """A cluster of `nodes x gpus_per_node` GPUs; names come from the catalog, specs are used as given."""
    from search_spaces.gpus import build_cluster

    return build_cluster(nodes=nodes, gpus_per_node=gpus_per_node, gpu=gpu, intra_node=intra_node,
                         inter_node=inter_node)


def from_yaml(path: str | Path, **overrides: object) -> ClusterSpec:
    """A cluster from a YAML file (keys: nodes, gpus_per_node, gpu, intra_node, inter_node); keyword overrides win."""
    from search_spaces.gpus import build_cluster

    return build_cluster(yaml_path=path, **overrides)  # type: ignore[arg-type]


def _replaced(spec, changes: dict[str, object]):
    allowed = {f.name for f in dataclasses.fields(spec)}
    unknown = sorted(set(changes) - allowed)
    if unknown:
        raise ValueError(f"{type(spec).__name__} has no field(s) {unknown}; fields are {sorted(allowed)}.")
    return dataclasses.replace(spec, **changes)


def gpu(name: str, **changes: object) -> GPUSpec:
    """A catalog GPU (`h100`, `h200`, `a100-80gb`, `b200` ...), optionally with some fields changed."""
    from search_spaces.gpus import get_gpu

    return _replaced(get_gpu(name), changes)


def link(name: str, **changes: object) -> LinkSpec:
    """A catalog link (`nvlink4`, `ib-ndr`, `roce-400g`, `ethernet-100g` ...), optionally with fields changed."""
    from search_spaces.gpus import get_link

    return _replaced(get_link(name), changes)


def gpus() -> list[GPUSpec]:
    """Every catalog GPU."""
    from search_spaces.gpus import list_gpus

    return list_gpus()


def links() -> list[LinkSpec]:
    """Every catalog interconnect."""
    from search_spaces.gpus import list_links

    return list_links()


def resolve(cluster: ClusterSpec | str | Path | None = None, **build_kwargs: object) -> ClusterSpec:
    """A `ClusterSpec` as is, a YAML path, or one built from `build` keywords (what `autotune.search` takes)."""
    if isinstance(cluster, ClusterSpec):
        given = {k: v for k, v in build_kwargs.items() if v is not None}
        if given:
            raise ValueError(f"give either cluster= or {sorted(given)}, not both.")
        return cluster
    if isinstance(cluster, (str, Path)):
        return from_yaml(cluster, **{k: v for k, v in build_kwargs.items() if v is not None})
    if cluster is None:
        return build(**build_kwargs)  # type: ignore[arg-type]
    raise ValueError(f"cluster must be a ClusterSpec or a YAML path, but got {type(cluster).__name__}.")
