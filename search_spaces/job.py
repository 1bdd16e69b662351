"""A training job: the model, the cluster and the training settings, independent of the layout."""

from __future__ import annotations

from dataclasses import dataclass, replace

from search_spaces.cluster import ClusterSpec
from search_spaces.gpus import list_gpus
from search_spaces.model import ModelSpec
from search_spaces.training import TrainingSpec, default_cuda_graph_modules

__all__ = ["Job"]


def _blackwell() -> str:
    """The catalog's Blackwell GPUs, as the messages name them (`B200, GB200, B300, GB300`)."""
    return ", ".join(g.name.upper() for g in list_gpus() if g.arch == "blackwell")


@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec

    def __post_init__(self) -> None:
        """The precision recipe must run on the GPU (Megatron-Bridge `training/mixed_precision.py`:
        MXFP8 is Blackwell only, blockwise (sub-channel) FP8 Hopper only; A100 has no FP8 at all). Muon's step is
        costed for GPT models only (`autotune.cost.muon`)."""
        gpu, t = self.cluster.gpu, self.training
        if t.muon and self.model.is_hybrid:
            raise ValueError(f"--optimizer muon: the Muon step of a hybrid Mamba model ({self.model.name}) is not "
                             "modelled (its Mamba weights' shapes are not enumerated); use --optimizer adam.")
        if t.fp4 and gpu.fp4_flops is None:
            raise ValueError(f"NVFP4 training (--precision fp4) needs FP4 tensor cores, a Blackwell GPU "
                             f"({_blackwell()}), but the cluster has {gpu.name} ({gpu.arch}); use --precision fp8 or "
                             f"bf16.")
        if not t.fp8:
            return
        if gpu.fp8_flops is None:
            raise ValueError(f"GPU {gpu.name} has no FP8 tensor cores; use --precision bf16.")
        recipe = self.fp8_recipe
        if recipe == "mxfp8" and gpu.arch != "blackwell":
            raise ValueError(f"fp8_recipe mxfp8 needs a Blackwell GPU ({_blackwell()}), but the cluster has "
                             f"{gpu.name} ({gpu.arch}); use tensorwise or delayed.")
        if recipe == "blockwise" and gpu.arch != "hopper":
            raise ValueError(f"fp8_recipe blockwise runs on Hopper GPUs only, but the cluster has {gpu.name} "
                             f"({gpu.arch}); use mxfp8 or tensorwise.")

    @property
    def mtp_in_bf16(self) -> bool:
        """Whether the multi-token-prediction layers run in BF16 in this low-precision run: in NVFP4, which
        megatron-core never applies to them ("currently ignoring FP4 in MTP layers",
        `transformer/multi_token_prediction.py` 0.19.2 :1180-1188, 0.16.1 :781)."""
        return self.training.fp4 and self.model.mtp_num_layers > 0

    @property
    def has_bf16_layers(self) -> bool:
        """Whether some layers of this low-precision run stay in BF16: the training spec's edge layers
        (`TrainingSpec.bf16_edges`), or the MTP layers (`mtp_in_bf16`)."""
        return self.training.bf16_edges != (0, 0) or self.mtp_in_bf16

    def in_bf16(self) -> Job:
        """This job with every layer in BF16: what a BF16 layer of a low-precision run costs."""
        t = replace(self.training, precision="bf16", fp8_recipe=None, fp8_dot_product_attention=False,
                    bf16_layers_at_start=0, bf16_layers_at_end=0)
        return replace(self, training=t)

    @property
    def world_size(self) -> int:
        return self.cluster.world_size

    @property
    def gemm_recipe(self) -> str | None:
        """The low-precision GEMM recipe the cost models follow: the FP8 recipe in effect, "nvfp4" for FP4, None for
        bf16."""
        return "nvfp4" if self.training.fp4 else self.fp8_recipe

    @property
    def fp8_recipe(self) -> str | None:
        """The FP8 scaling recipe in effect: the training spec's, else the GPU's own (tensorwise current scaling
        on Hopper, MXFP8 on Blackwell: what Megatron-Bridge's published FP8 runs use); None for bf16."""
        if not self.training.fp8:
            return None
        if self.training.fp8_recipe is not None:
            return self.training.fp8_recipe
        return "mxfp8" if self.cluster.gpu.arch == "blackwell" else "tensorwise"

    @property
    def moe_dispatcher(self) -> tuple[str, str | None]:
        """(megatron-core `moe_token_dispatcher_type`, `moe_flex_dispatcher_backend` or None): the training spec's,
        else the GPU's own as Megatron-Bridge 0.6's perf recipes run it: the flex dispatcher with HybridEP on
        Blackwell, alltoall elsewhere. A flex dispatcher without a named backend uses HybridEP on Blackwell and
        DeepEP (megatron-core's default backend) elsewhere."""
        t = self.training
        blackwell = self.cluster.gpu.arch == "blackwell"
        dispatcher = t.moe_token_dispatcher or ("flex" if blackwell else "alltoall")
        if dispatcher != "flex":
            return dispatcher, None
        return dispatcher, t.moe_flex_backend or ("hybridep" if blackwell else "deepep")

    @property
    def cuda_graph_modules(self) -> tuple[str, ...]:
        """What per-layer CUDA graphs capture in each layer: the training spec's, else Megatron-Bridge 0.6's
        (`attn`, `moe_router`, `moe_preprocess` for MoE models, `perf_recipes/*/common.py`; the whole layer, an
        empty list, for dense ones)."""
        modules = self.training.cuda_graph_modules
        return modules if modules is not None else default_cuda_graph_modules(self.model.is_moe, self.model.is_hybrid)
