"""The Python API: specs in code, one-layout estimates, the Result object, and the same ranking as the CLI."""

from __future__ import annotations

import json

import pytest

import autotune.ui.api as api
from autotune.tuning.answer import SearchResult
from autotune.tuning.results import TrialRecord
from autotune.ui import clusters, models
from autotune.ui.cli import build_parser
from autotune.ui.commands import job_from_args
from autotune.ui.request import JobRequest
from search_spaces.layout import Layout
from search_spaces.measurement import Measurement
from search_spaces.units import GIB


# --- specs in code ---------------------------------------------------------------------------------
def test_models_get_is_the_catalog_entry():
    from search_spaces.catalog import get_model

    assert models.get("mixtral") == get_model("mixtral-8x7b")


def test_model_variant_changes_one_field_and_names_itself():
    half = models.variant(models.get("llama3-70b"), num_layers=40)
    assert (half.num_layers, half.hidden_size, half.name) == (40, 8192, "llama3-70b[num_layers=40]")


def test_model_variant_rejects_unknown_fields():
    with pytest.raises(ValueError, match="no field"):
        models.variant(models.get("llama3-8b"), layers=4)


def test_model_from_hf_config_matches_the_catalog_counts():
    from pathlib import Path

    path = Path(__file__).parent / "data" / "hf" / "mixtral-8x7b.json"
    model = models.from_hf_config(path)
    assert model.total_params == models.get("mixtral").total_params
    assert api.make_job(str(path), nodes=4).model.total_params == model.total_params  # a path works as model=


def test_models_resolve_rejects_other_types():
    with pytest.raises(ValueError, match="catalog name"):
        models.resolve(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "world", "inter"),
    [
        ({"nodes": 4}, 32, "ib-ndr"),  # 4 * 8
        ({"nodes": 2, "gpus_per_node": 4, "inter_node": "ethernet-100g"}, 8, "ethernet-100g"),  # 2 * 4
    ],
)
def test_cluster_build(kwargs, world, inter):
    c = clusters.build(**kwargs)
    assert (c.world_size, c.inter_node.name) == (world, inter)


def test_custom_gpu_memory_flows_into_the_cluster():
    c = clusters.build(nodes=1, gpu=clusters.gpu("h100", memory_bytes=64 * GIB))
    assert c.gpu.memory_gib == 64.0


def test_cluster_and_parts_together_is_an_error():
    with pytest.raises(ValueError, match="either cluster="):
        api.make_job("mixtral", cluster=clusters.build(nodes=1), nodes=4)


@pytest.mark.parametrize(
    "argv",
    [
        ["--model", "mixtral", "--nodes", "4"],
        ["--model", "llama3-70b", "--nodes", "2", "--gpu", "h200", "--seq-length", "8192", "--global-batch-size", "64"],
    ],
)
def test_make_job_builds_the_cli_job(argv):
    args = build_parser().parse_args(["estimate", *argv, "--layout", "tp=1"])
    kwargs = {"nodes": args.nodes, "gpu": args.gpu, "seq_length": args.seq_length,
              "global_batch_size": args.global_batch_size}
    assert api.make_job(args.model, **{k: v for k, v in kwargs.items() if v is not None}) == job_from_args(args)


def test_the_cli_and_the_api_build_one_request():
    # the training flags too: the CLI's --precision / --fp8-recipe / --release are the API's keywords
    args = build_parser().parse_args(["estimate", "--model", "qwen3-30b-a3b", "--nodes", "2", "--gpu", "b200",
                                      "--precision", "fp8", "--fp8-recipe", "mxfp8", "--release", "26.04",
                                      "--layout", "tp=1"])
    cli = JobRequest.from_args(args)
    assert cli.job() == job_from_args(args)
    assert cli.job() == api.make_job("qwen3-30b-a3b", nodes=2, gpu="b200", precision="fp8",
                                     training={"fp8_recipe": "mxfp8", "release": "26.04"})


def test_an_unknown_job_keyword_is_named():
    with pytest.raises(ValueError, match=r"unknown job option\(s\) \['gpus'\]"):
        api.make_job("mixtral", gpus=8)  # type: ignore[call-arg]


# --- one layout --------------------------------------------------------------------------------------
def test_estimate_of_a_valid_layout_has_breakdowns():
    m = api.estimate("mixtral", "tp=2,pp=2,ep=8,sp=true,dist_opt=true", nodes=4)
    assert m.status == "ok" and m.layout.dp == 8  # 32 / (2 * 2 * 1)
    assert m.memory_bytes == pytest.approx(sum(m.memory.values()))
    assert m.step_time_s == pytest.approx(sum(m.time.values()))


def test_estimate_of_a_broken_layout_is_a_result_not_an_exception():
    m = api.estimate("mixtral", "tp=3", nodes=4)  # 32 heads are not a multiple of 3
    assert m.status == "invalid" and "tensor_model_parallel_size" in m.reason


# --- the Result object over a search result ------------------------------------------------------------
def _record(number: int, layout: Layout, tps: float | None, mem_gib: float, feasible: bool) -> TrialRecord:
    m = Measurement(layout=layout, status="ok" if tps else "oom", source="analytic", memory_bytes=mem_gib * GIB,
                    memory={"weights": mem_gib * GIB}, time={"compute": 1.0} if tps else {},
                    step_time_s=1.0 if tps else None, tokens_per_s_per_gpu=tps)
    return TrialRecord(number=number, origin="search", measurement=m, feasible=feasible, capacity_bytes=76 * GIB)


