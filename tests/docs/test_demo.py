"""``python -m tdfunc.demo`` (the project's main job), run as a user runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

MEMBERS = 4
# One intra-op thread: the demo's matmuls are tiny, and two OpenMP threads on a
# shared, busy CI machine can spend 10x longer waiting for each other than computing.
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_demo_trains_reports_and_plots(tmp_path):
    out = tmp_path / "plots" / "ensemble.png"
    result = subprocess.run(
        [sys.executable, "-m", "tdfunc.demo", "--members", str(MEMBERS), "--steps", "120",
         "--seed", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=ENV,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot written to {out}" in text
    members = re.findall(r"member\s+(\d+): ([0-9.]+)", text)
    assert [int(k) for k, _ in members] == list(range(MEMBERS))
    ensemble = float(re.search(r"ensemble mean: ([0-9.]+)", text).group(1))
    loop = float(re.search(r"one by one in a loop: ([0-9.]+)", text).group(1))
    baseline = float(re.search(r"baseline .*: ([0-9.]+)", text).group(1))
    assert ensemble < 0.25 * baseline  # it learned something
    func = float(re.search(r"with torch.func vmap\(grad\): ([0-9.]+)", text).group(1))
    assert ensemble == pytest.approx(loop, rel=0.05, abs=1e-3)  # the same training
    assert ensemble == pytest.approx(func, rel=0.05, abs=1e-3)
    assert "batched ensemble: 5/5 layers batched" in text
    timing = re.search(
        r"batched ensemble ([0-9.]+) ms, torch.func vmap\(grad\) ([0-9.]+) ms, "
        r"Python loop over members ([0-9.]+) ms",
        text,
    )
    assert timing is not None and all(float(t) > 0 for t in timing.groups())
    speed_up = re.search(r"([0-9.]+)x over the loop, ([0-9.]+)x over torch.func", text)
    assert speed_up is not None


def test_demo_rejects_bad_options(capsys):
    from tdfunc import demo

    with pytest.raises(SystemExit):
        demo.main(["--members", "1"])
    assert "--members must be at least 2" in capsys.readouterr().err
