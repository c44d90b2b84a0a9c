"""Batch sizes given as numpy integers become Python ints, as a tensor's shape does.

``torch.Size([np.int64(3)])`` keeps the numpy scalar; a tensor built with that size
reports ints. The reference is the shape of a plain tensor built from the same dims.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tdfunc import TensorClass, TensorDict

DIMS = [np.int64(3), np.int32(2)]


def _plain(size) -> None:
    reference = torch.zeros(*(int(d) for d in size)).shape
    assert size == reference
    assert [type(d) for d in size] == [type(d) for d in reference] == [int] * len(size)


@pytest.mark.parametrize(
    "batch_size",
    [DIMS, tuple(DIMS), torch.Size(DIMS), np.array([3, 2])],
    ids=["list", "tuple", "torch.Size", "ndarray"],
)
def test_constructor(batch_size):
    td = TensorDict({"a": torch.zeros(3, 2, 4)}, batch_size=batch_size)
    _plain(td.batch_size)
    _plain(TensorDict(batch_size=batch_size).batch_size)


def test_a_numpy_scalar_is_one_dim_as_an_int_is():
    td = TensorDict({"a": torch.zeros(3, 4)}, batch_size=np.int64(3))
    assert td.batch_size == TensorDict({"a": torch.zeros(3, 4)}, batch_size=3).batch_size
    _plain(td.batch_size)


def test_setter_and_shape_methods():
    td = TensorDict({"a": torch.zeros(3, 2, 4)}, [3, 2])
    td.batch_size = DIMS
    _plain(td.batch_size)
    _plain(td.expand(np.int64(5), *DIMS).batch_size)
    _plain(td[0].expand(np.int64(3), np.int64(2)).batch_size)
    _plain(td.new_zeros(np.int64(4), np.int64(1)).batch_size)
    _plain(td.new_ones([np.int64(4)]).batch_size)
    _plain(td.new_empty(torch.Size([np.int64(2)])).batch_size)


def test_tensorclass():
    class Pair(TensorClass):
        x: torch.Tensor

    _plain(Pair(x=torch.zeros(3, 2), batch_size=DIMS).batch_size)
    _plain(Pair(x=torch.zeros(3, 2), batch_size=torch.Size(DIMS)).batch_size)


def test_a_numpy_batch_size_saves_and_loads(tmp_path):
    td = TensorDict({"a": torch.arange(6.0).view(3, 2)}, batch_size=torch.Size(DIMS))
    td.memmap(tmp_path)
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["batch_size"] == [3, 2]
    loaded = TensorDict.load_memmap(tmp_path)
    _plain(loaded.batch_size)
    assert torch.equal(loaded["a"], td["a"])


def test_printed_form_shows_plain_dims():
    td = TensorDict({"a": torch.zeros(3)}, batch_size=[np.int64(3)])
    assert "batch_size=torch.Size([3])" in repr(td)


@pytest.mark.parametrize("cls", ["TensorDict", "TensorClass"])
def test_a_negative_dim_in_a_torch_size_is_refused(cls):
    class Pair(TensorClass):
        x: torch.Tensor

    build = (
        (lambda size: TensorDict({"x": torch.zeros(3)}, batch_size=size))
        if cls == "TensorDict"
        else (lambda size: Pair(x=torch.zeros(3), batch_size=size))
    )
    with pytest.raises(ValueError, match="batch_size must not be negative"):
        build(torch.Size([-2]))
