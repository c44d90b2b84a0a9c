"""Dataclasses to tensorclasses: ``from_dataclass`` and ``@tensorclass`` on a dataclass."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tdfunc import NonTensorData, TensorClass, from_dataclass, tensorclass


@dataclasses.dataclass
class Point:
    x: torch.Tensor
    label: int
    weight: float = 1.0

    def scaled(self):
        return self.x * self.weight


def test_a_dataclass_type_becomes_a_tensorclass():
    cls = from_dataclass(Point)
    assert issubclass(cls, TensorClass) and cls.__name__ == "Point" and cls is not Point
    assert [f.name for f in dataclasses.fields(cls)] == ["x", "label", "weight"]
    p = cls(x=torch.arange(3.0), label=2, batch_size=[3])
    assert p.batch_size == torch.Size([3]) and p.weight == 1.0
    assert torch.equal(p.scaled(), torch.arange(3.0))  # methods of the class body stay
    assert torch.equal(p[1:].x, torch.arange(3.0)[1:])
    # the dataclass itself is untouched
    assert Point(torch.zeros(1), 0).label == 0 and not issubclass(Point, TensorClass)


def test_a_tensorclass_type_is_returned_as_it_is():
    cls = from_dataclass(Point)
    assert from_dataclass(cls) is cls


def test_flags_apply_to_the_new_class():
    autocast = from_dataclass(Point, autocast=True)
    p = autocast(x=torch.zeros(2), label=0)
    assert p.label == 0 and type(p.label) is int  # an annotated int stays a Python int
    assert isinstance(p.to_tensordict()._data["label"], NonTensorData)
    frozen = from_dataclass(Point, frozen=True)
    with pytest.raises(Exception, match="frozen"):
        frozen(x=torch.zeros(2), label=0).x = torch.ones(2)


def test_an_instance_becomes_an_instance():
    plain = Point(torch.arange(4.0), 7)
    out = from_dataclass(plain)
    assert type(out).__name__ == "Point" and out.batch_size == torch.Size([])
    assert torch.equal(out.x, plain.x) and out.label.item() == 7  # numbers become tensors
    batched = from_dataclass(
        Point(torch.arange(4.0), torch.arange(4), torch.ones(4)), batch_size=[4]
    )
    assert batched.batch_size == torch.Size([4]) and torch.equal(batched[2].label, torch.tensor(2))
    Dest = from_dataclass(Point, nocast=True)
    into = from_dataclass(plain, dest_cls=Dest, auto_batch_size=True)
    assert type(into) is Dest and into.label == 7


def test_tensorclass_decorator_on_a_dataclass():
    @tensorclass
    @dataclasses.dataclass
    class Pair:
        a: torch.Tensor
        b: int = 3

    pair = Pair(a=torch.ones(2), batch_size=[2])
    assert pair.b == 3 and pair[0].a.item() == 1.0


def test_errors():
    with pytest.raises(TypeError, match="expected a dataclass"):
        from_dataclass(object())
    with pytest.raises(ValueError, match="inplace=True"):
        from_dataclass(Point, inplace=True)
