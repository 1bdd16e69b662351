"""Write the two parser references the launch-line tests check against (tests/test_launch_parsers.py).

    python tests/data/make_launch_references.py --megatron-lm /path/to/Megatron-LM \
        [--bridge-wheel megatron_bridge-0.3.1-py3-none-any.whl] [--check]

- `megatron_lm_core_v0.16.1_arguments.json`: every argument of Megatron-LM's real parser. The script builds it by
  running `add_megatron_arguments` from `megatron/training/arguments.py` at tag core_v0.16.1 (read with `git show`
  from a Megatron-LM clone) on top of the installed megatron-core 0.16.1; the four helpers it imports from
  `megatron.training.utils` (the training loop's module) are replaced by no-ops, since building the parser only
  references them. Each action: flags, dest, action class, nargs, choices, type, default.
- `megatron_bridge_v0.3.1_config.json`: the dataclass fields of Megatron-Bridge v0.3.1's `ConfigContainer` groups
  (what `scripts/training/run_recipe.py` turns into its Hydra tree), read with `ast` from the wheel
  (`pip download megatron-bridge==0.3.1 --no-deps`; importing it needs Transformer Engine, which has no CPU
  build), with the megatron-core base classes' fields from the installed megatron-core 0.16.1 (the version
  Bridge v0.3.1 pins), plus the registered mixed-precision recipe names.

Both files record where they came from (tag, commit, file hashes). `--check` compares instead of writing.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import hashlib
import importlib
import importlib.util
import json
import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path

HERE = Path(__file__).parent
LM_JSON = HERE / "megatron_lm_core_v0.16.1_arguments.json"
BRIDGE_JSON = HERE / "megatron_bridge_v0.3.1_config.json"
LM_TAG = "core_v0.16.1"
LM_FILES = ("arguments.py", "argument_utils.py", "training_config.py", "common_config.py", "resilience_config.py")
BRIDGE_VERSION = "0.3.1"
# ConfigContainer group -> the class a GPT pretraining recipe puts there (the union type's first member)
BRIDGE_MODULE = "megatron/bridge/training/config.py"


# --- Megatron-LM ----------------------------------------------------------------------------------------------
def _git_show(repo: Path, path: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "show", f"{LM_TAG}:megatron/training/{path}"], check=True,
                          capture_output=True, text=True).stdout


def megatron_lm_reference(repo: Path) -> dict:
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", f"{LM_TAG}^{{commit}}"], check=True,
                            capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        sources = {name: _git_show(repo, name) for name in LM_FILES}
        for name, text in sources.items():
            (Path(tmp) / name).write_text(text)
        utils = types.ModuleType("megatron.training.utils")
        utils.get_device_arch_version = lambda: 9  # type: ignore[attr-defined]
        utils.update_use_dist_ckpt = lambda args: None  # type: ignore[attr-defined]
        utils.print_rank_0 = utils.warn_rank_0 = lambda *a, **k: None  # type: ignore[attr-defined]
        utils.is_rank0 = lambda: True  # type: ignore[attr-defined]
        package = types.ModuleType("megatron.training")
        package.__path__ = []
        sys.modules.update({"megatron.training": package, "megatron.training.utils": utils})
        modules = {}
        for name in ("argument_utils", "training_config", "common_config", "resilience_config", "arguments"):
            spec = importlib.util.spec_from_file_location(f"megatron.training.{name}", Path(tmp) / f"{name}.py")
            module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
            sys.modules[spec.name] = module  # type: ignore[union-attr]
            spec.loader.exec_module(module)  # type: ignore[union-attr]
            modules[name] = module
        parser = argparse.ArgumentParser(allow_abbrev=False)
        modules["arguments"].add_megatron_arguments(parser)
    actions = []
    for a in parser._actions:
        if not a.option_strings or isinstance(a, argparse._HelpAction):
            continue
        actions.append({"flags": list(a.option_strings), "dest": a.dest, "action": type(a).__name__,
                        "nargs": a.nargs, "choices": None if a.choices is None else [str(c) for c in a.choices],
                        "type": getattr(a.type, "__name__", None if a.type is None else "callable"),
                        "default": _jsonable(a.default)})
    return {"source": {"repository": "https://github.com/NVIDIA/Megatron-LM", "tag": LM_TAG, "commit": commit,
                       "sha256": {f"megatron/training/{n}": hashlib.sha256(t.encode()).hexdigest()
                                  for n, t in sources.items()}},
            "actions": actions}


def _jsonable(value: object) -> object:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return repr(value)


# --- Megatron-Bridge ------------------------------------------------------------------------------------------
class _Source:
    """The wheel's Python files, parsed on demand."""

    def __init__(self, wheel: Path) -> None:
        self.zip = zipfile.ZipFile(wheel)
        self.trees: dict[str, ast.Module] = {}

    def module(self, dotted: str) -> ast.Module:
        tree = self.find(dotted)
        if tree is None:
            raise LookupError(f"{dotted}: module not in the wheel")
        return tree

    def find(self, dotted: str) -> ast.Module | None:
        for path in (dotted.replace(".", "/") + ".py", dotted.replace(".", "/") + "/__init__.py"):
            if path in self.zip.namelist():
                if path not in self.trees:
                    self.trees[path] = ast.parse(self.zip.read(path).decode())
                return self.trees[path]
        return None


