"""The NVIDIA NeMo / Megatron-Bridge software releases a cluster may run, and which one a user means.

A release is a NeMo container (`nvcr.io/nvidia/nemo:26.06`), which pins a Megatron-Bridge tag and a megatron-core
commit. The same layout trained 1.26 to 1.73 times faster on Blackwell from one release to a later one (kernels,
libraries, recipes: `bench/data/bridge_performance_tables.md`), so the throughput model carries per-release factors
fitted on each release's published tables (`autotune.cost.efficiency.Calibration.per_release`), and a prediction is
for one release: `--release` (default the newest, `DEFAULT_RELEASE`).

Which Bridge tag each container pins: Megatron-Bridge `docs/versions1.json` and the release notes (read at each tag in
the Megatron-Bridge mirror); the megatron-core each tag pins decides the validity rule set the release is judged by
(`search_spaces.megatron_version.rule_set_for`: 0.16.1's up to 26.02.01, 0.19.2's from 26.04, whose
megatron-core 0.17 first has the checks 0.19 has). Releases before 25.09 (NeMo 2.0 containers, from NVIDIA's NeMo
performance summaries) pin no Megatron-Bridge.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Release", "RELEASES", "DEFAULT_RELEASE", "release_names", "resolve_release", "release_rule_set",
           "local_layer_graphs_refused"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Release:
    name: str  # the NeMo container tag, "26.06"
    bridge: str | None  # the Megatron-Bridge tag it ships
    rule_set: str  # the megatron-core rule set that judges it (search_spaces.megatron_version.RULE_SETS)


RELEASES: tuple[Release, ...] = (
    Release(name="24.03.01", bridge=None, rule_set="0.16.1"),
    Release(name="24.07", bridge=None, rule_set="0.16.1"),
    Release(name="25.02", bridge=None, rule_set="0.16.1"),
    Release(name="25.04", bridge=None, rule_set="0.16.1"),
    Release(name="25.07", bridge=None, rule_set="0.16.1"),
    Release(name="25.09", bridge="0.1.0rc3", rule_set="0.16.1"),
    Release(name="25.11", bridge="0.2.0", rule_set="0.16.1"),
    Release(name="26.02", bridge="0.3.0", rule_set="0.16.1"),
    Release(name="26.02.01", bridge="0.3.1", rule_set="0.16.1"),
    Release(name="26.04", bridge="0.4.0", rule_set="0.19.2"),
    Release(name="26.04.01", bridge="0.4.2", rule_set="0.19.2"),
    Release(name="26.06", bridge="0.5.0", rule_set="0.19.2"),
    Release(name="26.06.01", bridge="0.5.1", rule_set="0.19.2"),
    Release(name="26.08", bridge="0.6.0", rule_set="0.19.2"),
)
DEFAULT_RELEASE = RELEASES[-1].name
_BY_NAME = {r.name: r for r in RELEASES}


def release_names() -> tuple[str, ...]:
    return tuple(r.name for r in RELEASES)


def _numbers(text: str) -> tuple[int, ...] | None:
    match = re.fullmatch(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?(?:rc\d+)?\s*", text)
    return None if match is None else tuple(int(p or 0) for p in match.groups())


def resolve_release(text: str) -> tuple[str, str | None]:
    """(release name, warning or None) for what a user wrote: a NeMo container tag ("26.06", "26.6") or a
    Megatron-Bridge version ("0.5.1", "v0.6.2"). A release autotune has no factors for resolves to the newest one
    not newer than it (the oldest when it predates them all), with a warning that says so. Raises ValueError for
    text that is neither."""
    numbers = _numbers(str(text))
    if numbers is None:
        raise ValueError(f"release must be a NeMo container tag such as {DEFAULT_RELEASE} or a Megatron-Bridge "
                         f"version such as 0.6.2, but got {text!r}; known releases: {', '.join(release_names())}.")
    if numbers[0] == 0:  # a Megatron-Bridge version: the container that ships that minor release
        shipped = [r for r in RELEASES if r.bridge is not None and _numbers(r.bridge) is not None]
        same = [r for r in shipped if _numbers(r.bridge or "")[:2] == numbers[:2]]  # type: ignore[index]
        if same:
            return same[-1].name, None
        older = [r for r in shipped if _numbers(r.bridge or "") < numbers]  # type: ignore[operator]
        chosen = older[-1] if older else shipped[0]
        return chosen.name, (f"no release ships Megatron-Bridge {text}; predicting for {chosen.name} "
                             f"(Bridge {chosen.bridge}), the nearest one autotune has factors for")
    for r in RELEASES:
        if _numbers(r.name) == numbers:
            return r.name, None
    older = [r for r in RELEASES if (_numbers(r.name) or ()) < numbers]
    chosen = older[-1] if older else RELEASES[0]
    return chosen.name, (f"autotune has no factors for release {text}; predicting for {chosen.name}, the nearest "
                         f"one (known: {', '.join(release_names())})")


def local_layer_graphs_refused(name: str) -> str | None:
    """Megatron-Bridge's message when release `name` refuses per-layer `local` CUDA graphs, or None. Bridge 0.6.0
    added `utils/cuda_graph.py` `validate_cuda_graph_configuration`, which allows `cuda_graph_impl="local"` only for
    full-iteration graphs; every earlier tag (v0.1.0rc3 to v0.5.1, read in the Megatron-Bridge mirror) and the NeMo
    2.0 containers before it run megatron-core's per-layer local graphs. Megatron-LM's own launcher takes them on
    every release."""
    bridge = _BY_NAME[name].bridge
    numbers = None if bridge is None else _numbers(bridge)
    if numbers is None or numbers < (0, 6, 0):
        return None
    return (f'Megatron Bridge supports model.cuda_graph_impl="local" only for full-iteration CUDA graphs (Bridge '
            f'{bridge}, release {name}). Use model.cuda_graph_impl="transformer_engine" for scoped CUDA graph capture '
            'such as "attn" or "mlp".')


def release_rule_set(name: str) -> str:
    """The megatron-core rule set that judges release `name` (one of `release_names()`)."""
    return _BY_NAME[name].rule_set
