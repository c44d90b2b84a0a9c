"""Train an ensemble of small MLPs on noisy ``sin(x)``: batched, against a loop and torch.func.

Run ``python -m tdfunc.demo`` (options: ``--members``, ``--steps``, ``--seed``,
``--width``, ``--rounds``, ``--threads``, ``--out``). It trains the members of an
:class:`~tdfunc.Ensemble` together (its forward runs every layer once for all members as a batched
kernel; one backward, one Adam step over the stacked parameters), each member
on its own bootstrap resample of the data. Then it trains the same members
again the two other ways: one by one in a Python loop, and with ``torch.func``
(``stack_module_state`` + ``functional_call`` in ``vmap(grad(...))``, the
PyTorch tutorial's recipe). It prints:

- which layers run batched (``Ensemble.batched_summary``);
- each member's and the ensemble's (mean prediction) test error, beside the
  error of predicting the mean of the training targets, and the errors of the
  loop- and torch.func-trained ensembles (the same computation, so the same);
- the time per training step of the three ways and the speed-ups, measured so that
  they hold on a busy machine: one intra-op thread (``torch.set_num_threads(1)``,
  ``--threads`` to change it), warm-up steps first, then rounds in which the three ways
  take turns, timed by the CPU time of this thread; medians with their interquartile
  range, and speed-ups as the median of the per-round ratios;

and writes a plot of the ensemble's mean and spread against the data beside a
bar chart of the step times (``demo_output/ensemble.png`` unless ``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.func import functional_call, grad, stack_module_state, vmap

from . import Ensemble

TRAIN_POINTS, NOISE, LR = 256, 0.1, 0.01
TRAIN_RANGE, PLOT_RANGE = 3.0, 5.5


def make_mlp(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(1, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 1)
    )


def make_data(members: int, generator: torch.Generator) -> dict:
    """Noisy ``sin`` on ``[-3, 3]``, a bootstrap resample per member, a clean test grid."""
    x = (torch.rand(TRAIN_POINTS, 1, generator=generator) * 2 - 1) * TRAIN_RANGE
    y = torch.sin(x) + NOISE * torch.randn(TRAIN_POINTS, 1, generator=generator)
    resample = torch.randint(TRAIN_POINTS, (members, TRAIN_POINTS), generator=generator)
    x_test = torch.linspace(-TRAIN_RANGE, TRAIN_RANGE, 200).unsqueeze(-1)
    return {
        "x": x,
        "y": y,
        "x_members": x[resample],  # [members, points, 1]
        "y_members": y[resample],
        "x_test": x_test,
        "y_test": torch.sin(x_test),
    }


def train_batched(ensemble: Ensemble, data: dict) -> Callable[[], None]:
    """All members in one step: a batched forward, the sum of the members' losses,
    one backward and one Adam step over the stacked parameters. Returns the step."""
    optimizer = torch.optim.Adam(ensemble.parameters(), lr=LR)
    x, y = data["x_members"], data["y_members"]

    def step() -> None:
        optimizer.zero_grad()
        losses = ((ensemble(x) - y) ** 2).mean(dim=(1, 2))  # one loss per member
        losses.sum().backward()  # members are independent: each gets its own gradient
        optimizer.step()

    return step


def train_loop(members: list[nn.Module], data: dict) -> Callable[[], None]:
    """The same training, one member after the other in a Python loop."""
    optimizers = [torch.optim.Adam(m.parameters(), lr=LR) for m in members]
    xs, ys = data["x_members"], data["y_members"]

    def step() -> None:
        for model, optimizer, x, y in zip(members, optimizers, xs, ys):
            optimizer.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            optimizer.step()

    return step


def train_torch_func(members: list[nn.Module], data: dict):
    """The same training with torch.func: ``vmap(grad(loss))`` over stacked dicts of
    parameters, the gradients handed to one Adam step. Returns the step and a function
    computing the members' predictions."""
    params, buffers = stack_module_state(members)
    base = copy.deepcopy(members[0]).to("meta")
    optimizer = torch.optim.Adam(params.values(), lr=LR)

    def loss(params, buffers, x, y):
        return ((functional_call(base, (params, buffers), (x,)) - y) ** 2).mean()

    member_grads = vmap(grad(loss))
    x, y = data["x_members"], data["y_members"]

    def step() -> None:
        grads = member_grads(params, buffers, x, y)
        for name, value in params.items():
            value.grad = grads[name]
        optimizer.step()

    def predict(inputs: torch.Tensor) -> torch.Tensor:
        return vmap(lambda p, b: functional_call(base, (p, b), (inputs,)))(params, buffers)

    return step, predict


