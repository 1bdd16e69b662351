"""Ray Train workers that run short megatron-core jobs for candidate layouts (GPU, or CPU proxy on gloo)."""
