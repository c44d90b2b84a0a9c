"""``MemoryMappedTensor``'s tensordict API: keywords, constructors, views that stay mapped."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
import torch

from tdfunc import MemoryMappedTensor, TensorDict


def _file(tmp_path, values: np.ndarray) -> str:
    path = os.fspath(tmp_path / "data.bin")
    values.tofile(path)
    return path


@pytest.mark.parametrize("make", ["empty", "zeros", "ones", "full"])
def test_shape_and_device_keywords(make, tmp_path):
    kwargs = {"fill_value": 3} if make == "full" else {}
    out = getattr(MemoryMappedTensor, make)(
        shape=(2, 3), dtype=torch.int64, device="cpu", filename=tmp_path / "x.memmap", **kwargs
    )
    expected = {"empty": 0, "zeros": 0, "ones": 1, "full": 3}[make]
    assert type(out) is MemoryMappedTensor and out.shape == torch.Size([2, 3])
    np.testing.assert_array_equal(
        np.fromfile(tmp_path / "x.memmap", dtype=np.int64), np.full(6, expected)
    )
    with pytest.raises(TypeError, match="not both"):
        getattr(MemoryMappedTensor, make)(2, shape=(2,), **kwargs)


def test_non_cpu_device_is_refused():
    with pytest.raises(ValueError, match="lives on the CPU"):
        MemoryMappedTensor.empty(shape=(2,), device="meta")


def test_from_filename_with_index(tmp_path):
    values = np.arange(12, dtype=np.float32)
    path = _file(tmp_path, values)
    out = MemoryMappedTensor.from_filename(path, torch.float32, (3, 4), index=1)
    assert type(out) is MemoryMappedTensor and out.tolist() == values.reshape(3, 4)[1].tolist()


def test_from_filename_mode(tmp_path):
    values = np.arange(6, dtype=np.int64)
    path = _file(tmp_path, values)
    private = MemoryMappedTensor.from_filename(path, torch.int64, (2, 3), mode="r")
    private[0, 0] = 100  # copy-on-write: the file keeps its bytes
    assert private[0, 0] == 100
    np.testing.assert_array_equal(np.fromfile(path, dtype=np.int64), values)
    shared = MemoryMappedTensor.from_filename(path, torch.int64, (2, 3), mode="r+")
    shared[0, 0] = 7
    assert np.fromfile(path, dtype=np.int64)[0] == 7
    default = MemoryMappedTensor.from_filename(path, torch.int64, (2, 3))
    default[0, 1] = 8  # a writable file is mapped shared
    assert np.fromfile(path, dtype=np.int64)[1] == 8
    with pytest.raises(ValueError, match="from_filename: mode must be None, 'r' or 'r\\+'"):
        MemoryMappedTensor.from_filename(path, torch.int64, (2, 3), mode="w")
    os.chmod(path, 0o444)
    try:
        if not os.access(path, os.W_OK):  # root can write to any file
            with pytest.raises(PermissionError, match="mode='r\\+'"):
                MemoryMappedTensor.from_filename(path, torch.int64, (2, 3), mode="r+")
        read_only = MemoryMappedTensor.from_filename(path, torch.int64, (2, 3), mode="r")
        assert read_only.tolist() == [[7, 8, 2], [3, 4, 5]]
    finally:
        os.chmod(path, 0o644)


def test_from_handler_maps_an_open_file(tmp_path):
    values = np.arange(6, dtype=np.int32)
    with open(_file(tmp_path, values), "r+b") as handle:
        mapped = MemoryMappedTensor.from_handler(handle, torch.int32, (2, 3))
        mapped[0, 0] = 42
    on_disk = np.fromfile(tmp_path / "data.bin", dtype=np.int32)
    assert on_disk.tolist() == [42, 1, 2, 3, 4, 5]
    with tempfile.TemporaryFile() as anonymous:  # only a descriptor, no name on disk
        anonymous.write(np.arange(3, dtype=np.float64).tobytes())
        anonymous.flush()
        if os.path.exists(f"/proc/self/fd/{anonymous.fileno()}"):
            mapped = MemoryMappedTensor.from_handler(anonymous.fileno(), torch.float64, (3,))
            assert mapped.tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(TypeError, match="from_handler"):
        MemoryMappedTensor.from_handler(object(), torch.float32, (1,))


@pytest.mark.parametrize(
    "make",
    [
        lambda: MemoryMappedTensor.empty((3, 4), dtype=torch.int32),
        lambda: MemoryMappedTensor.zeros((3, 4), dtype=torch.bool),
        lambda: MemoryMappedTensor.ones((3, 4), dtype=torch.int32),
        lambda: MemoryMappedTensor.from_tensor(torch.arange(12.0).view(3, 4)),
    ],
    ids=["empty", "zeros", "ones", "from_tensor"],
)
def test_handler_maps_the_same_file(make):
    t = make()
    reference = torch.arange(12).view(3, 4).to(t.dtype)  # plain torch: what the file holds
    t.copy_(reference)
    handle = t._handler
    assert handle is not None and handle.name == t.filename
    again = MemoryMappedTensor.from_handler(handle, dtype=t.dtype, shape=(3, 4))
    assert type(again) is MemoryMappedTensor and torch.equal(again, reference)
    again[1] = reference[0]  # one file: a write through one is read through the other
    assert torch.equal(t[1], reference[0])


def test_handler_of_a_nested_tensor_maps_its_components():
    parts = [torch.zeros(2, 3) + i for i in range(3)]
    nested = MemoryMappedTensor.from_tensor(torch.nested.nested_tensor(parts))
    shape = torch.tensor([[2, 3]] * 3)
    again = MemoryMappedTensor.from_handler(nested._handler, dtype=nested.dtype, shape=shape)
    assert type(again) is MemoryMappedTensor
    for got, want in zip(again.unbind(), parts):
        assert torch.equal(got, want)


def test_from_storage_shares_the_file():
    source = MemoryMappedTensor.from_tensor(torch.arange(6))
    out = MemoryMappedTensor.from_storage(source.untyped_storage(), torch.int64, (2, 3))
    assert out.filename == source.filename and out.tolist() == [[0, 1, 2], [3, 4, 5]]
    out[1, 2] = 50
    assert source[5].item() == 50
    with pytest.raises(ValueError, match="not backed by a file"):
        MemoryMappedTensor.from_storage(torch.zeros(2).untyped_storage(), torch.float32, (2,))


def test_direct_construction_forms(tmp_path):
    from_tensor = MemoryMappedTensor(torch.arange(4.0), filename=tmp_path / "t.memmap")
    assert type(from_tensor) is MemoryMappedTensor and from_tensor.tolist() == [0, 1, 2, 3]
    mapped = MemoryMappedTensor(from_tensor.filename, dtype=torch.float32, shape=(4,), index=2)
    assert mapped.item() == 2.0
    same = MemoryMappedTensor(filename=from_tensor.filename, dtype=torch.float32, shape=(2, 2))
    assert same.tolist() == [[0.0, 1.0], [2.0, 3.0]]
    with pytest.raises(TypeError, match="dtype= and shape="):
        MemoryMappedTensor(from_tensor.filename)


def test_indexing_gives_views_on_the_same_file():
    mapped = MemoryMappedTensor.from_tensor(torch.zeros(4, 3))
    for index in (1, slice(1, 3), (slice(None), 0), Ellipsis):
        view = mapped[index]
        assert type(view) is MemoryMappedTensor and view.filename == mapped.filename
        assert view.untyped_storage().data_ptr() == mapped.untyped_storage().data_ptr()
    mapped[2][1] = 9.0  # write through a view
    on_disk = np.fromfile(mapped.filename, dtype=np.float32).reshape(4, 3)
    assert on_disk[2, 1] == 9.0
    picked = mapped[torch.tensor([0, 2])]  # advanced indexing copies
    assert type(picked) is torch.Tensor


def test_from_tensor_of_a_view_copies_it():
    mapped = MemoryMappedTensor.from_tensor(torch.arange(6.0).view(2, 3))
    row = mapped[1]
    copy = MemoryMappedTensor.from_tensor(row)
    assert copy is not row and copy.filename != mapped.filename and copy.tolist() == [3, 4, 5]


def test_indexing_a_memory_mapped_tensordict_keeps_is_memmap(tmp_path):
    td = TensorDict({"a": torch.arange(12.0).view(3, 4), "n": {"b": torch.arange(3)}}, [3])
    mapped = td.memmap(tmp_path / "td")
    for index in (1, slice(0, 2), (Ellipsis,)):
        sub = mapped[index]
        assert sub.is_memmap()
        assert torch.equal(sub["a"], td["a"][index]) and torch.equal(
            sub["n", "b"], td["n", "b"][index]
        )
    saved = mapped[1:].memmap(tmp_path / "sub")  # a view is copied to the new directory
    assert saved["a"].filename.startswith(os.fspath(tmp_path / "sub"))
    assert torch.equal(saved["a"], td["a"][1:])
