"""tensordict in a separate process, for tests that compare tdfunc with it.

tensordict is never imported in the test process (importing it replaces functions
of torch's vmap). ``TDFUNC_TENSORDICT_PYTHON`` names an interpreter that can import
it (for example ``/path/to/venv-td/bin/python``); the tests that need it are skipped
when it is unset or cannot import tensordict.
"""

from __future__ import annotations

import functools
import os
import shlex
import subprocess

import pytest

_INSTALL = (
    "set TDFUNC_TENSORDICT_PYTHON to a Python interpreter that has tensordict 0.15.3 "
    "installed (for example: python -m venv venv-td && venv-td/bin/pip install "
    "tensordict==0.15.3; TDFUNC_TENSORDICT_PYTHON=venv-td/bin/python)"
)


@functools.cache
def _probe(command: str) -> bool:
    try:
        done = subprocess.run(
            [*shlex.split(command), "-c", "import tensordict"],
            capture_output=True,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def python() -> list[str] | None:
    """The argv prefix of an interpreter that imports tensordict in its own process."""
    command = os.environ.get("TDFUNC_TENSORDICT_PYTHON", "").strip()
    if not command or not _probe(command):
        return None
    return shlex.split(command)


def skip_reason() -> str:
    command = os.environ.get("TDFUNC_TENSORDICT_PYTHON", "").strip()
    if not command:
        return f"tensordict is needed: {_INSTALL}"
    return f"TDFUNC_TENSORDICT_PYTHON={command!r} cannot import tensordict: {_INSTALL}"


def run(code: str, *args: str, cwd=None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``code`` with tensordict's interpreter (``sys.argv[1:]`` is ``args``)."""
    argv = python()
    if argv is None:
        pytest.skip(skip_reason())
    return subprocess.run(
        [*argv, "-c", code, *args],
        check=False,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
    )
