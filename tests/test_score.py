"""Scoring a table gives, row by row, what scoring each layout alone gives (`estimate_time`, `estimate_memory`:
the one-row case of the same assembly, whose grouping of rows then has one group each) and the analytic backend."""

from __future__ import annotations

import math
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from autotune.cost.analytic import AnalyticBackend
from autotune.cost.layout_table import LayoutTable
from autotune.cost.memory import LOCAL_SPEC_ASSUMPTIONS
from autotune.cost.score import estimate_memory, estimate_time, score_layouts
from autotune.cost.throughput import TIME_KEYS
from search_spaces.catalog import get_model
from search_spaces.gpus import build_cluster
from search_spaces.job import Job
from search_spaces.layout import Layout
from search_spaces.space import SpaceOptions, feasible_space
from search_spaces.training import TrainingSpec
from search_spaces.units import GIB

ROOT = Path(__file__).resolve().parents[1]
REL = 1e-9


def _job(model: str, nodes: int = 1, gpu: str = "h100", **training: object) -> Job:
    return Job(model=get_model(model), cluster=build_cluster(nodes=nodes, gpu=gpu),
               training=TrainingSpec(**training))  # type: ignore[arg-type]


# (id, job, space options): dense, MoE, MLA with leading dense layers, uneven splits, CP, recompute, FP8, the
# training switches that change the assembly (a2a overlap: one more warm-up micro-batch with VPP; no
# precision-aware optimizer: the optimizer step can be the peak; block recompute; TE CUDA graphs; flex dispatcher)
CASES = [
    ("dense-llama3-8b", _job("llama3-8b", global_batch_size=64), SpaceOptions()),
    ("dense-cp-llama3-8b-32k", _job("llama3-8b", 4, seq_length=32768, global_batch_size=256), SpaceOptions()),
    ("dense-uneven-405b", _job("llama3.1-405b", 16, global_batch_size=512), SpaceOptions(max_pp=16)),
    ("dense-layernorm-gpt3", _job("gpt3-175b", 8, seq_length=2048, global_batch_size=512), SpaceOptions()),
    ("moe-mixtral", _job("mixtral-8x7b", 2, global_batch_size=128), SpaceOptions()),
    ("moe-qwen3-30b-fp8", _job("qwen3-30b-a3b", 1, precision="fp8", global_batch_size=64), SpaceOptions()),
    ("mla-deepseek-v3", _job("deepseek-v3", 32, global_batch_size=1024), SpaceOptions(max_tp=4, max_ep=32)),
    ("mla-tiny", _job("tiny-mla", 1, seq_length=1024, global_batch_size=32), SpaceOptions()),
    ("fp8-mxfp8-b200", _job("llama3-70b", 4, gpu="b200", precision="fp8", global_batch_size=128), SpaceOptions()),
    ("recompute-block", _job("llama3-8b", 1, recompute_num_layers=2, recompute_modules=("core_attn", "mlp"),
                             global_batch_size=64), SpaceOptions()),
    ("a2a-overlap-flex", _job("mixtral-8x7b", 2, moe_token_dispatcher="flex", global_batch_size=128),
     SpaceOptions(ep_overlap=(True,))),
    ("no-precision-aware-optimizer", _job("qwen3-8b", 1, precision_aware_optimizer=False,
                                          cross_entropy_fusion="native", global_batch_size=32), SpaceOptions()),
    ("te-cuda-graphs", _job("qwen3-30b-a3b", 1, cuda_graph_modules=("attn", "moe_router"), global_batch_size=64),
     SpaceOptions(cuda_graphs=("transformer_engine",))),
    ("full-iteration-moe-gb200", _job("qwen3-30b-a3b", 2, gpu="gb200", precision="fp8", global_batch_size=128),
     SpaceOptions(cuda_graphs=("full_iteration", "none"))),
    ("no-grad-overlap-bf16-moments", _job("qwen3-8b", 1, overlap_grad_reduce=False, optimizer_moments="bf16",
                                          grad_reduce_in_fp32=True, global_batch_size=32), SpaceOptions()),
    ("gb200-cross-node-tp", _job("llama3-70b", 4, gpu="gb200", global_batch_size=64),
     SpaceOptions(tp_within_node=False)),
    # BF16 edge layers of a low-precision run (first_last_layers_bf16): per-stage BF16 counts, uneven splits
    ("bf16-edges-fp8-b200", _job("llama3-70b", 4, gpu="b200", precision="fp8", bf16_layers_at_start=1,
                                 bf16_layers_at_end=3, global_batch_size=128), SpaceOptions()),
    # Megatron-FSDP and layer-level activation offload (PP 1 only): NVIDIA's Llama3-70B GB200 recipe's job
    ("fsdp-offload-70b-gb200", _job("llama3-70b", 16, gpu="gb200", precision="fp8", fp8_recipe="tensorwise",
                                    seq_length=8192, global_batch_size=256), SpaceOptions(max_pp=1)),
    # Nemotron-3 Super's NVFP4 recipe: the last 14 pattern layers and the MTP layer (never FP4) in BF16
    ("bf16-edges-nvfp4-hybrid-mtp", _job("nemotron-3-super-120b-a12b", 16, gpu="gb200", precision="fp4",
                                         bf16_layers_at_end=14, global_batch_size=512), SpaceOptions(max_pp=4)),
    # Muon (layer-wise distributed with dist_opt): its state, Newton-Schulz step and all-reduced gradients, MLA + MoE
    ("muon-mla-moe", _job("tiny-mla", 1, seq_length=1024, optimizer="muon", global_batch_size=32), SpaceOptions()),
    ("muon-mixtral-fp8", _job("mixtral-8x7b", 2, gpu="gb200", precision="fp8", optimizer="muon",
                              global_batch_size=128), SpaceOptions()),
]


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL, abs_tol=1e-300)


