"""A container's device reads like its tensors' devices."""

from __future__ import annotations

import pytest
import torch

from tdfunc import TensorDict
from tdfunc._core.helpers.device import as_device


def test_types_without_an_index_are_kept():
    assert as_device("cpu") == torch.device("cpu")
    assert as_device(torch.device("meta")) == torch.device("meta")
    assert as_device("cuda:1") == torch.device("cuda", 1)


def test_an_unindexed_accelerator_gets_the_current_index(monkeypatch):
    # Stands in for a machine with two GPUs, the second current: a tensor made
    # with device="cuda" reports cuda:1 there, and so must the container.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert as_device("cuda") == torch.device("cuda", 1)
    assert TensorDict({}, batch_size=[], device="cuda").device == torch.device("cuda", 1)


def test_without_the_accelerator_the_name_is_kept(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert as_device("cuda") == torch.device("cuda")


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
def test_to_sets_the_same_device_the_leaves_report(device):
    td = TensorDict({"a": torch.zeros(2), "n": {"b": torch.ones(2)}}, batch_size=[2]).to(device)
    assert td.device == td["a"].device == td["n"].device


def test_moving_leaves_the_source_non_tensor_values_where_they_were():
    source = TensorDict({"label": "x", "n": {"tags": ["a", "b"]}, "a": torch.zeros(2)}, [2])
    moved = source.to("meta")
    assert moved.get("label").device == torch.device("meta")
    assert moved.get(("n", "tags")).device == torch.device("meta")
    assert source.get("label").device is None
    assert source.get(("n", "tags")).device is None
    assert moved["label"] == source["label"] == "x"
    # a shallow clone shares the leaf objects; moving it in place must not move the source's
    shallow = source.clone(False)
    shallow.to("meta", inplace=True)
    assert shallow.get("label").device == torch.device("meta")
    assert source.get("label").device is None


@pytest.mark.parametrize("inplace", [False, True])
def test_pin_memory_pins_every_tensor_and_keeps_the_rest(monkeypatch, inplace):
    # Pinning needs an accelerator runtime; a stand-in records which tensors are pinned.
    pinned = []

    def fake_pin(tensor):
        out = tensor.clone()
        pinned.append(out)
        return out

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    source = TensorDict({"a": torch.arange(3.0), "n": {"b": torch.ones(3, 2)}, "s": "x"}, [3])
    out = source.pin_memory(inplace=inplace)
    assert (out is source) == inplace
    assert out.batch_size == torch.Size([3])
    assert out["s"] == "x"
    assert {id(t) for t in pinned} == {id(out["a"]), id(out["n", "b"])}
    assert torch.equal(out["n", "b"], torch.ones(3, 2))


def test_pin_memory_refuses_a_bad_thread_count():
    with pytest.raises(ValueError, match="num_threads"):
        TensorDict({}, []).pin_memory(num_threads=-1)
