"""Ensemble forward: tdfunc beside torch.func, a Python loop, ``torch.baddbmm`` and ``tensordict``.

Model: an MLP ``16 -> width -> width -> 8`` (two hidden layers, tanh), a batch of
64 inputs shared by all members, N members. Configurations ``N8-w32`` and
``N16-w128``. Implementations of one group (read ratios of medians from one run):

- ``tdfunc_ensemble``: ``tdfunc.Ensemble(*models)(x)``;
- ``tdfunc_vmap``: the README's pattern, ``vmap(func, (None, 0))(x, params)`` with
  ``params = TensorDict.from_modules(*models)`` and ``to_module`` inside ``func``;
- ``torch_func``: ``torch.func.stack_module_state`` + ``functional_call`` in ``vmap``
  (the torch tutorial's recipe);
- ``loop``: ``torch.stack([m(x) for m in models])``;
- ``baddbmm``: the MLP written by hand as batched matmuls over the stacked weights;
- ``tensordict``: ``tensordict.TensorDict.from_modules`` + ``to_module`` in ``vmap``.

Gradient recording is on (the parameters require grad), as in a training step.

The ``compiled`` groups time the same forwards through ``torch.compile`` (default
inductor backend, CPU, gcc). Compiling takes tens of seconds, so those benchmarks
are skipped when benchmarking is disabled (``--benchmark-disable``, the CI smoke
run); run them with ``--benchmark-enable``.

The ``tensordict`` benchmarks come last in this file on purpose: importing
``tensordict`` patches ``torch._functorch.vmap`` for the rest of the process, and
pytest runs benchmarks in file order, so every other benchmark runs unpatched.

Targets (ratios of medians): eager ``tdfunc_ensemble`` at least 10% faster than
``torch_func``; compiled ``tdfunc_ensemble`` within 1.5x of compiled ``baddbmm``.

Run this file in its own pytest process for clean ratios: a ``tensordict``
benchmark in a file collected earlier leaves vmap patched for this one.

    .venv-bench/bin/python -m pytest benchmarks/bench_ensemble.py --benchmark-enable -q
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from torch import nn
from torch.func import functional_call, stack_module_state

from tdfunc import Ensemble, TensorDict

IN_FEATURES, OUT_FEATURES, BATCH = 16, 8, 64
CONFIGS = {"N8-w32": (8, 32), "N16-w128": (16, 128)}


def make_mlp(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(IN_FEATURES, width),
        nn.Tanh(),
        nn.Linear(width, width),
        nn.Tanh(),
        nn.Linear(width, OUT_FEATURES),
    )


@functools.lru_cache
def setup(config: str):
    """Members, shared input and the loop's reference output for one configuration."""
    members, width = CONFIGS[config]
    torch.manual_seed(0)
    models = [make_mlp(width) for _ in range(members)]
    x = torch.randn(BATCH, IN_FEATURES)
    with torch.no_grad():
        expected = torch.stack([m(x) for m in models])
    return models, x, expected


def forward_of(kind: str, models: list, x: torch.Tensor):
    """A zero-argument callable computing the ensemble's output with implementation ``kind``."""
    if kind == "tdfunc_ensemble":
        ensemble = Ensemble(*models)
        return lambda: ensemble(x)
    if kind == "tdfunc_vmap":
        params = TensorDict.from_modules(*models)
        template = copy.deepcopy(models[0]).to("meta")

        def func(x, params):
            with params.to_module(template):
                return template(x)

        vmapped = torch.vmap(func, (None, 0))
        return lambda: vmapped(x, params)
    if kind == "torch_func":
        params, buffers = stack_module_state(models)
        base = copy.deepcopy(models[0]).to("meta")

        def fmodel(params, buffers, x):
            return functional_call(base, (params, buffers), (x,))

        vmapped = torch.vmap(fmodel, in_dims=(0, 0, None))
        return lambda: vmapped(params, buffers, x)
    if kind == "loop":
        return lambda: torch.stack([m(x) for m in models])
    if kind == "baddbmm":
        weights, biases = [], []
        for index in (0, 2, 4):
            stacked_weight = torch.stack([m[index].weight.detach() for m in models])
            stacked_bias = torch.stack([m[index].bias.detach() for m in models])
            weights.append(stacked_weight.transpose(1, 2).contiguous().requires_grad_())
            biases.append(stacked_bias.unsqueeze(1).requires_grad_())
        members = len(models)

        def baddbmm_forward(x):
            h = x.expand(members, *x.shape)
            h = torch.tanh(torch.baddbmm(biases[0], h, weights[0]))
            h = torch.tanh(torch.baddbmm(biases[1], h, weights[1]))
            return torch.baddbmm(biases[2], h, weights[2])

        return functools.partial(baddbmm_forward, x)
    raise ValueError(kind)


def run(benchmark, config: str, kind: str, compiled: bool = False):
    models, x, expected = setup(config)
    forward = forward_of(kind, models, x)
    if compiled:
        forward = torch.compile(forward)
        forward()  # compile outside the timing
    out = benchmark(forward)
    torch.testing.assert_close(out.detach(), expected, rtol=1e-4, atol=1e-5)


def skip_unless_enabled(request) -> None:
    # pyproject's addopts pass --benchmark-disable; --benchmark-enable overrides it
    # (pytest-benchmark keeps both options and benchmarks when enable is set).
    config = request.config
    if config.getoption("benchmark_disable") and not config.getoption("benchmark_enable"):
        pytest.skip("compiling takes tens of seconds: run with --benchmark-enable")


# ---------------------------------------------------------------- eager forward
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize(
    "kind", ["tdfunc_ensemble", "tdfunc_vmap", "torch_func", "loop", "baddbmm"]
)
def test_forward(benchmark, config, kind):
    benchmark.group = f"ensemble_forward[{config}]"
    run(benchmark, config, kind)


# ---------------------------------------------------------------- compiled forward
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("kind", ["tdfunc_ensemble", "torch_func", "baddbmm"])
def test_forward_compiled(benchmark, request, config, kind):
    skip_unless_enabled(request)
    torch._dynamo.reset()
    benchmark.group = f"ensemble_forward_compiled[{config}]"
    run(benchmark, config, kind, compiled=True)


# ---------------------------------------------------------------- tensordict (last)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_forward_tensordict(benchmark, config):
    tensordict = pytest.importorskip("tensordict")
    benchmark.group = f"ensemble_forward[{config}]"
    models, x, expected = setup(config)
    params = tensordict.TensorDict.from_modules(*models)
    template = copy.deepcopy(models[0]).to("meta")

    def func(x, params):
        with params.to_module(template):
            return template(x)

    vmapped = torch.vmap(func, (None, 0))
    out = benchmark(lambda: vmapped(x, params))
    torch.testing.assert_close(out.detach(), expected, rtol=1e-4, atol=1e-5)
