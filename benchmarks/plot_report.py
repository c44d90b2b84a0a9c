"""The figures of docs/benchmarks.md, from pytest-benchmark JSON files.

    python benchmarks/plot_report.py --ensemble ensemble.json --optim optim.json \\
        --container container.json --persist persist.json --out docs/img
    python benchmarks/plot_report.py --fixed fixed.json --out docs/img

``--fixed`` takes what ``benchmarks/fixed_cost.py --json`` writes (its own format: rows of
two contenders timed in one process), the others pytest-benchmark's JSON.

``--optim`` also takes what ``bench_optim.py --json`` writes (pytest-benchmark's layout,
from its interleaved script run, with the load average of the machine around each group).

``--transformer`` takes the record of ``bench_ensemble_transformer.py --json`` (every
sample of its interleaved script run, and the peak memory) instead.

Each figure shows one claim as ratios of medians from one run (contenders of a group
were timed in the same process, minutes apart at most), with whiskers for the spread:
for a time, its interquartile range; for a ratio ``b / a``, the range from
``q1(b) / q3(a)`` to ``q3(b) / q1(a)`` (a conservative range: both quartiles at their
least and most favourable). The machine and the date of the run are in each title.
Also prints the ratios as Markdown, for the text of the page.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import re
import statistics
from collections import defaultdict
from pathlib import Path

ENSEMBLE_KINDS = {
    "tdfunc_ensemble": "tdfunc Ensemble",
    "tdfunc_vmap": "TensorDict + vmap",
    "torch_func": "torch.func",
    "loop": "Python loop",
    "baddbmm": "hand-written baddbmm",
    "tensordict": "tensordict + vmap",
}
COLORS = {
    "tdfunc Ensemble": "tab:blue",
    "TensorDict + vmap": "tab:cyan",
    "torch.func": "tab:orange",
    "Python loop": "tab:gray",
    "hand-written baddbmm": "tab:green",
    "tensordict + vmap": "tab:red",
}


class Run:
    """One pytest-benchmark JSON file: ``{group: {contender: stats}}``, machine, date."""

    def __init__(self, path: Path, contender) -> None:
        data = json.loads(Path(path).read_text())
        self.groups: dict[str, dict[str, dict]] = defaultdict(dict)
        for bench in data["benchmarks"]:
            self.groups[bench["group"]][contender(bench)] = bench["stats"]
        cpu = data["machine_info"].get("cpu", {})
        self.machine = f"{cpu.get('brand_raw', 'unknown CPU')}, {cpu.get('count', '?')} cores"
        self.date = datetime.datetime.fromisoformat(data["datetime"]).strftime("%Y-%m-%d")
        # an interleaved script run records the 1-minute load average around its groups
        loads = [load for load in data.get("load_average") or () if load is not None]
        self.load = f", load average {min(loads):.1f}-{max(loads):.1f}" if loads else ""

    def caption(self) -> str:
        return f"{self.machine}{self.load}, {self.date}"


def suffix_contender(bench: dict) -> str:
    """``test_<op>_<contender>[case]`` -> contender."""
    name = bench["name"].split("[", 1)[0]
    for contender in ("tdfunc_threads", "torch_optim", "tensordict", "baseline", "torchopt"):
        if name.endswith("_" + contender):
            return contender
    return name.rsplit("_", 1)[-1]


def ensemble_contender(bench: dict) -> str:
    if "tensordict" in bench["name"]:
        return ENSEMBLE_KINDS["tensordict"]
    return ENSEMBLE_KINDS[bench["params"]["kind"]]


def _config_order(config: str) -> tuple:
    """``N8-w32`` before ``N16-w128`` (by members, then width); named models last."""
    sizes = re.findall(r"\d+", config)
    return (not sizes, [int(size) for size in sizes], config)


def ratio(slow: dict, fast: dict) -> tuple[float, float, float]:
    """How many times ``fast`` is faster than ``slow``: median ratio and its range."""
    return (
        slow["median"] / fast["median"],
        slow["q1"] / fast["q3"],
        slow["q3"] / fast["q1"],
    )


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _times_axis(axis) -> None:
    """Plain ``2x``-style tick labels on a log axis of ratios."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}x"))
    axis.set_minor_formatter(FuncFormatter(lambda value, _: ""))


