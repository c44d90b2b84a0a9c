"""Hostile directories and files: every load or save ends with a result or a clear error.

Cases that could hang (FIFOs, ``/dev/zero``) run under ``signal.alarm``: a regression
fails the test instead of blocking the run (the alarm interrupts a blocking ``open``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal

import pytest
import torch

from tdfunc import TensorDict
from tdfunc._persist.directory import wait_for_cleanup

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX file types and signals")


class _Hang(Exception):
    pass


@pytest.fixture
def deadline():
    """Fail (not hang) a test that blocks for more than 10 s."""

    def expire(signum, frame):
        raise _Hang("the call blocked for 10 s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "saved"
    TensorDict(
        {"a": torch.arange(4.0), "b": {"c": torch.ones(4, 2)}, "o": {1, 2}}, batch_size=[4]
    ).memmap(path)
    return path


def _meta(path) -> dict:
    return json.loads((path / "meta.json").read_text())


def _contents(root) -> dict:
    """{relative path: bytes} of every file under ``root`` (links as their target)."""
    out = {}
    for directory, _, names in os.walk(root):
        for name in names:
            full = os.path.join(directory, name)
            rel = os.path.relpath(full, root)
            if os.path.islink(full):
                out[rel] = os.readlink(full)
            else:
                with open(full, "rb") as file:
                    out[rel] = file.read()
    return out


# ---------------------------------------------------------------------------- user files
def _foreign(path) -> None:
    path.mkdir()
    (path / "weights.memmap").write_bytes(b"\x01" * 64)
    (path / "model.pt").write_bytes(b"my model")
    (path / "sub").mkdir()
    (path / "sub" / "x.memmap").write_bytes(b"\x02" * 16)


@pytest.mark.parametrize("method", ["memmap", "memmap_", "memmap_like", "save"])
def test_saving_into_a_directory_tdfunc_did_not_write_touches_nothing(tmp_path, method):
    path = tmp_path / "mine"
    _foreign(path)
    before = _contents(path)
    td = TensorDict({"weights": torch.ones(4), "model": torch.ones(4), "sub": {"x": torch.ones(4)}})
    with pytest.raises(FileExistsError, match=r"model\.pt, sub, weights\.memmap") as info:
        getattr(td, method)(path)
    assert "never deletes or overwrites" in str(info.value)
    wait_for_cleanup()
    assert _contents(path) == before


def test_a_foreign_meta_json_is_never_replaced(tmp_path):
    path = tmp_path / "mine"
    path.mkdir()
    (path / "meta.json").write_text('{"my": "config"}')
    with pytest.raises(FileExistsError, match="not metadata tdfunc wrote"):
        TensorDict({"a": torch.ones(2)}).memmap(path)
    assert (path / "meta.json").read_text() == '{"my": "config"}'
    assert os.listdir(path) == ["meta.json"]


def test_a_foreign_sub_directory_in_the_way_of_a_nested_key(tmp_path):
    path = tmp_path / "saved"
    TensorDict({"a": torch.ones(2)}).memmap(path)
    (path / "sub").mkdir()
    (path / "sub" / "x.memmap").write_bytes(b"\x02" * 16)
    (path / "sub" / "notes.txt").write_text("mine")
    before = _contents(path / "sub")
    with pytest.raises(FileExistsError, match=r"notes\.txt, x\.memmap"):
        TensorDict({"a": torch.ones(2), "sub": {"x": torch.ones(2)}}).memmap(path)
    assert _contents(path / "sub") == before
    assert TensorDict.load_memmap(path)["a"].tolist() == [1.0, 1.0]


def test_user_files_added_to_a_saved_directory_survive_later_saves(tmp_path):
    path = tmp_path / "saved"
    TensorDict({"a": torch.ones(2), "weights": {"w": torch.ones(2)}}).memmap(path)
    (path / "weights.memmap").write_bytes(b"\x01" * 8)  # looks like tdfunc's, is the user's
    (path / "model.pt").write_bytes(b"mine")
    (path / "extra").mkdir()
    (path / "extra" / "y.memmap").write_bytes(b"\x03" * 8)
    for step in range(3):  # "weights" dropped, re-added, dropped
        data = {"a": torch.full((2,), float(step))}
        if step == 1:
            data["weights"] = {"w": torch.ones(2)}
        TensorDict(data).memmap(path)
    wait_for_cleanup()
    assert (path / "weights.memmap").read_bytes() == b"\x01" * 8
    assert (path / "model.pt").read_bytes() == b"mine"
    assert (path / "extra" / "y.memmap").read_bytes() == b"\x03" * 8
    assert not (path / "weights").exists()
    assert TensorDict.load_memmap(path)["a"].tolist() == [2.0, 2.0]


def test_commit_is_a_rename_even_with_a_spare_name_linked_to_meta_json(saved):
    """A crash can leave ``meta.json.<token>.old`` hard-linked to ``meta.json`` (earlier
    versions kept one): the next save must not write that file in place."""
    spare = saved / "meta.json.0123456789abcdef.old"
    os.link(saved / "meta.json", spare)
    old = spare.read_bytes()
    old_inode = (saved / "meta.json").stat().st_ino
    TensorDict({"a": torch.zeros(4)}, [4]).memmap(saved)
    assert (saved / "meta.json").stat().st_ino != old_inode
    # removed as a leftover (by a background thread, maybe right now), or untouched
    with contextlib.suppress(FileNotFoundError):
        assert spare.read_bytes() == old
    assert TensorDict.load_memmap(saved)["a"].tolist() == [0.0] * 4


# ---------------------------------------------------------------------------- file types
def test_fifo_meta_json_is_refused_on_load(saved, deadline):
    os.unlink(saved / "meta.json")
    os.mkfifo(saved / "meta.json")
    with pytest.raises(ValueError, match="not a regular file"):
        TensorDict.load_memmap(saved)


def test_fifo_meta_json_is_refused_on_save(saved, deadline):
    os.unlink(saved / "meta.json")
    os.mkfifo(saved / "meta.json")
    with pytest.raises(FileExistsError, match="not a regular file"):
        TensorDict({"a": torch.ones(4)}, [4]).memmap(saved)
    assert os.path.exists(saved / "meta.json")


def test_fifo_non_tensor_value_file_is_refused(saved, deadline):
    name = _meta(saved)["entries"]["o"]["file"]
    os.unlink(saved / name)
    os.mkfifo(saved / name)
    with pytest.raises(ValueError, match="not a regular file"):
        TensorDict.load_memmap(saved)


def test_fifo_data_file_is_refused(saved, deadline):
    name = _meta(saved)["entries"]["a"]["file"]
    os.unlink(saved / name)
    os.mkfifo(saved / name)
    with pytest.raises(ValueError, match="not a regular file"):
        TensorDict.load_memmap(saved)


@pytest.mark.parametrize(
    "name", ["z.memmap", "a.0123abcd.memmap", "meta.json.0123456789abcdef.tmp"]
)
def test_fifo_in_the_target_directory_does_not_hang_a_save(saved, deadline, name):
    os.mkfifo(saved / name)
    for step in range(2):
        TensorDict({"a": torch.full((4,), float(step))}, [4]).memmap(saved)
    wait_for_cleanup()
    assert TensorDict.load_memmap(saved)["a"].tolist() == [1.0] * 4


def test_meta_json_linked_to_dev_zero_is_refused(saved, deadline):
    os.unlink(saved / "meta.json")
    os.symlink("/dev/zero", saved / "meta.json")
    with pytest.raises(ValueError, match="symbolic link"):
        TensorDict.load_memmap(saved)
    with pytest.raises(FileExistsError, match="symbolic link"):
        TensorDict({"a": torch.ones(4)}, [4]).memmap(saved)


def test_symbolic_link_sub_directory_is_not_followed(saved, tmp_path):
    outside = tmp_path / "outside"
    os.rename(saved / "b", outside)
    os.symlink(outside, saved / "b")
    with pytest.raises(ValueError, match="refusing to follow"):
        TensorDict.load_memmap(saved)


def test_symbolic_link_non_tensor_file_is_not_followed(saved, tmp_path):
    name = _meta(saved)["entries"]["o"]["file"]
    os.rename(saved / name, tmp_path / "outside.pt")
    os.symlink(tmp_path / "outside.pt", saved / name)
    with pytest.raises(ValueError, match="symbolic link"):
        TensorDict.load_memmap(saved)


# ---------------------------------------------------------------------------- metadata
def _nested_meta(depth: int) -> str:
    leaf = '{"format": "tdfunc.memmap", "version": 2, "class": "tdfunc.TensorDict", '
    leaf += '"batch_size": [], "names": null, "device": null, "entries": {}}'
    head = (
        '{"format": "tdfunc.memmap", "version": 2, "class": "tdfunc.TensorDict", '
        '"batch_size": [], "names": null, "device": null, "entries": {"k": '
        '{"kind": "collection", "dir": "k", "meta": '
    )
    return head * depth + leaf + "}}}" * depth


@pytest.mark.parametrize("depth", [150, 5000, 100_000])
def test_deeply_nested_metadata_is_a_clear_error(tmp_path, depth):
    (tmp_path / "meta.json").write_text(_nested_meta(depth))
    with pytest.raises(ValueError, match="nested"):
        TensorDict.load_memmap(tmp_path)


def test_deeply_nested_json_value_is_a_clear_error(saved):
    meta = _meta(saved)
    meta["entries"]["s"] = {"kind": "non_tensor", "batch_size": [4], "stack": False, "value": 0}
    text = json.dumps(meta).replace('"value": 0', '"value": ' + "[" * 100_000 + "]" * 100_000)
    (saved / "meta.json").write_text(text)
    with pytest.raises(ValueError, match="nested too deeply"):
        TensorDict.load_memmap(saved)


def test_saving_a_deeply_nested_container_or_value_is_a_clear_error(tmp_path):
    td = TensorDict({"x": torch.zeros(())})
    for _ in range(150):
        td = TensorDict({"k": td})
    with pytest.raises(ValueError, match="nested more than"):
        td.memmap(tmp_path / "deep")
    value: list = []
    for _ in range(5000):
        value = [value]
    with pytest.raises(TypeError, match="cannot save the non-tensor value"):
        TensorDict({"v": value}).memmap(tmp_path / "value")
    shallow = [[["x", "y"]]]
    assert TensorDict({"v": shallow}).memmap(tmp_path / "ok")["v"] == shallow


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m["entries"]["a"].update(dtype=["float32"]), "dtype"),
        (lambda m: m["entries"]["a"].update(dtype={"x": 1}), "dtype"),
        (lambda m: m["entries"]["a"].update(shape=[4, 0, 2**62, 2**62]), "shape"),
        (lambda m: m["entries"]["a"].update(shape=[4, 2**63]), "shape"),
        (lambda m: m.update(batch_size=[4, 1], names=["x", "x"]), "repeats"),
    ],
    ids=["dtype-list", "dtype-dict", "zero-size-overflow", "int64-overflow", "duplicate-names"],
)
def test_malformed_entries_are_clear_errors(saved, edit, message):
    meta = _meta(saved)
    edit(meta)
    (saved / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=message):
        TensorDict.load_memmap(saved)


def test_files_a_killed_save_was_about_to_remove_are_removed_by_the_next(tmp_path, monkeypatch):
    """A kill between a save's commit and its removal of the replaced files (simulated: the
    removal never runs) leaves plain names (``a.memmap``, ``b/``) no metadata references;
    the committed ``meta.json`` records them, so the next save removes them."""
    import tdfunc._persist.save as persist_save

    path = tmp_path / "saved"
    TensorDict({"a": torch.ones(2), "b": {"c": torch.ones(2)}}).memmap(path)
    monkeypatch.setattr(persist_save, "remove_in_background", lambda files, trash: None)
    TensorDict({"a": torch.zeros(2)}).memmap(path)
    assert "a.memmap" in os.listdir(path)  # left behind by the "killed" save
    monkeypatch.undo()
    TensorDict({"a": torch.full((2,), 2.0)}).memmap(path)
    wait_for_cleanup()
    names = sorted(os.listdir(path))
    assert len(names) == 2 and names[1] == "meta.json" and names[0].startswith("a."), names
    assert TensorDict.load_memmap(path)["a"].tolist() == [2.0, 2.0]
