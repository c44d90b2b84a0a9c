"""Faults: corrupt or hostile metadata, short files, crashes in the middle of a save."""

from __future__ import annotations

import json
import os
import random
import select
import signal
import sys
import time

import pytest
import torch

import tdfunc._persist.save as persist_save
from tdfunc import TensorClass, TensorDict
from tdfunc._persist.directory import wait_for_cleanup


def _meta(path) -> dict:
    return json.loads((path / "meta.json").read_text())


def _write_meta(path, meta: dict) -> None:
    (path / "meta.json").write_text(json.dumps(meta))


@pytest.fixture
def saved(tmp_path):
    td = TensorDict(
        {"a": torch.arange(4.0), "b": {"c": torch.ones(4, 2)}, "s": "text"}, batch_size=[4]
    )
    td.memmap(tmp_path)
    return tmp_path


# ---------------------------------------------------------------------------- metadata
def test_missing_meta_json_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"meta\.json not found") as info:
        TensorDict.load_memmap(tmp_path)
    assert str(tmp_path / "meta.json") in str(info.value)


@pytest.mark.parametrize(
    "text",
    ['{"format": "tdfunc.memmap", "vers', "", "\xff\xfe", "[1, 2]", "null"],
    ids=["truncated", "empty", "binary", "list", "null"],
)
def test_corrupt_meta_json_is_an_error_naming_the_file(saved, text):
    (saved / "meta.json").write_bytes(text.encode("latin-1"))
    with pytest.raises(ValueError, match="is corrupt") as info:
        TensorDict.load_memmap(saved)
    assert str(saved / "meta.json") in str(info.value)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m.update(format="other"), "'format'"),
        (lambda m: m.update(version="1"), "'version'"),
        (lambda m: m.update(batch_size=[-1]), "batch_size"),
        (lambda m: m.update(names=["x", "y"]), "names"),
        (lambda m: m["entries"]["a"].update(dtype="object"), "dtype"),
        (lambda m: m["entries"]["a"].update(dtype="torch.float32"), "dtype"),
        (lambda m: m["entries"]["a"].update(shape=[5]), "shape"),
        (lambda m: m["entries"]["a"].update(kind="pickle"), "unknown kind"),
        (lambda m: m["entries"]["a"].update(file="../../etc/passwd"), "not a name tdfunc"),
        (lambda m: m["entries"]["a"].update(file="/etc/passwd"), "not a name tdfunc"),
        (lambda m: m["entries"]["a"].update(file="a.memmap/../../x.memmap"), "not a name"),
        (lambda m: m["entries"]["b"].update(dir=".."), "not a name tdfunc"),
        (lambda m: m["entries"]["b"].update(dir="/tmp"), "not a name tdfunc"),
        (lambda m: m["entries"]["b"]["meta"].update(batch_size=[3]), "does not start"),
        (lambda m: m["entries"]["s"].update(file="s.pt"), "exactly one"),
        (lambda m: m["entries"]["s"].update(stack=True), "stack"),
    ],
)
def test_invalid_fields_are_rejected_with_the_key(saved, edit, message):
    meta = _meta(saved)
    edit(meta)
    _write_meta(saved, meta)
    with pytest.raises(ValueError, match=message):
        TensorDict.load_memmap(saved)


def test_newer_format_version_asks_for_an_upgrade(saved):
    meta = _meta(saved)
    meta["version"] = 99
    _write_meta(saved, meta)
    with pytest.raises(ValueError, match="Upgrade tdfunc"):
        TensorDict.load_memmap(saved)


@pytest.mark.parametrize(
    "name",
    [
        "os.system",
        "this.s",
        "builtins.eval",
        "tdfunc.Ensemble",
        "tdfunc._core.container.TensorDict",
    ],
)
def test_meta_cannot_import_or_build_an_arbitrary_class(saved, name):
    modules_before = set(sys.modules)
    meta = _meta(saved)
    meta["entries"]["b"]["meta"]["class"] = name
    _write_meta(saved, meta)
    with pytest.raises(ValueError, match="not a TensorDict or a TensorClass known"):
        TensorDict.load_memmap(saved)
    assert set(sys.modules) == modules_before  # nothing was imported


