"""A cached swap plan and the edits a module can get between two swaps.

Some edits run torch's registration hooks (``model[i] = ...``, ``register_parameter``)
and some do not (a write into ``_modules`` itself, as torch's own quantization
``convert`` does; ``del model[i]``; ``del linear.bias``). Every one of them must reach
the next swap: each case swaps once (the plan is cached), edits, swaps again and
compares the module's slots with what the edited module holds, read from its own
dicts. Both kinds of plan run every case (generated code for small models, C-level
passes for large ones), with the edit at the root and two levels down.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tdfunc import TensorDict
from tdfunc._modules import swap_plan


@pytest.fixture(params=["straight_line", "passes"])
def plan_kind(request, monkeypatch):
    if request.param == "passes":
        monkeypatch.setattr(swap_plan, "SMALL", 0)
    return request.param


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.Linear(2, 2)
        self.mlp = nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2))


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(_Block(), _Block(), nn.Linear(2, 2))


def _slots(model: nn.Module) -> dict:
    return {
        f"{prefix}.{name}" if prefix else name: value
        for prefix, sub in model.named_modules(remove_duplicate=False)
        for owner in (sub._parameters, sub._buffers)
        for name, value in owner.items()
    }


# where the edited module sits: at the root, and two levels down (a block's Sequential)
PARENTS = {"root": lambda model: model, "nested": lambda model: model[1].mlp}


def _swap_twice_around(model, edit):
    params = TensorDict.from_module(model).apply(lambda t: torch.full_like(t, 7.0))
    with params.to_module(model):  # builds and caches the plan
        pass
    edit()
    flat = dict(params.flatten_keys(".").items())
    before = _slots(model)
    with params.to_module(model):
        inside = _slots(model)
    assert inside.keys() == before.keys()
    for name, value in inside.items():
        assert value is flat[name], name  # every slot of the edited module, swapped
    after = _slots(model)
    assert all(after[name] is before[name] for name in before)


@pytest.mark.parametrize("where", list(PARENTS))
def test_a_child_written_into_modules_directly_is_swapped(plan_kind, where):
    model = _model()
    parent = PARENTS[where](model)
    new = nn.Linear(2, 2)
    key = "2" if where == "root" else "0"

    def edit():
        parent._modules[key] = new  # no registration hook runs

    _swap_twice_around(model, edit)
    assert (model[2] if where == "root" else model[1].mlp[0]) is new


@pytest.mark.parametrize("where", list(PARENTS))
def test_a_child_deleted_without_hooks_is_a_key_error(plan_kind, where):
    model = _model()
    parent = PARENTS[where](model)
    params = TensorDict.from_module(model).apply(torch.zeros_like)
    with params.to_module(model):
        pass
    del parent[0]  # delattr: no registration hook runs
    before = _slots(model)
    with pytest.raises(KeyError, match="has no submodule"):
        params.to_module(model)
    assert all(_slots(model)[name] is value for name, value in before.items())


@pytest.mark.parametrize("where", list(PARENTS))
def test_a_deleted_parameter_is_a_key_error(plan_kind, where):
    model = _model()
    linear = model[2] if where == "root" else model[1].mlp[0]
    params = TensorDict.from_module(model).apply(torch.zeros_like)
    with params.to_module(model):
        pass
    del linear.bias
    with pytest.raises(KeyError, match="has no parameter or buffer 'bias'"):
        params.to_module(model)


@pytest.mark.parametrize("where", list(PARENTS))
def test_a_replaced_parameter_and_buffer_are_restored_as_replaced(plan_kind, where):
    model = _model()
    norm = model[0].mlp[1] if where == "nested" else None
    linear = model[2] if where == "root" else model[1].mlp[0]

    def edit():
        linear.weight = nn.Parameter(torch.ones(2, 2))
        linear._parameters["bias"] = nn.Parameter(torch.ones(2))  # no hook
        if norm is not None:
            norm._parameters["weight"] = nn.Parameter(torch.ones(2))

    _swap_twice_around(model, edit)


def test_a_parameter_registered_after_the_plan_is_swapped(plan_kind):
    model = _model()
    params = TensorDict.from_module(model).apply(torch.zeros_like)
    with params.to_module(model):
        pass
    model[1].mlp[0].register_parameter("extra", nn.Parameter(torch.ones(3)))
    model[1].register_buffer("running", torch.ones(2))
    params = TensorDict.from_module(model).apply(lambda t: torch.full_like(t, 7.0))
    flat = dict(params.flatten_keys(".").items())
    before = _slots(model)
    with params.to_module(model):
        inside = _slots(model)
    assert all(inside[name] is flat[name] for name in inside)
    assert all(_slots(model)[name] is before[name] for name in before)


class _Loose(nn.Linear):
    """A module that calls every Linear equal to itself (a structural ``__eq__``)."""

    def __eq__(self, other):
        return isinstance(other, nn.Linear)

    __hash__ = nn.Linear.__hash__


@pytest.mark.parametrize("hooked", [True, False])
@pytest.mark.parametrize("where", list(PARENTS))
def test_a_child_replaced_by_one_that_calls_itself_equal_is_swapped(plan_kind, where, hooked):
    model = _model()
    parent = PARENTS[where](model)
    key = "2" if where == "root" else "0"
    new = _Loose(2, 2)

    def edit():
        if hooked:
            setattr(parent, key, new)
        else:
            parent._modules[key] = new

    _swap_twice_around(model, edit)
    assert parent._modules[key] is new
