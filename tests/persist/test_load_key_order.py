"""A loaded checkpoint lists its keys in the order they were saved.

Iteration order is what ``values()``, ``torch.cat(list(td.values()))`` or a zip with
another container's keys read, so a round trip must not reorder them. The reference is
the order of the dict the container was built from.
"""

from __future__ import annotations

import pytest
import torch

from tdfunc import TensorClass, TensorDict


def _source() -> dict:
    # tensors, a nested level, non-tensor data and a stack, interleaved
    return {
        "z": torch.ones(3),
        "n": {"y": torch.ones(3), "b": {"q": torch.zeros(3)}, "a": torch.ones(3, 2)},
        "label": "cat",
        "c": torch.zeros(3, dtype=torch.int64),
        "words": ["x", "y", "z"],
        "a": torch.zeros(3, 0),
    }


def _orders(td) -> list:
    return list(td.keys(include_nested=True))


@pytest.mark.parametrize("format", [None, "tensordict"])
def test_load_memmap_keeps_the_saved_order(tmp_path, format):
    source = _source()
    td = TensorDict(source, [3])
    assert list(td.keys()) == list(source)  # the reference order
    td.memmap(tmp_path, **({} if format is None else {"format": format}))
    loaded = TensorDict.load_memmap(tmp_path)
    assert list(loaded.keys()) == list(source)
    assert list(loaded["n"].keys()) == list(source["n"])
    assert _orders(loaded) == _orders(td)
    assert [k for k, _ in loaded.items()] == list(source)


def test_a_tensorclass_keeps_its_fields_order(tmp_path):
    class Sample(TensorClass):
        zeta: torch.Tensor
        label: str
        alpha: torch.Tensor

    sample = Sample(zeta=torch.ones(2), label="x", alpha=torch.zeros(2), batch_size=[2])
    sample.memmap(tmp_path)
    loaded = Sample.load_memmap(tmp_path)
    assert list(loaded.keys()) == ["zeta", "label", "alpha"]


def test_memmap_in_place_and_like_keep_the_order():
    source = _source()
    assert list(TensorDict(source, [3]).memmap_().keys()) == list(source)
    assert list(TensorDict(source, [3]).memmap_like().keys()) == list(source)
