"""MemoryMappedTensor: file-backed tensors, checked against the bytes in the file."""

from __future__ import annotations

import copy
import io
import os
import pickle
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch

from tdfunc import MemoryMappedTensor, TensorDict

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.complex64,
    torch.float8_e4m3fn,
]


def _random(shape, dtype):
    generator = torch.Generator().manual_seed(0)
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=generator)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(dtype)
    return torch.randint(-100 if dtype.is_signed else 0, 100, shape, generator=generator).to(dtype)


def _file_bytes(path) -> bytes:
    with open(path, "rb") as file:
        return file.read()


def _plain_bytes(tensor: torch.Tensor) -> bytes:
    """The reference: the C-contiguous bytes of the tensor, computed through numpy."""
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_from_tensor_writes_exact_bytes_and_reads_back(tmp_path, dtype):
    source = _random((4, 5), dtype)
    path = tmp_path / "x.memmap"
    mapped = MemoryMappedTensor.from_tensor(source, filename=path)
    assert _file_bytes(path) == _plain_bytes(source)
    assert mapped.filename == str(path)
    assert mapped.dtype == dtype and mapped.shape == source.shape
    reopened = MemoryMappedTensor.from_filename(path, dtype, (4, 5))
    assert _plain_bytes(reopened) == _plain_bytes(source)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.arange(12.0).view(3, 4).t(),  # transposed
        lambda: torch.arange(4.0).view(4, 1).expand(4, 6),  # broadcast
        lambda: torch.arange(24.0).view(4, 6)[:, ::2],  # strided
        lambda: torch.arange(6.0, requires_grad=True) * 2,  # needs grad
        lambda: torch.randn(3, dtype=torch.complex64).conj(),  # conjugate bit
    ],
    ids=["transposed", "expanded", "strided", "grad", "conj"],
)
def test_from_tensor_non_contiguous_sources(tmp_path, make):
    source = make()
    mapped = MemoryMappedTensor.from_tensor(source, filename=tmp_path / "x.memmap")
    expected = source.detach().resolve_conj().contiguous()
    assert _file_bytes(tmp_path / "x.memmap") == _plain_bytes(expected)
    assert torch.equal(mapped.as_subclass(torch.Tensor), expected)


def test_writes_reach_the_file_and_indexing_gives_memory_mapped_views(tmp_path):
    path = tmp_path / "x.memmap"
    mapped = MemoryMappedTensor.from_tensor(torch.zeros(4, 3), filename=path)
    row = mapped[1]
    assert type(row) is MemoryMappedTensor and row.filename == mapped.filename  # tensordict
    row.fill_(7.0)  # a view of the mapping: the write reaches the file
    mapped[3, 2] = 5.0
    on_disk = np.fromfile(path, dtype=np.float32).reshape(4, 3)
    expected = np.zeros((4, 3), dtype=np.float32)
    expected[1] = 7.0
    expected[3, 2] = 5.0
    np.testing.assert_array_equal(on_disk, expected)
    picked = mapped[torch.tensor([3, 1])]  # advanced indexing: a copy of the touched rows
    assert type(picked) is torch.Tensor
    np.testing.assert_array_equal(picked.numpy(), expected[[3, 1]])


def test_operations_return_plain_tensors(tmp_path):
    data = torch.randn(3, 4)
    mapped = MemoryMappedTensor.from_tensor(data, filename=tmp_path / "x.memmap")
    weight = torch.randn(2, 4)
    assert torch.equal(torch.nn.functional.linear(mapped, weight), data @ weight.T)
    for result in (mapped + 1, mapped.sum(0), mapped.clone(), torch.stack([mapped, mapped])):
        assert type(result) is torch.Tensor
    assert torch.equal(torch.stack([mapped, mapped]), torch.stack([data, data]))
    assert mapped.add_(1) is mapped
    assert torch.equal(mapped.as_subclass(torch.Tensor), data + 1)


def test_empty_is_sparse_and_reads_zeros(tmp_path):
    path = tmp_path / "big.memmap"
    mapped = MemoryMappedTensor.empty(1024, 1024, 64, dtype=torch.uint8, filename=path)
    stat = os.stat(path)
    assert stat.st_size == 64 * 2**20
    assert stat.st_blocks * 512 < 2**20  # allocated without writing
    assert int(mapped[100:110].sum()) == 0
    assert int(MemoryMappedTensor.zeros(3, dtype=torch.int64).sum()) == 0
    ones = MemoryMappedTensor.ones(2, 3, dtype=torch.int32)
    assert ones.tolist() == [[1, 1, 1], [1, 1, 1]]
    full = MemoryMappedTensor.full_like(torch.zeros(2), 2.5)
    assert full.tolist() == [2.5, 2.5]
    like = MemoryMappedTensor.empty_like(torch.zeros(5, 2, dtype=torch.float64))
    assert like.shape == (5, 2) and like.dtype == torch.float64


