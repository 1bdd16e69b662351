"""Validity rules: the reference's examples, then each rule once, accepted and rejected."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from search_spaces.catalog import get_model
from search_spaces.cluster import ClusterSpec
from search_spaces.gpus import get_gpu, get_link
from search_spaces.job import Job
from search_spaces.layout import Layout, parse_layout
from search_spaces.model import MambaSpec, ModelSpec, MoESpec
from search_spaces.rules import RULE_NAMES, RULES, check, lcm, rules_for
from search_spaces.training import TrainingSpec, training_spec

# heads 12 and 4 query groups; ffn 240 divides by every TP up to 16 that the heads allow
GQA12 = ModelSpec(name="gqa12", num_layers=12, hidden_size=96, ffn_hidden_size=240, num_attention_heads=12,
                  num_query_groups=4, vocab_size=1024)
GQA12_FFN198 = ModelSpec(name="gqa12-ffn198", num_layers=12, hidden_size=96, ffn_hidden_size=198,
                         num_attention_heads=12, num_query_groups=4, vocab_size=1024)  # 198 % 4 = 2
# 6 experts of ffn 100 (divides by 1, 2, 4, 5 but not 8), shared experts of ffn 60, one dense layer
MOE6 = ModelSpec(name="moe6", num_layers=8, hidden_size=128, ffn_hidden_size=512, num_attention_heads=16,
                 num_query_groups=8, vocab_size=1024,
                 moe=MoESpec(num_experts=6, topk=2, expert_ffn_hidden_size=100, shared_expert_ffn_hidden_size=60,
                             first_dense_layers=1))
MOE_BIAS = ModelSpec(name="moe-bias", num_layers=8, hidden_size=128, ffn_hidden_size=512, num_attention_heads=16,
                     vocab_size=1024, add_bias_linear=True,
                     moe=MoESpec(num_experts=8, topk=2, expert_ffn_hidden_size=256))
# one MTP layer; hidden 100 with 12 heads of 8 channels: TP 3 splits the heads (12 % 3) and the FFN (240 % 3) but not
# the MTP layer's eh_proj (100 % 3 = 1)
MTP12 = ModelSpec(name="mtp12", num_layers=12, hidden_size=100, ffn_hidden_size=240, num_attention_heads=12,
                  kv_channels=8, vocab_size=1024, mtp_num_layers=1)
MOE_MTP2 = ModelSpec(name="moe-mtp2", num_layers=8, hidden_size=128, ffn_hidden_size=512, num_attention_heads=16,
                     vocab_size=1024, mtp_num_layers=2, moe=MoESpec(num_experts=8, topk=2, expert_ffn_hidden_size=256))
FLEX = {"moe_token_dispatcher": "flex"}
# hybrid Mamba models (search_spaces/hybrid_rules.py): Nemotron-H 8B (128 Mamba heads, 8 groups) and variants
H8B = get_model("nemotron-h-8b")
H8B_24 = dataclasses.replace(H8B, name="h8b-24", mamba=MambaSpec(num_heads=24, head_dim=64, state_dim=128,
                                                                 num_groups=8))
H8B_96 = dataclasses.replace(H8B, name="h8b-96", mamba=MambaSpec(num_heads=96, head_dim=64, state_dim=128,
                                                                 num_groups=6))


def make_job(model: ModelSpec | str, world: int, *, gpus_per_node: int = 0, seq: int = 4096, gbs: int = 256,
             **training: object) -> Job:
    model = get_model(model) if isinstance(model, str) else model
    gpn = gpus_per_node or min(world, 8)
    cluster = ClusterSpec(nodes=world // gpn, gpus_per_node=gpn, gpu=get_gpu("h100"), intra_node=get_link("nvlink4"),
                          inter_node=get_link("ib-ndr"))
    return Job(model=model, cluster=cluster,
               training=TrainingSpec(seq_length=seq, global_batch_size=gbs, **training))  # type: ignore[arg-type]


def rules_broken(job: Job, text: str, version: str | None = None) -> set[str]:
    return {v.rule for v in check(job, parse_layout(text, world_size=job.world_size), version=version)}


# --- the reference's examples (shared/reference/parallelism.md) -----------------------------------
def test_32_gpus_tp2_pp4_cp2_gives_dp2() -> None:
    job = make_job("tiny-gpt", 32)
    layout = parse_layout("tp=2,pp=4,cp=2", world_size=32)
    assert layout.dp == 2  # 32 / (2 * 4 * 2)
    assert check(job, layout) == ()


def test_pp1_tp2_ep8_fits_8_gpus_not_16() -> None:
    # PP * lcm(TP*CP, EP*ETP) = 1 * lcm(2, 8) = 8; PP * max would also say 8, the product TP*EP would say 16
    assert check(make_job("tiny-moe", 8), parse_layout("tp=2,ep=8,etp=1,sp=true", world_size=8)) == ()
    assert lcm(2, 8) == 8


def test_tp_cp_6_with_ep_etp_4_needs_12_gpus() -> None:
    # PP * lcm(TP*CP, EP*ETP) = lcm(2*3, 4*1) = 12, not max(6, 4) = 6
    text = "tp=2,cp=3,ep=4,etp=1,sp=true"
    seq = 4104  # 4104 % (2*3) == 0 and (4104 / 3) % 2 == 0
    assert rules_broken(make_job("tiny-moe", 12, gpus_per_node=4, seq=seq), text) == set()
    assert rules_broken(make_job("tiny-moe", 24, gpus_per_node=4, seq=seq), text) == set()
    assert rules_broken(make_job("tiny-moe", 6, gpus_per_node=2, seq=seq), text) == {"expert_world_size_divisible"}
    violation = check(make_job("tiny-moe", 6, gpus_per_node=2, seq=seq), parse_layout(text, world_size=6))[0]
    assert "= 12 GPUs" in violation.message


def test_8_experts_on_ep4_gives_2_per_gpu() -> None:
    job = make_job("tiny-moe", 8)
    layout = parse_layout("ep=4,etp=1", world_size=8)
    assert check(job, layout) == ()
    assert job.model.moe is not None
    assert job.model.moe.num_experts // layout.ep == 2  # 8 / 4
    assert layout.expert_dp == 2  # 8 / (1 * 4 * 1)


def test_sp_with_tp1_is_rejected() -> None:
    assert rules_broken(make_job("tiny-gpt", 8), "tp=1,sp=true") == {"sp_needs_tp"}


def test_seq_4096_with_cp3_is_rejected() -> None:
    # 4096 % (2 * 3) = 4
    assert rules_broken(make_job(GQA12, 12, gpus_per_node=4), "cp=3") == {"cp_sequence_divisible"}


def test_ep_on_a_dense_model_is_rejected() -> None:
    assert rules_broken(make_job("tiny-gpt", 8), "ep=2") == {"ep_needs_moe"}


# --- every rule: a layout that breaks only it ------------------------------------------------------
BROKEN: list[tuple[ModelSpec | str, int, int, int, int, str, str | None]] = [
    # (model, world, gpus_per_node, seq, gbs, layout, the one rule it breaks)
    (GQA12, 12, 4, 4096, 24, "tp=2,pp=4", "world_size_divisible"),  # 12 % 8 = 4
    (H8B, 16, 8, 4096, 256, "tp=16,sp=true", "mamba_divisible_by_tp"),  # 8 groups % 16
    (H8B_24, 16, 8, 4096, 256, "tp=8,cp=2", "mamba_heads_divisible_by_cp"),  # 24 / 8 = 3 heads % 2
    (H8B_96, 4, 4, 4096, 256, "cp=4", "mamba_groups_vs_cp"),  # 96 heads split, 6 groups % 4
    (H8B, 4, 4, 4096, 256, "pp=4,vpp=13", "hybrid_vpp_needs_pipes"),  # VPP needs '|' in the pattern
    (H8B, 3, 3, 4096, 255, "pp=3", "hybrid_layers_split"),  # 52 % 3
    (H8B, 2, 2, 4096, 256, "pp=2,embedding_loss_split=true", "hybrid_split_fields"),  # (52 + 2) / 2: GPT would take it
    ("nemotron-3-nano", 8, 8, 4096, 256, "ep=8,etp=1,ep_overlap=true", "hybrid_no_ep_overlap"),
    (GQA12, 12, 4, 4096, 24, "tp=2,pp=2,dp=2", "data_parallel_size_matches"),  # 12 / 4 = 3, not 2
    ("tiny-gpt", 16, 8, 4096, 256, "tp=16,sp=true", None),  # heads 16, groups 8: 16 % 8 == 0 is accepted
    (GQA12, 8, 8, 4096, 256, "tp=8,sp=true", "heads_divisible_by_tp"),  # 12 % 8 = 4 (groups 4 divide 8)
    (GQA12, 12, 4, 4104, 24, "tp=3", "query_groups_vs_tp"),  # 4 % 3 and 3 % 4 are both non-zero
    (GQA12_FFN198, 8, 8, 4096, 256, "tp=4", "ffn_divisible_by_tp"),  # heads and groups divide by 4, 198 % 4 = 2
    (MOE6, 8, 8, 4096, 256, "tp=4,sp=true,ep=2,etp=1", None),  # shared experts: 60 % 4 = 0
    (MOE6, 16, 8, 4096, 256, "tp=8,sp=true,ep=2,etp=1", "shared_expert_ffn_divisible_by_tp"),  # 60 % 8 = 4
    (MOE6, 8, 8, 4096, 256, "ep=1,etp=8", "expert_ffn_divisible_by_etp"),  # 100 % 8 = 4
    (GQA12, 16, 8, 4096, 256, "pp=8", "layers_divisible_by_pp"),  # 12 % 8 = 4
    (GQA12, 16, 8, 4096, 256, "pp=2,vpp=4", "layers_divisible_by_vpp"),  # 12 / 2 = 6, 6 % 4 = 2
    (GQA12, 16, 8, 4096, 256, "pp=1,vpp=2", "vpp_needs_pp"),
    # uneven pipeline split, 12 layers (megatron-core transformer_config.py, "Uneven PP")
    (GQA12, 16, 8, 4096, 256, "pp=2,first_stage_layers=6,embedding_loss_split=true", "pipeline_split_exclusive"),
    (GQA12, 16, 8, 4096, 256, "pp=1,first_stage_layers=12", "pipeline_split_needs_pp"),  # megatron: a no-op
    (GQA12, 16, 8, 4096, 256, "pp=1,embedding_loss_split=true", "pipeline_split_needs_pp"),
    (GQA12, 12, 4, 4096, 24, "pp=3,vpp=5,first_stage_layers=2,last_stage_layers=5",
     "first_stage_layers_divisible_by_vpp"),  # 2 % 5 = 2; middle 12 - 2 - 5 = 5 on 1 stage, 5 % 5 = 0
    (GQA12, 12, 4, 4096, 24, "pp=3,vpp=5,first_stage_layers=5,last_stage_layers=2",
     "last_stage_layers_divisible_by_vpp"),
    (GQA12, 16, 8, 4096, 256, "pp=2,first_stage_layers=5,last_stage_layers=5",
     "middle_stages_match"),  # 12 - 5 - 5 = 2 layers left, 0 middle stages
    (GQA12, 16, 8, 4096, 256, "pp=2,first_stage_layers=5", None),  # 7 layers on the 1 stage left
    (GQA12, 16, 8, 4096, 256, "pp=2,first_stage_layers=5,last_stage_layers=7", None),  # 0 layers, 0 stages
    (GQA12, 16, 8, 4096, 256, "pp=4,first_stage_layers=2", "middle_layers_divisible"),  # 10 % 3 = 1
    (GQA12, 16, 8, 4096, 256, "pp=4,first_stage_layers=9,last_stage_layers=9",
     "first_last_within_num_layers"),  # 12 - 18 = -6 for 2 middle stages (megatron-core: -6 % 2 == 0, accepted)
    (GQA12, 16, 8, 4096, 256, "pp=4,first_stage_layers=3", None),  # 12 - 3 = 9 on 3 stages: 3 each
    (GQA12, 16, 8, 4096, 256, "pp=4,vpp=2,first_stage_layers=2,last_stage_layers=4",
     "middle_layers_divisible_by_vpp"),  # (12 - 2 - 4) / 2 = 3 per middle stage, 3 % 2 = 1
    (GQA12, 16, 8, 4096, 256, "pp=4,vpp=2,first_stage_layers=2,last_stage_layers=2", None),  # 8 / 2 = 4
    # PP 2, first and last, VPP 2: 0 middle stages; megatron-core divides by them on PP rank 1
    (GQA12, 16, 8, 4096, 256, "pp=2,vpp=2,first_stage_layers=6,last_stage_layers=6",
     "first_last_vpp_needs_middle_stage"),
    (GQA12, 16, 8, 4096, 256, "pp=2,vpp=2,first_stage_layers=6", None),  # only one of them: builds
    (GQA12, 16, 8, 4096, 256, "pp=2,first_stage_layers=6,last_stage_layers=6", None),  # no VPP: builds
    (GQA12, 16, 8, 4096, 256, "pp=2,vpp=2,pipeline_layout=Et*3|t*3|t*3|t*3L", None),  # the same split as a string
    (GQA12, 16, 8, 4096, 256, "pp=4,embedding_loss_split=true", "embedding_loss_layers_divisible_by_pp"),  # 14 % 4
    (GQA12, 16, 8, 4096, 256, "pp=2,embedding_loss_split=true", None),  # (12 + 2) / 2 = 7
    (GQA12, 16, 8, 4096, 256, "pp=2,vpp=2,embedding_loss_split=true",
     "embedding_loss_layers_divisible_by_vpp"),  # 14 / 2 = 7, 7 % 2 = 1
    # pipeline_model_parallel_layout strings, 12 layers (pipeline_parallel_layer_layout.py)
    (GQA12, 16, 8, 4096, 256, "pp=2,first_stage_layers=6,pipeline_layout=Et*6|t*6L", "pipeline_layout_exclusive"),
    (GQA12, 16, 8, 4096, 256, "pp=2,pipeline_layout=Et*6|t*5xL", "pipeline_layout_syntax"),
    (GQA12, 16, 8, 4096, 256, "pp=4,pipeline_layout=Et*4|t*4|t*4L", "pipeline_layout_divisible_by_pp"),  # 3 % 4
    (GQA12, 16, 8, 4096, 256, "pp=2,vpp=3,pipeline_layout=Et*3|t*3|t*3|t*3L",
     "pipeline_layout_vpp_matches"),  # 4 stages / PP 2 = 2, not 3
    (GQA12, 16, 8, 4096, 256, "pp=2,pipeline_layout=t*6|Et*6L", "pipeline_layout_embedding_and_loss"),
    (GQA12, 16, 8, 4096, 256, "pp=2,pipeline_layout=Et*6|t*5L", "pipeline_layout_decoder_count"),  # 11, not 12
    (GQA12, 16, 8, 4096, 256, "pp=2,pipeline_layout=Et*6|t*6mL", "pipeline_layout_mtp"),  # the model has no MTP
    (MTP12, 16, 8, 4096, 256, "pp=2,pipeline_layout=Et*6|t*6mL", None),
    (MTP12, 16, 8, 4096, 256, "pp=2,vpp=2,pipeline_layout=Et*3|t*3m|t*3|t*3L", "pipeline_layout_mtp"),  # m before t
    (MTP12, 16, 8, 4096, 256, "pp=2,vpp=2,pipeline_layout=Et*3|t*3|t*3|t*3mL", None),
    (GQA12, 16, 8, 4096, 256, "pp=2,pipeline_layout=Et*12||L", "pipeline_layout_divisible_by_pp"),  # 3 stages
    (GQA12, 16, 8, 4096, 256, "pp=2,vpp=2,pipeline_layout=Et*12|||L", None),  # empty stages build
    (MTP12, 12, 4, 4104, 24, "tp=3", "mtp_hidden_divisible_by_tp"),  # eh_proj: 100 % 3 = 1
    (GQA12, 16, 8, 4096, 8, "pp=4,vpp=3", "vpp_microbatches"),  # M = 8 / (1 * 4) = 2 < PP = 4
    (GQA12, 16, 8, 4096, 24, "pp=4,vpp=3", "vpp_microbatches"),  # M = 24 / 4 = 6, 6 % 4 = 2
    (GQA12, 16, 8, 4096, 32, "pp=4,vpp=3", None),  # M = 32 / 4 = 8, 8 % 4 = 0
    ("tiny-gpt", 8, 8, 4096, 256, "sp=true", "sp_needs_tp"),
    ("tiny-moe", 8, 8, 4096, 256, "tp=2,ep=2", "moe_tp_needs_sp"),
    ("tiny-moe", 8, 8, 4096, 256, "tp=2,ep=2,sp=true", None),
    (GQA12, 12, 4, 4098, 24, "cp=2", "cp_sequence_divisible"),  # 4098 % 4 = 2
    (GQA12, 12, 4, 4104, 24, "tp=4,sp=true", None),  # 4104 % 4 = 0
    (GQA12, 12, 4, 4098, 24, "tp=4,sp=true", "sp_sequence_divisible"),  # 4098 % 4 = 2
    ("tiny-gpt", 8, 8, 4096, 256, "ep=2", "ep_needs_moe"),
    (MOE6, 8, 8, 4096, 256, "ep=4,etp=1", "experts_divisible_by_ep"),  # 6 % 4 = 2
    (MOE_BIAS, 8, 8, 4096, 256, "tp=2,sp=true,ep=2", "moe_bias_needs_etp1"),  # ETP defaults to TP = 2
    (MOE_BIAS, 8, 8, 4096, 256, "tp=2,sp=true,ep=2,etp=1", None),
    ("tiny-moe", 8, 8, 4096, 256, "tp=2,sp=true,ep=8", "expert_world_size_divisible"),  # 8 % (2*8) != 0
    ("tiny-gpt", 8, 8, 4096, 12, "mbs=1", "global_batch_divisible"),  # 12 % (1 * 8) = 4
    # 12 heads, 4 groups of 8: TP 12 replicates the KV heads, but linear_qkv's (12 + 2 * 4) * 8 = 160 outputs do not
    # split over 12 (megatron-core: "160 is not divisible by 12")
    (GQA12, 12, 12, 4104, 24, "tp=12,sp=true", "qkv_divisible_by_tp"),
    (GQA12, 12, 12, 4104, 24, "tp=4,sp=true", None),  # 160 / 4
    # Megatron-FSDP and layer offload (search_spaces/fsdp_rules.py)
    ("tiny-gpt", 8, 8, 4096, 256, "dist_opt=true,fsdp=true", None),
    ("tiny-gpt", 8, 8, 4096, 256, "tp=2,sp=true,dist_opt=true,fsdp=true", None),
    ("tiny-gpt", 8, 8, 4096, 256, "pp=2,dist_opt=true,fsdp=true", "fsdp_needs_pp1"),  # the mesh is the whole world
    ("tiny-gpt", 8, 8, 4096, 256, "fsdp=true", "fsdp_needs_dist_opt"),
    ("tiny-moe", 8, 8, 4096, 256, "ep=2,dist_opt=true,fsdp=true", None),
    ("tiny-moe", 8, 8, 4096, 256, "ep=2,dist_opt=true,fsdp=true,ep_overlap=true", "fsdp_ep_overlap"),
    ("tiny-gpt", 8, 8, 4096, 256, "offload_layers=7", None),  # 8 layers: at most 7
    ("tiny-gpt", 8, 8, 4096, 256, "offload_layers=8", "offload_layers_lt_num_layers"),
    ("tiny-gpt", 8, 8, 4096, 256, "pp=2,offload_layers=1", "offload_needs_pp1"),
    ("tiny-gpt", 8, 8, 4096, 256, "offload_layers=1,recompute=selective", "offload_no_recompute"),
    ("tiny-gpt", 8, 8, 4096, 256, "offload_layers=1,recompute=full", "offload_no_recompute"),
    (H8B, 8, 8, 4096, 256, "offload_layers=1", "offload_hybrid"),
]


# rules of the training settings and the layout's switches (the MoE dispatcher, the EP all-to-all overlap, CUDA
# graphs), per megatron-core version; training settings by name, each its own type (TrainingSpec checks them)
OVERLAP = ",ep_overlap=true"
_TINY_MOE = get_model("tiny-moe")
assert _TINY_MOE.moe is not None
DENSE_FIRST_MOE = dataclasses.replace(_TINY_MOE, name="tiny-moe-dense-first",
                                      moe=dataclasses.replace(_TINY_MOE.moe, first_dense_layers=1))
TRAINING_BROKEN: list[tuple[ModelSpec | str, int, dict[str, Any], str, str, str | None]] = [
    # (model, world, training, layout, version, the one rule it breaks)
    ("tiny-moe", 8, FLEX, "ep=1,etp=1", "0.16.1", "flex_dispatcher_needs_tp_ep"),  # 1 x 1: nothing to dispatch over
    # 24 heads: in_proj 2 x 1536 + 2 x 8 x 128 + 24 = 5144, not a multiple of 16
    (H8B_24, 8, {"precision": "fp8", "fp8_recipe": "tensorwise"}, "tp=1", "0.19.2", "mamba_fp8_in_proj_width"),
    (H8B, 8, {"recompute_num_layers": 2}, "recompute=full", "0.19.2", "hybrid_block_recompute"),
    ("tiny-moe", 8, FLEX, "ep=2,etp=1", "0.16.1", None),
    ("tiny-gpt", 8, {}, "offload_layers=1,cuda_graphs=transformer_engine", "0.19.2", "offload_cuda_graphs"),
    ("tiny-gpt", 8, {"optimizer": "muon"}, "dist_opt=true,fsdp=true", "0.19.2", "muon_no_fsdp"),
    ("tiny-gpt", 8, {"optimizer": "muon"}, "dist_opt=true,fsdp=true", "0.16.1", "muon_no_fsdp"),
    ("tiny-gpt", 8, {"optimizer": "muon"}, "dist_opt=true", "0.19.2", None),  # layer-wise Muon: no rule
    ("tiny-gpt", 8, {}, "offload_layers=1,cuda_graphs=full_iteration", "0.19.2", None),  # 0.19: full graphs pass
    ("tiny-gpt", 8, {}, "offload_layers=1,cuda_graphs=full_iteration", "0.16.1", "offload_cuda_graphs"),
    ("tiny-moe", 8, FLEX, "ep=1,etp=1", "0.19.2", "flex_dispatcher_needs_tp_ep"),  # DeepEP (the H100 default)
    ("tiny-moe", 8, {**FLEX, "moe_flex_backend": "hybridep"}, "ep=1,etp=1", "0.19.2", None),  # 0.19: deepep, ncclep
    ("tiny-moe", 8, {}, "ep=1" + OVERLAP, "0.16.1", "ep_overlap_needs_ep"),
    ("tiny-moe", 8, {}, "pp=2,ep=2" + OVERLAP, "0.16.1", "ep_overlap_needs_vpp"),
    ("tiny-moe", 8, {}, "pp=2,vpp=2,ep=2" + OVERLAP, "0.16.1", None),
    ("tiny-moe", 8, {}, "ep=2,recompute=full" + OVERLAP, "0.16.1", "ep_overlap_no_full_recompute"),
    ("tiny-moe", 8, {"recompute_modules": ("moe",)}, "ep=2,recompute=selective" + OVERLAP, "0.19.2",
     "ep_overlap_recompute_modules"),  # new in 0.19
    ("tiny-moe", 8, {"recompute_modules": ("moe",)}, "ep=2,recompute=selective" + OVERLAP, "0.16.1", None),
    (MOE_MTP2, 8, {}, "ep=2" + OVERLAP, "0.16.1", "ep_overlap_mtp"),  # at most one MTP layer
    (MOE_MTP2, 8, {}, "ep=2" + OVERLAP, "0.19.2", "ep_overlap_mtp"),
    (dataclasses.replace(MOE_MTP2, mtp_num_layers=1), 8, {}, "ep=2" + OVERLAP, "0.16.1", "ep_overlap_mtp"),  # PP 1
    (dataclasses.replace(MOE_MTP2, mtp_num_layers=1), 8, {}, "ep=2" + OVERLAP, "0.19.2", None),  # dropped in 0.19
    ("tiny-moe", 8, {}, "ep=2,cuda_graphs=local" + OVERLAP, "0.16.1", "ep_overlap_cuda_graphs"),
    ("tiny-moe", 8, {}, "ep=2,cuda_graphs=local" + OVERLAP, "0.19.2", None),
    # per-layer graphs may not capture moe or mlp under the overlap, in both versions
    ("tiny-moe", 8, {"cuda_graph_modules": ("attn", "moe")}, "ep=2,cuda_graphs=transformer_engine" + OVERLAP,
     "0.16.1", "ep_overlap_cuda_graphs"),
    (DENSE_FIRST_MOE, 8, {"cuda_graph_modules": ("mlp",)}, "ep=2,cuda_graphs=transformer_engine" + OVERLAP,
     "0.19.2", "ep_overlap_cuda_graphs"),
    ("tiny-moe", 8, {"cuda_graph_modules": ("attn", "moe_router")}, "ep=2,cuda_graphs=transformer_engine" + OVERLAP,
     "0.16.1", None),
    # full recompute only under full-iteration CUDA graphs, in both versions (transformer_config.py __post_init__)
    ("tiny-gpt", 8, {}, "recompute=full,cuda_graphs=local", "0.16.1", "cuda_graphs_no_full_recompute"),
    ("tiny-gpt", 8, {"cuda_graph_modules": ("attn",)}, "recompute=full,cuda_graphs=transformer_engine", "0.19.2",
     "cuda_graphs_no_full_recompute"),
    ("tiny-gpt", 8, {}, "recompute=selective,cuda_graphs=local", "0.19.2", None),
    ("tiny-gpt", 8, {}, "recompute=full,cuda_graphs=full_iteration", "0.19.2", None),
    ("tiny-gpt", 8, {}, "recompute=full,cuda_graphs=full_iteration", "0.16.1", None),  # local, scope full_iteration
    # what per-layer graphs may capture (transformer_config.py 0.19.2 :2478-2516)
    ("tiny-moe", 8, {"cuda_graph_modules": ("moe_preprocess",)}, "ep=2,cuda_graphs=transformer_engine", "0.19.2",
     "cuda_graph_modules_supported"),
    ("tiny-moe", 8, {"cuda_graph_modules": ("attn", "moe")}, "ep=2,cuda_graphs=transformer_engine", "0.19.2",
     "cuda_graph_modules_supported"),  # a dropless MoE block
    ("tiny-gpt", 8, {"cuda_graph_modules": ("moe_router",)}, "cuda_graphs=transformer_engine", "0.19.2",
     "cuda_graph_modules_supported"),  # no MoE layer
    ("tiny-moe", 8, {}, "ep=2,cuda_graphs=transformer_engine", "0.19.2", None),  # attn, moe_router, moe_preprocess
    # selective recompute of moe under graphs of the router
    ("tiny-moe", 8, {"recompute_modules": ("moe",)}, "ep=2,recompute=selective,cuda_graphs=transformer_engine",
     "0.19.2", "te_graphs_moe_recompute"),
    ("tiny-moe", 8, {"recompute_modules": ("moe",), "cuda_graph_modules": ("attn",)},
     "ep=2,recompute=selective,cuda_graphs=transformer_engine", "0.19.2", None),
    # full-iteration graphs of a MoE model need the paged stash: HybridEP in 0.19, not at all in 0.16.1
    ("tiny-moe", 8, {"moe_token_dispatcher": "alltoall"}, "ep=2,cuda_graphs=full_iteration", "0.19.2",
     "full_iteration_moe"),
    ("tiny-moe", 8, {**FLEX, "moe_flex_backend": "hybridep"}, "ep=2,cuda_graphs=full_iteration", "0.19.2", None),
    ("tiny-moe", 8, {**FLEX, "moe_flex_backend": "hybridep"}, "ep=2,cuda_graphs=full_iteration", "0.16.1",
     "full_iteration_moe"),
    # BF16 edge layers of an FP8 run within one stage's layers (transformer_config.py 0.19.2 :1405-1425)
    ("tiny-gpt", 8, {"precision": "fp8", "bf16_layers_at_end": 5}, "pp=2", "0.19.2", "bf16_layers_within_stage"),
    ("tiny-gpt", 8, {"precision": "fp8", "bf16_layers_at_end": 4}, "pp=2", "0.19.2", None),
]


@pytest.mark.parametrize(("model", "world", "gpn", "seq", "gbs", "text", "rule"), BROKEN)
def test_each_rule_alone(model, world, gpn, seq, gbs, text, rule) -> None:
    job = make_job(model, world, gpus_per_node=gpn, seq=seq, gbs=gbs)
    assert rules_broken(job, text) == ({rule} if rule else set())


@pytest.mark.parametrize(("model", "world", "training", "text", "version", "rule"), TRAINING_BROKEN)
def test_each_training_rule_alone(model, world, training, text, version, rule) -> None:
    job = make_job(model, world, **training)
    assert rules_broken(job, text, version) == ({rule} if rule else set())


def test_sp_splits_the_per_rank_sequence_after_cp() -> None:
    # seq 4100, CP 2: 4100 % 4 = 0 passes CP; each rank holds 2050 tokens; TP 4: 2050 % 4 = 2
    job = make_job(GQA12, 16, seq=4100, gbs=32)
    assert rules_broken(job, "tp=4,cp=2,sp=true") == {"sp_sequence_divisible"}
    assert rules_broken(job, "tp=2,cp=2,sp=true") == set()  # 2050 % 2 = 0


def test_every_rule_has_a_breaking_example() -> None:
    assert set(RULE_NAMES) <= {b[-1] for b in BROKEN} | {b[-1] for b in TRAINING_BROKEN}


def _example_violation(name: str):
    for model, world, gpn, seq, gbs, text, rule in BROKEN:
        if rule == name:
            job = make_job(model, world, gpus_per_node=gpn, seq=seq, gbs=gbs)
            return next(v for v in check(job, parse_layout(text, world_size=world)) if v.rule == name)
    model, world, training, text, version, _ = next(b for b in TRAINING_BROKEN if b[-1] == name)
    job = make_job(model, world, **training)
    return next(v for v in check(job, parse_layout(text, world_size=world), version=version) if v.rule == name)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_violation_names_its_fields_and_values(rule) -> None:
    violation = _example_violation(rule.name)
    assert violation.fields
    for name, value in violation.fields.items():
        if isinstance(value, int) and not isinstance(value, bool):
            assert str(value) in violation.message, name
    assert rule.source.startswith("megatron/core/")


STRICTER_RULES = {"pipeline_split_needs_pp", "first_last_within_num_layers", "full_iteration_moe",
                  "hybrid_split_fields", "hybrid_block_recompute", "fsdp_needs_pp1", "fsdp_needs_dist_opt",
                  "offload_hybrid"}


def test_pp1_split_that_megatron_refuses_too_is_not_stricter() -> None:
    # first 5 of 12 at PP 1: 7 layers left, 0 middle stages, megatron-core's "Mismatch"
    (violation,) = check(make_job(GQA12, 16), parse_layout("pp=1,first_stage_layers=5", world_size=16))
    assert violation.rule == "pipeline_split_needs_pp" and not violation.stricter
    assert violation.message.startswith("Mismatch: 7 middle layers remaining but 0 middle PP stages available")


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_deliberate_refusals_say_megatron_core_would_accept(rule) -> None:
    violation = _example_violation(rule.name)
    assert violation.stricter == (rule.name in STRICTER_RULES)
    assert ("megatron-core would accept this layout; autotune refuses it because" in violation.message) \
        == violation.stricter


@pytest.mark.parametrize(("text", "field"), [
    ("pp=1,embedding_loss_split=true", "embedding_loss_split=true"),
    ("pp=1,first_stage_layers=12", "first_stage_layers=12"),
    ("pp=1,first_stage_layers=5,last_stage_layers=3", "last_stage_layers=3"),
])
def test_pipeline_split_needs_pp_names_the_field_given(text, field) -> None:
    (violation,) = check(make_job(GQA12, 16), parse_layout(text, world_size=16))
    assert field in violation.message and "None" not in violation.message


def test_a_negative_middle_says_so() -> None:
    (violation,) = check(make_job(GQA12, 16), parse_layout("pp=4,first_stage_layers=9,last_stage_layers=9",
                                                           world_size=16))
    assert "9 + 9 = 18 exceeds num_layers 12" in violation.message
    assert "-6 layers (a negative number)" in violation.message


def test_moe_tp_needs_sp_is_a_hard_error() -> None:
    (violation,) = check(make_job("tiny-moe", 8), parse_layout("tp=2,ep=2", world_size=8))
    assert violation.message.startswith("a MoE model with tensor_model_parallel_size 2 needs sequence_parallel true")
    assert "raises ValueError" in violation.message


def test_the_pp2_split_suggests_the_equivalent_layout_string() -> None:
    # mixtral, 32 layers: 14 + 18 over PP 2 x VPP 2 -> chunks of 7 (rank 0) and 9 (rank 1)
    (violation,) = check(make_job("mixtral", 32), parse_layout(
        "tp=1,pp=2,vpp=2,first_stage_layers=14,last_stage_layers=18", world_size=32))
    assert "ZeroDivisionError" in violation.message and "pipeline_layout=Et*7|t*9|t*7|t*9L" in violation.message
    assert rules_broken(make_job("mixtral", 32), "tp=1,pp=2,vpp=2,pipeline_layout=Et*7|t*9|t*7|t*9L") == set()


@pytest.mark.parametrize(("version", "message"), [
    ("0.16.1", "num_layers should be divisible by pipeline_model_parallel_size"),
    ("0.19.2", "num_layers=12 should be divisible by config.pipeline_model_parallel_size=8"),
    ("0.18.0", "num_layers=12 should be divisible by config.pipeline_model_parallel_size=8"),  # 0.19's rules
])
def test_layers_divisible_by_pp_in_each_versions_words(version, message) -> None:
    (violation,) = check(make_job(GQA12, 16), parse_layout("pp=8", world_size=16), version=version)
    assert violation.message.startswith(message)


def test_rules_for_unknown_versions_fall_back() -> None:
    assert [r.name for r in rules_for("0.15.0")] == [r.name for r in rules_for("0.16.1")]
    assert rules_for("0.20.1") == rules_for("0.19.2")


def test_megatron_wording() -> None:
    job = make_job(GQA12, 8)
    (violation,) = check(job, parse_layout("tp=8,sp=true", world_size=8))
    assert violation.message == "num_attention_heads (12) must be a multiple of tensor_model_parallel_size (8)."


def test_every_violation_is_listed() -> None:
    # world 8 % (8*3) != 0; heads 12 % 8 = 4; seq 4096 % (2*3) = 4; EP on a dense model; 8 % (8*2*1) != 0
    broken = rules_broken(make_job(GQA12, 8), "tp=8,cp=3,ep=2")
    assert broken == {"world_size_divisible", "heads_divisible_by_tp", "cp_sequence_divisible", "ep_needs_moe",
                      "expert_world_size_divisible"}


def test_unset_etp_means_tp() -> None:
    # ETP = TP = 2 and EP 4: expert grid 2 * 4 = 8 divides 8 GPUs; etp=4 would need 16
    job = make_job("tiny-moe", 8)
    assert rules_broken(job, "tp=2,sp=true,ep=4") == set()
    assert rules_broken(job, "tp=2,sp=true,ep=4,etp=4") == {"expert_world_size_divisible"}


@pytest.mark.parametrize(("model", "world", "text"), [
    ("deepseek-v3", 2048, "tp=2,pp=16,ep=64,sp=true,first_stage_layers=3,last_stage_layers=2"),  # 3 + 14*4 + 2
    # Megatron-Bridge v0.3.1 perf presets (scripts/performance/configs/deepseek): H100 PP 8 x VPP 4, GB300 PP 2 x VPP 8
    ("deepseek-v3", 1024, "tp=2,pp=8,ep=64,sp=true,pipeline_layout=Et|(tt|)*30mL"),
    ("deepseek-v3", 256, "pp=2,vpp=8,ep=32,pipeline_layout=Et*4|(t*4|)*14tmL"),
    ("deepseek-v3", 256, "pp=8,vpp=2,ep=32,pipeline_layout=Et*4|(t*4|)*14tmL"),  # the recipe table's (8, 2) entry
    ("llama3.1-405b", 512, "tp=8,pp=8,vpp=8,sp=true,embedding_loss_split=true"),  # (126 + 2) / 8 = 16 = 8 * 2
    ("qwen3-235b", 256, "tp=4,pp=8,vpp=4,ep=8,sp=true,embedding_loss_split=true"),  # (94 + 2) / 8 = 12 = 4 * 3
])
def test_published_uneven_recipes_are_valid(model, world, text) -> None:
    assert rules_broken(make_job(model, world, gbs=1024), text) == set()


def test_split_layer_counts_must_be_positive() -> None:
    with pytest.raises(ValueError, match="num_layers_in_first_pipeline_stage must be larger than 0"):
        check(make_job(GQA12, 16), Layout(pp=2, dp=8, first_stage_layers=0))


def test_non_positive_sizes_are_bad_input() -> None:
    with pytest.raises(ValueError, match="tp > 0"):
        check(make_job("tiny-gpt", 8), Layout(tp=0))


# --- the installed megatron-core (search_spaces/megatron_version.py) ---------------------------------------------
@pytest.mark.parametrize(("installed", "rules", "note"), [
    ("0.16.1", "0.16.1", None),
    ("0.19.2", "0.19.2", None),
    ("0.17.0rc1", "0.19.2", "megatron-core 0.17.0rc1 is installed; megatron-core 0.19.2's rules were applied"),
    ("0.12.0", "0.16.1", "megatron-core 0.12.0 is installed; megatron-core 0.16.1's rules were applied"),
    (None, "0.19.2", "megatron-core is not installed; megatron-core 0.19.2's rules were applied"),
])
def test_version_info_says_which_rules_apply(monkeypatch, installed, rules, note) -> None:
    from search_spaces import megatron_version

    monkeypatch.setattr(megatron_version, "installed_version", lambda: installed)
    assert megatron_version.version_info() == {"megatron_core_installed": installed, "megatron_core_rules": rules,
                                               "note": note}
    assert megatron_version.rules_version() == rules


@pytest.mark.parametrize(("given", "rules"), [("0.16.1", "0.16.1"), ("0.16", "0.16.1"), ("0.19", "0.19.2"),
                                              ("0.19.2", "0.19.2"), ("v0.19.0", "0.19.2"), ("0.19.3rc1", "0.19.2")])
def test_megatron_core_choice_names_a_rule_set(given, rules) -> None:
    from search_spaces.megatron_version import megatron_core_choice

    assert megatron_core_choice(given) == rules
    assert training_spec(megatron_core=given).megatron_core == rules


@pytest.mark.parametrize("given", ["0.18", "0.17.1", "1.0", "latest", "0.19; rm", ""])
def test_a_megatron_core_without_rules_is_refused(given) -> None:
    from search_spaces.megatron_version import megatron_core_choice

    with pytest.raises(ValueError, match=r"0\.16\.x or 0\.19\.x release"):
        megatron_core_choice(given)


def test_the_job_picks_the_rule_set() -> None:
    """0.16.1 asks for PP > 1 with an MTP layer and the EP A2A overlap; 0.19 does not (`ep_overlap_mtp`)."""
    layout = Layout(ep=2, dp=8, ep_overlap=True)
    model = dataclasses.replace(MOE_MTP2, mtp_num_layers=1)
    for version, refused in (("0.16.1", True), ("0.19.2", False)):
        job = make_job(model, 8, megatron_core=version)
        assert ("ep_overlap_mtp" in {v.rule for v in check(job, layout)}) is refused, version


def test_the_installed_version_is_read_from_metadata_without_importing_megatron() -> None:
    import subprocess
    import sys

    code = ("import sys; from search_spaces.megatron_version import installed_version; "
            "v = installed_version(); assert 'megatron' not in sys.modules, sorted(sys.modules); print(v)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    from importlib.metadata import version

    assert done.stdout.strip() == version("megatron-core")