def _imports(tree: ast.Module, module: str) -> dict[str, str]:
    """Local name -> dotted target, from the module's `from X import Y as Z` lines."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            base = node.module if node.level == 0 else module.rsplit(".", node.level)[0] + "." + node.module
            for alias in node.names:
                out[alias.asname or alias.name] = f"{base}.{alias.name}"
    return out


def _type_text(t: object) -> str:
    """An annotation as source text: `int`, `Optional[int]`, `torch.dtype`."""
    if isinstance(t, str):
        return t
    if isinstance(t, type):
        return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    return str(t).replace("typing.", "").replace("NoneType", "None")


def _class_fields(src: _Source, dotted: str) -> tuple[dict[str, str], list[str]]:
    """Dataclass fields (name -> annotation text) of a class, bases first, and the chain of class names."""
    module, _, name = dotted.rpartition(".")
    if module.startswith("megatron.core"):  # installed megatron-core 0.16.1: the real dataclass
        cls = getattr(importlib.import_module(module), name)
        return ({f.name: _type_text(f.type) for f in dataclasses.fields(cls)}, [dotted])
    tree = src.module(module)
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if node is None:  # re-exported from a package __init__
        return _class_fields(src, _imports(tree, module)[name])
    imports = _imports(tree, module)
    fields: dict[str, str] = {}
    chain = [dotted]
    for base in reversed(node.bases):  # MRO order: the last base's fields come first
        base_name = ast.unparse(base).split("[")[0]
        target = imports.get(base_name) or (f"{module}.{base_name}" if any(
            isinstance(n, ast.ClassDef) and n.name == base_name for n in tree.body) else None)
        if target is None or base_name in ("ABC", "Generic", "Container"):
            continue
        try:
            base_fields, base_chain = _class_fields(src, target)
        except (LookupError, AttributeError, KeyError):
            continue  # a mixin without dataclass fields (ModelProviderMixin, ...)
        fields.update(base_fields)
        chain += base_chain
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            if not ast.unparse(stmt.annotation).startswith("ClassVar"):
                fields[stmt.target.id] = ast.unparse(stmt.annotation)
    return fields, chain


def bridge_reference(wheel: Path) -> dict:
    src = _Source(wheel)
    config = src.module("megatron.bridge.training.config")
    container = next(n for n in config.body if isinstance(n, ast.ClassDef) and n.name == "ConfigContainer")
    imports = _imports(config, "megatron.bridge.training.config")
    groups: dict[str, dict] = {}
    for stmt in container.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        annotation = ast.unparse(stmt.annotation)
        # the class a GPT pretraining recipe puts there: the first class of the annotation that is a dataclass
        names = [n.id for n in sorted((n for n in ast.walk(stmt.annotation) if isinstance(n, ast.Name)),
                                      key=lambda n: n.col_offset) if n.id not in ("Optional", "Union", "str", "None")]
        entry: dict[str, object] = {"annotation": annotation}
        for cls in names:
            target = imports.get(cls, f"megatron.bridge.training.config.{cls}")
            try:
                fields, chain = _class_fields(src, target)
            except (LookupError, AttributeError, KeyError):
                continue
            entry.update({"class": target, "bases": chain, "fields": fields})
            break
        groups[stmt.target.id] = entry
    providers = {}
    for dotted in ("megatron.bridge.models.gpt_provider.GPTModelProvider",
                   "megatron.bridge.models.deepseek.deepseek_provider.DeepSeekV3ModelProvider"):
        fields, chain = _class_fields(src, dotted)
        providers[dotted] = {"bases": chain, "fields": fields}
    mp = src.module("megatron.bridge.training.mixed_precision")
    recipes = sorted(n.name for n in mp.body if isinstance(n, ast.FunctionDef)
                     and any(ast.unparse(d) == "register" for d in n.decorator_list))
    return {"source": {"package": f"megatron-bridge=={BRIDGE_VERSION}", "wheel": wheel.name,
                       "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
                       "megatron_core_bases": "installed megatron-core " + importlib.import_module(
                           "megatron.core.package_info").__version__},
            "groups": groups, "model_providers": providers, "mixed_precision_recipes": recipes}


def _dump(data: dict) -> str:
    """JSON with one list item or one mapping entry per line at the second level (short, diff-friendly lines)."""
    lines = []
    for key, value in sorted(data.items()):
        if isinstance(value, list):
            items = [json.dumps(v, sort_keys=True) for v in value]
        elif isinstance(value, dict):
            items = [f"{json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(value.items())]
        else:
            items = None
        if items is None:
            lines.append(f" {json.dumps(key)}: {json.dumps(value)}")
        else:
            opening, closing = ("[", "]") if isinstance(value, list) else ("{", "}")
            lines.append(f" {json.dumps(key)}: {opening}\n  " + ",\n  ".join(items) + f"\n {closing}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _download_wheel(folder: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", f"megatron-bridge=={BRIDGE_VERSION}", "--no-deps",
                    "-d", str(folder)], check=True, capture_output=True)
    return next(folder.glob("megatron_bridge-*.whl"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--megatron-lm", type=Path, required=True, help="a Megatron-LM git clone (with tag core_v0.16.1)")
    p.add_argument("--bridge-wheel", type=Path, default=None,
                   help="megatron_bridge-0.3.1 wheel (default: pip download)")
    p.add_argument("--check", action="store_true", help="compare with the committed files instead of writing them")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        wheel = args.bridge_wheel or _download_wheel(Path(tmp))
        made = {LM_JSON: megatron_lm_reference(args.megatron_lm), BRIDGE_JSON: bridge_reference(wheel)}
    stale = []
    for path, data in made.items():
        text = _dump(data)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"out of date: {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