def run_steps(step: Callable[[], None], steps: int, label: str) -> None:
    """Call ``step`` ``steps`` times behind a progress bar (tqdm when it is installed and
    the output is a terminal, a line per quarter otherwise)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        tqdm = None
    if tqdm is not None and sys.stderr.isatty():
        for _ in tqdm(range(steps), desc=label, unit="step", leave=False, mininterval=0.5):
            step()
        return
    marks = {steps * quarter // 4 for quarter in range(1, 5)}
    for done in range(1, steps + 1):
        step()
        if done in marks:
            print(f"  {label}: {done}/{steps} steps", flush=True)


@contextlib.contextmanager
def pinned_threads(threads: int):
    """Run the block with ``threads`` intra-op threads, then restore the previous count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def compare_timings(
    contenders: dict[str, Callable[[], None]],
    *,
    rounds: int = 20,
    calls: int = 5,
    warmup: int = 3,
    threads: int = 1,
) -> dict[str, list[float]]:
    """Seconds per call of each contender, one sample per round.

    Timings on a shared machine drift (other processes, CPU frequency, caches), so the
    contenders take turns: every round times ``calls`` calls of each, the order rotating
    from round to round, after ``warmup`` untimed calls each. With one thread the clock is
    this thread's CPU time (``time.thread_time_ns``), which time spent waiting for the CPU
    does not inflate; with more threads, whose work that clock would miss, wall time.
    """
    clock = time.thread_time_ns if threads == 1 else time.perf_counter_ns
    names = list(contenders)
    samples: dict[str, list[float]] = {name: [] for name in names}
    with pinned_threads(threads):
        for function in contenders.values():
            for _ in range(warmup):
                function()
        for round_ in range(rounds):
            shift = round_ % len(names)
            for name in names[shift:] + names[:shift]:
                function = contenders[name]
                start = clock()
                for _ in range(calls):
                    function()
                samples[name].append((clock() - start) / calls / 1e9)
    return samples


def spread(values: list[float]) -> tuple[float, float, float]:
    """Median and interquartile range (first and third quartiles)."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return median, q1, q3


def speed_up(fast: list[float], slow: list[float]) -> tuple[float, float, float]:
    """How many times faster ``fast`` is than ``slow``: median and IQR of the ratios of
    samples taken in the same round (paired, so a slow round slows both)."""
    return spread([s / f for f, s in zip(fast, slow)])


def plot(predictions: torch.Tensor, grid: torch.Tensor, data: dict, timings: dict, out: Path):
    """The ensemble's members, mean and spread over ``grid`` beside the step times.

    ``predictions`` is ``[members, points]``; ``timings`` maps a name to (median, q1, q3)
    in milliseconds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mean, std = predictions.mean(0), predictions.std(0)
    figure, (axes, bars) = plt.subplots(
        1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [2.2, 1]}
    )
    # The shading goes under everything: the spread it marks is the point of the plot.
    axes.axvspan(-PLOT_RANGE, -TRAIN_RANGE, color="0.92", zorder=0)
    axes.axvspan(TRAIN_RANGE, PLOT_RANGE, color="0.92", zorder=0)
    axes.scatter(data["x"], data["y"], s=6, color="0.6", label="training data", zorder=1)
    axes.plot(grid, torch.sin(grid), "k--", linewidth=1, label="sin(x)", zorder=4)
    for member in predictions:
        axes.plot(grid, member, color="tab:blue", alpha=0.25, linewidth=0.7, zorder=2)
    axes.fill_between(
        grid, mean - 2 * std, mean + 2 * std, color="tab:blue", alpha=0.2, zorder=3,
        label="mean ± 2 std",
    )  # fmt: skip
    axes.plot(grid, mean, color="tab:blue", linewidth=2, label="ensemble mean", zorder=5)
    axes.set(xlabel="x", ylabel="y", ylim=(-2.5, 2.5), xlim=(-PLOT_RANGE, PLOT_RANGE))
    axes.set_title(f"Ensemble of {len(predictions)} MLPs (shaded: outside the training range)")
    axes.legend(loc="upper left", fontsize=8)
    names = list(timings)
    medians = [timings[name][0] for name in names]
    errors = [
        [timings[name][0] - timings[name][1] for name in names],
        [timings[name][2] - timings[name][0] for name in names],
    ]
    drawn = bars.bar(
        names, medians, yerr=errors, capsize=4, color=["tab:blue", "tab:orange", "tab:gray"]
    )
    bars.bar_label(
        drawn, labels=[f"{v:.2f}" for v in medians], label_type="center", color="white",
        fontsize=9,
    )  # fmt: skip
    bars.set(
        ylabel="ms per training step (median, bars: IQR)",
        title="one training step, all members, 1 thread",
    )
    bars.tick_params(axis="x", labelsize=8)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m tdfunc.demo", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--members", type=int, default=8, help="ensemble size (default 8)")
    parser.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--width", type=int, default=32, help="hidden width (default 32)")
    parser.add_argument(
        "--rounds", type=int, default=20, help="timing rounds, 5 steps each (default 20)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="intra-op threads for training and timing (default 1)",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("demo_output/ensemble.png"), help="where to write the plot"
    )
    args = parser.parse_args(argv)
    if args.members < 2 or args.steps < 1 or args.width < 1 or args.rounds < 1:
        parser.error("--members must be at least 2, --steps, --width and --rounds at least 1")
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    with pinned_threads(args.threads):
        return _run(args)


