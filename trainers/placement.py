"""Where a measured trial's ranks run: one Ray placement group per worker group, bundles that keep a TP group (and,
where asked, an EP x ETP group) on one node.

megatron-core numbers ranks TP-fastest (the order "tp-cp-ep-dp-pp" of `parallel_state.RankGenerator`): ranks r and
r' share a TP group iff r // tp == r' // tp. The expert side ("tp-ep-dp-pp" over ETP) keeps each EP x ETP group
inside one block of ep * etp consecutive ranks. So a bundle of k consecutive ranks, k = tp (or lcm(tp, ep * etp)
where EP must stay inside a node), holds whole groups, and Ray places a bundle whole on one node. The placement
group's strategy is PACK: fill a node with bundles before the next, as a multi-node job is laid out. Both k | world:
world % tp == 0, and megatron-core's folding needs world % (pp * ep * etp) == 0.

Two answers before anything starts: `refusal(placement, nodes)` says why a group can never be placed on these
nodes (a bundle larger than every node, or more bundles than the nodes hold when idle); a group that fits but
finds the resources busy waits for them in Ray's queue (`ray.util.placement_group`).
Pure arithmetic on the nodes' total resources (`ray.nodes()`); nothing here imports Ray.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["GroupPlacement", "ranks_per_bundle", "refusal", "ranks_held", "alive_nodes", "STRATEGY"]

STRATEGY = "PACK"  # Ray's bundle strategy: as few nodes as the bundles allow


def ranks_per_bundle(*, tp: int, ep: int = 1, etp: int = 1, experts_within_node: bool = False) -> int:
    """Consecutive ranks that must share a node: the TP group, or with `experts_within_node` also the EP x ETP
    group (k = lcm(tp, ep * etp))."""
    for name, value in (("tp", tp), ("ep", ep), ("etp", etp)):
        if value < 1:
            raise ValueError(f"`{name} >= 1` must hold, but got ({name}={value}).")
    return math.lcm(tp, ep * etp) if experts_within_node else tp


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupPlacement:
    """`world` ranks in bundles of `ranks_per_bundle` consecutive ranks, each rank holding `per_rank`."""

    world: int
    ranks_per_bundle: int = 1
    per_rank: tuple[tuple[str, float], ...] = ()  # Ray resources each rank's actor holds (no zero amounts)

    def __post_init__(self) -> None:
        if self.world < 1 or self.ranks_per_bundle < 1 or self.world % self.ranks_per_bundle:
            raise ValueError(f"world ({self.world}) must be a positive multiple of ranks_per_bundle "
                             f"({self.ranks_per_bundle}).")

    @property
    def num_bundles(self) -> int:
        return self.world // self.ranks_per_bundle

    @property
    def bundle(self) -> dict[str, float]:
        """One bundle: `ranks_per_bundle` ranks' resources ({} when the ranks hold nothing: no placement group)."""
        return {name: amount * self.ranks_per_bundle for name, amount in self.per_rank if amount > 0}

    @property
    def bundles(self) -> list[dict[str, float]]:
        return [self.bundle for _ in range(self.num_bundles)]

    def bundle_of(self, rank: int) -> int:
        return rank // self.ranks_per_bundle

    def describe(self) -> str:
        return f"{self.num_bundles} x {_resources(self.bundle)} ({self.ranks_per_bundle} ranks each, {STRATEGY})"


def _resources(amounts: Mapping[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(amounts.items())) + "}"


def _fits(node: Mapping[str, float], bundle: Mapping[str, float]) -> int:
    """How many `bundle`s a node holds when idle."""
    return min((int(node.get(k, 0.0) // v) for k, v in bundle.items()), default=0)


def ranks_held(nodes: Sequence[Mapping[str, float]], *, ranks_per_bundle: int, per_rank: Mapping[str, float]) -> int:
    """Ranks these nodes hold when idle in whole bundles of `ranks_per_bundle` ranks, each rank `per_rank`."""
    bundle = {k: v * ranks_per_bundle for k, v in per_rank.items() if v > 0}
    return sum(_fits(node, bundle) for node in nodes) * ranks_per_bundle


def alive_nodes(nodes: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
    """The total resources of every alive node of a `ray.nodes()` answer."""
    return [dict(n.get("Resources") or {}) for n in nodes if n.get("Alive")]


def refusal(placement: GroupPlacement, nodes: Sequence[Mapping[str, float]]) -> str:
    """'' when these nodes (their total resources) can hold every bundle of `placement`; else why not, in one line."""
    bundle = placement.bundle
    if not bundle:
        return ""
    held = [_fits(node, bundle) for node in nodes]
    if sum(held) >= placement.num_bundles:
        return ""
    keys = sorted(bundle)
    largest = max(nodes, key=lambda n: [n.get(k, 0.0) for k in keys], default={})
    have = _resources({k: largest.get(k, 0.0) for k in keys})
    if not any(held):
        return (f"{placement.ranks_per_bundle} ranks that must share a node (a TP group) need {_resources(bundle)} "
                f"on one node, but the largest of this cluster's {len(nodes)} nodes has {have}")
    return (f"{placement.world} ranks in {placement.describe()} need {placement.num_bundles} bundles, but this "
            f"cluster's {len(nodes)} nodes hold {sum(held)} when idle (at most {max(held)} on one node, {have})")
