"""Model catalog, parameter counts against published figures, and Hugging Face config.json loading."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from search_spaces.catalog import PUBLISHED, get_model, list_models, model_names
from search_spaces.hf_config import SUPPORTED_ARCHITECTURES, model_from_hf_config
from search_spaces.model import ModelSpec

HF_DATA = Path(__file__).parent / "data" / "hf"


# --- counts vs published figures ------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_total_params_match_published(name: str) -> None:
    published = PUBLISHED[name]
    model = get_model(name)
    assert abs(model.total_params - published.total_params) <= published.tolerance(published.total_params)


@pytest.mark.parametrize("name", sorted(n for n, p in PUBLISHED.items() if p.active_params is not None))
def test_active_params_match_published(name: str) -> None:
    # DeepSeek-V3: 37.55B counted, "37B" published (truncated); within its last digit (1e9).
    published = PUBLISHED[name]
    model = get_model(name)
    assert abs(model.active_params - published.active_params) <= published.tolerance(published.active_params)


@pytest.mark.parametrize(
    ("name", "exact_total"),
    [
        # Exact sums of the tensor shapes in the HF safetensors index (same as `sum(p.numel())`).
        ("llama3-8b", 8_030_261_248),
        ("mixtral-8x7b", 46_702_792_704),
        ("qwen2-7b", 7_615_616_512),
        ("mistral-7b", 7_241_732_096),
    ],
)
def test_total_params_exact(name: str, exact_total: int) -> None:
    assert get_model(name).total_params == exact_total


def test_every_production_model_has_published_counts() -> None:
    production = [m.name for m in list_models() if not m.name.startswith("tiny")]
    assert sorted(production) == sorted(PUBLISHED)


def test_llama3_8b_breakdown() -> None:
    # per layer: attention 4096*(32+2*8)*128 + 32*128*4096 + 4096 norm = 41,947,136;
    # MLP 3*4096*14336 + 4096 = 176,164,864; embedding = output = 128256*4096 (+4096 final norm)
    m = get_model("llama3-8b")
    assert m.attention_params == 41_947_136
    assert m.dense_mlp_params == 176_164_864
    assert m.embedding_params == 128256 * 4096
    assert m.total_params == 32 * (41_947_136 + 176_164_864) + 2 * 128256 * 4096 + 4096


def test_deepseek_v3_excludes_mtp_and_counts_dense_layers() -> None:
    # 3 dense layers + 58 MoE layers of 256 routed experts of 3*7168*2048 = 44,040,192 each
    m = get_model("deepseek-v3")
    assert m.num_moe_layers == 58
    assert m.routed_expert_params == 58 * 256 * 3 * 7168 * 2048
    assert m.active_params == m.dense_params + 58 * 8 * 3 * 7168 * 2048


def test_gpt3_tied_embeddings_count_once() -> None:
    m = get_model("gpt3-175b")
    untied = dataclasses.replace(m, tied_embeddings=False)
    assert untied.total_params - m.total_params == 50257 * 12288


def test_qwen3_head_dim_differs_from_hidden_over_heads() -> None:
    m = get_model("qwen3-30b-a3b")
    assert (m.head_dim, m.hidden_size // m.num_attention_heads) == (128, 64)


# --- tiny models: divisibility for real CPU runs --------------------------------------------
@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-moe", "tiny-mla"])
@pytest.mark.parametrize("size", [1, 2, 4, 8])
def test_tiny_models_divide_by_parallel_sizes(name: str, size: int) -> None:
    m = get_model(name)
    assert m.num_attention_heads % size == 0
    assert m.query_groups % size == 0 or m.mla is not None
    assert m.num_layers % size == 0  # PP, or PP*VPP up to 8
    assert m.ffn_hidden_size % size == 0
    assert m.vocab_size % (128 * size) == 0  # no vocabulary padding up to TP=8
    if m.moe is not None:
        assert m.moe.num_experts % size == 0 and m.moe.expert_ffn_hidden_size % size == 0


def test_tiny_models_are_small() -> None:
    assert all(get_model(n).total_params < 10_000_000 for n in ("tiny-gpt", "tiny-moe", "tiny-mla"))


# --- names ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("alias", "name"),
    [("mixtral", "mixtral-8x7b"), ("MIXTRAL", "mixtral-8x7b"), ("Llama3-8B", "llama3-8b"),
     ("llama-3.1-405b", "llama3.1-405b"), (" deepseek-v3 ", "deepseek-v3"), ("gpt3", "gpt3-175b")],
)
def test_aliases_are_case_insensitive(alias: str, name: str) -> None:
    assert get_model(alias).name == name


def test_unknown_name_lists_known_names() -> None:
    with pytest.raises(ValueError, match=r"Unknown model 'llama9'.*llama3-8b.*mixtral-8x7b.*tiny-gpt"):
        get_model("llama9")


def test_names_and_aliases_are_unique() -> None:
    keys = [k.lower() for m in list_models() for k in (m.name, *m.aliases)]
    assert len(keys) == len(set(keys))
    assert model_names()[0] == "llama3-8b"


# --- Hugging Face config.json ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("fixture", "catalog_name"),
    [("llama3-8b", "llama3-8b"), ("mistral-7b", "mistral-7b"), ("mixtral-8x7b", "mixtral-8x7b"),
     ("qwen2-7b", "qwen2-7b"), ("qwen3-8b", "qwen3-8b"), ("qwen3-30b-a3b", "qwen3-30b-a3b"),
     ("deepseek-v3", "deepseek-v3")],
)
def test_hf_config_equals_catalog_entry(fixture: str, catalog_name: str) -> None:
    loaded = model_from_hf_config(HF_DATA / f"{fixture}.json")
    assert dataclasses.replace(loaded, name=catalog_name) == get_model(catalog_name)


def test_hf_config_architectures_covered_by_fixtures() -> None:
    found = {json.loads(p.read_text())["architectures"][0] for p in HF_DATA.glob("*.json")}
    assert set(SUPPORTED_ARCHITECTURES) <= found


def test_get_model_routes_json_paths_and_directories(tmp_path: Path) -> None:
    (tmp_path / "Meta-Llama-3-8B").mkdir()
    (tmp_path / "Meta-Llama-3-8B" / "config.json").write_text((HF_DATA / "llama3-8b.json").read_text())
    by_file = get_model(str(tmp_path / "Meta-Llama-3-8B" / "config.json"))
    by_dir = get_model(str(tmp_path / "Meta-Llama-3-8B"))
    assert by_file.name == by_dir.name == "Meta-Llama-3-8B"
    assert by_file.total_params == get_model("llama3-8b").total_params


def test_hf_rope_context_is_not_a_learned_position_table() -> None:
    # Llama's max_position_embeddings=8192 is the RoPE context, not 8192*4096 extra parameters.
    assert model_from_hf_config(HF_DATA / "llama3-8b.json").max_position_embeddings == 0


def test_hf_unsupported_architecture_names_supported_ones() -> None:
    with pytest.raises(ValueError, match=r"unsupported architecture GPT2LMHeadModel; supported: LlamaForCausalLM.*"):
        model_from_hf_config(HF_DATA / "gpt2.json")


def _write_config(tmp_path: Path, fixture: str, **changes: object) -> Path:
    data = json.loads((HF_DATA / f"{fixture}.json").read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


def test_hf_missing_key_names_file_and_key(tmp_path: Path) -> None:
    path = _write_config(tmp_path, "mixtral-8x7b", num_local_experts=None)
    with pytest.raises(ValueError, match=r"config\.json: missing key 'num_local_experts'"):
        model_from_hf_config(path)


def test_hf_invalid_json_names_file(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"architectures": ["LlamaForCausalLM"],')
    with pytest.raises(ValueError, match=r"config\.json is not valid JSON"):
        model_from_hf_config(path)


def test_hf_unreadable_file_names_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"Cannot read Hugging Face config .*nope\.json"):
        get_model(str(tmp_path / "nope.json"))


def test_hf_setting_the_spec_cannot_express_is_refused(tmp_path: Path) -> None:
    path = _write_config(tmp_path, "qwen3-30b-a3b", mlp_only_layers=[0, 1])
    with pytest.raises(ValueError, match=r"mlp_only_layers=\[0, 1\] is not supported"):
        model_from_hf_config(path)


def test_hf_model_type_stands_in_for_missing_architectures(tmp_path: Path) -> None:
    path = _write_config(tmp_path, "qwen2-7b", architectures=None)
    assert model_from_hf_config(path).add_qkv_bias


# --- ModelSpec checks ------------------------------------------------------------------------
def test_heads_must_be_multiple_of_query_groups() -> None:
    # 32 heads cannot be split into 6 groups: 32 % 6 = 2
    with pytest.raises(ValueError, match=r"num_attention_heads \(32\) must be a multiple of num_query_groups \(6\)"):
        ModelSpec(name="bad", num_layers=2, hidden_size=256, ffn_hidden_size=512, num_attention_heads=32,
                  num_query_groups=6, vocab_size=1024)


# --- the counts are megatron-core's: build shrunk copies and count `numel` ----------------------
def _shrunk(model: ModelSpec) -> ModelSpec:
    """The same structure (gating, biases, norms, GQA, head_dim override, MoE, shared/dense layers, MLA, tying,
    learned positions) at a width and depth that megatron-core builds on a CPU in well under a second."""
    if model.name.startswith("tiny"):
        return model
    moe = model.moe and dataclasses.replace(
        model.moe, num_experts=8, topk=2, expert_ffn_hidden_size=64,
        shared_expert_ffn_hidden_size=64 if model.moe.shared_expert_ffn_hidden_size else 0,
        first_dense_layers=min(model.moe.first_dense_layers, 1),
    )
    mla = model.mla and dataclasses.replace(
        model.mla, q_lora_rank=32, kv_lora_rank=16, qk_head_dim=16, qk_pos_emb_head_dim=8, v_head_dim=16
    )
    heads = 8 if model.num_attention_heads % 8 == 0 else 4
    return dataclasses.replace(
        model, num_layers=3, hidden_size=256, ffn_hidden_size=512, num_attention_heads=heads,
        num_query_groups=None if model.num_query_groups is None else min(model.query_groups, 4),
        kv_channels=64 if model.kv_channels else None, vocab_size=512, moe=moe, mla=mla,
        max_position_embeddings=128 if model.max_position_embeddings else 0,
    )


def _megatron_param_counts(models: list[ModelSpec]) -> list[int]:
    """Build each model with megatron-core (local specs, CPU, one gloo rank); run in a fresh process."""
    import os

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from trainers.cpu_patches import apply_cpu_patches, cpu_device_mode

    apply_cpu_patches()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    import megatron.core.transformer.multi_latent_attention as mla_module
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    parallel_state.initialize_model_parallel(create_gloo_process_groups=False)
    mla_module.HAVE_TE = False  # no TE here; its placeholder TELinear is not a type

    class NoParamCoreAttention(torch.nn.Module):  # local DotProductAttention takes no k_channels (MLA); no weights
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__()

    counts = []
    with cpu_device_mode():
        for m in models:
            common = dict(
                num_layers=m.num_layers, hidden_size=m.hidden_size, ffn_hidden_size=m.ffn_hidden_size,
                num_attention_heads=m.num_attention_heads, gated_linear_unit=m.gated_linear_unit,
                activation_func=F.silu if m.gated_linear_unit else F.gelu, normalization=m.normalization,
                add_bias_linear=m.add_bias_linear, add_qkv_bias=m.add_qkv_bias, qk_layernorm=m.qk_layernorm,
                use_cpu_initialization=True, perform_initialization=False, gradient_accumulation_fusion=False,
                bias_activation_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
                bias_dropout_fusion=False, apply_rope_fusion=False,
            )
            if m.moe is not None:
                common.update(
                    num_moe_experts=m.moe.num_experts, moe_router_topk=m.moe.topk,
                    moe_ffn_hidden_size=m.moe.expert_ffn_hidden_size, moe_grouped_gemm=False,
                    moe_shared_expert_intermediate_size=m.moe.shared_expert_ffn_hidden_size or None,
                    moe_layer_freq=[0] * m.moe.first_dense_layers + [1] * m.num_moe_layers,
                )
            if m.mla is not None:
                config = MLATransformerConfig(
                    **common, q_lora_rank=m.mla.q_lora_rank, kv_lora_rank=m.mla.kv_lora_rank,
                    qk_head_dim=m.mla.qk_head_dim, qk_pos_emb_head_dim=m.mla.qk_pos_emb_head_dim,
                    v_head_dim=m.mla.v_head_dim, rope_type="rope",
                )
            else:
                config = TransformerConfig(**common, num_query_groups=m.query_groups, kv_channels=m.head_dim)
            # the block spec honours moe_layer_freq (dense first layers); a single layer spec would not
            block = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization=m.normalization)
            if m.mla is not None:
                for layer_spec in block.layer_specs:
                    layer_spec.submodules.self_attention.submodules.core_attention = NoParamCoreAttention
            gpt = GPTModel(
                config=config, transformer_layer_spec=block, vocab_size=m.vocab_size,
                max_sequence_length=max(m.max_position_embeddings, 128),
                share_embeddings_and_output_weights=m.tied_embeddings,
                position_embedding_type="learned_absolute" if m.max_position_embeddings else "rope",
            )
            counts.append(sum(p.numel() for p in gpt.parameters()))
    dist.destroy_process_group()
    return counts


@pytest.mark.slow
def test_counts_equal_megatron_core_numel() -> None:
    import concurrent.futures
    import multiprocessing

    names = ["tiny-gpt", "tiny-moe", "tiny-mla", "llama3-8b", "mixtral-8x7b", "qwen2-7b", "qwen3-8b",
             "qwen3-30b-a3b", "deepseek-v3", "gpt3-175b"]
    models = [_shrunk(get_model(n)) for n in names]
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        built = pool.submit(_megatron_param_counts, models).result(timeout=300)
    assert dict(zip(names, built)) == {n: m.total_params for n, m in zip(names, models)}
