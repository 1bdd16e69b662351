"""Seed layouts: the rules of thumb of the parallelism guide, made valid for the job, and the user's own.

The bands (Megatron-Bridge parallelism guide, restated in docs: shared/reference/parallelism.md,
"Rules of thumb"), by total parameters:

    dense  <1B: DP only | 1-10B: TP 2-4 | 10-70B: TP 4-8, PP 2-4 | 70-175B: TP 8, PP 4-8 | 175-500B: TP 8, PP 8-16, CP 2
    MoE    <20B: EP only | 20-100B: TP 1-2, PP 2-4, EP 8-16 | 100-500B: TP 2-4, PP 8-16, EP 8-32
           | 500B+: TP 2, PP 16, EP 32-64

and by sequence length: 8K-32K adds CP 2, 32K+ CP 4 to 8; SP on whenever TP > 1; VPP on whenever PP > 1;
micro-batch 1, the distributed optimizer on, selective recompute (the guide's starting point).

A band's wish is made valid by walking the feasible space in its own dimension order and taking,
at each dimension, the offered option nearest the wish (log2 distance, ties to the smaller), so a
seed is always a layout of the space: a rule of thumb that does not fit this cluster bends to the
nearest layout that does, never to an invalid one.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from search_spaces.job import Job
from search_spaces.layout import Layout, parse_layout
from search_spaces.space import DIMENSIONS, FeasibleSpace

__all__ = ["Seed", "Band", "DENSE_BANDS", "MOE_BANDS", "band_for", "rule_of_thumb_seeds", "nearest_layout",
           "neighbours", "parse_user_layouts"]

B = 1e9


@dataclass(frozen=True, kw_only=True, slots=True)
class Band:
    """One row of the guide's table: up to `max_params` total parameters, these ranges per dimension."""

    label: str
    max_params: float
    tp: tuple[int, ...] = (1,)
    pp: tuple[int, ...] = (1,)
    ep: tuple[int, ...] = (1,)
    cp: tuple[int, ...] = (1,)


