"""The search's decision, typed once: what the terminal, best.json, trials.csv, report.html and a notebook read.

    decision = result.decision        # Decision: the pick, the ties, how sure and why, the warnings, your layouts
    decision.to_dict()                # best.json's `decision` (field names are its keys; a field that does not
                                      #   apply, None, is left out)

`autotune.tuning.ranking.decide` ranks arrays of layouts by row (`Ranking`); `autotune.tuning.analytic_search`
names the rows and adds what the search knows (the whole space's counts, the warnings, the verdicts on the user's
layouts) to make this one `Decision`. Plain dataclasses: no numpy, no Ray, no Optuna.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

__all__ = ["Decision", "MemoryWarning", "PipelineWarning", "RiskierLayout", "Verdict", "MODEL", "GPU", "PROXY"]

MODEL, GPU = "model", "GPU measurements"
PROXY = "model; CPU proxy checked that layouts build and train"  # CPU-proxy jobs never overrule the model


def _plain(value: Any) -> Any:
    """JSON-ready data: a nested record as its dict, a tuple as a list."""
    if is_dataclass(value) and not isinstance(value, type):
        return _as_dict(value)
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def _as_dict(record: Any) -> dict[str, Any]:
    """A record's fields by name, leaving out those that do not apply (None)."""
    return {f.name: _plain(getattr(record, f.name)) for f in fields(record) if getattr(record, f.name) is not None}


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryWarning:
    """The pick's free memory is inside the memory model's error: the margin to keep and what it costs
    (`autotune.tuning.ranking.memory_margin`)."""

    free_gib: float
    error_gib: float
    memory_resolution: float
    headroom_gib: float  # the --headroom-gib that keeps the error free
    text: str
    layout: str | None = None  # what the same rule picks with that headroom (None: nothing fits then)
    tokens_per_s_per_gpu: float | None = None
    change: float | None = None  # its tokens/s relative to the pick's
    free_then_gib: float | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class RiskierLayout:
    """A layout the model calls faster than the pick whose free memory is inside the memory model's error: shown
    beside the pick, never instead of it (`autotune.tuning.ranking.riskier_layout`)."""

    layout: str
    tokens_per_s_per_gpu: float
    change: float  # its tokens/s relative to the pick's
    free_gib: float
    error_gib: float
    text: str


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineWarning:
    """The global batch leaves a pipeline starved, and the batch that feeds it (`autotune.tuning.batch_advice`)."""

    layout: str
    pick: bool  # the layout starved is the pick (else the fastest of its PP degree, beaten by the pick)
    global_batch_size: int
    microbatches: int
    pp: int
    vpp: int
    bubble_share: float
    suggested_global_batch_size: int
    text: str
    tokens_per_s_per_gpu_at_suggested: float | None = None
    mfu_at_suggested: float | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Verdict:
    """One of the user's layouts against the search (`autotune.tuning.verdicts.verdict`)."""

    layout: str
    status: str  # ok, oom, invalid (the model's word)
    fits: bool
    in_space: bool = False  # a layout of the searched space (else scored on its own)
    tokens_per_s_per_gpu: float | None = None
    mfu: float | None = None
    memory_gib: float | None = None
    free_gib: float | None = None
    over_gib: float | None = None
    host_memory: str | None = None  # why it does not fit when the device does: offload beyond the host's memory
    violations: tuple[str, ...] = ()
    rank: int | None = None  # among every layout that fits (1 = the fastest)
    of: int | None = None
    change_vs_pick: float | None = None
    is_pick: bool = False
    tied: bool = False
    largest_time_term: str | None = None
    largest_time_share: float | None = None
    largest_memory_term: str | None = None
    better: str | None = None  # the fastest layout that fits in no more memory, when faster than this one
    better_change: float | None = None
    better_free_gib: float | None = None
    nearest: str | None = None  # the nearest variant that fits, when this one does not
    nearest_changes: tuple[str, ...] = ()
    nearest_tokens_per_s_per_gpu: float | None = None
    nearest_free_gib: float | None = None
    measured: dict[str, Any] | None = None  # what a measuring backend found for it
    pick_gain: float | None = None  # the pick's predicted tokens/s over this layout's, minus 1
    gain_terms: tuple[tuple[str, float, float], ...] = ()  # (term, this layout's s, the pick's s) per step
    no_measurable_gain: float | None = None  # the pick's gain lies inside this relative error of the model on two
    #   layouts of one job (exp(Calibration.pair_band) - 1): reported as no measurable gain, not a win
    unverified: str | None = None  # a gain above verdicts.UNVERIFIED_GAIN and the pair error: the term it rests on
    unverified_share: float | None = None  # that term's share of the step time the pick saves
    recipe: str | None = None  # where NVIDIA published this layout, when it is the job's baseline
    published_tokens_per_s_per_gpu: float | None = None  # what NVIDIA measured with it (the same job only)
    recipe_differs: tuple[str, ...] = ()  # how the published row's job differs from this one (empty: the same)


