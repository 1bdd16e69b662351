"""Write the index of Megatron-Bridge 0.6.2's pretraining recipes that the launch header names
(search_spaces/data/megatron_bridge_0.6.2_recipes.json), from the installed wheel's source.

    .venv/bin/python tests/data/make_bridge_recipe_index.py [--check]

Every top-level `def <name>_pretrain_<...>_config` of `megatron/bridge/perf_recipes/**` (NVIDIA's benchmark recipes)
and `megatron/bridge/recipes/**` (the library recipes), read with `ast` (importing them needs Transformer Engine),
with the file it is in, as `src/megatron/bridge/...` (its path in the Megatron-Bridge repository). `--check` compares
instead of writing (tests/test_launch_bridge.py runs it).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from importlib import metadata
from pathlib import Path

VERSION = "0.6.2"
_FOLDERS = ("megatron/bridge/perf_recipes/", "megatron/bridge/recipes/")
OUT = Path(__file__).resolve().parents[2] / "search_spaces" / "data" / f"megatron_bridge_{VERSION}_recipes.json"


def index() -> dict[str, object]:
    dist = metadata.distribution("megatron-bridge")
    if dist.version != VERSION:
        raise SystemExit(f"megatron-bridge {dist.version} is installed; this index is for {VERSION}")
    recipes: dict[str, str] = {}
    for file in sorted(dist.files or (), key=str):
        path = str(file)
        if not path.endswith(".py") or not path.startswith(_FOLDERS):
            continue
        tree = ast.parse(Path(str(dist.locate_file(file))).read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and "_pretrain_" in node.name and node.name.endswith("_config"):
                recipes.setdefault(node.name, f"src/{path}")
    return {"megatron_bridge": VERSION, "source": "function definitions in the megatron-bridge wheel from PyPI",
            "recipes": dict(sorted(recipes.items()))}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true", help="compare with the committed file instead of writing")
    args = parser.parse_args()
    text = json.dumps(index(), indent=1) + "\n"
    if args.check:
        if OUT.read_text() != text:
            print(f"{OUT} differs from the installed megatron-bridge {VERSION}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
