"""The megatron-core 0.19.2 launch lines, loaded by the real code of what they are written for.

- Megatron-Bridge 0.6.2 (installed from the package index by `scripts/bootstrap --test`): each line's overrides go
  through Bridge's own `process_config_with_overrides` onto a real `ConfigContainer` (NVIDIA's recipe for the job
  where its model's Hugging Face config is here, else Bridge's `_pretrain_common()` template with the model's
  provider), then `runtime_config_update`, and every megatron-core setting the prediction assumes must hold its
  value in the finished config. tests/bridge_harness.py runs Bridge in its own interpreter and says what stands in
  for Transformer Engine and the GPU on this CPU machine.
- Megatron-LM: the `megatron/training/arguments.py` that the megatron-core 0.19.2 wheel ships, its own parser and
  `validate_args` (as rank 0 of the job's world, on the job's GPU), after the model's architecture arguments.
Lines of the --megatron-core 0.16.1 target (Bridge v0.3.1, Megatron-LM core_v0.16.1): tests/test_launch_parsers.py.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.outputs.launch import (
    bridge_overrides,
    launch_header,
    megatron_lm_args,
    megatron_lm_environment,
    megatron_lm_settings,
)
from search_spaces.bridge_recipes import bridge_recipe, model_prefix, recipe_names
from search_spaces.catalog import get_model
from search_spaces.gpus import build_cluster
from search_spaces.hf_config import model_from_hf_config
from search_spaces.job import Job
from search_spaces.layout import Layout, parse_layout
from search_spaces.megatron_names import NAMES, architecture_settings, job_settings
from search_spaces.model import ModelSpec
from search_spaces.training import TrainingSpec

from bridge_harness import HF_CONFIGS, Case, Outcome, load
from test_launch_parsers import expected_megatron_lm

HERE = Path(__file__).parent
# models whose Bridge recipes build their provider from a Hugging Face config this folder has
RECIPE_HF = {"llama3-8b": "meta-llama/Meta-Llama-3-8B", "deepseek-v3": "deepseek-ai/DeepSeek-V3",
             "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B", "gpt-oss-20b": "openai/gpt-oss-20b"}
# models Bridge 0.6.2 converts from their Hugging Face config (AutoBridge); Mixtral it does not
PROVIDER_HF = {"qwen3-8b": "Qwen/Qwen3-8B", "qwen2-7b": "Qwen/Qwen2-7B"}


def _job(model: str | ModelSpec, nodes: int, *, gpu: str = "h100", seq: int = 4096, gbs: int = 256,
         **training: object) -> Job:
    spec = get_model(model) if isinstance(model, str) else model
    return Job(model=spec, cluster=build_cluster(nodes=nodes, gpu=gpu),
               training=TrainingSpec(seq_length=seq, global_batch_size=gbs, **training))  # type: ignore[arg-type]


def architecture_args(model: ModelSpec) -> list[str]:
    """The Megatron-LM arguments of the model's architecture (what a user puts before autotune's line), plus a
    tokenizer, mock data and a schedule so that validate_args has a whole run to check."""
    m, a = model, architecture_settings(model)
    args = ["--num-layers", str(m.num_layers), "--hidden-size", str(m.hidden_size),
            "--ffn-hidden-size", str(m.ffn_hidden_size), "--num-attention-heads", str(m.num_attention_heads),
            "--max-position-embeddings", str(max(m.max_position_embeddings, 131072)),
            "--position-embedding-type", "learned_absolute" if m.max_position_embeddings else "rope",
            "--normalization", m.normalization, "--tokenizer-type", "NullTokenizer", "--vocab-size",
            str(m.vocab_size), "--train-iters", "10", "--lr", "1e-4", "--mock-data"]
    if "kv_channels" in a:
        args += ["--kv-channels", str(a["kv_channels"])]
    if m.query_groups != m.num_attention_heads and m.mla is None:
        args += ["--group-query-attention", "--num-query-groups", str(m.query_groups)]
    args += ["--swiglu"] if m.gated_linear_unit else []
    args += [] if m.add_bias_linear else ["--disable-bias-linear"]
    args += ["--add-qkv-bias"] if m.add_qkv_bias else []
    args += ["--qk-layernorm"] if m.qk_layernorm else []
    args += [] if m.tied_embeddings else ["--untie-embeddings-and-output-weights"]
    if m.moe is not None:
        args += ["--num-experts", str(m.moe.num_experts), "--moe-router-topk", str(m.moe.topk),
                 "--moe-ffn-hidden-size", str(m.moe.expert_ffn_hidden_size)]
        if m.moe.shared_expert_ffn_hidden_size:
            args += ["--moe-shared-expert-intermediate-size", str(m.moe.shared_expert_ffn_hidden_size)]
        if m.moe.first_dense_layers:
            args += ["--moe-layer-freq", f"([0]*{m.moe.first_dense_layers}+[1]*{m.num_moe_layers})"]
    if m.mla is not None:
        args += ["--multi-latent-attention", "--kv-lora-rank", str(m.mla.kv_lora_rank), "--qk-head-dim",
                 str(m.mla.qk_head_dim), "--qk-pos-emb-head-dim", str(m.mla.qk_pos_emb_head_dim), "--v-head-dim",
                 str(m.mla.v_head_dim)]
        args += ["--q-lora-rank", str(m.mla.q_lora_rank)] if m.mla.q_lora_rank else []
    if m.mtp_num_layers:
        args += ["--mtp-num-layers", str(m.mtp_num_layers)]
    return args


def case_of(job: Job, layout: Layout) -> Case:
    """The Bridge config the line starts from (module docstring) and both lines."""
    gpu = job.cluster.gpu
    base: dict[str, object] = {}
    recipe = bridge_recipe(job)
    if recipe is not None and job.model.name in RECIPE_HF:
        module = recipe.file.removeprefix("src/").removesuffix(".py").replace("/", ".")
        base["recipe"] = f"{module}:{recipe.function}"
    elif job.model.name in PROVIDER_HF:
        base["hf_model"] = PROVIDER_HF[job.model.name]
    else:
        m = job.model
        base["provider"] = {**architecture_settings(m), "vocab_size": m.vocab_size, "seq_length": 4096,
                            "share_embeddings_and_output_weights": m.tied_embeddings,
                            "position_embedding_type": "learned_absolute" if m.max_position_embeddings else "rope"}
    return Case(overrides=tuple(bridge_overrides(job, layout)), world_size=job.world_size,
                gpu=(gpu.torch_device_name, gpu.capability, gpu.memory_bytes),
                megatron_lm=tuple(architecture_args(job.model) + megatron_lm_args(job, layout)),
                megatron_lm_env=tuple(megatron_lm_environment(job, layout).items()), **base)  # type: ignore[arg-type]


# --- what each line must carry ----------------------------------------------------------------------------------------
def bridge_mismatches(job: Job, layout: Layout, outcome: Outcome) -> list[str]:
    """Every setting the prediction assumes whose value in Bridge's finished config differs."""
    if outcome.error:
        return [f"Bridge refused the line: {outcome.error}"]
    got, out = outcome.values, []
    for name, want in job_settings(job, layout).items():
        if name == "fp8_recipe" and job.fp8_recipe is None:
            continue  # inert without FP8 (the recipe's own default stays)
        value = got[name]
        if name in ("recompute_modules", "cuda_graph_modules") and want is None:
            continue  # set only where they act (selective recompute, scoped TE graphs)
        if value != want:
            out.append(f"{name}: {value!r} in Bridge, the prediction assumes {want!r}")
    seq = job.training.seq_length
    if (got["dataset.seq_length"], got["dataset.sequence_length"]) != (seq, seq):
        out.append(f"dataset sequence length {got['dataset.seq_length']}/{got['dataset.sequence_length']} != {seq}")
    if got["optimizer.use_distributed_optimizer"] is not job.training.adam_dist_opt(layout.dist_opt):
        out.append("optimizer.use_distributed_optimizer differs from ddp's")
    if got["data_parallel_size"] != layout.dp:
        out.append(f"Bridge's data_parallel_size {got['data_parallel_size']} != {layout.dp}")
    return out


