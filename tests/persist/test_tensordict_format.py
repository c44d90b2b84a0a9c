"""Checkpoints move both ways between tdfunc and tensordict (its memory-mapped layout).

The fixtures in tests/data/tensordict_0_15_3/ were written by tensordict 0.15.3
(tests/data/make_tensordict_checkpoints.py); their values are recomputed here with
plain torch.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import tensordict_peer
import torch

from tdfunc import MemoryMappedTensor, NonTensorStack, TensorClass, TensorDict

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "tensordict_0_15_3")


class Pair(TensorClass):
    x: torch.Tensor
    label: str


def test_reads_a_tensordict_checkpoint():
    td = TensorDict.load_memmap(os.path.join(DATA, "plain"))
    # unlocked, as a load of tdfunc's own layout is (and tensordict's load_memmap)
    assert td.batch_size == torch.Size([2]) and not td.is_locked
    assert isinstance(td["a"], MemoryMappedTensor)
    assert torch.equal(td["a"], torch.arange(6, dtype=torch.float32).view(2, 3))
    assert torch.equal(td["b", "c"], torch.arange(2, dtype=torch.int64))
    assert torch.equal(td["b", "flag"], torch.tensor([True, False]))
    assert td["note"] == "written by tensordict"
    assert td.device == torch.device("cpu")


def test_reads_names_stacks_and_small_dtypes():
    named = TensorDict.load_memmap(os.path.join(DATA, "named"))
    assert named.names == ["rows", "cols"]
    assert torch.equal(named["a"], torch.arange(6.0).view(2, 3))
    stack = TensorDict.load_memmap(os.path.join(DATA, "stack"))
    assert stack["s"] == ["x", "y"] and stack[1]["s"] == "y"
    assert torch.equal(stack["h"], torch.arange(2, dtype=torch.float16))


def test_tensorclass_checkpoint_without_importing_its_class():
    # "__main__.Pair" is not a class tdfunc knows: its fields come back as a TensorDict
    td = TensorDict.load_memmap(os.path.join(DATA, "tensorclass"))
    assert type(td["pair"]) is TensorDict
    assert torch.equal(td["pair", "x"], torch.ones(2, 2))
    assert td["pair", "label"] == "lab"


def test_round_trip_through_the_tensordict_layout(tmp_path):
    td = TensorDict(
        {
            "a": torch.arange(6.0).view(2, 3),
            "b": {"c": torch.arange(2)},
            "note": "hi",
            "s": NonTensorStack("x", "y"),
            "p": Pair(x=torch.ones(2, 2), label="lab", batch_size=[2]),
        },
        [2],
        names=["n"],
    )
    saved = td.memmap(tmp_path / "ckpt", format="tensordict")
    meta = json.loads((tmp_path / "ckpt" / "meta.json").read_text())
    assert meta["_class"] == "tensordict:TensorDict" and meta["shape"] == [2]
    assert meta["a"] == {
        "device": "cpu",
        "shape": [2, 3],
        "dtype": "torch.float32",
        "is_nested": False,
    }
    for loaded in (saved, TensorDict.load_memmap(tmp_path / "ckpt")):
        assert torch.equal(loaded["a"], td["a"]) and torch.equal(loaded["b", "c"], td["b", "c"])
        assert loaded["note"] == "hi" and loaded["s"] == ["x", "y"]
        assert isinstance(loaded["p"], Pair) and loaded["p"].label == "lab"
        assert loaded.names == ["n"]


def test_hostile_keys_and_pickled_values_are_refused(tmp_path):
    shutil.copytree(os.path.join(DATA, "plain"), tmp_path / "bad")
    meta_path = tmp_path / "bad" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["../escape"] = meta.pop("a")
    meta_path.write_text(json.dumps(meta))
    (tmp_path / "escape.memmap").write_bytes(bytes(24))  # what a joined path would reach
    # the key is percent-encoded into one name inside the directory, as tensordict does
    with pytest.raises(FileNotFoundError, match=r"\.\.%2Fescape\.memmap of key '\.\./escape'"):
        TensorDict.load_memmap(tmp_path / "bad")
    shutil.copytree(os.path.join(DATA, "plain"), tmp_path / "pickled")
    (tmp_path / "pickled" / "note" / "meta.json").write_text(
        json.dumps({"_type": "<class 'tensordict.tensorclass.NonTensorData'>"})
    )
    with pytest.raises(ValueError, match="never unpickles"):
        TensorDict.load_memmap(tmp_path / "pickled")
    with pytest.raises(TypeError, match="JSON"):
        TensorDict({"o": object()}).memmap(tmp_path / "obj", format="tensordict")


def test_short_data_file_is_an_error(tmp_path):
    shutil.copytree(os.path.join(DATA, "plain"), tmp_path / "short")
    with open(tmp_path / "short" / "a.memmap", "r+b") as f:
        f.truncate(8)
    with pytest.raises(ValueError):
        TensorDict.load_memmap(tmp_path / "short")


def test_tensordict_reads_what_tdfunc_wrote(tmp_path):
    TensorDict({"a": torch.arange(4.0), "n": {"b": torch.ones(4, 2)}, "s": "text"}, [4]).memmap(
        tmp_path / "ckpt", format="tensordict"
    )
    code = (
        "import sys, json; from tensordict import TensorDict;"
        "t = TensorDict.load_memmap(sys.argv[1]);"
        "print(json.dumps([t['a'].tolist(), t['n', 'b'].sum().item(), t['s']]))"
    )
    out = tensordict_peer.run(code, str(tmp_path / "ckpt"))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [[0.0, 1.0, 2.0, 3.0], 8.0, "text"]


def test_allow_pickle_is_accepted_and_must_be_a_bool(tmp_path):
    TensorDict({"a": torch.zeros(2)}, [2]).memmap(tmp_path / "p")
    for value in (True, False, None):
        assert torch.equal(
            TensorDict.load_memmap(tmp_path / "p", allow_pickle=value)["a"], torch.zeros(2)
        )
    with pytest.raises(TypeError, match="allow_pickle must be a bool"):
        TensorDict.load_memmap(tmp_path / "p", allow_pickle=1)