def plot_ensemble(run: Run, out: Path) -> list[str]:
    plt = _plt()
    lines = []
    figure, panels = plt.subplots(1, 2, figsize=(12, 4.2), sharey=False)
    for panel, prefix, title in (
        (panels[0], "ensemble_forward", "forward"),
        (panels[1], "ensemble_train_step", "training step (forward + backward)"),
    ):
        groups = {
            g[len(prefix) + 1 : -1]: s for g, s in run.groups.items() if g.startswith(prefix + "[")
        }
        configs = sorted(groups, key=_config_order)
        kinds = [k for k in COLORS if any(k in groups[c] for c in configs)]
        width = 0.8 / max(len(kinds), 1)
        for i, kind in enumerate(kinds):
            xs, values, low, high = [], [], [], []
            for j, config in enumerate(configs):
                stats = groups[config]
                if kind not in stats or "tdfunc Ensemble" not in stats:
                    continue
                value, lo, hi = ratio(stats[kind], stats["tdfunc Ensemble"])
                xs.append(j + (i - (len(kinds) - 1) / 2) * width)
                values.append(value)
                low.append(value - lo)
                high.append(hi - value)
                if kind != "tdfunc Ensemble":
                    lines.append(
                        f"| {title} | {config} | {kind} | {value:.2f}x ({lo:.2f}-{hi:.2f}) |"
                    )
            panel.bar(
                xs, values, width, yerr=[low, high], capsize=2, color=COLORS[kind], label=kind
            )
        panel.axhline(1, color="k", linewidth=0.8)
        panel.set_yscale("log")
        _times_axis(panel.yaxis)
        panel.set_xticks(range(len(configs)), configs)
        panel.set_title(title)
        panel.set_ylabel("time / tdfunc Ensemble's time (log)")
    panels[0].legend(fontsize=8)
    figure.suptitle(
        "Ensembles: time of each way relative to tdfunc's Ensemble (above 1: slower), "
        f"medians, 1 thread\n{run.caption()}",
        fontsize=10,
    )
    _save(figure, out / "bench-ensemble.png")
    return lines


def _bars(run: Run, group: str, labels: dict[str, str], ylabel: str, title: str, path: Path):
    plt = _plt()
    stats = run.groups[group]
    names = [n for n in labels if n in stats]
    medians = [stats[n]["median"] * 1e3 for n in names]
    errors = [
        [stats[n]["median"] * 1e3 - stats[n]["q1"] * 1e3 for n in names],
        [stats[n]["q3"] * 1e3 - stats[n]["median"] * 1e3 for n in names],
    ]
    figure, axes = plt.subplots(figsize=(6.5, 3.6))
    colors = ["tab:blue", "tab:gray", "tab:green", "tab:orange"][: len(names)]
    drawn = axes.bar([labels[n] for n in names], medians, yerr=errors, capsize=4, color=colors)
    labels_ = [f"{m:.2f} ms" for m in medians]
    axes.bar_label(drawn, labels=labels_, label_type="center", color="white", fontsize=8)
    axes.set_yscale("log")
    # bars on a log axis start at a power of ten below the lowest, so that their heights
    # compare as the ratios do; plain numbers rather than 6x10^0 on the ticks
    axes.set_ylim(bottom=10 ** math.floor(math.log10(min(medians) / 2)))
    from matplotlib.ticker import FuncFormatter

    axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axes.yaxis.set_minor_formatter(
        FuncFormatter(lambda value, _: f"{value:g}" if f"{value:g}"[0] in "25" else "")
    )
    axes.set_ylabel(ylabel)
    axes.set_title(f"{title}\n{run.caption()}", fontsize=10)
    axes.tick_params(axis="x", labelsize=8)
    _save(figure, path)
    return names, stats


def plot_optim(run: Run, out: Path) -> list[str]:
    labels = {
        "tdfunc": "tdfunc.optim.Adam\n(one step, stacked)",
        "torch_optim": "64 torch.optim.Adam\n(foreach)",
        "baseline": "hand-written\nforeach Adam",
    }
    _, stats = _bars(run, "adam-ensemble", labels, "ms per step (median, IQR; log)",
                         "One Adam step for a 64-member ensemble, per-member learning rates",
                         out / "bench-optim.png")  # fmt: skip
    value, lo, hi = ratio(stats["torch_optim"], stats["tdfunc"])
    return [f"| Adam step, 64 members | 64 torch.optim.Adam | {value:.1f}x ({lo:.1f}-{hi:.1f}) |"]


