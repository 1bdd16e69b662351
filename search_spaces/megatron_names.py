"""The one mapping from autotune's fields to megatron's names: the megatron-core field, the Megatron-LM flag and
the Megatron-Bridge override key of every switch a prediction assumes.

`megatron_settings(layout)`, the launch lines (`autotune.outputs.launch`) and the tests read this table; nothing else
spells megatron's names. Targets (the versions autotune's rules and cost models follow):

- megatron-core 0.16.1: `TransformerConfig` / `ModelParallelConfig` (owner "transformer"),
  `DistributedDataParallelConfig` ("ddp"), `OptimizerConfig` ("optimizer"). Megatron-LM arguments with no
  megatron-core field (micro/global batch, sequence length) have owner "training".
- Megatron-LM `megatron/training/arguments.py` at tag core_v0.16.1 (commit 55ac7082517c), the flags.
- Megatron-Bridge v0.3.1 (commit 9c9dd848966, the release that pins megatron-core 0.16.1), the
  `ConfigContainer` keys of `scripts/training/run_recipe.py`'s Hydra overrides. A key `comm_overlap:<field>` or
  `mixed_precision:<field>` is a keyword of the `CommOverlapConfig` / `MixedPrecisionConfig` object the launch line
  builds: both objects overwrite the model's, DDP's and the optimizer's fields of the same names
  (`training/comm_overlap.py` `setup`, `training/mixed_precision.py` `update_config_with_precision_overrides`), so
  a switch set only on `model.` / `ddp.` would be undone by them.

`job_settings(job, layout)` gives every setting by megatron-core name with the value the cost models assume, the
effective one (`tp_comm_overlap` only with TP > 1 and SP on, as Megatron-LM asserts; `overlap_param_gather` only
with the distributed optimizer; FP8 fields only in FP8; MoE fields only for MoE models).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from search_spaces.job import Job
    from search_spaces.layout import Layout
    from search_spaces.model import ModelSpec
    from search_spaces.training import TrainingSpec

__all__ = ["Name", "NAMES", "LAYOUT_NAMES", "TRAINING_NAMES", "MOE_ONLY", "PARALLEL_STATE", "layout_settings",
           "job_settings", "optimizer_settings", "megatron_settings", "parallel_state_kwargs",
           "fp8_format", "architecture_settings", "transformer_config_kwargs"]

Owner = Literal["transformer", "ddp", "optimizer", "training"]
Kind = Literal["int", "float", "bool", "str", "list", "dtype"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Name:
    """How one megatron-core setting is spelled in each form."""

    core: str
    owner: Owner
    kind: Kind
    lm: str | None  # Megatron-LM flag; None: no flag (the form says it another way)
    lm_false: str | None = None  # a flag that sets False (Megatron-LM's own default would be True)
    bridge: tuple[str, ...] = ()  # Megatron-Bridge 0.6.2 override keys
    bridge_0_3_1: tuple[str, ...] | None = None  # Bridge v0.3.1's keys where they differ from 0.6.2's
    lm_0_16_1: str | None = None  # Megatron-LM core_v0.16.1's flag where it differs
    since: str = "0.16.1"  # the first release (rule set) that has the setting: job_settings leaves it out before

    def lm_flag(self, tag: str) -> str | None:
        """The Megatron-LM flag at `tag` ("core_v0.19.2" or "core_v0.16.1": `megatron_version.LAUNCH_TARGETS`)."""
        if tag == "core_v0.16.1" and self.lm_0_16_1 is not None:
            return self.lm_0_16_1
        return self.lm

    def bridge_keys(self, release: str) -> tuple[str, ...]:
        """The override keys in Megatron-Bridge `release` ("0.6.2" or "0.3.1": `megatron_version.LAUNCH_TARGETS`)."""
        if release == "0.3.1" and self.bridge_0_3_1 is not None:
            return self.bridge_0_3_1
        return self.bridge


def _n(core: str, owner: Owner, kind: Kind, lm: str | None, *bridge: str, lm_false: str | None = None,
       bridge_0_3_1: tuple[str, ...] | None = None, lm_0_16_1: str | None = None, since: str = "0.16.1") -> Name:
    return Name(core=core, owner=owner, kind=kind, lm=lm, lm_false=lm_false, bridge=bridge, bridge_0_3_1=bridge_0_3_1,
                lm_0_16_1=lm_0_16_1, since=since)


_T: Owner = "transformer"
_D: Owner = "ddp"
_O: Owner = "optimizer"
_R: Owner = "training"
NAMES: dict[str, Name] = {n.core: n for n in (
    # --- the layout ---------------------------------------------------------------------------
    _n("tensor_model_parallel_size", _T, "int", "--tensor-model-parallel-size", "model.tensor_model_parallel_size"),
    _n("pipeline_model_parallel_size", _T, "int", "--pipeline-model-parallel-size",
       "model.pipeline_model_parallel_size"),
    # Megatron-LM names the chunks per stage (`--num-virtual-stages-per-pipeline-rank`, which also works with an
    # uneven split); it derives VPP itself from a pipeline layout string and refuses both (arguments.py L503-527).
    _n("virtual_pipeline_model_parallel_size", _T, "int", "--num-virtual-stages-per-pipeline-rank",
       "model.virtual_pipeline_model_parallel_size"),
    _n("context_parallel_size", _T, "int", "--context-parallel-size", "model.context_parallel_size"),
    _n("expert_model_parallel_size", _T, "int", "--expert-model-parallel-size", "model.expert_model_parallel_size"),
    _n("expert_tensor_parallel_size", _T, "int", "--expert-tensor-parallel-size",
       "model.expert_tensor_parallel_size"),
    _n("sequence_parallel", _T, "bool", "--sequence-parallel", "model.sequence_parallel"),
    _n("micro_batch_size", _R, "int", "--micro-batch-size", "train.micro_batch_size"),
    _n("use_distributed_optimizer", _D, "bool", "--use-distributed-optimizer", "ddp.use_distributed_optimizer",
       "optimizer.use_distributed_optimizer"),
    _n("recompute_granularity", _T, "str", "--recompute-granularity", "model.recompute_granularity"),
    _n("num_layers_in_first_pipeline_stage", _T, "int", "--decoder-first-pipeline-num-layers",
       "model.num_layers_in_first_pipeline_stage"),
    _n("num_layers_in_last_pipeline_stage", _T, "int", "--decoder-last-pipeline-num-layers",
       "model.num_layers_in_last_pipeline_stage"),
    _n("account_for_embedding_in_pipeline_split", _T, "bool", "--account-for-embedding-in-pipeline-split",
       "model.account_for_embedding_in_pipeline_split"),
    _n("account_for_loss_in_pipeline_split", _T, "bool", "--account-for-loss-in-pipeline-split",
       "model.account_for_loss_in_pipeline_split"),
    _n("pipeline_model_parallel_layout", _T, "str", "--pipeline-model-parallel-layout",
       "model.pipeline_model_parallel_layout"),
    # --- the training recipe ------------------------------------------------------------------
    _n("recompute_method", _T, "str", "--recompute-method", "model.recompute_method"),
    _n("recompute_num_layers", _T, "int", "--recompute-num-layers", "model.recompute_num_layers"),
    _n("recompute_modules", _T, "list", "--recompute-modules", "model.recompute_modules"),
    # Bridge 0.6: the dataset owns the sequence length as `seq_length` and copies it over megatron-core's
    # `sequence_length` in `GPTDatasetConfig.finalize()` (training/config.py), so an override of `sequence_length`
    # is undone. v0.3.1 had only megatron-core's `sequence_length` field (`seq_length` was a property, which the
    # Hydra tree refuses).
    _n("seq_length", _R, "int", "--seq-length", "model.seq_length", "dataset.seq_length",
       bridge_0_3_1=("model.seq_length", "dataset.sequence_length")),
    _n("global_batch_size", _R, "int", "--global-batch-size", "train.global_batch_size"),
    _n("bf16", _T, "bool", "--bf16", "mixed_precision:bf16"),
    _n("fp8", _T, "str", "--fp8-format", "mixed_precision:fp8"),
    _n("fp8_recipe", _T, "str", "--fp8-recipe", "mixed_precision:fp8_recipe"),
    _n("fp8_param_gather", _D, "bool", "--fp8-param-gather", "mixed_precision:fp8_param_gather"),
    # NVFP4 (megatron-core 0.19 `TransformerConfig.fp4` / `fp4_recipe`; Bridge `bf16_with_nvfp4_mixed`)
    _n("fp4", _T, "str", "--fp4-format", "mixed_precision:fp4"),
    _n("fp4_recipe", _T, "str", "--fp4-recipe", "mixed_precision:fp4_recipe"),
    # decoder layers kept out of the FP8/FP4 autocast (fp8_utils.is_first_last_bf16_layer, fp4_utils.get_fp4_context);
    # Bridge's MixedPrecisionConfig carries all three and overwrites the model's
    _n("first_last_layers_bf16", _T, "bool", "--first-last-layers-bf16", "mixed_precision:first_last_layers_bf16"),
    _n("num_layers_at_start_in_bf16", _T, "int", "--num-layers-at-start-in-bf16",
       "mixed_precision:num_layers_at_start_in_bf16"),
    _n("num_layers_at_end_in_bf16", _T, "int", "--num-layers-at-end-in-bf16",
       "mixed_precision:num_layers_at_end_in_bf16"),
    # Megatron-LM has no flag for it ("no CLI argument exists for these", arguments.py `_add_network_size_args`,
    # core_v0.16.1 and 0.19.2): its line says so (`autotune.outputs.launch.megatron_lm_notes`)
    _n("fp8_dot_product_attention", _T, "bool", None, "mixed_precision:fp8_dot_product_attention"),
    # MXFP8 primary weights gather through the gradient buffer; Bridge asserts it (`MixedPrecisionConfig.finalize`)
    _n("reuse_grad_buf_for_mxfp8_param_ag", _D, "bool", "--reuse-grad-buf-for-mxfp8-param-ag",
       "mixed_precision:reuse_grad_buf_for_mxfp8_param_ag"),
    # Megatron-LM reduces bf16 gradients in fp32 unless told `--grad-reduce-in-bf16` (arguments.py L715-723).
    _n("grad_reduce_in_fp32", _D, "bool", "--accumulate-allreduce-grads-in-fp32", "ddp.grad_reduce_in_fp32",
       "mixed_precision:grad_reduce_in_fp32", lm_false="--grad-reduce-in-bf16"),
    _n("use_precision_aware_optimizer", _O, "bool", "--use-precision-aware-optimizer",
       "optimizer.use_precision_aware_optimizer"),
    # Muon: "dist_muon" is the layer-wise distributed Muon in both releases (megatron-core 0.16.1
    # `optimizer/muon.py`, Bridge `training/optim.py`: `layer_wise_distributed_optimizer="dist" in optimizer`;
    # Megatron-LM 0.19 takes the name too, deprecated for `muon` + `--use-distributed-optimizer`, arguments.py
    # :1672-1678); set only for a Muon job (Adam is every release's default)
    _n("optimizer", _O, "str", "--optimizer", "optimizer.optimizer"),
    _n("exp_avg_dtype", _O, "dtype", "--exp-avg-dtype", "optimizer.exp_avg_dtype"),
    _n("exp_avg_sq_dtype", _O, "dtype", "--exp-avg-sq-dtype", "optimizer.exp_avg_sq_dtype"),
    _n("overlap_grad_reduce", _D, "bool", "--overlap-grad-reduce", "ddp.overlap_grad_reduce",
       "comm_overlap:overlap_grad_reduce"),
    _n("overlap_param_gather", _D, "bool", "--overlap-param-gather", "ddp.overlap_param_gather",
       "comm_overlap:overlap_param_gather"),
    _n("tp_comm_overlap", _T, "bool", "--tp-comm-overlap", "model.tp_comm_overlap", "comm_overlap:tp_comm_overlap"),
    _n("overlap_moe_expert_parallel_comm", _T, "bool", "--overlap-moe-expert-parallel-comm",
       "model.overlap_moe_expert_parallel_comm", "comm_overlap:overlap_moe_expert_parallel_comm"),
    _n("moe_token_dispatcher_type", _T, "str", "--moe-token-dispatcher-type", "model.moe_token_dispatcher_type"),
    _n("moe_flex_dispatcher_backend", _T, "str", "--moe-flex-dispatcher-backend",
       "model.moe_flex_dispatcher_backend"),
    # the EP A2A overlap's weight gradients behind the combine (Bridge: `CommOverlapConfig.delay_wgrad_compute`,
    # copied over the model's in `setup`)
    _n("delay_wgrad_compute", _T, "bool", "--delay-wgrad-compute", "model.delay_wgrad_compute",
       "comm_overlap:delay_wgrad_compute"),
    # the paged stash of full-iteration graphs of MoE models (0.19; Bridge 0.6 perf_recipes/qwen/common.py)
    _n("moe_paged_stash", _T, "bool", "--moe-paged-stash", "model.moe_paged_stash", since="0.19.2"),
    _n("moe_expert_rank_capacity_factor", _T, "float", "--moe-expert-rank-capacity-factor",
       "model.moe_expert_rank_capacity_factor", since="0.19.2"),
    _n("moe_paged_stash_buffer_size_factor_cuda", _T, "float", "--moe-paged-stash-buffer-size-factor-cuda",
       "model.moe_paged_stash_buffer_size_factor_cuda", since="0.19.2"),
    _n("moe_paged_stash_buffer_size_factor_cpu", _T, "float", "--moe-paged-stash-buffer-size-factor-cpu",
       "model.moe_paged_stash_buffer_size_factor_cpu", since="0.19.2"),
    # full-iteration graphs cannot capture the NaN check of the loss (Megatron-LM validate_args: "--no-check-for-nan-
    # in-loss-and-grad should be set with --cuda-graph-impl=full_iteration"; Bridge ConfigContainer.validate asserts
    # rerun_state_machine.check_for_nan_in_loss=False); on by default in both
    _n("check_for_nan_in_loss_and_grad", _R, "bool", None, "rerun_state_machine.check_for_nan_in_loss",
       lm_false="--no-check-for-nan-in-loss-and-grad"),
    # HybridEP with a rank capacity factor needs TE's op fuser ("moe_expert_rank_capacity_factor with the
    # 'hybridep' backend requires use_transformer_engine_op_fuser", transformer_config.py :1698-1705)
    _n("use_transformer_engine_op_fuser", _T, "bool", "--use-transformer-engine-op-fuser",
       "model.use_transformer_engine_op_fuser", since="0.19.2"),
    _n("moe_expert_capacity_factor", _T, "float", "--moe-expert-capacity-factor", "model.moe_expert_capacity_factor"),
    _n("moe_pad_expert_input_to_capacity", _T, "bool", "--moe-pad-expert-input-to-capacity",
       "model.moe_pad_expert_input_to_capacity"),
    _n("moe_grouped_gemm", _T, "bool", "--moe-grouped-gemm", "model.moe_grouped_gemm"),
    _n("moe_permute_fusion", _T, "bool", "--moe-permute-fusion", "model.moe_permute_fusion"),
    _n("moe_router_force_load_balancing", _T, "bool", "--moe-router-force-load-balancing",
       "model.moe_router_force_load_balancing"),
    _n("cross_entropy_loss_fusion", _T, "bool", "--cross-entropy-loss-fusion", "model.cross_entropy_loss_fusion"),
    _n("cross_entropy_fusion_impl", _T, "str", "--cross-entropy-fusion-impl", "model.cross_entropy_fusion_impl"),
    _n("cuda_graph_impl", _T, "str", "--cuda-graph-impl", "model.cuda_graph_impl"),
    # megatron-core 0.19 renamed `cuda_graph_scope` to `cuda_graph_modules` (transformer_config.py: the old name is
    # migrated in __post_init__ and both together are refused) and moved "full_iteration" to `cuda_graph_impl`
    _n("cuda_graph_modules", _T, "list", "--cuda-graph-modules", "model.cuda_graph_modules",
       lm_0_16_1="--cuda-graph-scope", bridge_0_3_1=("model.cuda_graph_scope",)),
    # CUDA graphs need Transformer Engine's RNG tracker (Bridge `scripts/performance/utils/overrides.py`
    # `_set_cuda_graph_overrides` sets both keys).
    _n("use_te_rng_tracker", _T, "bool", "--te-rng-tracker", "model.use_te_rng_tracker", "rng.te_rng_tracker"),
    # Megatron-FSDP (`DistributedDataParallelConfig`; docs/design/megatron-fsdp-and-offload.md (e)): autotune's one
    # strategy is ZeRO-3, `optim_grads_params`, with the two-unit double buffer every Bridge FSDP recipe sets;
    # Megatron-LM asserts `--ckpt-format fsdp_dtensor` with it ("Megatron-FSDP requires the `fsdp_dtensor`
    # checkpointing format.", arguments.py validate_args), Bridge only when it saves or loads
    # Bridge turns Megatron-FSDP on when either its DDP or its distributed-init switch is set (training/config.py
    # `ConfigContainer.validate` :1345, `_validate_and_apply_megatron_fsdp_configs` :1070-1071), and some recipes set
    # only the second (perf_recipes/nemotronh/gb200/nemotronh.py :652): the line sets both
    _n("use_megatron_fsdp", _D, "bool", "--use-megatron-fsdp", "ddp.use_megatron_fsdp", "dist.use_megatron_fsdp"),
    _n("data_parallel_sharding_strategy", _D, "str", "--data-parallel-sharding-strategy",
       "ddp.data_parallel_sharding_strategy"),
    _n("fsdp_double_buffer", _D, "bool", "--fsdp-double-buffer", "ddp.fsdp_double_buffer"),
    _n("ckpt_format", _R, "str", "--ckpt-format", "checkpoint.ckpt_format"),
    # the model built on the meta device and materialised shard by shard by Megatron-FSDP (transformer_config.py
    # :405 "only works when megatron fsdp is turned on"; Megatron-LM training.py `get_model` :1768-1827), as every
    # Bridge FSDP recipe sets it (perf_recipes/llama/gb200/llama3.py :219): without it each GPU first allocates the
    # whole unsharded model. Off otherwise, explicitly: a Bridge FSDP recipe's True would leave a DDP model on meta
    # tensors (Bridge's `get_model` skips `.cuda()` for it and, unlike Megatron-LM, never materialises it,
    # models/model_provider.py :647-689)
    _n("init_model_with_meta_device", _T, "bool", "--init-model-with-meta-device",
       "model.init_model_with_meta_device"),
    # layer-level activation offload (TransformerConfig via ModelParallelConfig; Megatron-LM has no
    # `--cpu-offloading` flag: `--cpu-offloading-num-layers N` with N > 0 turns it on, arguments.py validate_args)
    _n("cpu_offloading", _T, "bool", None, "model.cpu_offloading"),
    _n("cpu_offloading_num_layers", _T, "int", "--cpu-offloading-num-layers", "model.cpu_offloading_num_layers"),
)}

# Layout field -> the megatron-core settings it decides (`dp` and `expert_dp` are derived, never set).
LAYOUT_NAMES: dict[str, tuple[str, ...]] = {
    "tp": ("tensor_model_parallel_size",),
    "pp": ("pipeline_model_parallel_size",),
    "vpp": ("virtual_pipeline_model_parallel_size",),
    "cp": ("context_parallel_size",),
    "ep": ("expert_model_parallel_size",),
    "etp": ("expert_tensor_parallel_size",),
    "dp": (),
    "mbs": ("micro_batch_size",),
    "sp": ("sequence_parallel",),
    "dist_opt": ("use_distributed_optimizer",),
    "recompute": ("recompute_granularity",),
    "cuda_graphs": ("cuda_graph_impl", "cuda_graph_modules", "use_te_rng_tracker", "check_for_nan_in_loss_and_grad"),
    "ep_overlap": ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute"),
    "fsdp": ("use_megatron_fsdp", "data_parallel_sharding_strategy", "fsdp_double_buffer", "ckpt_format",
             "init_model_with_meta_device"),
    "offload_layers": ("cpu_offloading", "cpu_offloading_num_layers"),
    "first_stage_layers": ("num_layers_in_first_pipeline_stage",),
    "last_stage_layers": ("num_layers_in_last_pipeline_stage",),
    "embedding_loss_split": ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"),
    "pipeline_layout": ("pipeline_model_parallel_layout",),
}

# TrainingSpec field -> the megatron-core settings it decides.
TRAINING_NAMES: dict[str, tuple[str, ...]] = {
    "seq_length": ("seq_length",),
    "global_batch_size": ("global_batch_size",),
    "precision": ("bf16", "fp8", "fp4", "fp4_recipe"),
    "fp8_recipe": ("fp8_recipe",),
    "fp8_param_gather": ("fp8_param_gather", "reuse_grad_buf_for_mxfp8_param_ag"),
    "fp8_dot_product_attention": ("fp8_dot_product_attention",),
    "grad_reduce_in_fp32": ("grad_reduce_in_fp32",),
    "optimizer_moments": ("use_precision_aware_optimizer", "exp_avg_dtype", "exp_avg_sq_dtype"),
    "precision_aware_optimizer": ("use_precision_aware_optimizer",),
    "optimizer": ("optimizer", "use_distributed_optimizer", "overlap_param_gather", "fp8_param_gather"),
    "overlap_grad_reduce": ("overlap_grad_reduce",),
    "overlap_param_gather": ("overlap_param_gather",),
    "tp_comm_overlap": ("tp_comm_overlap",),
    "delay_wgrad_compute": ("delay_wgrad_compute",),
    "moe_token_dispatcher": ("moe_token_dispatcher_type", "moe_flex_dispatcher_backend"),
    "moe_flex_backend": ("moe_flex_dispatcher_backend",),
    "moe_rank_capacity_factor": ("moe_paged_stash", "moe_expert_rank_capacity_factor",
                                 "moe_paged_stash_buffer_size_factor_cuda", "moe_paged_stash_buffer_size_factor_cpu",
                                 "use_transformer_engine_op_fuser"),
    "moe_expert_capacity_factor": ("moe_expert_capacity_factor",),
    "moe_pad_expert_input_to_capacity": ("moe_pad_expert_input_to_capacity",),
    "moe_grouped_gemm": ("moe_grouped_gemm",),
    "moe_permute_fusion": ("moe_permute_fusion",),
    "moe_router_force_load_balancing": ("moe_router_force_load_balancing",),
    "cross_entropy_fusion": ("cross_entropy_loss_fusion", "cross_entropy_fusion_impl"),
    "cuda_graph_modules": ("cuda_graph_modules",),
    "recompute_modules": ("recompute_modules",),
    "recompute_num_layers": ("recompute_method", "recompute_num_layers"),
    "bf16_layers_at_start": ("first_last_layers_bf16", "num_layers_at_start_in_bf16"),
    "bf16_layers_at_end": ("first_last_layers_bf16", "num_layers_at_end_in_bf16"),
    "megatron_core": (),  # which release the names are spelled for (Name.lm_flag, Name.bridge_keys), no setting
    "release": (),  # the software release the throughput factors are for (search_spaces.releases), no setting
}

# Settings that exist only for MoE models (a dense model's launch line leaves them out).
MOE_ONLY = frozenset({"expert_model_parallel_size", "expert_tensor_parallel_size", "overlap_moe_expert_parallel_comm",
                      "moe_token_dispatcher_type", "moe_grouped_gemm", "moe_permute_fusion",
                      "moe_router_force_load_balancing", "moe_flex_dispatcher_backend", "delay_wgrad_compute",
                      "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity"})
# Bridge 0.6 paged-stash buffer sizes NVIDIA's full-iteration MoE recipes use (perf_recipes/qwen/common.py
# `_enable_hybridep_full_iteration_mxfp8`): 1.2 x the average-based device buffer, a host buffer of 1.0 x it
PAGED_STASH_BUFFER_CUDA = 1.2
PAGED_STASH_BUFFER_CPU = 1.0


def layout_settings(layout: Layout) -> dict[str, object]:
    """The layout alone, by megatron-core name. The pipeline layout string appears only when the layout has one."""
    out: dict[str, object] = {
        "tensor_model_parallel_size": layout.tp,
        "pipeline_model_parallel_size": layout.pp,
        "virtual_pipeline_model_parallel_size": layout.vpp,
        "context_parallel_size": layout.cp,
        "expert_model_parallel_size": layout.ep,
        "expert_tensor_parallel_size": layout.expert_tp,  # None in the Layout means ETP = TP
        "sequence_parallel": layout.sp,
        "micro_batch_size": layout.mbs,
        "use_distributed_optimizer": layout.dist_opt,
        "recompute_granularity": None if layout.recompute == "none" else layout.recompute,
        "num_layers_in_first_pipeline_stage": layout.first_stage_layers,
        "num_layers_in_last_pipeline_stage": layout.last_stage_layers,
        "account_for_embedding_in_pipeline_split": layout.embedding_loss_split,
        "account_for_loss_in_pipeline_split": layout.embedding_loss_split,
        "cpu_offloading": layout.offload_layers > 0,
        "cpu_offloading_num_layers": layout.offload_layers,
    }
    pipeline_layout = getattr(layout, "pipeline_layout", None)
    if pipeline_layout is not None:
        out["pipeline_model_parallel_layout"] = pipeline_layout
    return out


# `megatron.core.parallel_state.initialize_model_parallel` keywords (the same names as TransformerConfig's)
PARALLEL_STATE = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
                  "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size")


def parallel_state_kwargs(layout: Layout) -> dict[str, object]:
    """`initialize_model_parallel` keywords of the layout."""
    settings = layout_settings(layout)
    return {k: settings[k] for k in PARALLEL_STATE}


def fp8_format(recipe: str) -> str:
    """Megatron-Bridge's FP8 format per recipe (`training/mixed_precision.py`): E4M3 everywhere for MXFP8
    (`bf16_with_mxfp8_mixed`), hybrid (E4M3 forward, E5M2 gradients) for delayed, tensorwise and blockwise."""
    return "e4m3" if recipe == "mxfp8" else "hybrid"


def optimizer_settings(training: TrainingSpec, layout: Layout) -> dict[str, object]:
    """What the job's optimizer changes in the layout's megatron settings: nothing for Adam; for Muon the optimizer's
    name and `use_distributed_optimizer` off. With dist_opt Muon is the layer-wise distributed "dist_muon", and DDP
    runs without the distributed optimizer (Bridge's Muon recipes: ddp.use_distributed_optimizer=False,
    overlap_param_gather=False, recipes/kimi/h100/kimi_k2.py::_apply_kimi_k2_optimizer), so no FP8 primary weights
    either (`TrainingSpec.fp8_params`)."""
    if not training.muon:
        return {}
    return {"optimizer": "dist_muon" if layout.dist_opt else "muon", "use_distributed_optimizer": False}


def megatron_settings(layout: Layout, training: TrainingSpec | None = None) -> dict[str, object]:
    """megatron-core field names and values of `layout` (`layout_settings`), plus the derived `dp` and `expert_dp`
    and the searched switches under their layout names (`cuda_graphs`, `ep_overlap`, `fsdp`, `offload_layers`: the
    megatron settings they stand for depend on the release, `job_settings`). With the job's `training`, what its
    optimizer changes (`optimizer_settings`: Muon's dist_opt is "dist_muon" with `use_distributed_optimizer` off)."""
    out = layout_settings(layout)
    if training is not None:
        out.update(optimizer_settings(training, layout))
    out["dp"] = layout.dp
    out["expert_dp"] = layout.expert_dp
    out["cuda_graphs"] = layout.cuda_graphs
    out["ep_overlap"] = layout.ep_overlap
    out["fsdp"] = layout.fsdp
    out["offload_layers"] = layout.offload_layers
    return out


def job_settings(job: Job, layout: Layout) -> dict[str, object]:
    """Every megatron setting the step-time and memory predictions assume, by megatron-core name. (Long on purpose:
    one line per setting, in one place, so the launch lines and the cost model cannot drift apart.)

    None means "unset" (megatron's default: no VPP, no uneven split, no recompute method). The values are the
    effective ones: a switch megatron would refuse or ignore in this layout is off here too.
    """
    t, moe = job.training, job.model.moe is not None
    out = layout_settings(layout)
    if not moe:
        for name in MOE_ONLY:
            out.pop(name, None)
    out["pipeline_model_parallel_layout"] = getattr(layout, "pipeline_layout", None)
    full = layout.recompute == "full"
    # full recompute: every layer of each chunk (`uniform`, 1 layer per group) unless N layers per chunk (`block`)
    out["recompute_method"] = None if not full else ("uniform" if t.recompute_num_layers is None else "block")
    out["recompute_num_layers"] = None if not full else (t.recompute_num_layers or 1)
    if layout.recompute == "selective":
        out["recompute_modules"] = list(t.recompute_modules)
    out["seq_length"] = t.seq_length
    out["global_batch_size"] = t.global_batch_size
    out["bf16"] = True  # both precisions keep bf16 parameters and activations outside the FP8 GEMMs
    recipe = job.fp8_recipe
    out["fp8"] = None if recipe is None else fp8_format(recipe)
    out["fp8_recipe"] = recipe
    out["fp4"] = "e2m1" if t.fp4 else None  # Bridge's `bf16_with_nvfp4_mixed`; FP4 primary weights stay off
    out["fp4_recipe"] = "nvfp4"  # megatron-core's and Bridge's default, set or not
    start, end = t.bf16_edges
    edges = bool(start or end)
    out["first_last_layers_bf16"] = edges
    # the counts in effect (Bridge's MixedPrecisionConfig writes 0 and 0 over megatron-core's 1 and 1); the launch
    # lines spell them only with the switch on (`autotune.outputs.launch._ONLY_WITH`)
    out["num_layers_at_start_in_bf16"] = start
    out["num_layers_at_end_in_bf16"] = end
    # FP8 primary weights need the distributed optimizer (arguments.py: "--fp8-param-gather only supported with
    # distributed optimizer ...")
    out["fp8_param_gather"] = recipe is not None and t.fp8_params(layout.dist_opt)
    # Megatron-FSDP gathers MXFP8 weights from its own buffers: Megatron-LM and Bridge switch the reuse off with it
    # ("reuse_grad_buf_for_mxfp8_param_ag not implemented for Megatron FSDP", Bridge training/config.py)
    out["reuse_grad_buf_for_mxfp8_param_ag"] = bool(out["fp8_param_gather"]) and recipe == "mxfp8" and not layout.fsdp
    out["fp8_dot_product_attention"] = recipe is not None and t.fp8_dot_product_attention
    out["grad_reduce_in_fp32"] = t.grad_reduce_in_fp32
    out.update(optimizer_settings(t, layout))
    # bf16 moments are the precision-aware optimizer's, which megatron-core runs with the distributed optimizer
    # only ("--use-precision-aware-optimizer only supported with distributed optimizer", optimizer_config.py)
    out["use_precision_aware_optimizer"] = t.precision_aware(layout.dist_opt)
    out["exp_avg_dtype"] = out["exp_avg_sq_dtype"] = t.moments(layout.dist_opt)
    out["overlap_grad_reduce"] = t.overlap_grad_reduce or layout.fsdp  # Megatron-FSDP forces both on (F18)
    # "--overlap-param-gather only supported with distributed optimizer" and "Must use --overlap-param-gather with
    # --overlap-grad-reduce" (arguments.py L597-603)
    out["overlap_param_gather"] = (t.overlap_param_gather and t.adam_dist_opt(layout.dist_opt) and t.overlap_grad_reduce
                                   or layout.fsdp)
    out["use_megatron_fsdp"] = layout.fsdp
    out["init_model_with_meta_device"] = layout.fsdp
    if layout.fsdp:
        out["data_parallel_sharding_strategy"] = "optim_grads_params"
        out["fsdp_double_buffer"] = True
        out["ckpt_format"] = "fsdp_dtensor"
    # "Tensor parallel communication/GEMM overlap can happen only when sequence parallelism is enabled" (L915)
    out["tp_comm_overlap"] = t.tp_comm_overlap and layout.tp > 1 and layout.sp
    if moe:
        out["overlap_moe_expert_parallel_comm"] = layout.ep_overlap and layout.ep > 1
        # megatron-core: "overlap_moe_expert_parallel_comm must be enabled when enabling delay_wgrad_compute"
        out["delay_wgrad_compute"] = bool(out["overlap_moe_expert_parallel_comm"]) and t.delay_wgrad_compute
        dispatcher, backend = job.moe_dispatcher
        out["moe_token_dispatcher_type"] = dispatcher
        if backend is not None:  # a non-optional field in Bridge: set only with the flex dispatcher
            out["moe_flex_dispatcher_backend"] = backend
        out["moe_grouped_gemm"] = t.moe_grouped_gemm
        out["moe_permute_fusion"] = t.moe_permute_fusion
        out["moe_router_force_load_balancing"] = t.moe_router_force_load_balancing
        out["moe_expert_capacity_factor"] = t.moe_expert_capacity_factor
        out["moe_pad_expert_input_to_capacity"] = t.moe_pad_expert_input_to_capacity
    out["cross_entropy_loss_fusion"] = t.cross_entropy_fusion != "none"
    out["cross_entropy_fusion_impl"] = "native" if t.cross_entropy_fusion == "none" else t.cross_entropy_fusion
    graphs, modules = layout.cuda_graphs, list(job.cuda_graph_modules)
    new = t.megatron_core >= "0.17"
    # per-layer graphs capture the listed parts of each layer (0.19 `CudaGraphModule`, 0.16.1 `CudaGraphScope`),
    # empty: the whole layer; full-iteration graphs capture the whole step, with no modules in 0.19 and as local
    # graphs of the scope ["full_iteration"] in 0.16.1 (0.19 cuda_graph_config.py migrates that spelling).
    # 0.19 is told the modules always (a recipe's own would otherwise stay), 0.16.1 only when they matter.
    out["cuda_graph_impl"] = graphs if new or graphs != "full_iteration" else "local"
    if graphs == "full_iteration":
        out["cuda_graph_modules"] = [] if new else ["full_iteration"]
    elif graphs != "none" and (new or modules):
        out["cuda_graph_modules"] = modules
    out["use_te_rng_tracker"] = graphs != "none"
    out["check_for_nan_in_loss_and_grad"] = graphs != "full_iteration"
    if moe and new:
        # the static token buffers a captured MoE dispatcher needs (rules.full_iteration_moe_refused)
        stash = graphs == "full_iteration"
        out["moe_paged_stash"] = stash
        out["moe_expert_rank_capacity_factor"] = t.moe_rank_capacity_factor if stash else None
        if stash:  # non-optional floats: set only with the stash on
            out["moe_paged_stash_buffer_size_factor_cuda"] = PAGED_STASH_BUFFER_CUDA
            out["moe_paged_stash_buffer_size_factor_cpu"] = PAGED_STASH_BUFFER_CPU
        out["use_transformer_engine_op_fuser"] = stash and backend == "hybridep"
    return out


def architecture_settings(model: ModelSpec) -> dict[str, object]:
    """The model's architecture as megatron-core `TransformerConfig` / `MLATransformerConfig` keywords, in plain
    values (`activation_func` by name, "silu" or "gelu", for the caller to turn into torch's function): what
    Megatron-LM's `gpt_builders` and Megatron-Bridge's model providers set from a checkpoint's config, for the model
    fields autotune knows. The tests' megatron-core builds and Bridge configs start from it."""
    m = model
    out: dict[str, object] = dict(
        num_layers=m.num_layers, hidden_size=m.hidden_size, ffn_hidden_size=m.ffn_hidden_size,
        num_attention_heads=m.num_attention_heads, num_query_groups=m.query_groups, kv_channels=m.head_dim,
        gated_linear_unit=m.gated_linear_unit, activation_func=m.activation, normalization=m.normalization,
        add_bias_linear=m.add_bias_linear, add_qkv_bias=m.add_qkv_bias, qk_layernorm=m.qk_layernorm,
        softmax_type=m.softmax_type, mtp_num_layers=m.mtp_num_layers or None,
    )
    if m.sliding_window is not None:
        out.update(window_size=(m.sliding_window - 1, 0), window_attn_skip_freq=m.window_attn_skip_freq)
    if m.moe is not None:
        e = m.moe
        out.update(num_moe_experts=e.num_experts, moe_router_topk=e.topk, moe_ffn_hidden_size=e.expert_ffn_hidden_size,
                   moe_shared_expert_intermediate_size=e.shared_expert_ffn_hidden_size or None,
                   moe_shared_expert_gate=e.shared_expert_gate,
                   moe_layer_freq=[0] * e.first_dense_layers + [1] * m.num_moe_layers,
                   moe_router_score_function=e.score_function,
                   moe_router_pre_softmax=e.pre_softmax or (e.topk == 1 and e.score_function == "softmax"),
                   moe_router_num_groups=e.num_groups, moe_router_group_topk=e.group_topk,
                   moe_router_topk_scaling_factor=e.topk_scaling_factor, moe_router_enable_expert_bias=e.expert_bias)
    if m.mla is not None:
        a = m.mla
        out.update(multi_latent_attention=True, q_lora_rank=a.q_lora_rank, kv_lora_rank=a.kv_lora_rank,
                   qk_head_dim=a.qk_head_dim, qk_pos_emb_head_dim=a.qk_pos_emb_head_dim, v_head_dim=a.v_head_dim)
        del out["num_query_groups"], out["kv_channels"]
    return out


# the layout's settings that are TransformerConfig keywords (the parallel sizes of `PARALLEL_STATE`, SP, the split)
_LAYOUT_CONFIG = (*PARALLEL_STATE, "sequence_parallel", "num_layers_in_first_pipeline_stage",
                  "num_layers_in_last_pipeline_stage", "account_for_embedding_in_pipeline_split",
                  "account_for_loss_in_pipeline_split")


def transformer_config_kwargs(model: ModelSpec, layout: Layout, training: TrainingSpec | None = None,
                              ) -> dict[str, object]:
    """The one ModelSpec + Layout -> megatron-core `TransformerConfig` path: the model's architecture
    (`architecture_settings`, `activation_func` by name), the layout's parallel sizes, SP, uneven split and pipeline
    layout string, and its recompute (full as megatron's usual `uniform` over 1 layer; selective with the job's
    `recompute_modules` when `training` is given). Builders of megatron-core objects (the trainers, the parity
    tests) add their device settings (dtype, fusions, initialisation) to it."""
    out = architecture_settings(model)
    settings = layout_settings(layout)
    out.update({k: settings[k] for k in _LAYOUT_CONFIG})
    if layout.pipeline_layout is not None:
        out["pipeline_model_parallel_layout"] = layout.pipeline_layout
    if layout.recompute == "full":
        out.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    elif layout.recompute == "selective":
        out.update(recompute_granularity="selective")
        if training is not None:
            out.update(recompute_modules=list(training.recompute_modules))
    return out
