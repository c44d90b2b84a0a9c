"""Train an ensemble of small MLPs on noisy ``sin(x)``: batched, against a loop and torch.func.

Run ``python -m tdfunc.demo`` (options: ``--members``, ``--steps``, ``--seed``,
``--width``, ``--out``). It trains the members of an :class:`~tdfunc.Ensemble`
together (its forward runs every layer once for all members as a batched
kernel; one backward, one Adam step over the stacked parameters), each member
on its own bootstrap resample of the data. Then it trains the same members
again the two other ways: one by one in a Python loop, and with ``torch.func``
(``stack_module_state`` + ``functional_call`` in ``vmap(grad(...))``, the
PyTorch tutorial's recipe). It prints:

- which layers run batched (``Ensemble.batched_summary``);
- each member's and the ensemble's (mean prediction) test error, beside the
  error of predicting the mean of the training targets, and the errors of the
  loop- and torch.func-trained ensembles (the same computation, so the same);
- the time per training step of the three ways and the speed-ups;

and writes a plot of the ensemble's mean and spread against the data beside a
bar chart of the step times (``demo_output/ensemble.png`` unless ``--out``).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
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


def train_batched(ensemble: Ensemble, data: dict, steps: int) -> list[float]:
    """All members in one step: a batched forward, the sum of the members' losses,
    one backward and one Adam step over the stacked parameters. Returns step times."""
    optimizer = torch.optim.Adam(ensemble.parameters(), lr=LR)
    x, y = data["x_members"], data["y_members"]

    def step() -> None:
        optimizer.zero_grad()
        losses = ((ensemble(x) - y) ** 2).mean(dim=(1, 2))  # one loss per member
        losses.sum().backward()  # members are independent: each gets its own gradient
        optimizer.step()

    return _timed(step, steps)


def train_loop(members: list[nn.Module], data: dict, steps: int) -> list[float]:
    """The same training, one member after the other in a Python loop."""
    optimizers = [torch.optim.Adam(m.parameters(), lr=LR) for m in members]
    xs, ys = data["x_members"], data["y_members"]

    def step() -> None:
        for model, optimizer, x, y in zip(members, optimizers, xs, ys):
            optimizer.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            optimizer.step()

    return _timed(step, steps)


def train_torch_func(members: list[nn.Module], data: dict, steps: int):
    """The same training with torch.func: ``vmap(grad(loss))`` over stacked dicts of
    parameters, the gradients handed to one Adam step. Returns the step times and a
    function computing the members' predictions."""
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

    return _timed(step, steps), predict


def _timed(step, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


def plot(ensemble: Ensemble, data: dict, timings: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = torch.linspace(-PLOT_RANGE, PLOT_RANGE, 300).unsqueeze(-1)
    with torch.no_grad():
        predictions = ensemble(grid).squeeze(-1)  # [members, points]
    mean, std = predictions.mean(0), predictions.std(0)
    grid = grid.squeeze(-1)
    figure, (axes, bars) = plt.subplots(
        1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [2.2, 1]}
    )
    axes.scatter(data["x"], data["y"], s=6, color="0.6", label="training data")
    axes.plot(grid, torch.sin(grid), "k--", linewidth=1, label="sin(x)")
    for member in predictions:
        axes.plot(grid, member, color="tab:blue", alpha=0.25, linewidth=0.7)
    axes.plot(grid, mean, color="tab:blue", linewidth=2, label="ensemble mean")
    axes.fill_between(
        grid, mean - 2 * std, mean + 2 * std, color="tab:blue", alpha=0.2, label="mean ± 2 std"
    )
    axes.axvspan(-PLOT_RANGE, -TRAIN_RANGE, color="0.92")
    axes.axvspan(TRAIN_RANGE, PLOT_RANGE, color="0.92")
    axes.set(xlabel="x", ylabel="y", ylim=(-2.5, 2.5))
    axes.set_title(f"Ensemble of {len(ensemble)} MLPs (shaded: outside the training range)")
    axes.legend(loc="upper left", fontsize=8)
    names, values = list(timings), list(timings.values())
    drawn = bars.bar(names, values, color=["tab:blue", "tab:orange", "tab:gray"])
    bars.bar_label(drawn, labels=[f"{v:.2f}" for v in values], fontsize=8)
    bars.set(ylabel="ms per training step (median)", title="one training step, all members")
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
    parser.add_argument("--steps", type=int, default=400, help="training steps (default 400)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--width", type=int, default=32, help="hidden width (default 32)")
    parser.add_argument(
        "--out", type=Path, default=Path("demo_output/ensemble.png"), help="where to write the plot"
    )
    args = parser.parse_args(argv)
    if args.members < 2 or args.steps < 1 or args.width < 1:
        parser.error("--members must be at least 2, --steps and --width at least 1")

    torch.manual_seed(args.seed)
    data = make_data(args.members, torch.Generator().manual_seed(args.seed))
    ensemble = Ensemble(make_mlp(args.width), num_members=args.members, in_dims=0)
    members = [ensemble.member(k) for k in range(args.members)]  # same initial values
    func_members = copy.deepcopy(members)
    print(
        f"tdfunc demo: {args.members} MLPs (1-{args.width}-{args.width}-1), noisy sin(x), "
        f"{TRAIN_POINTS} points (a bootstrap resample per member), {args.steps} Adam steps, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"batched ensemble: {ensemble.batched_summary}")

    batched_times = train_batched(ensemble, data, args.steps)
    loop_times = train_loop(members, data, args.steps)
    func_times, func_predict = train_torch_func(func_members, data, args.steps)

    ensemble.in_dims = None  # evaluate every member on the same test inputs
    x_test, y_test = data["x_test"], data["y_test"]
    with torch.no_grad():
        predictions = ensemble(x_test)
        loop_predictions = torch.stack([member(x_test) for member in members])
        func_predictions = func_predict(x_test)
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

    skip = min(5, args.steps - 1)  # warm-up steps are left out of the medians
    batched_ms = statistics.median(batched_times[skip:]) * 1e3
    loop_ms = statistics.median(loop_times[skip:]) * 1e3
    func_ms = statistics.median(func_times[skip:]) * 1e3
    print(
        f"time per training step (median): batched ensemble {batched_ms:.3f} ms, "
        f"torch.func vmap(grad) {func_ms:.3f} ms, Python loop over members {loop_ms:.3f} ms"
    )
    print(
        f"speed-up of the batched ensemble: {loop_ms / batched_ms:.2f}x over the loop, "
        f"{func_ms / batched_ms:.2f}x over torch.func"
    )
    timings = {"batched Ensemble": batched_ms, "torch.func": func_ms, "Python loop": loop_ms}
    plot(ensemble, data, timings, args.out)
    print(f"plot written to {args.out}")
    return {
        "member_errors": member_errors.tolist(),
        "ensemble_error": ensemble_error,
        "baseline_error": baseline_error,
        "batched_ms": batched_ms,
        "loop_ms": loop_ms,
        "torch_func_ms": func_ms,
        "loop_ensemble_error": loop_error,
        "torch_func_ensemble_error": func_error,
    }


if __name__ == "__main__":
    main()
