"""The separate-process tensordict used by the cross-library checks (tests/tensordict_peer.py)."""

from __future__ import annotations

import sys

import pytest
import tensordict_peer


def test_run_skips_with_a_reason_that_says_what_to_set(monkeypatch):
    monkeypatch.setattr(tensordict_peer, "python", lambda: None)
    with pytest.raises(pytest.skip.Exception) as skipped:
        tensordict_peer.run("print(1)")
    reason = str(skipped.value)
    assert "TDFUNC_PROVISION_TENSORDICT=1" in reason and "TDFUNC_TENSORDICT_PYTHON" in reason
    assert "0.15.3" in reason and "/work" not in reason


def test_a_configured_interpreter_without_tensordict_is_an_error(monkeypatch, tmp_path):
    # A configured check must fail loudly, never skip: an interpreter that has no
    # tensordict (a bare one that imports only the standard library).
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    fake.chmod(0o755)
    monkeypatch.setenv(tensordict_peer.ENV_PYTHON, str(fake))
    with pytest.raises(RuntimeError, match=r"must import tensordict 0\.15\.3; it cannot import"):
        tensordict_peer.python.__wrapped__()


@pytest.mark.slow
def test_the_peer_runs_tensordict_in_another_process(tmp_path):
    out = tensordict_peer.run(
        "import sys, tensordict; print(__name__, tensordict.__version__, sys.argv[1:])",
        "x y",
        "2",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split(None, 2) == ["__main__", "0.15.3", "['x y', '2']\n"]
    assert "tensordict" not in sys.modules  # its patches of torch stay in the peer
