"""A tie made after a swap plan was cached must be honoured, as on a fresh module.

Swap plans are cached per (module, key structure). Tying ``b.weight = a.weight``
keeps the key structure and every slot the plan already knows, so only the
registration itself says the plan may be stale. The reference is a copy of the
module whose parameters are assigned by hand, tie included.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import tdfunc
from tdfunc import TensorDict

X = torch.randn(2, 3)


def _model(depth: int) -> nn.Sequential:
    torch.manual_seed(depth)
    return nn.Sequential(*[nn.Linear(3, 3) for _ in range(depth)])


def _reference(model: nn.Sequential, values: dict) -> torch.Tensor:
    """``model``'s forward with ``values`` (dotted names) assigned by hand."""
    ref = copy.deepcopy(model)  # keeps ties
    with torch.no_grad():
        for name, value in values.items():
            owner, _, leaf = name.rpartition(".")
            getattr(ref.get_submodule(owner), leaf).copy_(value)
    return ref(X)


# 5 layers: a generated plan; 200 layers: one past swap_plan.SMALL slots + levels
@pytest.mark.parametrize("depth", [5, 200])
def test_tie_made_after_the_plan_fills_every_tied_slot(depth):
    model = _model(depth)
    params = TensorDict.from_module(model).exclude(("1", "weight")).apply(torch.randn_like)
    with params.to_module(model):  # caches the plan for this key structure
        pass
    model[1].weight = model[0].weight  # tie, same key structure
    with params.to_module(model):
        assert model[1].weight is params["0", "weight"]
        out = model(X)
    expected = _reference(model, dict(params.flatten_keys(".").items()))
    assert torch.equal(out, expected)
    assert model[1].weight is model[0].weight  # the tie is back after the swap


@pytest.mark.parametrize("depth", [5, 200])
def test_tie_made_after_the_plan_refuses_two_values(depth):
    model = _model(depth)
    params = TensorDict.from_module(model).apply(torch.randn_like)
    with params.to_module(model):
        pass
    model[1].weight = model[0].weight
    before = dict(model.named_parameters(remove_duplicate=False))
    with pytest.raises(ValueError, match="tied"):
        with params.to_module(model):
            pass
    after = dict(model.named_parameters(remove_duplicate=False))
    assert all(after[name] is value for name, value in before.items())


@pytest.mark.parametrize("depth", [5, 200])
def test_tie_made_after_a_functional_call_plan(depth):
    model = _model(depth)
    params = TensorDict.from_module(model).exclude(("1", "weight")).apply(torch.randn_like)
    tdfunc.functional_call(model, params, (X,))
    model[1].weight = model[0].weight
    out = tdfunc.functional_call(model, params, (X,))
    assert torch.equal(out, _reference(model, dict(params.flatten_keys(".").items())))


@pytest.mark.parametrize("depth", [5, 200])
def test_unrelated_registrations_keep_swaps_right(depth):
    model = _model(depth)
    params = TensorDict.from_module(model).apply(torch.randn_like)
    expected = _reference(model, dict(params.flatten_keys(".").items()))
    for _ in range(3):
        nn.Linear(2, 2)  # registers parameters elsewhere: the plan is checked, then kept
        model[2].register_buffer("extra", torch.zeros(1))  # a new slot no key names
        with params.to_module(model):
            assert torch.equal(model(X), expected)


def _held(model: nn.Module, name: str):
    owner, _, leaf = name.rpartition(".")
    return getattr(model.get_submodule(owner), leaf)


class _RegistersWhileWalked(nn.Sequential):
    """Registers a parameter elsewhere each time its modules are walked: what another
    thread building a model does while a swap plan for this one is being built."""

    def named_modules(self, *args, **kwargs):
        nn.Linear(1, 1)
        return super().named_modules(*args, **kwargs)


@pytest.mark.parametrize("depth", [5, 200])
def test_registration_while_a_plan_is_built_does_not_fail_the_swap(depth):
    torch.manual_seed(depth)
    model = _RegistersWhileWalked(*[nn.Linear(3, 3) for _ in range(depth)])
    model[1].weight = model[0].weight
    params = TensorDict.from_module(model).apply(torch.randn_like)
    expected = _reference(model, dict(params.flatten_keys(".").items()))
    for _ in range(3):  # every swap finds a registration since its plan's
        with params.to_module(model):
            assert model[1].weight is params["0", "weight"]
            assert torch.equal(model(X), expected)
        assert torch.equal(tdfunc.functional_call(model, params, (X,)), expected)


def test_swaps_while_another_thread_builds_modules():
    import threading

    model = _model(150)
    model[1].weight = model[0].weight
    base = dict(model.named_parameters(remove_duplicate=False))
    params = TensorDict.from_module(model)
    keys = list(params.keys(True, True))
    stop, errors = threading.Event(), []

    def build() -> None:
        while not stop.is_set():
            nn.Linear(1, 1)

    builder = threading.Thread(target=build)
    builder.start()
    try:
        for count in range(1, 40):
            part = params.select(*keys[: count * 7 % len(keys) + 1]).apply(torch.randn_like)
            values = dict(part.flatten_keys(".").items())
            with part.to_module(model):
                errors += [
                    name for name, value in values.items() if _held(model, name) is not value
                ]
    finally:
        stop.set()
        builder.join()
    assert errors == []
    assert all(
        value is base[name] for name, value in model.named_parameters(remove_duplicate=False)
    )