def _assert_same(job: Job, scores, i: int, headroom: float = 0.0) -> None:
    layout = scores.table.layout(i)
    ref = AnalyticBackend(headroom_bytes=headroom).evaluate(job, layout)
    got = scores.measurement(i)
    assert (got.status, got.reason) == (ref.status, ref.reason), layout
    for name in ("memory_bytes", "allocated_bytes", "step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu"):
        assert _close(getattr(got, name), getattr(ref, name)), (name, layout)
    assert got.time.keys() == ref.time.keys() and got.memory.keys() == ref.memory.keys()
    for part in ("time", "memory"):
        for key, value in getattr(ref, part).items():
            assert _close(getattr(got, part)[key], value), (part, key, layout)
    for key, value in ref.extra.items():
        if isinstance(value, dict):
            assert all(_close(got.extra[key][k], v) for k, v in value.items()), (key, layout)
        elif isinstance(value, float):
            assert _close(got.extra[key], value), (key, layout)
        else:
            assert got.extra[key] == value, (key, layout)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_rows_equal_the_analytic_backend(case) -> None:
    _, job, options = case
    table = LayoutTable.from_space(feasible_space(job, options))
    scores = score_layouts(job, table)
    rows = random.Random(0).sample(range(len(table)), min(60, len(table)))
    for i in rows:
        _assert_same(job, scores, i)


