"""``make_memmap*`` (``_persist/make.py``): new mapped entries of a saved container, checked
against the tensors written and what ``load_memmap`` reads back."""

import pytest
import torch

from tdfunc import MemoryMappedTensor, TensorClass, TensorDict


class Pair(TensorClass):
    x: torch.Tensor = None
    y: torch.Tensor = None


def test_make_memmap_adds_mapped_entries_that_load_memmap_sees(tmp_path):
    td = TensorDict().memmap_(tmp_path)
    a = td.make_memmap("a", [3, 4], dtype=torch.float32)
    a.fill_(1.0)
    c = td.make_memmap(("b", "c"), [5, 6], dtype=torch.int64)
    c.fill_(2)
    assert isinstance(a, MemoryMappedTensor) and td["a"] is a
    assert td.is_memmap() and td.is_locked and td["b"].is_locked
    loaded = TensorDict.load_memmap(tmp_path)
    assert torch.equal(loaded["a"], torch.ones(3, 4))
    assert torch.equal(loaded["b", "c"], torch.full((5, 6), 2))
    with pytest.raises(RuntimeError, match="already exists"):
        td.make_memmap(("b", "c"), [5, 6])
    with pytest.raises(RuntimeError, match="memmap_"):
        TensorDict().make_memmap("a", [2])


def test_make_memmap_from_tensor_copies(tmp_path):
    td = TensorDict().memmap_(tmp_path)
    source = torch.arange(6.0).view(2, 3)
    out = td.make_memmap_from_tensor(("n", "v"), source)
    assert torch.equal(out, source) and out.data_ptr() != source.data_ptr()
    source.zero_()
    assert torch.equal(TensorDict.load_memmap(tmp_path)["n", "v"], torch.arange(6.0).view(2, 3))


def test_make_memmap_from_storage_reads_the_storage(tmp_path):
    td = TensorDict().memmap_(tmp_path / "td")
    storage = torch.arange(6, dtype=torch.int32).untyped_storage()
    out = td.make_memmap_from_storage("s", storage, [3, 2], dtype=torch.int32)
    assert torch.equal(out, torch.arange(6, dtype=torch.int32).view(3, 2))
    elsewhere = MemoryMappedTensor.ones([2], filename=tmp_path / "elsewhere.memmap")
    with pytest.raises(RuntimeError, match="associated filename"):
        td.make_memmap_from_storage("e", elsewhere.untyped_storage(), [2], dtype=torch.float32)
    assert "e" not in td


def test_make_memmap_on_a_tensorclass(tmp_path):
    pair = Pair(x=torch.zeros(2), batch_size=[2]).memmap_(tmp_path)
    pair.make_memmap("y", [2]).fill_(3.0)
    assert torch.equal(pair.y, torch.full((2,), 3.0))
    assert torch.equal(Pair.load_memmap(tmp_path).y, torch.full((2,), 3.0))
