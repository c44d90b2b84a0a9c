"""Cases the differential fuzz (test_persist_differential.py) found, pinned one by one.

Each compares with a plain-tensor or plain-value reference computed without tdfunc.
"""

from __future__ import annotations

import copy
import json
import multiprocessing
import os
import pickle

import pytest
import torch

from tdfunc import MemoryMappedTensor, NonTensorData, NonTensorStack, TensorClass, TensorDict


def test_size_one_dim_with_a_stride_saves(tmp_path):
    # contiguous, yet a stride of 2 on its only (size-1) dim: torch.arange(4.)[1::2][:1]
    odd = torch.arange(4.0)[1::2][:1]
    matrix = torch.arange(6.0).reshape(3, 2)[:1, ::2]
    assert odd.is_contiguous() and odd.stride() == (2,)
    saved = TensorDict({"a": odd, "b": matrix}, []).memmap(tmp_path / "x")
    loaded = TensorDict.load_memmap(tmp_path / "x")
    for out in (saved, loaded):
        assert torch.equal(out["a"].as_subclass(torch.Tensor), torch.tensor([1.0]))
        assert torch.equal(out["b"].as_subclass(torch.Tensor), torch.tensor([[0.0]]))
    assert torch.equal(MemoryMappedTensor.from_tensor(odd).as_subclass(torch.Tensor), odd)


def test_one_kept_file_is_never_shared_by_two_entries(tmp_path):
    path = tmp_path / "x"
    TensorDict({"a": torch.zeros(3), "b": torch.ones(3)}, [3]).memmap(path)
    loaded = TensorDict.load_memmap(path)
    # both entries hold the tensor that maps b's file: one keeps the file, one gets a copy
    TensorDict({"a": loaded["b"], "b": loaded["b"]}, [3]).memmap(path)
    files = [e["file"] for e in json.loads((path / "meta.json").read_text())["entries"].values()]
    assert len(set(files)) == 2
    again = TensorDict.load_memmap(path)
    again["a"][0] = 99.0
    assert again["b"].tolist() == [1.0, 1.0, 1.0]  # reference: two independent tensors
    assert TensorDict.load_memmap(path)["a"].tolist() == [99.0, 1.0, 1.0]


@pytest.mark.parametrize("how", ["set_", "update_", "copy_", "set_inplace"])
def test_in_place_write_of_a_saved_non_tensor_entry_reaches_the_file(tmp_path, how):
    path = tmp_path / "x"
    TensorDict({"a": torch.zeros(2), "n": {"s": "old"}}, [2]).memmap(path)
    loaded = TensorDict.load_memmap(path)
    if how == "set_":
        loaded.set_(("n", "s"), "new")
    elif how == "update_":
        loaded.update_({"n": {"s": "new"}})
    elif how == "copy_":
        loaded.copy_(TensorDict({"a": torch.ones(2), "n": {"s": "new"}}, [2]))
    else:
        loaded.set(("n", "s"), "new", inplace=True)
    assert loaded["n", "s"] == "new"
    assert TensorDict.load_memmap(path)["n", "s"] == "new"  # the file agrees with memory
    assert TensorDict.load_memmap(path / "n")["s"] == "new"


def test_in_place_stack_into_a_saved_single_value_is_refused_before_any_write(tmp_path):
    path = tmp_path / "x"
    TensorDict({"a": torch.zeros(2), "s": "old"}, [2]).memmap(path)
    loaded = TensorDict.load_memmap(path)
    stack = NonTensorStack.from_list(["p", "q"], batch_size=[2])
    with pytest.raises(ValueError, match="Nothing was written"):
        loaded.update_({"a": torch.ones(2), "s": stack})
    assert loaded["a"].tolist() == [0.0, 0.0] and loaded["s"] == "old"
    assert TensorDict.load_memmap(path)["s"] == "old"


def test_a_replaced_save_never_takes_a_non_tensor_write(tmp_path):
    path = tmp_path / "x"
    TensorDict({"a": torch.zeros(2), "s": "gen1", "n": {"t": "gen1"}}, [2]).memmap(path)
    old = TensorDict.load_memmap(path)
    TensorDict({"a": torch.ones(2), "s": "gen2"}, [2]).memmap(path)  # "n" is gone
    with pytest.raises(RuntimeError, match="saved again"):
        old.get("s").update_(NonTensorData("stale", batch_size=[2]))
    with pytest.raises(RuntimeError, match="saved again"):
        old.get("n").get("t").update_(NonTensorData("stale", batch_size=[2]))
    new = TensorDict.load_memmap(path)  # the newer save, whole: no mix of the two
    assert (new["s"], new["a"].tolist(), sorted(new.keys())) == ("gen2", [1.0, 1.0], ["a", "s"])
    # the current save takes writes, from every container loaded from it
    first, second = TensorDict.load_memmap(path), TensorDict.load_memmap(path)
    first.get("s").update_(NonTensorData("one", batch_size=[2]))
    second.get("s").update_(NonTensorData("two", batch_size=[2]))
    assert TensorDict.load_memmap(path)["s"] == "two"
    assert os.path.isdir(path)


class Labelled(TensorClass):
    x: torch.Tensor
    label: str


