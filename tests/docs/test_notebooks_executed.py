"""The notebooks run top to bottom, show what they claim, and are committed executed.

Each notebook is executed afresh with nbclient (one OpenMP thread, as
``notebooks/execute.py`` runs them) and its printed key numbers are checked: the
comparisons with a loop hold, training lowers the loss, the timings come with their
spread. ``frozen_batches.ipynb`` has its own test (it compiles). The committed files
must hold their outputs, so that a reader on the repository page sees the plots.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def _execute(name: str, workdir: Path) -> str:
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    client = nbclient.NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"]
    assert any("image/png" in out.get("data", {}) for out in outputs), f"{name} drew no plot"
    return "".join(
        out.get("text", "")
        if out.output_type == "stream"
        else out.get("data", {}).get("text/plain", "")
        for out in outputs
    )


def _number(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not in the notebook's output:\n{text[-3000:]}"
    return float(match.group(1))


def _check_ensembling(text: str) -> None:
    assert text.count("same as the loop: True") == 3, text
    assert "member 3 alone equals slice 3: True" in text
    assert "same parameters: True" in text
    losses = re.search(r"final training loss per member: \[([^\]]*)\]", text).group(1)
    assert all(float(v) < 0.05 for v in losses.split(",")), losses  # every member learned
    for other in ("torch.func", "Python loop"):
        pattern = rf"([0-9.]+)x \[IQR ([0-9.]+)-([0-9.]+)\] faster than {other}"
        ratio, low, high = map(float, re.search(pattern, text).groups())
        assert low <= ratio <= high


def _check_meta_learning(text: str) -> None:
    assert _number(r"meta-gradients agree on (\d+) tensors", text) > 0
    first = _number(r"meta-loss: first 50 steps ([0-9.]+)", text)
    last = _number(r"last 50 steps ([0-9.]+)", text)
    assert last < first


def _check_optimizers(text: str) -> None:
    assert _number(r"largest difference to the separate run: ([0-9.e+-]+)", text) < 1e-3
    start = _number(r"held-out query loss after adaptation: ([0-9.]+) from the random start", text)
    end = _number(r"from the random start, ([0-9.]+) after 200 meta-steps", text)
    assert end < 0.8 * start, (start, end)  # MAML visibly learns


def _check_datasets_on_disk(text: str) -> None:
    assert "preallocated 20000 items" in text
    assert len(re.findall(r"items/s \[IQR [0-9,]+-[0-9,]+\]", text)) == 6  # one per batch size


CHECKS = {
    "ensembling.ipynb": _check_ensembling,
    "meta_learning.ipynb": _check_meta_learning,
    "optimizers.ipynb": _check_optimizers,
    "datasets_on_disk.ipynb": _check_datasets_on_disk,
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CHECKS))
def test_notebook_executes_and_shows_its_key_numbers(name, monkeypatch, tmp_path):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # the kernel imports this checkout's tdfunc, installed or not
    monkeypatch.setenv(
        "PYTHONPATH",
        os.pathsep.join(filter(None, [str(NOTEBOOKS.parent), os.environ.get("PYTHONPATH")])),
    )
    monkeypatch.chdir(NOTEBOOKS)
    CHECKS[name](_execute(name, NOTEBOOKS if name != "datasets_on_disk.ipynb" else tmp_path))


@pytest.mark.parametrize("name", sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")))
def test_notebook_is_committed_executed(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    unexecuted = [i for i, cell in enumerate(code) if cell.execution_count is None]
    assert not unexecuted, (
        f"{name}: code cells {unexecuted} have not been run (notebooks/execute.py)"
    )
    outputs = [out for cell in code for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"], name
    assert any("image/png" in out.get("data", {}) for out in outputs), f"{name}: no plot stored"
    # numbered in order, top to bottom: one fresh run, not cells re-run by hand
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1)), name
