"""autotune: find the fastest valid Megatron-Core parallel layout for a model on a GPU cluster."""

__version__ = "0.1.0"
