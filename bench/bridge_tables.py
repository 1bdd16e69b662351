"""Megatron-Bridge performance tables and the switches of the recipes behind them (bench/data/bridge_*.csv).

    .venv/bin/python bench/bridge_tables.py

`load_tables()` reads `bench/data/bridge_performance_tables.csv` (every pre-training row of NVIDIA's published
Megatron-Bridge performance tables, releases 25.09 to 26.08), `load_switches()` reads
`bench/data/bridge_recipe_switches.csv` (the performance recipe of each row and the switches it sets); both return
lists of dicts with the CSV's text values. `main()` prints the counts that `bench/data/bridge_performance_tables.md`
quotes and exits 1 unless every switches row joins exactly one table row. How the files were made:
`bench/data/bridge_performance_tables.md`.
"""

from __future__ import annotations

import csv
import sys
from collections import Counter, defaultdict
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
TABLES = DATA / "bridge_performance_tables.csv"
SWITCHES = DATA / "bridge_recipe_switches.csv"

# the columns that identify a published row (value_variant: '', 'main' or 'parenthesized' for rows printed 'a (b)')
KEY = ("release", "system", "model", "num_gpus", "precision", "global_batch_size", "micro_batch_size", "seq_length",
       "tp", "pp", "cp", "vp", "ep", "value_variant")


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def load_tables(path: Path = TABLES) -> list[dict[str, str]]:
    """The published pre-training rows, one dict per row (text values; empty where the table prints nothing)."""
    return _read(path)


def load_switches(path: Path = SWITCHES) -> list[dict[str, str]]:
    """One dict per published row: the recipe that produced it and the switches it sets (empty = release default)."""
    return _read(path)


def key(row: dict[str, str]) -> tuple[str, ...]:
    """The identifying columns of a row of either file."""
    return tuple(row[k] for k in KEY)


def _release_order(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release.split("."))


def _count(title: str, counter: Counter[str], order: list[str] | None = None) -> None:
    names = order if order is not None else sorted(counter)
    print(f"{title}: " + ", ".join(f"{n} {counter[n]}" for n in names if counter[n]))


def feature_counts(switches: list[dict[str, str]], tables: dict[tuple[str, ...], dict[str, str]]) -> Counter[str]:
    """How many traced rows (match exact or inferred) use each feature, read from the switch columns."""
    out: Counter[str] = Counter()
    for s in switches:
        if s["match"] == "untraced":
            continue
        t = tables[key(s)]
        on = {
            "full-iteration CUDA graphs": s["full_iteration_cuda_graph"] == "true",
            "TE-scoped CUDA graphs": s["cuda_graph_impl"] == "transformer_engine",
            "local per-layer CUDA graphs": s["enable_cuda_graph"] == "true"
            or s["cuda_graph_impl"] == "local" and s["full_iteration_cuda_graph"] != "true",
            "MoE paged stash": s["moe_paged_stash"] == "true",
            "HybridEP": s["moe_flex_dispatcher_backend"] == "hybridep" and s["moe_token_dispatcher_type"] == "flex",
            "DeepEP": s["moe_flex_dispatcher_backend"] == "deepep" and s["moe_token_dispatcher_type"] == "flex"
            or s["moe_enable_deepep"] == "true",
            "EP A2A overlap": s["overlap_moe_expert_parallel_comm"] == "true",
            "delay_wgrad_compute": s["delay_wgrad_compute"] == "true",
            "Megatron-FSDP": s["use_megatron_fsdp"] == "true",
            "CPU activation offload": s["cpu_offloading"] == "true",
            "fine-grained activation offload": s["fine_grained_activation_offloading"] == "true",
            "NVFP4": t["precision"] == "NVFP4" or s["compute_dtype"] == "nvfp4",
            "forced balanced router": s["moe_router_force_load_balancing"] == "true",
            "BF16 Adam moments": s["exp_avg_dtype"] == "bfloat16",
            "explicit pipeline layout": s["pipeline_model_parallel_layout"] not in ("", "null"),
            "TP comm overlap (recipe flag, TP > 1)": s["tp_comm_overlap"] == "true"
            and s["tensor_model_parallel_size"] not in ("", "1"),
        }
        out.update(name for name, used in on.items() if used)
    return out


def sweeps(tables: list[dict[str, str]]) -> dict[tuple[str, str, str, str], list[dict[str, str]]]:
    """Published same-job sweeps: one model + system + release + GPU count printed at several layouts or precisions."""
    groups: dict[tuple[str, str, str, str], list[dict[str, str]]] = defaultdict(list)
    for t in tables:
        model = t["model"].split(" (")[0]
        groups[(t["release"], t["system"], model, t["num_gpus"])].append(t)
    return {g: rows for g, rows in groups.items() if len(rows) > 1}


def layout(r: dict[str, str]) -> str:
    """A row's printed layout in one word list (TP PP CP VP EP MBS GBS, FSDP when on)."""
    fsdp = f" FSDP{r['fsdp']}" if r["fsdp"] not in ("", "0") else ""
    return (f"TP{r['tp']} PP{r['pp']} CP{r['cp']} VP{r['vp']} EP{r['ep']} MBS{r['micro_batch_size']}"
            f" GBS{r['global_batch_size']}{fsdp}")


def _sweep_order(item: tuple[tuple[str, str, str, str], list[dict[str, str]]]) -> tuple[object, ...]:
    (release, system, model, gpus), _ = item
    return (_release_order(release), system, model, int(gpus))


def main() -> int:
    tables = load_tables()
    switches = load_switches()
    by_key: dict[tuple[str, ...], dict[str, str]] = {}
    duplicate = [key(t) for t in tables if key(t) in by_key or by_key.setdefault(key(t), t) is not t]
    releases = sorted({t["release"] for t in tables}, key=_release_order)
    print(f"{len(tables)} published pre-training rows, {len(switches)} switches rows")
    _count("rows per release", Counter(t["release"] for t in tables), releases)
    _count("rows per GPU", Counter(t["gpu"] for t in tables), ["h100", "b200", "b300", "gb200", "gb300"])
    _count("dense / MoE / hybrid", Counter(t["arch"] for t in tables), ["dense", "moe", "hybrid"])
    _count("precision", Counter(t["precision"] or "(not printed)" for t in tables))
    _count("match", Counter(s["match"].split(":")[0] for s in switches), ["exact", "inferred", "untraced"])
    _count("recipe tag", Counter(s["recipe_tag"] or "(none)" for s in switches))
    exact = [s for s in switches if s["match"].startswith("exact")]
    _count("features, exact matches", feature_counts(exact, by_key))
    _count("features, exact + inferred", feature_counts(switches, by_key))
    groups = sweeps(tables)
    print(f"same-job sweeps (release, system, model, #GPUs with > 1 published row): {len(groups)}")
    for (release, system, model, gpus), rows in sorted(groups.items(), key=_sweep_order):
        layouts = {layout(r) for r in rows}
        kind = "layouts differ" if len(layouts) > 1 else "one layout"
        runs = "; ".join(f"{r['precision'] or r['value_variant']} {layout(r)} -> {r['tokens_per_s_per_gpu']}"
                         for r in rows)
        print(f"  {release} {system} {model} x{gpus} ({kind}): {runs}")
    problems = [f"duplicate table key {k}" for k in duplicate]
    joined: Counter[tuple[str, ...]] = Counter()
    for s in switches:
        if key(s) not in by_key:
            problems.append(f"switches row joins no table row: {key(s)}")
        joined[key(s)] += 1
    problems += [f"table row joined {n} times: {k}" for k, n in joined.items() if n > 1]
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
