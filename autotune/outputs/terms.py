"""The cost model's time and memory terms as people read them, and the few cells every view shares.

The term names are the cost model's own (`autotune.cost.throughput.TIME_KEYS`, `autotune.cost.memory.TERMS`); this
module only labels them, so the terminal, the report and the plots list the same terms in the same order. A
measuring backend's extra timings (`step_median`, `step_stdev`, ...) are statistics, not terms: they are never
stacked or named as what bounds a step.
"""

from __future__ import annotations

from typing import Any

from autotune.cost.memory import TERMS as MEMORY_KEYS
from autotune.cost.throughput import TIME_KEYS

__all__ = ["TIME_TERMS", "MEMORY_TERMS", "time_label", "bound_cell", "BOUND_HEADER", "BOUND_NOTE", "count_text",
           "share"]

_TIME_LABELS = {"compute": "compute", "recompute": "recompute", "tp_comm": "TP comm", "cp_comm": "CP ring",
                "ep_comm": "EP all-to-all", "host": "host", "pp_p2p": "PP p2p", "pp_bubble": "PP bubble",
                "dp_comm": "DP comm", "offload": "activation offload", "optimizer": "optimizer",
                "overhead": "overhead"}
TIME_TERMS: dict[str, str] = {k: _TIME_LABELS.get(k, k.replace("_", " ")) for k in TIME_KEYS}
MEMORY_TERMS: dict[str, str] = {k: k for k in MEMORY_KEYS}
BOUND_HEADER = "largest non-compute"
BOUND_NOTE = ("largest non-compute: the step-time term beyond compute that takes the most time, with its share of "
              "the step (host: CPU launch work the GPU waits for); MFU: model FLOPs (Megatron-LM's count) over the "
              "GPU's dense peak at the job's precision (an FP8 run's, the FP8 peak)")


def time_label(name: object) -> str:
    return "-" if not name else TIME_TERMS.get(str(name), str(name))


def bound_cell(measurement: Any) -> str:
    """`EP all-to-all 18%`: the largest time term beyond compute and its share ("-" without a breakdown)."""
    from autotune.tuning.answer import largest_time_term

    term = largest_time_term(measurement.time, measurement.step_time_s)
    return "-" if term is None else f"{time_label(term[0])} {share(term[1])}"


def share(x: float) -> str:
    """A share of the step: `18%`, `2%`, and below 1% with a decimal (`0.4%`), never a bare `0%`."""
    return f"{x:.0%}" if x >= 0.01 else f"{x:.1%}"


def count_text(n: int, what: str) -> str:
    return f"{n:,} {what}{'' if n == 1 else 's'}"
