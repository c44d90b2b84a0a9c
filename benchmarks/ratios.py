"""Ratios of medians from a pytest-benchmark JSON file, as a Markdown table.

Every benchmark is named ``test_<op>_<contender>`` (parametrized ones carry their
case in brackets) and shares its ``group`` with the other contenders of the same
operation. For each group this prints ``tensordict / tdfunc`` (how many times
faster tdfunc is than the ``tensordict`` library) and ``tdfunc / baseline``
(plain dicts, optree), then the geometric mean of the speedups. Given several
files (runs of the same benchmarks), each contender's time is its lowest median
over the runs: on a shared machine a run's medians carry the load of the moment,
and the lowest one is the closest to the cost of the code::

    .venv-bench/bin/python -m pytest benchmarks/bench_container.py --benchmark-enable \\
        --benchmark-json=/tmp/container.json -q
    .venv-bench/bin/python benchmarks/ratios.py /tmp/container.json [/tmp/run2.json ...]
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

CONTENDERS = ("tdfunc", "tensordict", "baseline")


def cpu_model() -> str:
    """The CPU's model name, for the record of a run."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    """The CPU's model name and core count."""
    return f"{cpu_model()}, {os.cpu_count()} cores"


def interleaved_medians(
    contenders: dict[str, Callable[[], object]],
    rounds: int,
    *,
    number: int = 1,
    samples: int = 1,
    warmup: int = 0,
) -> dict[str, float]:
    """``{name: median seconds per call}`` of :func:`interleaved_samples`."""
    times = interleaved_samples(contenders, rounds, number=number, samples=samples, warmup=warmup)
    return {name: statistics.median(values) for name, values in times.items()}


def interleaved_samples(
    contenders: dict[str, Callable[[], object]],
    rounds: int,
    *,
    number: int = 1,
    samples: int = 1,
    warmup: int = 0,
) -> dict[str, list[float]]:
    """``{name: [seconds per call, one per sample]}`` in CPU time of the calling thread.

    The contenders alternate round by round, so that a change of load on a shared
    machine falls on all of them; time other jobs take from the CPU is not counted
    (``time.thread_time_ns``). Each round times every contender ``samples`` times, each
    sample ``number`` calls in a row (divided by ``number``); ``warmup`` rounds of one
    call each come first. Quote ratios of these medians, pinned to one thread
    (``torch.set_num_threads(1)``).
    """
    clock = time.thread_time_ns
    for _ in range(warmup):
        for function in contenders.values():
            function()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, function in contenders.items():
            record = times[name].append
            for _ in range(samples):
                if number == 1:  # no loop inside the timed span
                    start = clock()
                    function()
                    record((clock() - start) / 1e9)
                    continue
                start = clock()
                for _ in range(number):
                    function()
                record((clock() - start) / number / 1e9)
    return times


def medians(paths: list[str]) -> dict[str, dict[str, float]]:
    """``{group: {contender: median seconds}}`` (the lowest median over the files)."""
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for path in paths:
        with open(path) as file:
            runs = json.load(file)["benchmarks"]
        for run in runs:
            name = re.sub(r"\[.*\]$", "", run["name"])
            contender = next((c for c in CONTENDERS if name.endswith("_" + c)), None)
            if contender is not None:
                times = out[run["group"] or name]
                median = run["stats"]["median"]
                times[contender] = min(times.get(contender, median), median)
    return out


def table(groups: dict[str, dict[str, float]]) -> str:
    lines = [
        "| operation | tdfunc median (µs) | tensordict / tdfunc | tdfunc / baseline |",
        "|---|---|---|---|",
    ]
    speedups = []
    for group, times in sorted(groups.items()):
        mine = times.get("tdfunc")
        if mine is None:
            continue
        anchor = times.get("tensordict")
        base = times.get("baseline")
        speedup = f"{anchor / mine:.2f}x" if anchor else "-"
        if anchor:
            speedups.append(anchor / mine)
        versus = f"{mine / base:.2f}" if base else "-"
        lines.append(f"| `{group}` | {mine * 1e6:.2f} | {speedup} | {versus} |")
    if speedups:
        mean = math.exp(sum(map(math.log, speedups)) / len(speedups))
        lines.append(
            f"\nGeometric mean of tensordict / tdfunc over {len(speedups)} operations: "
            f"{mean:.2f}x; lowest {min(speedups):.2f}x."
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(medians(sys.argv[1:])))
