"""The ensembling, meta-learning and optimizers notebooks run top to bottom and draw their plots."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ensembling.ipynb", "meta_learning.ipynb", "optimizers.ipynb"])
def test_notebook_executes_with_plots(name, monkeypatch):
    # The kernel inherits this: one intra-op thread for these tiny models (two OpenMP
    # threads on a shared, busy CI machine mostly wait for each other).
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": NOTEBOOKS}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in
               cell.outputs]  # fmt: skip
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, f"{name} drew no plot"
