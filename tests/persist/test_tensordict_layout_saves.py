"""Saving in tensordict's layout: validate everything, then write, then commit.

A refused save leaves the previous checkpoint byte for byte as it was; keys that the
layout cannot hold (named like its metadata, or whose file names collide) are refused
naming the key; in-place writes to a loaded checkpoint reach its files, non-tensor
values included; the same call answers the same in both layouts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from tdfunc import NonTensorStack, TensorClass, TensorDict

LAYOUTS = ["tdfunc", "tensordict"]


class Pair(TensorClass):
    x: torch.Tensor
    label: str


def _snapshot(root) -> dict:
    out = {}
    for directory, _, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    "late",
    [
        {"z": object()},
        {
            "z": torch.nested.nested_tensor(
                [torch.ones(2), torch.ones(3), torch.ones(1)], layout=torch.jagged
            )
        },
        {"z": {"deep": {"shape": torch.zeros(3)}}},  # a metadata name, two levels down
        {"z": {"w": NonTensorStack(object(), object(), object())}},
    ],
    ids=["object", "nested-tensor", "reserved-key", "non-json"],
)
def test_a_refused_save_changes_nothing_on_disk(tmp_path, layout, late):
    ck = tmp_path / "ck"
    TensorDict({"a": torch.zeros(3), "n": {"b": torch.zeros(3)}}, [3]).memmap(ck, format=layout)
    before = _snapshot(ck)
    new = TensorDict({"a": torch.ones(3), "n": {"b": torch.ones(3)}, **late}, [3])
    try:
        new.memmap(ck, format=layout)
    except (TypeError, ValueError):
        pass
    else:
        assert layout == "tdfunc"  # tdfunc's own layout holds these
        return
    assert _snapshot(ck) == before
    loaded = TensorDict.load_memmap(ck)
    assert torch.equal(loaded["a"], torch.zeros(3)) and torch.equal(
        loaded["n", "b"], torch.zeros(3)
    )


@pytest.mark.parametrize(
    "key", ["shape", "device", "_type", "_class", "_format_version", "_metadata", "_names"]
)
def test_keys_named_like_the_metadata_are_refused_naming_the_key(tmp_path, key):
    td = TensorDict({"a": torch.zeros(2), "n": {key: torch.zeros(2)}}, [2])
    with pytest.raises(ValueError, match=rf"cannot save key \('n', '{key}'\) in tensordict's"):
        td.memmap(tmp_path / "ck", format="tensordict")
    assert not (tmp_path / "ck").exists()
    saved = td.memmap(tmp_path / "own")  # tdfunc's own layout keeps them
    assert torch.equal(TensorDict.load_memmap(tmp_path / "own")["n", key], torch.zeros(2))
    assert saved is not None


def test_keys_whose_file_names_collide_are_refused(tmp_path):
    td = TensorDict({"a": torch.zeros(2), "a.memmap": {"b": torch.zeros(2)}}, [2])
    with pytest.raises(ValueError, match=r"keys 'a' and 'a.memmap' would both be stored"):
        td.memmap(tmp_path / "ck", format="tensordict")
    with pytest.raises(ValueError, match="would both be stored"):
        TensorDict({"meta.json": {"b": torch.zeros(2)}}, [2]).memmap(
            tmp_path / "m", format="tensordict"
        )
    assert not (tmp_path / "ck").exists() and not (tmp_path / "m").exists()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_non_tensor_writes_reach_the_files_with_the_tensors(tmp_path, layout):
    TensorDict({"x": torch.zeros(2), "label": "cat"}, [2]).memmap(tmp_path / "ck", format=layout)
    loaded = TensorDict.load_memmap(tmp_path / "ck")
    loaded.set_("label", "dog")
    assert TensorDict.load_memmap(tmp_path / "ck")["label"] == "dog"
    loaded[1] = TensorDict({"x": torch.tensor(5.0), "label": "emu"}, [])
    again = TensorDict.load_memmap(tmp_path / "ck")
    assert again["x"].tolist() == [0.0, 5.0]
    assert again["label"] == ["dog", "emu"]  # the row is whole: tensor and label


def test_a_leaf_write_after_another_save_is_refused(tmp_path):
    TensorDict({"label": "cat"}, []).memmap(tmp_path / "ck", format="tensordict")
    loaded = TensorDict.load_memmap(tmp_path / "ck")
    TensorDict({"label": "owl"}, []).memmap(tmp_path / "ck", format="tensordict")
    with pytest.raises(RuntimeError, match="saved again since this leaf was loaded"):
        loaded.set_("label", "dog")
    assert TensorDict.load_memmap(tmp_path / "ck")["label"] == "owl"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_one_call_one_answer(tmp_path, layout):
    td = TensorDict(
        {"a": torch.zeros(2), "p": Pair(x=torch.ones(2), label="l", batch_size=[2])}, [2]
    )
    td.lock_()
    saved = td.memmap(tmp_path / "ck", format=layout)
    assert saved.is_locked
    loaded = TensorDict.load_memmap(tmp_path / "ck")
    assert not loaded.is_locked
    assert isinstance(loaded["p"], Pair) and loaded["p"].label == "l"
    other = TensorDict({"a": torch.ones(2)}, [2])
    assert other.memmap_(tmp_path / "inplace", format=layout) is other
    assert other.is_locked and type(other["a"]).__name__ == "MemoryMappedTensor"
    other["a"][0] = 7
    assert TensorDict.load_memmap(tmp_path / "inplace")["a"].tolist() == [7.0, 1.0]
    like = td.memmap_like(tmp_path / "like", format=layout)
    assert torch.equal(like["a"], torch.zeros(2)) and like.is_locked
    with pytest.raises(ValueError, match="format must be 'tdfunc' or 'tensordict'"):
        td.memmap(tmp_path / "x", format="pickle")


def test_a_key_named_format_loads(tmp_path):
    TensorDict({"format": torch.arange(3.0)}, [3]).memmap(tmp_path / "ck", format="tensordict")
    assert torch.equal(TensorDict.load_memmap(tmp_path / "ck")["format"], torch.arange(3.0))


@pytest.mark.parametrize("key", ["a:b", "next obs", "100%", "%41", "", ".", "..", "a\\b", "é ü"])
def test_keys_are_named_as_tensordict_names_them(tmp_path, key):
    TensorDict({key: torch.arange(2.0), "n": {key: "v"}}, [2]).memmap(
        tmp_path / "ck", format="tensordict"
    )
    loaded = TensorDict.load_memmap(tmp_path / "ck")
    assert torch.equal(loaded[key], torch.arange(2.0)) and loaded["n", key] == "v"
    names = set(os.listdir(tmp_path / "ck"))
    assert names <= {"meta.json", "n"} | {n for n in names if n.endswith(".memmap")}
    assert all("/" not in n for n in names) and ".." not in names


_SAVE_AFTER_GO = """
import sys, torch
from tdfunc import TensorDict
big = torch.ones(64, 1 << 20)  # 256 MB: the write takes long enough to be killed in it
print("go", flush=True)
TensorDict({"n": {"big": big}, "s": "t"}, [64]).memmap(sys.argv[1], format="tensordict")
print("done", flush=True)
"""


def _leftovers(path) -> list[str]:
    return [n for _, _, names in os.walk(path) for n in names if n.endswith(".tmp")]


@pytest.mark.parametrize("first", [True, False])
def test_a_save_after_a_killed_save_succeeds(tmp_path, first):
    """A save SIGKILLed while it writes its data files leaves temporary files (the
    checkpoint before it is untouched); the next save reuses the place and loads whole."""
    path = tmp_path / "ck"
    if not first:
        TensorDict({"s": "old"}, [64]).memmap(path, format="tensordict")
    child = subprocess.Popen(
        [sys.executable, "-c", _SAVE_AFTER_GO, str(path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    assert child.stdout.readline().strip() == "go"
    deadline = time.monotonic() + 60
    while not _leftovers(path) and time.monotonic() < deadline:
        time.sleep(0.001)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    child.stdout.close()
    assert _leftovers(path), "the kill came after the save: nothing to test"
    if not first:
        assert TensorDict.load_memmap(path)["s"] == "old"
    TensorDict({"n": {"big": torch.full((64, 4), -1.0)}, "s": "new"}, [64]).memmap(
        path, format="tensordict"
    )
    loaded = TensorDict.load_memmap(path)
    assert bool((loaded["n", "big"] == -1).all()) and loaded["s"] == "new"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_leaf_saved_in_place_writes_its_updates_in_both_layouts(tmp_path, layout):
    leaf = NonTensorStack("a", "b")
    assert leaf.memmap_(tmp_path / "leaf", format=layout) is leaf
    leaf.update_(NonTensorStack("c", "d"))
    assert NonTensorStack.load_memmap(tmp_path / "leaf").tolist() == ["c", "d"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_make_memmap_keeps_the_directorys_layout(tmp_path, layout):
    TensorDict({"a": torch.ones(2)}, [2]).memmap(tmp_path / "ck", format=layout)
    loaded = TensorDict.load_memmap(tmp_path / "ck")
    loaded.make_memmap("new key", [2, 3]).fill_(4.0)
    again = TensorDict.load_memmap(tmp_path / "ck")
    assert torch.equal(again["new key"], torch.full((2, 3), 4.0))
    assert torch.equal(again["a"], torch.ones(2))
    meta = (tmp_path / "ck" / "meta.json").read_text()
    assert ('"_type"' in meta) == (layout == "tensordict")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_tensorclass_at_the_top_in_both_layouts(tmp_path, layout):
    pair = Pair(x=torch.arange(4.0).view(2, 2), label="top", batch_size=[2])
    saved = pair.memmap(tmp_path / "ck", format=layout)
    for loaded in (saved, Pair.load_memmap(tmp_path / "ck")):
        assert isinstance(loaded, Pair) and loaded.label == "top"
        assert torch.equal(loaded.x, torch.arange(4.0).view(2, 2))
    assert pair.memmap_(tmp_path / "in-place", format=layout) is pair
    pair.x[0, 0] = 9.0
    assert Pair.load_memmap(tmp_path / "in-place").x[0, 0].item() == 9.0
