"""Execute the notebooks in place, so that they are committed with their outputs.

    python notebooks/execute.py [name.ipynb ...]

Runs each notebook top to bottom in a fresh kernel with this checkout first on the path
(``PYTHONPATH``) and one OpenMP thread, and writes the outputs (text and plots) back
into the file, so that a reader on the repository page sees them without running
anything. The test suite executes them again and checks their key numbers
(``tests/docs/test_notebooks_executed.py``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbclient
import nbformat

HERE = Path(__file__).resolve().parent


def execute(path: Path, timeout: int = 600) -> nbformat.NotebookNode:
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(HERE)}},
    )
    client.execute()
    return notebook


def main(names: list[str]) -> None:
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")])
    )
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    paths = [HERE / name for name in names] or sorted(HERE.glob("*.ipynb"))
    for path in paths:
        print(f"executing {path.name}", flush=True)
        nbformat.write(execute(path), path)


if __name__ == "__main__":
    main(sys.argv[1:])
