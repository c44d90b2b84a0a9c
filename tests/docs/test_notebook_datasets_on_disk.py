"""Execute notebooks/datasets_on_disk.ipynb with nbclient: it runs cleanly and draws its plot."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "datasets_on_disk.ipynb"


@pytest.mark.slow
def test_datasets_on_disk_notebook_runs_and_plots(tmp_path):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    client = nbclient.NotebookClient(
        notebook,
        timeout=120,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs]
    errors = [out for out in outputs if out.output_type == "error"]
    assert not errors, errors
    text = "".join(out.get("text", "") for out in outputs if out.output_type == "stream")
    assert "preallocated 20000 items" in text
    assert text.count("items/s") == 6  # one throughput per batch size
    assert any("image/png" in out.get("data", {}) for out in outputs)