DENSE_BANDS: tuple[Band, ...] = (
    Band(label="dense <1B: DP only", max_params=1 * B),
    Band(label="dense 1-10B: TP 2-4", max_params=10 * B, tp=(2, 4)),
    Band(label="dense 10-70B: TP 4-8 + PP 2-4", max_params=70 * B, tp=(4, 8), pp=(2, 4)),
    Band(label="dense 70-175B: TP 8 + PP 4-8", max_params=175 * B, tp=(8,), pp=(4, 8)),
    Band(label="dense 175-500B: TP 8 + PP 8-16 + CP 2", max_params=500 * B, tp=(8,), pp=(8, 16), cp=(2,)),
    Band(label="dense 500B+: TP 8 + PP 16 + CP 2", max_params=math.inf, tp=(8,), pp=(16,), cp=(2,)),
)
MOE_BANDS: tuple[Band, ...] = (
    Band(label="MoE <20B: EP only", max_params=20 * B, ep=(8,)),
    Band(label="MoE 20-100B: TP 1-2 + PP 2-4 + EP 8-16", max_params=100 * B, tp=(1, 2), pp=(2, 4), ep=(8, 16)),
    Band(label="MoE 100-500B: TP 2-4 + PP 8-16 + EP 8-32", max_params=500 * B, tp=(2, 4), pp=(8, 16), ep=(8, 32)),
    Band(label="MoE 500B+: TP 2 + PP 16 + EP 32-64", max_params=math.inf, tp=(2,), pp=(16,), ep=(32, 64)),
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Seed:
    layout: Layout
    origin: str  # "rule of thumb: <band>" or "user"


def band_for(job: Job) -> Band:
    bands = MOE_BANDS if job.model.is_moe else DENSE_BANDS
    total = job.model.total_params
    return next(b for b in bands if total < b.max_params)


def _cp_for_sequence(seq_length: int) -> tuple[int, ...]:
    """By sequence length: < 8K no CP; 8K-32K CP 2; 32K+ CP 4 to 8."""
    if seq_length < 8192:
        return (1,)
    if seq_length < 32768:
        return (2,)
    return (4, 8)


def _distance(option: object, wish: object) -> tuple[float, float]:
    if isinstance(option, bool) or isinstance(wish, bool) or isinstance(option, str) or isinstance(wish, str):
        return (0.0 if option == wish else 1.0, 0.0)
    a, b = _size(option), _size(wish)
    return (abs(math.log2(a) - math.log2(b)), a)


def _size(value: object) -> float:
    """A dimension's size as a number; None (no VPP, ETP = TP) counts as 1."""
    if value is None:
        return 1.0
    if not isinstance(value, int | float):
        raise TypeError(f"a layout dimension's size must be a number, not {value!r}")
    return float(value or 1)


def nearest_layout(space: FeasibleSpace, wish: Mapping[str, object]) -> Layout:
    """The layout of `space` nearest `wish`, one dimension at a time in the space's order.

    Dimensions missing from `wish` take the first option offered. Always a layout of the space.
    """
    values: dict[str, object] = {}
    for name in DIMENSIONS:
        options = space.choices(name, values)
        if name in wish and wish[name] in options:
            values[name] = wish[name]
        elif name in wish:
            values[name] = min(options, key=lambda o: _distance(o, wish[name]))
        else:
            values[name] = options[0]
    return space.layout(values)


def _wishes(job: Job, space: FeasibleSpace, band: Band) -> Iterable[dict[str, object]]:
    cps = tuple(sorted(set(band.cp) | set(_cp_for_sequence(job.training.seq_length))))
    recompute = "selective" if "selective" in space.options.recompute else space.options.recompute[0]
    dist_opt = True if True in space.options.dist_opt else space.options.dist_opt[0]
    for tp, pp, ep, cp in itertools.product(band.tp, band.pp, band.ep, cps):
        yield {"tp": tp, "cp": cp, "pp": pp, "vpp": 2 if pp > 1 else None, "ep": ep, "etp": 1 if ep > 1 else None,
               "mbs": 1, "sp": tp > 1, "dist_opt": dist_opt, "recompute": recompute}


def rule_of_thumb_seeds(job: Job, space: FeasibleSpace, *, limit: int = 8) -> list[Seed]:
    """Up to `limit` distinct valid layouts from the job's band; [] when the space is empty."""
    if not space.shapes:
        return []
    band = band_for(job)
    seeds: list[Seed] = []
    seen: set[Layout] = set()
    for wish in _wishes(job, space, band):
        layout = nearest_layout(space, wish)
        if layout not in seen:
            seen.add(layout)
            seeds.append(Seed(layout=layout, origin=f"rule of thumb: {band.label}"))
        if len(seeds) >= limit:
            break
    return seeds


def parse_user_layouts(job: Job, texts: Sequence[str]) -> list[Seed]:
    """`--layout` texts as seeds (dp derived from the world size); ValueError names the bad text."""
    seeds = []
    for text in texts:
        try:
            layout = parse_layout(text, world_size=job.world_size)
        except ValueError as e:
            raise ValueError(f"--layout {text!r}: {e}") from None
        seeds.append(Seed(layout=layout, origin="user"))
    return seeds


def neighbours(space: FeasibleSpace, layout: Layout) -> list[Layout]:
    """Layouts of `space` one move from `layout`: one dimension changed to another offered option, the
    later dimensions kept where still offered and otherwise moved to the nearest (dp follows). A layout outside
    the space (a user's `--layout`) has the neighbours of the nearest layout of the space instead."""
    from autotune.tuning.space_sampler import params_of

    try:
        params_of(space, layout)
    except ValueError:
        nearest = nearest_layout(space, layout.short_dict())
        return [nearest, *(n for n in neighbours(space, nearest) if n != layout)] if nearest != layout else []
    current = layout.short_dict()
    values: dict[str, object] = {}
    out: list[Layout] = []
    seen = {layout}
    for name in DIMENSIONS:
        for option in space.choices(name, values):
            if option == current[name]:
                continue
            candidate = nearest_layout(space, {**current, **values, name: option})
            if candidate not in seen:
                seen.add(candidate)
                out.append(candidate)
        values[name] = current[name]
    return out
