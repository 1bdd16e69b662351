"""The example notebooks run top to bottom on the default backend (nbclient, the venv's python3 kernel)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
NOTEBOOKS = ["search_mixtral.ipynb", "compare_recipe.ipynb"]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_committed_without_outputs(name):
    import nbformat

    nb = nbformat.read(EXAMPLES / name, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{name} has no code cells"
    assert all(not c.outputs and c.execution_count is None for c in code), f"{name} was committed with outputs"


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_top_to_bottom(name, tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(EXAMPLES / name, as_version=4)
    # The kernel (jupyter_client starts "python" as this interpreter) imports autotune from the checkout,
    # and runs in a scratch folder so nothing lands in examples/.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))))
    client = NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError naming the failing cell
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code)
    assert any(o.get("data", {}).get("image/png") for c in code for o in c.outputs), "no plot was displayed"
