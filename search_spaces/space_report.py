"""How many candidates each validity rule rules out over the whole space (`rejections`): the `space` verb's and the
report's counts. A depth-first walk over the valid prefixes of the dimensions in `space.DIMENSIONS` order: each rule
is checked at the first dimension where everything it reads is assigned, and a prefix it breaks removes every
layout below it, counted against that rule (the first it breaks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from math import prod

from search_spaces.job import Job
from search_spaces.layout import SPLIT_FIELDS, Layout
from search_spaces.rules import Rule, rules_for
from search_spaces.space import DIMENSIONS, SpaceOptions, dimension_ranges, pipeline_fields, space_rules

__all__ = ["SpaceReport", "rejections"]


@dataclass(frozen=True, kw_only=True, slots=True)
class SpaceReport:
    """Candidates = product of `dimensions`; each rejected one counted against its first broken rule."""

    candidates: int
    feasible: int
    rejected_by: Mapping[str, int]
    dimensions: Mapping[str, tuple[object, ...]]

    @property
    def rejected(self) -> int:
        return self.candidates - self.feasible


def rejections(job: Job, options: SpaceOptions | None = None, *, version: str | None = None) -> SpaceReport:
    """Count candidates removed per rule by a depth-first walk over valid prefixes (see module docstring); `options`
    default: `SpaceOptions()`, every dimension open."""
    options = SpaceOptions() if options is None else options
    ranges = dimension_ranges(job, options)
    rules = rules_for(version or job.training.megatron_core) + space_rules(job, options)
    assigned: set[str] = set()
    due: list[tuple[Rule, ...]] = []  # rules that become checkable at each dimension
    for name in DIMENSIONS:
        assigned |= {name, "dp"} if name == "pp" else SPLIT_FIELDS | {name} if name == "vpp" else {name}
        due.append(tuple(r for r in rules if r.reads <= assigned and r not in sum(due, ())))
    last = max(i for i, d in enumerate(due) if d)
    counts = dict.fromkeys([r.name for r in rules], 0)
    remaining = [prod(len(ranges[d]) for d in DIMENSIONS[i + 1:]) for i in range(len(DIMENSIONS))]
    world = job.world_size
    prefixes: list[dict[str, object]] = [{}]
    for i, name in enumerate(DIMENSIONS[: last + 1]):
        survivors = []
        for prefix in prefixes:
            for value in ranges[name]:
                values = {**prefix, name: value}
                if name == "pp":
                    tp, cp = values["tp"], values["cp"]
                    assert isinstance(tp, int) and isinstance(cp, int) and isinstance(value, int)
                    model_size = tp * cp * value
                    values["dp"] = world // model_size if world % model_size == 0 else 1
                if name == "vpp":
                    pp = values["pp"]
                    assert isinstance(pp, int) and (value is None or isinstance(value, int))
                    values.update(pipeline_fields(job.model.num_layers, pp, value, job.model.mtp_num_layers,
                                                  hybrid=job.model.is_hybrid))
                broken = _first_broken(job, due[i], values)
                if broken is None:
                    survivors.append(values)
                else:
                    counts[broken] += remaining[i]
        prefixes = survivors
    feasible = len(prefixes) * remaining[last]
    candidates = prod(len(v) for v in ranges.values())
    return SpaceReport(candidates=candidates, feasible=feasible, rejected_by=counts, dimensions=ranges)


def _first_broken(job: Job, rules: tuple[Rule, ...], values: Mapping[str, object]) -> str | None:
    if not rules:
        return None
    layout = Layout(**values)  # type: ignore[arg-type]
    for rule in rules:
        if rule.check(job, layout) is not None:
            return rule.name
    return None
