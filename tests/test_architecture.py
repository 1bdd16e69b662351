"""The import graph: layers import one way, no modules import each other in a circle, and the analytic path stays
light.

    search_spaces  <-  autotune.cost  <-  autotune.tuning  <-  autotune.outputs  <-  autotune.ui
    trainers       <-  search_spaces only (the backend registry loads trainers by name)

Every `import` and `from ... import` in every module is read from its source (function-level imports
included), so a lazy import inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"search_spaces": 0, "autotune.cost": 1, "autotune.tuning": 2, "autotune.outputs": 3, "autotune.ui": 4}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in found if name.split(".")[0] in ("autotune", "search_spaces", "trainers")}


def _layer(module: str) -> int | None:
    for prefix, rank in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            return rank
    return None


def _sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_layers_import_one_way() -> None:
    upward = []
    for path in _sources("autotune") + _sources("search_spaces"):
        me = _module_name(path)
        mine = _layer(me)
        if mine is None:  # autotune/__init__.py, __main__.py: the package's front door
            continue
        for target in _imports(path):
            theirs = _layer(target)
            if target.startswith("trainers"):
                upward.append(f"{me} imports {target} (trainers load by name through the backend registry)")
            elif theirs is not None and theirs > mine:
                upward.append(f"{me} imports {target}")
    assert not upward, "\n".join(upward)


def _import_graph() -> dict[str, set[str]]:
    """module -> the modules of ours it imports (a `from pkg import name` of a submodule counts as that module)."""
    paths = _sources("autotune") + _sources("search_spaces") + _sources("trainers")
    modules = {_module_name(p) for p in paths}
    return {_module_name(p): {t for t in _imports(p) if t in modules and t != _module_name(p)} for p in paths}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles() -> None:
    # a package's __init__ re-exporting its modules is the package's face, not a circle: it is left out
    graph = {m: {t for t in ts if not _is_package(t)} for m, ts in _import_graph().items() if not _is_package(m)}
    circles = _circles(graph)
    assert not circles, "import circles (deferred imports included):\n" + "\n".join(" <-> ".join(c) for c in circles)


def _is_package(module: str) -> bool:
    return (ROOT / module.replace(".", "/") / "__init__.py").exists()


def test_shared_constants_have_one_home() -> None:
    # GiB is `search_spaces.units.GIB`; a module that needs it imports it, none defines its own
    homes = [_module_name(p) for p in _sources("autotune") + _sources("search_spaces") + _sources("trainers")
             for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.Assign)
             for target in node.targets if isinstance(target, ast.Name) and target.id == "GIB"]
    assert homes == ["search_spaces.units"], homes


def test_trainers_import_only_search_spaces() -> None:
    wrong = [f"{_module_name(p)} imports {t}" for p in _sources("trainers") for t in _imports(p)
             if t.startswith("autotune")]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("module", ["autotune.cost.analytic", "autotune.cost.memory", "autotune.cost.throughput",
                                    "autotune.ui.cli", "search_spaces.space"])
def test_the_analytic_path_imports_nothing_heavy(module: str) -> None:
    code = (f"import sys, {module}; heavy = [m for m in ('torch', 'ray', 'optuna', 'megatron') if m in sys.modules]; "
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == ""
