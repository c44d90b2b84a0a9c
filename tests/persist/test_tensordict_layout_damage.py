"""Damaged or hand-edited tensordict-layout checkpoints: a clear error naming the file
and the key, never an inconsistent container or an error from inside torch."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from tdfunc import TensorDict

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "tensordict_0_15_3")


def _edit(tmp_path, relative: str, change) -> str:
    ck = tmp_path / "ck"
    shutil.copytree(os.path.join(DATA, "plain"), ck)
    path = ck / relative
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta))
    return str(ck)


def test_a_nested_level_must_fit_its_parent(tmp_path):
    ck = _edit(tmp_path, "b/meta.json", lambda m: m.update(shape=[5]))
    for name in ("c.memmap", "flag.memmap"):  # data for 5 rows: only the batch is wrong
        with open(os.path.join(ck, "b", name), "ab") as f:
            f.write(bytes(40))
    with pytest.raises(ValueError, match=r"b/meta.json is corrupt at key 'shape'.*\[5\].*\[2\]"):
        TensorDict.load_memmap(ck)


def test_the_container_is_on_the_device_of_its_leaves(tmp_path):
    # the leaves are memory-mapped on the CPU: a recorded CUDA device is not where they
    # are, and a load of tdfunc's own layout with the same edit answers the same
    ck = _edit(tmp_path, "meta.json", lambda m: m.update(device="cuda:0"))
    own = tmp_path / "own"
    TensorDict({"a": torch.zeros(2, 3)}, [2]).memmap(own)
    meta = json.loads((own / "meta.json").read_text())
    meta["device"] = "cuda:0"
    (own / "meta.json").write_text(json.dumps(meta))
    for path in (ck, own):
        loaded = TensorDict.load_memmap(path)
        assert loaded.device == torch.device("cpu")
        assert all(v.device == loaded.device for v in loaded.values(True, True))
    with pytest.raises(ValueError, match="is not a device"):
        TensorDict.load_memmap(_edit(tmp_path / "x", "meta.json", lambda m: m.update(device=3)))


@pytest.mark.parametrize("shape", [[2, 2**62], [2, 2**31, 2**31, 4], [2, -3], [2, 3.0], "2,3"])
def test_enormous_or_malformed_shapes_name_the_key_and_the_file(tmp_path, shape):
    ck = _edit(tmp_path, "meta.json", lambda m: m["a"].update(shape=shape))
    with pytest.raises(ValueError, match=r"meta.json is corrupt at key 'a': the shape"):
        TensorDict.load_memmap(ck)


def test_a_shape_larger_than_the_file_names_the_file(tmp_path):
    ck = _edit(tmp_path, "meta.json", lambda m: m["a"].update(shape=[2, 300]))
    with pytest.raises(ValueError, match=r"a.memmap of key 'a' holds 24 bytes.*need 2400"):
        TensorDict.load_memmap(ck)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda m: m.update(shape=[2**63]), "more elements than a tensor can hold"),
        (lambda m: m["a"].update(dtype="torch.object"), "unknown dtype"),
        (lambda m: m.update(a=[1, 2]), "the entry must be a JSON object"),
        (lambda m: m.update(a={"size": 3}), "neither a tensor nor a node"),
        (lambda m: m.update(_names=["x", "y", "z"]), "is not a list of 1 names"),
        (lambda m: m.update(_type="os.system"), "is not a class name"),
    ],
)
def test_wrong_metadata_is_a_clear_error(tmp_path, change, message):
    with pytest.raises(ValueError, match=message):
        TensorDict.load_memmap(_edit(tmp_path, "meta.json", change))


def test_a_missing_data_file_is_named(tmp_path):
    ck = _edit(tmp_path, "meta.json", lambda m: None)
    os.remove(os.path.join(ck, "a.memmap"))
    with pytest.raises(FileNotFoundError, match=r"a.memmap of key 'a' is missing"):
        TensorDict.load_memmap(ck)


def test_two_keys_never_share_one_file(tmp_path):
    # "a%20b" read by its old plain name is the file of "a b" (its encoded name)
    ck = tmp_path / "ck"
    TensorDict({"a b": torch.zeros(2)}, [2]).memmap(ck, format="tensordict")
    meta = json.loads((ck / "meta.json").read_text())
    meta["a%20b"] = dict(meta["a b"])
    (ck / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"at key 'a%20b': it names the file 'a%20b.memmap'"):
        TensorDict.load_memmap(ck)


def test_a_leaf_where_a_level_is_recorded_takes_the_containers_batch(tmp_path):
    ck = _edit(tmp_path, "meta.json", lambda m: m.update(note={"type": "TensorDict"}))
    loaded = TensorDict.load_memmap(ck)
    assert loaded["note"] == "written by tensordict"
    assert loaded.get("note").batch_size == loaded.batch_size == torch.Size([2])
    assert loaded[1]["note"] == "written by tensordict"
