"""Plot time per leaf against size from ``bench_scale.py`` results.

Reads a pytest-benchmark JSON file (or, with no argument, runs
``benchmarks/bench_scale.py`` once to make one) and writes
``docs/img/scale.png``: one panel per case, tdfunc and its floor, time per leaf
(median) on log-log axes; a flat line is cost linear in the size. Also prints
the Markdown table of ratios of medians (tdfunc / floor) per size::

    python benchmarks/plot_scale.py /tmp/scale.json
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "docs" / "img" / "scale.png"
# leaves per checkpoint case (the case id names count x shape)
CHECKPOINT_LEAVES = {"1000x1KB": 1000, "32x256x256": 32, "4x32MB": 4}


def _leaves(case: str, size: str) -> int:
    return CHECKPOINT_LEAVES[size] if case == "checkpoint" else int(size)


def medians(path: str) -> dict:
    """``{case: {size: {contender: median seconds}}}``."""
    out: dict = defaultdict(lambda: defaultdict(dict))
    for bench in json.loads(Path(path).read_text())["benchmarks"]:
        match = re.fullmatch(r"scale-(\w+)-(.+)", bench["group"] or "")
        if match is None:
            continue
        contender = bench["name"].split("[")[0].rsplit("_", 1)[1]
        out[match[1]][match[2]][contender] = bench["stats"]["median"]
    return out


def collections(path: str) -> str:
    """The garbage collections per 20 pytree round trips, as a Markdown table."""
    found: dict = defaultdict(dict)
    for bench in json.loads(Path(path).read_text())["benchmarks"]:
        count = bench.get("extra_info", {}).get("gc_collections_per_20")
        match = re.fullmatch(r"scale-pytree-(.+)", bench["group"] or "")
        if count is None or match is None:
            continue
        found[int(match[1])][bench["name"].split("[")[0].rsplit("_", 1)[1]] = count
    lines = ["| leaves | tdfunc | torch's pytree on dicts |", "|---|---|---|"]
    for size in sorted(found):
        row = found[size]
        lines.append(f"| {size:,} | {row.get('tdfunc', '')} | {row.get('baseline', '')} |")
    return "\n".join(lines)


def table(results: dict) -> str:
    lines = ["| case | size | tdfunc (µs) | floor (µs) | tdfunc / floor |", "|---|---|---|---|---|"]
    for case, sizes in results.items():
        for size, row in sorted(sizes.items(), key=lambda item: _leaves(case, item[0])):
            ours, floor = row.get("tdfunc"), row.get("baseline")
            if ours is None or floor is None:
                continue
            lines.append(
                f"| {case} | {size} | {ours * 1e6:,.0f} | {floor * 1e6:,.0f} | {ours / floor:.2f} |"
            )
    return "\n".join(lines)


def plot(results: dict, output: Path = OUTPUT) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [case for case in ("to_module", "pytree", "checkpoint") if case in results]
    figure, axes = plt.subplots(1, len(cases), figsize=(4.2 * len(cases), 3.4), squeeze=False)
    for axis, case in zip(axes[0], cases):
        sizes = sorted(results[case], key=lambda size: _leaves(case, size))
        for contender, style in (("tdfunc", "o-"), ("baseline", "s--")):
            points = [
                (_leaves(case, s), results[case][s][contender] / _leaves(case, s) * 1e6)
                for s in sizes
                if contender in results[case][s]
            ]
            label = "tdfunc" if contender == "tdfunc" else "floor"
            axis.plot(*zip(*points), style, label=label)
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("leaves")
        axis.set_ylabel("µs per leaf (median)")
        axis.set_title(case)
        axis.legend()
    figure.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=110)


def main(argv: list[str]) -> None:
    if argv:
        path = argv[0]
    else:
        path = os.path.join(tempfile.mkdtemp(), "scale.json")
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        command = [sys.executable, "-m", "pytest", str(ROOT / "benchmarks" / "bench_scale.py")]
        command += ["--benchmark-enable", f"--benchmark-json={path}", "-q"]
        subprocess.run(command, check=True, env=env, cwd=ROOT)
    results = medians(path)
    print(table(results))
    print("\ngarbage collections per 20 pytree round trips:")
    print(collections(path))
    plot(results)
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main(sys.argv[1:])
