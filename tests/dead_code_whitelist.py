"""What the dead-code check (`tests/test_dead_code.py`, vulture) cannot see used, each with who uses it.

Vulture reads this file as code that uses these names (`_.name`); it never runs. Nothing here is called by our
code by name: a framework, a library or a person calls it, and each line says which.
"""
# ruff: noqa
# mypy: ignore-errors

# the package's lazy attributes (PEP 562): `autotune.search`, `dir(autotune)`
_.__getattr__, _.__dir__
# the notebook API (README, examples/*.ipynb): people call these, not our code
_.plot_pareto, _.plot_time_breakdown, _.plot_memory_breakdown, _.plot_progress
# Ray Tune's Callback, Stopper and Searcher hooks (autotune.tuning.tune_glue, tune_policy): Tune calls them
_.on_trial_recover, _.on_trial_error, _.stop_all, _.save, _.restore, _.checkpoint_path
# Ray Train's backend hooks (trainers.worker_pool): Ray Train calls them
_.on_start, _.backend_cls
# fields of the typed decision (autotune.tuning.decision) written to best.json by name (`Decision.to_dict`) for the
# people and scripts that read it, never read as an attribute by our code
_.error_gib, _.memory_resolution, _.free_then_gib, _.mfu_at_suggested, _.in_space, _.better_free_gib
_.within_band, _.pick_tokens_per_s_per_gpu, _.dominated_ties, _.runner_up_margin
# Hugging Face config facts the model spec records (Gemma 2); no cost term depends on them yet
_.attn_logit_softcapping, _.final_logit_softcapping
# numpy's read-only flag, set on the arrays we hand out
_.writeable
# optuna's storage rows, filled in as its models define them (autotune.tuning.study_db)
_.user_attributes, _.system_attributes
# the type inside an optuna `cast(...)` string (autotune.tuning.space_sampler)
_.CategoricalChoiceType
# a signal handler's (signum, frame)
_.signum
# megatron-core's config hooks and layer spec, set for megatron-core to call (trainers.megatron_job, gpu_probe)
_.no_sync_func, _.finalize_model_grads_func, _.grad_scale_func, _.core_attention
# the CPU stand-ins for torch.cuda's stream and event API that megatron-core calls (trainers.cpu_patches)
_.wait_stream, _.wait_event, _.record_event, _.elapsed_time, _._get_cuda_rng_state, _.record_stream
# megatron-core's core-attention signature, which the CP stand-in keeps (trainers.cp_attention)
_.attention_type, _.attn_mask_type, _.layer_number, _.cp_comm_type, _.pg_collection, _.attention_mask
_.attention_bias, _.packed_seq_params
