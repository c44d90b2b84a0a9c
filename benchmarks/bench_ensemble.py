"""Ensembles: tdfunc beside torch.func, a Python loop, ``torch.baddbmm`` and ``tensordict``.

Models: an MLP ``16 -> width -> width -> 8`` (two hidden layers, tanh) in the
configurations ``N8-w32`` (8 members, batch 16) and ``N16-w128`` (16 members,
batch 64), and the torch.func ensembling tutorial's model (``tutorial``: a
custom ``forward`` with ``x.flatten(1)`` and ``F.relu``, 784-128-128-10, 10
members, batch 64). A batch of inputs is shared by all members. Implementations
of one group (read ratios of medians from one run):

- ``tdfunc_ensemble``: ``tdfunc.Ensemble(*models)(x)``: batched kernels (the
  Sequential runs as a chain of batched layers, the tutorial's forward through
  its ``torch.fx`` rewrite);
- ``tdfunc_vmap``: the README's pattern, ``vmap(func, (None, 0))(x, params)`` with
  ``params = TensorDict.from_modules(*models)`` and ``to_module`` inside ``func``;
- ``torch_func``: ``torch.func.stack_module_state`` + ``functional_call`` in ``vmap``
  (the torch tutorial's recipe);
- ``loop``: ``torch.stack([m(x) for m in models])``;
- ``baddbmm``: the model written by hand as batched matmuls over stacked weights
  (pre-transposed: the fastest eager form);
- ``tensordict``: ``tensordict.TensorDict.from_modules`` + ``to_module`` in ``vmap``.

Gradient recording is on (the parameters require grad), as in a training step.
The ``train`` groups time one forward and backward of the summed squared
outputs (``torch_func`` there is ``vmap(grad(loss))``, the loop backpropagates
each member's loss).

The ``compiled`` groups time the same forwards through ``torch.compile`` (default
inductor backend, CPU, gcc). Compiling takes tens of seconds, so those benchmarks
are skipped when benchmarking is disabled (``--benchmark-disable``, the CI smoke
run); run them with ``--benchmark-enable``.

The ``tensordict`` benchmarks come last in this file on purpose: importing
``tensordict`` patches ``torch._functorch.vmap`` for the rest of the process, and
pytest runs benchmarks in file order, so every other benchmark runs unpatched.

Targets (ratios of medians, CPU, one thread): ``N8-w32`` forward within 1.3x of
``baddbmm`` and at least 4x faster than ``torch_func``; ``N16-w128`` at least 1.4x
and ``tutorial`` at least 1.3x faster than ``torch_func``; ``N8-w32`` training step
at least 3x faster than ``torch_func`` and than the loop; never slower than the loop.

    OMP_NUM_THREADS=1 python -m pytest benchmarks/bench_ensemble.py --benchmark-enable -q
"""

from __future__ import annotations

import copy
import functools

import contenders
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tdfunc import TensorDict

IN_FEATURES, OUT_FEATURES = 16, 8
# name -> (members, batch, make one member, input shape of one sample)
CONFIGS = {
    "N8-w32": (8, 16, lambda: make_mlp(32), (IN_FEATURES,)),
    "N16-w128": (16, 64, lambda: make_mlp(128), (IN_FEATURES,)),
    "tutorial": (10, 64, lambda: TutorialMLP(), (1, 28, 28)),
}


def make_mlp(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(IN_FEATURES, width),
        nn.Tanh(),
        nn.Linear(width, width),
        nn.Tanh(),
        nn.Linear(width, OUT_FEATURES),
    )


class TutorialMLP(nn.Module):
    """The model of the torch.func model-ensembling tutorial."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(784, 128)
        self.fc2 = nn.Linear(128, 128)
        self.fc3 = nn.Linear(128, 10)

    def forward(self, x):
        x = x.flatten(1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.fc2(x)
        x = F.relu(x)
        return self.fc3(x)


@functools.lru_cache
def setup(config: str):
    """Members, shared input and the loop's reference output for one configuration."""
    members, batch, make, sample = CONFIGS[config]
    torch.manual_seed(0)
    models = [make() for _ in range(members)]
    x = torch.randn(batch, *sample)
    with torch.no_grad():
        expected = torch.stack([m(x) for m in models])
    return models, x, expected


def baddbmm_of(models: list):
    """The forward written by hand: stacked, pre-transposed weights and ``torch.baddbmm``."""
    weights, biases = [], []
    names = [n for n, m in models[0].named_modules() if isinstance(m, nn.Linear)]
    for name in names:
        layers = [m.get_submodule(name) for m in models]
        weight = torch.stack([layer.weight.detach() for layer in layers])
        weights.append(weight.transpose(1, 2).contiguous().requires_grad_())
        biases.append(torch.stack([layer.bias.detach() for layer in layers]).unsqueeze(1))
        biases[-1].requires_grad_()
    members = len(models)
    activation = torch.relu if isinstance(models[0], TutorialMLP) else torch.tanh
    w0, w1, w2 = weights
    b0, b1, b2 = biases

    def forward(x):
        h = x.flatten(1).expand(members, x.shape[0], -1)
        h = activation(torch.baddbmm(b0, h, w0))
        h = activation(torch.baddbmm(b1, h, w1))
        return torch.baddbmm(b2, h, w2)

    return forward, [*weights, *biases]


def forward_of(kind: str, models: list, x: torch.Tensor):
    """A zero-argument callable computing the ensemble's output with implementation ``kind``."""
    if kind == "tdfunc_vmap":
        params = TensorDict.from_modules(*models)
        template = copy.deepcopy(models[0]).to("meta")

        def func(x, params):
            with params.to_module(template):
                return template(x)

        vmapped = torch.vmap(func, (None, 0))
        return lambda: vmapped(x, params)
    if kind == "baddbmm":
        return functools.partial(baddbmm_of(models)[0], x)
    return contenders.forward_of(kind, models, x)


def train_step_of(kind: str, models: list, x: torch.Tensor):
    """A zero-argument callable: one forward and backward of every member's loss."""
    if kind == "baddbmm":
        forward, _ = baddbmm_of(models)
        return lambda: forward(x).square().sum().backward()
    return contenders.train_step_of(kind, models, x)


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


# ---------------------------------------------------------------- eager training step
@pytest.mark.parametrize("config", ["N8-w32", "tutorial"])
@pytest.mark.parametrize("kind", ["tdfunc_ensemble", "torch_func", "loop", "baddbmm"])
def test_train_step(benchmark, config, kind):
    benchmark.group = f"ensemble_train_step[{config}]"
    models, x, _ = setup(config)
    models = copy.deepcopy(models)  # the loop accumulates gradients in its models
    benchmark(train_step_of(kind, models, x))


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
def test_forward_tensordict(benchmark, config, tensordict_lib):
    tensordict = tensordict_lib
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