@pytest.fixture
def result() -> api.Result:
    job = api.make_job("mixtral", nodes=4)
    records = (
        _record(0, Layout(tp=1, pp=4, ep=8, dp=8, dist_opt=True), 4000.0, 60.0, True),
        _record(1, Layout(tp=2, pp=2, ep=8, dp=8, sp=True, dist_opt=True), 5000.0, 50.0, True),
        _record(2, Layout(tp=1, pp=1, ep=8, dp=32), None, 120.0, False),
        _record(3, Layout(tp=1, pp=2, ep=8, dp=16), 6000.0, 79.0, False),  # fast, but over the headroom
    )
    raw = SearchResult(job=job, records=records, capacity_bytes=76 * GIB, headroom_bytes=4 * GIB, mode="search",
                       backend="analytic", seed=0, space_size=100)
    return api.Result(raw)


def test_result_best_is_the_fastest_feasible(result):
    assert result.best == Layout(tp=2, pp=2, ep=8, dp=8, sp=True, dist_opt=True)


def test_result_trials_frame_has_one_row_per_trial(result):
    df = result.trials
    assert list(df["trial"]) == [0, 1, 2, 3]
    assert list(df["feasible"]) == [True, True, False, False]
    assert "time.compute" in df and "memory.weights" in df


def test_result_top_follows_the_search_ranking(result):
    assert list(result.top(5)["tokens_per_s_per_gpu"]) == [5000.0, 4000.0]
    assert result.ranking == [Layout(tp=2, pp=2, ep=8, dp=8, sp=True, dist_opt=True),
                              Layout(tp=1, pp=4, ep=8, dp=8, dist_opt=True)]


def test_result_launch_forms_name_the_winner(result):
    assert "--tensor-model-parallel-size 2" in result.launch["megatron_lm"]
    assert "model.tensor_model_parallel_size=2" in result.launch["megatron_bridge"]


@pytest.mark.parametrize("method", ["plot_pareto", "plot_time_breakdown", "plot_memory_breakdown", "plot_progress"])
def test_result_plots_are_figures(result, method):
    from matplotlib.figure import Figure

    assert isinstance(getattr(result, method)(), Figure)


def test_result_report_shows_the_winner(result, tmp_path):
    text = open(result.write_report(tmp_path)).read()
    winner = text[text.index('id="winner"'):]
    assert str(result.best) in winner[: winner.index("</div>")]


# --- the same engine as the CLI ---------------------------------------------------------------------
@pytest.mark.slow
def test_api_and_cli_rank_the_same_layouts(tmp_path, capsys):
    from autotune.ui.cli import main

    argv = ["--model", "mixtral", "--nodes", "4", "--trials", "12", "--seed", "3", "--json", "--top", "12"]
    with api.ray_session():  # one local Ray for both runs (each would otherwise start its own)
        assert main([*argv, "--output", str(tmp_path / "cli")]) == 0
        cli_ranked = [row["layout_text"] for row in json.loads(capsys.readouterr().out)["ranked"]]
        result = api.search("mixtral", nodes=4, trials=12, seed=3, output_dir=tmp_path / "api")
    assert cli_ranked, "the CLI found no feasible layout"
    assert [str(layout) for layout in result.ranking][:12] == cli_ranked
    assert (tmp_path / "api" / "report.html").exists()


# --- the docs' commands are real ---------------------------------------------------------------------
DOCS = ["cli.md", "api.md", "notebooks.md", "dashboard.md", "report.md"]


def _blocks(name: str, language: str) -> list[str]:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / name).read_text()
    parts = text.split("```")
    return [p[len(language) + 1:] for p in parts[1::2] if p.startswith(language + "\n")]


@pytest.mark.parametrize("name", DOCS)
def test_docs_cli_lines_parse(name):
    import shlex

    lines = [line.split(" > ")[0] for block in _blocks(name, "bash") for line in block.splitlines()
             if line.startswith("python -m autotune")]
    for line in lines:
        argv = shlex.split(line.split("python -m autotune", 1)[1], comments=True)
        if argv == ["space", "--list-models"]:
            continue  # no --model needed there; parses below with a model
        build_parser().parse_args(argv if argv[0] in ("search", "space", "check", "estimate", "smoke")
                                  else ["search", *argv])


@pytest.mark.parametrize("name", DOCS)
def test_docs_python_blocks_compile(name):
    for block in _blocks(name, "python"):
        compile(block, name, "exec")


def test_result_notebook_view_names_the_winner(result):
    assert str(result.best) in result._repr_html_()


def test_autotune_search_stays_the_api_function_after_the_driver_loads():
    import autotune

    api._driver()  # imports autotune.tuning.driver
    assert autotune.search is api.search


def test_dashboard_session_without_the_flag_starts_nothing():
    import argparse

    from autotune.ui import dashboard

    with dashboard.session(argparse.Namespace(dashboard=False)) as dash:
        assert dash is None


@pytest.mark.parametrize("module", ["autotune.ui.models", "autotune.ui.clusters", "autotune.ui.api"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    failures, tried = doctest.testmod(importlib.import_module(module))
    assert (failures, tried > 0) == (0, True)
