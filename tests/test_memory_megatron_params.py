"""`autotune.cost.memory` against real megatron-core GPTModels: parameters per GPU, and one micro-batch's activations.

Parameters: a subprocess builds, for each layout, the model chunks that the first and the last rank would hold:
torch's fake process group (`FakeStore`, backend "fake") stands in for a world of TP * PP * CP * DP ranks, so
`parallel_state.initialize_model_parallel` creates the real groups and `GPTModel` allocates each rank's real
shards (local layer spec, CPU, no initialisation). Parameters are split the way megatron-core's DDP splits
them: expert parameters are the ones marked `allreduce = False`. The vocabulary is padded by Megatron-LM's
rule (a multiple of 128 * TP) before it reaches `GPTModel`, as `pretrain_gpt.py` does.

Weights, gradients, optimizer: the same subprocess wraps rank 0's chunks in megatron-core's DDP (fp32 main
grads) and builds its optimizer (distributed or not), then counts storages with `trainers.memory_probe`.

Activations: the same subprocess runs one bf16 micro-batch forward (with its loss) of a one-rank gloo world
under `trainers.memory_probe.SavedTensorTracker` and reports the bytes autograd keeps for the backward pass.

Run alone: `python tests/test_memory_megatron_params.py '{"params": [...], "activations": [...]}'`."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune.cost.memory import LOCAL_SPEC_ASSUMPTIONS, microbatch_activation_terms  # noqa: E402
from autotune.cost.placement import padded_vocab_size, stage_params  # noqa: E402
from autotune.cost.score import estimate_memory_per_stage  # noqa: E402
from search_spaces.catalog import get_model  # noqa: E402
from search_spaces.gpus import build_cluster  # noqa: E402
from search_spaces.job import Job  # noqa: E402
from search_spaces.layout import Layout  # noqa: E402
from search_spaces.megatron_version import rules_version  # noqa: E402
from search_spaces.model import ModelSpec, MoESpec  # noqa: E402
from search_spaces.training import TrainingSpec  # noqa: E402

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
    ("tiny-gpt", Layout(tp=2, pp=2, sp=True)),
    ("tiny-gpt", Layout(tp=4, pp=2, vpp=2, sp=True)),
    ("tiny-gpt", Layout(tp=8, pp=4, dp=2, sp=True)),
    ("tiny-gpt3", Layout(tp=2, pp=2)),
    ("tiny-gpt3", Layout(tp=4)),
    ("tiny-moe", Layout(tp=2, pp=2, ep=4, etp=1, dp=2, sp=True)),
    ("tiny-moe", Layout(tp=2, ep=2, dp=2, sp=True)),  # ETP = TP = 2
    ("tiny-moe", Layout(pp=2, vpp=2, ep=8, dp=8)),
    ("tiny-moe-shared", Layout(tp=2, pp=2, ep=2, etp=1, sp=True)),
    # MLA: the local spec splits the down projections over TP (Transformer Engine's, the default, duplicates
    # them), so everything is compared with LOCAL_SPEC_ASSUMPTIONS (`mla_down_proj_split=True`)
    ("tiny-mla", Layout(pp=2, ep=4, dp=4)),
    ("tiny-mla", Layout(tp=2, pp=2, ep=2, etp=1, sp=True)),
]
# Weights, fp32 main grads and optimizer state of rank 0 after megatron-core's DDP and optimizer are built (Adam state
# materialised with the optimizer's own `init_state_fn`). CP only shapes the process groups here: the local
# attention cannot run CP, and no parameter depends on it.
STATE_CASES = [
    ("tiny-gpt", Layout(tp=2, cp=2, dp=2, sp=True, dist_opt=True)),  # dense optimizer sharded over DP x CP = 4
    ("tiny-gpt", Layout(tp=2, pp=2, dp=2)),  # 18 B/param
    ("tiny-moe", Layout(cp=2, dp=2, ep=2, dist_opt=True)),  # experts over EDP = 1 * 2 * 2 / 2 = 2
    ("tiny-moe", Layout(tp=2, pp=2, ep=4, etp=1, dp=4, sp=True, dist_opt=True)),
]

# One micro-batch's forward on one rank (TP = PP = 1): what autograd keeps, against `microbatch_activation_terms`.
SEQ = 64
ACTIVATION_CASES = [
    ("tiny-gpt", Layout(mbs=2)),
    ("tiny-gpt", Layout(mbs=2, recompute="selective")),
    ("tiny-gpt", Layout(mbs=2, recompute="full")),
    ("tiny-moe", Layout(mbs=2)),
]
# seen: within 0.6% (RoPE cos/sin caches, the causal mask and router indices are not counted)
ACTIVATION_TOLERANCE = 0.03


def _case_id(case: tuple[str, Layout]) -> str:
    return f"{case[0]}-{case[1]}"


# --- the subprocess: real megatron-core models -------------------------------------------------------------
def _init_world(layout: Layout, rank: int, *, fake: bool) -> None:
    """A process group for `rank` of the layout's world (fake: no communication), then megatron's groups."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        ps.destroy_model_parallel()
        dist.destroy_process_group()
    if fake:
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=layout.world_size)
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    ps.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp, context_parallel_size=layout.cp,
        expert_model_parallel_size=layout.ep, expert_tensor_parallel_size=layout.expert_tp,
        create_gloo_process_groups=False,
    )


