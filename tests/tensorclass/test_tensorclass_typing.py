"""Type checkers understand TensorClass subclasses: mypy (with the tdfunc plugin), pyright.

``tests/typing/typed_example.py`` must check clean; a snippet with deliberate
mistakes must produce exactly the expected errors, so the check can fail.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "typing" / "typed_example.py"

# Each line marked "# error: <code>" must be reported, and nothing else.
BAD_SNIPPET = textwrap.dedent(
    """
    from __future__ import annotations

    import torch

    from tdfunc import TensorClass, tensorclass


    class Batch(TensorClass["frozen"]):
        obs: torch.Tensor
        label: str = "train"


    class Bad(TensorClass["frozn"]):  # error: name-defined
        x: torch.Tensor


    batch = Batch(obs="not a tensor")  # error: arg-type
    Batch(torch.zeros(2), batch_size=[2], colour="red")  # error: call-arg
    batch.obs = torch.zeros(2)  # error: misc
    wrong: int = batch.reshape(2)  # error: assignment
    also_wrong: str = batch.obs  # error: assignment


    @tensorclass(frozen=True)
    class Decorated:
        obs: torch.Tensor


    decorated = Decorated(torch.zeros(2), batch_size=[2])
    reshaped: Decorated = decorated.reshape(2)
    decorated.obs = torch.zeros(2)  # error: misc
    Decorated(torch.zeros(2), colour="red")  # error: call-arg
    """
)

MYPY_CONFIG = textwrap.dedent(
    """
    [mypy]
    plugins = tdfunc.mypy_plugin
    ignore_missing_imports = True
    follow_imports = silent
    """
)


def _expected_errors(path: Path) -> dict[int, str]:
    expected = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        match = re.search(r"# error: ([\w-]+)", line)
        if match:
            expected[number] = match.group(1)
    return expected


@pytest.fixture(scope="module")
def mypy_output(tmp_path_factory, request) -> tuple[str, Path]:
    work = tmp_path_factory.mktemp("mypy")
    bad = work / "typed_errors.py"
    bad.write_text(BAD_SNIPPET)
    config = work / "mypy.ini"
    config.write_text(MYPY_CONFIG)
    cache_plugin = getattr(request.config, "cache", None)
    cache = cache_plugin.mkdir("tdfunc-mypy") if cache_plugin else work / "cache"
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(config),
            "--cache-dir",
            str(cache),
            "--show-error-codes",
            "--no-error-summary",
            str(EXAMPLE),
            str(bad),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert "INTERNAL ERROR" not in result.stderr + result.stdout, result.stderr
    return result.stdout, bad


def _errors_in(output: str, path: Path) -> dict[int, list[str]]:
    errors: dict[int, list[str]] = {}
    for line in output.splitlines():
        match = re.match(r"(.+?):(\d+): error: .*\[([\w-]+)\]$", line)
        if match and Path(match.group(1)).name == path.name:
            errors.setdefault(int(match.group(2)), []).append(match.group(3))
    return errors


def test_mypy_accepts_the_typed_example(mypy_output):
    output, _ = mypy_output
    assert _errors_in(output, EXAMPLE) == {}, output


def test_mypy_reports_the_deliberate_mistakes(mypy_output):
    output, bad = mypy_output
    errors = _errors_in(output, bad)
    expected = _expected_errors(bad)
    assert set(errors) == set(expected), output
    for line, code in expected.items():
        assert code in errors[line], (line, errors[line], output)


@pytest.mark.skipif(importlib.util.find_spec("pyright") is None, reason="pyright is not installed")
def test_pyright_accepts_the_example_and_rejects_a_wrong_type(tmp_path):
    bad = tmp_path / "typed_errors.py"
    bad.write_text(
        "import torch\nfrom tdfunc import TensorClass\n\n"
        'class Batch(TensorClass["frozen"]):\n    obs: torch.Tensor\n\n'
        'Batch(obs="not a tensor")\n'
        "class Frozen(TensorClass, frozen=True):\n    obs: torch.Tensor\n\n"
        "Frozen(obs=torch.zeros(2)).obs = torch.ones(2)\n"
    )
    command = [sys.executable, "-m", "pyright", "--pythonpath", sys.executable, "--outputjson"]
    good = subprocess.run(
        [*command, str(EXAMPLE)], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert good.returncode == 0, good.stdout[-3000:]
    wrong = subprocess.run(
        [*command, str(bad)], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert wrong.returncode == 1 and '"line": 6' in wrong.stdout, wrong.stdout[-3000:]
    assert '"line": 10' in wrong.stdout, wrong.stdout[-3000:]  # a frozen field is read-only
