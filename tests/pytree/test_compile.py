"""``torch.compile`` of vmapped ``to_module`` code: one graph, no graph break, no recompile.

``fullgraph=True`` turns any graph break into an error; the
``CompileCounter`` backend counts graphs without generating code (fast).
References: the same models run one by one, and ``torch.func.functional_call``
with plain dicts.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounter
from torch.func import functional_call, grad, vmap

from tdfunc import TensorDict

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()  # compiled vmap wrappers share one code object across tests
    yield
    torch._dynamo.reset()


def _mlp(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))


def _slots(module: nn.Module) -> dict:
    return dict(module.named_parameters(remove_duplicate=False))


def _reference_step(model: nn.Module, x, y) -> dict:
    """One SGD step on a plain dict of the model's parameters, with functional_call."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(d):
        return ((functional_call(model, d, (x,)) - y) ** 2).mean()

    grads = grad(loss)(params)
    return {name: value - 0.1 * grads[name] for name, value in params.items()}


@pytest.mark.parametrize("plan", ["cold", "cached"])
def test_compiled_vmapped_ensemble_forward(plan):
    template = _mlp(100)
    before = _slots(template)
    models = [_mlp(seed) for seed in range(4)]
    params = TensorDict.from_modules(*models)
    x = torch.randn(5, 3)
    if plan == "cached":  # an eager call first: the swap plan is in the cache
        with params[0].to_module(template):
            template(x)

    def member(p, x):
        with p.to_module(template):
            return template(x)

    counter = CompileCounter()
    forward = torch.compile(vmap(member, (0, None)), backend=counter, fullgraph=True)
    out = forward(params, x)
    assert torch.allclose(out, torch.stack([m(x) for m in models]), atol=1e-6)
    others = [_mlp(seed) for seed in range(10, 14)]
    out = forward(TensorDict.from_modules(*others), x)  # fresh params, same shapes
    assert torch.allclose(out, torch.stack([m(x) for m in others]), atol=1e-6)
    assert counter.frame_count == 1
    assert all(_slots(template)[k] is before[k] for k in before)


def test_compiled_vmap_of_grad_step_with_to_module():
    template = _mlp(100)
    before = _slots(template)
    models = [_mlp(seed) for seed in range(3)]
    x, y = torch.randn(6, 3), torch.randn(3, 6, 2)

    def loss(p, x, y):
        with p.to_module(template):
            return ((template(x) - y) ** 2).mean()

    def step(p, x, y):
        return p - 0.1 * grad(loss)(p, x, y)

    counter = CompileCounter()
    compiled = torch.compile(vmap(step, (0, None, 0)), backend=counter, fullgraph=True)
    for group in (models, [_mlp(seed) for seed in range(20, 23)]):
        new = compiled(TensorDict.from_modules(*group), x, y)
        assert type(new) is TensorDict and new.batch_size == torch.Size([3])
        for member, model in enumerate(group):
            expected = _reference_step(model, x, y[member])
            for name, value in expected.items():
                got = new.get(tuple(name.split(".")))[member]
                assert torch.allclose(got, value, atol=1e-6), name
    assert counter.frame_count == 1
    assert all(_slots(template)[k] is before[k] for k in before)
