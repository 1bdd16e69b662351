"""Megatron-FSDP (`fsdp=true`) and layer-level activation offload (`offload_layers=N`), held to the code they are for.

(a) Megatron-LM: each line parses with the megatron-core 0.19.2 wheel's own `megatron/training/arguments.py` parser and
    passes its `validate_args` (as rank 0 of the job's world on the job's GPU, `tests/bridge_harness.py`), and the
    namespace carries Megatron-FSDP's switches (`use_megatron_fsdp`, `data_parallel_sharding_strategy`,
    `fsdp_double_buffer`, `ckpt_format fsdp_dtensor`, meta-device init) and the offload (`cpu_offloading`,
    `cpu_offloading_num_layers`); without `--ckpt-format fsdp_dtensor` or with `CUDA_DEVICE_MAX_CONNECTIONS=1` it
    refuses them.
(b) Megatron-Bridge 0.6.2: each line's overrides on the job's ConfigContainer (NVIDIA's recipe where its Hugging Face
    config is here, else the template with the model's provider, as tests/test_launch_bridge.py builds them) through
    `runtime_config_update`, every switch the prediction assumes in the finished config and the FSDP ones spelled
    out; a Hopper TP recipe's `CUDA_DEVICE_MAX_CONNECTIONS=1` and an FSDP recipe's own switches do not survive.
(c) megatron-core's `TransformerConfig` (0.19.2 here, 0.16.1 in `.venv-mcore-0.16.1`, by `tests/megatron_runner.py`;
    the config alone, no model) accepts the offload layouts autotune accepts and refuses the others with the words of
    autotune's message (search_spaces/fsdp_rules.py); Megatron-FSDP's device mesh (0.19.2's
    `mcore_fsdp_adapter._get_dp_tp_mesh`, on a fake process group) fails exactly where `fsdp_needs_pp1` refuses.
The 0.16.1 launch target's FSDP lines against the recorded Megatron-LM core_v0.16.1 and Bridge v0.3.1 definitions
(tests/test_launch_parsers.py) close the file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from test_launch_bridge import _job, bridge_mismatches, case_of, megatron_lm_mismatches

from autotune.outputs.launch import bridge_overrides, launch_forms, megatron_lm_args, megatron_lm_environment
from search_spaces.job import Job
from search_spaces.layout import Layout, parse_layout
from search_spaces.megatron_names import NAMES, job_settings
from search_spaces.rules import check

import megatron_runner
from bridge_harness import Case, Outcome, load
from test_launch_parsers import _job as _job_0161
from test_launch_parsers import apply_bridge, check_bridge, check_megatron_lm, parse_megatron_lm
from test_rules import make_job

VERSIONS = ("0.16.1", "0.19.2")

# --- (a), (b): the launch lines ---------------------------------------------------------------------------------------
CASES: dict[str, tuple[Job, str]] = {
    # NVIDIA's 26.02 GB200 recipe layout (perf_recipes/llama/gb200/llama3.py `llama3_70b_pretrain_64gpu_gb200_fp8cs`)
    "llama70b-gb200-fp8cs-fsdp-offload40": (_job("llama3-70b", 16, gpu="gb200", seq=8192, gbs=256, precision="fp8",
                                                 fp8_recipe="tensorwise"),
                                            "tp=1,pp=1,dp=64,mbs=2,dist_opt=true,fsdp=true,offload_layers=40"),
    "qwen3-moe-h100-ep8-fsdp": (_job("qwen3-30b-a3b", 2), "tp=1,ep=8,dp=16,dist_opt=true,fsdp=true"),
    "mixtral-h100-tp2-sp-ep8-fsdp": (_job("mixtral", 4), "tp=2,sp=true,ep=8,etp=1,dp=16,dist_opt=true,fsdp=true"),
    # TP on Hopper: NVIDIA's recipe sets CUDA_DEVICE_MAX_CONNECTIONS=1, which Megatron-FSDP refuses
    "llama8b-h100-tp2-sp-fsdp": (_job("llama3-8b", 1), "tp=2,dp=4,sp=true,dist_opt=true,fsdp=true"),
    # MXFP8 primary weights: FSDP gathers them from its own buffers, the gradient-buffer reuse is off; FSDP turns the
    # gradient-reduce overlap on although the job has it off
    "llama8b-b200-mxfp8-fsdp": (_job("llama3-8b", 1, gpu="b200", precision="fp8", overlap_grad_reduce=False),
                                "tp=1,dp=8,mbs=2,dist_opt=true,fsdp=true"),
    # offload without FSDP, TP on Hopper (Megatron-LM then wants CUDA_DEVICE_MAX_CONNECTIONS=1)
    "llama8b-h100-tp2-offload8": (_job("llama3-8b", 1), "tp=2,dp=4,sp=true,dist_opt=true,offload_layers=8"),
}
TP2_FSDP = "llama8b-h100-tp2-sp-fsdp"
_ENV_OVERRIDE = "++env_vars.CUDA_DEVICE_MAX_CONNECTIONS=32"
# switches of an FSDP recipe (perf_recipes/llama/gb200/llama3.py, perf_recipes/nemotronh/gb200/nemotronh.py) put on
# a non-FSDP recipe ahead of a line that has FSDP off
_FSDP_RECIPE = ("dist.use_megatron_fsdp=true", "ddp.use_megatron_fsdp=true", "model.init_model_with_meta_device=true")


def _layout(job: Job, text: str) -> Layout:
    return parse_layout(text, world_size=job.world_size)


def _case(name: str) -> tuple[Job, Layout]:
    job, text = CASES[name]
    return job, _layout(job, text)


def _without(items: tuple[str, ...], *drop: str) -> tuple[str, ...]:
    """`items` less `drop` (the tests below say that the line has them)."""
    return tuple(i for i in items if i not in drop)


def _special_cases() -> dict[str, Case]:
    """Lines changed on purpose (each one a check that must refuse), loaded in the same Bridge process as CASES."""
    job, layout = _case(TP2_FSDP)
    fsdp = case_of(job, layout)
    lm = fsdp.megatron_lm
    at = lm.index("--ckpt-format")
    plain = case_of(job, _layout(job, "tp=2,dp=4,sp=true,dist_opt=true"))
    return {
        "lm-connections-1": dataclasses.replace(fsdp, megatron_lm_env=(("CUDA_DEVICE_MAX_CONNECTIONS", "1"),)),
        "lm-no-fsdp-dtensor": dataclasses.replace(fsdp, megatron_lm=lm[:at] + lm[at + 2:]),
        "bridge-no-env-override": dataclasses.replace(fsdp, overrides=_without(fsdp.overrides, _ENV_OVERRIDE),
                                                      megatron_lm=()),
        "bridge-fsdp-recipe-line-off": dataclasses.replace(plain, overrides=_FSDP_RECIPE + plain.overrides,
                                                           megatron_lm=()),
        "bridge-fsdp-recipe-ddp-key-only": dataclasses.replace(
            plain, overrides=_FSDP_RECIPE + _without(plain.overrides, "dist.use_megatron_fsdp=false",
                                                     "model.init_model_with_meta_device=false"), megatron_lm=()),
    }


# --- (c): megatron-core's own decisions -------------------------------------------------------------------------------
# (model, layout, training settings, the rules autotune breaks under 0.16.1, under 0.19.2) on 8 H100s; tiny-gpt and
# tiny-moe have 8 layers
_HYBRIDEP = {"moe_token_dispatcher": "flex", "moe_flex_backend": "hybridep"}
OFFLOAD: list[tuple[str, str, dict[str, Any], set[str], set[str]]] = [
    ("tiny-gpt", "offload_layers=7", {}, set(), set()),
    ("tiny-gpt", "offload_layers=1", {}, set(), set()),
    ("tiny-gpt", "tp=2,sp=true,offload_layers=3", {}, set(), set()),
    ("tiny-gpt", "cp=2,offload_layers=1", {}, set(), set()),
    ("tiny-gpt", "dist_opt=true,fsdp=true,offload_layers=4", {}, set(), set()),
    ("tiny-moe", "ep=2,offload_layers=2", {}, set(), set()),
    ("tiny-gpt", "offload_layers=8", {}, {"offload_layers_lt_num_layers"}, {"offload_layers_lt_num_layers"}),
    ("tiny-gpt", "offload_layers=20", {}, {"offload_layers_lt_num_layers"}, {"offload_layers_lt_num_layers"}),
    ("tiny-gpt", "pp=2,offload_layers=1", {}, {"offload_needs_pp1"}, {"offload_needs_pp1"}),
    ("tiny-gpt", "offload_layers=1,recompute=selective", {}, {"offload_no_recompute"}, {"offload_no_recompute"}),
    ("tiny-gpt", "offload_layers=1,recompute=full", {}, {"offload_no_recompute"}, {"offload_no_recompute"}),
    ("tiny-gpt", "offload_layers=1,cuda_graphs=transformer_engine", {}, {"offload_cuda_graphs"},
     {"offload_cuda_graphs"}),
    ("tiny-gpt", "offload_layers=1,cuda_graphs=local", {}, {"offload_cuda_graphs"}, {"offload_cuda_graphs"}),
    ("tiny-moe", "ep=2,offload_layers=1,cuda_graphs=transformer_engine", {}, {"offload_cuda_graphs"},
     {"offload_cuda_graphs"}),
    # full-iteration graphs: 0.19 lets a dense model through, 0.16.1 refuses every graph kind
    ("tiny-gpt", "offload_layers=2,cuda_graphs=full_iteration", {}, {"offload_cuda_graphs"}, set()),
    # ... and a MoE model's run with the paged stash, which 0.19 refuses with the offload (0.16.1: the graphs; it
    # also has no paged stash, a stricter refusal of its own)
    ("tiny-moe", "ep=2,offload_layers=1,cuda_graphs=full_iteration", _HYBRIDEP,
     {"offload_cuda_graphs", "full_iteration_moe"}, {"offload_cuda_graphs"}),
]
# the settings of the launch line that reach TransformerConfig beyond `megatron_build.config_kwargs` (the layout's
# sizes, recompute and graphs): the offload, and the dispatcher and paged stash a full-iteration MoE run needs
_CONFIG_EXTRA = ("cpu_offloading", "cpu_offloading_num_layers", "moe_token_dispatcher_type",
                 "moe_flex_dispatcher_backend", "moe_paged_stash", "moe_expert_rank_capacity_factor",
                 "moe_paged_stash_buffer_size_factor_cuda", "moe_paged_stash_buffer_size_factor_cpu",
                 "use_transformer_engine_op_fuser")
# (model, layout) on 8 GPUs: Megatron-FSDP's mesh
MESH: list[tuple[str, str, bool]] = [
    ("tiny-gpt", "dp=8,dist_opt=true,fsdp=true", True),
    ("tiny-gpt", "tp=2,sp=true,dp=4,dist_opt=true,fsdp=true", True),
    ("tiny-gpt", "cp=2,dp=4,dist_opt=true,fsdp=true", True),
    ("tiny-moe", "tp=2,sp=true,ep=4,etp=1,dp=4,dist_opt=true,fsdp=true", True),
    ("tiny-gpt", "pp=2,dp=4,dist_opt=true,fsdp=true", False),
    ("tiny-gpt", "tp=2,pp=2,sp=true,dp=2,dist_opt=true,fsdp=true", False),
    ("tiny-moe", "pp=2,ep=2,dp=4,dist_opt=true,fsdp=true", False),
]


def _offload_job(model: str, version: str, training: dict[str, Any]) -> Job:
    return make_job(model, 8, megatron_core=version, **training)


def _config_cases(version: str) -> list[tuple[Job, Layout, dict[str, Any]]]:
    out = []
    for model, text, training, _, _ in OFFLOAD:
        job = _offload_job(model, version, training)
        layout = _layout(job, text)
        settings = job_settings(job, layout)
        out.append((job, layout, {k: settings[k] for k in _CONFIG_EXTRA if k in settings}))
    return out


def _mesh_cases() -> list[tuple[Layout, int]]:
    return [(parse_layout(text, world_size=8), 8) for _, text, _ in MESH]


# --- the children: megatron-core of both releases and Bridge, all at once ---------------------------------------------
@pytest.fixture(scope="module")
def pending() -> Iterator[dict[str, megatron_runner.Pending]]:
    started = {v: megatron_runner.start("fsdp_offload_decisions", _config_cases(v),
                                        _mesh_cases() if v == "0.19.2" else [], version=v, timeout=300)
               for v in VERSIONS if megatron_runner.python_for(v) is not None}
    yield started
    for child in started.values():
        child.cancel()


@pytest.fixture(scope="module")
def outcomes(pending) -> dict[str, Outcome]:
    """Bridge and Megatron-LM on every line (the megatron-core children run meanwhile)."""
    cases = {name: case_of(*_case(name)) for name in CASES}
    cases.update(_special_cases())
    found = load(list(cases.values()), sorted(NAMES))
    return dict(zip(cases, found, strict=True))


@pytest.fixture(scope="module")
def megatron(pending) -> dict[str, tuple[list[tuple[bool, str]], list[tuple[bool, str]]]]:
    return {v: child.result() for v, child in pending.items()}


def _of(megatron: dict[str, Any], version: str) -> Any:
    if version not in megatron:
        pytest.skip(f"no interpreter with megatron-core {version} ({megatron_runner.INTERPRETERS[version]}; "
                    "scripts/bootstrap creates it)")
    return megatron[version]


# --- (a), (b) ---------------------------------------------------------------------------------------------------------
def _fsdp_expected(layout: Layout) -> dict[str, object]:
    """What a line of this layout must leave in megatron's settings, written out (not read from the table)."""
    want: dict[str, object] = {"use_megatron_fsdp": layout.fsdp, "init_model_with_meta_device": layout.fsdp,
                               "cpu_offloading_num_layers": layout.offload_layers}
    if layout.fsdp:
        want.update(data_parallel_sharding_strategy="optim_grads_params", fsdp_double_buffer=True,
                    ckpt_format="fsdp_dtensor", use_distributed_optimizer=True, overlap_grad_reduce=True,
                    overlap_param_gather=True, reuse_grad_buf_for_mxfp8_param_ag=False)
    return want