def megatron_lm_mismatches(job: Job, layout: Layout, outcome: Outcome) -> list[str]:
    if outcome.lm_error:
        return [f"Megatron-LM refused the line: {outcome.lm_error}"]
    got, out = outcome.lm_values, []
    want = expected_megatron_lm(job, layout)
    want["data_parallel_size"] = layout.dp
    settings = megatron_lm_settings(job, layout)
    want["cross_entropy_loss_fusion"] = settings["cross_entropy_loss_fusion"]
    want["cross_entropy_fusion_impl"] = settings["cross_entropy_fusion_impl"]
    if job.model.moe is None:
        want.pop("expert_model_parallel_size", None)
    for dest, value in want.items():
        if dest == "fp8_recipe" and job.fp8_recipe is None:
            continue
        if dest == "num_virtual_stages_per_pipeline_rank":
            continue  # validate_args turns it into virtual_pipeline_model_parallel_size
        if got.get(dest, "<absent>") != value:
            out.append(f"--{dest}: {got.get(dest, '<absent>')!r} after validate_args, the prediction assumes {value!r}")
    vpp = got.get("virtual_pipeline_model_parallel_size")
    if vpp != layout.vpp and getattr(layout, "pipeline_layout", None) is None:
        out.append(f"virtual_pipeline_model_parallel_size {got.get('virtual_pipeline_model_parallel_size')} != "
                   f"{layout.vpp}")
    return out


