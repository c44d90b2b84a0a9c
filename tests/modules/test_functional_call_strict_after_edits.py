"""``functional_call(strict=True)`` after the module gained a slot no key fills.

Whether a call leaves a slot out was remembered on the cached swap plan, which
stays valid when a parameter, buffer or submodule is added elsewhere: the next
strict call used the module's own tensor for the new slot without a word. The
reference is ``torch.func.functional_call(strict=True)`` with a plain dict.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tdfunc
from tdfunc import TensorDict

X = torch.randn(2, 3)


def _model(depth: int) -> nn.Sequential:
    torch.manual_seed(depth)
    return nn.Sequential(*[nn.Linear(3, 3) for _ in range(depth)])


def _edits():
    yield "buffer", lambda model: model[0].register_buffer("extra", torch.zeros(1))
    yield "parameter", lambda model: model[1].register_parameter("p", nn.Parameter(torch.ones(1)))
    yield "submodule", lambda model: model[0].add_module("side", nn.Linear(1, 1))
    yield "bias back", lambda model: setattr(model[1], "bias", nn.Parameter(torch.zeros(3)))


# 5 layers: a generated plan; 200 layers: one past swap_plan.SMALL slots + levels
@pytest.mark.parametrize("depth", [5, 200])
@pytest.mark.parametrize("edit", [edit for _, edit in _edits()], ids=[n for n, _ in _edits()])
def test_strict_call_sees_slots_added_after_the_plan(depth, edit):
    model = _model(depth)
    model[1].bias = None  # so that "bias back" adds a slot
    params = TensorDict.from_module(model)
    plain = {name: value for name, value in params.flatten_keys(".").items()}
    expected = torch.func.functional_call(model, plain, (X,), strict=True)
    assert torch.equal(tdfunc.functional_call(model, params, (X,), strict=True), expected)
    edit(model)
    with pytest.raises(RuntimeError):
        torch.func.functional_call(model, plain, (X,), strict=True)
    before = dict(model.state_dict(keep_vars=True))
    with pytest.raises(RuntimeError, match="strict=True"):
        tdfunc.functional_call(model, params, (X,), strict=True)
    assert all(value is before[name] for name, value in model.state_dict(keep_vars=True).items())
    # not strict: the module's own tensor fills the new slot, as in torch
    expected = torch.func.functional_call(model, plain, (X,))
    assert torch.equal(tdfunc.functional_call(model, params, (X,)), expected)
