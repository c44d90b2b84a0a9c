"""The three ways a swap plan runs agree: generated straight-line code
(``tdfunc/_modules/swap_fast.py``), the C-level passes (``SwapPlan.read_passes`` /
``enter_passes`` / ``write_passes`` in ``tdfunc/_modules/swap_plan.py``) and the
interpreted loops dynamo traces (``SwapPlan.swap_interpreted``).

For each module of a corpus and each mapping (fitting, or broken in one way), the
three give the same values, the same old objects, the same slots after entering and
after restoring, and refuse the same mappings.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tdfunc import TensorDict
from tdfunc._modules import swap_plan
from tdfunc._modules.module_swap import _MISMATCH


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(3, 3)
        self.decoder = nn.Linear(3, 3)
        self.decoder.weight = self.encoder.weight


class _Buffers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(3)
        self.inner = nn.Sequential(nn.Linear(3, 2), nn.ReLU(), nn.Linear(2, 1))
        self.register_buffer("scale", torch.ones(1), persistent=False)


class _ManyNames(nn.Module):
    """More distinct slot names than a large plan reads by column (one pass per name)."""

    def __init__(self) -> None:
        super().__init__()
        for index in range(70):
            self.register_parameter(f"p{index}", nn.Parameter(torch.randn(2)))
        self.inner = nn.Linear(2, 2)


class _TiedNames(nn.Module):
    """One tensor under two names (two slot names, one value), beside a tied Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(3, 3)
        self.second = nn.Linear(3, 3)
        self.second.bias = self.first.bias
        self.register_buffer("left", torch.ones(3))
        self.register_buffer("right", self.left)


MODULES = {
    "linear": lambda: nn.Linear(3, 2),
    "mlp": lambda: nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)),
    "tied": _Tied,
    "buffers and nesting": _Buffers,
    "many names": _ManyNames,
    "one tensor under two names": _TiedNames,
}


def _slots(model: nn.Module) -> dict:
    return {
        f"{prefix}.{name}" if prefix else name: value
        for prefix, sub in model.named_modules(remove_duplicate=False)
        for owner in (sub._parameters, sub._buffers)
        for name, value in owner.items()
    }


def _data(model: nn.Module) -> dict:
    params = TensorDict.from_module(model)
    return params.apply(lambda t: torch.randn_like(t.float()).to(t.dtype))._data


def _broken(model: nn.Module, how: str) -> dict:
    td = TensorDict.from_module(model).apply(torch.zeros_like)
    flat = td.flatten_keys(".")
    if how == "extra key":
        first = next(iter(flat.keys()))
        prefix = first.rpartition(".")[0]
        flat[f"{prefix}.extra" if prefix else "extra"] = torch.zeros(1)
    elif how == "missing key":
        del flat[next(iter(flat.keys()))]
    return flat.unflatten_keys(".")._data


def _plans(model: nn.Module, data: dict, monkeypatch) -> dict:
    generated = swap_plan.build_swap_plan(data, model)
    with monkeypatch.context() as patch:
        patch.setattr(swap_plan, "SMALL", 0)
        passes = swap_plan.build_swap_plan(data, model)
    traced = swap_plan.build_swap_plan(data, model, traced=True)
    assert generated.read is not generated.read_passes  # the small plan was generated
    assert passes.read == passes.read_passes
    return {"generated": generated, "passes": passes, "interpreted": traced}


def _by_slot(plan, objects) -> dict:
    """``objects`` (one per slot, in the plan's slot order) keyed by the slot itself."""
    return {
        (id(owner), name): id(value)
        for owner, name, value in zip(plan.owners, plan.names, objects, strict=True)
    }


def _enter(kind: str, plan, data):
    if kind == "interpreted":
        return plan.swap_interpreted(data)
    return plan.enter(data)


def _restore(kind: str, plan, olds) -> None:
    if kind == "interpreted":
        plan.restore_interpreted(olds)
    else:
        plan.restore(olds)


@pytest.mark.parametrize("name", list(MODULES))
def test_every_way_enters_and_restores_the_same_slots(name, monkeypatch):
    model = MODULES[name]()
    data = _data(model)
    before = _slots(model)
    results = {}
    for kind, plan in _plans(model, data, monkeypatch).items():
        olds = _enter(kind, plan, data)
        inside = _slots(model)
        _restore(kind, plan, olds)
        after = _slots(model)
        assert all(after[key] is before[key] for key in before), kind  # the same objects
        results[kind] = (_by_slot(plan, olds), {k: id(v) for k, v in inside.items()})
    assert results["generated"] == results["passes"] == results["interpreted"]


@pytest.mark.parametrize("name", list(MODULES))
def test_the_generated_read_equals_the_passes(name, monkeypatch):
    model = MODULES[name]()
    data = _data(model)
    plans = _plans(model, data, monkeypatch)
    generated, passes = plans["generated"], plans["passes"]
    values, olds = generated.read(data)
    other_values, other_olds = passes.read(data)
    assert _by_slot(generated, values) == _by_slot(passes, other_values)
    assert _by_slot(generated, olds) == _by_slot(passes, other_olds)


@pytest.mark.parametrize("name", list(MODULES))
@pytest.mark.parametrize("how", ["extra key", "missing key"])
def test_every_way_refuses_a_mapping_that_no_longer_fits(name, how, monkeypatch):
    model = MODULES[name]()
    plans = _plans(model, _data(model), monkeypatch)
    wrong = _broken(model, how)
    before = _slots(model)
    for kind, plan in plans.items():
        with pytest.raises(_MISMATCH):  # what the swap reads as "the plan does not fit"
            _enter(kind, plan, wrong)
        assert all(_slots(model)[key] is before[key] for key in before), kind  # untouched


def test_every_way_refuses_a_module_changed_since_the_plan(monkeypatch):
    model = MODULES["mlp"]()
    data = _data(model)
    plans = _plans(model, data, monkeypatch)
    model[2] = nn.Linear(4, 2)  # a new child: the plan's owners are stale
    for kind, plan in plans.items():
        if kind == "interpreted":
            continue  # built per traced call, never reused across module edits
        with pytest.raises(_MISMATCH):
            plan.enter(data)
