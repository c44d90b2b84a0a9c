"""A subclass that turns a flag on is checked against the fields it inherits."""

from __future__ import annotations

import pytest
import torch

from tdfunc import TensorClass


class Labelled(TensorClass):
    x: torch.Tensor
    label: str = "lab"


def test_tensor_only_subclass_of_a_non_tensor_field_is_refused_at_definition():
    with pytest.raises(TypeError, match=r"'label' \(inherited from Labelled\)"):

        class Fast(Labelled, tensor_only=True):
            y: torch.Tensor | None = None


def test_tensor_only_subclass_of_tensor_fields_is_accepted():
    class Pair(TensorClass):
        a: torch.Tensor
        b: int = 0

    class FastPair(Pair, tensor_only=True):
        pass

    obj = FastPair(torch.ones(2))
    assert torch.equal(obj.a, torch.ones(2))
    assert torch.equal(obj.b, torch.tensor(0))  # tensor_only stores the number as a tensor
