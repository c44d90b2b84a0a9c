"""The batch size of a leaf-by-leaf op of two operands describes the leaves it returns.

torch broadcasts each pair of leaves; when the other operand makes them larger than the
container's batch size, the result takes the broadcast batch size (two containers) or
the op raises (a tensor operand, which broadcasts aligned on the right), never a
container whose batch size misreports its leaves.
"""

from __future__ import annotations

import pytest
import torch

from tdfunc import TensorClass, TensorDict


class Pair(TensorClass):
    a: torch.Tensor
    n: TensorDict


def _pair(lead: tuple) -> TensorDict:
    size = (*lead, 4)
    nested = TensorDict({"b": torch.randn(*size, 2)}, [*size, 2])
    return TensorDict({"a": torch.randn(*size), "n": nested}, list(size))


BINARY = {
    "add": lambda x, y: x + y,
    "rsub": lambda x, y: y.__rsub__(x),
    "eq": lambda x, y: x == y,
    "maximum": torch.maximum,
    "lerp": lambda x, y: x.lerp(y, 0.25),
    "clamp_min": lambda x, y: x.clamp_min(y),
    "where": lambda x, y: x.where(torch.zeros(x.batch_size, dtype=torch.bool), y),
}
REFERENCE = {
    "add": lambda a, b: a + b,
    "rsub": lambda a, b: a - b,
    "eq": lambda a, b: a == b,
    "maximum": torch.maximum,
    "lerp": lambda a, b: torch.lerp(a, b, 0.25),
    "clamp_min": torch.clamp_min,
    "where": lambda a, b: torch.where(torch.zeros((), dtype=torch.bool), a, b),
}


@pytest.mark.parametrize("op", list(BINARY))
@pytest.mark.parametrize("lead", [(1,), ()], ids=["batch-1x4", "batch-4"])
def test_a_container_with_a_broadcast_batch_size_gives_the_broadcast_batch_size(op, lead):
    small, large = _pair(lead), _pair((3,))
    out = BINARY[op](small, large)
    assert out.batch_size == torch.Size([3, 4])
    assert out["n"].batch_size == torch.Size([3, 4, 2])
    for key in ("a", ("n", "b")):
        expected = REFERENCE[op](small[key], large[key])
        assert out[key].shape == expected.shape and torch.equal(out[key], expected)
    # the other order already had the larger batch size
    assert BINARY[op](large, small).batch_size == torch.Size([3, 4])


def test_the_broadcast_batch_size_keeps_the_names():
    small = TensorDict({"a": torch.randn(1, 4)}, [1, 4], names=["x", "y"])
    out = small + TensorDict({"a": torch.randn(3, 4)}, [3, 4])
    assert out.batch_size == torch.Size([3, 4]) and out.names == ["x", "y"]


@pytest.mark.parametrize(
    "op",
    [
        lambda td, w: td + w,
        lambda td, w: w - td,
        lambda td, w: td < w,
        lambda td, w: td.pow(w),
        lambda td, w: td.clamp(max=w),
        lambda td, w: td.lerp(td, w),
        lambda td, w: td.where(torch.ones(4, dtype=torch.bool), w),
        lambda td, w: torch.where(torch.ones(4, dtype=torch.bool), w, td),
        lambda td, w: torch.maximum(td, w),
        lambda td, w: td + w.numpy(),
    ],
    ids=["add", "rsub", "lt", "pow", "clamp", "lerp", "where", "torch.where", "maximum", "np"],
)
def test_a_tensor_that_broadcasts_a_leaf_beyond_the_batch_size_is_refused(op):
    # torch gives the leaf shape [3, 4]; the batch size [4] would not describe it
    td = TensorDict({"a": torch.randn(4)}, [4])
    with pytest.raises(ValueError, match=r"broadcasts the leaf 'a' to shape \[3, 4\]"):
        op(td, torch.randn(3, 4))


def test_a_tensor_that_grows_a_batch_dim_of_size_one_is_refused():
    td = TensorDict({"a": torch.randn(1, 2), "n": {"b": torch.randn(1, 2)}}, [1])
    with pytest.raises(ValueError, match="does not start with the batch size"):
        td * torch.randn(3, 2)


def test_a_tensor_aligned_with_the_batch_still_broadcasts():
    td = TensorDict({"a": torch.randn(3, 4), "n": {"b": torch.randn(3, 4)}}, [3, 4])
    w = torch.randn(4)
    for out, expected in ((td * w, td["a"] * w), (td.clamp(min=w), td["a"].clamp(min=w))):
        assert out.batch_size == torch.Size([3, 4]) and torch.equal(out["a"], expected)


def test_tensorclass_takes_the_broadcast_batch_size_too():
    small = Pair(a=torch.randn(1, 4), n=TensorDict({"b": torch.randn(1, 4, 2)}, [1, 4, 2]))
    large = Pair(a=torch.randn(3, 4), n=TensorDict({"b": torch.randn(3, 4, 2)}, [3, 4, 2]))
    small.batch_size = [1, 4]
    large.batch_size = [3, 4]
    out = small * large
    assert isinstance(out, Pair)
    assert out.batch_size == torch.Size([3, 4]) and out.n.batch_size == torch.Size([3, 4, 2])
    assert torch.equal(out.a, small.a * large.a)
    with pytest.raises(ValueError, match="batch size"):
        small * torch.randn(3, 1, 1)


@pytest.mark.parametrize("op", ["add", "eq", "maximum"])
def test_non_tensor_entries_take_the_broadcast_batch_size(op):
    small = TensorDict({"x": torch.randn(1, 4), "s": "hello"}, [1, 4])
    large = TensorDict({"x": torch.randn(3, 4), "s": "hello"}, [3, 4])
    out = BINARY[op](small, large)
    assert out.batch_size == torch.Size([3, 4])
    if op == "eq":  # the comparison of the values, one per batch element
        assert out["s"].shape == torch.Size([3, 4]) and bool(out["s"].all())
    else:
        assert out.get("s").batch_size == torch.Size([3, 4]) and out["s"] == "hello"