def test_autotune_accepts_the_layouts() -> None:
    for name in CASES:
        job, layout = _case(name)
        assert check(job, layout) == (), name
        assert parse_layout(str(layout), world_size=job.world_size) == layout  # the switches print back


@pytest.mark.parametrize("name", sorted(CASES))
def test_bridge_runs_the_line_with_fsdp_and_offload(name, outcomes) -> None:
    job, layout = _case(name)
    outcome = outcomes[name]
    assert bridge_mismatches(job, layout, outcome) == []
    got = outcome.values
    for key, value in _fsdp_expected(layout).items():
        assert got[key] == value, f"{key}: {got[key]!r} in Bridge, the line means {value!r}"
    assert got["cpu_offloading"] is (layout.offload_layers > 0)
    assert got["dist.use_megatron_fsdp"] is layout.fsdp  # Bridge's second FSDP switch
    if layout.fsdp:
        assert got["env.CUDA_DEVICE_MAX_CONNECTIONS"] == "32"  # over the H100 recipe's 1 (the others have 32 or none)


@pytest.mark.parametrize("name", sorted(CASES))
def test_megatron_lm_validates_the_line_with_fsdp_and_offload(name, outcomes) -> None:
    job, layout = _case(name)
    outcome = outcomes[name]
    problems = megatron_lm_mismatches(job, layout, outcome)
    if layout.fsdp and not job.training.overlap_grad_reduce:
        # tests/test_launch_parsers.py's expectation is the job's switch; Megatron-FSDP turns both overlaps on
        # (megatron_fsdp.py MegatronFSDP.__init__), which `_fsdp_expected` holds the line to below
        problems = [p for p in problems if not p.startswith(("--overlap_grad_reduce:", "--overlap_param_gather:"))]
    assert problems == []
    got = outcome.lm_values
    for key, value in _fsdp_expected(layout).items():
        assert got[key] == value, f"--{key}: {got[key]!r} after validate_args, the line means {value!r}"
    # Megatron-LM has no --cpu-offloading: validate_args sets it from the layer count (and leaves it unset when 0)
    assert got.get("cpu_offloading", False) is (layout.offload_layers > 0)
    assert ("--cpu-offloading-num-layers" in megatron_lm_args(job, layout)) is (layout.offload_layers > 0)