def _config(model: ModelSpec, layout: Layout, *, initialise: bool):
    """The model's TransformerConfig by the one path (`megatron_names.transformer_config_kwargs`), bf16 on the CPU,
    fusions off, the local spec's alltoall dispatcher."""
    import torch
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    from search_spaces.megatron_names import transformer_config_kwargs
    from trainers.megatron_job import torch_activation

    kw = transformer_config_kwargs(model, layout)
    kw.update(activation_func=torch_activation(str(kw["activation_func"])), use_cpu_initialization=True,
              perform_initialization=initialise, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
              bf16=True, hidden_dropout=0.0, attention_dropout=0.0, gradient_accumulation_fusion=False,
              bias_activation_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
              bias_dropout_fusion=False, apply_rope_fusion=False)
    if model.moe is not None:
        kw.update(moe_grouped_gemm=False, moe_token_dispatcher_type="alltoall")
    if model.mla is not None:
        kw.update(rope_type="rope")
    return (MLATransformerConfig if model.mla is not None else TransformerConfig)(**kw)


def _build_chunks(model: ModelSpec, layout: Layout, config) -> list:
    """This rank's GPTModel chunks (one per virtual stage), local layer spec."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_layer_local_spec

    class ParameterFreeAttention(torch.nn.Module):
        """Stands in for the core attention where the local spec cannot build MLA's (it has no parameters)."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__()

    chunks = []
    for v in range(layout.vpp_size):
        vp = v if layout.vpp else None
        if model.moe is not None:  # per-layer specs: `moe_layer_freq` makes the leading layers dense
            spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False,
                                              normalization=model.normalization, vp_stage=vp)
            if model.mla is not None:  # the local DotProductAttention takes no MLA head dims
                from megatron.core.transformer import multi_latent_attention

                if not isinstance(multi_latent_attention.TELinear, type):  # no TE: isinstance needs a type
                    multi_latent_attention.TELinear = type("TELinear", (), {})
                for layer in spec.layer_specs:
                    layer.submodules.self_attention.submodules.core_attention = ParameterFreeAttention
        else:
            spec = get_gpt_layer_local_spec(qk_layernorm=model.qk_layernorm, normalization=model.normalization)
        chunks.append(GPTModel(
            config=config, transformer_layer_spec=spec,
            vocab_size=padded_vocab_size(model.vocab_size, layout.tp),
            max_sequence_length=model.max_position_embeddings or SEQ,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp),
            share_embeddings_and_output_weights=model.tied_embeddings,
            position_embedding_type="learned_absolute" if model.max_position_embeddings else "rope",
            vp_stage=vp,
        ))
    return chunks


def _count_rank(model: ModelSpec, layout: Layout, rank: int) -> dict[str, int]:
    _init_world(layout, rank, fake=True)
    dense = expert = 0
    for chunk in _build_chunks(model, layout, _config(model, layout, initialise=False)):
        for p in chunk.parameters():
            if getattr(p, "allreduce", True):
                dense += p.numel()
            else:
                expert += p.numel()
    return {"dense": dense, "expert": expert}


def _state_bytes(model: ModelSpec, layout: Layout) -> dict[str, int]:
    """Rank 0's weights, main grads and optimizer state (`trainers.memory_probe`), bf16 with fp32 main grads."""
    import torch
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.module import Float16Module

    from trainers import memory_probe

    _init_world(layout, 0, fake=True)
    built = replace(layout, cp=1)
    config = _config(model, built, initialise=False)
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=layout.dist_opt)
    chunks = [DistributedDataParallel(config=config, ddp_config=ddp_config, module=Float16Module(config, chunk))
              for chunk in _build_chunks(model, built, config)]
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-3, bf16=True, params_dtype=torch.bfloat16,
                        use_distributed_optimizer=layout.dist_opt),
        chunks, use_gloo_process_groups=False)
    for leaf in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        leaf.init_state_fn(leaf.optimizer, leaf.config)
    return {"weights": memory_probe.weights_bytes(chunks), "gradients": memory_probe.gradient_bytes(chunks)[0],
            "optimizer": memory_probe.optimizer_bytes(optimizer, chunks)}


