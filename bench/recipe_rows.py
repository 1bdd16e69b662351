"""Every published Megatron-Bridge performance row as a (Job, Layout) at its recipe's own switches, or why not.

    .venv/bin/python bench/recipe_rows.py          # counts: rows scored, skipped by reason, per GPU and release

Source: `bench/data/bridge_performance_tables.csv` (the 286 pre-training rows of NVIDIA's Megatron-Bridge performance
tables, releases 25.09-26.08) joined with `bench/data/bridge_recipe_switches.csv` (the switches each row's recipe
set, read by running that release's recipe; `bench/data/bridge_performance_tables.md`). An empty switch cell is
the release's dataclass default (that file's section 6): off for every overlap, graph and MoE switch here.

What a row becomes:
- the layout is the table's (TP, PP, CP, VP, EP, MBS) with the recipe's ETP, SP, distributed optimizer, recompute,
  pipeline split (layout string, or embedding/loss accounting), CUDA graphs (`cuda_graph_impl`, 0.16-era
  `enable_cuda_graph`, the full-iteration scope) and EP all-to-all overlap;
- the training spec carries the recipe's precision (MXFP8, FP8 current scaling, blockwise, BF16), FP8 primary
  weights, optimizer dtypes, overlaps, dispatcher and flex backend, forced balance, capacity factors, graph
  modules, recompute modules, loss fusion, and the rule set of the megatron-core the release pins (0.16.1 up to
  26.02.01, Bridge v0.3.x; 0.19.2 after);
- "(w/o MTP)" rows drop DeepSeek-V3's MTP layer; "(tokendrop)" rows set the capacity factor the recipe sets;
- Kimi-K2's recipes train with `optimizer="dist_muon"`: the Muon optimizer, layer-wise distributed (`dist_opt`).

Hybrid Mamba rows: Nemotron-3 Nano, Super and 3.5 Lightning are scored (catalog `nemotron-3-nano-30b-a3b`,
`nemotron-3-super-120b-a12b`: LatentMoE and its repeated '*E' MTP layer; its NVFP4 recipe keeps the last 14
layers in BF16, `first_last_layers_bf16`, carried as `bf16_layers_at_end`; `nemotron-3.5-lightning-30b-a3b`:
Nano with Super's MTP); Ultra is skipped with its reason (`HYBRID_UNMODELLED`). Skipped, each with its reason:
Megatron-FSDP other than `optim_grads_params` over one DP group and fine-grained or optimizer offload (issue 20),
models outside the catalog, rows whose printed layout no recipe of the release
reproduces, rows megatron-core would refuse as printed, rows without tokens/s, and two rows whose figure belongs
to another precision (`MISPRINTS`). Where the printed micro-batch contradicts the exactly matching recipe (and the
printed GA), the recipe's is taken.
GB300 and B300 rows are `held_out`: reported, never fitted.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bridge_tables import key, load_switches, load_tables  # noqa: E402
from search_spaces.catalog import get_model  # noqa: E402
from search_spaces.gpus import build_cluster, get_gpu  # noqa: E402
from search_spaces.job import Job  # noqa: E402
from search_spaces.layout import Layout, parse_layout  # noqa: E402
from search_spaces.releases import release_rule_set  # noqa: E402
from search_spaces.rules import check  # noqa: E402
from search_spaces.training import TrainingSpec, training_spec  # noqa: E402

__all__ = ["RecipeRow", "HELD_OUT_GPUS", "load_recipe_rows", "MODELS"]

HELD_OUT_GPUS = ("gb300", "b300")  # Blackwell Ultra: how the model generalises to a GPU from its spec sheet
# table model name (before any " (variant)") -> catalog name
MODELS = {"LLAMA3_8B": "llama3-8b", "LLAMA3_70B": "llama3-70b", "LLAMA3.1_405B": "llama3.1-405b",
          "DeepSeekV3": "deepseek-v3", "Qwen3_30B_a3B": "qwen3-30b-a3b", "Qwen3_235B_a22B": "qwen3-235b-a22b",
          "GPT OSS 120B": "gpt-oss-120b", "Nemotron_3_Nano": "nemotron-3-nano-30b-a3b",
          "Nemotron_3_Super": "nemotron-3-super-120b-a12b",
          "Nemotron_3_5_Lightning": "nemotron-3.5-lightning-30b-a3b", "Kimi_K2": "kimi-k2"}
# hybrid rows autotune cannot score yet, with why (issue 23)
HYBRID_UNMODELLED = {
    "Nemotron_3_Ultra": "hybrid Mamba model Nemotron-3 Ultra: its config.json is not available offline (Bridge's "
                        "recipe reads the sizes from the Hugging Face checkpoint), so its sizes are unknown",
}
_LAYER_CHARS = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}
# Rows whose printed figure contradicts the same recipe in the neighbouring releases: (release, gpu, model,
# precision) -> why. 26.06.01 prints GPT-OSS-120B "MXFP8" at 18,304 (GB200) and 20,288 (GB300) tokens/s, the
# figures of 26.06's BF16 rows of the same layout (17,770 and 20,635), while 26.06 and 26.08 print the identical
# MXFP8 recipe (every switch equal) at 28,947 / 33,166 and 28,672 / 33,024: the BF16 run's figure under the MXFP8
# label (`bench/data/bridge_performance_tables.md` notes that 26.06.01 replaced 26.06's BF16 GPT-OSS rows).
MISPRINTS = {
    ("26.06.01", "gb200", "GPT OSS 120B", "MXFP8"): "printed figure is 26.06's BF16 run of the layout, not MXFP8's",
    ("26.06.01", "gb300", "GPT OSS 120B", "MXFP8"): "printed figure is 26.06's BF16 run of the layout, not MXFP8's",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class RecipeRow:
    """One published row: what it ran (job and layout, or None with `skip`) and what it measured."""

    release: str
    gpu: str
    model: str  # the table's name, variant included ("DeepSeekV3 (w/o MTP)")
    arch: str  # dense, moe, hybrid
    precision: str  # as printed (MXFP8, FP8, BF16, NVFP4, FP8-CS, ...; empty in 25.09)
    num_gpus: int
    published: float | None  # tokens/s per GPU
    job: Job | None
    layout: Layout | None
    skip: str  # why the row is not scored ("" when it is)
    match: str  # how its recipe was found: exact, inferred
    switches: dict[str, str]

    @property
    def held_out(self) -> bool:
        return self.gpu in HELD_OUT_GPUS

    @property
    def full_iteration(self) -> bool:
        return self.layout is not None and self.layout.cuda_graphs == "full_iteration"


def _on(value: str) -> bool:
    return value.strip().lower() == "true"


def _json(value: str) -> Any:
    value = value.strip()
    if value in ("", "null"):
        return None
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _skip_reason(t: dict[str, str], s: dict[str, str]) -> str:
    base = t["model"].split(" (")[0]
    reasons = []
    if base in HYBRID_UNMODELLED:
        reasons.append(HYBRID_UNMODELLED[base])
    elif base not in MODELS:
        reasons.append(f"{base} is not in the catalog")
    if s["match"].startswith("untraced"):
        reasons.append("no release recipe reproduces the printed layout")
    elif s["layout_differences"].strip():
        reasons.append(f"no recipe of its release reproduces the printed layout (the nearest differs: "
                       f"{s['layout_differences'].strip()})")
    if _on(s["use_megatron_fsdp"]) and (s["data_parallel_sharding_strategy"] not in ("", "optim_grads_params")
                                        or s["num_distributed_optimizer_instances"] not in ("", "null", "1")):
        reasons.append("Megatron-FSDP other than optim_grads_params over one DP group (HSDP; issue 20)")
    if _on(s["fine_grained_activation_offloading"]) or _on(s["optimizer_cpu_offload"]):
        reasons.append("fine-grained activation offload or optimizer CPU offload (issue 20)")
    if _on(s["cpu_offloading"]) and _on(s["cpu_offloading_weights"]):
        reasons.append("CPU offloading of weights (issue 20)")
    if not t["tokens_per_s_per_gpu"].strip():
        reasons.append("no tokens/s printed")
    misprint = MISPRINTS.get((t["release"], t["gpu"], t["model"], t["precision"]))
    if misprint:
        reasons.append(misprint)
    return "; ".join(reasons)


def _precision(s: dict[str, str]) -> tuple[str, str | None]:
    mixed = s["mixed_precision"]
    if "nvfp4" in mixed or s["compute_dtype"] == "nvfp4":
        return "fp4", None
    if mixed.startswith("bf16_mixed") and "fp8=" not in mixed:
        return "bf16", None
    recipe = s["fp8_recipe"] if s["fp8_recipe"] not in ("", "null") else "tensorwise"
    return "fp8", recipe


def _cuda_graphs(s: dict[str, str]) -> tuple[str, tuple[str, ...] | None]:
    """(Layout.cuda_graphs, TrainingSpec.cuda_graph_modules) of the recipe."""
    impl, scope = s["cuda_graph_impl"], _json(s["cuda_graph_scope"])
    if _on(s["full_iteration_cuda_graph"]) or impl == "full_iteration":
        return "full_iteration", None
    if impl in ("", "none"):
        if _on(s["enable_cuda_graph"]):  # before cuda_graph_impl: megatron-core's own per-layer graphs
            return "local", ()
        return "none", None
    modules = () if scope in (None, "full") or not isinstance(scope, list) else tuple(scope)
    return impl, modules


def _pipeline_layout(s: dict[str, str]) -> str | None:
    value = _json(s["pipeline_model_parallel_layout"])
    if value is None:
        return None
    if isinstance(value, list):
        return "|".join("".join(_LAYER_CHARS[name] for name in stage) for stage in value)
    return str(value)


def _layout(t: dict[str, str], s: dict[str, str], world: int, cuda_graphs: str, mtp: bool) -> Layout:
    # the recipe's micro-batch where the printed one contradicts it (25.09 Llama3-70B GB200: MBS 2 printed, GA 16
    # and the recipe say 1; `notes`)
    mbs = s["recipe_micro_batch_size"] or t["micro_batch_size"]
    text = [f"tp={t['tp']}", f"pp={t['pp']}", f"cp={t['cp']}", f"mbs={mbs}"]
    if t["ep"] not in ("", "n/a"):
        text.append(f"ep={t['ep']}")
    layout_string = _pipeline_layout(s)
    if layout_string is not None and not mtp:  # "(w/o MTP)": the recipe's layout less its MTP slot
        layout_string = layout_string.replace("m", "")
    if layout_string is not None:
        text.append(f"pipeline_layout={layout_string}")
    elif t["vp"] not in ("", "n/a", "1") and int(t["pp"]) > 1:
        text.append(f"vpp={t['vp']}")
    if s["expert_tensor_parallel_size"] not in ("", "null") and t["ep"] not in ("", "n/a"):
        text.append(f"etp={s['expert_tensor_parallel_size']}")
    if _on(s["account_for_embedding_in_pipeline_split"]) and layout_string is None and int(t["pp"]) > 1:
        text.append("embedding_loss_split=true")
    for name, field in (("num_layers_in_first_pipeline_stage", "first_stage_layers"),
                        ("num_layers_in_last_pipeline_stage", "last_stage_layers")):
        if s[name] not in ("", "null"):
            text.append(f"{field}={s[name]}")
    recompute = s["recompute_granularity"] if s["recompute_granularity"] in ("selective", "full") else "none"
    fsdp = _on(s["use_megatron_fsdp"])
    # Megatron-FSDP turns the distributed optimizer on itself; "dist_muon" is the layer-wise distributed Muon
    dist_opt = _on(s["use_distributed_optimizer"]) or fsdp or s["optimizer"] == "dist_muon"
    text += [f"sp={str(_on(s['sequence_parallel'])).lower()}", f"dist_opt={str(dist_opt).lower()}",
             f"recompute={recompute}", f"cuda_graphs={cuda_graphs}",
             f"ep_overlap={str(_on(s['overlap_moe_expert_parallel_comm'])).lower()}", f"fsdp={str(fsdp).lower()}"]
    if _on(s["cpu_offloading"]) and s["cpu_offloading_num_layers"] not in ("", "null", "0"):
        text.append(f"offload_layers={s['cpu_offloading_num_layers']}")
    return parse_layout(",".join(text), world_size=world)


def _training(t: dict[str, str], s: dict[str, str], moe: bool, modules: tuple[str, ...] | None) -> TrainingSpec:
    precision, recipe = _precision(s)
    values: dict[str, Any] = dict(
        seq_length=int(t["seq_length"]), global_batch_size=int(t["global_batch_size"]), precision=precision,
        fp8_recipe=recipe, fp8_param_gather=_on(s["fp8_param_gather"]),
        fp8_dot_product_attention=precision == "fp8" and _on(s["fp8_dot_product_attention"]),
        grad_reduce_in_fp32=_on(s["grad_reduce_in_fp32"]),
        optimizer_moments="bf16" if s["exp_avg_dtype"] == "bfloat16" else "fp32",
        precision_aware_optimizer=_on(s["use_precision_aware_optimizer"]),
        overlap_grad_reduce=_on(s["overlap_grad_reduce"]), overlap_param_gather=_on(s["overlap_param_gather"]),
        tp_comm_overlap=_on(s["tp_comm_overlap"]), delay_wgrad_compute=_on(s["delay_wgrad_compute"]),
        cross_entropy_fusion=("none" if not _on(s["cross_entropy_loss_fusion"])
                              else "native" if s["cross_entropy_fusion_impl"] == "native" else "te"),
        cuda_graph_modules=modules, optimizer="muon" if "muon" in s["optimizer"] else "adam",
        release=t["release"], megatron_core=release_rule_set(t["release"]),
    )
    granularity, names = s["recompute_granularity"], _json(s["recompute_modules"])
    if granularity == "selective" and names:
        values["recompute_modules"] = tuple(names)
    if granularity == "full" and s["recompute_num_layers"] not in ("", "null"):
        values["recompute_num_layers"] = int(s["recompute_num_layers"])
    if _on(s["first_last_layers_bf16"]):  # empty counts: Bridge MixedPrecisionConfig's default, 0
        values["bf16_layers_at_start"] = int(s["num_layers_at_start_in_bf16"] or 0)
        values["bf16_layers_at_end"] = int(s["num_layers_at_end_in_bf16"] or 0)
    if moe:
        dispatcher = s["moe_token_dispatcher_type"] or "alltoall"
        deepep = _on(s["moe_enable_deepep"])
        values.update(
            moe_token_dispatcher="flex" if deepep else dispatcher,
            moe_flex_backend=("deepep" if deepep else s["moe_flex_dispatcher_backend"] or None)
            if (deepep or dispatcher == "flex") else None,
            moe_router_force_load_balancing=_on(s["moe_router_force_load_balancing"]),
            moe_grouped_gemm=_on(s["moe_grouped_gemm"]), moe_permute_fusion=_on(s["moe_permute_fusion"]),
            moe_expert_capacity_factor=float(s["moe_expert_capacity_factor"])
            if s["moe_expert_capacity_factor"] not in ("", "null") else None,
            moe_pad_expert_input_to_capacity=_on(s["moe_pad_expert_input_to_capacity"]),
        )
        if s["moe_expert_rank_capacity_factor"] not in ("", "null"):
            values["moe_rank_capacity_factor"] = float(s["moe_expert_rank_capacity_factor"])
    return training_spec(**values)


def _row(t: dict[str, str], s: dict[str, str]) -> RecipeRow:
    base, variant = t["model"].split(" (")[0], t["model"]
    gpus, published = int(t["num_gpus"]), t["tokens_per_s_per_gpu"].strip()
    common: dict[str, Any] = dict(release=t["release"], gpu=t["gpu"], model=variant, arch=t["arch"],
                                  precision=t["precision"], num_gpus=gpus,
                                  published=float(published) if published else None,
                                  match=s["match"].split(":")[0], switches=s)
    skip = _skip_reason(t, s)
    if skip:
        return RecipeRow(job=None, layout=None, skip=skip, **common)
    model = get_model(MODELS[base])
    if "w/o MTP" in variant:
        model = replace(model, mtp_num_layers=0)
    cuda_graphs, modules = _cuda_graphs(s)
    gpn = get_gpu(t["gpu"]).gpus_per_node or 8
    job = Job(model=model, cluster=build_cluster(nodes=max(gpus // gpn, 1), gpus_per_node=min(gpn, gpus),
                                                 gpu=t["gpu"]),
              training=_training(t, s, model.is_moe, modules))
    layout = _layout(t, s, gpus, cuda_graphs, model.mtp_num_layers > 0)
    refused = [v for v in check(job, layout) if not v.stricter]
    if refused:  # megatron-core itself would not run what the table prints (a misprint)
        return RecipeRow(job=None, layout=None, skip="megatron-core refuses the printed layout: "
                         + "; ".join(v.message for v in refused), **common)
    return RecipeRow(job=job, layout=layout, skip="", **common)


def load_recipe_rows() -> list[RecipeRow]:
    """Every published row, in the tables' order: scored ones with their job and layout, the rest with `skip`."""
    switches = {key(s): s for s in load_switches()}
    return [_row(t, switches[key(t)]) for t in load_tables()]


def main() -> int:
    rows = load_recipe_rows()
    scored = [r for r in rows if not r.skip]
    print(f"{len(rows)} published rows: {len(scored)} scored ({sum(r.held_out for r in scored)} held out on "
          f"{'/'.join(HELD_OUT_GPUS)}), {len(rows) - len(scored)} skipped")
    for reason, n in Counter(r.skip for r in rows if r.skip).most_common():
        print(f"  skipped {n:3d}: {reason}")
    print("scored per GPU: " + ", ".join(f"{g} {n}" for g, n in sorted(Counter(r.gpu for r in scored).items())))
    print("scored per release: " + ", ".join(f"{g} {n}" for g, n in Counter(r.release for r in scored).items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
