"""Shape ops: names, non-tensor stacks, dtype views and batch-size changes, each
against what torch does to a tensor of the batch shape (cases found by
test_shape_sequences.py, pinned here)."""

from __future__ import annotations

import pytest
import torch

from tdfunc import NonTensorStack, TensorClass, TensorDict

VALUES = [["a", "b", "c"], ["d", "e", "f"]]


def _named(cls=TensorDict):
    nested = TensorDict({"b": torch.arange(24.0).reshape(2, 3, 4)}, [2, 3, 4])
    data = {
        "a": torch.arange(6.0).reshape(2, 3),
        "n": nested,
        "s": NonTensorStack.from_list(VALUES),
    }
    if cls is TensorDict:
        td = TensorDict(data, [2, 3])
    else:
        td = cls(**data, batch_size=[2, 3])
    td.names = ["x", "y"]
    return td


class Box(TensorClass):
    a: torch.Tensor
    n: TensorDict
    s: object


def _codes() -> torch.Tensor:
    return torch.arange(6).reshape(2, 3)  # element i of the stack is "abcdef"[i]


def _as_values(codes: torch.Tensor) -> list:
    flat = [v for row in VALUES for v in row]
    return [_as_values(c) for c in codes] if codes.dim() else flat[int(codes)]


@pytest.mark.parametrize("cls", [TensorDict, Box])
@pytest.mark.parametrize(
    "op",
    [
        lambda x: x.narrow(1, 1, 2),
        lambda x: x.narrow(-1, 0, 2),
        lambda x: x.tensor_split(2, 1)[1],
        lambda x: torch.tensor_split(x, [1], 0)[0],
    ],
)
def test_selections_carry_a_non_tensor_stack(cls, op):
    td = _named(cls)
    out = op(td)
    assert out.get("s") == _as_values(op(_codes()))
    assert out.names == ["x", "y"]
    assert torch.equal(out.get("a"), op(td.get("a")))


def test_masked_select_carries_a_non_tensor_stack():
    td = _named()
    mask = torch.tensor([True, False])
    out = td.masked_select(mask)
    assert out["s"] == _as_values(_codes()[mask])
    assert torch.equal(out["a"], td["a"][mask])


@pytest.mark.parametrize("cls", [TensorDict, Box])
def test_flatten_and_unflatten_keep_the_names_of_the_other_dims(cls):
    td = _named(cls).unsqueeze(-1)  # [2, 3, 1], names x, y, None
    td.rename_("x", "y", "z")
    assert td.flatten(0, 1).names == [None, "z"]
    assert td["n"].flatten(0, 1).names == [None, "z", None]
    assert td.flatten(1, 1).names == ["x", "y", "z"]  # one dim: nothing merges
    out = td.unflatten(1, (3, 1))
    assert out.batch_size == torch.zeros(2, 3, 1).unflatten(1, (3, 1)).shape
    assert out.names == ["x", None, None, "z"]
    assert out["n"].names == ["x", None, None, "z", None]
    assert torch.unflatten(td, 1, (3, 1)).batch_size == out.batch_size  # dispatched


def test_view_dtype_keeps_names_and_refuses_to_resize_a_batch_dim():
    td = TensorDict({"a": torch.zeros(4, 2)}, [4], names=["x"])
    out = td.view(torch.int32)
    assert out.names == ["x"] and out["a"].dtype == torch.int32
    assert out.view(torch.int64)["a"].shape == td["a"].view(torch.int64).shape  # [4, 1]
    # torch views a [4] leaf as int64 with shape [2]: the batch dim would no longer fit
    with pytest.raises(ValueError, match=r"view.*'b'.*batch dim"):
        TensorDict({"b": torch.zeros(4)}, [4]).view(torch.int64)


def test_squeeze_takes_a_tuple_of_dims_like_torch():
    td = TensorDict({"a": torch.zeros(1, 2, 1, 5)}, [1, 2, 1], names=["x", "y", "z"])
    for dims in [(0, 2), (-1,), (0, 1), [2]]:
        out = td.squeeze(dims)
        assert out.batch_size == torch.zeros(1, 2, 1).squeeze(dims).shape
        assert out["a"].shape == out.batch_size + (5,)
        assert torch.squeeze(td, dims).batch_size == out.batch_size
    assert td.squeeze((0, 2)).names == ["y"]
    with pytest.raises(RuntimeError, match="more than once"):
        td.squeeze((0, -3))


def test_squeeze_without_a_dim_to_squeeze_does_not_share_nested_containers():
    td = _named()
    out = td.squeeze()
    out.names = ["p", "q"]  # names of the result only, as for a tensor view
    assert td.names == ["x", "y"] and td["n"].names == ["x", "y", None]
    assert out["n"].names == ["p", "q", None]
    assert out["a"].data_ptr() == td["a"].data_ptr()  # the leaves are shared (a view)


@pytest.mark.parametrize("cls", [TensorDict, Box])
def test_batch_size_setter_keeps_the_names_of_the_dims_that_stay(cls):
    td = _named(cls)
    td.batch_size = [2]
    assert td.names == ["x"] and td.get("n").names == ["x", "y", None]
    td.batch_size = [2, 3]
    assert td.names == ["x", None] and td.get("n").names == ["x", None, None]


def test_batch_size_setter_growing_into_a_named_nested_dim():
    nested = TensorDict({"b": torch.zeros(2, 3)}, [2, 3], names=["x", "w"])
    td = TensorDict({"n": nested}, [2], names=["x"])
    td.batch_size = [2, 3]  # the new dim has no name, here and in "n", which shares it
    assert td.names == ["x", None] and td["n"].names == ["x", None]


def test_auto_batch_size_stops_at_the_dims_of_a_non_tensor_stack():
    td = TensorDict({"a": torch.zeros(2, 3), "s": NonTensorStack.from_list(["u", "v"])}, [])
    assert td.auto_batch_size_().batch_size == torch.Size([2])
    assert td["s"] == ["u", "v"]
