"""benchmarks/plot_report.py draws the benchmark page's figures from pytest-benchmark JSON."""

from __future__ import annotations

import importlib.util
import json

import pytest
from markdown_blocks import ROOT

pytest.importorskip("matplotlib")


def _module():
    spec = importlib.util.spec_from_file_location(
        "plot_report", ROOT / "benchmarks" / "plot_report.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stats(median: float) -> dict:
    return {"median": median, "q1": 0.9 * median, "q3": 1.2 * median}


def _run(tmp_path, name, benchmarks):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({
        "datetime": "2026-12-07T18:00:00+00:00",
        "machine_info": {"cpu": {"brand_raw": "Test CPU", "count": 2}},
        "benchmarks": benchmarks,
    }))  # fmt: skip
    return path


def test_figures_and_ratios_from_benchmark_json(tmp_path, capsys):
    report = _module()
    ensemble = [
        {"group": f"ensemble_forward[{config}]", "name": f"test_forward[{kind}-{config}]",
         "params": {"kind": kind, "config": config}, "stats": _stats(median)}
        for config in ("N8-w32", "tutorial")
        for kind, median in (("tdfunc_ensemble", 1.0), ("torch_func", 4.0), ("loop", 8.0))
    ]  # fmt: skip
    container = [
        {"group": "reshape", "name": f"test_reshape_{who}", "params": None, "stats": _stats(m)}
        for who, m in (("tdfunc", 2.0), ("tensordict", 5.0), ("baseline", 1.0))
    ]
    report.main([
        "--ensemble", str(_run(tmp_path, "ensemble", ensemble)),
        "--container", str(_run(tmp_path, "container", container)),
        "--out", str(tmp_path / "img"),
    ])  # fmt: skip
    for figure in ("bench-ensemble.png", "bench-container.png"):
        assert (tmp_path / "img" / figure).read_bytes()[:4] == b"\x89PNG"
    text = capsys.readouterr().out
    # ratio of medians, and the conservative range q1(slow)/q3(fast) .. q3(slow)/q1(fast)
    assert "| forward | N8-w32 | torch.func | 4.00x (3.00-5.33) |" in text
    assert "| container ops (1) | tensordict | median 2.5x, from 2.5x to 2.5x |" in text


def test_transformer_figure_from_the_interleaved_record(tmp_path, capsys):
    report = _module()
    kinds = {"tdfunc_ensemble": 1.0, "torch_func": 2.0, "loop": 3.0, "batched_by_hand": 0.9}
    record = {
        "datetime": "2026-12-07T21:00:00+00:00",
        "machine": "Test CPU, 2 cores",
        "torch": "2.13.0+cpu",
        "configs": {
            config: {
                "forward": {k: [m * 0.9, m, m, m * 1.2, m * 1.2] for k, m in kinds.items()},
                "train step": {k: [m, m, m] for k, m in kinds.items()},
                "peak memory": {"loop": 100, "tdfunc_ensemble": 103},
            }
            for config in ("N32-B16-T32-D64", "N8-B8-T8-D32")
        },
    }
    path = tmp_path / "transformer.json"
    path.write_text(json.dumps(record))
    report.main(["--transformer", str(path), "--out", str(tmp_path / "img")])
    assert (tmp_path / "img" / "bench-transformer.png").read_bytes()[:4] == b"\x89PNG"
    text = capsys.readouterr().out
    # quartiles of [2.7, 3, 3, 3.6, 3.6] and of [0.9, 1, 1, 1.2, 1.2]: 3 and 3.6, 1 and 1.2
    assert "| transformer forward | N8-B8-T8-D32 | Python loop | 3.00x (2.50-3.60) |" in text
    assert "| transformer train step | N32-B16-T32-D64 | torch.func | 2.00x (2.00-2.00) |" in text
    assert "| transformer peak memory | N8-B8-T8-D32 | Python loop | 1.03x the loop's |" in text


def test_fixed_cost_figure_from_fixed_cost_json(tmp_path, capsys):
    report = _module()
    path = tmp_path / "fixed.json"
    rows = [
        {
            "case": "swap",
            "name": "to_module, 10 leaves",
            "tdfunc": _stats(3.0),
            "floor": _stats(2.0),
        },
        {"case": "ops", "name": "clone", "tdfunc": _stats(1.0), "floor": _stats(1.25)},
    ]
    path.write_text(json.dumps({"machine": "Test CPU", "date": "2026-12-07", "rows": rows}))
    report.main(["--fixed", str(path), "--out", str(tmp_path / "img")])
    assert (tmp_path / "img" / "bench-fixed.png").read_bytes()[:4] == b"\x89PNG"
    text = capsys.readouterr().out
    # tdfunc / floor, lower is better; the range is q1(tdfunc)/q3(floor) .. q3(tdfunc)/q1(floor)
    assert "| to_module, 10 leaves | 1.50 (1.13-2.00) |" in text
    assert "| clone | 0.80 (0.60-1.07) |" in text
    assert text.index("to_module, 10 leaves") < text.index("| clone |")  # in the run's order


def _bench_optim():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))  # the script imports its neighbours
    try:
        spec = importlib.util.spec_from_file_location(
            "bench_optim_script", ROOT / "benchmarks" / "bench_optim.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


def test_optim_script_interleaves_its_contenders_and_its_record_draws(
    tmp_path, capsys, monkeypatch
):
    bench = _bench_optim()
    calls: list[str] = []

    def contender(name):
        return lambda: calls.append(name)

    def groups(torchopt=None):
        steps = {name: contender(name) for name in ("tdfunc", "torch_optim", "baseline")}
        return {"adam-ensemble": (4, 1, steps)}

    monkeypatch.setattr(bench, "groups", groups)
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    bench.main(1.0, str(tmp_path / "optim.json"))
    # one warm-up round, then four rounds: every round calls each contender once, in turn
    assert calls == ["tdfunc", "torch_optim", "baseline"] * 5
    record = json.loads((tmp_path / "optim.json").read_text())
    assert {bench["name"] for bench in record["benchmarks"]} == {
        "test_adam_ensemble_tdfunc", "test_adam_ensemble_torch_optim",
        "test_adam_ensemble_baseline",
    }  # fmt: skip
    assert all(bench["stats"]["rounds"] == 4 for bench in record["benchmarks"])
    report = _module()
    run = report.Run(tmp_path / "optim.json", report.suffix_contender)
    assert "load average" in run.caption()
    report.main(["--optim", str(tmp_path / "optim.json"), "--out", str(tmp_path / "img")])
    assert (tmp_path / "img" / "bench-optim.png").read_bytes()[:4] == b"\x89PNG"
    assert "| Adam step, 64 members | 64 torch.optim.Adam |" in capsys.readouterr().out