def plot_container(run: Run, out: Path) -> list[str]:
    plt = _plt()
    rows = []
    for group, stats in run.groups.items():
        if "tdfunc" in stats and "tensordict" in stats:
            rows.append((group, *ratio(stats["tensordict"], stats["tdfunc"])))
    rows.sort(key=lambda row: row[1])
    figure, axes = plt.subplots(figsize=(7, 0.22 * len(rows) + 1.4))
    ys = range(len(rows))
    values = [row[1] for row in rows]
    axes.barh(ys, values, xerr=[[v - r[2] for v, r in zip(values, rows)],
                                [r[3] - v for v, r in zip(values, rows)]],
              color=["tab:blue" if v >= 1 else "tab:red" for v in values], capsize=2)  # fmt: skip
    axes.axvline(1, color="k", linewidth=0.8)
    axes.set_xscale("log")
    _times_axis(axes.xaxis)
    axes.set_yticks(list(ys), [row[0] for row in rows], fontsize=7)
    axes.set_xlabel("tensordict's time / tdfunc's time (log; right of 1: tdfunc faster)")
    axes.set_title(f"Container operations against tensordict 0.15.3\n{run.caption()}", fontsize=10)
    _save(figure, out / "bench-container.png")
    speedups = sorted(values)
    median = speedups[len(speedups) // 2]
    return [
        f"| container ops ({len(rows)}) | tensordict | median {median:.1f}x, "
        f"from {speedups[0]:.1f}x to {speedups[-1]:.1f}x |"
    ]


def plot_persist(run: Run, out: Path) -> list[str]:
    plt = _plt()
    groups = sorted(g for g, s in run.groups.items() if "tdfunc" in s and "baseline" in s)
    figure, axes = plt.subplots(figsize=(7, 3.6))
    lines = []
    width = 0.38
    for i, (contender, label, color) in enumerate(
        (("tdfunc", "tdfunc memmap + load_memmap", "tab:blue"),
         ("baseline", "torch.save + torch.load(mmap=True)", "tab:gray"))
    ):  # fmt: skip
        stats = [run.groups[g][contender] for g in groups]
        medians = [s["median"] * 1e3 for s in stats]
        errors = [[s["median"] * 1e3 - s["q1"] * 1e3 for s in stats],
                  [s["q3"] * 1e3 - s["median"] * 1e3 for s in stats]]  # fmt: skip
        xs = [j + (i - 0.5) * width for j in range(len(groups))]
        axes.bar(xs, medians, width, yerr=errors, capsize=3, color=color, label=label)
    for group in groups:
        value, lo, hi = ratio(run.groups[group]["baseline"], run.groups[group]["tdfunc"])
        lines.append(f"| checkpoint {group} | torch.save | {value:.2f}x ({lo:.2f}-{hi:.2f}) |")
    names = {
        "persist_weights_new": "32 weights of 256 x 256 (4 MB)",
        "persist_large_new": "3 tensors of 64 MB",
        "persist_tiny_new": "1,000 leaves of 4 floats",
    }
    axes.set_xticks(range(len(groups)), [names.get(g, re.sub(r"^persist_", "", g)) for g in groups])
    axes.set_yscale("log")
    axes.set_ylabel("ms per save + load (median, IQR; log)")
    axes.set_title(f"Checkpoints: save then load, a new directory each time\n{run.caption()}",
                   fontsize=10)  # fmt: skip
    axes.legend(fontsize=8)
    _save(figure, out / "bench-persist.png")
    return lines


TRANSFORMER_KINDS = {
    "torch_func": ("torch.func", "tab:orange"),
    "loop": ("Python loop", "tab:gray"),
    "batched_by_hand": ("hand-written batched", "tab:green"),
}


def _quartiles(samples: list) -> dict:
    """A sample list as the ``median``/``q1``/``q3`` of a pytest-benchmark stats entry."""
    q1, median, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return {"median": median, "q1": q1, "q3": q3}


def plot_transformer(path: Path, out: Path) -> list[str]:
    """Ensembles of transformers from ``bench_ensemble_transformer.py --json``: forward,
    training step (each contender's time over the ensemble's) and peak memory."""
    plt = _plt()
    record = json.loads(Path(path).read_text())
    configs = sorted(record["configs"], key=_config_order)
    date = datetime.datetime.fromisoformat(record["datetime"]).strftime("%Y-%m-%d")
    figure, panels = plt.subplots(1, 3, figsize=(14, 4.2), width_ratios=(3, 3, 1.4))
    width = 0.8 / len(TRANSFORMER_KINDS)
    lines = []
    for panel, what in zip(panels, ("forward", "train step")):
        for i, (kind, (label, color)) in enumerate(TRANSFORMER_KINDS.items()):
            xs, values, low, high = [], [], [], []
            for j, config in enumerate(configs):
                samples = record["configs"][config][what]
                value, lo, hi = ratio(_quartiles(samples[kind]),
                                      _quartiles(samples["tdfunc_ensemble"]))  # fmt: skip
                xs.append(j + (i - (len(TRANSFORMER_KINDS) - 1) / 2) * width)
                values.append(value)
                low.append(value - lo)
                high.append(hi - value)
                lines.append(f"| transformer {what} | {config} | {label} | "
                             f"{value:.2f}x ({lo:.2f}-{hi:.2f}) |")  # fmt: skip
            panel.bar(xs, values, width, yerr=[low, high], capsize=2, color=color, label=label)
        panel.axhline(1, color="k", linewidth=0.8)
        panel.set_yscale("log")
        _times_axis(panel.yaxis)
        panel.set_xticks(range(len(configs)), configs, fontsize=8)
        panel.set_title("training step (forward + backward)" if what == "train step" else what)
        panel.set_ylabel("time / tdfunc Ensemble's time (log)")
    panels[0].legend(fontsize=8)
    memory = [
        record["configs"][c]["peak memory"]["tdfunc_ensemble"]
        / record["configs"][c]["peak memory"]["loop"]
        for c in configs
    ]
    drawn = panels[2].bar(range(len(configs)), memory, color="tab:blue")
    panels[2].bar_label(drawn, labels=[f"{m:.2f}" for m in memory], fontsize=8)
    panels[2].axhline(1, color="k", linewidth=0.8)
    panels[2].set_xticks(range(len(configs)), configs, fontsize=6, rotation=20)
    panels[2].set_ylim(0, max(1.3, max(memory) * 1.15))
    panels[2].set_title("peak memory of a training step", fontsize=9)
    panels[2].set_ylabel("Ensemble / loop")
    for config, value in zip(configs, memory):
        lines.append(
            f"| transformer peak memory | {config} | Python loop | {value:.2f}x the loop's |"
        )
    figure.suptitle(
        "Ensembles of transformers (N members, batch B, T tokens, width D): time of each way "
        "relative to tdfunc's Ensemble (above 1: slower), medians of interleaved runs, "
        f"1 thread\n{record['machine']}, {date}, torch {record['torch'].split('+')[0]}",
        fontsize=10,
    )
    _save(figure, out / "bench-transformer.png")
    return lines


def plot_fixed(path: Path, out: Path) -> list[str]:
    """tdfunc / its floor per row of ``fixed_cost.py --json`` (lower is better)."""
    plt = _plt()
    run = json.loads(Path(path).read_text())
    rows = [(row["name"], *ratio(row["tdfunc"], row["floor"])) for row in reversed(run["rows"])]
    figure, axes = plt.subplots(figsize=(7.5, 0.26 * len(rows) + 1.5))
    ys = range(len(rows))
    values = [row[1] for row in rows]
    spread = [[v - r[2] for v, r in zip(values, rows)], [r[3] - v for v, r in zip(values, rows)]]
    colors = ["tab:blue" if value <= 1 else "tab:orange" for value in values]
    axes.barh(ys, values, xerr=spread, color=colors, capsize=2)
    axes.axvline(1, color="k", linewidth=0.8)
    axes.set_yticks(list(ys), [row[0] for row in rows], fontsize=7)
    axes.set_xlabel("tdfunc's time / the floor's time (left of 1: tdfunc adds nothing)")
    axes.set_title(
        f"Fixed cost per call (tdfunc / floor, 1 thread)\n{run['machine']}\n{run['date']}",
        fontsize=10,
    )
    _save(figure, out / "bench-fixed.png")
    table = ["", "| case | tdfunc / floor (range) |", "| --- | --- |"]
    return table + [
        f"| {name} | {value:.2f} ({lo:.2f}-{hi:.2f}) |" for name, value, lo, hi in rows[::-1]
    ]


def _save(figure, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    _plt().close(figure)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ensemble", type=Path)
    parser.add_argument("--optim", type=Path)
    parser.add_argument("--container", type=Path)
    parser.add_argument("--persist", type=Path)
    parser.add_argument("--transformer", type=Path, help="bench_ensemble_transformer.py --json")

    parser.add_argument("--fixed", type=Path, help="what fixed_cost.py --json wrote")
    parser.add_argument("--out", type=Path, default=Path("docs/img"))
    args = parser.parse_args(argv)
    lines = ["| Claim | Against | tdfunc faster by (range) |", "| --- | --- | --- |"]
    if args.ensemble:
        lines += plot_ensemble(Run(args.ensemble, ensemble_contender), args.out)
    if args.optim:
        lines += plot_optim(Run(args.optim, suffix_contender), args.out)
    if args.container:
        lines += plot_container(Run(args.container, suffix_contender), args.out)
    if args.persist:
        lines += plot_persist(Run(args.persist, suffix_contender), args.out)
    if args.transformer:
        lines += plot_transformer(args.transformer, args.out)

    if args.fixed:
        lines += plot_fixed(args.fixed, args.out)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
