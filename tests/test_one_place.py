"""A term is computed in one place: perturb it there, and estimate, check, the search and the report all move together.

Two terms stand for the rest: the EP all-to-all dispatch time (`autotune.cost.moe_time._dispatch_s`, what the
`ep_comm` time term is made of) and the gradient buffer's bytes per parameter
(`autotune.cost.memory.gradient_bytes_per_param`, the `gradients` memory term). Each is scaled where it is defined;
then the CLI's `estimate --json` and `check --json`, the search (its verdict on the same layout, `--layout`) and the
HTML report's line for it must all show the new figure, and the same one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import autotune.cost.memory as memory_model
import autotune.cost.moe_time as moe_time
import autotune.cost.throughput as throughput_model
from autotune.ui.cli import main

JOB = ["--model", "qwen3-30b-a3b", "--nodes", "1", "--global-batch-size", "64"]
LAYOUT = "tp=1,ep=8,etp=1,dp=8,mbs=4,dist_opt=true,recompute=full"  # GPU-bound: its all-to-all shows
REL = 1e-9


def _clear_caches() -> None:
    throughput_model._MEMOS.clear()
    memory_model._job_cache.cache_clear()


@pytest.fixture
def fresh() -> Iterator[None]:
    _clear_caches()
    yield
    _clear_caches()


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code = main(list(argv))
    out = capsys.readouterr().out
    assert code in (0, 1), out
    return json.loads(out)


def _surfaces(capsys: pytest.CaptureFixture[str], folder: Path) -> dict[str, Any]:
    """What each surface says of LAYOUT: estimate's tokens, ep_comm and memory, check's memory, the search's verdict,
    and the report's verdict line."""
    from autotune.outputs.report import report_input
    from autotune.ui.api import search

    estimate = _json(capsys, "estimate", *JOB, "--layout", LAYOUT, "--json")
    check = _json(capsys, "check", *JOB, "--layout", LAYOUT, "--json")
    result = search("qwen3-30b-a3b", nodes=1, global_batch_size=64, output_dir=folder, compare=[LAYOUT],
                    progress=False)
    (yours,) = result.answer.yours
    (report_line,) = report_input(result).yours
    return {"tokens": estimate["tokens_per_s_per_gpu"], "ep_comm": estimate["time"]["ep_comm"],
            "memory_gib": estimate["memory_gib"], "usable_gib": estimate["usable_gib"],
            "check_memory_gib": check["memory_gib"],
            "search_tokens": yours.tokens_per_s_per_gpu, "search_memory_gib": yours.memory_gib,
            "report": report_line[1]}


def _scaled(f: Callable[..., float], factor: float) -> Callable[..., float]:
    return lambda *args, **kwargs: factor * f(*args, **kwargs)


def _agree(s: dict[str, Any]) -> None:
    assert s["search_tokens"] == pytest.approx(s["tokens"], rel=REL)
    assert s["check_memory_gib"] == pytest.approx(s["memory_gib"], rel=REL)
    assert s["search_memory_gib"] == pytest.approx(s["memory_gib"], rel=REL)
    assert f"{s['tokens']:,.0f} tokens/s/GPU" in s["report"]
    assert f"fits, {s['usable_gib'] - s['memory_gib']:.1f} GiB free" in s["report"]  # the report's memory figure


@pytest.mark.slow  # three searches of a one-node job and six CLI calls: about 7 s on 2 cores
def test_one_term_moves_every_surface(fresh: None, capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    base = _surfaces(capsys, tmp_path / "base")
    _agree(base)

    # the EP all-to-all 3x slower, where it is computed: every surface's tokens/s falls, by the same figure
    monkeypatch.setattr(moe_time, "_dispatch_s", _scaled(moe_time._dispatch_s, 3.0))
    _clear_caches()
    slow_a2a = _surfaces(capsys, tmp_path / "a2a")
    monkeypatch.undo()
    _agree(slow_a2a)
    assert slow_a2a["ep_comm"] > 2.0 * base["ep_comm"]
    assert slow_a2a["tokens"] < base["tokens"] and slow_a2a["memory_gib"] == pytest.approx(base["memory_gib"])

    # the gradient buffer 1.1x larger, where it is defined: every surface's memory grows, by the same figure (9.6 GiB
    # of gradients: +0.96 GiB, and the layout still fits)
    monkeypatch.setattr(memory_model, "gradient_bytes_per_param", _scaled(memory_model.gradient_bytes_per_param, 1.1))
    _clear_caches()
    big_grads = _surfaces(capsys, tmp_path / "grads")
    monkeypatch.undo()
    _agree(big_grads)
    assert big_grads["memory_gib"] > base["memory_gib"] + 0.5
    assert big_grads["tokens"] == pytest.approx(base["tokens"], rel=REL)
