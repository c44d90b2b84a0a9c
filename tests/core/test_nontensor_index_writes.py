"""Writes at an index into containers holding non-tensor values, and joins of
non-tensor values with tensors.

References are nested Python lists and plain tensors edited by hand.
"""

from __future__ import annotations

import pytest
import torch

from tdfunc import NonTensorStack, TensorDict


def test_whole_write_into_a_zero_dim_container_keeps_one_value():
    td = TensorDict({"s": "c", "x": torch.tensor(0.0)}, [])
    td[...] = TensorDict({"s": "E", "x": torch.tensor(1.0)}, [])
    assert td["s"] == "E"
    assert td._data["s"].batch_size == torch.Size([])
    assert td["x"].item() == 1.0


def _three():
    return TensorDict({"s": NonTensorStack("a", "b", "c"), "x": torch.zeros(3)}, [3])


def test_write_at_an_index_of_a_slice_reaches_the_parent_stack():
    td = _three()
    expected_s, expected_x = ["a", "b", "c"], [0.0, 0.0, 0.0]
    view = td[1:]
    view[0] = TensorDict({"s": "Q", "x": torch.tensor(1.0)}, [])
    expected_s[1], expected_x[1] = "Q", 1.0
    # the tensor entry writes through its view; the non-tensor entry must too
    assert list(td["s"]) == expected_s and td["x"].tolist() == expected_x
    assert list(view["s"]) == expected_s[1:]


def test_write_into_an_element_of_a_stack_reaches_it():
    td = _three()
    element = td[2]
    element[...] = TensorDict({"s": "E", "x": torch.tensor(4.0)}, [])
    assert list(td["s"]) == ["a", "b", "E"] and td["x"].tolist() == [0.0, 0.0, 4.0]


def test_write_into_a_column_of_a_2d_stack_reaches_it():
    grid = TensorDict(
        {"s": NonTensorStack.from_list([["a", "b"], ["c", "d"]]), "x": torch.zeros(2, 2)}, [2, 2]
    )
    column = grid[:, 1]
    column[0] = TensorDict({"s": "W", "x": torch.tensor(1.0)}, [])
    assert grid["s"] == [["a", "W"], ["c", "d"]]
    assert grid["x"].tolist() == [[0.0, 1.0], [0.0, 0.0]]


@pytest.mark.parametrize("join", [torch.stack, torch.cat])
def test_joining_a_non_tensor_value_with_a_tensor_names_the_entry(join):
    with_text = TensorDict({"s": "a"}, [1])
    with_tensor = TensorDict({"s": torch.zeros(1)}, [1])
    with pytest.raises(TypeError, match=r"entry 's'.*non-tensor value.*Tensor"):
        join([with_text, with_tensor], 0)
