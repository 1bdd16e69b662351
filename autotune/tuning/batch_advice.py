"""Too few micro-batches for the pipeline: the warning, and the global batch size that would not starve it.

With PP stages and VPP chunks per stage, the fill-and-drain bubble is (PP - 1) / VPP stage passes against the m
micro-batches of the steady state (Narayanan et al. 2021, arXiv 2104.04473, eq. 1 and Sec. 2.2.2), so its share
of the step is b = ((PP - 1) / VPP) / (m + (PP - 1) / VPP), m = GBS / (MBS * DP). The share stays at most
`BUBBLE_TARGET` (10%) when m >= (PP - 1) / VPP * (1 - target) / target; interleaving also needs m to be a
multiple of PP (megatron-core's interleaved schedule). The suggestion rounds m up to a power of two.

`pipeline_warning(answer)` warns when the pick's bubble (the model's own `pp_bubble` term) is above `BUBBLE_WARN` of
its step, or when the pick avoids pipelining but the fastest layout of some PP degree, starved now (bubble above the
target), would beat it at the batch that feeds it; it gives that GBS and the model's figure for the layout there.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from autotune.tuning.analytic_pass import AnalyticAnswer
from autotune.tuning.decision import PipelineWarning

__all__ = ["pipeline_warning", "suggested_global_batch", "BUBBLE_TARGET", "BUBBLE_WARN"]

BUBBLE_TARGET = 0.10
BUBBLE_WARN = 0.20


def suggested_global_batch(pp: int, vpp: int, mbs: int, dp: int, target: float = BUBBLE_TARGET) -> int:
    """The smallest GBS (a multiple of MBS * DP, of MBS * DP * PP with interleaving) whose bubble share is at most
    `target` for equal stages (module docstring)."""
    fill = (pp - 1) / vpp
    m = max(1, math.ceil(fill * (1 - target) / target - 1e-9))
    m = 1 << (m - 1).bit_length()  # a power of two, as global batches are
    if vpp > 1:
        m = -(-m // pp) * pp
    return m * mbs * dp


def _at_batch(answer: AnalyticAnswer, row: int, gbs: int) -> Any:
    """The analytic figures of row `row`'s layout with the global batch `gbs` (same capacity)."""
    from autotune.cost.analytic import AnalyticBackend

    job = answer.job
    bigger = replace(job, training=replace(job.training, global_batch_size=gbs))
    headroom = job.cluster.gpu.memory_bytes - answer.scores.capacity_bytes
    return AnalyticBackend(headroom_bytes=headroom, calibration=answer.cal).evaluate(bigger, answer.layout(row))


def pipeline_warning(answer: AnalyticAnswer) -> PipelineWarning | None:
    """The warning (module docstring), or None when the global batch feeds the pipelines."""
    d, s, t = answer.ranking, answer.scores, answer.table
    if d.pick is None:
        return None
    share = s.breakdown["pp_bubble"] / s.step_time_s
    pick_tps = float(s.tokens_per_s_per_gpu[d.pick])
    found: tuple[int, int, Any] | None = None  # (row, suggested GBS, figures there)
    if t.pp[d.pick] > 1 and share[d.pick] > BUBBLE_WARN:
        row = d.pick
        gbs = _suggested(t, row)
        found = (row, gbs, _at_batch(answer, row, gbs))
    elif t.pp[d.pick] == 1 or share[d.pick] <= BUBBLE_WARN:
        # the pick avoids a starved pipeline: would the fastest layout of some PP degree beat it with a larger batch?
        for pp in np.unique(t.pp[answer.eligible & (t.pp > 1)]):
            rows = np.flatnonzero(answer.eligible & (t.pp == pp))
            row = int(rows[np.argmax(s.tokens_per_s_per_gpu[rows])])
            if share[row] <= BUBBLE_TARGET:
                continue
            gbs = _suggested(t, row)
            there = _at_batch(answer, row, gbs)
            if there.status == "ok" and (there.tokens_per_s_per_gpu or 0) > pick_tps * (1 + d.tolerance) and (
                    found is None or there.tokens_per_s_per_gpu > found[2].tokens_per_s_per_gpu):
                found = (row, gbs, there)
    if found is None:
        return None
    row, suggested, there = found
    gbs = answer.job.training.global_batch_size
    pp, vpp, mbs, dp = int(t.pp[row]), int(t.vpp_size[row]), int(t.mbs[row]), int(t.dp[row])
    m = gbs // (mbs * dp)
    layout = answer.layout(row)
    figures: dict[str, Any] = {}
    if there.status == "ok" and there.tokens_per_s_per_gpu:
        figures = {"tokens_per_s_per_gpu_at_suggested": there.tokens_per_s_per_gpu, "mfu_at_suggested": there.mfu}
    who = "the pick" if row == d.pick else f"the fastest PP {pp} layout ({layout})"
    text = (f"global batch {gbs} leaves {m} micro-batch{'es' if m != 1 else ''} per step for {who}: with PP {pp}"
            f"{f' x VPP {vpp}' if vpp > 1 else ''} the pipeline bubble is {share[row]:.0%} of the step")
    if row != d.pick:
        text += ", so the pick avoids deep pipelines"
    text += f". --global-batch-size {suggested} would bring it under {BUBBLE_TARGET:.0%}"
    if figures:
        text += (f" (the model: {figures['tokens_per_s_per_gpu_at_suggested']:,.0f} tokens/s/GPU, MFU "
                 f"{figures['mfu_at_suggested']:.1%}, vs {pick_tps:,.0f} for the pick now)")
    return PipelineWarning(layout=str(layout), pick=row == d.pick, global_batch_size=gbs, microbatches=m, pp=pp,
                           vpp=vpp, bubble_share=float(share[row]), suggested_global_batch_size=suggested,
                           text=text + ".", **figures)


def _suggested(t: Any, row: int) -> int:
    return suggested_global_batch(int(t.pp[row]), int(t.vpp_size[row]), int(t.mbs[row]), int(t.dp[row]))