def _probe_activations(model: ModelSpec, layout: Layout) -> int:
    """Bytes of tensors saved for backward and still live after one micro-batch's forward with its loss
    (`trainers.memory_probe.SavedTensorTracker`: unique storages, parameters excluded). One rank, TP = PP = 1."""
    import torch
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from megatron.core.transformer.module import Float16Module

    from trainers.memory_probe import SavedTensorTracker

    _init_world(layout, 0, fake=False)
    model_parallel_cuda_manual_seed(1234)
    config = _config(model, layout, initialise=True)
    gpt = Float16Module(config, _build_chunks(model, layout, config)[0])
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.vocab_size, (layout.mbs, SEQ + 1), generator=gen)
    positions = torch.arange(SEQ).unsqueeze(0).expand(layout.mbs, SEQ).contiguous()
    tracker = SavedTensorTracker({p.untyped_storage().data_ptr() for p in gpt.parameters()})
    with tracker.hooks():
        loss = gpt(tokens[:, :-1].contiguous(), positions, None, labels=tokens[:, 1:].contiguous())
        live = tracker.live_bytes
    del loss
    return live


def _main(cases_json: str) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    # torch norms with SP (MoE with TP needs SP on); `.cuda()` of the tied output weight when PP > 1
    from trainers.cpu_patches import apply_cpu_patches, cpu_device_mode

    apply_cpu_patches()
    cases = json.loads(cases_json)
    params, activations = [], []
    with cpu_device_mode():
        for name, fields in cases["params"]:
            layout, model = Layout(**fields), MODELS[name]
            last = layout.world_size - 1
            params.append({"first": _count_rank(model, layout, 0), "last": _count_rank(model, layout, last)})
        states = [_state_bytes(MODELS[name], Layout(**fields)) for name, fields in cases["states"]]
        for name, fields in cases["activations"]:
            activations.append(_probe_activations(MODELS[name], Layout(**fields)))
    print(json.dumps({"params": params, "states": states, "activations": activations}))


# --- the tests ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def megatron() -> dict[str, list]:
    cases = json.dumps({"params": [(name, asdict(layout)) for name, layout in CASES],
                        "states": [(name, asdict(layout)) for name, layout in STATE_CASES],
                        "activations": [(name, asdict(layout)) for name, layout in ACTIVATION_CASES]})
    done = subprocess.run([sys.executable, __file__, cases], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(CASES)), ids=[_case_id(c) for c in CASES])
@pytest.mark.parametrize("end", ["first", "last"])
def test_params_per_gpu_match_megatron_core(megatron, index, end):
    name, layout = CASES[index]
    stages = stage_params(MODELS[name], layout, mla_down_proj_split=True)
    ours = stages[0] if end == "first" else stages[-1]
    real = megatron["params"][index][end]
    assert (ours.dense_params_per_gpu, ours.expert_params_per_gpu) == (real["dense"], real["expert"])


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(STATE_CASES)), ids=[_case_id(c) for c in STATE_CASES])
def test_weights_grads_optimizer_bytes_match_megatron_core(megatron, index):
    name, layout = STATE_CASES[index]
    job = Job(model=MODELS[name], cluster=build_cluster(nodes=1, gpus_per_node=layout.world_size),
              training=TrainingSpec(seq_length=SEQ, global_batch_size=64,
                                    grad_reduce_in_fp32=True))  # as trainers/megatron_job.py
    est = estimate_memory_per_stage(job, layout, LOCAL_SPEC_ASSUMPTIONS)[0]
    ours = {"weights": est.weights_bytes, "gradients": est.gradients_bytes, "optimizer": est.optimizer_bytes}
    assert ours == megatron["states"][index]


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(ACTIVATION_CASES)), ids=[_case_id(c) for c in ACTIVATION_CASES])
def test_microbatch_activations_match_the_saved_tensor_probe(megatron, index):
    # the local spec's tensors (no flash attention, torch norms, unfused SwiGLU): LOCAL_SPEC_ASSUMPTIONS
    name, layout = ACTIVATION_CASES[index]
    job = Job(model=MODELS[name], cluster=build_cluster(nodes=1, gpus_per_node=1),
              training=TrainingSpec(seq_length=SEQ, global_batch_size=layout.mbs))
    predicted = sum(microbatch_activation_terms(job, layout, assumptions=LOCAL_SPEC_ASSUMPTIONS).values())
    assert predicted == pytest.approx(megatron["activations"][index], rel=ACTIVATION_TOLERANCE)


