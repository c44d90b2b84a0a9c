"""Keyword forms of existing methods, against plain-tensor references."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tdfunc import NonTensorData, TensorDict


def _td():
    return TensorDict(
        {"a": torch.arange(24.0).view(2, 3, 4), "n": {"b": torch.arange(6).view(2, 3)}}, [2, 3]
    )


def test_reshape_and_view_size_keyword():
    td = _td()
    assert torch.equal(td.reshape(size=(3, 2))["a"], td["a"].reshape(3, 2, 4))
    assert torch.equal(td.view(size=[6])["n", "b"], td["n", "b"].view(6))
    with pytest.raises(TypeError, match="not both"):
        td.reshape(6, size=(6,))


def test_view_dtype():
    td = TensorDict({"a": torch.arange(4, dtype=torch.float32).view(2, 2)}, [2])
    viewed = td.view(torch.int32)
    assert torch.equal(viewed["a"], td["a"].view(torch.int32))
    assert viewed.batch_size == torch.Size([2])
    assert viewed["a"].data_ptr() == td["a"].data_ptr()


@pytest.mark.parametrize(
    ("call", "reference", "size"),
    [
        (lambda td: td.reshape(6, inplace=True), lambda t: t.reshape(6, 4), [6]),
        (lambda td: td.flatten(0, 1, inplace=True), lambda t: t.flatten(0, 1), [6]),
        (
            lambda td: td.unflatten(1, (3, 1), inplace=True),
            lambda t: t.unflatten(1, (3, 1)),
            [2, 3, 1],
        ),
    ],
    ids=["reshape", "flatten", "unflatten"],
)
def test_inplace_shape_ops_keep_identity(call, reference, size):
    td = _td()
    expected = reference(td["a"])
    assert call(td) is td
    assert td.batch_size == torch.Size(size) and torch.equal(td["a"], expected)


def test_inplace_shape_op_refused_when_locked():
    td = _td().lock_()
    with pytest.raises(RuntimeError, match="locked"):
        td.reshape(6, inplace=True)


def test_flatten_without_batch_dims_gives_one_dim_of_size_one():
    td = TensorDict({"a": torch.zeros(3)}, [])
    flat = td.flatten()
    assert flat.batch_size == torch.Size([1]) and flat["a"].shape == torch.Size([1, 3])


def test_contiguous_inplace_and_canonical():
    base = torch.arange(12.0).view(4, 3)
    td = TensorDict({"a": base.T}, [3])
    assert not td["a"].is_contiguous()
    assert td.contiguous(inplace=True) is td and td["a"].is_contiguous()
    assert torch.equal(td["a"], base.T)
    odd = torch.zeros(3, 1)[:, :1].as_strided((3, 1), (1, 5))  # contiguous by torch, odd strides
    assert odd.is_contiguous()
    fixed = TensorDict({"o": odd}, [3]).contiguous(canonical=True)["o"]
    assert fixed.stride() == (1, 1)


def test_apply_is_leaf_gives_non_tensor_and_nested_values_whole():
    td = TensorDict({"a": torch.ones(2), "s": "x", "n": {"b": torch.ones(2)}}, [2])
    seen = []

    def fn(value):
        seen.append(type(value).__name__)
        return value

    td.apply(fn, is_leaf=lambda cls: issubclass(cls, NonTensorData))
    assert sorted(seen) == ["NonTensorData", "Tensor", "Tensor"]
    seen.clear()
    out = td.apply(fn, is_leaf=lambda cls: issubclass(cls, TensorDict))
    assert sorted(seen) == ["Tensor", "TensorDict"] and out["n"] is td["n"]


def _not_a_container(cls: type) -> bool:
    return not getattr(cls, "_is_tensor_collection", False)


def test_keys_values_items_is_leaf_and_sort():
    td = TensorDict({"z": torch.zeros(()), "a": {"y": torch.zeros(()), "b": "s"}})
    assert list(td.keys(True, True, sort=True)) == [("a", "y"), "z"]  # non-tensor left out
    everything = td.keys(True, True, is_leaf=_not_a_container, sort=True)
    assert list(everything) == [("a", "b"), ("a", "y"), "z"]
    only_tensors = td.keys(True, True, is_leaf=lambda cls: issubclass(cls, torch.Tensor))
    assert sorted(map(str, only_tensors)) == ["('a', 'y')", "z"]
    values = list(td.values(True, True, is_leaf=lambda cls: cls is TensorDict))
    assert values == [td["a"]]
    assert [k for k, _ in td.items(True, True, sort=True)] == [("a", "y"), "z"]


def test_to_inplace_and_to_another_container():
    td = _td()
    leaf_b = td["n"]
    assert td.to(torch.float64, inplace=True) is td
    assert td["a"].dtype == torch.float64 and td["n"] is leaf_b
    assert td["n", "b"].dtype == torch.float64
    target = TensorDict({}, [], device="cpu")
    moved = _td().to(target)
    assert moved.device == torch.device("cpu")
    like = _td().to(torch.zeros((), dtype=torch.float16))
    assert like["a"].dtype == torch.float16


def test_update_clone_and_keys_to_update():
    td = TensorDict({"a": torch.zeros(2), "n": {"b": torch.zeros(2), "c": torch.zeros(2)}}, [2])
    source = {"a": torch.ones(2), "n": {"b": torch.ones(2), "c": torch.ones(2)}}
    td.update(source, keys_to_update=[("n", "b")])
    assert td["a"].sum() == 0 and td["n", "b"].sum() == 2 and td["n", "c"].sum() == 0
    td.update(source, keys_to_update=["n"])
    assert td["n", "c"].sum() == 2 and td["a"].sum() == 0
    value = torch.full((2,), 3.0)
    td.update({"a": value}, clone=True)
    assert td["a"] is not value and torch.equal(td["a"], value)
    td.update({"a": value})
    assert td["a"] is value
    td.update(extra=torch.ones(2))
    assert torch.equal(td["extra"], torch.ones(2))


def test_from_module_use_state_dict_follows_state_dict():
    model = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    model.register_buffer("scratch", torch.zeros(1), persistent=False)
    reference = model.state_dict(keep_vars=True)
    params = TensorDict.from_module(model, use_state_dict=True)
    keys = {".".join(k) for k in params.keys(True, True)}
    assert keys == set(reference) and "scratch" not in keys
    for name, value in reference.items():
        assert params[tuple(name.split("."))] is value
    assert "scratch" in TensorDict.from_module(model)
    assert TensorDict.from_module(model, use_state_dict=True, lock=True).is_locked


def test_flatten_keys_is_leaf_keeps_accepted_containers_whole():
    inner = TensorDict({"x": torch.ones(2)}, [2])
    td = TensorDict({"a": {"b": torch.zeros(2)}, "keep": inner}, [2])
    flat = td.flatten_keys(is_leaf=lambda cls: cls is TensorDict)
    assert list(flat.keys()) == ["a", "keep"]  # every nested TensorDict is a leaf here
    nested_only = td.flatten_keys(is_leaf=lambda cls: False)
    assert sorted(nested_only.keys()) == ["a.b", "keep.x"]
    assert nested_only["keep.x"] is inner["x"]


def test_update_ignore_lock_writes_and_relocks():
    td = TensorDict({"a": {"b": torch.zeros(2)}}, [2]).lock_()
    with pytest.raises(RuntimeError, match="locked"):
        td.update({"new": torch.ones(2)})
    td.update({"new": torch.ones(2), "a": {"c": torch.ones(2)}}, ignore_lock=True)
    assert torch.equal(td["new"], torch.ones(2)) and torch.equal(td["a", "c"], torch.ones(2))
    assert td.is_locked and td["a"].is_locked
    with pytest.raises(RuntimeError, match="locked"):
        td.update({"other": torch.ones(2)})
