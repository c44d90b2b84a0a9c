"""``rename`` / ``rename_`` of batch dims (the rules of torch's former ``Tensor.rename``,
written out as lists), ``permute(dims=...)`` against ``Tensor.permute``,
``is_tensor_collection`` of classes, and the lock checked before a key lookup."""

from __future__ import annotations

import pytest
import torch

from tdfunc import TensorClass, TensorDict, TensorDictBase, is_tensor_collection


def _nested() -> TensorDict:
    return TensorDict(
        {"a": torch.arange(24.0).reshape(2, 3, 4), "n": {"b": torch.zeros(2, 3, 5)}},
        [2, 3],
        names=["x", "y"],
    )


@pytest.mark.parametrize(
    ("args", "kwargs", "reference"),
    [
        (("p", "q"), {}, ["p", "q"]),
        ((["p", "q"],), {}, ["p", "q"]),
        (("p", ...), {}, ["p", "y"]),
        ((..., "q"), {}, ["x", "q"]),
        (("p", ..., "q"), {}, ["p", "q"]),
        ((None,), {}, [None, None]),
        ((), {"y": "z"}, ["x", "z"]),
        ((), {"x": "w", "y": "z"}, ["w", "z"]),
    ],
)
def test_rename_names_follow_tensor_rename(args, kwargs, reference):
    td = _nested()
    out = td.rename(*args, **kwargs)
    assert out.names == reference
    assert out["n"].names == reference  # nested levels share the batch dims' names
    assert td.names == ["x", "y"] and td["n"].names == ["x", "y"]  # the source is untouched
    assert out["a"] is td["a"]  # a renamed view shares the tensors


def test_rename_in_place_renames_every_level():
    td = _nested()
    assert td.rename_(x="b") is td
    assert td.names == ["b", "y"]
    assert td["n"].names == ["b", "y"]


def test_rename_errors():
    td = _nested()
    with pytest.raises(ValueError, match="no batch dim is named"):
        td.rename(nope="z")
    with pytest.raises(ValueError, match="not both"):
        td.rename("p", y="z")
    with pytest.raises(ValueError):
        td.rename("p", "q", "r")


def test_rename_on_a_tensorclass():
    class Pair(TensorClass):
        a: torch.Tensor

    pair = Pair(a=torch.zeros(2, 3), batch_size=[2, 3], names=["x", "y"])
    assert pair.rename(y="z").names == ["x", "z"] and pair.names == ["x", "y"]
    assert pair.rename_(None).names == [None, None]


def test_permute_takes_dims_as_keyword():
    td = TensorDict({"a": torch.arange(24).reshape(2, 3, 4)}, [2, 3])
    reference = td["a"].permute(dims=[1, 0, 2])
    assert torch.equal(td.permute(dims=[1, 0])["a"], reference)
    assert torch.equal(td.permute([1, 0])["a"], reference)
    with pytest.raises(TypeError, match="not both"):
        td.permute(1, 0, dims=[1, 0])


def test_is_tensor_collection_of_classes_and_instances():
    class Pair(TensorClass):
        a: torch.Tensor

    for obj in (TensorDict, TensorDictBase, Pair, TensorDict(), Pair(a=torch.zeros(()))):
        assert is_tensor_collection(obj)
    for obj in (dict, torch.Tensor, {}, torch.zeros(()), "text", None):
        assert not is_tensor_collection(obj)


def test_a_class_stored_as_data_stays_data():
    td = TensorDict({"kind": TensorDict})  # a class as a value, not a nested container
    assert td["kind"] is TensorDict


def test_deleting_from_a_locked_container_reports_the_lock():
    td = TensorDict({"a": torch.zeros(2)}, [2]).lock_()
    for key in ("a", "missing"):
        with pytest.raises(RuntimeError, match="locked"):
            del td[key]
    td.unlock_()
    with pytest.raises(KeyError):
        del td["missing"]
