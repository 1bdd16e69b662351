"""Parameters per GPU from `autotune.memory.stage_params` against real megatron-core GPTModels.

A subprocess builds, for each layout, the model chunks that the first and the last rank would hold: torch's
fake process group (`FakeStore`, backend "fake") stands in for a world of TP * PP * CP * DP ranks, so
`parallel_state.initialize_model_parallel` creates the real groups and `GPTModel` allocates each rank's real
shards (local layer spec, CPU, no initialisation). Parameters are split the way megatron-core's DDP splits
them: expert parameters are the ones marked `allreduce = False`. The vocabulary is padded by Megatron-LM's
rule (a multiple of 128 * TP) before it reaches `GPTModel`, as `pretrain_gpt.py` does.

Run alone: `python tests/test_memory_megatron_params.py '<json cases>'` prints the counts as JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune.memory import MemoryAssumptions, padded_vocab_size, stage_params  # noqa: E402
from search_spaces.catalog import get_model  # noqa: E402
from search_spaces.layout import Layout  # noqa: E402
from search_spaces.model import ModelSpec, MoESpec  # noqa: E402

# GPT-3 style: LayerNorm, biases, GeLU, tied embeddings, learned positions, MHA, a vocabulary that needs padding.
TINY_GPT3 = ModelSpec(name="tiny-gpt3", num_layers=4, hidden_size=64, ffn_hidden_size=256, num_attention_heads=8,
                      vocab_size=1000, gated_linear_unit=False, tied_embeddings=True, add_bias_linear=True,
                      normalization="LayerNorm", max_position_embeddings=128)
# DeepSeek-style MoE without MLA: a leading dense layer, shared experts, qk-layernorm, qkv bias.
TINY_MOE_SHARED = replace(
    get_model("tiny-moe"), name="tiny-moe-shared", qk_layernorm=True, add_qkv_bias=True,
    moe=MoESpec(num_experts=8, topk=2, expert_ffn_hidden_size=256, shared_expert_ffn_hidden_size=256,
                first_dense_layers=1),
)
MODELS = {m.name: m for m in (get_model("tiny-gpt"), get_model("tiny-moe"), get_model("tiny-mla"), TINY_GPT3,
                               TINY_MOE_SHARED)}

CASES = [  # (model, layout)
    ("tiny-gpt", Layout()),
    ("tiny-gpt", Layout(tp=2, pp=2, sp=True)),
    ("tiny-gpt", Layout(tp=4, pp=2, vpp=2, sp=True)),
    ("tiny-gpt", Layout(tp=8, pp=4, dp=2, sp=True)),
    ("tiny-gpt3", Layout(tp=2, pp=2)),
    ("tiny-gpt3", Layout(tp=4)),
    ("tiny-moe", Layout(tp=2, pp=2, ep=4, etp=1, dp=2, sp=True)),
    ("tiny-moe", Layout(tp=2, ep=2, dp=2, sp=True)),  # ETP = TP = 2
    ("tiny-moe", Layout(pp=2, vpp=2, ep=8, dp=8)),
    ("tiny-moe-shared", Layout(tp=2, pp=2, ep=2, etp=1, sp=True)),
    ("tiny-moe-shared", Layout(pp=4, ep=2, dp=2)),
    # MLA: the local spec splits the down projections over TP (Transformer Engine's, the default, duplicates
    # them), so TP > 1 is compared with `mla_down_proj_split=True`
    ("tiny-mla", Layout(pp=2, ep=4, dp=4)),
    ("tiny-mla", Layout(tp=2, pp=2, ep=2, etp=1, sp=True)),
]
LOCAL_SPEC = MemoryAssumptions(mla_down_proj_split=True)


def _case_id(case: tuple[str, Layout]) -> str:
    return f"{case[0]}-{case[1]}"


# --- the subprocess: real megatron-core models -------------------------------------------------------------
class _ParameterFreeAttention:
    """Stands in for the core attention (no parameters) where the local spec cannot build MLA's; replaced by a
    torch module when the subprocess imports torch (see `_count_rank`)."""


def _count_rank(model: ModelSpec, layout: Layout, rank: int) -> dict[str, int]:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig
    from torch.testing._internal.distributed.fake_pg import FakeStore

    global _ParameterFreeAttention

    class _ParameterFreeAttention(torch.nn.Module):  # noqa: F811 - a torch module inside the subprocess
        def __init__(self, *args, **kwargs) -> None:
            super().__init__()

    if dist.is_initialized():
        ps.destroy_model_parallel()
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=layout.world_size)
    ps.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp, context_parallel_size=layout.cp,
        expert_model_parallel_size=layout.ep, expert_tensor_parallel_size=layout.expert_tp,
        create_gloo_process_groups=False,
    )
    moe: dict = {}
    if model.moe is not None:
        m = model.moe
        moe = dict(num_moe_experts=m.num_experts, moe_router_topk=m.topk, moe_ffn_hidden_size=m.expert_ffn_hidden_size,
                   moe_shared_expert_intermediate_size=m.shared_expert_ffn_hidden_size or None,
                   moe_layer_freq=[0] * m.first_dense_layers + [1] * (model.num_layers - m.first_dense_layers),
                   moe_grouped_gemm=False)
    mla: dict = {}
    config_class = TransformerConfig
    if model.mla is not None:
        config_class = MLATransformerConfig
        mla = dict(q_lora_rank=model.mla.q_lora_rank, kv_lora_rank=model.mla.kv_lora_rank,
                   qk_head_dim=model.mla.qk_head_dim, qk_pos_emb_head_dim=model.mla.qk_pos_emb_head_dim,
                   v_head_dim=model.mla.v_head_dim, rope_type="rope")
    config = config_class(
        num_layers=model.num_layers, hidden_size=model.hidden_size, ffn_hidden_size=model.ffn_hidden_size,
        num_attention_heads=model.num_attention_heads, num_query_groups=model.query_groups,
        kv_channels=model.head_dim, gated_linear_unit=model.gated_linear_unit,
        activation_func=F.silu if model.gated_linear_unit else F.gelu, normalization=model.normalization,
        add_bias_linear=model.add_bias_linear, add_qkv_bias=model.add_qkv_bias, qk_layernorm=model.qk_layernorm,
        tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp, context_parallel_size=layout.cp,
        expert_model_parallel_size=layout.ep, expert_tensor_parallel_size=layout.expert_tp,
        sequence_parallel=layout.sp, use_cpu_initialization=True, perform_initialization=False,
        params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16, gradient_accumulation_fusion=False,
        bias_activation_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
        bias_dropout_fusion=False, apply_rope_fusion=False, **moe, **mla,
    )
    dense = expert = 0
    for v in range(layout.vpp_size):
        vp = v if layout.vpp else None
        if model.moe is not None:  # per-layer specs: `moe_layer_freq` makes the leading layers dense
            spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False,
                                              normalization=model.normalization, vp_stage=vp)
            if model.mla is not None:  # the local DotProductAttention takes no MLA head dims; it has no params
                from megatron.core.transformer import multi_latent_attention

                if not isinstance(multi_latent_attention.TELinear, type):  # no TE: isinstance needs a type
                    multi_latent_attention.TELinear = type("TELinear", (), {})
                for layer in spec.layer_specs:
                    layer.submodules.self_attention.submodules.core_attention = _ParameterFreeAttention
        else:
            spec = get_gpt_layer_local_spec(qk_layernorm=model.qk_layernorm, normalization=model.normalization)
        gpt = GPTModel(
            config=config, transformer_layer_spec=spec,
            vocab_size=padded_vocab_size(model.vocab_size, layout.tp),
            max_sequence_length=max(128, model.max_position_embeddings),
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp),
            share_embeddings_and_output_weights=model.tied_embeddings,
            position_embedding_type="learned_absolute" if model.max_position_embeddings else "rope",
            vp_stage=vp,
        )
        for p in gpt.parameters():
            if getattr(p, "allreduce", True):
                dense += p.numel()
            else:
                expert += p.numel()
    return {"dense": dense, "expert": expert}


def _main(cases_json: str) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    # torch norms with SP (MoE with TP needs SP on); `.cuda()` of the tied output weight when PP > 1
    from trainers.cpu_patches import apply_cpu_patches, cpu_device_mode

    apply_cpu_patches()
    out = []
    with cpu_device_mode():
        for name, fields in json.loads(cases_json):
            layout, model = Layout(**fields), MODELS[name]
            last = layout.world_size - 1
            out.append({"first": _count_rank(model, layout, 0), "last": _count_rank(model, layout, last)})
    print(json.dumps(out))


# --- the tests ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def megatron_counts() -> list[dict[str, dict[str, int]]]:
    cases = json.dumps([(name, asdict(layout)) for name, layout in CASES])
    done = subprocess.run([sys.executable, __file__, cases], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(CASES)), ids=[_case_id(c) for c in CASES])
@pytest.mark.parametrize("end", ["first", "last"])
def test_params_per_gpu_match_megatron_core(megatron_counts, index, end):
    name, layout = CASES[index]
    stages = stage_params(MODELS[name], layout, LOCAL_SPEC)
    ours = stages[0] if end == "first" else stages[-1]
    real = megatron_counts[index][end]
    assert (ours.dense_params_per_gpu, ours.expert_params_per_gpu) == (real["dense"], real["expert"])


if __name__ == "__main__":
    _main(sys.argv[1])