def test_megatron_lm_environment_of_the_fsdp_lines() -> None:
    """Hopper TP wants CUDA_DEVICE_MAX_CONNECTIONS=1 unless Megatron-FSDP runs (which refuses 1)."""
    assert megatron_lm_environment(*_case(TP2_FSDP)) == {}
    assert megatron_lm_environment(*_case("llama8b-h100-tp2-offload8")) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    for name in CASES:
        job, layout = _case(name)
        assert (_ENV_OVERRIDE in bridge_overrides(job, layout)) is layout.fsdp, name


def test_megatron_lm_refuses_fsdp_with_one_connection(outcomes) -> None:
    error = outcomes["lm-connections-1"].lm_error
    assert error is not None and "FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset." in error


def test_megatron_lm_refuses_fsdp_without_the_dtensor_format(outcomes) -> None:
    error = outcomes["lm-no-fsdp-dtensor"].lm_error
    assert error is not None and "Megatron-FSDP requires the `fsdp_dtensor` checkpointing format." in error


def test_bridge_refuses_the_hopper_recipes_connections_without_the_override(outcomes) -> None:
    """The H100 TP recipe's env_vars hold CUDA_DEVICE_MAX_CONNECTIONS=1: without the line's `++env_vars` override
    Bridge's FSDP validation fails (with it, test_bridge_runs_the_line_with_fsdp_and_offload passes)."""
    job, layout = _case(TP2_FSDP)
    assert _ENV_OVERRIDE in bridge_overrides(job, layout)
    error = outcomes["bridge-no-env-override"].error
    assert error is not None and "FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset." in error


