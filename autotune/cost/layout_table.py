"""Many layouts of one job as columns of numbers: what the vectorised scorer (`autotune/cost/score.py`) reads.

A `LayoutTable` holds one numpy array per `Layout` field, all of the same length. Optional fields are stored as
integers with 0 for None (`vpp`, `etp`, `first_stage_layers`, `last_stage_layers`), `recompute` as its index in
`RECOMPUTE_CHOICES`, `cuda_graphs` as its index in `CUDA_GRAPH_CHOICES`, `pipeline_layout` as an index into the
table's `layout_strings` (0 for None, the strings themselves kept once per table). Build one from Layout objects
(`from_layouts`), from arrays (`from_arrays`), or straight from a feasible space without making a Layout per row
(`from_space`, in the order `FeasibleSpace.layouts()` yields). `layout(i)` turns row i back into the Layout it
stands for. The arrays are read-only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from search_spaces.layout import CUDA_GRAPH_CHOICES, RECOMPUTE_CHOICES, Layout
from search_spaces.space import CONTEXTS, FeasibleSpace, pipeline_fields

__all__ = ["LayoutTable", "COLUMNS"]

COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(Layout))
_OPTIONAL = ("vpp", "etp", "first_stage_layers", "last_stage_layers")
_BOOLS = ("sp", "dist_opt", "embedding_loss_split", "ep_overlap", "fsdp")
_CODED = {"recompute": RECOMPUTE_CHOICES, "cuda_graphs": CUDA_GRAPH_CHOICES}  # stored as the index of the value
_DEFAULTS: dict[str, int] = {"tp": 1, "pp": 1, "vpp": 0, "cp": 1, "ep": 1, "etp": 0, "dp": 1, "mbs": 1, "sp": 0,
                             "dist_opt": 0, "recompute": 0, "first_stage_layers": 0, "last_stage_layers": 0,
                             "embedding_loss_split": 0, "pipeline_layout": 0, "cuda_graphs": 0, "ep_overlap": 0,
                             "fsdp": 0, "offload_layers": 0}


def _frozen(values: object, dtype: type) -> np.ndarray:
    out: np.ndarray = np.array(values, dtype=dtype)
    out.flags.writeable = False
    return out


@dataclass(frozen=True, eq=False, slots=True)
class LayoutTable:
    """One read-only array per Layout field (see the module docstring for the encoding)."""

    tp: np.ndarray
    pp: np.ndarray
    vpp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    dp: np.ndarray
    mbs: np.ndarray
    sp: np.ndarray
    dist_opt: np.ndarray
    recompute: np.ndarray
    first_stage_layers: np.ndarray
    last_stage_layers: np.ndarray
    embedding_loss_split: np.ndarray
    pipeline_layout: np.ndarray  # codes into layout_strings
    cuda_graphs: np.ndarray
    ep_overlap: np.ndarray
    fsdp: np.ndarray
    offload_layers: np.ndarray
    layout_strings: tuple[str | None, ...] = (None,)
    _python: list[list[object]] | None = field(default=None, init=False, repr=False)  # columns as Python values

    def __post_init__(self) -> None:
        n = len(self.tp)
        for name in COLUMNS:
            column = getattr(self, name)
            if column.ndim != 1 or len(column) != n:
                raise ValueError(f"every LayoutTable column must be 1-D of length {n}, but {name!r} has shape "
                                 f"{column.shape}.")

    # --- construction ---------------------------------------------------------------------------------------
    @classmethod
    def from_arrays(cls, *, layout_strings: Sequence[str | None] = (None,),
                    **columns: Sequence[int] | np.ndarray) -> LayoutTable:
        """Columns by field name, encoded as in the module docstring (`pipeline_layout` as codes into
        `layout_strings`, whose entry 0 is None); omitted fields take Layout's defaults."""
        if not layout_strings or layout_strings[0] is not None:
            raise ValueError("layout_strings[0] must be None (the code of a layout without a pipeline_layout).")
        unknown = sorted(set(columns) - set(COLUMNS))
        if unknown:
            raise ValueError(f"unknown layout field(s) {unknown}; fields: {', '.join(COLUMNS)}.")
        n = len(next(iter(columns.values()))) if columns else 0
        out = {}
        for name in COLUMNS:
            given = columns.get(name)
            values = np.full(n, _DEFAULTS[name]) if given is None else given
            out[name] = _frozen(values, np.bool_ if name in _BOOLS else np.int64)
        for name, choices in _CODED.items():
            if n and not np.all(out[name] < len(choices)):
                raise ValueError(f"{name} codes index {choices}, but got {sorted(set(out[name]))}.")
        if n and not np.all(out["pipeline_layout"] < len(layout_strings)):
            raise ValueError(f"pipeline_layout codes index {len(layout_strings)} layout strings.")
        return cls(**out, layout_strings=tuple(layout_strings))

    @classmethod
    def from_layouts(cls, layouts: Iterable[Layout]) -> LayoutTable:
        rows: list[dict[str, Any]] = [lay.short_dict() for lay in layouts]
        strings: dict[str | None, int] = {None: 0}
        columns: dict[str, list[Any]] = {}
        for name in COLUMNS:
            if name == "pipeline_layout":
                columns[name] = [strings.setdefault(r[name], len(strings)) for r in rows]
            elif name in _CODED:
                columns[name] = [_CODED[name].index(r[name]) for r in rows]
            elif name in _OPTIONAL:
                columns[name] = [r[name] or 0 for r in rows]
            else:
                columns[name] = [int(r[name]) for r in rows]
        return cls.from_arrays(layout_strings=tuple(strings), **columns)

    @classmethod
    def from_space(cls, space: FeasibleSpace) -> LayoutTable:
        """Every layout of `space`, row i being the i-th of `space.layouts()` (shape, then its switches in order),
        built from the space's shapes without a Layout per row."""
        job = space.job
        shapes = np.array([[s[0], s[1], s[2], s[3] or 0, s[4], s[5] or 0, s[6], int(s[7]), int(s[8]), int(s[9]),
                            s[10]] for s in space.shapes], dtype=np.int64).reshape(-1, 11)
        # each shape repeated once per switch of its switch context (ep_overlap, fsdp, offload > 0); the switches
        # laid out shape after shape
        switch = [np.array([(int(d), RECOMPUTE_CHOICES.index(r), CUDA_GRAPH_CHOICES.index(g))
                            for d, r, g in space.switches.get(c, ())], dtype=np.int64).reshape(-1, 3)
                  for c in CONTEXTS]
        context = shapes[:, 8] * 4 + shapes[:, 9] * 2 + (shapes[:, 10] > 0)  # the index into CONTEXTS
        sizes = np.array([len(x) for x in switch], dtype=np.int64)
        offsets = np.cumsum(sizes) - sizes
        counts = sizes[context]
        tp, cp, pp, vpp, ep, etp, mbs, sp, ep_overlap, fsdp, offload = (np.repeat(shapes[:, k], counts)
                                                                       for k in range(11))
        start = np.repeat(np.cumsum(counts) - counts, counts)
        position = np.arange(len(tp)) - start  # the row's index in its shape's switch list
        every = np.concatenate(switch)
        row_context = np.repeat(context, counts)
        chosen = every[offsets[row_context] + position] if len(tp) else every[:0]
        dist_opt, recompute, cuda_graphs = chosen[:, 0].astype(bool), chosen[:, 1], chosen[:, 2]
        split = {"first_stage_layers": np.zeros(len(tp), np.int64), "last_stage_layers": np.zeros(len(tp), np.int64),
                 "embedding_loss_split": np.zeros(len(tp), bool), "pipeline_layout": np.zeros(len(tp), np.int64)}
        strings: dict[str | None, int] = {None: 0}
        pairs, inverse = np.unique(np.stack([pp, vpp], axis=1), axis=0, return_inverse=True) if len(tp) else ((), ())
        for k, (p, v) in enumerate(pairs):
            rows = np.asarray(inverse).reshape(-1) == k
            for name, value in pipeline_fields(job.model.num_layers, int(p), int(v) or None,
                                               job.model.mtp_num_layers, hybrid=job.model.is_hybrid).items():
                # pipeline_layout (a str) is coded by its index in layout_strings; the others are ints and a bool
                if isinstance(value, str):
                    split[name][rows] = strings.setdefault(value, len(strings))
                else:
                    assert isinstance(value, int), (name, value)
                    split[name][rows] = int(value)
        return cls.from_arrays(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp, dp=job.world_size // (tp * cp * pp),
                               mbs=mbs, sp=sp, dist_opt=dist_opt, recompute=recompute, cuda_graphs=cuda_graphs,
                               ep_overlap=ep_overlap.astype(bool), fsdp=fsdp.astype(bool), offload_layers=offload,
                               layout_strings=tuple(strings), **split)

    # --- reading --------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.tp)

    def layout(self, i: int) -> Layout:
        """Row i as the Layout it encodes."""
        python = self._python
        if python is None:
            python = [self._decoded(name) for name in COLUMNS]
            object.__setattr__(self, "_python", python)
        return Layout(**{name: column[i] for name, column in zip(COLUMNS, python, strict=True)})  # type: ignore[arg-type]

    def _decoded(self, name: str) -> list[object]:
        values = getattr(self, name).tolist()
        if name in _CODED:
            return [_CODED[name][v] for v in values]
        if name == "pipeline_layout":
            return [self.layout_strings[v] for v in values]
        if name in _OPTIONAL:
            return [v or None for v in values]
        return values

    def layouts(self) -> list[Layout]:
        return [self.layout(i) for i in range(len(self))]

    def take(self, rows: np.ndarray | Sequence[int]) -> LayoutTable:
        """The rows `rows` (indices or a boolean mask), as a new table."""
        return LayoutTable(**{name: _frozen(getattr(self, name)[rows], getattr(self, name).dtype) for name in COLUMNS},
                           layout_strings=self.layout_strings)

    def with_column(self, name: str, values: np.ndarray | Sequence[int]) -> LayoutTable:
        """This table with column `name` replaced by `values` (encoded as the column is)."""
        if name not in COLUMNS:
            raise ValueError(f"unknown layout column {name!r}; columns: {', '.join(COLUMNS)}.")
        dtype = getattr(self, name).dtype
        return LayoutTable(**{n: _frozen(values, dtype) if n == name else getattr(self, n) for n in COLUMNS},
                           layout_strings=self.layout_strings)

    def columns(self) -> Mapping[str, np.ndarray]:
        return {name: getattr(self, name) for name in COLUMNS}

    # --- derived columns (as Layout's properties define them) ------------------------------------------------
    @property
    def vpp_size(self) -> np.ndarray:
        return np.where(self.vpp > 0, self.vpp, 1)

    @property
    def expert_tp(self) -> np.ndarray:
        return np.where(self.etp > 0, self.etp, self.tp)

    @property
    def world_size(self) -> np.ndarray:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def expert_dp(self) -> np.ndarray:
        return (self.tp * self.cp * self.dp) // (self.ep * self.expert_tp)

    def num_microbatches(self, global_batch_size: int) -> np.ndarray:
        return global_batch_size // (self.mbs * self.dp)
