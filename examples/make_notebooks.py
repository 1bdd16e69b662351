"""Writes the example notebooks (without outputs) from the cells below: `python examples/make_notebooks.py`.

Edit here, regenerate, commit both. `tests/test_notebooks.py` runs the .ipynb files top to bottom.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).parent

SEARCH_MIXTRAL = [
    new_markdown_cell(
        "# Search Mixtral-8x7B on 4 nodes\n\n"
        "The same search as `python -m autotune --model mixtral --nodes 4`, from Python: run it, look at the "
        "winner and the Pareto front, see where the time goes, then ask what-if questions (a longer sequence, "
        "more or fewer nodes). Everything runs on the default analytic backend, on a CPU, in seconds."
    ),
    new_code_cell(
        "%matplotlib inline\n"
        "import autotune\n"
        "from autotune import clusters, models\n\n"
        "model = models.get(\"mixtral\")\n"
        "cluster = clusters.build(nodes=4, gpu=\"h100\")\n"
        "print(model.name, f\"{model.total_params / 1e9:.1f}B parameters,\", f\"{model.active_params / 1e9:.1f}B active\")\n"
        "print(cluster.world_size, \"GPUs of\", cluster.gpu.name, f\"({cluster.gpu.memory_gib:.0f} GiB)\")"
    ),
    new_markdown_cell("## Search\n\nEvery valid layout is scored by the cost models (no Ray); the 32 best are kept as trials. "
                      "`result.decision` says how sure the pick is and which layouts it is tied with."),
    new_code_cell(
        "result = autotune.search(model, cluster=cluster, trials=32, seed=0)\n"
        "assert result.best is not None, \"no feasible layout\"\n"
        "print(result.decision.confidence, \"-\", result.decision.reason)\n"
        "result"
    ),
    new_code_cell(
        "best = result.best_measurement\n"
        "print(\"best layout:\", result.best)\n"
        "print(f\"{best.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, {best.memory_gib:.1f} GiB per GPU, MFU {best.mfu:.1%}\")"
    ),
    new_markdown_cell("## Every trial, and the fastest layouts\n\n`result.trials` is a pandas DataFrame: filter, sort and group it as usual."),
    new_code_cell(
        "columns = [\"layout\", \"status\", \"tokens_per_s_per_gpu\", \"memory_gib\", \"step_time_s\", \"mfu\"]\n"
        "result.top(5)[columns]"
    ),
    new_code_cell("result.trials.groupby(\"status\").size()"),
    new_markdown_cell(
        "## Pareto front\n\nThroughput against memory: every feasible layout as a dot, infeasible ones as crosses, "
        "the usable memory (the GPU's minus the search's headroom) as the orange line and the GPU's memory as the "
        "dashed line. Layouts on the front trade memory for speed; anything below it is beaten."
    ),
    new_code_cell("result.plot_pareto()"),
    new_code_cell("result.pareto[columns]"),
    new_markdown_cell("## Where the time goes\n\nStep time of the top layouts, split into compute, communication per dimension, the pipeline bubble and the optimizer."),
    new_code_cell("result.plot_time_breakdown(k=5)"),
    new_code_cell("result.plot_memory_breakdown(k=5)"),
    new_code_cell("result.plot_progress()"),
    new_markdown_cell("## Launch the winner\n\nThe same layout as Megatron-Bridge overrides and as Megatron-LM arguments, "
                      "with every switch the prediction assumes (overlap, dispatcher, precision, recompute)."),
    new_code_cell(
        "print(result.launch[\"megatron_bridge\"])\n"
        "print()\n"
        "print(result.launch[\"megatron_lm\"])"
    ),
    new_markdown_cell(
        "## What if?\n\nLonger sequences need more activation memory (context parallelism starts to pay); "
        "more nodes change the balance between pipeline and data parallelism. The first row is the search above; each other row is a fresh search."
    ),
    new_code_cell(
        "import pandas as pd\n\n"
        "m = result.best_measurement\n"
        "rows = [{\"seq_length\": 4096, \"nodes\": 4, \"best layout\": str(result.best),\n"
        "         \"tokens/s per GPU\": round(m.tokens_per_s_per_gpu), \"GiB per GPU\": round(m.memory_gib, 1)}]\n"
        "for seq_length, nodes in [(16384, 4), (4096, 8)]:\n"
        "    r = autotune.search(model, nodes=nodes, gpu=\"h100\", seq_length=seq_length, trials=16, seed=0)\n"
        "    m = r.best_measurement\n"
        "    rows.append({\"seq_length\": seq_length, \"nodes\": nodes, \"best layout\": str(r.best),\n"
        "                 \"tokens/s per GPU\": None if m is None else round(m.tokens_per_s_per_gpu),\n"
        "                 \"GiB per GPU\": None if m is None else round(m.memory_gib, 1)})\n"
        "pd.DataFrame(rows)"
    ),
    new_markdown_cell("## One layout by hand\n\n`autotune.estimate` prices a single layout without searching, with its breakdowns."),
    new_code_cell(
        "m = autotune.estimate(model, \"tp=2,pp=2,ep=8,sp=true,dist_opt=true\", cluster=cluster)\n"
        "print(m.status, m.reason)\n"
        "{k: round(v, 4) for k, v in m.time.items()}"
    ),
    new_markdown_cell("## Report\n\nThe self-contained HTML report (tables, plots and the launch lines with copy buttons; no server "
                      "needed). `autotune.search` already wrote one, with trials.csv and best.json, into its own "
                      "temporary folder (`result.output_dir`; give `output_dir=` to choose it): nothing lands in the "
                      "notebook's folder."),
    new_code_cell(
        "import tempfile\n\n"
        "path = result.write_report(tempfile.mkdtemp(prefix=\"autotune-report-\"))\n"
        "print(\"open in a browser:\", path)\n"
        "print(\"the search's own output folder:\", result.output_dir)"
    ),
]

COMPARE_RECIPE = [
    new_markdown_cell(
        "# The tuner's choice against a published recipe\n\n"
        "NVIDIA's NeMo Framework Launcher trains Mixtral-8x7B on H100 with TP=1, PP=4, VPP=8, EP=8, no sequence "
        "parallelism and the distributed optimizer (`examples/training/mixtral/h100/mixtral_8x7b_bf16.sh` in "
        "NVIDIA/NeMo-Framework-Launcher). How does that layout compare with what the tuner picks for the same "
        "job on 4 nodes of 8 H100s, by the analytic model?"
    ),
    new_code_cell(
        "%matplotlib inline\n"
        "import autotune\n"
        "from autotune import clusters, launch, models, plots\n\n"
        "job = autotune.make_job(models.get(\"mixtral\"), cluster=clusters.build(nodes=4, gpu=\"h100\"),\n"
        "                        seq_length=4096, global_batch_size=256)\n"
        "recipe_layout = \"tp=1,pp=4,vpp=8,ep=8,etp=1,mbs=1,sp=false,dist_opt=true\"  # etp=1: ETP = TP, megatron-core's default\n"
        "headroom_gib = 0.0  # the search's default: the memory model keeps its own allowance"
    ),
    new_markdown_cell("## The recipe's layout, priced by the analytic model"),
    new_code_cell(
        "recipe = autotune.estimate(job, recipe_layout, headroom_gib=headroom_gib)\n"
        "print(recipe.layout, \"->\", recipe.status, recipe.reason)\n"
        "print(f\"{recipe.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, {recipe.memory_gib:.1f} GiB per GPU\")"
    ),
    new_markdown_cell("## The tuner's choice\n\nThe whole space scored by the model, knowing nothing of the recipe "
                      "(the 32 best layouts kept as trials)."),
    new_code_cell(
        "result = autotune.search(job, trials=32, seed=0)\n"
        "tuned = result.best_measurement\n"
        "assert tuned is not None, \"no feasible layout\"\n"
        "print(tuned.layout)\n"
        "print(f\"{tuned.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, {tuned.memory_gib:.1f} GiB per GPU\")"
    ),
    new_markdown_cell("## Side by side\n\nThe same table and plots as a search's, built from just these two measurements."),
    new_code_cell(
        "both = plots.trials_frame([recipe, tuned])\n"
        "both.insert(0, \"who\", [\"recipe\", \"tuner\"])\n"
        "ratio = tuned.tokens_per_s_per_gpu / recipe.tokens_per_s_per_gpu\n"
        "faster = result.trials.query(\"feasible\")[\"tokens_per_s_per_gpu\"] > recipe.tokens_per_s_per_gpu\n"
        "print(f\"tuner / recipe throughput: {ratio:.2f}x; {int(faster.sum())} of the \"\n"
        "      f\"{int(result.trials['feasible'].sum())} feasible trials beat the recipe\")\n"
        "both[[\"who\", \"layout\", \"tokens_per_s_per_gpu\", \"memory_gib\", \"step_time_s\", \"mfu\"]]"
    ),
    new_code_cell("plots.time_breakdown(both, k=2)"),
    new_code_cell("plots.memory_breakdown(both, k=2, capacity_gib=job.cluster.gpu.memory_gib)"),
    new_markdown_cell(
        "## Where the recipe sits among all trials\n\n"
        "The recipe's layout as a point on the search's Pareto plot: below the front means some layout of the "
        "space is both faster and lighter by the model."
    ),
    new_code_cell(
        "fig = result.plot_pareto()\n"
        "ax = fig.axes[0]\n"
        "ax.scatter([recipe.memory_gib], [recipe.tokens_per_s_per_gpu], marker=\"D\", s=80, color=\"purple\", label=\"recipe\")\n"
        "ax.legend(fontsize=\"small\")\n"
        "fig"
    ),
    new_markdown_cell(
        "## The recipe beside the search\n\n"
        "`compare=` (the CLI's `--layout`) evaluates the recipe beside the search, so the ranking always includes "
        "it. The winner is then at least as fast as the recipe, up to the model's 2% tie tolerance."
    ),
    new_code_cell(
        "seeded = autotune.search(job, trials=16, seed=0, compare=[recipe_layout])\n"
        "best = seeded.best_measurement\n"
        "assert best.tokens_per_s_per_gpu >= recipe.tokens_per_s_per_gpu * (1 - 0.02)\n"
        "print(best.layout, f\"{best.tokens_per_s_per_gpu:,.0f} tokens/s per GPU\")\n"
        "seeded.top(5)[[\"origin\", \"layout\", \"tokens_per_s_per_gpu\", \"memory_gib\"]]"
    ),
    new_markdown_cell("## Launch forms"),
    new_code_cell(
        "print(\"recipe:       \", launch.launch_forms(job, recipe.layout)[\"megatron_lm\"])\n"
        "print(\"tuner's pick: \", launch.launch_forms(job, tuned.layout)[\"megatron_lm\"])\n"
        "print(\"seeded search:\", launch.launch_forms(job, best.layout)[\"megatron_lm\"])"
    ),
]


def write(name: str, cells: list) -> Path:
    nb = new_notebook(cells=cells)
    for i, cell in enumerate(nb.cells):  # stable ids: regenerating changes only what was edited
        cell.id = f"{Path(name).stem}-{i}"
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    path = HERE / name
    nbformat.validate(nb)
    nbformat.write(nb, path)
    return path


if __name__ == "__main__":
    for name, cells in (("search_mixtral.ipynb", SEARCH_MIXTRAL), ("compare_recipe.ipynb", COMPARE_RECIPE)):
        print(write(name, cells))
