"""`Result`: a search's outcome for people (tables, launch forms, plots, the report), over `SearchResult`.

The notebook and API face of a search (`autotune.search(...)` returns one); everything is read from the search's
one answer (`raw.answer`, `autotune.tuning.answer.Answer`), so the CLI, the report and a notebook show the same
pick, ranking, Pareto front and verdicts.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.units import GIB

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from autotune.tuning.answer import Answer
    from autotune.tuning.decision import Decision, Verdict
    from search_spaces.measurement import Measurement

__all__ = ["Result"]



class Result:
    """A search's outcome for people: the best layout, the Pareto front, every trial, launch forms, plots.

    Wraps the search driver's result (`raw`); everything here is derived from it.
    """

    def __init__(self, raw: Any, *, dashboard_url: str | None = None) -> None:
        self.raw = raw
        self.dashboard_url = dashboard_url
        self._trials: pd.DataFrame | None = None

    # --- facts -----------------------------------------------------------------------------
    @property
    def job(self) -> Job:
        return self.raw.job

    @property
    def measurements(self) -> list[Measurement]:
        """Every trial's measurement, in trial order."""
        return list(self.raw.measurements)

    @property
    def answer(self) -> Answer:
        """The search's one answer: pick, ranking, Pareto front, typed decision, verdicts on your layouts."""
        return self.raw.answer

    @property
    def best_measurement(self) -> Measurement | None:
        """The pick's figures: the fastest layout that fits up to ties, never one another beats on speed at no more
        memory (docs/search.md), or None when nothing fits."""
        return self.raw.best

    @property
    def decision(self) -> Decision:
        """How sure the pick is and why, typed: `confidence`, `reason`, `tied_layouts`, `stage`, `basis`,
        `memory_warning`, `pipeline_warning`, `yours` (`decision.to_dict()` is best.json's `decision`)."""
        return self.answer.decision

    @property
    def confidence(self) -> str:
        """The confidence sentence the terminal and the report's Winner box show."""
        return self.answer.decision.sentence

    @property
    def yours(self) -> list[Verdict]:
        """The verdict on each `compare=` layout: fits or not (and by what), tokens/s, change vs the pick, rank."""
        return list(self.answer.yours)

    @property
    def best(self) -> Layout | None:
        """The picked layout, or None when nothing fits."""
        best = self.best_measurement
        return None if best is None else best.layout

    @property
    def capacity_gib(self) -> float:
        """The GPU's memory (the line on the plots); feasibility also keeps the search's headroom free."""
        return self.job.cluster.gpu.memory_gib

    @property
    def usable_gib(self) -> float:
        """The GPU's memory minus the search's headroom: what "feasible" means (the second line on the plots)."""
        return self.raw.capacity_bytes / GIB

    @property
    def headroom_gib(self) -> float:
        return self.raw.headroom_bytes / GIB

    @property
    def output_dir(self) -> str | None:
        return getattr(self.raw, "output_dir", None)

    @property
    def title(self) -> str:
        c = self.job.cluster
        return f"autotune: {self.job.model.name} on {c.nodes} x {c.gpus_per_node} {c.gpu.name}"

    # --- tables ----------------------------------------------------------------------------
    @property
    def trials(self) -> pd.DataFrame:
        """One row per trial: number, layout fields, status, feasible, tokens/s per GPU, memory, and the
        `time.*` (s) and `memory.*` (bytes) breakdowns."""
        if self._trials is None:
            from autotune.outputs.plots import trials_frame

            self._trials = trials_frame(self.raw.records)
        return self._trials

    @property
    def pareto(self) -> pd.DataFrame:
        """Feasible layouts no other beats on both tokens/s per GPU (higher) and memory per GPU (lower): the pick
        first, then fastest first (the CLI's and the report's order)."""
        from autotune.outputs.plots import trials_frame

        return trials_frame(self.raw.pareto)

    def top(self, k: int = 10) -> pd.DataFrame:
        """The first k distinct feasible layouts in the search's (and the CLI's) ranking order: the pick first."""
        from autotune.outputs.plots import trials_frame

        return trials_frame(self.raw.ranked[:k])

    @property
    def ranking(self) -> list[Layout]:
        """Every distinct feasible layout, best first: the order the CLI prints."""
        return [r.layout for r in self.raw.ranked]

    # --- launch forms ----------------------------------------------------------------------
    @property
    def launch(self) -> dict[str, str]:
        """The winner as launch text: `megatron_bridge` (Megatron-Bridge overrides), `megatron_lm` (Megatron-LM
        arguments), each one shell line."""
        return self.launch_forms()

    def launch_forms(self) -> dict[str, str]:
        from autotune.outputs.launch import launch_forms

        best = self.best
        return {} if best is None else launch_forms(self.job, best)

    def job_summary(self) -> dict[str, object]:
        j, c, t = self.job, self.job.cluster, self.job.training
        precision = t.precision if j.fp8_recipe is None else f"{t.precision} ({j.fp8_recipe} scaling)"
        return {
            "model": j.model.name,
            "parameters": _count(j.model.total_params),
            "cluster": f"{c.nodes} nodes x {c.gpus_per_node} {c.gpu.name} ({c.gpu.memory_gib:.0f} GiB)",
            "usable memory per GPU": f"{self.usable_gib:.1f} GiB ({self.headroom_gib:.1f} GiB kept free)",
            "links": f"{c.intra_node.name} inside a node, {c.inter_node.name} between nodes",
            "sequence length": f"{t.seq_length:,}",
            "global batch size": f"{t.global_batch_size:,}",
            "precision": precision,
            "software release": f"{t.release} (throughput factors; megatron-core {t.megatron_core} rules)",
            "backend": _backend_text(self.raw),
        }

    # --- plots and report ------------------------------------------------------------------
    def plot_pareto(self) -> Figure:
        from autotune.outputs import plots

        a = self.answer
        return plots.pareto(self.trials, capacity_gib=self.capacity_gib, usable_gib=self.usable_gib,
                            pick=a.decision.pick, front=[str(r.layout) for r in a.pareto])

    def _model_frame(self, k: int) -> tuple[pd.DataFrame, list[str]]:
        from autotune.outputs.plots import trials_frame

        records = self.answer.model_records(k)
        return trials_frame(records), [str(r.layout) for r in records]

    def plot_time_breakdown(self, k: int = 5) -> Figure:
        from autotune.outputs import plots

        df, order = self._model_frame(k)
        return plots.time_breakdown(df, k=k, order=order, pick=self.answer.decision.pick)

    def plot_memory_breakdown(self, k: int = 5) -> Figure:
        from autotune.outputs import plots

        df, order = self._model_frame(k)
        return plots.memory_breakdown(df, k=k, capacity_gib=self.capacity_gib, usable_gib=self.usable_gib,
                                      order=order, pick=self.answer.decision.pick)

    def plot_progress(self) -> Figure:
        from autotune.outputs import plots

        return plots.progress(self.trials)

    def write_report(self, folder: str | Path) -> str:
        """Write `report.html` and the plot PNGs into `folder`; returns the report's path."""
        from autotune.outputs.report import write_report

        return write_report(self, folder)

    def _repr_html_(self) -> str:
        """Jupyter's view: the job, the winner with its launch forms, the top layouts (the report's sections)."""
        from autotune.outputs.report import summary_html

        return summary_html(self)

    def __repr__(self) -> str:
        feasible = int(self.trials["feasible"].sum()) if len(self.trials) else 0
        return (f"<autotune.Result {self.job.model.name}: {len(self.trials)} trials, {feasible} feasible, "
                f"best {self.best}>")


def _count(n: float) -> str:
    """A parameter count people read: `46.7 B`, `6.1 M`, `12 K` (a tiny test model is not `0.0 B`)."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:,.0f}"


def _backend_text(raw: Any) -> str:
    """The backend, and for the megatron backend whether its figures came from GPUs or the CPU proxy."""
    name = getattr(raw, "backend", "-")
    sources = {r.measurement.source for r in getattr(raw, "records", ())}
    if "megatron-cpu-proxy" in sources:
        return f"{name} (CPU proxy: checks that layouts build and train; its times are not GPU times)"
    if "megatron-gpu" in sources:
        return f"{name} (measured on GPUs)"
    return str(name)
