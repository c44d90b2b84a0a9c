"""TensorClass behaves as tensordict documents it (a drop-in for tensordict users).

Each test pins one behaviour of tensordict 0.15's tensorclass: attribute typos
are errors, ``get`` reads attributes (defaults, chains, unset fields),
dicts stay dicts in ``dict``/``Any`` fields, instances are dataclasses of the
decorated class, a subclass may override ``__setattr__``, autocast fills the
fields a nested dict leaves out, and error texts name the class.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from tdfunc import TensorClass, TensorDict, tensorclass


class Inner(TensorClass):
    a: torch.Tensor
    b: torch.Tensor
    tag: str = "inner"


class Outer(TensorClass["autocast"]):
    inner: Inner
    options: dict
    anything: Any = None
    table: TensorDict | None = None


def make_outer() -> Outer:
    return Outer(
        inner={"a": torch.ones(2)},
        options={"lr": 0.1},
        anything={"k": 1},
        table={"w": torch.zeros(2, 3)},
        batch_size=[2],
    )


# ---------------------------------------------------------------------- typos
def test_assigning_a_name_that_is_not_a_field_raises():
    inner = Inner(torch.zeros(2), torch.zeros(2), batch_size=[2])
    with pytest.raises(AttributeError):
        inner.aa = torch.ones(2)  # a typo of `a`
    assert torch.equal(inner.a, torch.zeros(2))

    @tensorclass
    class Decorated:
        x: torch.Tensor

    decorated = Decorated(torch.zeros(3), batch_size=[3])
    with pytest.raises(AttributeError):
        decorated.xx = 5
    with pytest.raises(AttributeError):
        Inner(torch.zeros(2), torch.zeros(2)).set("aa", torch.ones(2))


def test_set_of_an_unknown_name_suggests_the_field():
    inner = Inner(torch.zeros(2), torch.zeros(2), batch_size=[2])
    with pytest.raises(AttributeError, match=r"Inner\.set: 'aa' is not a field.*Did you mean 'a'"):
        inner.set("aa", torch.ones(2))


# ---------------------------------------------------------------------- get
def test_get_reads_fields_with_defaults_and_chains():
    outer = make_outer()
    assert torch.equal(outer.get(("inner", "a")), torch.ones(2))
    assert outer.get(("inner", "b")) is None  # an unset field reads None, as the attribute
    assert outer.get(("inner", "b"), 7) is None
    assert outer.get(("inner", "nope"), 7) == 7
    assert outer.get("nope", "default") == "default"
    assert outer.get(("inner", "tag")) == "inner"
    assert outer.get("nope") is None  # as tensordict (indexing is where it raises)
    with pytest.raises(KeyError, match=r"Outer\.__getitem__: key 'nope' not found"):
        outer["nope"]
    assert outer["inner", "b"] is None  # indexing with the key reads the same


# ---------------------------------------------------------------------- dict fields
def test_dict_values_stay_dicts_in_dict_and_any_fields():
    outer = make_outer()
    assert outer.options == {"lr": 0.1} and type(outer.options) is dict
    assert outer.anything == {"k": 1} and type(outer.anything) is dict
    # autocast and a union annotation (TensorDict | None): the dict is kept as given
    assert type(outer.table) is dict and outer.table["w"].shape == (2, 3)

    class Plain(TensorClass):
        meta: dict
        other: Any = None

    plain = Plain({"a": [1, 2]}, other={"b": 2}, batch_size=[3])
    assert plain.meta == {"a": [1, 2]} and plain.other == {"b": 2}
    assert plain[0].meta == {"a": [1, 2]}  # indexing keeps the value
    plain.meta = {"c": 3}
    assert plain.meta == {"c": 3}
    from collections import UserDict

    mapping = UserDict({"metadata": "value"})
    assert Plain(mapping, other=mapping).other is mapping  # the object given, not a copy


# ---------------------------------------------------------------------- dataclass
def test_instances_are_dataclasses_of_the_decorated_class():
    @tensorclass
    class Point:
        xy: torch.Tensor
        label: str = "p"

    point = Point(torch.zeros(4, 2), batch_size=[4])
    assert dataclasses.is_dataclass(point) and dataclasses.is_dataclass(Point)
    assert [f.name for f in dataclasses.fields(point)] == ["xy", "label"]
    assert dataclasses.fields(Point)[1].default == "p"
    assert type(point) is Point
    assert type(point[1:]) is Point and type(point.clone()) is Point


# ---------------------------------------------------------------------- __setattr__
def test_a_subclass_may_override_setattr():
    seen = []

    class Logged(TensorClass):
        x: torch.Tensor

        def __setattr__(self, name: str, value: Any) -> None:
            seen.append(name)
            super().__setattr__(name, value * 2 if name == "x" else value)

    logged = Logged(torch.ones(2), batch_size=[2])  # the constructor assigns through it too
    assert seen == ["x"] and torch.equal(logged.x, torch.full((2,), 2.0))
    logged.x = torch.full((2,), 3.0)
    assert seen == ["x", "x"] and torch.equal(logged.x, torch.full((2,), 6.0))
    with pytest.raises(AttributeError):
        logged.y = 1  # still not a field

    class FrozenLogged(TensorClass["frozen"]):
        x: torch.Tensor

        def __setattr__(self, name: str, value: Any) -> None:
            seen.append(name)
            super().__setattr__(name, value)

    frozen = FrozenLogged(torch.ones(2), batch_size=[2])
    with pytest.raises(dataclasses.FrozenInstanceError):
        frozen.x = torch.zeros(2)
    assert torch.equal(frozen.x, torch.ones(2))


# ---------------------------------------------------------------------- autocast
def test_autocast_of_a_nested_dict_with_missing_fields():
    outer = make_outer()
    assert type(outer.inner) is Inner
    assert torch.equal(outer.inner.a, torch.ones(2))
    assert outer.inner.b is None  # left out: None
    assert outer.inner.tag == "inner"  # left out: its default
    assert outer.inner.batch_size == torch.Size([2])


# ---------------------------------------------------------------------- error texts
def test_error_texts_name_the_tensorclass():
    inner = Inner(torch.zeros(2, 3), torch.zeros(2), batch_size=[2])
    with pytest.raises(ValueError, match=r"^Inner\.reshape: "):
        inner.reshape(5)
    with pytest.raises(ValueError, match=r"^Inner\.permute: "):
        inner.permute(0, 0)
    with pytest.raises(KeyError, match=r"Inner\.__add__: both operands must have the same keys"):
        inner + TensorDict({"a": torch.zeros(2)}, [2])
    with pytest.raises(TypeError, match=r"^Inner: iteration over a Inner with batch_size=\[\]"):
        iter(inner[0])
    frozen = Frozen(torch.zeros(2), batch_size=[2])
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"^Frozen\.zero_: Frozen is frozen"):
        frozen.zero_()


class Frozen(TensorClass["frozen"]):
    x: torch.Tensor


class Labelled(TensorClass):
    x: torch.Tensor
    labels: list


@pytest.mark.parametrize("batch_size", [[3], [3, 2]])
def test_a_list_field_holds_one_item_per_element_like_a_tensordict_entry(batch_size):
    labels = [["a", "b"], ["c", "d"], ["e", "f"]] if len(batch_size) == 2 else ["a", "b", "c"]
    data = Labelled(x=torch.zeros(*batch_size, 4), labels=labels, batch_size=batch_size)
    assert data.labels == labels
    for i in range(3):  # the reference: the plain list indexed the same way
        assert data[i].labels == labels[i]
    assert data[1:].labels == labels[1:]
    td = TensorDict({"labels": labels}, batch_size)  # the same rule as a TensorDict's
    assert td[0]["labels"] == data[0].labels


def test_a_list_field_that_does_not_fit_the_batch_raises_unless_list_to_stack_is_off():
    from tdfunc import set_list_to_stack

    with pytest.raises(RuntimeError, match="batch dimension mismatch for the list at key"):
        Labelled(x=torch.zeros(3, 2), labels=["a", "b", "c"], batch_size=[3, 2])
    with set_list_to_stack(False):
        data = Labelled(x=torch.zeros(3, 2), labels=["a", "b", "c"], batch_size=[3, 2])
    assert data[0, 1].labels == ["a", "b", "c"]  # one value, shared by every element
    unbatched = Labelled(x=torch.zeros(4), labels=["a", "b", "c"], batch_size=[])
    assert unbatched.labels == ["a", "b", "c"]


def test_casting_flags_under_tensordict_class_attribute_names():
    class Cast(TensorClass["autocast"]):
        a: int

    @tensorclass(nocast=True)
    class NoCast:
        a: int

    assert Cast._autocast and not Cast._nocast
    assert NoCast._nocast and not NoCast._autocast
    assert not TensorClass._autocast and not Inner._autocast


class Node(TensorClass["autocast"]):
    value: torch.Tensor
    child: "Node" = None  # noqa: UP037 (quoted on purpose: a string twice under postponed annotations)


def test_a_quoted_self_reference_casts_to_the_class():
    node = Node(value=torch.zeros(()), child={"value": torch.ones(()), "child": None})
    assert type(node.child) is Node and node.child.value.item() == 1.0


def test_get_reads_the_properties_of_the_instance():
    inner = Inner(torch.zeros(2, 3), torch.ones(2), batch_size=[2], names=["n"])
    for name in ("batch_size", "device", "names", "shape", "batch_dims"):
        assert inner.get(name) == getattr(inner, name), name
    assert inner.get("nope") is None  # neither a field, a key nor a property
    assert TensorDict({}, [2]).get("batch_size") is None  # a TensorDict reads keys only


def test_the_constructor_assigns_fields_through_a_class_own_setattr():
    seen = []

    class Shifted(TensorClass, nocast=True):
        a: int
        b: int = 0

        def __setattr__(self, key, value):
            seen.append(key)
            super().__setattr__(key, value + 1 if key == "b" else value)

    class Child(Shifted):
        pass

    plain = {"a": torch.zeros(2, 3), "b": torch.zeros(2)}  # the reference: b shifted by one
    for cls in (Shifted, Child):
        seen.clear()
        obj = cls(a=plain["a"], b=plain["b"], batch_size=[2])
        assert seen == ["a", "b"]
        assert torch.equal(obj.a, plain["a"]) and torch.equal(obj.b, plain["b"] + 1)
        obj.b = torch.ones(2)
        assert seen == ["a", "b", "b"] and torch.equal(obj.b, torch.full((2,), 2.0))
    assert Shifted(a=torch.zeros(2), batch_size=[2]).b == 1  # the default goes through too


@pytest.mark.parametrize("op", ["view", "reshape", "unsqueeze", "permute"])
def test_a_shape_block_writes_new_fields_back_into_the_instance(op):
    @tensorclass
    class Sample:
        x: torch.Tensor
        label: str

    data = Sample(x=None, label="t", batch_size=[3, 4])
    args = {"view": (-1,), "reshape": (12,), "unsqueeze": (0,), "permute": (1, 0)}[op]
    value = torch.arange(60.0)  # the reference: the same values viewed back to [3, 4, 5]
    with getattr(data, op)(*args) as shaped:
        assert isinstance(shaped, Sample)
        shaped.x = (
            value.reshape(*shaped.batch_size, 5)
            if op != "permute"
            else (value.reshape(3, 4, 5).permute(1, 0, 2))
        )
    assert torch.equal(data.x, value.reshape(3, 4, 5))


def test_the_inner_tensordict_under_tensordicts_attribute_name():
    inner = Inner(torch.zeros(2, 3), torch.ones(2), batch_size=[2])
    assert type(inner._tensordict) is TensorDict
    assert inner._tensordict is inner._tensordict  # the instance's own, not a copy
    inner._tensordict["a"] += 1  # writes reach the instance
    assert torch.equal(inner.a, torch.ones(2, 3))
    holder = TensorDict({"inner": inner}, [2])
    assert holder.get("inner")._tensordict is inner._tensordict


def test_a_tensor_only_class_keeps_a_non_tensor_data_field_wrapped():
    from collections import UserDict

    from tdfunc import NonTensorData

    class Tagged(TensorClass["tensor_only"]):
        tag: NonTensorData
        x: torch.Tensor | None = None

    mapping = UserDict({"metadata": "value"})
    tagged = Tagged(tag=mapping)
    assert isinstance(tagged.tag, NonTensorData) and tagged.tag.data is mapping
    batched = Tagged(tag=NonTensorData("s"), x=torch.zeros(3), batch_size=[3])
    assert batched.tag.batch_size == (3,) and batched[1].tag.data == "s"
    with pytest.raises(TypeError, match="expects a tensor"):
        batched.x = "not a tensor"  # the other fields stay tensor-only
