"""``MemoryMappedTensor`` as a nested tensor: a 2-D integer tensor as the shape (one row
per component) gives a nested tensor whose components lie back to back in one file.

Every result is compared with the plain components (``torch.zeros(size)``, ...) it
stands for, and with the bytes of the file read back without tdfunc.
"""

from __future__ import annotations

import math
import warnings
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch

from tdfunc import MemoryMappedTensor

SIZES = [[2, 3], [2, 4], [3, 2]]
SHAPE = torch.tensor(SIZES)

pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")


def _components(sizes, start=0.0, dtype=torch.float32):
    return [torch.full(size, start + i, dtype=dtype) for i, size in enumerate(sizes)]


def _file_values(path, dtype=np.float32):
    return np.fromfile(path, dtype=dtype)


def _assert_components(tensor, expected):
    assert type(tensor) is MemoryMappedTensor and tensor.is_nested
    parts = tensor.unbind(0)
    assert len(parts) == len(expected)
    for part, want in zip(parts, expected):
        assert part.shape == want.shape and part.dtype == want.dtype
        assert torch.equal(part.as_subclass(torch.Tensor), want)


@pytest.mark.parametrize("make", ["empty", "zeros"])
def test_empty_and_zeros_give_zero_components(make, tmp_path):
    path = tmp_path / "x.memmap"
    tensor = getattr(MemoryMappedTensor, make)(SHAPE, dtype=torch.int32, filename=path)
    _assert_components(tensor, [torch.zeros(s, dtype=torch.int32) for s in SIZES])
    assert torch.equal(tensor._nested_tensor_size(), SHAPE)
    assert path.stat().st_size == sum(math.prod(s) for s in SIZES) * 4


def test_ones_and_full(tmp_path):
    ones = MemoryMappedTensor.ones(SHAPE, dtype=torch.int64)
    _assert_components(ones, [torch.ones(s, dtype=torch.int64) for s in SIZES])
    full = MemoryMappedTensor.full(shape=SHAPE, fill_value=-0.5)
    _assert_components(full, [torch.full(s, -0.5) for s in SIZES])


def test_writes_reach_the_file_in_component_order(tmp_path):
    path = tmp_path / "x.memmap"
    tensor = MemoryMappedTensor.empty(SHAPE, filename=path)
    tensor.fill_(2.0)
    tensor[1].copy_(torch.arange(8.0).view(2, 4))
    expected = torch.cat([c.reshape(-1) for c in [torch.full((2, 3), 2.0),
                                                  torch.arange(8.0).view(2, 4),
                                                  torch.full((3, 2), 2.0)]])  # fmt: skip
    np.testing.assert_array_equal(_file_values(path), expected.numpy())


def test_from_tensor_then_from_filename_round_trip(tmp_path):
    nested = torch.nested.nested_tensor(_components(SIZES))
    path = tmp_path / "x.memmap"
    stored = MemoryMappedTensor.from_tensor(nested, filename=path)
    _assert_components(stored, _components(SIZES))
    flat = torch.cat([c.reshape(-1) for c in _components(SIZES)])
    np.testing.assert_array_equal(_file_values(path), flat.numpy())
    again = MemoryMappedTensor.from_filename(path, dtype=torch.float32, shape=SHAPE)
    _assert_components(again, _components(SIZES))
    assert MemoryMappedTensor.from_tensor(stored) is stored  # already the whole file


def test_from_tensor_of_a_jagged_tensor_keeps_the_components():
    parts = [torch.arange(6.0).view(2, 3), torch.arange(9.0).view(3, 3)]
    jagged = torch.nested.nested_tensor(parts, layout=torch.jagged)
    _assert_components(MemoryMappedTensor.from_tensor(jagged), parts)


def test_from_tensor_refuses_other_component_shapes():
    nested = torch.nested.nested_tensor(_components(SIZES))
    with pytest.raises(ValueError, match="component shapes"):
        MemoryMappedTensor.from_tensor(nested, shape=torch.tensor([[1, 1], [1, 1], [1, 1]]))


@pytest.mark.parametrize("with_filename", [False, True])
def test_from_storage_cuts_the_storage_into_components(with_filename, tmp_path):
    filename = str(tmp_path / "x.memmap") if with_filename else None
    flat = MemoryMappedTensor.from_tensor(torch.arange(10, dtype=torch.float64), filename=filename)
    shape = torch.tensor([[2, 2], [2, 3]])
    out = MemoryMappedTensor.from_storage(
        flat.untyped_storage(), filename=filename, shape=shape, dtype=flat.dtype
    )
    _assert_components(out, [torch.arange(4.0).view(2, 2).double(),
                             torch.arange(4.0, 10.0).view(2, 3).double()])  # fmt: skip
    out[0].zero_()  # the same memory
    assert flat[:4].tolist() == [0.0] * 4


def test_like_constructors_take_the_component_shapes():
    nested = torch.nested.nested_tensor(_components(SIZES, dtype=torch.float64))
    _assert_components(
        MemoryMappedTensor.ones_like(nested), [torch.ones(s, dtype=torch.float64) for s in SIZES]
    )


def test_sent_to_another_process_maps_the_same_components():
    tensor = MemoryMappedTensor.from_tensor(torch.nested.nested_tensor(_components(SIZES)))
    received = ForkingPickler.loads(ForkingPickler.dumps(tensor))
    _assert_components(received, _components(SIZES))
    received[2].fill_(7.0)  # the same file
    assert torch.equal(tensor[2].as_subclass(torch.Tensor), torch.full((3, 2), 7.0))


@pytest.mark.parametrize(
    ("shape", "error"),
    [
        (torch.tensor([2, 3]), TypeError),  # 1-D: not one row per component
        (torch.tensor([[2.0, 3.0]]), TypeError),  # not integers
        (torch.tensor([[2, -1]]), ValueError),
    ],
)
def test_bad_component_shapes_are_clear_errors(shape, error, tmp_path):
    with pytest.raises(error, match=r"MemoryMappedTensor\.empty"):
        MemoryMappedTensor.empty(shape, filename=tmp_path / "x.memmap")
    assert not list(tmp_path.iterdir())  # no file left behind


def test_values_as_source_are_copied_like_torch_as_tensor():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = MemoryMappedTensor([3, 4])
    reference = torch.as_tensor([3, 4])
    assert type(out) is MemoryMappedTensor and out.dtype == reference.dtype
    assert out.tolist() == reference.tolist()
    assert MemoryMappedTensor(np.ones((2, 2), dtype=np.float32)).tolist() == [[1.0, 1.0]] * 2
    with pytest.raises(ValueError, match="CPU"):
        MemoryMappedTensor([3, 4], device="meta")
