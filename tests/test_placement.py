"""Where the parameters are (autotune/cost/placement.py): vocabulary padding, layers per chunk, stage totals that
add up to the model, leading dense layers, and more TP or PP never raising a GPU's share."""

from __future__ import annotations

import pytest

from autotune.cost.placement import chunk_layer_counts, heaviest_stage, padded_vocab_size, stage_params
from search_spaces.catalog import get_model
from search_spaces.layout import Layout


@pytest.mark.parametrize("vocab,tp,padded", [(50257, 1, 50304), (50257, 8, 51200), (1024, 8, 1024), (128256, 8, 129024)])
def test_vocab_padded_to_multiple_of_128_tp(vocab, tp, padded):
    assert padded_vocab_size(vocab, tp) == padded


@pytest.mark.parametrize("layers,pp,vpp,split,counts", [
    (8, 2, 1, (None, None, False), (4, 4)),
    (8, 2, 2, (None, None, False), (2, 2, 2, 2)),
    (94, 8, 4, (None, None, True), (2,) + (3,) * 30 + (2,)),  # (94 + 2) / 32 = 3, embedding and loss count as a layer
    (61, 16, 1, (3, 2, False), (3,) + (4,) * 14 + (2,)),  # 3 + 14 * 4 + 2 = 61 (num_layers_in_first/last_pipeline_stage)
    (126, 8, 2, (16, 14, False), (8,) * 7 + (7,) + (8,) * 7 + (7,)),  # each stage's layers split over its 2 chunks
])
def test_chunk_layer_counts(layers, pp, vpp, split, counts):
    assert chunk_layer_counts(layers, pp, vpp, split) == counts
    assert sum(counts) == layers


@pytest.mark.parametrize("name,pp", [("tiny-gpt", 1), ("tiny-gpt", 4), ("tiny-moe", 2), ("tiny-mla", 2),
                                     ("gpt3-175b", 8), ("deepseek-v3", 16)])
def test_stage_totals_add_up_to_the_model(name, pp):
    model = get_model(name)
    stages = stage_params(model, Layout(pp=pp))
    pad_rows = padded_vocab_size(model.vocab_size, 1) - model.vocab_size
    tied_copy = model.vocab_size + pad_rows if (model.tied_embeddings and pp > 1) else 0
    outputs = 1 if model.tied_embeddings else 2  # padded embedding and (untied) output layer
    mtp_copy = model.vocab_size + pad_rows if (model.mtp_num_layers and pp > 1) else 0  # the MTP stage's embedding
    expected = model.dense_params + outputs * pad_rows * model.hidden_size + (tied_copy + mtp_copy) * model.hidden_size
    assert sum(s.dense_params for s in stages) == expected
    assert sum(s.expert_params for s in stages) == model.routed_expert_params
    assert [s.dense_params_per_gpu for s in stages] == [s.dense_params for s in stages]  # TP = EP = 1


def test_deepseek_first_dense_layers_land_in_stage_0():
    stages = stage_params(get_model("deepseek-v3"), Layout(pp=16))
    assert (stages[0].layers, stages[0].moe_layers) == (4, 1)  # 3 dense + 1 MoE
    assert all(s.moe_layers == s.layers for s in stages[1:])


def test_embedding_first_stage_output_last_stage_with_vpp():
    stages = stage_params(get_model("tiny-gpt"), Layout(pp=2, vpp=2))
    assert [(s.has_embedding, s.has_output) for s in stages] == [(True, False), (False, True)]


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-moe", "llama3-70b", "mixtral-8x7b", "deepseek-v3"])
def test_more_tp_never_raises_weight_memory(name):
    model = get_model(name)
    per_gpu = [max(s.params_per_gpu for s in stage_params(model, Layout(tp=tp))) for tp in (1, 2, 4, 8)]
    assert per_gpu == sorted(per_gpu, reverse=True)


@pytest.mark.parametrize("name,pps", [("tiny-gpt", (1, 2, 4, 8)), ("llama3-70b", (1, 2, 4, 8, 16)),
                                      ("deepseek-v3", (1, 2, 4, 8, 16))])
def test_more_pp_never_raises_weight_memory(name, pps):
    model = get_model(name)
    per_gpu = [max(s.params_per_gpu for s in stage_params(model, Layout(tp=2, pp=pp))) for pp in pps]
    assert per_gpu == sorted(per_gpu, reverse=True)


def test_the_heaviest_stage_holds_the_most_parameters():
    # deepseek-v3 on PP 16 with the 3 + 14 x 4 + 2 split: stage 0 holds the 3 dense layers and the embedding
    # (1.36 B parameters per GPU at TP 2), more than a middle stage's 4 MoE layers at EP 64 (1.20 B); the last
    # stage holds 2 MoE layers, the output head and the MTP layer with its embedding copy (1.88 B), the most
    stages = stage_params(get_model("deepseek-v3"), Layout(tp=2, pp=16, ep=64, etp=1, dp=64,
                                                           first_stage_layers=3, last_stage_layers=2))
    heavy = heaviest_stage(stages)
    assert heavy.params_per_gpu == max(s.params_per_gpu for s in stages)
    assert heavy.stage == 15 and heavy.mtp_layers == 1
    assert stages[0].params_per_gpu > stages[1].params_per_gpu
