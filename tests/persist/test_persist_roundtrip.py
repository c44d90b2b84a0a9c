"""Saving and loading TensorDicts: every container of a corpus round-trips exactly.

The reference for each case is the plain nested dict the container was built
from (tensors and Python values), compared leaf by leaf with ``torch.equal``.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest
import torch

from tdfunc import MemoryMappedTensor, NonTensorData, NonTensorStack, TensorClass, TensorDict
from tdfunc._persist.directory import wait_for_cleanup


class Point(TensorClass):
    x: torch.Tensor
    label: str
    extra: Any = None


def _gen():
    return torch.Generator().manual_seed(0)


def corpus():
    """(name, plain nested dict, batch size) for every case."""
    g = _gen()
    yield "empty", {}, []
    yield "flat", {"a": torch.randn(3, 4, generator=g), "b": torch.arange(3)}, [3]
    yield (
        "nested",
        {
            "a": torch.randn(2, 3, generator=g),
            "b": {"c": torch.randn(2, generator=g), "d": {"e": torch.randn(2, 5, 1, generator=g)}},
        },
        [2],
    )
    yield "batch0", {"a": torch.randn(0, 3, generator=g), "n": {"m": torch.zeros(0)}}, [0]
    yield "batch2", {"x": torch.randn(2, 3, 4, generator=g), "y": torch.ones(2, 3)}, [2, 3]
    yield "zero_feature", {"z": torch.zeros(3, 0), "w": torch.zeros(3, 2, 0, 5)}, [3]
    yield "scalars", {"f": torch.tensor(1.5), "i": torch.tensor(3), "b": torch.tensor(True)}, []
    yield (
        "dtypes",
        {
            "bf16": torch.randn(4, generator=g).to(torch.bfloat16),
            "f16": torch.randn(4, generator=g).half(),
            "f64": torch.randn(4, generator=g).double(),
            "c64": torch.randn(4, dtype=torch.complex64, generator=g),
            "u8": torch.arange(4, dtype=torch.uint8),
            "i16": torch.arange(4, dtype=torch.int16),
            "bool": torch.tensor([True, False, True, True]),
        },
        [4],
    )
    yield "non_contiguous", {"t": torch.randn(4, 3, generator=g).t()}, [3]
    yield "expanded", {"e": torch.randn(1, 3, generator=g).expand(5, 3)}, [5]
    yield (
        "non_tensor",
        {
            "s": "a string!",
            "none": NonTensorData(None),
            "json": NonTensorData({"k": [1, 2.5, None, "x"], "nested": {"t": True}}),
            "big_int": NonTensorData(2**70),
            "set": {1, 2, 3},  # not JSON: torch.save, read back with weights_only
            "bytes": b"\x00\xff",
            "tuple_obj": NonTensorData((1, "a")),
        },
        [2],
    )


CASES = list(corpus())


def build(plain: dict, batch_size) -> TensorDict:
    return TensorDict(plain, batch_size)


def assert_matches(loaded: Any, plain: dict, at=()) -> None:
    """Compare a loaded container with the plain dict it was built from (no tdfunc calls)."""
    assert set(loaded.keys()) == set(plain.keys()), at
    for key, ref in plain.items():
        value = loaded[key]
        if isinstance(ref, dict) and not isinstance(value, (dict, NonTensorData)):
            assert_matches(value, ref, at + (key,))
        elif isinstance(ref, torch.Tensor):
            assert isinstance(value, torch.Tensor), at + (key,)
            assert value.dtype == ref.dtype and value.shape == ref.shape, at + (key,)
            assert torch.equal(value.as_subclass(torch.Tensor), ref.detach()), at + (key,)
        else:
            expected = ref.data if isinstance(ref, NonTensorData) else ref
            assert value == expected and type(value) is type(expected), at + (key,)


@pytest.mark.parametrize(("name", "plain", "batch_size"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("method", ["memmap", "memmap_", "save", "threads"])
def test_corpus_round_trips(tmp_path, name, plain, batch_size, method):
    td = build(plain, batch_size)
    if method == "threads":
        saved = td.memmap(tmp_path, num_threads=3)
    else:
        saved = getattr(td, method)(tmp_path)
    assert saved.is_locked and saved.batch_size == torch.Size(batch_size)
    if method == "memmap_":
        assert saved is td
    assert_matches(saved, plain)
    loaded = TensorDict.load_memmap(tmp_path)
    assert type(loaded) is TensorDict and loaded.batch_size == torch.Size(batch_size)
    assert_matches(loaded, plain)
    for value in loaded.values(True, True):
        if isinstance(value, torch.Tensor):
            assert type(value) is MemoryMappedTensor


@pytest.mark.parametrize(("name", "plain", "batch_size"), CASES[:6], ids=[c[0] for c in CASES[:6]])
def test_corpus_memmap_like_keeps_shapes_and_reads_zeros(tmp_path, name, plain, batch_size):
    td = build(plain, batch_size)
    like = td.memmap_like(tmp_path)
    loaded = TensorDict.load_memmap(tmp_path)
    for out in (like, loaded):
        assert sorted(out.keys(True, True), key=str) == sorted(td.keys(True, True), key=str)
        for key in td.keys(True, True):
            ref = td.get(key)
            got = out.get(key)
            assert got.shape == ref.shape and got.dtype == ref.dtype
            assert not got.any()


@pytest.mark.parametrize("where", ["temporary", "directory"])
@pytest.mark.parametrize("copy_existing", [False, True])
def test_memmap_like_of_a_memory_mapped_container_gets_new_empty_files(
    tmp_path, where, copy_existing
):
    plain = {"a": torch.arange(6.0).reshape(3, 2), ("n", "b"): torch.ones(3)}
    td = TensorDict({"a": plain["a"].clone(), "n": {"b": plain[("n", "b")].clone()}}, [3])
    td = td.memmap(tmp_path / "source")
    prefix = tmp_path / "like" if where == "directory" else None
    like = td.memmap_like(prefix, copy_existing=copy_existing)
    for key, ref in plain.items():
        got = like.get(key)
        assert type(got) is MemoryMappedTensor and got.shape == ref.shape
        assert not got.any()  # no content, whatever the source holds
        assert got.untyped_storage().data_ptr() != td.get(key).untyped_storage().data_ptr()
        got.fill_(-1.0)  # writing the new container leaves the source alone
        assert torch.equal(td.get(key), ref)


def test_layout_is_the_seeds_layout(tmp_path):
    td = TensorDict({"a": torch.rand(10), "b": {"c": torch.rand(10)}}, [10])
    td.memmap_(prefix=tmp_path / "tensordict")
    found = sorted(
        os.path.relpath(os.path.join(root, name), tmp_path)
        for root, _, files in os.walk(tmp_path)
        for name in files
    )
    assert found == [
        "tensordict/a.memmap",
        "tensordict/b/c.memmap",
        "tensordict/b/meta.json",
        "tensordict/meta.json",
    ]


def test_saved_result_is_locked_and_writes_reach_the_files(tmp_path):
    saved = TensorDict({"a": torch.zeros(3), "b": {"c": torch.zeros(3)}}, [3]).memmap(tmp_path)
    with pytest.raises(RuntimeError, match="locked"):
        saved["new"] = torch.zeros(3)
    saved["a"][1] = 2.0
    saved["b", "c"].add_(1)
    saved[2] = TensorDict({"a": torch.tensor(7.0), "b": {"c": torch.tensor(9.0)}}, [])
    loaded = TensorDict.load_memmap(tmp_path)
    assert loaded["a"].tolist() == [0.0, 2.0, 7.0]
    assert loaded["b", "c"].tolist() == [1.0, 1.0, 9.0]


def test_memmap_in_place_replaces_leaves_and_keeps_sources(tmp_path):
    source = torch.arange(4.0)
    td = TensorDict({"a": source, "nested": {"b": torch.ones(4)}}, [4])
    nested = td["nested"]
    assert td.memmap_(tmp_path) is td
    assert td["nested"] is nested
    assert type(td["a"]) is MemoryMappedTensor and type(nested["b"]) is MemoryMappedTensor
    assert td.device == torch.device("cpu") and td.is_memmap() and td.is_locked
    td["a"].zero_()
    assert source.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_partial_load_of_a_nested_directory(tmp_path):
    plain = {
        "x": torch.arange(3.0),
        "inner": {"y": torch.ones(3, 2), "deeper": {"z": torch.eye(3)}},
    }
    TensorDict(plain, [3]).memmap(tmp_path)
    inner = TensorDict.load_memmap(tmp_path / "inner")
    assert inner.batch_size == torch.Size([3])
    assert_matches(inner, plain["inner"])
    assert_matches(TensorDict.load_memmap(tmp_path / "inner" / "deeper"), plain["inner"]["deeper"])


def test_names_and_batch_size_round_trip(tmp_path):
    td = TensorDict({"a": torch.zeros(2, 3, 4)}, [2, 3], names=["batch", "time"])
    TensorDict.load_memmap(td.memmap(tmp_path).saved_path)
    loaded = TensorDict.load_memmap(tmp_path)
    assert loaded.names == ["batch", "time"] and loaded.batch_size == torch.Size([2, 3])


def test_load_on_meta_device_opens_no_data_file(tmp_path):
    TensorDict({"a": torch.zeros(2, 3), "b": {"c": torch.zeros((), dtype=torch.int64)}}, []).save(
        tmp_path
    )
    os.remove(tmp_path / "a.memmap")  # proves the file is never opened
    loaded = TensorDict.load_memmap(tmp_path, device="meta")
    assert loaded.device == torch.device("meta") and loaded["b"].device == torch.device("meta")
    assert loaded["a"].device.type == "meta" and loaded["a"].shape == (2, 3)
    assert loaded["b", "c"].dtype == torch.int64


def test_load_under_fake_tensor_mode(tmp_path):
    from torch._subclasses import FakeTensorMode
    from torch._subclasses.fake_tensor import FakeTensor

    TensorDict({"a": torch.zeros(4), "b": {"c": torch.zeros(2, 2)}}, []).save(tmp_path)
    with FakeTensorMode():
        loaded = TensorDict.load_memmap(tmp_path)
    assert type(loaded["a"]) is FakeTensor and loaded["b", "c"].shape == (2, 2)
    assert loaded.device == torch.device("cpu")


def test_load_onto_a_device(tmp_path):
    TensorDict({"a": torch.arange(3.0)}, [3]).save(tmp_path)
    loaded = TensorDict.load_memmap(tmp_path, device="cpu", num_threads=2)
    assert type(loaded["a"]) is MemoryMappedTensor and loaded.device == torch.device("cpu")
    if torch.cuda.is_available():
        on_gpu = TensorDict.load_memmap(tmp_path, device="cuda")
        assert on_gpu["a"].device.type == "cuda" and on_gpu["a"].tolist() == [0.0, 1.0, 2.0]


def test_tensorclass_nested_and_stacked_round_trip_with_their_classes(tmp_path):
    points = Point(x=torch.randn(3, 2, generator=_gen()), label="pts", batch_size=[3])
    items = torch.stack([TensorDict({"item": i, "name": f"n{i}"}, []) for i in range(4)])
    stacked = torch.stack([points, points.apply(lambda t: t + 1)])
    data = TensorDict({"points": points, "items": items, "stacked": stacked}, [])
    data.memmap_(tmp_path)
    loaded = TensorDict.load_memmap(tmp_path)
    assert type(loaded["points"]) is Point and type(loaded["stacked"]) is Point
    assert loaded["points"].label == "pts" and loaded["points"].extra is None
    assert torch.equal(loaded["points"].x, points.x)
    assert torch.equal(loaded["stacked"].x, torch.stack([points.x, points.x + 1]))
    assert loaded["items"]["item"].tolist() == [0, 1, 2, 3]
    assert loaded["items"]["name"] == ["n0", "n1", "n2", "n3"]
    alone = TensorDict.load_memmap(tmp_path / "points")
    assert type(alone) is Point and torch.equal(alone.x, points.x)


def test_tensorclass_top_level_memmap_and_load(tmp_path):
    points = Point(x=torch.arange(3.0), label="top", batch_size=[3])
    saved = points.memmap(tmp_path)
    assert type(saved) is Point and type(saved.x) is MemoryMappedTensor
    loaded = Point.load_memmap(tmp_path)
    assert type(loaded) is Point and loaded.label == "top" and loaded.x.tolist() == [0, 1, 2]


def test_existing_memmap_leaves_without_prefix_are_reused():
    td0 = TensorDict({"a": 1}, []).memmap()
    td1 = td0.memmap()
    assert td0["a"] is td1["a"]
    assert td0.saved_path is None  # a temporary location, not a saved dataset
    with pytest.raises(RuntimeError, match="no saved path"):
        td0.memmap_refresh_()


def test_existing_memmap_leaves_same_prefix_reuse_other_prefix_error(tmp_path):
    td = TensorDict({"a": torch.arange(3.0)}, [3])
    td0 = td.memmap(tmp_path / "p0")
    again = td0.memmap(tmp_path / "p0")
    assert again["a"] is td0["a"]
    wait_for_cleanup()
    assert [n for n in os.listdir(tmp_path / "p0") if n.endswith(".memmap")] == ["a.memmap"]
    with pytest.raises(RuntimeError, match="copy_existing=True"):
        td0.memmap(tmp_path / "p1")
    td1 = td0.memmap(tmp_path / "p1", copy_existing=True)
    assert td1["a"].filename.startswith(str(tmp_path / "p1"))
    assert (TensorDict.load_memmap(tmp_path / "p1") == td).all()
    with pytest.raises(FileNotFoundError, match=r"meta\.json"):
        TensorDict.load_memmap(tmp_path / "p2")


def test_resaving_replaces_content_and_removes_stale_files(tmp_path):
    TensorDict({"a": torch.zeros(3), "b": {"c": torch.zeros(3)}, "d": torch.zeros(3)}, [3]).memmap(
        tmp_path
    )
    (tmp_path / "notes.txt").write_text("mine")  # files tdfunc did not write are kept
    TensorDict({"a": torch.ones(3), "b": torch.ones(3)}, [3]).memmap(tmp_path)
    loaded = TensorDict.load_memmap(tmp_path)
    assert sorted(loaded.keys()) == ["a", "b"] and loaded["b"].tolist() == [1, 1, 1]
    wait_for_cleanup()
    names = set(os.listdir(tmp_path))
    assert "notes.txt" in names and "meta.json" in names
    assert not (tmp_path / "b").is_dir()  # the nested directory of the first save
    assert not any(name.startswith("d.") for name in names)  # a key that is gone
    assert len([n for n in names if n.endswith(".memmap")]) == 2  # a, b


def _inodes(path) -> dict:
    return {p.name: p.stat().st_ino for p in path.rglob("*.memmap")}


def test_resaving_never_writes_a_committed_file(tmp_path):
    """Every save writes new files (new inodes): a load of an earlier generation, here or
    in another process, keeps its values however many saves follow."""

    def generation(g):
        return TensorDict({"w": torch.full((4, 3), float(g)), "n": {"b": torch.full((4,), g)}}, [4])

    generation(1).memmap(tmp_path)
    os.symlink(tmp_path, tmp_path.parent / f"{tmp_path.name}-alias")
    first = TensorDict.load_memmap(tmp_path.parent / f"{tmp_path.name}-alias")  # generation 1
    first_slice = first["n", "b"][1:]  # a view: keeps the mapping alive on its own
    first_inodes = previous = set(_inodes(tmp_path).values())
    for g in range(2, 7):
        generation(g).memmap(tmp_path)
        wait_for_cleanup()
        inodes = set(_inodes(tmp_path).values())
        # new files, the old ones removed (a freed inode number may come back later)
        assert len(inodes) == 2 and not inodes & (first_inodes | previous)
        previous = inodes
        assert first_slice.tolist() == [1, 1, 1] and first["w"].unique().tolist() == [1.0]
    loaded = TensorDict.load_memmap(tmp_path)
    assert loaded["w"].unique().tolist() == [6.0] and loaded["n", "b"].unique().tolist() == [6]


def test_existsok_false_refuses_to_overwrite(tmp_path):
    td = TensorDict({"a": torch.zeros(2)}, [2])
    td.memmap(tmp_path, existsok=False)
    with pytest.raises(FileExistsError, match="existsok"):
        td.memmap(tmp_path, existsok=False)


def test_return_early_gives_a_future(tmp_path):
    td = TensorDict({f"k{i}": torch.full((2,), float(i)) for i in range(6)}, [2])
    future = td.memmap(tmp_path, num_threads=2, return_early=True)
    assert isinstance(future, Future)
    result = future.result(timeout=30)
    assert result["k5"].tolist() == [5.0, 5.0]
    assert TensorDict.load_memmap(tmp_path)["k3"].tolist() == [3.0, 3.0]
    in_place = td.memmap_(tmp_path / "x", num_threads=2, return_early=True).result(timeout=30)
    assert in_place is td and type(td["k0"]) is MemoryMappedTensor


def test_load_memmap_into_an_existing_tensordict_and_refresh(tmp_path):
    TensorDict({"a": torch.ones(2), "n": {"b": torch.ones(2)}}, [2]).memmap(tmp_path)
    target = TensorDict({"a": torch.zeros(2), "n": {"b": torch.zeros(2)}, "z": "gone"}, [2])
    nested = target["n"]
    assert target.load_memmap_(tmp_path) is target
    assert sorted(target.keys()) == ["a", "n"] and target["n"] is nested
    assert nested["b"].tolist() == [1.0, 1.0] and target.saved_path == str(tmp_path)
    assert target.load_(tmp_path) is target

    saved = TensorDict({"a": torch.zeros(2)}, [2]).memmap(tmp_path / "r")
    TensorDict({"a": torch.full((2,), 3.0), "b": torch.ones(2)}, [2]).memmap(tmp_path / "r")
    assert saved["a"].tolist() == [0.0, 0.0]  # the old mapping keeps its snapshot
    assert saved.memmap_refresh_() is saved and saved.is_locked
    assert sorted(saved.keys()) == ["a", "b"] and saved["a"].tolist() == [3.0, 3.0]


def test_aliases_save_dumps_load(tmp_path):
    td = TensorDict({"a": torch.arange(2)}, [2])
    assert type(td.dumps(tmp_path / "d")["a"]) is MemoryMappedTensor
    assert TensorDict.load(tmp_path / "d")["a"].tolist() == [0, 1]
    assert td.save(tmp_path / "s").saved_path == str(tmp_path / "s")


def test_unsupported_options_are_clear_errors(tmp_path):
    td = TensorDict({"a": torch.zeros(1)}, [1])
    with pytest.raises(NotImplementedError, match="share_non_tensor"):
        td.memmap(tmp_path, share_non_tensor=True)
    with pytest.raises(ValueError, match="robust_key"):
        td.memmap(tmp_path, robust_key=False)
    with pytest.raises(ValueError, match="num_threads"):
        td.memmap(tmp_path, num_threads=-1)


@pytest.mark.parametrize(
    ("num_threads", "error"),
    [(-1, ValueError), (1.5, TypeError), (True, TypeError), (False, TypeError), ("2", TypeError)],
)
def test_num_threads_is_checked_by_every_entry_point(tmp_path, num_threads, error):
    td = TensorDict({"a": torch.arange(3.0)}, [3])
    td.memmap(tmp_path / "saved")
    before = sorted(os.listdir(tmp_path / "saved"))
    with pytest.raises(error, match="num_threads"):
        TensorDict.load_memmap(tmp_path / "saved", num_threads=num_threads)
    with pytest.raises(error, match="num_threads"):
        td.clone().load_memmap_(tmp_path / "saved", num_threads=num_threads)
    for fmt in ("tdfunc", "tensordict"):
        with pytest.raises(error, match="num_threads"):
            td.memmap(tmp_path / fmt, num_threads=num_threads, format=fmt)
        assert not (tmp_path / fmt).exists()
    assert sorted(os.listdir(tmp_path / "saved")) == before
    # a non-tensor leaf saved on its own takes the same keywords, checked the same way
    for leaf in (NonTensorData("a"), NonTensorStack("a", "b")):
        for fmt in ("tdfunc", "tensordict"):
            for method in ("memmap", "memmap_"):
                target = tmp_path / f"{type(leaf).__name__}-{fmt}-{method}"
                with pytest.raises(error, match=f"{type(leaf).__name__}.{method}: num_threads"):
                    getattr(leaf, method)(target, num_threads=num_threads, format=fmt)
                assert not target.exists()


def test_num_threads_takes_any_integer_type(tmp_path):
    td = TensorDict({"a": torch.arange(3.0), "b": {"c": torch.ones(2)}}, [])
    td.memmap(tmp_path, num_threads=np.int64(2))
    loaded = TensorDict.load_memmap(tmp_path, num_threads=np.int64(2))
    assert loaded["a"].tolist() == [0.0, 1.0, 2.0] and loaded["b", "c"].tolist() == [1.0, 1.0]


def test_unloadable_non_tensor_value_fails_before_anything_is_written(tmp_path):
    class Opaque:
        pass

    td = TensorDict({"a": torch.zeros(2), "obj": Opaque()}, [2])
    with pytest.raises(TypeError, match=r"key 'obj'.*weights_only"):
        td.memmap(tmp_path)
    assert os.listdir(tmp_path) == []


def test_fsync_option_saves_the_same_content(tmp_path):
    td = TensorDict({"a": torch.arange(3.0), "b": {"c": torch.ones(2, 3)}}, [])
    td.memmap(tmp_path, fsync=True)
    assert (TensorDict.load_memmap(tmp_path) == td).all()


def test_memmap_like_preallocates_a_million_images_instantly(tmp_path):
    datum = TensorDict(
        {
            "images": torch.zeros((128, 128, 3), dtype=torch.uint8),
            "labels": torch.zeros((), dtype=torch.int),
        },
        [],
    )
    start = time.perf_counter()
    data = datum.expand(1000000).memmap_like(tmp_path)
    elapsed = time.perf_counter() - start
    assert elapsed < 0.5, elapsed
    image_file = tmp_path / "images.memmap"
    assert os.path.getsize(image_file) == 1000000 * 128 * 128 * 3
    used = sum(os.stat(p).st_blocks * 512 for p in tmp_path.iterdir())
    assert used < 2**20  # 49 GB of images, less than a megabyte on disk
    index = torch.tensor([1, 10000, 500000])
    data[index] = TensorDict(
        {
            "images": torch.full((3, 128, 128, 3), 7, dtype=torch.uint8),
            "labels": torch.tensor([1, 2, 3], dtype=torch.int),
        },
        [3],
    )
    batch = TensorDict.load_memmap(tmp_path)[index]
    assert batch["labels"].tolist() == [1, 2, 3] and bool((batch["images"] == 7).all())
    assert int(data["labels"][2:10000].sum()) == 0


def test_reusing_a_leaf_whose_file_is_queued_for_removal_copies_it(tmp_path, monkeypatch):
    """A memory-mapped leaf whose file an earlier save is about to remove is copied, not
    referenced (else the new meta.json would point to a file that disappears)."""
    import threading

    import tdfunc._persist.directory as persist_dir

    release = threading.Event()
    real_remove = persist_dir._remove

    def slow_remove(files, trash):
        release.wait(10)
        real_remove(files, trash)

    monkeypatch.setattr(persist_dir, "_remove", slow_remove)
    first = TensorDict({"a": torch.arange(3.0)}, [3]).memmap(tmp_path)  # maps a.memmap
    for g in (2, 3):  # a.memmap is kept one save (still mapped), then queued for removal
        TensorDict({"a": torch.full((3,), float(g))}, [3]).memmap(tmp_path)
    first.memmap(tmp_path)
    release.set()
    wait_for_cleanup()
    assert TensorDict.load_memmap(tmp_path)["a"].tolist() == [0.0, 1.0, 2.0]
