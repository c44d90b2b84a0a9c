"""Nested tensors (strided and jagged) memory-mapped (``_persist/nested.py``), checked
against the components of the plain nested tensor they were saved from."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tdfunc import TensorClass, TensorDict

# torch warns that strided nested tensors are a prototype
pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")


def _strided() -> torch.Tensor:
    return torch.nested.nested_tensor(
        [torch.arange(12.0).view(3, 4), -torch.arange(18.0).view(3, 6)]
    )


def _jagged() -> torch.Tensor:
    rows = [torch.arange(20.0).view(4, 5), torch.arange(30.0).view(6, 5)]
    return torch.nested.nested_tensor(rows, layout=torch.jagged)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    assert a.is_nested and a.layout == b.layout
    pairs = zip(a.unbind(), b.unbind(), strict=True)
    return all(x.shape == y.shape and torch.equal(x, y) for x, y in pairs)


@pytest.mark.parametrize("make", [_strided, _jagged])
def test_round_trip_is_memory_mapped_and_writes_reach_the_file(tmp_path, make):
    nt = make()
    td = TensorDict({"n": nt, "s": {"n": nt * 2}, "d": torch.zeros(2)}, [2])
    saved = td.memmap(tmp_path)
    assert saved.is_memmap()
    loaded = TensorDict.load_memmap(tmp_path)
    assert loaded.is_memmap()
    assert _same(loaded["n"], nt) and _same(loaded["s", "n"], nt * 2)
    loaded["n"].unbind()[1].fill_(7.0)  # a view of the mapped file
    again = TensorDict.load_memmap(tmp_path)
    assert torch.equal(again["n"].unbind()[1], torch.full_like(nt.unbind()[1], 7.0))
    assert torch.equal(again["n"].unbind()[0], nt.unbind()[0])


def test_the_entry_records_layout_and_component_shapes(tmp_path):
    TensorDict({"n": _strided(), "j": _jagged()}, [2]).memmap(tmp_path)
    with open(os.path.join(tmp_path, "meta.json")) as f:
        entries = json.load(f)["entries"]
    assert entries["n"]["kind"] == "nested" and entries["n"]["layout"] == "strided"
    assert entries["n"]["sizes"] == [[3, 4], [3, 6]]
    assert entries["j"]["layout"] == "jagged" and entries["j"]["sizes"] == [[4, 5], [6, 5]]
    assert os.path.getsize(os.path.join(tmp_path, entries["n"]["file"])) == (12 + 18) * 4


def test_a_ragged_batch_round_trips(tmp_path):
    nt = _strided()
    TensorDict({"n": nt, "t": "text"}, [2, 3, -1]).memmap(tmp_path)
    loaded = TensorDict.load_memmap(tmp_path)
    assert loaded.batch_size == torch.Size([2, 3, -1]) and loaded["t"] == "text"
    padded = loaded.to_padded_tensor(padding=-1.0)
    assert torch.equal(padded["n"], torch.nested.to_padded_tensor(nt, -1.0))


def test_make_memmap_with_a_tensor_of_shapes(tmp_path):
    td = TensorDict().memmap_(tmp_path)
    made = td.make_memmap(("e", "f"), torch.tensor([[1, 2], [1, 3]]), dtype=torch.float64)
    assert made.is_nested and made.dtype == torch.float64
    assert [c.shape for c in made.unbind()] == [torch.Size([1, 2]), torch.Size([1, 3])]
    td.make_memmap("other", [2])  # saving again keeps the file the first handle maps
    made.unbind()[1].fill_(5.0)
    loaded = TensorDict.load_memmap(tmp_path)
    assert loaded["e", "f"].is_nested and td.is_memmap()
    assert torch.equal(loaded["e", "f"].unbind()[1], torch.full((1, 3), 5.0, dtype=torch.float64))
    with pytest.raises(ValueError, match="2-d integer tensor"):
        td.make_memmap("bad", torch.tensor([1.0, 2.0]))


@pytest.mark.parametrize("make", [_strided, _jagged])
def test_make_memmap_from_a_nested_tensor(tmp_path, make):
    td = TensorDict().memmap_(tmp_path)
    nt = make()
    copy = td.make_memmap_from_tensor("n", nt)
    assert _same(copy, nt) and td.is_memmap()
    copy.unbind()[0].zero_()  # a copy: the source is untouched
    assert not _same(copy, nt)
    assert _same(TensorDict.load_memmap(tmp_path)["n"], copy)


def test_memmap_like_allocates_zeros_of_the_component_shapes(tmp_path):
    like = TensorDict({"n": _strided()}, [2]).memmap_like(tmp_path)
    parts = like["n"].unbind()
    assert [p.shape for p in parts] == [torch.Size([3, 4]), torch.Size([3, 6])]
    assert all((p == 0).all() for p in parts)


def test_a_tensorclass_field(tmp_path):
    class Seq(TensorClass):
        x: torch.Tensor

    nt = _jagged()
    Seq(x=nt, batch_size=[2]).memmap(tmp_path)
    loaded = Seq.load_memmap(tmp_path)
    assert type(loaded) is Seq and _same(loaded.x, nt)


def test_what_cannot_be_stored_is_a_clear_error(tmp_path):
    holes = torch.nested.narrow(
        torch.arange(12.0).view(3, 4),
        1,
        torch.tensor([0, 1, 0]),
        torch.tensor([2, 2, 3]),
        torch.jagged,
    )
    with pytest.raises(TypeError, match="only a jagged tensor whose ragged dim follows"):
        TensorDict({"h": holes}, [3]).memmap(tmp_path / "a")
    with pytest.raises(TypeError, match="tensordict's layout"):
        TensorDict({"n": _strided()}, [2]).memmap(tmp_path / "b", format="tensordict")
    TensorDict({"n": _strided()}, [2]).memmap(tmp_path / "c")
    with pytest.raises(NotImplementedError, match="meta device"):
        TensorDict.load_memmap(tmp_path / "c", device="meta")


def test_corrupt_nested_metadata_is_refused(tmp_path):
    TensorDict({"n": _strided()}, [2]).memmap(tmp_path)
    path = os.path.join(tmp_path, "meta.json")
    with open(path) as f:
        meta = json.load(f)
    for sizes in ([[3, 4], [3]], [], [[3, 4], [3, -6]], "x"):
        meta["entries"]["n"]["sizes"] = sizes
        with open(path, "w") as f:
            json.dump(meta, f)
        with pytest.raises(ValueError, match="'sizes'"):
            TensorDict.load_memmap(tmp_path)
