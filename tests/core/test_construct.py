"""Keyword construction, ``non_blocking``, ``to_tensordict(retain_none=)`` and ``to_dict``."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tdfunc import TensorClass, TensorDict


def test_keyword_entries_like_tensordict():
    a, c = torch.randn(3, 4), torch.randn(3)
    td = TensorDict(a=a, b={"c": c}, s="text", batch_size=[3])
    assert td.batch_size == torch.Size([3])
    assert td["a"] is a and td["b", "c"] is c and td["s"] == "text"
    assert list(td.keys()) == ["a", "b", "s"]
    assert TensorDict(x=torch.zeros(())).batch_size == torch.Size([])


def test_keyword_entries_and_source_together_are_refused():
    with pytest.raises(ValueError, match="either as source or as keyword"):
        TensorDict({"a": torch.zeros(2)}, [2], a2=torch.zeros(2))


def test_keyword_entries_are_validated_like_source():
    with pytest.raises(ValueError, match="does not start with the batch size"):
        TensorDict(a=torch.zeros(2), batch_size=[3])


def test_positional_arguments_in_tensordicts_order():
    td = TensorDict({"a": torch.ones(2)}, [2], "cpu", ["n"], True, True)
    assert td.device == torch.device("cpu") and td.names == ["n"] and td.is_locked


def test_set_non_blocking_sends_to_the_device_and_stores_the_value():
    td = TensorDict({"a": torch.zeros(2)}, [2], device="cpu")
    value = torch.arange(2.0)
    td.set("b", value, non_blocking=True)
    assert torch.equal(td["b"], value) and td["b"].device == torch.device("cpu")
    before = td["a"]
    td.set("a", torch.ones(2, dtype=torch.float64), inplace=True, non_blocking=True)
    assert td["a"] is before and torch.equal(before, torch.ones(2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU to change devices")
def test_set_non_blocking_across_devices():
    td = TensorDict({}, [2], device="cuda")
    td.set("a", torch.arange(2.0).pin_memory(), non_blocking=True)
    torch.cuda.synchronize()
    assert td["a"].device.type == "cuda" and td["a"].cpu().tolist() == [0.0, 1.0]


class _WithNone(TensorClass):
    x: torch.Tensor
    y: Any = None


def test_to_tensordict_retain_none_reaches_nested_tensorclasses():
    td = TensorDict({"tc": _WithNone(x=torch.zeros(2), batch_size=[2]), "a": torch.ones(2)}, [2])
    kept = td.to_tensordict(retain_none=True)
    dropped = td.to_tensordict(retain_none=False)
    assert ("tc", "y") in kept and kept["tc", "y"] is None
    assert ("tc", "y") not in dropped
    assert type(kept["tc"]) is TensorDict
    assert torch.equal(kept["a"], td["a"]) and kept["a"] is not td["a"]


def test_to_dict_convert_tensors_and_retain_none():
    td = TensorDict({"a": torch.arange(3), "n": {"b": torch.zeros(2, dtype=torch.int64)}})
    assert td.to_dict(convert_tensors=True) == {"a": [0, 1, 2], "n": {"b": [0, 0]}}
    arrays = td.to_dict(convert_tensors="numpy")
    assert arrays["a"].tolist() == [0, 1, 2] and type(arrays["a"]).__module__ == "numpy"
    nested = TensorDict({"tc": _WithNone(x=torch.zeros(()))})
    assert nested.to_dict()["tc"]["y"] is None
    assert "y" not in nested.to_dict(retain_none=False)["tc"]