@pytest.mark.parametrize("case", CASES[:6], ids=[c[0] for c in CASES[:6]])
def test_spread_of_the_space_equals_the_scalar_models(case) -> None:
    """Every term of an evenly spread 300 rows of the space: estimate_time's breakdown, band, dominant term;
    estimate_memory's totals, stage, phase, dominant term and parameters per GPU."""
    _, job, options = case
    space = feasible_space(job, options)
    table = LayoutTable.from_space(space)
    scores = score_layouts(job, table)
    layouts = list(space.layouts())
    for i in range(0, len(layouts), max(1, len(layouts) // 300)):
        layout = layouts[i]
        t, m = estimate_time(job, layout), estimate_memory(job, layout)
        assert _close(scores.step_time_s[i], t.step_time_s)
        assert all(_close(scores.breakdown[k][i], t.breakdown[k]) for k in TIME_KEYS)
        assert _close(scores.tokens_per_s_per_gpu_low[i], t.tokens_per_s_per_gpu_low)
        assert _close(scores.tokens_per_s_per_gpu_high[i], t.tokens_per_s_per_gpu_high)
        assert scores.dominant_time(i) == t.dominant
        assert _close(scores.total_bytes[i], m.total_bytes) and _close(scores.allocated_bytes[i], m.allocated_bytes)
        assert (int(scores.memory_stage[i]), scores.dominant_memory(i)) == (m.stage, m.dominant)
        assert bool(scores.optimizer_phase[i]) == (m.phase == "optimizer step")
        assert int(scores.params_per_gpu[i]) == m.params_per_gpu


def test_fsdp_and_offload_rows_equal_the_scalar_models() -> None:
    _, job, options = next(c for c in CASES if c[0] == "fsdp-offload-70b-gb200")
    table = LayoutTable.from_space(feasible_space(job, options))
    scores = score_layouts(job, table)
    rows = [i for i in range(len(table)) if table.fsdp[i] or table.offload_layers[i]]
    assert any(table.fsdp[i] and table.offload_layers[i] for i in rows)
    assert any(table.offload_layers[i] and not table.fsdp[i] for i in rows)
    for i in random.Random(1).sample(rows, 40):
        _assert_same(job, scores, i)
    recipe = Layout(tp=1, pp=1, dp=64, mbs=2, dist_opt=True, fsdp=True, offload_layers=40)
    assert recipe in set(table.layouts())  # NVIDIA's recipe is a row of the space


def test_verdicts_follow_the_headroom() -> None:
    # mixtral-8x7b on 2 nodes: with 20 GiB of headroom some layouts that fit 80 GiB no longer do
    job = CASES[4][1]
    table = LayoutTable.from_space(feasible_space(job))
    plain = score_layouts(job, table)
    tight = score_layouts(job, table, headroom_bytes=20 * GIB)
    assert plain.fits.sum() > tight.fits.sum() > 0
    assert not tight.fits.all()
    flipped = np.flatnonzero(plain.fits & ~tight.fits)
    for i in list(flipped[:10]) + list(np.flatnonzero(tight.fits)[:10]):
        _assert_same(job, tight, int(i), headroom=20 * GIB)
    np.testing.assert_array_equal(tight.fits, tight.total_bytes <= job.cluster.gpu.memory_bytes - 20 * GIB)


def test_layouts_outside_the_space() -> None:
    # valid layouts the default space leaves out: cross-node TP with ETP = TP (etp=None), an explicit vpp=1,
    # an uneven split given by hand
    job = _job("mixtral-8x7b", 4, global_batch_size=256)
    layouts = [Layout(tp=16, pp=2, ep=1, dp=1, sp=True), Layout(tp=2, pp=2, vpp=1, ep=4, dp=8, mbs=2, sp=True),
               Layout(tp=1, pp=4, first_stage_layers=7, last_stage_layers=9, ep=8, dp=8, recompute="full"),
               Layout(tp=1, pp=4, vpp=8, ep=8, dp=8, dist_opt=True)]
    table = LayoutTable.from_layouts(layouts)
    scores = score_layouts(job, table)
    for i, layout in enumerate(layouts):
        assert table.layout(i) == layout
        assert AnalyticBackend().evaluate(job, layout).status != "invalid"
        _assert_same(job, scores, i)


def test_other_memory_assumptions() -> None:
    # the CPU proxy's local spec splits MLA's down projections over TP: the placement differs
    job = _job("tiny-mla", 1, seq_length=512, global_batch_size=16)
    table = LayoutTable.from_space(feasible_space(job))
    scores = score_layouts(job, table, assumptions=LOCAL_SPEC_ASSUMPTIONS)
    for i in range(0, len(table), max(1, len(table) // 50)):
        ref = estimate_memory(job, table.layout(i), LOCAL_SPEC_ASSUMPTIONS)
        assert _close(scores.total_bytes[i], ref.total_bytes)
        assert int(scores.memory_stage[i]) == ref.stage


def test_table_from_space_is_the_space_in_order() -> None:
    space = feasible_space(CASES[2][1], CASES[2][2])  # llama3.1-405b: uneven and embedding/loss splits
    table = LayoutTable.from_space(space)
    assert table.layouts() == list(space.layouts())
    assert len(table) == space.size
    assert table.embedding_loss_split.any() and (table.first_stage_layers > 0).any()


def test_table_columns() -> None:
    layouts = [Layout(tp=2, pp=4, vpp=2, ep=2, etp=1, dp=2, mbs=4, sp=True, dist_opt=True, recompute="selective"),
               Layout()]
    table = LayoutTable.from_layouts(layouts)
    assert table.layouts() == layouts
    assert table.vpp_size.tolist() == [2, 1] and table.expert_tp.tolist() == [1, 1]
    assert table.world_size.tolist() == [16, 1] and table.take([1]).layouts() == [Layout()]
    with pytest.raises(ValueError, match="unknown layout field"):
        LayoutTable.from_arrays(tp=[1], zz=[2])
    with pytest.raises(ValueError, match="length"):
        LayoutTable.from_arrays(tp=[1, 2], pp=[1])
    with pytest.raises(ValueError):
        table.tp[0] = 4  # read-only


def test_scores_of_an_equal_job_are_the_same() -> None:
    # a second, equal Job object (new identity: the scalar memos are per object) scores the same
    job = CASES[0][1]
    table = LayoutTable.from_space(feasible_space(job))
    a = score_layouts(job, table)
    b = score_layouts(replace(job), table)
    np.testing.assert_array_equal(a.step_time_s, b.step_time_s)
    np.testing.assert_array_equal(a.total_bytes, b.total_bytes)


def test_the_scorer_imports_nothing_heavy() -> None:
    code = ("import sys, autotune.cost.score; print(','.join(m for m in ('torch', 'ray', 'optuna', 'megatron', "
            "'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == ""


def test_time_only_for_the_rows_that_fit() -> None:
    job = CASES[4][1]  # mixtral-8x7b on 2 nodes: some layouts do not fit
    table = LayoutTable.from_space(feasible_space(job))
    every = score_layouts(job, table)
    fitting = score_layouts(job, table, time_for="fits")
    assert not every.fits.all() and every.fits.any()
    np.testing.assert_array_equal(fitting.total_bytes, every.total_bytes)
    np.testing.assert_array_equal(fitting.tokens_per_s_per_gpu[every.fits], every.tokens_per_s_per_gpu[every.fits])
    for key in TIME_KEYS:
        np.testing.assert_array_equal(fitting.breakdown[key][every.fits], every.breakdown[key][every.fits])
    assert np.isnan(fitting.step_time_s[~every.fits]).all()
    with pytest.raises(ValueError, match="time_for"):
        score_layouts(job, table, time_for="some")


def test_rows_with_a_pipeline_layout_string_equal_the_analytic_backend() -> None:
    # deepseek-v3 (61 layers + 1 MTP layer) on 32 nodes: PP 4/8/16 with VPP split 61 + 1 + 2 = 64 slots only by a
    # pipeline_model_parallel_layout string (e.g. `Et|(tt|)*30mL`); those rows must score as the scalar models do
    job, options = CASES[6][1], CASES[6][2]
    table = LayoutTable.from_space(feasible_space(job, options))
    with_string = np.flatnonzero(table.pipeline_layout > 0)
    assert len(with_string) and len(table.layout_strings) > 2
    scores = score_layouts(job, table)
    for i in random.Random(1).sample(list(with_string), 40):
        assert scores.table.layout(int(i)).pipeline_layout is not None
        _assert_same(job, scores, int(i))