# --- the cases --------------------------------------------------------------------------------------------------------
CASES: dict[str, tuple[Job, str]] = {
    "mixtral-vpp-selective": (_job("mixtral", 4),
                              "tp=2,pp=2,vpp=2,ep=8,etp=1,dp=8,sp=true,dist_opt=true,recompute=selective"),
    "mixtral-fp8-blackwell": (_job("mixtral", 4, gpu="b200", precision="fp8"), "tp=1,pp=2,ep=8,dp=16,dist_opt=true"),
    "mixtral-ep-overlap-flex": (_job("mixtral", 4, moe_token_dispatcher="flex"),
                                "tp=1,pp=4,vpp=2,ep=8,dp=8,dist_opt=true,ep_overlap=true"),
    "deepseek-uneven-full": (_job("deepseek-v3", 32, gbs=4096, optimizer_moments="bf16", recompute_num_layers=2),
                             "tp=2,pp=16,ep=64,etp=1,first_stage_layers=3,last_stage_layers=2,dp=8,sp=true,"
                             "dist_opt=true,recompute=full"),
    "deepseek-b200-mxfp8-string": (_job("deepseek-v3", 32, gpu="b200", gbs=4096, precision="fp8"),
                                   "tp=1,pp=8,ep=8,etp=1,dp=32,dist_opt=true,recompute=selective,"
                                   "pipeline_layout=Et*4|(t*4|)*14tmL"),
    "llama405b-embedding-split-fp8": (_job("llama3.1-405b", 32, seq=8192, gbs=1536, precision="fp8",
                                           fp8_recipe="delayed"),
                                      "tp=8,pp=8,vpp=2,cp=2,embedding_loss_split=true,dp=2,sp=true,dist_opt=true"),
    "llama8b-recipe-h100": (_job("llama3-8b", 1), "tp=2,dp=4,sp=true,dist_opt=true"),
    "llama8b-recipe-b200-mxfp8-graphs": (_job("llama3-8b", 1, gpu="b200", precision="fp8", overlap_grad_reduce=False,
                                              grad_reduce_in_fp32=True),
                                         "tp=1,dp=8,mbs=2,cuda_graphs=transformer_engine"),
    "llama8b-recipe-b200-full-iteration": (_job("llama3-8b", 1, gpu="b200"),
                                           "tp=1,dp=8,mbs=2,recompute=full,cuda_graphs=full_iteration"),
    "qwen3-moe-recipe-gb200": (_job("qwen3-30b-a3b", 2, gpu="gb200", precision="fp8"),
                               "tp=1,pp=2,vpp=2,ep=4,dp=4,dist_opt=true,ep_overlap=true,cuda_graphs=transformer_engine"),
    "qwen3-moe-full-iteration-gb200": (_job("qwen3-30b-a3b", 2, gpu="gb200", precision="fp8",
                                            moe_router_force_load_balancing=True),
                                       "tp=1,ep=8,dp=8,mbs=4,dist_opt=true,ep_overlap=true,cuda_graphs=full_iteration"),
    "qwen3-dense-provider": (_job("qwen3-8b", 1, cuda_graph_modules=("attn",)),
                             "tp=2,pp=2,dp=2,sp=true,dist_opt=true,recompute=selective,cuda_graphs=transformer_engine"),
    "gpt-oss-recipe-h100": (_job(model_from_hf_config(HERE / "data" / "hf" / "gpt-oss-20b.json"), 2),
                            "tp=1,ep=8,etp=1,dp=16,dist_opt=true"),
}


