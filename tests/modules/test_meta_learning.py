"""MAML with TensorDict parameters, checked against torch.func with plain dicts.

The tdfunc version takes ``grad`` over a TensorDict of parameters, updates it
with TensorDict arithmetic (``params - lr * grads``), differentiates through
the inner loop (second order) and vmaps over tasks. The references do the same
with ``torch.func.functional_call`` on ``dict``s, and with plain
``torch.autograd.grad(create_graph=True)`` in a Python loop over tasks.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from tdfunc import TensorDict

TASKS, SHOTS, INNER_STEPS, INNER_LR = 5, 8, 2, 0.1


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                         nn.Linear(16, 1))  # fmt: skip


def sine_tasks(seed: int = 0):
    """Support and query sets of ``TASKS`` sine regression tasks: ``[TASKS, SHOTS, 1]``."""
    generator = torch.Generator().manual_seed(seed)
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


# ------------------------------------------------------------------ tdfunc
def tdfunc_maml(model: nn.Module, first_order: bool = False, inner_steps: int = INNER_STEPS):
    """The meta-loss of a TensorDict of params, tasks vmapped."""

    def loss(params, x, y):
        with params.to_module(model):
            return F.mse_loss(model(x), y)

    def adapt(params, x, y):
        for _ in range(inner_steps):
            grads = grad(loss)(params, x, y)
            if first_order:
                grads = grads.detach()
            params = params - INNER_LR * grads
        return params

    def task_loss(params, x_support, y_support, x_query, y_query):
        return loss(adapt(params, x_support, y_support), x_query, y_query)

    def meta_loss(params, *tasks):
        return vmap(task_loss, (None, 0, 0, 0, 0))(params, *tasks).mean()

    return meta_loss, adapt


# ------------------------------------------------------------------ references
def dict_maml(model: nn.Module):
    """The same with torch.func and plain dicts."""

    def loss(params, x, y):
        return F.mse_loss(functional_call(model, params, (x,)), y)

    def adapt(params, x, y):
        for _ in range(INNER_STEPS):
            grads = grad(loss)(params, x, y)
            params = {k: params[k] - INNER_LR * grads[k] for k in params}
        return params

    def task_loss(params, x_support, y_support, x_query, y_query):
        return loss(adapt(params, x_support, y_support), x_query, y_query)

    def meta_loss(params, *tasks):
        return vmap(task_loss, (None, 0, 0, 0, 0))(params, *tasks).mean()

    return meta_loss, adapt


def autograd_meta_grads(model: nn.Module, tasks, inner_steps: int = INNER_STEPS) -> dict:
    """Second-order MAML with torch.autograd only, a Python loop over tasks."""
    names = [name for name, _ in model.named_parameters()]
    params = [p for _, p in model.named_parameters()]
    losses = []
    for x_support, y_support, x_query, y_query in zip(*tasks):
        fast = params
        for _ in range(inner_steps):
            out = functional_call(model, dict(zip(names, fast)), (x_support,))
            grads = torch.autograd.grad(F.mse_loss(out, y_support), fast, create_graph=True)
            fast = [p - INNER_LR * g for p, g in zip(fast, grads)]
        out = functional_call(model, dict(zip(names, fast)), (x_query,))
        losses.append(F.mse_loss(out, y_query))
    meta_grads = torch.autograd.grad(torch.stack(losses).mean(), params)
    return dict(zip(names, meta_grads))


def assert_same(td: TensorDict, reference: dict) -> None:
    flat = td.flatten_keys(".")
    assert set(flat.keys()) == set(reference)
    for key, value in reference.items():
        torch.testing.assert_close(flat[key], value)


# ------------------------------------------------------------------ tests
def test_inner_loop_adaptation_matches_dicts():
    model = make_model()
    tasks = sine_tasks()
    _, adapt = tdfunc_maml(model)
    _, dict_adapt = dict_maml(model)
    params = TensorDict.from_module(model)
    adapted = vmap(adapt, (None, 0, 0))(params, tasks[0], tasks[1])
    assert isinstance(adapted, TensorDict) and adapted.batch_size == torch.Size([TASKS])
    expected = vmap(dict_adapt, (None, 0, 0))(dict(model.named_parameters()), tasks[0], tasks[1])
    assert_same(adapted, expected)


def test_second_order_meta_gradient_matches_torch_func_with_dicts():
    model = make_model()
    tasks = sine_tasks()
    meta_loss, _ = tdfunc_maml(model)
    dict_meta_loss, _ = dict_maml(model)
    params = TensorDict.from_module(model)
    meta_grads, value = torch.func.grad_and_value(meta_loss)(params, *tasks)
    dict_grads, dict_value = torch.func.grad_and_value(dict_meta_loss)(
        dict(model.named_parameters()), *tasks
    )
    torch.testing.assert_close(value, dict_value)
    assert isinstance(meta_grads, TensorDict)
    assert_same(meta_grads, dict_grads)


def test_meta_gradient_matches_autograd_loop_and_is_second_order():
    model = make_model()
    tasks = sine_tasks()
    meta_loss, _ = tdfunc_maml(model)
    first_order_loss, _ = tdfunc_maml(model, first_order=True)
    params = TensorDict.from_module(model)
    meta_grads = grad(meta_loss)(params, *tasks)
    assert_same(meta_grads, autograd_meta_grads(model, tasks))
    first_order = grad(first_order_loss)(params, *tasks)

    def total_norm(td):  # norm() gives one norm per leaf; the 2-norm of those is the total
        return torch.linalg.vector_norm(torch.stack(list(td.norm().values(True, True))))

    difference = total_norm(meta_grads - first_order)
    assert difference > 1e-3 * total_norm(meta_grads)  # the second-order terms are there


def test_backward_into_module_parameters():
    """``meta_loss.backward()`` fills ``model.parameters()``' ``.grad`` (for torch.optim)."""
    model = make_model()
    tasks = sine_tasks()
    meta_loss, _ = tdfunc_maml(model)
    meta_loss(TensorDict.from_module(model), *tasks).backward()
    reference = autograd_meta_grads(make_model(), tasks)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, reference[name])


def test_meta_training_matches_dicts():
    model = make_model()
    meta_loss, _ = tdfunc_maml(model)
    params = TensorDict.from_module(model).detach()
    reference_model = copy.deepcopy(model)
    dict_meta_loss, _ = dict_maml(reference_model)
    dict_params = {k: v.detach() for k, v in reference_model.named_parameters()}
    outer_lr = 0.01
    for step in range(3):
        tasks = sine_tasks(seed=step)
        params = params - outer_lr * grad(meta_loss)(params, *tasks)
        dict_grads = grad(dict_meta_loss)(dict_params, *tasks)
        dict_params = {k: v - outer_lr * dict_grads[k] for k, v in dict_params.items()}
    assert_same(params, dict_params)
    initial = dict(make_model().named_parameters())
    assert not torch.allclose(dict_params["0.weight"], initial["0.weight"])


@pytest.mark.slow
def test_compiled_maml_step_matches_autograd():
    from torch._dynamo.testing import CompileCounter

    model = make_model()
    tasks = sine_tasks()
    meta_loss, _ = tdfunc_maml(model, inner_steps=1)  # one inner step: tracing is slow
    params = TensorDict.from_module(model).detach()
    counter = CompileCounter()
    step = torch.compile(grad(meta_loss), backend=counter, fullgraph=True)
    assert_same(step(params, *tasks), autograd_meta_grads(model, tasks, inner_steps=1))
    step(params, *sine_tasks(seed=1))
    assert counter.frame_count == 1