class _Payload:
    """Unpickling this would create a directory (the sentinel)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_loading_never_unpickles(saved, tmp_path):
    sentinel = tmp_path.parent / f"pwned-{os.getpid()}-{random.random()}"
    torch.save(_Payload(str(sentinel)), saved / "s.pt")
    meta = _meta(saved)
    del meta["entries"]["s"]["value"]
    meta["entries"]["s"]["file"] = "s.pt"
    _write_meta(saved, meta)
    with pytest.raises(ValueError, match="weights_only"):
        TensorDict.load_memmap(saved)
    assert not sentinel.exists()


# ---------------------------------------------------------------------------- data files
def test_short_data_file_is_an_error_not_a_crash_nor_short_data(saved):
    path = saved / "b" / "c.memmap"
    with open(path, "r+b") as file:
        file.truncate(12)
    with pytest.raises(ValueError, match=r"holds 12 bytes.*needs 32 bytes.*truncated"):
        TensorDict.load_memmap(saved)
    with pytest.raises(ValueError, match="truncated"):
        TensorDict.load_memmap(saved / "b")
    assert os.path.getsize(path) == 12  # not grown to size by the mapping


def test_longer_data_file_is_an_error(saved):
    with open(saved / "a.memmap", "ab") as file:
        file.write(b"\0" * 8)
    with pytest.raises(ValueError, match="holds 24 bytes"):
        TensorDict.load_memmap(saved)


def test_missing_data_file_names_it(saved):
    os.remove(saved / "a.memmap")
    with pytest.raises(FileNotFoundError, match=r"a\.memmap is listed in .*meta\.json"):
        TensorDict.load_memmap(saved)


def test_symbolic_link_data_file_is_refused(saved, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside") / "secret.bin"
    outside.write_bytes(b"\0" * 16)
    os.remove(saved / "a.memmap")
    os.symlink(outside, saved / "a.memmap")
    with pytest.raises(
        ValueError, match="is a symbolic link; refusing to follow it out of the checkpoint"
    ):
        TensorDict.load_memmap(saved)


def test_symbolic_link_nested_directory_is_refused_when_saving(tmp_path, tmp_path_factory):
    outside = tmp_path_factory.mktemp("elsewhere")
    (tmp_path / "saved").mkdir()
    os.symlink(outside, tmp_path / "saved" / "b")
    with pytest.raises(FileExistsError, match="b"):  # not a directory of tdfunc's
        TensorDict({"b": {"c": torch.zeros(1)}}, []).memmap(tmp_path / "saved")
    assert os.listdir(outside) == []
    os.unlink(tmp_path / "saved" / "b")
    TensorDict({"c": torch.zeros(1)}, []).memmap(tmp_path / "saved")
    os.symlink(outside, tmp_path / "saved" / "b")  # inside a directory of tdfunc's
    with pytest.raises(FileExistsError, match="symbolic link"):
        TensorDict({"b": {"c": torch.zeros(1)}}, []).memmap(tmp_path / "saved")
    assert os.listdir(outside) == []


# ---------------------------------------------------------------------------- crash safety
class _Part(TensorClass):
    """A TensorClass level: saved as ``part/meta.json`` plus ``part/_tensordict/``."""

    z: torch.Tensor
    sub: TensorDict
    tag: str


def _generation(g: int) -> TensorDict:
    """A tree whose every leaf holds ``g``: a mix of generations is easy to see."""
    part = _Part(
        z=torch.full((64, 2), float(g)),
        sub=TensorDict({"w": torch.full((64,), float(g))}, [64]),
        tag=f"gen{g}",
        batch_size=[64],
    )
    return TensorDict(
        {
            "part": part,
            "big": torch.full((64, 1024), float(g)),  # 256 KB: writing it takes a while
            "small": torch.full((64,), g, dtype=torch.int64),
            "inner": {
                "x": torch.full((64, 3), float(g)),
                "deep": {"y": torch.full((64, 2), float(g)), "tag": f"gen{g}"},
            },
            "tag": f"gen{g}",
        },
        [64],
    )


def _generation_of(td: TensorDict) -> int:
    """The single generation ``td`` holds; fails on a mix."""
    values = set()
    for key in td.keys(True, True):
        value = td[key]
        if isinstance(value, torch.Tensor):
            values |= set(value.unique().tolist())
        else:
            values.add(float(value.removeprefix("gen")))
    assert len(values) == 1, f"a mix of generations: {sorted(values)}"
    return int(values.pop())


def _check_consistent(path) -> int:
    generation = _generation_of(TensorDict.load_memmap(path))
    levels = ("inner", "inner/deep", "part", "part/_tensordict", "part/_tensordict/sub")
    for sub in levels:
        _generation_of(TensorDict.load_memmap(path / sub))  # each level alone: one generation
    return generation


@pytest.mark.parametrize("fail_at", range(6))
def test_failed_commit_leaves_the_old_content(tmp_path, monkeypatch, fail_at):
    _generation(1).memmap(tmp_path)
    calls = []
    real = persist_save.write_meta

    def failing(directory, node, fsync):
        if len(calls) == fail_at:
            raise OSError("disk full")
        calls.append(directory)
        return real(directory, node, fsync)

    monkeypatch.setattr(persist_save, "write_meta", failing)
    with pytest.raises(OSError, match="disk full"):
        _generation(2).memmap(tmp_path)
    assert _generation_of(TensorDict.load_memmap(tmp_path)) == 1
    _check_consistent(tmp_path)
    monkeypatch.undo()
    _generation(3).memmap(tmp_path)
    assert _check_consistent(tmp_path) == 3


def test_failed_write_leaves_the_old_content_and_no_new_files(tmp_path, monkeypatch):
    _generation(1).memmap(tmp_path)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    real = persist_save.write_file
    count = []

    def failing(fd, path, tensor, shape=None):
        count.append(path)
        if len(count) == 3:
            raise OSError("no space left")
        real(fd, path, tensor, shape)

    monkeypatch.setattr(persist_save, "write_file", failing)
    with pytest.raises(OSError, match="no space"):
        _generation(2).memmap(tmp_path)
    assert _check_consistent(tmp_path) == 1
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def _saver(path: str, write_fd: int, generation: int) -> None:
    """Child process: save generations g, g+1, ... in a loop, reporting each commit."""
    torch.set_num_threads(1)  # the parent's OpenMP pool does not survive fork
    real_replace = os.replace

    def slow_replace(src, dst):  # widen the windows between the commits of each level
        time.sleep(random.random() * 0.002)
        real_replace(src, dst)

    os.replace = slow_replace
    while True:
        _generation(generation).memmap(path)
        os.write(write_fd, generation.to_bytes(4, "little"))
        generation += 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_killed_saver_never_leaves_a_mix(tmp_path):
    """SIGKILL a process that saves in a loop, at random times: the data is old or new."""
    rng = random.Random(0)
    path = tmp_path / "data"
    _generation(0).memmap(path)
    deadline = time.monotonic() + 20
    trials = saves = 0
    while trials < 12 and time.monotonic() < deadline:
        trials += 1
        previous = _check_consistent(path)
        start = 1000 * trials
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child is killed
            try:
                os.close(read_fd)
                _saver(str(path), write_fd, start)
            finally:
                os._exit(1)
        os.close(write_fd)
        # kill before the first commit in a few trials, in the middle of a later save otherwise
        if trials % 4 != 1:
            ready, _, _ = select.select([read_fd], [], [], 10)
            assert ready, "the saving process made no progress"
        time.sleep(rng.random() * 0.02)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        reported = b""
        while chunk := os.read(read_fd, 4096):
            reported += chunk
        os.close(read_fd)
        generation = _check_consistent(path)
        if reported:
            # the last reported save is committed; the one in flight may be committed too
            committed = int.from_bytes(reported[-4:], "little")
            assert committed <= generation <= committed + 1
            saves += 1
        else:
            assert generation in (previous, start)
    assert saves >= trials // 2
    # the next save removes whatever the killed processes left behind
    _generation(100).memmap(path)
    assert _check_consistent(path) == 100
    wait_for_cleanup()
    files = {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()}
    assert files == set(_referenced(path)), sorted(files ^ set(_referenced(path)))


def _referenced(path) -> list[str]:
    """Every file the committed meta.json files reference, and the meta.json files."""
    out = []

    def walk(node: dict, relative: str) -> None:
        out.append(os.path.join(relative, "meta.json") if relative else "meta.json")
        if "tensordict" in node:  # a TensorClass
            inner = node["tensordict"]
            walk(inner["meta"], os.path.join(relative, inner["dir"]) if relative else inner["dir"])
        for entry in node["entries"].values():
            if entry.get("file"):
                out.append(os.path.join(relative, entry["file"]) if relative else entry["file"])
            if entry["kind"] == "collection":
                walk(
                    entry["meta"],
                    os.path.join(relative, entry["dir"]) if relative else entry["dir"],
                )

    walk(_meta(path), "")
    return out
