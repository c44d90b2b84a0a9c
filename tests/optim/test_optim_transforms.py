"""Differentiating through, vmapping and compiling the functional optimizers.

The reference is a hand-written differentiable Adam on plain tensors (a list of
weights, a hand-written MLP), with ``torch.func.grad`` or ``torch.autograd``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import grad, vmap

from tdfunc import TensorDict, functional_call, optim

INNER_STEPS = 3
TASKS = 5
NAMES = ("0.weight", "0.bias", "2.weight", "2.bias")


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1))


def make_tasks():
    generator = torch.Generator().manual_seed(3)
    amplitude = torch.rand(TASKS, 1, 1, generator=generator) + 0.5
    xs = torch.rand(TASKS, 2, 6, 1, generator=generator) * 4 - 2
    ys = amplitude[:, None] * torch.sin(xs)
    return xs[:, 0], ys[:, 0], xs[:, 1], ys[:, 1]


# ------------------------------------------------------------------ the reference
def plain_forward(weights, x):
    w1, b1, w2, b2 = weights
    return torch.tanh(x @ w1.T + b1) @ w2.T + b2


def plain_loss(weights, x, y):
    return ((plain_forward(weights, x) - y) ** 2).mean()


def plain_adam_step(weights, grads, exp_avg, exp_avg_sq, step, lr, b1=0.9, b2=0.999, eps=1e-8):
    exp_avg = [b1 * m + (1 - b1) * g for m, g in zip(exp_avg, grads)]
    exp_avg_sq = [b2 * v + (1 - b2) * g * g for v, g in zip(exp_avg_sq, grads)]
    bc1, bc2 = 1 - b1**step, 1 - b2**step
    weights = [
        w - lr * (m / bc1) / ((v / bc2).sqrt() + eps)
        for w, m, v in zip(weights, exp_avg, exp_avg_sq)
    ]
    return weights, exp_avg, exp_avg_sq


def plain_adapted_loss(weights, lr, xs, ys, xq, yq):
    exp_avg = [torch.zeros_like(w) for w in weights]
    exp_avg_sq = [torch.zeros_like(w) for w in weights]
    for step in range(1, INNER_STEPS + 1):
        grads = grad(plain_loss)(weights, xs, ys)
        weights, exp_avg, exp_avg_sq = plain_adam_step(
            weights, grads, exp_avg, exp_avg_sq, step, lr
        )
    return plain_loss(weights, xq, yq)


# ------------------------------------------------------------------ tdfunc
MODEL = make_model()


def loss(params, x, y):
    return ((functional_call(MODEL, params, (x,)) - y) ** 2).mean()


def adapted_loss(params, lr, xs, ys, xq, yq):
    opt = optim.adam(lr=lr)
    state = opt.init(params)
    for _ in range(INNER_STEPS):
        updates, state = opt.update(grad(loss)(params, xs, ys), state, params)
        params = optim.apply_updates(params, updates)
    return loss(params, xq, yq)


def start():
    params = TensorDict.from_module(MODEL).detach()
    weights = [params[name.split(".")[0], name.split(".")[1]].clone() for name in NAMES]
    return params, weights


def as_list(td):
    return [td[tuple(name.split("."))] for name in NAMES]


def test_meta_gradient_through_adam_matches_hand_written():
    params, weights = start()
    lr = torch.tensor(0.05)
    tasks = [t[0] for t in make_tasks()]
    meta_params, meta_lr = grad(adapted_loss, argnums=(0, 1))(params, lr, *tasks)
    ref_weights, ref_lr = grad(plain_adapted_loss, argnums=(0, 1))(weights, lr, *tasks)
    torch.testing.assert_close(as_list(meta_params), ref_weights)
    torch.testing.assert_close(meta_lr, ref_lr)
    assert float(meta_lr.abs()) > 0


def test_meta_gradient_with_autograd_create_graph():
    """The loop most MAML code is written as: autograd.grad(create_graph=True)."""
    params, weights = start()
    params = params.apply(lambda t: t.requires_grad_())
    xs, ys, xq, yq = [t[1] for t in make_tasks()]
    opt = optim.adam(lr=0.05)
    state = opt.init(params)
    current = params
    for _ in range(INNER_STEPS):
        leaves = as_list(current)
        grads = torch.autograd.grad(loss(current, xs, ys), leaves, create_graph=True)
        grads_td = current.apply(lambda t: t)  # same structure, grads filled in below
        for name, g in zip(NAMES, grads):
            grads_td[tuple(name.split("."))] = g
        updates, state = opt.update(grads_td, state, current)
        current = optim.apply_updates(current, updates)
    meta = torch.autograd.grad(loss(current, xq, yq), as_list(params))
    reference = grad(plain_adapted_loss)(weights, 0.05, xs, ys, xq, yq)
    torch.testing.assert_close(list(meta), reference)


def test_vmap_over_tasks_equals_loop_shared_params():
    params, weights = start()
    tasks = make_tasks()

    def meta_loss(p):
        return vmap(adapted_loss, (None, None, 0, 0, 0, 0))(p, 0.05, *tasks).mean()

    batched = grad(meta_loss)(params)
    looped = [grad(plain_adapted_loss)(weights, 0.05, *[t[i] for t in tasks])
              for i in range(TASKS)]  # fmt: skip
    expected = [torch.stack(parts).mean(0) for parts in zip(*looped)]
    torch.testing.assert_close(as_list(batched), expected)


def test_vmap_over_batched_params_and_lrs_equals_loop():
    """Each task its own parameters and learning rate (params batched, lr batched)."""
    params, _weights = start()
    tasks = make_tasks()
    generator = torch.Generator().manual_seed(5)
    stacked = (
        params.expand(TASKS)
        .clone()
        .apply(lambda t: t + 0.1 * torch.randn(t.shape, generator=generator))
    )
    lrs = torch.linspace(0.01, 0.1, TASKS)
    values = vmap(adapted_loss)(stacked, lrs, *tasks)
    expected = torch.stack([
        plain_adapted_loss(as_list(stacked[i]), float(lrs[i]), *[t[i] for t in tasks])
        for i in range(TASKS)
    ])  # fmt: skip
    torch.testing.assert_close(values, expected)


def test_meta_sgd_learns_per_parameter_learning_rates():
    """Meta-SGD: lr is a pytree shaped like the parameters, differentiated through."""
    params, weights = start()
    lrs = params.apply(lambda t: torch.full_like(t, 0.1))
    xs, ys, xq, yq = [t[2] for t in make_tasks()]

    def adapted(lr_tree):
        opt = optim.sgd(lr=lr_tree)
        state = opt.init(params)
        updates, _ = opt.update(grad(loss)(params, xs, ys), state, params)
        return loss(optim.apply_updates(params, updates), xq, yq)

    def plain(lr_list):
        grads = grad(plain_loss)(weights, xs, ys)
        return plain_loss([w - a * g for w, a, g in zip(weights, lr_list, grads)], xq, yq)

    ours = grad(adapted)(lrs)
    assert isinstance(ours, TensorDict)
    torch.testing.assert_close(as_list(ours), grad(plain)(as_list(lrs)))


def test_per_member_lr_under_grad_and_vmap():
    """A learned per-member lr ([N]) gets one meta-gradient per member."""
    params, weights = start()
    members = 3
    stacked = params.expand(members).clone()
    lrs = torch.tensor([0.01, 0.05, 0.1])
    tasks = [t[:members] for t in make_tasks()]

    def total(lr):
        opt = optim.adam(lr=lr)
        state = opt.init(stacked)

        def member_loss(p, x, y):
            return loss(p, x, y)

        current = stacked
        for _ in range(INNER_STEPS):
            grads = vmap(grad(member_loss))(current, tasks[0], tasks[1])
            updates, state = opt.update(grads, state, current)
            current = optim.apply_updates(current, updates)
        return vmap(loss)(current, tasks[2], tasks[3]).sum()

    ours = grad(total)(lrs)
    expected = torch.stack([
        grad(plain_adapted_loss, argnums=1)(weights, lrs[i], *[t[i] for t in tasks])
        for i in range(members)
    ])  # fmt: skip
    torch.testing.assert_close(ours, expected)


@pytest.mark.slow
def test_compiled_inner_loop_has_no_graph_breaks():
    params, _ = start()
    xs, ys, _xq, _yq = [t[0] for t in make_tasks()]
    opt = optim.adamw(lr=0.05, weight_decay=0.01)

    def inner_loop(p, xs, ys):
        state = opt.init(p)
        for _ in range(INNER_STEPS):
            updates, state = opt.update(grad(loss)(p, xs, ys), state, p)
            p = optim.apply_updates(p, updates)
        return p, state

    torch._dynamo.reset()
    compiled = torch.compile(inner_loop, fullgraph=True, backend="aot_eager")
    got_params, got_state = compiled(params, xs, ys)
    want_params, want_state = inner_loop(params, xs, ys)
    torch.testing.assert_close(got_params, want_params)
    torch.testing.assert_close(got_state, want_state)