@dataclass(frozen=True, kw_only=True, slots=True)
class Decision:
    """Which layout the search picks, how sure it is and why (module docstring). Layouts are named by their text.

    `stage`: "analytic" (the model's whole-space pick) or "measured" (by GPU measurements); `basis`: whose figures
    (MODEL, GPU or PROXY). `tied`: how many layouts are within `tolerance` of the fastest, `tied_layouts` the first
    of them (`analytic_search.MAX_TIED_LISTED`). `within_band`: other layouts inside the pick's band (`band`, the
    (low, high) log-ratio of a prediction; None for measurements). `model_pick`: the model's pick when it failed
    to build or train and the next was picked; `analytic_pick`: the model's pick beside a measured one."""

    stage: str
    basis: str
    pick: str | None
    confidence: str  # "clear", "within the model's uncertainty", "measured", "measured, tied", "none", "" (unknown)
    reason: str
    fastest: str | None = None
    tied: int = 0
    tied_layouts: tuple[str, ...] = ()
    tolerance: float | None = None
    within_band: int = 0
    band: tuple[float, float] | None = None
    memory_resolution: float | None = None
    error_free: bool = False  # picked among the layouts that leave the memory model's error free (those first)
    fastest_tokens_per_s_per_gpu: float | None = None
    pick_tokens_per_s_per_gpu: float | None = None
    pick_free_gib: float | None = None
    dominated_ties: int = 0  # tied layouts another beats on speed at no more memory
    runner_up_margin: float | None = None  # how far the next layout is behind the pick (relative tokens/s)
    space_size: int | None = None
    space: dict[str, Any] = field(default_factory=dict)  # the whole space's counts (`analytic_search.space_counts`)
    measured: int | None = None  # layouts measured (a measuring backend)
    memory_warning: MemoryWarning | None = None
    riskier: RiskierLayout | None = None
    pipeline_warning: PipelineWarning | None = None
    yours: tuple[Verdict, ...] = ()
    model_pick: str | None = None
    analytic_pick: str | None = None
    proxy: dict[str, Any] | None = None  # CPU proxy: measured, ran, failed, timed_out, failed_layouts

    @property
    def sentence(self) -> str:
        """The confidence sentence the terminal, the report's Winner box and the notebook show."""
        if not self.confidence or self.confidence == "none":
            return ""
        return f"Pick: {self.confidence} ({self.basis}): {self.reason}."

    @property
    def overruled(self) -> str | None:
        """The model's own pick when the pick is another (measured faster, or the model's failed); else None."""
        own = self.analytic_pick if self.stage == "measured" else self.model_pick
        return own if own is not None and own != self.pick else None

    @property
    def warnings(self) -> tuple[str, ...]:
        """The memory-margin, riskier-layout and pipeline-batch warnings' texts, as the terminal and the report
        print them."""
        return tuple(w.text for w in (self.memory_warning, self.riskier, self.pipeline_warning) if w is not None)

    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)