def _layout(job: Job, text: str) -> Layout:
    return parse_layout(text, world_size=job.world_size)


def _special_cases() -> dict[str, Case]:
    """Lines the tests below change on purpose, loaded in the same Bridge process as CASES."""
    job, text = CASES["llama8b-recipe-h100"]
    case = case_of(job, _layout(job, text))
    # Bridge v0.3.1's sequence key on a 0.6 recipe
    old = tuple(o.replace("dataset.seq_length=", "dataset.sequence_length=") for o in case.overrides)
    hopper = _job("llama3-8b", 1)
    return {"v031-sequence-key": dataclasses.replace(case, overrides=old, megatron_lm=()),
            "local-graphs": case_of(hopper, _layout(hopper, "tp=1,dp=8,cuda_graphs=local")),
            "no-connections-env": dataclasses.replace(case_of(hopper, _layout(hopper, "tp=2,dp=4,sp=true")),
                                                      megatron_lm_env=())}


@pytest.fixture(scope="module")
def outcomes() -> dict[str, Outcome]:
    cases = {name: case_of(job, _layout(job, text)) for name, (job, text) in CASES.items()}
    cases.update(_special_cases())
    found = load(list(cases.values()), sorted(NAMES))
    return dict(zip(cases, found, strict=True))


@pytest.mark.parametrize("name", sorted(CASES))
def test_bridge_runs_the_line_and_keeps_every_switch(name, outcomes) -> None:
    job, text = CASES[name]
    assert bridge_mismatches(job, _layout(job, text), outcomes[name]) == []


@pytest.mark.parametrize("name", sorted(CASES))
def test_megatron_lm_validates_the_line_and_keeps_every_switch(name, outcomes) -> None:
    job, text = CASES[name]
    assert megatron_lm_mismatches(job, _layout(job, text), outcomes[name]) == []


def test_the_cases_start_from_nvidia_recipes_where_they_can() -> None:
    """Four cases load NVIDIA's own recipe function (not the template), one of them an exact match."""
    bases = {name: case_of(job, _layout(job, text)) for name, (job, text) in CASES.items()}
    recipes = {name: c.recipe for name, c in bases.items() if c.recipe}
    assert len(recipes) >= 4, recipes
    assert recipes["llama8b-recipe-h100"] == ("megatron.bridge.perf_recipes.llama.h100.llama3:"
                                              "llama3_8b_pretrain_8gpu_h100_bf16_config")


# --- a line Bridge 0.6 would quietly undo -----------------------------------------------------------------------------
def test_the_v031_sequence_key_is_undone_by_bridge_06(outcomes) -> None:
    """Bridge v0.3.1's `dataset.sequence_length` on a 0.6 recipe: `GPTDatasetConfig.finalize()` copies the
    recipe's `seq_length` (8192) over it, and Bridge then refuses the model's 4096 (what the 0.3.1 line would do to a
    Bridge 0.6 user); the 0.6 key passes (test_bridge_runs_the_line_and_keeps_every_switch)."""
    job, text = CASES["llama8b-recipe-h100"]
    assert _special_cases()["v031-sequence-key"].overrides != case_of(job, _layout(job, text)).overrides
    outcome = outcomes["v031-sequence-key"]
    assert outcome.error is not None and "Sequence length in dataset config: 8192" in outcome.error


