"""``python -m tdfunc.demo`` (the project's main job), run as a user runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

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
    assert "1 thread (torch.set_num_threads)" in text
    assert "20 rounds of 5 training steps per way, the ways taking turns" in text
    for name in ("batched Ensemble", "torch.func", "Python loop"):
        median, q1, q3 = map(
            float, re.search(rf"  {name}: ([0-9.]+) ms \[([0-9.]+)-([0-9.]+)\]", text).groups()
        )
        assert 0 < q1 <= median <= q3, (name, q1, median, q3)
    speed_up = re.search(
        r"([0-9.]+)x \[([0-9.]+)-([0-9.]+)\] over the loop, "
        r"([0-9.]+)x \[([0-9.]+)-([0-9.]+)\] over torch.func",
        text,
    )
    assert speed_up is not None, text
    for median, q1, q3 in (speed_up.groups()[:3], speed_up.groups()[3:]):
        assert float(q1) <= float(median) <= float(q3)


def test_demo_rejects_bad_options(capsys):
    from tdfunc import demo

    with pytest.raises(SystemExit):
        demo.main(["--members", "1"])
    assert "--members must be at least 2" in capsys.readouterr().err


def test_spread_and_speed_up_against_plain_statistics():
    import statistics

    from tdfunc.demo import speed_up, spread

    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert spread(values) == (3.0, 2.0, 4.0)
    assert spread([7.0]) == (7.0, 7.0, 7.0)
    fast, slow = [1.0, 2.0, 1.0], [4.0, 4.0, 3.0]  # paired rounds: ratios 4, 2, 3
    assert speed_up(fast, slow)[0] == statistics.median([4.0, 2.0, 3.0])


def test_compare_timings_interleaves_warms_up_and_restores_threads():
    from tdfunc.demo import compare_timings

    calls = []
    threads_before = torch.get_num_threads()
    seen_threads = set()

    def contender(name):
        def run():
            calls.append(name)
            seen_threads.add(torch.get_num_threads())

        return run

    samples = compare_timings(
        {"a": contender("a"), "b": contender("b")}, rounds=4, calls=2, warmup=3, threads=1
    )
    assert {name: len(times) for name, times in samples.items()} == {"a": 4, "b": 4}
    assert calls[:6] == ["a"] * 3 + ["b"] * 3  # warm-up first, untimed
    timed = calls[6:]
    # rounds alternate who goes first: a a b b | b b a a | a a b b | b b a a
    assert timed[::2] == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert seen_threads == {1}
    assert torch.get_num_threads() == threads_before


def test_demo_plot_draws_the_spread_above_the_out_of_range_shading(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tdfunc import demo

    drawn = {}
    monkeypatch.setattr(plt, "close", lambda figure: drawn.setdefault("figure", figure))
    grid = torch.linspace(-demo.PLOT_RANGE, demo.PLOT_RANGE, 50)
    predictions = torch.stack([torch.sin(grid) + 0.1 * k for k in range(3)])
    data = {"x": torch.zeros(4, 1), "y": torch.zeros(4, 1)}
    timings = {
        "batched Ensemble": (1.0, 0.9, 1.1),
        "torch.func": (2, 1.8, 2.2),
        "Python loop": (3, 2.5, 3.5),
    }
    demo.plot(predictions, grid, data, timings, tmp_path / "plot.png")
    axes = drawn["figure"].axes[0]
    band = next(c for c in axes.collections if c.get_label() == "mean ± 2 std")
    shading = [p for p in axes.patches if p.get_facecolor()[:3] == matplotlib.colors.to_rgb("0.92")]
    assert len(shading) == 2
    assert all(band.get_zorder() > patch.get_zorder() for patch in shading)


def test_progress_without_tqdm_prints_a_line_per_quarter(monkeypatch, capsys):
    import sys

    from tdfunc.demo import run_steps

    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # as if tqdm were not installed
    calls = []
    run_steps(lambda: calls.append(1), 8, "training (x)")
    assert len(calls) == 8
    assert capsys.readouterr().out.splitlines() == [
        f"  training (x): {done}/8 steps" for done in (2, 4, 6, 8)
    ]


def test_compare_timings_with_several_threads_uses_wall_time():
    import time

    from tdfunc.demo import compare_timings

    # A sleeping contender spends no CPU time: only a wall clock sees its 2 ms.
    samples = compare_timings({"sleep": lambda: time.sleep(0.002)}, rounds=2, calls=1, threads=2)
    assert all(t >= 0.002 for t in samples["sleep"])
    samples = compare_timings({"sleep": lambda: time.sleep(0.002)}, rounds=2, calls=1, threads=1)
    assert all(t < 0.002 for t in samples["sleep"])
