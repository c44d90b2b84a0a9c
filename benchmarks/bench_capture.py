"""A whole ensemble training step: captured, compiled and eager, beside the hand-written chain.

The step: forward of every member on a shared batch, the members' summed MSE
losses, their gradients, one Adam update of the stacked parameters. Models as in
``bench_ensemble.py``: an MLP ``16 -> width -> width -> 8`` (tanh) at ``N8-w32``
(8 members, batch 16) and ``N16-w128`` (16 members, batch 64). Contenders:

- ``handwritten``: the eager chain a careful user writes by hand: stacked,
  pre-transposed weights, ``torch.baddbmm`` layers, ``torch.autograd.grad``, and
  an in-place foreach Adam (``bench_optim.handwritten_inplace_adam``). The floor
  for eager code;
- ``tdfunc_eager``: ``Ensemble.functional_call`` + ``torch.func.grad_and_value``
  + ``tdfunc.optim.adam``, called as it is;
- ``tdfunc_captured``: the same step through :func:`tdfunc.capture_step`: on a
  CUDA device one replay of a CUDA graph per step; on the CPU the same body per
  call (plus copying the inputs into its buffers), so here it measures what the
  capture's checks and copies cost;
- ``tdfunc_compiled_captured``: the same step through ``torch.compile`` (inductor)
  inside ``capture_step``. Compiling takes tens of seconds on the CPU, so it runs
  only with ``--benchmark-enable``.

Every contender is checked against the hand-written chain after three steps from
the same initialisation before it is timed.

Target (the fixed-cost issue): on a GPU, ``tdfunc_captured`` at least 3x faster
than ``handwritten`` at ``N8-w32`` and ``N16-w128``, where the step is bound by
kernel launches. On the CPU there is no launch to save: read the CPU rows as the
price of the captured path's checks and copies, and compiled against eager.

    OMP_NUM_THREADS=1 python -m pytest benchmarks/bench_capture.py --benchmark-enable -q
    python benchmarks/bench_capture.py            # one table, CUDA if present, else CPU
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.func import grad_and_value

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ensemble import make_mlp
from bench_optim import handwritten_inplace_adam

from tdfunc import Ensemble, capture_step, optim

LR = 1e-3
# name -> (members, batch, width)
CONFIGS = {"N8-w32": (8, 16, 32), "N16-w128": (16, 64, 128)}
KINDS = ("handwritten", "tdfunc_eager", "tdfunc_captured", "tdfunc_compiled_captured")


def setup(config: str, device: str = "cpu") -> tuple[list[nn.Module], torch.Tensor, torch.Tensor]:
    members, batch, width = CONFIGS[config]
    torch.manual_seed(0)
    models = [make_mlp(width).to(device) for _ in range(members)]
    x = torch.randn(batch, 16, device=device)
    y = torch.randn(batch, 8, device=device)
    return models, x, y


def handwritten_step(models: list[nn.Module], x: torch.Tensor, y: torch.Tensor):
    """The eager floor: ``step()`` trains stacked tensors in place; ``params()`` reads them."""
    members = len(models)
    weights, biases = [], []
    for index in (0, 2, 4):
        layers = [model[index] for model in models]
        weights.append(torch.stack([layer.weight.detach() for layer in layers]).mT.contiguous())
        biases.append(torch.stack([layer.bias.detach() for layer in layers]).unsqueeze(1))
    tensors = [t.requires_grad_() for pair in zip(weights, biases) for t in pair]
    grads = [torch.zeros_like(t) for t in tensors]
    lrs = torch.full((members,), LR, device=x.device)
    adam = handwritten_inplace_adam(
        [t.detach() for t in tensors], grads,
        [torch.zeros_like(t) for t in tensors], [torch.zeros_like(t) for t in tensors], lrs,
    )  # fmt: skip
    w0, b0, w1, b1, w2, b2 = tensors
    shared = x.expand(members, *x.shape)

    def step():
        h = torch.tanh(torch.baddbmm(b0, shared, w0))
        h = torch.tanh(torch.baddbmm(b1, h, w1))
        out = torch.baddbmm(b2, h, w2)
        loss = ((out - y) ** 2).mean(dim=(1, 2)).sum()
        grads[:] = torch.autograd.grad(loss, tensors)
        adam()

    def params() -> list[torch.Tensor]:  # in the modules' layout and order, for the check
        return [
            t.detach().mT if index % 2 == 0 else t.detach().squeeze(1)
            for index, t in enumerate(tensors)
        ]

    return step, params


def tdfunc_step(models: list[nn.Module], x: torch.Tensor, y: torch.Tensor, kind: str):
    """``step()`` and ``params()`` for the tdfunc contenders."""
    ensemble = Ensemble(*copy.deepcopy(models))
    opt = optim.adam(lr=LR)

    def train_step(carry, x, y):
        params, state = carry

        def loss(p):
            return ((ensemble.functional_call(p, x) - y) ** 2).mean(dim=(1, 2)).sum()

        grads, value = grad_and_value(loss)(params)
        updates, state = opt.update(grads, state, params)
        return (optim.apply_updates(params, updates), state), value

    carry = (ensemble.params, opt.init(ensemble.params))
    if kind == "tdfunc_eager":
        holder = [(ensemble.params.detach(), carry[1])]

        def step():
            with torch.no_grad():
                holder[0], _ = train_step(holder[0], x, y)

        def params() -> list[torch.Tensor]:
            return list(holder[0][0].values(True, True))

        return step, params
    if kind == "tdfunc_compiled_captured":
        torch._dynamo.reset()
        train_step = torch.compile(train_step, fullgraph=True)
    captured = capture_step(train_step, carry, x, y)
    return (lambda: captured(x, y)), (lambda: list(ensemble.params.detach().values(True, True)))


def contender(kind: str, models: list[nn.Module], x: torch.Tensor, y: torch.Tensor):
    if kind == "handwritten":
        return handwritten_step(models, x, y)
    return tdfunc_step(models, x, y, kind)


def check(config: str, kinds: tuple[str, ...], device: str = "cpu") -> None:
    """Three steps of every contender from one initialisation give the hand-written numbers."""
    models, x, y = setup(config, device)
    step, params = handwritten_step(models, x, y)
    for _ in range(3):
        step()
    expected = params()
    for kind in kinds:
        if kind == "handwritten":
            continue
        step, params = contender(kind, models, x, y)
        for _ in range(3):
            step()
        got = params()
        assert len(got) == len(expected)
        for mine, want in zip(got, expected):
            torch.testing.assert_close(mine, want, rtol=1e-4, atol=1e-5, msg=f"{config} {kind}")


def skip_unless_enabled(request) -> None:
    config = request.config
    if config.getoption("benchmark_disable") and not config.getoption("benchmark_enable"):
        pytest.skip("compiling takes tens of seconds: run with --benchmark-enable")


# ------------------------------------------------------------------ pytest-benchmark
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("kind", KINDS)
def test_train_step(benchmark, request, config, kind):
    if kind == "tdfunc_compiled_captured":
        skip_unless_enabled(request)
    benchmark.group = f"captured_train_step[{config}]"
    check(config, ("handwritten", kind))
    models, x, y = setup(config)
    step, _ = contender(kind, models, x, y)
    benchmark(step)


# ------------------------------------------------------------------ one table
def cuda_seconds(step, samples: int = 25) -> float:
    """Median seconds of one step on a CUDA device, synchronising around each sample."""
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    step()
    torch.cuda.synchronize()
    iterations = max(1, int(2e-3 / max(time.perf_counter() - start, 1e-6)))
    times = []
    for _ in range(samples):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iterations):
            step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / iterations)
    return statistics.median(times)


def cpu_seconds(steps: dict, rounds: int = 200) -> dict:
    """Median CPU time of the thread per step, the contenders interleaved round by round."""
    for step in steps.values():
        for _ in range(5):
            step()
    samples: dict = {kind: [] for kind in steps}
    for _ in range(rounds):
        for kind, step in steps.items():
            start = time.thread_time_ns()
            step()
            samples[kind].append(time.thread_time_ns() - start)
    return {kind: statistics.median(values) * 1e-9 for kind, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--no-compile", action="store_true", help="skip the compiled contender")
    args = parser.parse_args()
    kinds = tuple(k for k in KINDS if not (args.no_compile and "compiled" in k))
    if args.device == "cpu":
        torch.set_num_threads(1)
    else:
        torch.backends.cuda.matmul.allow_tf32 = False  # compare float32 with float32
    print(f"device: {args.device} | torch {torch.__version__}")
    for config in CONFIGS:
        check(config, kinds, args.device)
        models, x, y = setup(config, args.device)
        steps = {kind: contender(kind, models, x, y)[0] for kind in kinds}
        if args.device == "cpu":
            times = cpu_seconds(steps)
        else:
            times = {kind: cuda_seconds(step) for kind, step in steps.items()}
        base = times["handwritten"]
        cells = "  ".join(f"{k} {v * 1e6:8.1f}us ({base / v:4.2f}x)" for k, v in times.items())
        print(f"{config:9s} {cells}")
    print("(x: hand-written eager chain / contender; above 1 is faster than the chain)")


if __name__ == "__main__":
    main()
