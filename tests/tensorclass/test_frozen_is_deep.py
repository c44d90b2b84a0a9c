"""Frozen is deep: every mutator and metadata setter of a nested level refuses, at any depth.

The list of mutators is generated: every public method whose name ends in ``_``
(in place, as in torch) plus every property setter, so a new one is covered
without editing this file. ``MUTABLE_WHEN_FROZEN`` is the short allow-list
(with its reasons) of in-place names that do nothing on frozen data.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from tdfunc import TensorClass, TensorDict
from tdfunc._core.helpers.mixin import MUTABLE_WHEN_FROZEN


class Inner(TensorClass):
    w: torch.Tensor


class Frozen(TensorClass, frozen=True):
    x: torch.Tensor
    n: TensorDict
    inner: Inner


def _frozen() -> Frozen:
    deep = TensorDict({"c": torch.zeros(3, 2)}, [3])
    n = TensorDict({"a": torch.zeros(3, 2), "m": deep}, [3])
    return Frozen(
        x=torch.zeros(3), n=n, inner=Inner(w=torch.zeros(3, 2), batch_size=[3]), batch_size=[3]
    )


# arguments for the in-place methods that take some (anything valid on an unfrozen one)
ARGS = {
    "add_": (1.0,), "addcdiv_": (torch.ones(()), torch.ones(())), "sub_": (1.0,),
    "addcmul_": (torch.ones(()), torch.ones(())), "clamp_": (0.0, 1.0), "clamp_max_": (1.0,),
    "clamp_min_": (0.0,), "copy_at_": ("SELF", 0), "div_": (2.0,), "fill_": ("a", 1.0),
    "lerp_": ("SELF", 0.5), "masked_fill_": (torch.ones(3, dtype=torch.bool), 1.0),
    "maximum_": ("SELF",), "minimum_": ("SELF",), "mul_": (2.0,), "pow_": (2.0,),
    "apply_": (lambda t: t + 1,), "del_": ("a",), "rename_key_": ("a", "z"),
    "set_": ("a", "ONES"), "set_at_": ("a", 1.0, 0), "update_": ({"a": "ONES"},),
    "update_at_": ({"a": 1.0}, 0), "load_": ("PATH",), "load_memmap_": ("PATH",),
    "memmap_": ("PATH",), "memmap_refresh_": (), "share_memory_": (), "detach_": (),
    "requires_grad_": (), "auto_batch_size_": (), "zero_": (),
}  # fmt: skip


def _args(name: str, node, tmp_path) -> tuple:
    def fill(arg):
        if arg == "SELF":
            return node.clone()
        if arg == "ONES":
            return torch.ones(3, 2)
        if arg == "PATH":
            return tmp_path / name
        if isinstance(arg, dict):
            return {k: fill(v) for k, v in arg.items()}
        return arg

    return tuple(fill(arg) if isinstance(arg, (str, dict)) else arg for arg in ARGS.get(name, ()))


def _inplace_names() -> list[str]:
    names = {n for n in dir(TensorDict) if n.endswith("_") and not n.startswith("_")}
    return sorted(names - set(MUTABLE_WHEN_FROZEN))


def _setters() -> list[str]:
    return sorted(
        name
        for name, value in inspect.getmembers(TensorDict)
        if isinstance(value, property) and value.fset is not None and name != "is_locked"
    )


def _levels(f: Frozen) -> dict:
    return {"f.n": f.n, "f.n['m']": f.n["m"], "f.inner": f.inner}


def _snapshot(f: Frozen) -> list:
    td = f.to_tensordict()
    return [
        (key, value.clone(), value.requires_grad)
        for key, value in td.items(include_nested=True, leaves_only=True)
    ] + [(k, v.batch_size, v.names) for k, v in td.items(True) if hasattr(v, "batch_size")]


def _same(a: list, b: list) -> bool:
    if len(a) != len(b):
        return False
    for left, right in zip(a, b):
        for x, y in zip(left, right):
            if isinstance(x, torch.Tensor):
                if not torch.equal(x, y):
                    return False
            elif x != y:
                return False
    return True


@pytest.mark.parametrize("name", _inplace_names())
def test_every_inplace_method_of_a_nested_level_refuses(name, tmp_path):
    f = _frozen()
    before = _snapshot(f)
    for where, node in _levels(f).items():
        method = getattr(node, name, None)
        if method is None:
            continue
        with pytest.raises((RuntimeError, AttributeError), match="frozen"):
            method(*_args(name, node, tmp_path))
        assert _same(_snapshot(f), before), f"{where}.{name} changed frozen data"


def test_the_list_of_inplace_methods_is_not_empty_and_covers_the_issue():
    names = _inplace_names()
    assert {"requires_grad_", "apply_", "set_", "zero_", "update_"} <= set(names)
    assert set(MUTABLE_WHEN_FROZEN) <= {"lock_", "unlock_"}


@pytest.mark.parametrize("setter", _setters())
def test_every_setter_of_a_nested_level_refuses(setter):
    values = {"batch_size": [], "names": ["t"]}
    f = _frozen()
    before = _snapshot(f)
    for where, node in _levels(f).items():
        with pytest.raises((RuntimeError, AttributeError), match="frozen"):
            setattr(node, setter, values.get(setter, getattr(node, setter)))
        assert _same(_snapshot(f), before), f"{where}.{setter} changed frozen data"


@pytest.mark.parametrize(
    "call",
    [
        lambda n: n.refine_names("t"),
        lambda n: n.update({"z": torch.zeros(3)}, ignore_lock=True),
        lambda n: n.update({"a": torch.ones(3, 2)}, ignore_lock=True),
        lambda n: n.set("a", torch.ones(3, 2)),
        lambda n: n.pop("a"),
        lambda n: n.clear(),
        lambda n: n.__setitem__("a", torch.ones(3, 2)),
    ],
    ids=["refine_names", "update new", "update existing", "set", "pop", "clear", "setitem"],
)
def test_mutators_without_an_underscore_refuse_too(call):
    f = _frozen()
    before = _snapshot(f)
    for node in (f.n, f.n["m"]):
        with pytest.raises(RuntimeError, match="frozen"):
            call(node)
    assert _same(_snapshot(f), before)
    assert f.n["m"].is_locked  # update(ignore_lock=True) did not lift the freeze


def test_lock_and_unlock_change_nothing_on_frozen_data():
    f = _frozen()
    with f.n.unlock_():
        assert f.n.is_locked
    f.n["m"].lock_()
    with pytest.raises(RuntimeError, match="frozen"):
        f.n["m"]["new"] = torch.zeros(3)
