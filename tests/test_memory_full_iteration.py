"""The memory terms of full-iteration CUDA graphs of a MoE model (NVIDIA's Blackwell MoE recipe bundle, issue 19):
the paged stash, the rank capacity factor's static token buffers, HybridEP's buffers, the graph pool and the
static input copies, each against a hand computation from megatron-core 0.19 / DeepEP hybrid-ep's own formula
(docs/memory-model.md), and what turning full-iteration graphs on adds for published recipes."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.cost.activations import shape_of  # noqa: E402
from autotune.cost.allowance import full_iteration_static_input_bytes, hybridep_buffer_terms  # noqa: E402
from autotune.cost.memory import DEFAULT_ASSUMPTIONS  # noqa: E402
from autotune.cost.moe_activations import paged_stash_of, rank_capacity_tokens  # noqa: E402
from autotune.cost.score import estimate_memory  # noqa: E402
from bench.recipe_rows import load_recipe_rows  # noqa: E402
from search_spaces.catalog import get_model  # noqa: E402
from search_spaces.gpus import build_cluster  # noqa: E402
from search_spaces.job import Job  # noqa: E402
from search_spaces.layout import Layout  # noqa: E402
from search_spaces.training import TrainingSpec  # noqa: E402
from search_spaces.units import GIB  # noqa: E402


@pytest.fixture(scope="module")
def recipes():
    return [r for r in load_recipe_rows() if not r.skip]


def _row(recipes, model: str, gpu: str = "gb200", release: str = "26.08"):
    return next(r for r in recipes if r.model == model and r.gpu == gpu and r.release == release and r.full_iteration)


def _qwen_per_token() -> float:
    """Qwen3-30B-A3B (h 2048, f_e 768, gated) under MXFP8: fc1 input (1 + 1/32) h, fc1 output 2 x 2 f_e (bf16),
    fc2 input (1 + 1/32) f_e, the fp32 probability."""
    return (1 + 1 / 32) * 2048 + 2 * 2 * 768 + (1 + 1 / 32) * 768 + 4


def test_qwen3_30b_recipe_is_what_the_hand_computation_assumes(recipes) -> None:
    r = _row(recipes, "Qwen3_30B_a3B")
    m, lay = r.job.model, r.layout
    assert (m.hidden_size, m.num_layers, m.moe.num_experts, m.moe.topk, m.moe.expert_ffn_hidden_size) == \
        (2048, 48, 128, 8, 768)
    assert (lay.tp, lay.pp, lay.cp, lay.ep, lay.expert_tp, lay.mbs, lay.dp, r.job.training.seq_length) == \
        (1, 1, 1, 8, 1, 4, 8, 4096)
    assert r.job.fp8_recipe == "mxfp8" and r.job.moe_dispatcher == ("flex", "hybridep")
    assert r.job.training.moe_rank_capacity_factor == 1.5 and r.job.cluster.nvlink_domain == 8


def test_rank_capacity_budget_is_megatron_cores(recipes) -> None:
    # token_dispatcher.py::_HybridEPManager.setup_metadata: int(T_r x topk x 1.5), rounded up to 256 (op fuser)
    r = _row(recipes, "Qwen3_30B_a3B")
    x = shape_of(r.job, r.layout, DEFAULT_ASSUMPTIONS)
    budget = int(4 * 4096 * 8 * 1.5)
    assert rank_capacity_tokens(r.job, x) == budget + (-budget % 256) == 196608
    stash = paged_stash_of(r.job, r.layout, DEFAULT_ASSUMPTIONS)
    assert stash is not None and stash.avg_tokens == int(196608 // 1.5) == 131072 and stash.buffer_factor == 1.2
    # bf16 and the alltoall dispatcher would not pad to 256; no stash without full-iteration graphs
    assert paged_stash_of(r.job, replace(r.layout, cuda_graphs="transformer_engine"), DEFAULT_ASSUMPTIONS) is None


def test_paged_stash_buffer_replaces_the_expert_activations(recipes) -> None:
    r = _row(recipes, "Qwen3_30B_a3B")
    on = dict(estimate_memory(r.job, r.layout).activation_terms)
    off = dict(estimate_memory(r.job, replace(r.layout, cuda_graphs="none")).activation_terms)
    # 1F1B without PP keeps one micro-batch: the stash's peak is 48 MoE layers x avg tokens, x 1.2
    assert on["experts"] == 0.0
    assert on["paged_stash"] == pytest.approx(1.2 * 131072 * _qwen_per_token() * 48, rel=1e-12)
    # balanced routing: the eager experts hold T_r k = avg tokens, so the stash is 1.2 x what they held
    assert off["experts"] == pytest.approx(131072 * _qwen_per_token() * 48, rel=1e-12)
    assert "paged_stash" not in off


def test_capacity_working_set_is_one_layer_at_capacity(recipes) -> None:
    r = _row(recipes, "Qwen3_30B_a3B")
    on = dict(estimate_memory(r.job, r.layout).activation_terms)
    per_token = _qwen_per_token()
    forward = 2 * 2 * 2048 + 4 + per_token  # dispatched bf16 tokens + fp32 probs + experts + fc2 output
    backward = per_token + 2 * (3 * 768 + 2048)  # reloaded saved tensors + activation gradients
    assert on["moe_capacity_working_set"] == pytest.approx(196608 * max(forward, backward), rel=1e-12)


def test_hybridep_buffers_follow_deepeps_allocation(recipes) -> None:
    r = _row(recipes, "Qwen3_30B_a3B")
    terms = hybridep_buffer_terms(r.job, r.layout)
    tokens, group, local, h = 16384, 8, 16, 2048  # T_r padded to 64, EP x ETP, E / EP
    worst = tokens * group  # max_num_of_tokens_per_rank x ranks per NVLink domain x domains
    assert terms == {
        "hybridep_nvl_tokens": worst * h * 2,
        "hybridep_nvl_probs": worst * local * group * 4,
        "hybridep_nvl_scales": worst * (h // 128) * 4,
        "hybridep_allgather": local * group * tokens * group,
    }
    overhead = dict(estimate_memory(r.job, r.layout).overhead_terms)
    assert overhead["hybridep_buffers"] == sum(terms.values()) and overhead["deepep_buffers"] == 0.0


def test_hybridep_across_nvlink_domains_adds_rdma_buffers() -> None:
    # Qwen3-30B-A3B on 4 B200 nodes (8-GPU NVLink domains), EP 16: two domains of 8 ranks
    job = Job(model=get_model("qwen3-30b-a3b"), cluster=build_cluster(gpu="b200", nodes=4),
              training=TrainingSpec(global_batch_size=256, seq_length=4096, precision="fp8"))
    layout = Layout(tp=1, pp=1, cp=1, ep=16, dp=32, mbs=1, sp=False, dist_opt=True, recompute="none")
    assert job.moe_dispatcher == ("flex", "hybridep")
    terms = hybridep_buffer_terms(job, layout)
    t, g, r_, n, loc, h = 4096, 16, 8, 2, 8, 2048
    assert terms["hybridep_nvl_tokens"] == t * g * h * 2
    assert terms["hybridep_nvl_probs"] == t * g * loc * r_ * 4
    rdma = t * (h * 2 + loc * g * 4 + h // 128 * 4) + t * (n - 1) * (h * 2 + loc * r_ * 4 + h // 128 * 4)
    rdma += 2 * t * (n - 1) * (h * 2 + loc * r_ * 4)
    assert terms["hybridep_rdma"] == rdma
    # DeepEP (a flex H100 job) keeps its own buffers and gets no HybridEP ones
    h100 = replace(job, cluster=build_cluster(gpu="h100", nodes=4),
                   training=replace(job.training, moe_token_dispatcher="flex"))
    assert h100.moe_dispatcher == ("flex", "deepep") and hybridep_buffer_terms(h100, layout) == {}
    assert dict(estimate_memory(h100, layout).overhead_terms)["deepep_buffers"] > 0


def test_graph_pool_and_static_inputs(recipes) -> None:
    r = _row(recipes, "Qwen3_30B_a3B")
    est = estimate_memory(r.job, r.layout)
    microbatches = r.job.training.global_batch_size // (4 * 8)
    assert full_iteration_static_input_bytes(r.job, r.layout) == microbatches * 4 * 4096 * 28
    assert full_iteration_static_input_bytes(r.job, replace(r.layout, cuda_graphs="none")) == 0.0
    # the eager optimizer step (fp32 gradient copies of this GPU's shard) cannot reuse the graph's pool
    overhead = dict(est.overhead_terms)
    assert est.phase == "activations"
    assert overhead["graph_pool_held"] > 0
    assert "graph_pool_held" not in dict(estimate_memory(r.job, replace(r.layout, cuda_graphs="none")).overhead_terms)


def test_full_iteration_graphs_raise_the_estimate_by_the_terms(recipes) -> None:
    """Qwen3-30B-A3B on 8 GB200 (26.08): graphs on minus graphs off is exactly the stash's 20% headroom on the
    experts, the capacity working set less the experts' backward candidate it replaces, the static inputs and
    the pool held through the optimizer step."""
    r = _row(recipes, "Qwen3_30B_a3B")
    on = estimate_memory(r.job, r.layout)
    off = estimate_memory(r.job, replace(r.layout, cuda_graphs="none"))
    a_on, a_off = dict(on.activation_terms), dict(off.activation_terms)
    per_token = _qwen_per_token()
    stash_extra = 0.2 * 131072 * per_token * 48
    capacity = 196608 * (per_token + 2 * (3 * 768 + 2048))
    # the experts' gradients at T_r k rows were the largest candidate of the eager backward working set; under
    # the stash their capacity version is in `moe_capacity_working_set`, so the candidate leaves
    layer_io = 2 * 2 * 16384 * 2048
    assert a_off["backward_working_set"] == pytest.approx(layer_io + 2 * 131072 * (3 * 768 + 2048), rel=1e-12)
    assert a_on["backward_working_set"] < a_off["backward_working_set"]
    bws_delta = a_on["backward_working_set"] - a_off["backward_working_set"]
    static = r.job.training.global_batch_size // 32 * 4 * 4096 * 28
    held = dict(on.overhead_terms)["graph_pool_held"]
    expected = stash_extra + capacity + bws_delta + static + held
    assert on.total_bytes - off.total_bytes == pytest.approx(expected, rel=1e-9)
    assert held <= on.activations_bytes
    assert on.total_bytes - off.total_bytes > 20 * GIB  # ~23 GiB: 137.7 -> 161.6 GiB of the GPU's 186 GiB
    assert on.fits(r.job.cluster.gpu.memory_bytes)


def test_every_full_iteration_moe_recipe_has_the_terms_and_fits(recipes) -> None:
    bundle = [r for r in recipes if r.full_iteration and r.arch == "moe"]
    assert len(bundle) >= 20
    for r in bundle:
        est = estimate_memory(r.job, r.layout)
        acts = dict(est.activation_terms)
        assert acts["experts"] == 0.0 and acts["paged_stash"] > 0 and acts["moe_capacity_working_set"] > 0
        assert dict(est.overhead_terms)["hybridep_buffers"] > 0
        off = estimate_memory(r.job, replace(r.layout, cuda_graphs="none"))
        assert est.total_bytes > off.total_bytes
        assert est.fits(r.job.cluster.gpu.memory_bytes), (r.release, r.gpu, r.model, est.total_gib)


def test_deepseek_v3_gb200_stash_spans_every_chunk_in_flight(recipes) -> None:
    """DeepSeek-V3 on 256 GB200 (PP 4, VP 4, EP 64): the stash holds the average-based tokens of every (MoE layer,
    micro-batch) in flight on the peak stage, all chunks together; 1.2 x the eager experts under balance."""
    r = _row(recipes, "DeepSeekV3")
    on = dict(estimate_memory(r.job, r.layout).activation_terms)
    off = dict(estimate_memory(r.job, replace(r.layout, cuda_graphs="none")).activation_terms)
    stash = paged_stash_of(r.job, r.layout, DEFAULT_ASSUMPTIONS)
    # T_r = 4096 (TP 1, MBS 1), topk 8: int(4096 x 8 x 1.5) = 49152, a multiple of 256; avg = 49152 // 1.5
    assert stash is not None and stash.capacity_tokens == 49152 and stash.avg_tokens == 32768
    assert on["paged_stash"] == pytest.approx(1.2 * off["experts"], rel=1e-12)
