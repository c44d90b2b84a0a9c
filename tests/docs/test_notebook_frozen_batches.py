"""Execute notebooks/frozen_batches.ipynb with nbclient: it runs cleanly and draws its plot."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "frozen_batches.ipynb"


@pytest.mark.slow
def test_frozen_batches_notebook_runs_and_plots(monkeypatch):
    # Same tracing and guards as inductor, without kernel code generation (seconds, not tens).
    monkeypatch.setenv("TDFUNC_NOTEBOOK_BACKEND", "aot_eager")
    # the kernel imports this checkout's tdfunc, installed or not
    root = str(NOTEBOOK.parents[1])
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    )
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    client = nbclient.NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )
    client.execute()
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs]
    errors = [out for out in outputs if out.output_type == "error"]
    assert not errors, errors
    text = "".join(out.get("text", "") for out in outputs if out.output_type == "stream")
    assert "compilations: 1 | graph breaks: 0" in text
    assert "FrozenInstanceError" in text
    # timings with their spread, measured as the demo measures them (one thread, interleaved)
    for name in ("eager", "compiled"):
        median, q1, q3 = map(
            float, re.search(rf"{name}: (\d+) us per step \[IQR (\d+)-(\d+)\]", text).groups()
        )
        assert q1 <= median <= q3
    assert any("image/png" in out.get("data", {}) for out in outputs)
