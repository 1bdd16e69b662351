"""Model catalog, parameter counts against published figures, and Hugging Face config.json loading."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import pytest

from search_spaces.catalog import PUBLISHED, get_model, list_models, model_names
from search_spaces.hf_config import SUPPORTED_ARCHITECTURES, UnreadKeysWarning, model_from_hf_config
from search_spaces.model import ModelSpec

HF_DATA = Path(__file__).parent / "data" / "hf"


# --- counts vs published figures ------------------------------------------------------------
def _without_mtp(model: ModelSpec) -> ModelSpec:
    """Published totals leave the multi-token-prediction layers out (DeepSeek-V3: 671B without its 14B MTP module)."""
    return dataclasses.replace(model, mtp_num_layers=0)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_total_params_match_published(name: str) -> None:
    published = PUBLISHED[name]
    if published.total_params is None:
        pytest.skip(f"{name}: no published total to hold the count to ({published.source})")
    model = _without_mtp(get_model(name))
    assert abs(model.total_params - published.total_params) <= published.tolerance(published.total_params)


@pytest.mark.parametrize("name", sorted(n for n, p in PUBLISHED.items() if p.active_params is not None))
def test_active_params_match_published(name: str) -> None:
    # DeepSeek-V3: 37.55B counted, "37B" published (truncated); within its last digit (1e9).
    published = PUBLISHED[name]
    model = _without_mtp(get_model(name))
    assert published.active_params is not None
    assert abs(model.active_params - published.active_params) <= published.tolerance(published.active_params)


def test_gpt_oss_120b_active_params_are_the_model_cards_plus_the_input_embedding() -> None:
    # the model card's 5.13B active per token (Table 1) counts no input embedding (201088 x 2880 = 0.58B)
    model = get_model("gpt-oss-120b")
    assert abs(model.active_params - model.vocab_size * model.hidden_size - 5.13e9) <= 0.01e9


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


def test_deepseek_v3_counts_dense_layers_and_its_mtp_layer() -> None:
    # 3 dense layers + 58 MoE layers + 1 MTP layer (a MoE layer) of 256 routed experts of 3*7168*2048 = 44,040,192
    m = get_model("deepseek-v3")
    assert m.num_moe_layers == 58 and m.mtp_num_layers == 1
    assert m.routed_expert_params == (58 + 1) * 256 * 3 * 7168 * 2048
    assert m.active_params == m.dense_params + (58 + 1) * 8 * 3 * 7168 * 2048
    # the MTP layer: enorm + hnorm + final_layernorm (3 x 7168), eh_proj 2 x 7168 x 7168, one MoE decoder layer
    layer = m.attention_params + m.moe_non_expert_params + 256 * m.expert_params
    assert m.mtp_params == 3 * 7168 + 2 * 7168 * 7168 + layer
    assert round(m.mtp_params / 1e9, 2) == 11.61  # the report's 14B adds its own embedding and head (2 x 0.93B)


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


# published configs of each family (sources in tests/data/hf/README.md) and what they say
HF_FAMILIES = [
    ("phi3-mini-4k-instruct", dict(num_layers=32, query_groups=32, sliding_window=2047, window_attn_skip_freq=None,
                                   total_params=3_821_079_552)),  # 3.82B
    ("qwen2.5-3b-instruct", dict(add_qkv_bias=True, tied_embeddings=True, query_groups=2, total_params=3_085_938_688)),
    ("qwen1.5-moe-a2.7b", dict(moe=dict(num_experts=60, topk=4, shared_expert_ffn_hidden_size=5632,
                                        shared_expert_gate=True, pre_softmax=True))),
    ("olmoe-1b-7b-0125", dict(qk_layernorm=True, qk_layernorm_per_head=False, total_params=6_919_161_856,
                              moe=dict(num_experts=64, topk=8, pre_softmax=True))),
    ("deepseek-v2-lite", dict(mla=dict(q_lora_rank=None, kv_lora_rank=512),
                              moe=dict(num_groups=None, score_function="softmax", pre_softmax=True))),
    ("deepseek-v2.5", dict(moe=dict(num_experts=160, num_groups=8, group_topk=3, topk_scaling_factor=16.0,
                                    score_function="softmax", expert_bias=False))),
    ("deepseek-v3", dict(mtp_num_layers=1, moe=dict(num_groups=8, group_topk=4, score_function="sigmoid",
                                                    expert_bias=True, topk_scaling_factor=2.5))),
    ("gemma-2-2b-it", dict(post_norms=True, tied_embeddings=True, activation="gelu", head_dim=256, sliding_window=4096,
                           window_attn_skip_freq=2, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                           total_params=2_614_341_888)),
    ("gemma-3-1b-it", dict(post_norms=True, qk_layernorm=True, sliding_window=512, window_attn_skip_freq=6,
                           final_logit_softcapping=None, total_params=999_885_952)),
    ("gpt-oss-20b", dict(add_bias_linear=True, softmax_type="learnable", head_dim=64, sliding_window=128,
                         window_attn_skip_freq=2, moe=dict(num_experts=32, topk=4))),
]


@pytest.mark.parametrize(("fixture", "facts"), HF_FAMILIES, ids=[f[0] for f in HF_FAMILIES])
def test_hf_family_loads_with_its_features(fixture: str, facts: dict) -> None:
    # the totals are the published safetensors sums, which these specs reproduce exactly (and megatron-core builds:
    # test_hf_counts_equal_megatron_core_numel)
    model = model_from_hf_config(HF_DATA / f"{fixture}.json")
    for key, value in facts.items():
        if isinstance(value, dict):
            for sub, expected in value.items():
                assert getattr(getattr(model, key), sub) == expected, (key, sub)
        else:
            assert getattr(model, key) == value, key


@pytest.mark.parametrize(("fixture", "architecture"), [("deepseek-v2.5", "DeepseekV3ForCausalLM"),
                                                       ("deepseek-v3", "DeepseekV2ForCausalLM")])
def test_deepseek_routing_follows_the_keys_not_the_label(tmp_path: Path, fixture: str, architecture: str) -> None:
    # a DeepSeek-V2 config relabelled as V3 keeps its group-limited softmax routing (and V3 relabelled as V2 its
    # noaux_tc sigmoid routing and MTP layer): no routing key is dropped for the name
    original = model_from_hf_config(HF_DATA / f"{fixture}.json")
    relabelled = model_from_hf_config(_write_config(tmp_path, fixture, architectures=[architecture]))
    assert relabelled == dataclasses.replace(original, name=relabelled.name)


@pytest.mark.parametrize(("fixture", "changes", "match"), [
    ("llama3-8b", {"num_hidden_layers": "32"}, r"num_hidden_layers must be an integer, but got '32' \(a string\)"),
    ("llama3-8b", {"vocab_size": 32000.5}, r"vocab_size must be an integer, but got 32000.5 \(float\)"),
    ("llama3-8b", {"hidden_size": -4096}, r"`hidden_size >= 1` must hold, but got \(hidden_size=-4096\)"),
    ("llama3-8b", {"num_attention_heads": True}, r"num_attention_heads must be an integer, but got True"),
    ("llama3-8b", {"tie_word_embeddings": "yes"}, r"tie_word_embeddings must be true or false"),
    ("llama3-8b", {"intermediate_size": None}, r"missing key 'intermediate_size'"),
    ("llama3-8b", {"attention_bias": True}, r"attention_bias=True is not supported"),
    ("llama3-8b", {"hidden_act": "relu"}, r"hidden_act='relu' is not supported"),
    ("mistral-7b", {"sliding_window": 0}, r"`sliding_window >= 1` must hold"),
    ("qwen2-7b", {"use_sliding_window": True}, r"use_sliding_window=true is not supported"),
    ("olmoe-1b-7b-0125", {"num_key_value_heads": 8}, r"num_key_value_heads=8 is not supported for OLMoE"),
    ("olmoe-1b-7b-0125", {"clip_qkv": 8.0}, r"clip_qkv=8.0 is not supported"),
    ("deepseek-v3", {"scoring_func": "softmax"}, r"topk_method='noaux_tc' .* needs scoring_func='sigmoid'"),
    ("deepseek-v3", {"topk_method": "greedy"}, r"topk_method='greedy' routes without groups"),
    ("deepseek-v3", {"topk_method": "sparsemixer"}, r"topk_method='sparsemixer' is not supported"),
    ("deepseek-v3", {"n_group": 7}, r"num_moe_experts \(256\) should be divisible by moe_router_num_groups \(7\)"),
    ("deepseek-v3", {"num_nextn_predict_layers": -1}, r"`num_nextn_predict_layers >= 0` must hold"),
    ("gemma-3-1b-it", {"layer_types": ["full_attention"] * 26 + ["sliding_attention"]}, r"layer_types must list"),
    ("gemma-3-1b-it", {"layer_types": ["sliding_attention", "full_attention"] * 10 + ["sliding_attention"] * 6},
     r"is not 'every 2-th layer full attention'"),
    ("gpt-oss-20b", {"experts_per_token": 2}, r"experts_per_token=2 disagrees with num_experts_per_tok=4"),
    ("gemma-3-1b-it", {"architectures": ["Gemma3ForConditionalGeneration"]},
     r"Gemma3ForConditionalGeneration is not supported: its SigLIP vision tower"),
])
def test_hf_bad_values_name_the_file_and_key(tmp_path: Path, fixture: str, changes: dict, match: str) -> None:
    path = _write_config(tmp_path, fixture, **changes)
    with pytest.raises(ValueError, match=rf"config\.json: .*{match}"):
        model_from_hf_config(path)


def test_hf_unknown_keys_are_named_not_dropped(tmp_path: Path) -> None:
    path = _write_config(tmp_path, "llama3-8b", lora_rank_experimental=16)
    with pytest.warns(UnreadKeysWarning, match=r"does not read lora_rank_experimental"):
        model_from_hf_config(path)


@pytest.mark.parametrize("fixture", sorted(p.stem for p in HF_DATA.glob("*.json") if p.stem != "gpt2"))
def test_hf_published_configs_have_no_unread_keys(fixture: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreadKeysWarning)
        model_from_hf_config(HF_DATA / f"{fixture}.json")


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
            data.pop(key, None)
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


# --- the counts are megatron-core's: build every model (meta device, nothing allocated) and count `numel` -------
def _fewer_experts(model: ModelSpec, experts: int = 16) -> ModelSpec:
    """The same model with 16 routed experts (groups kept dividing them): a 256-expert model takes seconds."""
    if model.moe is None or model.moe.num_experts <= experts:
        return model
    groups = model.moe.num_groups and min(model.moe.num_groups, 8)
    group_topk = model.moe.group_topk  # set exactly when num_groups is (MoESpec checks)
    moe = dataclasses.replace(model.moe, num_experts=experts, topk=min(model.moe.topk, experts), num_groups=groups,
                              group_topk=groups and group_topk and min(group_topk, groups))
    return dataclasses.replace(model, moe=moe)


def megatron_only_params_per_layer(model: ModelSpec, version: str) -> int:
    """Parameters megatron-core builds in each attention layer (MTP layers included) that the checkpoint and
    autotune's count do not have: 0.19 fuses a q norm into MLA's `linear_q_proj` when `q_lora_rank` is None and
    `qk_layernorm` is set (Transformer Engine's `TELayerNormColumnParallelLinear`, one norm over hidden_size, whole
    on every TP rank; transformer/mla_qk_norm_config.py:147-150; `megatron_build.MEGATRON_ONLY_PARAMS`)."""
    mla = model.mla
    if version < "0.17" or mla is None or mla.q_lora_rank is not None or not model.qk_layernorm:
        return 0
    return model.hidden_size * (2 if model.normalization == "LayerNorm" else 1)


def megatron_only_params(model: ModelSpec, version: str) -> int:
    return (model.num_layers + model.mtp_num_layers) * megatron_only_params_per_layer(model, version)


@pytest.mark.slow
def test_counts_equal_megatron_core_numel() -> None:
    """Build each model with the installed megatron-core on one rank (`megatron_build.param_counts`: Megatron-LM's
    builder with Bridge's modules where megatron-core has none, in a child process) and count the parameters."""
    from search_spaces.megatron_version import rules_version

    import megatron_runner

    catalog = [_fewer_experts(m) for m in list_models()]
    hf = [_fewer_experts(model_from_hf_config(p)) for p in sorted(HF_DATA.glob("*.json")) if p.stem != "gpt2"]
    # GPT models only: megatron_build builds GPTModel; the hybrid Mamba models' stages are built as HybridModel and
    # counted in tests/test_hybrid.py (`test_megatron_builds_every_hybrid_stage`)
    models = [m for m in catalog + hf if not m.is_hybrid]
    version = rules_version()
    built = megatron_runner.run("param_counts", models, version=version, timeout=600)
    names = [m.name for m in models]
    assert dict(zip(names, [ours for ours, _ in built], strict=True)) == {m.name: m.total_params for m in models}
    assert dict(zip(names, [extra for _, extra in built], strict=True)) == {
        m.name: megatron_only_params(m, version) for m in models}
    if version >= "0.17":  # DeepSeek-V2-Lite has the fused q norm, so the second comparison is not vacuous
        assert any(extra for _, extra in built)
