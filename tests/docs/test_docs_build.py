"""The documentation site builds with warnings as errors (mkdocs --strict).

Warnings include a page missing from the nav, griffe's (a docstring parameter that is
not in the signature, an API page naming an object that does not resolve) and mkdocs'
(a broken link or anchor).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from markdown_blocks import ROOT


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "api" / "containers" / "index.html").is_file()
