"""Entry-level methods tensordict users call: set_at_ on non-tensor leaves,
``type(dtype)``, ``create_nested``, ``entry_class``, ``filter_empty_``, ``*_like(device=)``,
nested containers with a shorter batch size, locked views, transpose's range error.

References are plain Python lists, dicts and tensors.
"""

from __future__ import annotations

import pytest
import torch

from tdfunc import NonTensorData, TensorClass, TensorDict


class Pair(TensorClass):
    x: torch.Tensor
    label: str


@pytest.mark.parametrize("method", ["update_at_", "copy_at_", "set_at_"])
def test_write_at_index_into_non_tensor_leaf(method):
    values = [0] * 10
    values[1::2] = [1] * 5  # the plain-list reference
    td = TensorDict({"val": NonTensorData(0, batch_size=[10]), "t": torch.zeros(10)}, [10])
    if method == "set_at_":
        td.set_at_("val", 1, slice(1, None, 2))
    else:
        other = TensorDict({"val": NonTensorData(1, batch_size=[5]), "t": torch.ones(5)}, [5])
        getattr(td, method)(other, slice(1, None, 2))
    assert td.get("val").tolist() == values


def test_set_at_non_tensor_nested_mask_and_locked():
    reference = ["a"] * 4
    td = TensorDict({"n": {"s": NonTensorData("a", batch_size=[4])}}, [4])
    mask = torch.tensor([True, False, True, False])
    td.set_at_(("n", "s"), "b", mask)
    reference[0] = reference[2] = "b"
    assert td["n", "s"] == reference
    td.lock_()  # an in-place write: allowed on a locked container
    td.set_at_(("n", "s"), "c", 3)
    reference[3] = "c"
    assert td["n", "s"] == reference


@pytest.mark.parametrize("kind", ["TensorDict", "TensorClass"])
def test_type_casts_every_leaf(kind):
    a, b = torch.zeros(2, 3), torch.ones(2, dtype=torch.int64)
    if kind == "TensorDict":
        obj = TensorDict({"a": a, "n": {"b": b}}, [2])
    else:
        obj = Pair(x=a, label="l", batch_size=[2])
    out = obj.type(torch.float16)
    leaves = [v for v in out.values(True, True) if isinstance(v, torch.Tensor)]
    assert leaves and all(v.dtype is torch.float16 for v in leaves)
    assert torch.equal(leaves[0], a.half())
    with pytest.raises(TypeError, match=r"torch\.dtype"):
        obj.type("torch.FloatTensor")


def test_create_nested_entry_class_filter_empty():
    td = TensorDict({"a": torch.zeros(2, 3)}, [2, 3], names=["r", "c"])
    td.create_nested(("x", "y"))
    nested = td["x", "y"]
    assert nested.batch_size == torch.Size([2, 3]) and nested.names == ["r", "c"]
    assert nested.is_empty()
    td["s"] = "text"
    assert td.entry_class("a") is torch.Tensor
    assert td.entry_class("s") is NonTensorData
    assert td.entry_class(("x", "y")) is TensorDict
    td["z", "w"] = torch.ones(2, 3)
    td.filter_empty_()
    assert sorted(td.keys(True), key=str) == sorted(["a", "s", "z", ("z", "w")], key=str)
    td.lock_()
    with pytest.raises(RuntimeError, match="locked"):
        td.create_nested("q")


@pytest.mark.parametrize("like", [torch.empty_like, torch.zeros_like, torch.ones_like])
def test_like_with_device_sets_the_device(like):
    td = TensorDict({"a": torch.zeros(2), "n": {"b": torch.zeros(2, 1)}}, [2])
    out = like(td, device="meta")
    assert out.device == torch.device("meta")
    assert out["n"].device == torch.device("meta")
    assert out["n", "b"].shape == torch.Size([2, 1])  # as like(tensor, device="meta")


def test_nested_container_with_shorter_batch_size_is_extended():
    inner_value = torch.randn(4, 3, 1)
    td = TensorDict({"a": torch.zeros(4, 3)}, [4, 3])
    inner = TensorDict({"inner": inner_value}, [])
    td["x"] = inner
    assert td["x"].batch_size == torch.Size([4, 3])
    assert inner.batch_size == torch.Size([])  # the caller's container is not changed
    assert td["x", "inner"] is inner_value  # same tensor, no copy
    with pytest.raises(ValueError, match="batch size"):
        td["y"] = TensorDict({"inner": torch.randn(4, 1)}, [])


@pytest.mark.parametrize(
    "op",
    [
        lambda t: t.reshape(-1),
        lambda t: t.view(-1),
        lambda t: t.permute(1, 0),
        lambda t: t.transpose(0, 1),
        lambda t: t.unsqueeze(0),
        lambda t: t.flatten(0, 1),
        lambda t: t.unflatten(0, (2, 2)),
    ],
)
def test_views_of_a_locked_container_are_locked(op):
    td = TensorDict({"a": torch.zeros(4, 3, 2), "n": {"b": torch.zeros(4, 3)}}, [4, 3])
    assert not op(td).is_locked
    out = op(td.lock_())
    assert out.is_locked and out["n"].is_locked
    assert not td[0].is_locked and not td.clone().is_locked  # copies are not


def test_transpose_out_of_range_is_index_and_value_error():
    td = TensorDict({"a": torch.zeros(2, 3)}, [2, 3])
    with pytest.raises(IndexError):
        torch.zeros(2, 3).transpose(-3, 0)  # torch's error type for tensors
    with pytest.raises(IndexError, match="dim0 and dim1 must be within the range"):
        td.transpose(-3, 0)
    with pytest.raises(ValueError, match="dim0 and dim1 must be within the range"):
        td.transpose(0, 2)


def test_none_entry_compares_as_an_unset_field():
    class Node(TensorClass):
        x: torch.Tensor
        child: Node | None = None

    node = Node(x=torch.ones(2), child=Node(x=torch.zeros(2), batch_size=[2]), batch_size=[2])
    plain = node.to_tensordict(retain_none=True)  # keeps the unset fields as None entries
    assert (node == plain).all()
    assert not (node == plain.apply(lambda t: t + 1)).any()
    with pytest.raises(KeyError, match="same keys"):
        _ = node == TensorDict({"x": torch.ones(2)}, [2])
