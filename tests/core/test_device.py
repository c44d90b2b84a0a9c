"""A container's device reads like its tensors' devices."""

from __future__ import annotations

import pytest
import torch

from tdfunc import TensorDict
from tdfunc._core.device import as_device


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
