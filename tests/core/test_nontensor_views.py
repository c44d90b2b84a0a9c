"""Elements read from a NonTensorStack by basic indexing write back into it.

The reference is a nested Python list edited by hand.
"""

from __future__ import annotations

import pickle

import pytest
import torch

from tdfunc import NonTensorData, NonTensorStack, TensorDict


def test_element_write_reaches_the_stack():
    stack = NonTensorStack.from_list([["a", "b"], ["c", "d"]])
    expected = [["a", "b"], ["c", "d"]]
    row = stack[1]
    row[0] = "x"
    expected[1][0] = "x"
    assert stack.tolist() == expected and row.tolist() == ["x", "d"]
    stack[1, 1] = "y"  # written through the stack meanwhile: the row does not undo it
    expected[1][1] = "y"
    row[0] = "z"
    expected[1][0] = "z"
    assert stack.tolist() == expected and row.tolist() == ["z", "y"]


def test_element_of_element_and_update():
    stack = NonTensorStack("a", "b")
    stack[0][...] = "c"
    stack[1].update(NonTensorData("d"))
    assert stack.tolist() == ["c", "d"]
    single = NonTensorStack("a string")
    single[0][True] = NonTensorStack("another string")
    assert single[0].data == "another string"


@pytest.mark.parametrize("index", [None, True])
def test_setitem_with_new_dims(index):
    stack = NonTensorStack("0", "1")
    stack[:, index] = NonTensorStack(NonTensorStack("2", "3"), stack_dim=1)
    assert stack.tolist() == ["2", "3"]


def test_advanced_index_gives_a_copy():
    stack = NonTensorStack("a", "b")
    picked = stack[[0, 0]]  # an element twice: a copy, as for tensors
    picked[0] = "x"
    assert stack.tolist() == ["a", "b"] and picked.tolist() == ["x", "a"]


def test_element_of_a_stack_in_a_tensordict():
    td = TensorDict({"s": NonTensorStack.from_list([["a", "b"], ["c", "d"]])}, [2, 2])
    td[0].get("s")[1] = "q"
    assert td["s"] == [["a", "q"], ["c", "d"]]


def test_pickled_element_leaves_its_stack_behind():
    stack = NonTensorStack.from_list(list(range(100)))
    element = stack[3:5]
    copy = pickle.loads(pickle.dumps(element))
    assert copy.tolist() == [3, 4] and "_view_of" not in copy.__dict__
    assert len(pickle.dumps(element)) < len(pickle.dumps(stack))


def test_non_tensor_data_holds_one_value():
    leaf = NonTensorData("a", batch_size=[2])
    with pytest.raises(TypeError, match="one value for its whole batch"):
        leaf[0] = "b"
    leaf[:] = "b"
    assert leaf.tolist() == ["b", "b"] and type(leaf) is NonTensorData
    with pytest.raises(ValueError, match="Cannot update a NonTensorDataBase object"):
        NonTensorData(1, batch_size=[2]).update(NonTensorStack(2, 3))
    assert NonTensorData(1, batch_size=[2]).maybe_to_stack().update(
        NonTensorStack(2, 3)
    ).tolist() == [2, 3]


def test_in_place_writes_through_an_index_reach_the_stack():
    # as for a tensor entry: set_ / update_ on td[index] write into the parent's stack
    td = TensorDict({"x": torch.zeros(3)}, [3])
    td["st"] = NonTensorStack("a", "b", "c")
    td[0].set_("st", "Z")
    assert list(td["st"]) == ["Z", "b", "c"]
    td[1:].set_("st", NonTensorStack("P", "Q"))
    assert list(td["st"]) == ["Z", "P", "Q"]
    td[1:].update_({"st": "R", "x": torch.ones(2)})
    assert list(td["st"]) == ["Z", "R", "R"] and td["x"].tolist() == [0.0, 1.0, 1.0]
    # atomic: a bad entry of the same update writes nothing
    with pytest.raises(ValueError):
        td[0:2].update_({"st": "S", "x": torch.ones(5)})
    assert list(td["st"]) == ["Z", "R", "R"] and td["x"].tolist() == [0.0, 1.0, 1.0]
    grid = TensorDict({"x": torch.zeros(2, 2)}, [2, 2])
    grid["st"] = NonTensorStack.from_list([["a", "b"], ["c", "d"]])
    grid[:, 1].set_("st", "W")
    assert grid["st"] == [["a", "W"], ["c", "W"]]
