"""What-if: one table of the best layout per cluster, the token budget's time and GPU-hours, the smallest cluster
that fits."""

from __future__ import annotations

import json
import re

import pytest

from autotune.tuning.analytic_pass import analytic_pass
from autotune.tuning.whatif import parse_tokens, smallest_fitting, what_if
from autotune.ui.api import make_job
from autotune.ui.cli import main
from search_spaces.space import DEFAULT_SPACE, feasible_space


@pytest.mark.parametrize("text, tokens", [("1T", 1e12), ("300B", 3e11), ("2.5e12", 2.5e12), ("500m", 5e8),
                                          ("1_000", 1e3)])
def test_token_budgets(text, tokens) -> None:
    assert parse_tokens(text) == tokens


@pytest.mark.parametrize("text", ["", "T", "-1T", "lots", "infB"])
def test_bad_token_budgets_are_refused(text) -> None:
    with pytest.raises(ValueError, match="--tokens"):
        parse_tokens(text)


def test_each_row_is_that_clusters_own_answer() -> None:
    jobs = [make_job("llama3-8b", nodes=n, global_batch_size=128) for n in (1, 2)]
    rows = what_if(jobs, tokens=1e12)
    for job, row in zip(jobs, rows, strict=True):
        answer = analytic_pass(job, feasible_space(job, DEFAULT_SPACE))
        assert answer.ranking.pick is not None and row.tokens_per_s_per_gpu is not None and row.seconds is not None
        assert row.pick == str(answer.layout(answer.ranking.pick))
        assert row.tokens_per_s_per_gpu == pytest.approx(answer.scores.tokens_per_s_per_gpu[answer.ranking.pick])
        # 1e12 tokens / (tokens/s per GPU x GPUs) seconds; GPU-hours = GPUs x hours
        assert row.seconds == pytest.approx(1e12 / (row.tokens_per_s_per_gpu * job.world_size))
        assert row.gpu_hours == pytest.approx(row.seconds / 3600 * job.world_size)


def test_the_smallest_cluster_that_fits_when_none_does() -> None:
    # llama3-70b at 32K tokens does not fit one node of 8 H100s; the smallest that does is found, and one node fewer
    # does not fit
    job = make_job("llama3-70b", nodes=1, seq_length=32768, global_batch_size=16)
    rows = what_if([job])
    assert rows[0].pick is None and rows[-1].found and rows[-1].pick is not None
    found = rows[-1].job.cluster.nodes
    smallest = smallest_fitting(job)
    assert found > 1
    fewer = what_if([make_job("llama3-70b", nodes=found - 1, seq_length=32768, global_batch_size=16)],
                    find_smallest=False)
    assert fewer[0].pick is None
    assert smallest is not None and smallest.job.cluster.nodes == found


def test_a_list_of_gpus_and_nodes_is_one_row_each(capsys) -> None:
    # (docs/cli.md's `--model mixtral --nodes 4,8,16 --tokens 1T` runs in tests/test_docs_commands.py, slow)
    code = main(["--model", "llama3-8b", "--nodes", "1,2", "--gpu", "h100,h200", "--global-batch-size", "128",
                 "--tokens", "1T", "--json"])
    payload = json.loads(capsys.readouterr().out)
    rows = payload["rows"]
    assert code == 0 and payload["tokens"] == 1e12
    assert [(r["gpu"], r["nodes"]) for r in rows] == [("h100-sxm", 1), ("h100-sxm", 2), ("h200", 1), ("h200", 2)]
    for r in rows:
        assert r["pick"] and r["tokens_per_s"] == pytest.approx(r["tokens_per_s_per_gpu"] * r["gpus"])
        assert r["days"] == pytest.approx(1e12 / r["tokens_per_s"] / 86400)
        assert r["gpu_hours"] == pytest.approx(r["days"] * 24 * r["gpus"])
    code = main(["--model", "llama3-8b", "--nodes", "1,2", "--global-batch-size", "128", "--tokens", "1T"])
    out = capsys.readouterr().out
    assert code == 0 and out.count("What-if: the best layout per cluster") == 1
    rows = [line for line in out.splitlines() if " x 8 h100" in line[:14]]
    assert [line.split(" x ")[0] for line in rows] == ["1", "2"]
    assert all(re.search(r" \d[\d,.]* [dh] ", line) and "nothing fits" not in line for line in rows)  # the time


@pytest.mark.parametrize("argv", [
    ["check", "--model", "mixtral", "--nodes", "4,8", "--layout", "tp=2"],
    ["estimate", "--model", "mixtral", "--gpu", "h100,h200", "--layout", "tp=2"],
    ["--model", "mixtral", "--nodes", "4,8", "--layout", "tp=2"],
    ["--model", "mixtral", "--nodes", "4", "--tokens", "lots"],
])
def test_lists_where_one_value_is_needed_are_one_line_refusals(capsys, argv) -> None:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
