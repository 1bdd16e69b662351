"""Megatron-Bridge 0.6.2's pretraining recipes, and the one a job's launch line starts from.

The index (`data/megatron_bridge_0.6.2_recipes.json`, written from the wheel by
tests/data/make_bridge_recipe_index.py) holds every `<model>_pretrain_<N>gpu_<gpu>_<precision>[_<variant>]_config`
function of Bridge's `perf_recipes/` (NVIDIA's benchmark recipes) and `recipes/` (the library), with its file.
Bridge names a model by its Hugging Face name in lower case with `-` as `_` and no dots (`llama3.1-405b` ->
`llama31_405b`, `qwen3-30b-a3b` -> `qwen3_30b_a3b`), a GPU by its product (`h100`, `b200`, `gb200`, `gb300`), and
a precision by Bridge's preset (`bf16`, `fp8cs` tensorwise current scaling, `fp8mx` MXFP8, `fp8sc` blockwise
sub-channel, `nvfp4`). The overrides set every switch the prediction assumes, so any recipe of the model is a
valid base; the closest one keeps NVIDIA's tuned environment (CUDA_DEVICE_MAX_CONNECTIONS, NCCL settings).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from search_spaces.job import Job

__all__ = ["BridgeRecipe", "BRIDGE_RECIPES_VERSION", "bridge_recipe", "recipe_names", "model_prefix"]

BRIDGE_RECIPES_VERSION = "0.6.2"
_INDEX = Path(__file__).parent / "data" / f"megatron_bridge_{BRIDGE_RECIPES_VERSION}_recipes.json"
_PRECISION = {"bf16": "bf16", "tensorwise": "fp8cs", "mxfp8": "fp8mx", "blockwise": "fp8sc"}
_NAME = re.compile(r"(?P<model>[a-z0-9_]+?)_pretrain_(?P<gpus>\d+)gpu_(?P<gpu>[a-z0-9]+)_(?P<precision>[a-z0-9]+)"
                   r"(?P<variant>_[a-z0-9_]+)?_config")


@dataclass(frozen=True, kw_only=True, slots=True)
class BridgeRecipe:
    function: str  # `run_recipe.py --recipe <function>`
    file: str  # where it is defined in the Megatron-Bridge repository
    exact: bool  # the job's own model, GPU, precision and GPU count (else the closest of the model's recipes)
    gpus: int


@lru_cache(maxsize=1)
def recipe_names() -> dict[str, str]:
    """Every pretraining recipe of the index: function name -> file."""
    return json.loads(_INDEX.read_text(encoding="utf-8"))["recipes"]


# catalog names Bridge spells otherwise: its Nemotron recipes (`perf_recipes/nemotronh/`, `recipes/nemotronh/`)
_BRIDGE_NAMES = {"nemotron-3-nano-30b-a3b": "nemotron_3_nano", "nemotron-3-super-120b-a12b": "nemotron_3_super",
                 "nemotron-3.5-lightning-30b-a3b": "nemotron_3_5_lightning",
                 "nemotron-h-8b": "nemotronh_8b",
                 "nemotron-h-47b": "nemotronh_47b", "nemotron-h-56b": "nemotronh_56b"}


def model_prefix(model_name: str) -> str:
    """Bridge's name of a model in recipe names (`llama3.1-405b` -> `llama31_405b`, `nemotron-h-56b` ->
    `nemotronh_56b`)."""
    return _BRIDGE_NAMES.get(model_name) or model_name.lower().replace(".", "").replace("-", "_")


def bridge_recipe(job: Job) -> BridgeRecipe | None:
    """The recipe to start the job's launch line from: NVIDIA's for this model, GPU, precision and GPU count if
    there is one; else the model's recipe closest to it (same GPU and precision first, then the nearest GPU
    count, benchmark recipes before library ones, no variant before a variant); None when Bridge has no
    pretraining recipe for the model."""
    prefix = model_prefix(job.model.name)
    gpu = job.cluster.gpu.name.split("-")[0]
    precision = _PRECISION.get(job.fp8_recipe or "bf16")
    candidates = []
    for function, file in recipe_names().items():
        match = _NAME.fullmatch(function)
        if match is None or match["model"] != prefix:
            continue
        gpus = int(match["gpus"])
        same = (match["gpu"] == gpu) + (match["precision"] == precision)
        rank = (-same, abs(gpus - job.world_size), "/perf_recipes/" not in file, bool(match["variant"]), function)
        exact = same == 2 and gpus == job.world_size and not match["variant"]
        candidates.append((rank, BridgeRecipe(function=function, file=file, exact=exact, gpus=gpus)))
    return min(candidates, key=lambda c: c[0])[1] if candidates else None