def test_zero_element_tensors(tmp_path):
    path = tmp_path / "empty.memmap"
    mapped = MemoryMappedTensor.from_tensor(torch.zeros(0, 3), filename=path)
    assert mapped.shape == (0, 3) and os.path.getsize(path) == 0
    assert MemoryMappedTensor.from_filename(path, torch.float32, (0, 3)).shape == (0, 3)


def test_from_filename_short_file_is_an_error_not_a_crash(tmp_path):
    path = tmp_path / "short.memmap"
    path.write_bytes(b"\0" * 10)
    with pytest.raises(ValueError, match=r"10 bytes.*needs 16 bytes"):
        MemoryMappedTensor.from_filename(path, torch.float32, (4,))
    assert os.path.getsize(path) == 10  # torch.from_file would have grown it
    # a longer file maps its beginning
    path.write_bytes(np.arange(6, dtype=np.float32).tobytes())
    assert MemoryMappedTensor.from_filename(path, torch.float32, (4,)).tolist() == [0, 1, 2, 3]


def test_existsok_replaces_atomically_and_old_mappings_keep_content(tmp_path):
    path = tmp_path / "x.memmap"
    old = MemoryMappedTensor.from_tensor(torch.zeros(3), filename=path)
    with pytest.raises(FileExistsError, match="existsok=True"):
        MemoryMappedTensor.from_tensor(torch.ones(3), filename=path)
    new = MemoryMappedTensor.from_tensor(torch.ones(3), filename=path, existsok=True)
    assert old.tolist() == [0, 0, 0] and new.tolist() == [1, 1, 1]
    assert np.fromfile(path, dtype=np.float32).tolist() == [1, 1, 1]
    assert [p.name for p in tmp_path.iterdir()] == ["x.memmap"]


def test_existing_memmap_reuse_and_copy_rules(tmp_path):
    first = MemoryMappedTensor.from_tensor(torch.arange(3.0), filename=tmp_path / "a.memmap")
    assert MemoryMappedTensor.from_tensor(first) is first
    assert MemoryMappedTensor.from_tensor(first, filename=tmp_path / "a.memmap") is first
    with pytest.raises(RuntimeError, match="copy_existing=True"):
        MemoryMappedTensor.from_tensor(first, filename=tmp_path / "b.memmap")
    copied = MemoryMappedTensor.from_tensor(
        first, filename=tmp_path / "b.memmap", copy_existing=True
    )
    assert copied.filename != first.filename and copied.tolist() == [0, 1, 2]


def test_constructor_type_errors_are_clear():
    with pytest.raises(TypeError, match="from_tensor"):
        MemoryMappedTensor(3.0)
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        MemoryMappedTensor.from_tensor(np.zeros(2))
    with pytest.raises(TypeError, match=r"torch\.dtype"):
        MemoryMappedTensor.from_filename("x", "float32", (2,))


def test_pickle_and_torch_save_store_values_as_plain_tensors(tmp_path):
    mapped = MemoryMappedTensor.from_tensor(torch.arange(4.0), filename=tmp_path / "x.memmap")
    for clone in (pickle.loads(pickle.dumps(mapped)), copy.deepcopy(mapped)):
        assert type(clone) is torch.Tensor and clone.tolist() == [0, 1, 2, 3]
        clone[0] = 9
        assert mapped[0] == 0
    buffer = io.BytesIO()
    torch.save(mapped, buffer)
    loaded = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    assert type(loaded) is torch.Tensor and loaded.tolist() == [0, 1, 2, 3]


def test_processes_share_the_file(tmp_path):
    """multiprocessing sends the file name: the receiver maps the same file."""
    mapped = MemoryMappedTensor.from_tensor(torch.zeros(3), filename=tmp_path / "x.memmap")
    received = pickle.loads(bytes(ForkingPickler.dumps(mapped)))
    assert type(received) is MemoryMappedTensor and received.filename == mapped.filename
    received[1] = 4.0
    assert mapped.tolist() == [0, 4, 0]


def test_temporary_files_without_filename():
    mapped = MemoryMappedTensor.from_tensor(torch.arange(3))
    assert os.path.exists(mapped.filename)
    assert np.fromfile(mapped.filename, dtype=np.int64).tolist() == [0, 1, 2]


def test_an_existing_file_is_also_a_runtime_error(tmp_path):
    # tensordict raises RuntimeError here; FileExistsError stays the primary type
    path = tmp_path / "x.memmap"
    path.write_bytes(b"")
    for make in (
        lambda: MemoryMappedTensor.from_tensor(torch.zeros(3), filename=path),
        lambda: MemoryMappedTensor.empty((3,), filename=path),
        lambda: MemoryMappedTensor.zeros((3,), filename=path),
        lambda: MemoryMappedTensor.ones_like(torch.zeros(3), filename=path),
    ):
        with pytest.raises(RuntimeError, match="existsok"):
            make()
        with pytest.raises(FileExistsError):
            make()
    assert path.read_bytes() == b""  # nothing was written
    saved = tmp_path / "saved"
    TensorDict({"a": torch.zeros(2)}, [2]).memmap(saved)
    with pytest.raises(RuntimeError, match="existsok"):
        TensorDict({"a": torch.zeros(2)}, [2]).memmap(saved, existsok=False)
