"""A MAML meta-gradient step: TensorDict params beside plain dicts with ``functional_call``.

One step is ``grad(meta_loss)(params, *tasks)``: for each of 8 sine-regression
tasks (10 support and 10 query points, vmapped) one inner SGD step with
``grad``, then the query loss; the meta-gradient is second order (through the
inner step). Model: ``1 -> 40 -> 40 -> 1`` MLP with ReLU.

- ``tdfunc``: a ``TensorDict`` of params, ``to_module`` inside the loss, the inner
  update as TensorDict arithmetic ``params - lr * grads``;
- ``dict``: the same with ``torch.func.functional_call`` and a dict comprehension;
- ``tensordict``: the ``tensordict`` library's ``from_module``/``to_module`` and
  arithmetic (last in the file: importing it patches ``torch._functorch.vmap`` for
  the rest of the process).

Target (ratio of medians): ``tdfunc`` within 1.15x of ``dict``.

Run this file in its own pytest process for clean ratios: a ``tensordict``
benchmark in a file collected earlier leaves vmap patched for this one.

    .venv-bench/bin/python -m pytest benchmarks/bench_maml.py --benchmark-enable -q
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from tdfunc import TensorDict

TASKS, SHOTS, INNER_LR = 8, 10, 0.01


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(1, 40), nn.ReLU(), nn.Linear(40, 40), nn.ReLU(), nn.Linear(40, 1)
    )


def make_tasks():
    generator = torch.Generator().manual_seed(1)
    amplitude = torch.rand(TASKS, 1, 1, generator=generator) * 4.5 + 0.5
    phase = torch.rand(TASKS, 1, 1, generator=generator) * torch.pi
    x_support = torch.rand(TASKS, SHOTS, 1, generator=generator) * 10 - 5
    x_query = torch.rand(TASKS, SHOTS, 1, generator=generator) * 10 - 5
    return (
        x_support,
        amplitude * torch.sin(x_support + phase),
        x_query,
        amplitude * torch.sin(x_query + phase),
    )


def meta_step(loss, update):
    """``grad`` of the task-averaged post-adaptation loss, given a loss and an update rule."""

    def task_loss(params, x_support, y_support, x_query, y_query):
        adapted = update(params, grad(loss)(params, x_support, y_support))
        return loss(adapted, x_query, y_query)

    def meta_loss(params, *tasks):
        return vmap(task_loss, (None, 0, 0, 0, 0))(params, *tasks).mean()

    return grad(meta_loss)


def dict_step(model):
    def loss(params, x, y):
        return F.mse_loss(functional_call(model, params, (x,)), y)

    return meta_step(loss, lambda p, g: {k: p[k] - INNER_LR * g[k] for k in p})


def module_step(model):
    """For TensorDict-like params with ``to_module`` and arithmetic (tdfunc, tensordict)."""

    def loss(params, x, y):
        with params.to_module(model):
            return F.mse_loss(model(x), y)

    return meta_step(loss, lambda p, g: p - INNER_LR * g)


@pytest.fixture(scope="module")
def reference():
    model = make_model()
    params = {k: v.detach() for k, v in model.named_parameters()}
    return dict_step(model)(params, *make_tasks())


def check(grads: dict, reference: dict) -> None:
    assert set(grads) == set(reference)
    for key, value in reference.items():
        torch.testing.assert_close(grads[key], value)


@pytest.mark.benchmark(group="maml_step")
def test_maml_step_tdfunc(benchmark, reference):
    model = make_model()
    params = TensorDict.from_module(model).detach()
    step, tasks = module_step(model), make_tasks()
    grads = benchmark(lambda: step(params, *tasks))
    check(dict(grads.flatten_keys(".").items()), reference)


@pytest.mark.benchmark(group="maml_step")
def test_maml_step_dict(benchmark, reference):
    model = make_model()
    params = {k: v.detach() for k, v in model.named_parameters()}
    step, tasks = dict_step(model), make_tasks()
    check(benchmark(lambda: step(params, *tasks)), reference)


@pytest.mark.benchmark(group="maml_step")
def test_maml_step_tensordict(benchmark, reference, tensordict_lib):
    tensordict = tensordict_lib
    model = make_model()
    params = tensordict.TensorDict.from_module(model).detach()
    step, tasks = module_step(model), make_tasks()
    grads = benchmark(lambda: step(params, *tasks))
    check(dict(grads.flatten_keys(".").items()), reference)