if __name__ == "__main__":
    from megatron_runner import exit_without_teardown

    _main(sys.argv[1])
    exit_without_teardown()


# --- every stage, on the meta device: MTP, layout strings and the new model features --------------------------
# Full-size models build without memory on torch's meta device (`megatron_build`); the first rank of every pipeline
# stage is compared with `stage_params` (Transformer Engine's MLA down projections: duplicated, not split over TP).
def _hf(name: str) -> ModelSpec:
    from search_spaces.hf_config import model_from_hf_config

    return model_from_hf_config(ROOT / "tests" / "data" / "hf" / f"{name}.json")


TINY_MTP_TIED = replace(TINY_GPT3, name="tiny-mtp-tied", mtp_num_layers=1)  # the MTP stage's embedding copy, tied
PLACEMENT_CASES = [  # (model, layout)
    ("deepseek-v3", Layout(tp=2, pp=8, ep=64, etp=1, dp=64, sp=True, pipeline_layout="Et|(tt|)*30mL")),  # H100 preset
    ("deepseek-v3", Layout(tp=2, pp=16, ep=64, etp=1, dp=32, sp=True, first_stage_layers=3, last_stage_layers=2)),
    ("gemma-2-2b-it", Layout(tp=2, pp=2, dp=2, sp=True)),  # post norms, tied embeddings over PP
    ("gemma-3-1b-it", Layout(tp=4, pp=2, vpp=13, dp=1, sp=True)),  # 26 layers over 26 chunks; q/k norms
    ("gpt-oss-20b", Layout(tp=2, pp=2, ep=4, etp=1, dp=4, sp=True)),  # biases everywhere, sinks over TP
    ("olmoe-1b-7b-0125", Layout(tp=2, pp=2, vpp=2, ep=8, etp=1, dp=8, sp=True)),  # full-width q/k norms
    ("deepseek-v2-lite", Layout(tp=2, pp=3, ep=8, etp=1, dp=4, sp=True, first_stage_layers=9, last_stage_layers=9)),
    ("qwen1.5-moe-a2.7b", Layout(tp=2, pp=2, ep=4, etp=1, dp=2, sp=True)),  # the shared expert's gate
    ("tiny-mtp-tied", Layout(tp=2, pp=2, dp=1)),
    ("tiny-mtp-tied", Layout(pp=2, vpp=2, dp=1, pipeline_layout="Et|t|ttm|L")),  # MTP on rank 0's last chunk
    ("tiny-mtp-tied", Layout(pp=2, vpp=2, dp=1, pipeline_layout="Et|tt|t|mL")),  # an MTP chunk without decoders
    ("tiny-mtp-tied", Layout(pp=2, dp=1, embedding_loss_split=True)),  # (4 + 2) / 2 = 3 slots per stage
]


def _placement_model(name: str) -> ModelSpec:
    return TINY_MTP_TIED if name == "tiny-mtp-tied" else get_model(name) if name == "deepseek-v3" else _hf(name)


@pytest.fixture(scope="module")
def every_stage() -> list[list[tuple[int, int, int]]]:
    """(dense, expert, megatron-only) parameters on the first rank of every stage (`megatron_build.stage_param_counts`
    in a child process of the installed megatron-core)."""
    import megatron_runner

    cases = [(_placement_model(name), layout) for name, layout in PLACEMENT_CASES]
    return megatron_runner.run("stage_param_counts", cases, version=rules_version(), timeout=600)


def _megatron_only_per_stage(model: ModelSpec, layout: Layout) -> list[int]:
    """`megatron_only_params_per_layer` times the decoder and MTP layers on each stage (chunk c on stage c % PP)."""
    from test_models import megatron_only_params_per_layer

    per_layer = megatron_only_params_per_layer(model, rules_version())
    mtp = layout.chunk_mtp_counts(model.mtp_num_layers)
    return [per_layer * (layers + sum(mtp[stage::layout.pp]))
            for stage, layers in enumerate(layout.stage_layer_counts(model.num_layers))]


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(PLACEMENT_CASES)), ids=[_case_id(c) for c in PLACEMENT_CASES])
def test_every_stage_params_per_gpu_match_megatron_core(every_stage, index):
    name, layout = PLACEMENT_CASES[index]
    model = _placement_model(name)
    ours = [(s.dense_params_per_gpu, s.expert_params_per_gpu, extra)
            for s, extra in zip(stage_params(model, layout), _megatron_only_per_stage(model, layout), strict=True)]
    assert ours == every_stage[index]