# --- the recipe the header names --------------------------------------------------------------------------------------
def test_recipe_index_is_the_installed_bridge() -> None:
    done = subprocess.run([sys.executable, str(HERE / "data" / "make_bridge_recipe_index.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(recipe_names()) > 400


@pytest.mark.parametrize(("model", "nodes", "gpu", "precision", "fp8_recipe", "function", "exact"), [
    ("llama3-70b", 8, "h100", "bf16", None, "llama3_70b_pretrain_64gpu_h100_bf16_config", True),
    ("llama3-70b", 8, "b200", "fp8", None, "llama3_70b_pretrain_64gpu_b200_fp8mx_config", True),
    ("llama3-70b", 8, "h100", "fp8", None, "llama3_70b_pretrain_64gpu_h100_fp8cs_config", True),
    ("llama3-70b", 4, "h100", "bf16", None, "llama3_70b_pretrain_32gpu_h100_bf16_config", True),  # library recipe
    ("llama3-70b", 16, "h100", "bf16", None, "llama3_70b_pretrain_64gpu_h100_bf16_config", False),  # nearest count
    ("deepseek-v3", 128, "h100", "fp8", "blockwise", "deepseek_v3_pretrain_1024gpu_h100_fp8sc_config", True),
    ("llama3.1-405b", 64, "gb200", "bf16", None, "llama31_405b_pretrain_256gpu_gb200_bf16_config", True),
])
def test_the_recipe_of_a_job(model, nodes, gpu, precision, fp8_recipe, function, exact) -> None:
    job = _job(model, nodes, gpu=gpu, precision=precision, fp8_recipe=fp8_recipe)
    found = bridge_recipe(job)
    assert found is not None and (found.function, found.exact) == (function, exact)
    assert found.file.startswith("src/megatron/bridge/") and found.file.endswith(".py")
    assert f"--recipe {function}" in launch_header(job, "megatron_bridge")


def test_a_model_without_a_recipe_says_so() -> None:
    job = _job("mixtral", 4)
    assert bridge_recipe(job) is None and model_prefix("llama3.1-405b") == "llama31_405b"
    assert "Bridge 0.6.2 has no pretraining recipe for mixtral-8x7b" in launch_header(job, "megatron_bridge")


def test_the_headers_name_the_targets() -> None:
    job = _job("llama3-8b", 1)
    assert launch_header(job, "megatron_bridge").startswith("Megatron-Bridge 0.6.2 overrides for "
                                                            "scripts/training/run_recipe.py")
    lm = launch_header(job, "megatron_lm")
    assert lm.startswith("Megatron-LM core_v0.19.2 arguments") and "native fused loss" in lm
    old = dataclasses.replace(job, training=dataclasses.replace(job.training, megatron_core="0.16.1"))
    assert launch_header(old, "megatron_bridge").startswith("Megatron-Bridge 0.3.1 overrides")
    assert launch_header(old, "megatron_lm").startswith("Megatron-LM core_v0.16.1 arguments")


def test_megatron_lm_019_gets_the_native_loss_and_016_keeps_te() -> None:
    job = _job("llama3-8b", 1)
    layout = _layout(job, "tp=2,sp=true")
    new = megatron_lm_args(job, layout)
    assert new[new.index("--cross-entropy-fusion-impl") + 1] == "native"
    old = dataclasses.replace(job, training=dataclasses.replace(job.training, megatron_core="0.16.1"))
    args = megatron_lm_args(old, layout)
    assert args[args.index("--cross-entropy-fusion-impl") + 1] == "te"
    assert "dataset.seq_length=4096" in bridge_overrides(job, layout)
    assert "dataset.sequence_length=4096" in bridge_overrides(old, layout)


def test_every_hf_fixture_the_harness_names_exists() -> None:
    assert all((HERE / "data" / "hf" / name).is_file() for name in HF_CONFIGS.values())
    assert set(RECIPE_HF.values()) | set(PROVIDER_HF.values()) <= set(HF_CONFIGS)


def test_bridge_refuses_per_layer_local_graphs_as_the_header_says(outcomes) -> None:
    """Bridge 0.6 runs `cuda_graph_impl="local"` only as full-iteration graphs; the header says so, and Bridge's
    own validation refuses the line (the Megatron-LM line is accepted). A release before Bridge 0.6 runs them."""
    job = _job("llama3-8b", 1)
    header = launch_header(job, "megatron_bridge", _layout(job, "tp=1,dp=8,cuda_graphs=local"))
    assert 'cuda_graph_impl="local" only for full-iteration CUDA graphs (Bridge 0.6.0, release 26.08)' in header
    older = dataclasses.replace(job, training=dataclasses.replace(job.training, release="26.06.01"))
    assert "only for full-iteration" not in launch_header(older, "megatron_bridge",
                                                          _layout(older, "tp=1,dp=8,cuda_graphs=local"))
    outcome = outcomes["local-graphs"]
    assert outcome.error is not None and 'cuda_graph_impl="local" only for full-iteration' in outcome.error
    assert outcome.lm_error is None


def test_megatron_lm_is_told_its_connections_on_hopper(outcomes) -> None:
    job = _job("llama3-8b", 1)
    tp2, tp1 = _layout(job, "tp=2,dp=4,sp=true"), _layout(job, "tp=1,dp=8")
    assert megatron_lm_environment(job, tp2) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert megatron_lm_environment(job, tp1) == {}
    assert "run with CUDA_DEVICE_MAX_CONNECTIONS=1" in launch_header(job, "megatron_lm", tp2)
    blackwell = _job("llama3-8b", 1, gpu="b200")
    assert megatron_lm_environment(blackwell, _layout(blackwell, "tp=2,dp=4,sp=true")) == {}
    # without the variable Megatron-LM refuses a TP layout on Hopper
    outcome = outcomes["no-connections-env"]
    assert outcome.lm_error is not None and "CUDA_DEVICE_MAX_CONNECTIONS to 1" in outcome.lm_error


# --- the lines of the documented searches -----------------------------------------------------------------------------
def _documented_search_jobs() -> dict[str, Job]:
    """The job of every search command in README.md and docs/*.md (tests/test_docs_commands.py collects them), built
    by the CLI's own parser, as the command builds it."""
    import shlex

    from autotune.ui.cli import build_parser
    from autotune.ui.commands.whatif import what_if_jobs

    from test_docs_commands import COMMANDS, _verb

    jobs: dict[str, Job] = {}
    for where, command, _ in COMMANDS:
        if _verb(command) != "search" or "--address" in command:
            continue
        argv = shlex.split(command.split(">", 1)[0])[3:]
        argv = argv if argv and argv[0] == "search" else ["search", *argv]
        # a what-if (`--nodes 4,8,16`, `--gpu h100,h200`) answers one search per cluster: each is a job
        for job in what_if_jobs(build_parser().parse_args(argv)):
            jobs.setdefault(f"{job.model.name} {job.world_size} {job.cluster.gpu.name}", job)
        del where
    return jobs


@pytest.mark.slow
def test_the_winners_of_the_documented_searches_load_into_bridge_and_megatron_lm() -> None:
    """The lines the documented commands print (the whole-space pick of the analytic search, as the CLI makes it)
    run through Bridge 0.6.2's overrides and runtime_config_update and Megatron-LM's validate_args."""
    from autotune.tuning.analytic_pass import analytic_pass
    from search_spaces.space import feasible_space

    jobs = _documented_search_jobs()
    assert {"mixtral-8x7b 32 h100-sxm", "llama3-70b 64 h200", "deepseek-v3 1024 h100-sxm"} <= set(jobs), sorted(jobs)
    picks = {}
    for name, job in jobs.items():
        answer = analytic_pass(job, feasible_space(job))
        assert answer.ranking.pick is not None, name
        picks[name] = (job, answer.layout(answer.ranking.pick))
    outcomes = load([case_of(job, layout) for job, layout in picks.values()], sorted(NAMES))
    problems = {name: bridge_mismatches(job, layout, o) + megatron_lm_mismatches(job, layout, o)
                for (name, (job, layout)), o in zip(picks.items(), outcomes, strict=True)}
    assert problems == {name: [] for name in picks}