def test_a_line_without_fsdp_turns_an_fsdp_recipe_off(outcomes) -> None:
    """A layout without FSDP on a recipe that has it: both of Bridge's switches and the meta-device init go off (a
    DDP model on meta tensors would never be materialised); with only the DDP switch cleared Bridge turns
    Megatron-FSDP back on."""
    job, layout = _case(TP2_FSDP)
    line = bridge_overrides(job, dataclasses.replace(layout, fsdp=False))
    assert {"dist.use_megatron_fsdp=false", "model.init_model_with_meta_device=false"} <= set(line)
    off = outcomes["bridge-fsdp-recipe-line-off"]
    assert off.error is None, off.error
    assert (off.values["use_megatron_fsdp"], off.values["dist.use_megatron_fsdp"],
            off.values["init_model_with_meta_device"]) == (False, False, False)
    back = outcomes["bridge-fsdp-recipe-ddp-key-only"]
    assert back.error is not None or back.values["use_megatron_fsdp"] is True, back


# --- (c) --------------------------------------------------------------------------------------------------------------
def _megatron_words(reason: str) -> str:
    """megatron-core's message without the exception type."""
    return reason.split(": ", 1)[1].strip()


@pytest.mark.parametrize("version", VERSIONS)
def test_the_offload_rules_break_as_listed(version) -> None:
    for (_, text, _, old, new), (job, layout, _) in zip(OFFLOAD, _config_cases(version), strict=True):
        assert {v.rule for v in check(job, layout, version=version)} == (old if version == "0.16.1" else new), text


