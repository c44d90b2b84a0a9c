"""``attrs()`` and ``to(attrs)``: per-leaf devices and dtypes, checked against plain tensors."""

from __future__ import annotations

import pytest
import torch

from tdfunc import TensorAttrs, TensorClass, TensorDict


def _source() -> dict:
    return {
        "a": torch.zeros(3),
        "b": torch.zeros(3, dtype=torch.int32),
        "n": {"c": torch.zeros(3, 2, dtype=torch.float64), "label": "text"},
    }


def test_attrs_records_each_leaf():
    plain = _source()
    attrs = TensorDict(plain, [3]).attrs()
    assert attrs.batch_size == torch.Size([]) and attrs.device is None
    for key, tensor in [("a", plain["a"]), ("b", plain["b"]), (("n", "c"), plain["n"]["c"])]:
        leaf = attrs[key]
        assert isinstance(leaf, TensorAttrs)
        assert (leaf.tgt_device, leaf.tgt_dtype, leaf.tgt_shape) == (
            tensor.device,
            tensor.dtype,
            tensor.shape,
        )
    assert ("n", "label") not in attrs.keys(True)  # only tensors are described
    partial = TensorDict(plain, [3]).attrs(fields=("dtype",))
    assert partial["a"].tgt_dtype == torch.float32 and partial["a"].tgt_device is None
    assert partial["a"].tgt_shape is None


def test_to_attrs_casts_each_leaf_to_its_own_dtype():
    plain = _source()
    attrs = TensorDict(plain, [3]).attrs(fields=("device", "dtype"))
    target = {
        "a": torch.ones(3, dtype=torch.float16),
        "b": torch.ones(3),
        "n": {"c": torch.ones(3, 2)},
    }
    out = TensorDict(target, [3]).to(attrs)
    assert out["a"].dtype == torch.float32 and out["b"].dtype == torch.int32
    assert out["n", "c"].dtype == torch.float64
    assert torch.equal(out["b"], target["b"].to(torch.int32))
    assert torch.equal(out["n", "c"], target["n"]["c"].double())


def test_to_attrs_keeps_leaves_it_does_not_describe():
    attrs = TensorDict({"a": torch.zeros(2, dtype=torch.int64)}, [2]).attrs()
    target = TensorDict({"a": torch.ones(2), "extra": torch.ones(2)}, [2], device="cpu")
    out = target.to(attrs)
    assert out["a"].dtype == torch.int64 and out["extra"] is target["extra"]
    assert out.device == torch.device("cpu")  # every leaf still on the container's device
    same = target.to(TensorDict({"a": torch.ones(2)}, [2]).attrs(fields=("shape",)))
    assert same["a"] is target["a"]  # neither device nor dtype given: untouched


def test_to_attrs_in_place_and_on_a_tensorclass():
    class Pair(TensorClass):
        x: torch.Tensor
        y: torch.Tensor

    source = Pair(x=torch.zeros(2, dtype=torch.int16), y=torch.zeros(2), batch_size=[2])
    attrs = source.attrs()
    assert isinstance(attrs, TensorDict) and attrs["x"].tgt_dtype == torch.int16
    other = Pair(x=torch.ones(2), y=torch.ones(2, dtype=torch.float64), batch_size=[2])
    out = other.to(attrs)
    assert isinstance(out, Pair) and out.x.dtype == torch.int16 and out.y.dtype == torch.float32
    td = TensorDict({"x": torch.ones(2), "y": torch.ones(2)}, [2])
    assert td.to(attrs, inplace=True) is td and td["x"].dtype == torch.int16


def test_to_plain_container_still_takes_its_device_and_dtype():
    # a container without TensorAttrs keeps tdfunc's td.to(other): other's device and dtype
    other = TensorDict({"z": torch.zeros(1, dtype=torch.float64)}, [1])
    assert TensorDict({"a": torch.ones(2)}, [2]).to(other)["a"].dtype == torch.float64


def test_attrs_errors():
    td = TensorDict({"a": torch.zeros(2)}, [2])
    with pytest.raises(ValueError, match="fields must be a subset"):
        td.attrs(fields=("layout",))
    with pytest.raises(TypeError, match="takes no other argument"):
        td.to(td.attrs(), torch.float64)
    assert TensorAttrs.from_tensor(torch.zeros(2, 3), fields=("shape",)).tgt_shape == (2, 3)
