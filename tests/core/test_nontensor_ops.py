"""Bitwise ops and ``new_empty(empty_lazy=True)`` on non-tensor entries (``_core/math/arith.py``,
``_core/convert/constructors.py``), checked against the Python values."""

import operator

import pytest
import torch

from tdfunc import NonTensorData, NonTensorStack, TensorDict


@pytest.mark.parametrize("op", [operator.and_, operator.or_, operator.xor])
@pytest.mark.parametrize(("left", "right"), [(True, True), (True, False), (3, 5)])
def test_bitwise_ops_apply_to_non_tensor_values(op, left, right):
    a = TensorDict({"t": torch.ones((), dtype=torch.bool), "v": NonTensorData(left)}, [])
    b = TensorDict({"t": torch.ones((), dtype=torch.bool), "v": NonTensorData(right)}, [])
    out = op(a, b)
    assert out["v"] == op(left, right)
    assert type(out["v"]) is type(op(left, right))


def test_other_ops_keep_the_left_value():
    a = TensorDict({"t": torch.ones((), dtype=torch.int64), "v": NonTensorData("x")}, [])
    assert (a | a)["v"] == "x"
    assert (a + a)["v"] == "x"


def test_new_empty_empty_lazy_empties_stacks():
    td = TensorDict(
        {"a": NonTensorStack("a", "b").unsqueeze(-1), "n": {"s": NonTensorStack("x", "y")}},
        [2],
    )
    td["t"] = torch.zeros(2, 3)
    out = td.new_empty((4,), empty_lazy=True)
    assert isinstance(out.get("a"), NonTensorStack)
    # the batch dims are replaced, the stack's own extra dims kept (as tensordict does)
    assert out.get("a").batch_size == torch.Size([4, 1])
    assert out.get("a").tolist() == [[None]] * 4
    assert out.get(("n", "s")).tolist() == [None] * 4
    assert out["t"].shape == torch.Size([4, 3])
    assert td["a"] == [["a"], ["b"]]  # the source is unchanged
    with pytest.raises(TypeError, match="NonTensorStack"):
        td.new_empty((4,))


def test_eq_of_non_tensor_leaves_of_different_shapes_broadcasts():
    # reference: the comparison written with nested lists
    rows = [["a", "b"], ["a", "b"]]
    stacked = TensorDict({"s": NonTensorStack.from_list(rows)}, [2])
    single = TensorDict({"s": NonTensorData("a", batch_size=[2])}, [2])
    expected = torch.tensor([[value == "a" for value in row] for row in rows])
    assert torch.equal((stacked == single)["s"], expected)
    assert torch.equal((single == stacked)["s"], expected)
    other = TensorDict({"s": NonTensorStack.from_list([["a", "b", "c"]] * 2)}, [2])
    with pytest.raises(ValueError, match="do not broadcast"):
        stacked == other  # noqa: B015
