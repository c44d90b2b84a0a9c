"""A checkpoint directory is a boundary, in both layouts and at every entry point.

Links (data files, nested levels, a non-tensor entry's folder, ``subpath``) are
never followed; a save never writes through a link or over a file it did not write;
the same call is refused with the same words whatever the layout. Every case uses
real files and links, and checks the bytes outside the directory afterwards.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from tdfunc import NonTensorData, NonTensorStack, TensorDict

LAYOUTS = ["tdfunc", "tensordict"]
SECRET = bytes(range(16)) * 2  # 32 bytes: enough for a float32 [2, 4] tensor


def _secret(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    secret = outside / "secret.bin"
    secret.write_bytes(SECRET)
    return secret


def _saved(tmp_path, layout: str):
    ck = tmp_path / f"ck-{layout}"
    TensorDict({"a": torch.zeros(2, 4), "n": {"b": torch.zeros(2)}, "label": "cat"}, [2]).memmap(
        ck, format=layout
    )
    return ck


def _meta(directory) -> dict:
    with open(os.path.join(directory, "meta.json")) as f:
        return json.load(f)


def _data_file(ck, *parts) -> str:
    """The data file of the tensor at key ``parts`` (each layout names it its own way)."""
    directory = str(ck)
    meta = _meta(directory)
    for part in parts[:-1]:
        if "entries" in meta:
            directory = os.path.join(directory, meta["entries"][part]["dir"])
        else:
            directory = os.path.join(directory, part)
        meta = _meta(directory)
    if "entries" in meta:
        return os.path.join(directory, meta["entries"][parts[-1]]["file"])
    return os.path.join(directory, parts[-1] + ".memmap")


def _sub_directory(ck, key: str) -> str:
    meta = _meta(ck)
    if "entries" in meta:
        return os.path.join(ck, meta["entries"][key]["dir"])
    return os.path.join(ck, key)


# ------------------------------------------------------------------ reading
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_linked_data_file_is_never_mapped(tmp_path, layout):
    ck = _saved(tmp_path, layout)
    secret = _secret(tmp_path)
    path = _data_file(ck, "a")
    os.remove(path)
    os.symlink(secret, path)
    with pytest.raises(ValueError, match="is a symbolic link; refusing to follow it"):
        TensorDict.load_memmap(ck)
    assert secret.read_bytes() == SECRET


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_linked_nested_level_is_never_followed(tmp_path, layout):
    ck = _saved(tmp_path, layout)
    elsewhere = tmp_path / "elsewhere"
    TensorDict({"b": torch.ones(2)}, [2]).memmap(elsewhere, format=layout)
    sub = _sub_directory(ck, "n")
    os.rename(sub, tmp_path / "moved")
    os.symlink(elsewhere, sub)
    for call in (
        lambda: TensorDict.load_memmap(ck),
        lambda: TensorDict.load_memmap(ck, subpath="n"),
        lambda: TensorDict.load_memmap(ck, subpath=("n",)),
    ):
        with pytest.raises((ValueError, KeyError), match="symbolic link"):
            call()


def test_a_linked_non_tensor_folder_is_never_followed(tmp_path):
    ck = _saved(tmp_path, "tensordict")
    elsewhere = tmp_path / "elsewhere"
    NonTensorData("dog", batch_size=[2]).memmap(elsewhere, format="tensordict")
    os.rename(ck / "label", tmp_path / "moved")
    os.symlink(elsewhere, ck / "label")
    with pytest.raises(ValueError, match="is a symbolic link; refusing to follow it"):
        TensorDict.load_memmap(ck)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_writes_through_a_loaded_checkpoint_stay_inside(tmp_path, layout):
    ck = _saved(tmp_path, layout)
    secret = _secret(tmp_path)
    loaded = TensorDict.load_memmap(ck)
    loaded["a"][0, 0] = 99
    assert torch.equal(TensorDict.load_memmap(ck)["a"][0, 0], torch.tensor(99.0))
    assert secret.read_bytes() == SECRET


# ------------------------------------------------------------------ writing
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_save_never_writes_through_a_linked_sub_directory(tmp_path, layout):
    ck = _saved(tmp_path, layout)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "b.memmap").write_bytes(SECRET)
    (victim / "meta.json").write_text('{"mine": true}')
    sub = _sub_directory(ck, "n")
    os.rename(sub, tmp_path / "moved")
    os.symlink(victim, sub)
    before = {p.name: p.read_bytes() for p in victim.iterdir()}
    with pytest.raises(FileExistsError, match="symbolic link"):
        TensorDict({"a": torch.ones(2, 4), "n": {"b": torch.ones(2)}}, [2]).memmap(
            ck, format=layout
        )
    assert {p.name: p.read_bytes() for p in victim.iterdir()} == before


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_save_never_overwrites_the_users_files(tmp_path, layout):
    target = tmp_path / "mine"
    (target / "label").mkdir(parents=True)
    mine = {
        "meta.json": b'{"my": "notes"}',
        "a.memmap": SECRET,
        "label/meta.json": b'{"my": "label"}',
    }
    for name, data in mine.items():
        (target / name).write_bytes(data)
    with pytest.raises(FileExistsError, match="never"):
        TensorDict({"a": torch.ones(2, 4), "label": "dog"}, [2]).memmap(target, format=layout)
    for name, data in mine.items():
        assert (target / name).read_bytes() == data


def test_a_save_into_a_checkpoint_never_overwrites_an_unused_file(tmp_path):
    ck = _saved(tmp_path, "tensordict")
    (ck / "new.memmap").write_bytes(SECRET)  # the user's, not used by the checkpoint
    (ck / "c").mkdir()
    (ck / "c" / "meta.json").write_bytes(b"user")
    with pytest.raises(FileExistsError, match="does not use"):
        TensorDict({"new": torch.ones(2, 4)}, [2]).memmap(ck, format="tensordict")
    with pytest.raises(FileExistsError, match="does not use"):
        TensorDict({"c": "text"}, [2]).memmap(ck, format="tensordict")
    assert (ck / "new.memmap").read_bytes() == SECRET
    assert (ck / "c" / "meta.json").read_bytes() == b"user"
    assert torch.equal(TensorDict.load_memmap(ck)["a"], torch.zeros(2, 4))


@pytest.mark.parametrize("kind", [NonTensorData, NonTensorStack])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_leaf_saved_on_its_own_never_replaces_the_users_files(tmp_path, kind, layout):
    target = tmp_path / "leaf"
    target.mkdir()
    (target / "pickle.pkl").write_bytes(b"user pickle")
    (target / "meta.json").write_bytes(b'{"user": 1}')
    leaf = kind("x", batch_size=[2]) if kind is NonTensorData else kind("x", "y")
    with pytest.raises(FileExistsError):
        leaf.memmap(target, format=layout)
    assert (target / "pickle.pkl").read_bytes() == b"user pickle"
    assert (target / "meta.json").read_bytes() == b'{"user": 1}'


@pytest.mark.parametrize("layout", LAYOUTS)
def test_existsok_false_is_the_same_answer_in_both_layouts(tmp_path, layout):
    ck = _saved(tmp_path, layout)
    with pytest.raises(FileExistsError, match="existsok=False") as error:
        TensorDict({"a": torch.ones(2, 4)}, [2]).memmap(ck, format=layout, existsok=False)
    assert isinstance(error.value, RuntimeError)  # tensordict's type, too


@pytest.mark.parametrize("where", ["top", "nested"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_linked_meta_json_is_never_read_or_replaced(tmp_path, layout, where):
    ck = _saved(tmp_path, layout)
    directory = ck if where == "top" else _sub_directory(ck, "n")
    outside = tmp_path / "outside-meta.json"
    shutil.copyfile(os.path.join(directory, "meta.json"), outside)
    os.remove(os.path.join(directory, "meta.json"))
    os.symlink(outside, os.path.join(directory, "meta.json"))
    before = outside.read_bytes()
    with pytest.raises(ValueError, match="symbolic link"):
        TensorDict.load_memmap(directory)
    with pytest.raises((FileExistsError, ValueError)):
        TensorDict({"a": torch.ones(2, 4), "n": {"b": torch.ones(2)}}, [2]).memmap(
            ck, format=layout
        )
    assert outside.read_bytes() == before