@pytest.mark.parametrize("version", VERSIONS)
def test_transformer_config_decides_offload_as_the_rules_with_their_words(megatron, version) -> None:
    decided, _ = _of(megatron, version)
    mismatches = []
    for (job, layout, extra), (accepted, reason) in zip(_config_cases(version), decided, strict=True):
        ours = [v for v in check(job, layout, version=version) if not v.stricter]
        if accepted != (not ours):
            mismatches.append(f"{job.model.name} {layout}: ours={[v.rule for v in ours]} "
                              f"megatron={'accepts' if accepted else reason}")
        elif ours and not any(_megatron_words(reason) in v.message for v in ours):
            mismatches.append(f"{job.model.name} {layout}: megatron says {reason!r}, ours "
                              f"{[v.message for v in ours]}")
        if layout.offload_layers:
            assert extra["cpu_offloading"] is True and extra["cpu_offloading_num_layers"] == layout.offload_layers
    assert not mismatches, "\n".join(mismatches)


def test_transformer_config_refuses_each_offload_rule_in_both_releases(megatron) -> None:
    """The sample reaches every offload rule of fsdp_rules.py that megatron-core's config checks (offload_hybrid is
    autotune's stricter refusal: the hybrid stack never opens the offload context), in both releases."""
    for version in VERSIONS:
        decided, _ = _of(megatron, version)
        refused = {v.rule for (job, layout, _), (accepted, _) in zip(_config_cases(version), decided, strict=True)
                   if not accepted for v in check(job, layout, version=version) if not v.stricter}
        assert refused == {"offload_layers_lt_num_layers", "offload_needs_pp1", "offload_no_recompute",
                           "offload_cuda_graphs"}, version


