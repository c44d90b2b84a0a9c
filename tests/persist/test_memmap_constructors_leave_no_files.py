"""``MemoryMappedTensor`` constructors: exact values, clear errors, no file left on failure."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from tdfunc import MemoryMappedTensor


def _files(directory) -> list[str]:
    return sorted(os.listdir(directory))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64])
def test_full_keeps_the_sign_of_negative_zero(tmp_path, dtype):
    out = MemoryMappedTensor.full(3, fill_value=-0.0, dtype=dtype, filename=tmp_path / "x")
    expected = torch.full((3,), -0.0, dtype=dtype)
    assert out.view(torch.uint8).tolist() == expected.view(torch.uint8).tolist()
    on_disk = np.fromfile(tmp_path / "x", dtype=np.uint8)
    assert on_disk.tolist() == expected.view(torch.uint8).tolist()


@pytest.mark.parametrize("fill_value", [0, 0.0, 7, -1.5, True])
def test_full_matches_torch_full(tmp_path, fill_value):
    out = MemoryMappedTensor.full((2, 3), fill_value=fill_value, filename=tmp_path / "x")
    assert torch.equal(out, torch.full((2, 3), fill_value, dtype=torch.get_default_dtype()))


@pytest.mark.parametrize("shape", [(-1,), (-2, -2), (3, -1)])
@pytest.mark.parametrize("api", ["empty", "zeros", "ones"])
def test_negative_dims_are_a_value_error_before_any_file(tmp_path, shape, api):
    with pytest.raises(ValueError, match=r"negative dim; every dim must be >= 0"):
        getattr(MemoryMappedTensor, api)(shape=shape, filename=tmp_path / "x")
    assert _files(tmp_path) == []


def test_bad_fill_value_leaves_no_file(tmp_path):
    with pytest.raises(TypeError, match=r"MemoryMappedTensor.full: fill_value='x' cannot be"):
        MemoryMappedTensor.full(3, fill_value="x", filename=tmp_path / "x")
    assert _files(tmp_path) == []


def test_a_directory_as_filename_is_refused_and_leaves_nothing(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(IsADirectoryError, match="is a directory; pass the path of a file"):
        MemoryMappedTensor.zeros(4, filename=tmp_path / "d", existsok=True)
    assert _files(tmp_path) == ["d"] and _files(tmp_path / "d") == []


def test_a_failed_write_removes_its_temporary_file(tmp_path):
    class Exploding(torch.Tensor):  # fails while the file is being written
        pass

    source = torch.zeros(3).as_subclass(Exploding)
    source.__class__.numpy = lambda self: (_ for _ in ()).throw(OSError("disk gone"))
    with pytest.raises(OSError, match="disk gone"):
        MemoryMappedTensor.from_tensor(source, filename=tmp_path / "x")
    assert _files(tmp_path) == []


def test_from_storage_says_negative_dims_and_short_storages(tmp_path):
    storage = MemoryMappedTensor.zeros(4, filename=tmp_path / "x").untyped_storage()
    with pytest.raises(ValueError, match=r"the shape \[2, -1\] has a negative dim"):
        MemoryMappedTensor.from_storage(storage, torch.float32, (2, -1))
    with pytest.raises(ValueError, match=r"needs 32 bytes, but the storage holds 16"):
        MemoryMappedTensor.from_storage(storage, torch.float32, (2, 4))
    assert MemoryMappedTensor.from_storage(storage, torch.float32, (2, 2)).shape == (2, 2)


def test_from_tensor_with_an_incompatible_shape_leaves_no_file(tmp_path):
    with pytest.raises(ValueError, match=r"shape=\[4\] is not a broadcast of the input"):
        MemoryMappedTensor.from_tensor(torch.zeros(3), filename=tmp_path / "x", shape=(4,))
    assert _files(tmp_path) == []


def test_a_transposed_view_is_not_mistaken_for_its_whole_file(tmp_path):
    """Views keep the class; a save must still copy a transposed view, not reuse the file."""
    mapped = MemoryMappedTensor.from_tensor(torch.arange(9.0).view(3, 3), filename=tmp_path / "x")
    transposed = mapped.t()
    assert type(transposed) is MemoryMappedTensor and not transposed._is_whole_file()
    copy = MemoryMappedTensor.from_tensor(transposed, filename=tmp_path / "y")
    assert copy is not transposed and torch.equal(copy, torch.arange(9.0).view(3, 3).t())
