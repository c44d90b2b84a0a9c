"""tensordict 0.15.3 in a separate process, for the checks that compare with it.

Importing tensordict replaces private functions of ``torch._functorch.vmap`` for the
whole process, so the test process never imports it: the cross-library checks run
their tensordict half through :func:`run`, in an interpreter found by :func:`python`:

1. ``TDFUNC_TENSORDICT_PYTHON``: the path of an interpreter that imports tensordict
   0.15.3 (an error if it does not: a configured check must not skip silently);
2. a copy provisioned for the test session: when ``CI=true`` or
   ``TDFUNC_PROVISION_TENSORDICT=1``, tensordict 0.15.3 and its two small pure-Python
   dependencies are installed once with ``pip install --target`` under
   ``.pytest_cache/`` (pinned by ``constraints.txt``), and run by this interpreter with
   that directory first on its path (torch and numpy come from the test environment);
3. this interpreter, in a child process, when it can import tensordict 0.15.3 itself.

Otherwise :func:`run` skips the test with :data:`REASON`, which says what to set.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

VERSION = "0.15.3"
ROOT = Path(__file__).resolve().parents[1]
# tensordict's install requirements besides torch and numpy (pure Python, pinned in
# constraints.txt).
DEPENDENCIES = ("cloudpickle", "pyvers")
TARGET = ROOT / ".pytest_cache" / f"tensordict-{VERSION}"
ENV_PYTHON = "TDFUNC_TENSORDICT_PYTHON"
ENV_PROVISION = "TDFUNC_PROVISION_TENSORDICT"
REASON = (
    f"compares with tensordict {VERSION}, run in a separate process: set "
    f"{ENV_PROVISION}=1 (installs it once under .pytest_cache/, about 10 MB) or "
    f"{ENV_PYTHON}=<a python that imports tensordict=={VERSION}>"
)
_PROBE = "import tensordict, sys; sys.stdout.write(tensordict.__version__)"
# Runs ``-c code args`` (or a script) with the provisioned directory first on sys.path.
_LAUNCHER = """\
import runpy, sys
sys.path.insert(0, {target!r})
if len(sys.argv) > 2 and sys.argv[1] == "-c":
    code = sys.argv[2]
    sys.argv = ["-c", *sys.argv[3:]]
    exec(compile(code, "<string>", "exec"), {{"__name__": "__main__"}})
else:
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _version(argv: list[str]) -> str | None:
    try:
        probe = subprocess.run(
            [*argv, "-c", _PROBE], capture_output=True, text=True, timeout=120, cwd=ROOT
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return probe.stdout.strip() if probe.returncode == 0 else None


def _provisioning_requested() -> bool:
    return os.environ.get("CI", "").lower() == "true" or os.environ.get(ENV_PROVISION) == "1"


def _launcher() -> list[str]:
    return [sys.executable, str(TARGET / "launch.py")]


def _provision() -> None:
    """Install tensordict into TARGET, all or nothing (a half-made copy is never used)."""
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="tensordict-", dir=TARGET.parent))
    try:
        install = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             "--no-deps", "--target", str(staging), "-c", str(ROOT / "constraints.txt"),
             f"tensordict=={VERSION}", *DEPENDENCIES],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if install.returncode != 0:
            raise RuntimeError(
                f"tensordict_peer: pip could not install tensordict=={VERSION} into "
                f"{staging}:\n{install.stderr[-2000:]}"
            )
        (staging / "launch.py").write_text(_LAUNCHER.format(target=str(TARGET)))
        if _version(_launcher()) == VERSION:
            return  # another test session finished the same install meanwhile
        shutil.rmtree(TARGET, ignore_errors=True)
        staging.rename(TARGET)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@functools.cache
def python() -> list[str] | None:
    """The argv prefix of an interpreter that imports tensordict 0.15.3, or None."""
    configured = os.environ.get(ENV_PYTHON)
    if configured:
        found = _version([configured])
        if found != VERSION:
            raise RuntimeError(
                f"tensordict_peer: {ENV_PYTHON}={configured} must import tensordict "
                f"{VERSION}; it " + (f"has {found}" if found else "cannot import tensordict")
            )
        return [configured]
    if (TARGET / "launch.py").is_file() or _provisioning_requested():
        if not (TARGET / "launch.py").is_file() or _version(_launcher()) != VERSION:
            _provision()
        found = _version(_launcher())
        if found != VERSION:
            raise RuntimeError(
                f"tensordict_peer: the copy provisioned in {TARGET} imports tensordict "
                f"{found}, expected {VERSION}; delete the directory and run again"
            )
        return _launcher()
    if _version([sys.executable]) == VERSION:
        return [sys.executable]
    return None


def run(code: str, *args: str, cwd=None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``code`` (``python -c code *args``) with tensordict importable; skip the
    calling test with :data:`REASON` when no such interpreter is available."""
    prefix = python()
    if prefix is None:
        pytest.skip(REASON)
    return subprocess.run(
        [*prefix, "-c", code, *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def printed_by_both(probe: str) -> tuple[list[str], list[str]]:
    """The non-empty lines ``probe`` prints with tensordict and with tdfunc.

    ``probe`` names the library ``LIB`` (``from LIB import TensorDict``); tensordict's
    run must succeed (its stderr is shown if not), and so must tdfunc's.
    """
    done = run(probe.replace("LIB", "tensordict"))
    assert done.returncode == 0, done.stderr[-2000:]
    mine = subprocess.run(
        [sys.executable, "-c", probe.replace("LIB", "tdfunc")],
        capture_output=True, text=True, cwd=ROOT, check=True,
    )  # fmt: skip
    return (
        [line for line in done.stdout.splitlines() if line],
        [line for line in mine.stdout.splitlines() if line],
    )


def recorded_by_both(script: Path, folder: Path, *reference_args: str, timeout: float) -> tuple:
    """The JSON records of a side-by-side runner, with tensordict and then with tdfunc.

    ``script`` is a module with ``main(["reference", OUT, *reference_args])``, run in
    tensordict's interpreter, and a command line ``script tdfunc OUT MINE`` that replays
    the reference run with tdfunc. Both runs must succeed (their stderr is shown if not).
    """
    reference, candidate = folder / "tensordict.json", folder / "tdfunc.json"
    code = (
        "import importlib, sys; sys.path.insert(0, sys.argv[1]); "
        "importlib.import_module(sys.argv[2]).main(['reference', *sys.argv[3:]])"
    )
    done = run(
        code, str(script.parent), script.stem, str(reference), *reference_args,
        cwd=folder, timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(script.parent)])}
    done = subprocess.run(
        [sys.executable, str(script), "tdfunc", str(reference), str(candidate)],
        cwd=folder, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    expected = json.loads(reference.read_text())
    assert expected["version"] == VERSION
    return expected, json.loads(candidate.read_text())