def test_from_consolidated_rebuilds_tensorclasses(tmp_path):
    filename = tmp_path / "packed.bin"
    inner = Labelled(x=torch.arange(3.0), label="cat", batch_size=[3])
    td = TensorDict({"p": inner, "n": {"q": torch.ones(3, dtype=torch.bool)}}, [3], names=["t"])
    td.consolidate(filename=filename)
    loaded = TensorDict.from_consolidated(filename)
    assert type(loaded["p"]) is Labelled and loaded["p"].label == "cat"
    assert torch.equal(loaded["p"].x, torch.arange(3.0)) and loaded.names == ["t"]
    assert type(loaded["n"]) is TensorDict and loaded.is_consolidated()
    inner.consolidate(filename=tmp_path / "top.bin")
    top = Labelled.from_consolidated(tmp_path / "top.bin")
    assert type(top) is Labelled and top.label == "cat"


@pytest.mark.parametrize("copy_with", ["deepcopy", "pickle"])
def test_a_copy_of_a_loaded_container_never_writes_to_its_files(tmp_path, copy_with):
    path = tmp_path / "x"
    TensorDict({"a": torch.zeros(2), "s": "old", "st": ["u", "v"]}, [2]).memmap(path)
    loaded = TensorDict.load_memmap(path)
    if copy_with == "deepcopy":
        copied = copy.deepcopy(loaded)
    else:
        copied = pickle.loads(pickle.dumps(loaded))
    copied.unlock_()
    copied["a"][0] = 5.0
    copied.get("s").update_(NonTensorData("new"))
    copied.update_({"st": NonTensorStack("p", "q")})
    assert (copied["s"], copied["st"]) == ("new", ["p", "q"])
    again = TensorDict.load_memmap(path)  # reference: the values saved, untouched
    assert (again["a"].tolist(), again["s"], again["st"]) == ([0.0, 0.0], "old", ["u", "v"])


def _update_in_child(queue) -> None:
    loaded = queue.get()
    loaded.get("s").update_(NonTensorData("from the child", batch_size=[2]))
    loaded["a"][0] = 7.0


def test_multiprocessing_sends_the_saved_entry_itself(tmp_path):
    path = tmp_path / "x"
    TensorDict({"a": torch.zeros(2), "s": "old"}, [2]).memmap(path)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_update_in_child, args=(queue,))
    child.start()
    queue.put(TensorDict.load_memmap(path))
    child.join(60)
    assert child.exitcode == 0
    again = TensorDict.load_memmap(path)
    assert (again["s"], again["a"].tolist()) == ("from the child", [7.0, 0.0])


@pytest.mark.parametrize("kind", ["wrapper_subclass", "meta"])
def test_a_tensor_without_values_of_its_own_is_a_clear_error(tmp_path, kind):
    from torch.testing._internal.two_tensor import TwoTensor

    if kind == "meta":
        value = torch.empty(3, device="meta")
    else:
        value = TwoTensor(torch.ones(3), torch.zeros(3))
    path = tmp_path / "x"
    with pytest.raises(TypeError, match="cannot save key 'a'"):
        TensorDict({"a": value, "b": torch.ones(3)}, [3]).memmap(path)
    assert not path.exists()  # refused before anything was written
    with pytest.raises(TypeError, match=r"MemoryMappedTensor\.from_tensor"):
        MemoryMappedTensor.from_tensor(value)
    # only the shape and dtype are needed to allocate: reference, a zero tensor
    like = TensorDict({"a": value}, [3]).memmap_like(path)
    assert torch.equal(like["a"].as_subclass(torch.Tensor), torch.zeros(3))


def test_indexed_writes_reach_the_file_for_text_as_for_tensors(tmp_path):
    # td[i] = ... wrote the tensor into its file but replaced the text in memory only
    TensorDict({"x": torch.arange(4), "s": ["a", "b", "c", "d"]}, [4]).memmap(tmp_path / "x")
    loaded = TensorDict.load_memmap(tmp_path / "x")
    loaded[1] = TensorDict({"x": torch.tensor(10), "s": "Z"}, [])
    loaded.set_at_("s", "Y", 2)
    again = TensorDict.load_memmap(tmp_path / "x")
    assert again["x"].tolist() == [0, 10, 2, 3]
    assert list(again["s"]) == list(loaded["s"]) == ["a", "Z", "Y", "d"]


def test_indexed_write_of_different_values_into_a_saved_single_value_makes_a_stack(tmp_path):
    # a buffer preallocated with one text value, then filled row by row
    single = NonTensorData("a", batch_size=[4])
    TensorDict({"x": torch.arange(4), "s": single}, [4]).memmap(tmp_path / "x")
    loaded = TensorDict.load_memmap(tmp_path / "x")
    loaded[1] = TensorDict({"x": torch.tensor(10), "s": "Z"}, [])
    loaded.set_at_("s", "Y", 0)
    again = TensorDict.load_memmap(tmp_path / "x")
    assert again["x"].tolist() == [0, 10, 2, 3]
    assert list(again["s"]) == list(loaded["s"]) == ["Y", "Z", "a", "a"]
    loaded[2:] = TensorDict({"x": torch.tensor(7), "s": "Q"}, [])  # the stack, in place
    assert list(TensorDict.load_memmap(tmp_path / "x")["s"]) == ["Y", "Z", "Q", "Q"]
