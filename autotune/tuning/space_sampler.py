"""The define-by-run search space for Optuna: valid layouts only, by construction.

Dimensions are chosen in `search_spaces.space.DIMENSIONS` order and each one's options come from
`FeasibleSpace.choices(name, earlier_choices)`, a dictionary look-up, so the function does no real
work (Ray Tune's OptunaSearch asks exactly that of a define-by-run space) and every proposal is a
valid layout: every prefix the space offers has a valid completion.

Optuna wants one fixed choice list per parameter name, so a dimension whose options depend on the
earlier choices gets a name that carries what they depend on. Two namings:

- `"options"` (the default): the name carries the option list itself, `pp:1,2,4,8`. Parents that
  offer the same options share one parameter, so the sampler learns from all of them (a deep
  path-specific parameter would see one or two trials in a whole search).
- `"path"`: the name carries the parent choices, `pp_tp2_cp1` (`FeasibleSpace.param_name`).

`params_of(space, layout)` gives the parameter dict of a layout of the space (for seeds and for
telling a study about finished trials); `layout_of(space, config)` reads a proposal back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, cast

from search_spaces.layout import Layout
from search_spaces.space import DIMENSIONS, FeasibleSpace

if TYPE_CHECKING:
    from optuna.distributions import CategoricalChoiceType

__all__ = ["Naming", "define_by_run", "param_name", "params_of", "layout_of", "dimension_of", "distributions_of"]

Naming = Literal["options", "path"]
_BY_LENGTH = sorted(DIMENSIONS, key=len, reverse=True)


def _text(value: object) -> str:
    return str(value).lower()


def param_name(space: FeasibleSpace, name: str, values: Mapping[str, object], options: tuple[object, ...],
               naming: Naming = "options") -> str:
    """The Optuna parameter name of dimension `name` given the earlier `values` and its `options`."""
    if naming == "path":
        return space.param_name(name, values)
    return f"{name}:{','.join(_text(o) for o in options)}"


def dimension_of(key: str) -> str | None:
    """The dimension a parameter name belongs to (`pp:1,2,4` -> `pp`, `mbs_tp2_cp1` -> `mbs`); None if none."""
    for dim in _BY_LENGTH:
        if key == dim or key.startswith(dim + ":") or key.startswith(dim + "_"):
            return dim
    return None


def define_by_run(space: FeasibleSpace, naming: Naming = "options") -> Callable[[Any], None]:
    """An Optuna define-by-run function over `space` (suggest_categorical per dimension, nothing else)."""

    def define(trial: Any) -> None:
        values: dict[str, object] = {}
        for name in DIMENSIONS:
            options = space.choices(name, values)
            values[name] = trial.suggest_categorical(param_name(space, name, values, options, naming), list(options))
        return None

    return define


def _walk(space: FeasibleSpace, layout: Layout, naming: Naming) -> list[tuple[str, object, tuple[object, ...]]]:
    fields = layout.short_dict()
    values: dict[str, object] = {}
    steps = []
    for name in DIMENSIONS:
        options = space.choices(name, values)
        value = fields[name]
        if value not in options:
            raise ValueError(f"layout {layout} is outside the search space: {name}={_text(value)} is not one of "
                             f"{', '.join(_text(o) for o in options)} after {values or 'nothing'}.")
        steps.append((param_name(space, name, values, options, naming), value, options))
        values[name] = value
    return steps


def params_of(space: FeasibleSpace, layout: Layout, naming: Naming = "options") -> dict[str, object]:
    """The parameters `define_by_run` would suggest for `layout`; ValueError if it is not in the space."""
    return {key: value for key, value, _ in _walk(space, layout, naming)}


def distributions_of(space: FeasibleSpace, layout: Layout, naming: Naming = "options") -> dict[str, Any]:
    """Optuna distributions of the parameters of `layout` (for `optuna.trial.create_trial`)."""
    from optuna.distributions import CategoricalDistribution

    # a dimension's options are ints, bools, strings or None (Layout's field types): all Optuna categorical choices
    return {key: CategoricalDistribution(cast("list[CategoricalChoiceType]", list(options)))
            for key, _, options in _walk(space, layout, naming)}


def layout_of(space: FeasibleSpace, config: Mapping[str, object]) -> Layout:
    """The Layout of a proposal (a Tune config or Optuna params): one value per dimension, dp derived."""
    values: dict[str, object] = {}
    for key, value in config.items():
        dim = dimension_of(key)
        if dim is not None:
            values[dim] = value
    return space.layout(values)
