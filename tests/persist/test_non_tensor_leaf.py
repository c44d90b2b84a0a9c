"""A NonTensorData / NonTensorStack saved on its own: memmap, memmap_, load_memmap.

The reference is the nested Python list the leaf was built from.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from tdfunc import NonTensorData, NonTensorStack, TensorDict


@pytest.mark.parametrize("fmt", ["tdfunc", "tensordict"])
@pytest.mark.parametrize(
    "leaf",
    [
        NonTensorStack.from_list([[0, 1], [2, 3], [4, 5]]),
        NonTensorStack([[1, 2], [3, 4]], batch_size=[2]),  # a stack of lists
        NonTensorData("text", batch_size=[3]),
        NonTensorData({"k": [1, 2]}),
    ],
    ids=["stack", "stack-of-lists", "data", "data-dict"],
)
def test_round_trip(tmp_path, leaf, fmt):
    saved = leaf.memmap(tmp_path, format=fmt)
    assert saved.is_locked if hasattr(saved, "is_locked") else saved._is_locked
    for loaded in (TensorDict.load_memmap(tmp_path), type(leaf).load_memmap(tmp_path)):
        assert type(loaded) is type(leaf)
        assert loaded.batch_size == leaf.batch_size
        assert loaded.tolist() == leaf.tolist()


def test_tensordict_layout_of_a_stack(tmp_path):
    NonTensorStack("a", "b").memmap(tmp_path, format="tensordict")
    node = json.loads((tmp_path / "meta.json").read_text())
    assert node["_type"] == "<class 'tensordict.tensorclass.NonTensorStack'>"
    assert node["data"] == ["a", "b"] and node["stack_dim"] == 0


def test_memmap_in_place_updates_reach_the_file(tmp_path):
    data = NonTensorStack.from_list([[0, 1], [0, 1], [0, 1]])
    assert data.memmap_(tmp_path) is data
    assert data.is_memmap() and data._is_memmap and data[0, 0]._is_memmaped_from_above()
    with pytest.raises(RuntimeError, match="locked"):
        data.update(NonTensorStack.from_list([[2, 3]] * 3))
    data.update_(NonTensorStack.from_list([[2, 3]] * 3))
    assert TensorDict.load_memmap(tmp_path).tolist() == [[2, 3]] * 3
    data[0, 0] = 99
    assert TensorDict.load_memmap(tmp_path).tolist() == [[99, 3], [2, 3], [2, 3]]
    with pytest.raises(RuntimeError, match="memmaped parent NonTensorStack"):
        data[0].update_(NonTensorStack(5, 6))  # an element of a saved stack is read-only
    assert data.tolist() == [[99, 3], [2, 3], [2, 3]]


def test_non_json_values_use_a_torch_file(tmp_path):
    leaf = NonTensorStack(1 + 2j, 3 + 4j)
    leaf.memmap(tmp_path)
    assert NonTensorStack.load_memmap(tmp_path).tolist() == [1 + 2j, 3 + 4j]
    assert not os.path.exists(tmp_path / "pickle.pkl")
    with pytest.raises(TypeError, match="JSON"):
        leaf.memmap(tmp_path / "td", format="tensordict")


def test_errors(tmp_path):
    with pytest.raises(ValueError, match="needs a prefix"):
        NonTensorStack("a").memmap()
    TensorDict({"a": torch.zeros(2)}, [2]).memmap(tmp_path / "td")
    with pytest.raises(TypeError, match="holds a TensorDict"):
        NonTensorStack.load_memmap(tmp_path / "td")
    NonTensorStack("a").memmap(tmp_path / "leaf")
    with pytest.raises(TypeError, match="saved on its own"):
        TensorDict({}, []).load_memmap_(tmp_path / "leaf")