def test_megatron_fsdp_mesh_fails_where_fsdp_needs_pp1_refuses(megatron) -> None:
    _, meshes = _of(megatron, "0.19.2")
    for (model, text, builds), (ok, reason) in zip(MESH, meshes, strict=True):
        job = make_job(model, 8)
        rules = {v.rule for v in check(job, _layout(job, text))}
        assert ok is builds, (text, reason)
        assert rules == (set() if builds else {"fsdp_needs_pp1"}), text
        if not builds:
            # einops' layout of the whole world, which autotune's message names
            assert "EinopsError" in reason and "(dp_cp ep tp)" in reason
            assert "(dp_cp ep tp)" in next(v.message for v in check(job, _layout(job, text)))


# --- the --megatron-core 0.16.1 target: Megatron-LM core_v0.16.1 and Bridge v0.3.1 (recorded definitions) -------------
OLD_CASES = {
    "mixtral-tp2-sp-ep8-fsdp": (_job_0161("mixtral", 4), "tp=2,sp=true,ep=8,etp=1,dp=16,dist_opt=true,fsdp=true"),
    "llama8b-tp2-fsdp-offload": (_job_0161("llama3-8b", 1),
                                 "tp=2,dp=4,sp=true,dist_opt=true,fsdp=true,offload_layers=8"),
    "llama8b-offload": (_job_0161("llama3-8b", 1), "tp=1,dp=8,offload_layers=31"),
}


@pytest.mark.parametrize("name", sorted(OLD_CASES))
def test_the_0161_lines_parse_and_carry_fsdp_and_offload(name) -> None:
    job, text = OLD_CASES[name]
    layout = _layout(job, text)
    assert check(job, layout) == ()
    check_megatron_lm(job, layout)
    check_bridge(job, layout)
    forms = launch_forms(job, layout)
    ns = parse_megatron_lm(forms["megatron_lm"])
    want = _fsdp_expected(layout)
    for key in ("use_megatron_fsdp", "init_model_with_meta_device", "cpu_offloading_num_layers",
                "data_parallel_sharding_strategy", "fsdp_double_buffer", "ckpt_format"):
        if key in want:
            assert getattr(ns, key) == want[key], key
    cfg = apply_bridge(forms["megatron_bridge"], comm_overlap=None, mixed_precision="bf16_mixed")
    assert cfg["ddp"]["use_megatron_fsdp"] is cfg["dist"]["use_megatron_fsdp"] is layout.fsdp
    assert cfg["model"]["init_model_with_meta_device"] is layout.fsdp
    assert cfg["model"]["cpu_offloading"] is (layout.offload_layers > 0)
    if layout.offload_layers:
        assert cfg["model"]["cpu_offloading_num_layers"] == layout.offload_layers
    if layout.fsdp:
        assert (cfg["ddp"]["data_parallel_sharding_strategy"], cfg["ddp"]["fsdp_double_buffer"],
                cfg["checkpoint"]["ckpt_format"]) == ("optim_grads_params", True, "fsdp_dtensor")
    assert "env_vars" not in forms["megatron_bridge"]  # Bridge v0.3.1's ConfigContainer has no env_vars