def _run(args: argparse.Namespace) -> dict:
    torch.manual_seed(args.seed)
    data = make_data(args.members, torch.Generator().manual_seed(args.seed))
    ensemble = Ensemble(make_mlp(args.width), num_members=args.members, in_dims=0)
    members = [ensemble.member(k) for k in range(args.members)]  # same initial values
    func_members = copy.deepcopy(members)
    print(
        f"tdfunc demo: {args.members} MLPs (1-{args.width}-{args.width}-1), noisy sin(x), "
        f"{TRAIN_POINTS} points (a bootstrap resample per member), {args.steps} Adam steps, "
        f"{args.threads} thread{'s' if args.threads > 1 else ''} (torch.set_num_threads)"
    )
    print(f"batched ensemble: {ensemble.batched_summary}")

    steps = {
        "batched Ensemble": train_batched(ensemble, data),
        "torch.func": None,
        "Python loop": train_loop(members, data),
    }
    steps["torch.func"], func_predict = train_torch_func(func_members, data)
    for label, step in steps.items():
        run_steps(step, args.steps, f"training ({label})")

    ensemble.in_dims = None  # evaluate every member on the same test inputs
    x_test, y_test = data["x_test"], data["y_test"]
    grid = torch.linspace(-PLOT_RANGE, PLOT_RANGE, 300).unsqueeze(-1)
    with torch.no_grad():
        predictions = ensemble(x_test)
        loop_predictions = torch.stack([member(x_test) for member in members])
        func_predictions = func_predict(x_test)
        on_grid = ensemble(grid).squeeze(-1)  # [members, points], before timing trains on
    member_errors = ((predictions - y_test) ** 2).mean(dim=(1, 2))
    ensemble_error = float(((predictions.mean(0) - y_test) ** 2).mean())
    baseline_error = float(((data["y"].mean() - y_test) ** 2).mean())
    loop_error = float(((loop_predictions.mean(0) - y_test) ** 2).mean())
    func_error = float(((func_predictions.mean(0) - y_test) ** 2).mean())
    print("test MSE (clean sin on [-3, 3]):")
    for k, error in enumerate(member_errors.tolist()):
        print(f"  member {k:2d}: {error:.5f}")
    print(f"  ensemble mean: {ensemble_error:.5f}")
    print(f"  ensemble mean, members trained one by one in a loop: {loop_error:.5f}")
    print(f"  ensemble mean, members trained with torch.func vmap(grad): {func_error:.5f}")
    print(f"  baseline (predict the mean of the training targets): {baseline_error:.5f}")

    ensemble.in_dims = 0
    clock = "CPU time of this thread" if args.threads == 1 else "wall time"
    print(
        f"timing: {args.rounds} rounds of 5 training steps per way, the ways taking turns, "
        f"after 3 warm-up steps; {args.threads} thread{'s' if args.threads > 1 else ''}, "
        f"{clock}"
    )
    samples = compare_timings(steps, rounds=args.rounds, threads=args.threads)
    timings = {name: tuple(1e3 * t for t in spread(times)) for name, times in samples.items()}
    print("time per training step, median [interquartile range]:")
    for name, (median, q1, q3) in timings.items():
        print(f"  {name}: {median:.3f} ms [{q1:.3f}-{q3:.3f}]")
    over_loop = speed_up(samples["batched Ensemble"], samples["Python loop"])
    over_func = speed_up(samples["batched Ensemble"], samples["torch.func"])
    print(
        "speed-up of the batched ensemble, median [IQR] of the per-round ratios: "
        f"{over_loop[0]:.2f}x [{over_loop[1]:.2f}-{over_loop[2]:.2f}] over the loop, "
        f"{over_func[0]:.2f}x [{over_func[1]:.2f}-{over_func[2]:.2f}] over torch.func"
    )
    plot(on_grid, grid.squeeze(-1), data, timings, args.out)
    print(f"plot written to {args.out}")
    return {
        "member_errors": member_errors.tolist(),
        "ensemble_error": ensemble_error,
        "baseline_error": baseline_error,
        "batched_ms": timings["batched Ensemble"][0],
        "loop_ms": timings["Python loop"][0],
        "torch_func_ms": timings["torch.func"][0],
        "speed_up_over_loop": over_loop,
        "speed_up_over_torch_func": over_func,
        "loop_ensemble_error": loop_error,
        "torch_func_ensemble_error": func_error,
    }


if __name__ == "__main__":
    main()
