"""Many small tensors of one level share one data file (each a view at its offset).

Compared with the tensors themselves (plain torch): every dtype and layout comes back
bit for bit, writes through a loaded view reach the file and only its own bytes, a
re-save replaces the shared file whole, and damaged offsets are clear errors.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from tdfunc import TensorDict
from tdfunc._persist.directory import wait_for_cleanup


def _leaves(n: int = 24) -> dict:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 5, generator=g)
    out = {
        "bool": torch.rand(7, generator=g) > 0.5,
        "half": torch.randn(3, generator=g).half(),
        "bf16": torch.randn(5, generator=g).bfloat16(),
        "cplx": torch.randn(3, dtype=torch.complex64, generator=g),
        "conj": torch.randn(2, dtype=torch.complex64, generator=g).conj(),
        "neg": torch.randn(4, generator=g)._neg_view(),
        "int8": torch.randint(-100, 100, (9,), dtype=torch.int8, generator=g),
        "f64": torch.randn(2, 2, dtype=torch.float64, generator=g),
        "scalar": torch.tensor(3.5),
        "transposed": base.t(),
        "expanded": torch.arange(3.0).expand(4, 3),
        "sliced": base[::2, 1:],
    }
    for i in range(n - len(out)):
        out[f"w{i}"] = torch.randn(i + 1, generator=g)
    return out


def _files(path) -> list[str]:
    return sorted(n for n in os.listdir(path) if n.endswith(".memmap"))


def test_small_leaves_share_one_file_and_come_back_exactly(tmp_path):
    leaves = _leaves()
    saved = TensorDict(leaves, []).memmap(tmp_path / "ck")
    assert len(_files(tmp_path / "ck")) == 1
    meta = json.loads((tmp_path / "ck" / "meta.json").read_text())
    assert meta["version"] == 3
    assert len({e["offset"] for e in meta["entries"].values()}) == len(leaves)
    for loaded in (saved, TensorDict.load_memmap(tmp_path / "ck")):
        for key, value in leaves.items():
            expected = value.resolve_conj().resolve_neg()
            assert loaded[key].dtype == value.dtype and loaded[key].shape == value.shape
            assert torch.equal(loaded[key], expected), key
            assert type(loaded[key]).__name__ == "MemoryMappedTensor"


def test_a_few_small_leaves_keep_a_file_each(tmp_path):
    TensorDict({f"k{i}": torch.ones(2) for i in range(5)}, []).memmap(tmp_path / "ck")
    assert _files(tmp_path / "ck") == [f"k{i}.memmap" for i in range(5)]
    assert json.loads((tmp_path / "ck" / "meta.json").read_text())["version"] == 2


def test_writes_reach_only_their_own_bytes(tmp_path):
    leaves = _leaves()
    TensorDict(leaves, []).memmap(tmp_path / "ck")
    loaded = TensorDict.load_memmap(tmp_path / "ck")
    loaded["w3"].fill_(7.0)
    loaded["bool"][0] = not bool(leaves["bool"][0])
    again = TensorDict.load_memmap(tmp_path / "ck")
    assert torch.equal(again["w3"], torch.full_like(leaves["w3"], 7.0))
    assert bool(again["bool"][0]) != bool(leaves["bool"][0])
    assert torch.equal(again["bool"][1:], leaves["bool"][1:])
    for key in ("w2", "w4", "half", "int8", "scalar"):
        assert torch.equal(again[key], leaves[key]), key


def test_resaving_a_loaded_checkpoint_replaces_the_shared_file(tmp_path):
    leaves = _leaves()
    TensorDict(leaves, []).memmap(tmp_path / "ck")
    first = TensorDict.load_memmap(tmp_path / "ck")
    (first.apply(lambda t: t * 0 if t.dtype.is_floating_point else t)).memmap(tmp_path / "ck")
    wait_for_cleanup()
    assert len(_files(tmp_path / "ck")) == 1
    assert torch.equal(first["w5"], leaves["w5"])  # the old mapping keeps its values
    again = TensorDict.load_memmap(tmp_path / "ck")
    assert torch.equal(again["w5"], torch.zeros_like(leaves["w5"]))
    assert torch.equal(again["int8"], leaves["int8"])


def test_in_place_save_and_refresh(tmp_path):
    leaves = _leaves()
    td = TensorDict({k: v.clone() for k, v in leaves.items()}, [])
    assert td.memmap_(tmp_path / "ck") is td
    td["w1"].add_(1)
    loaded = TensorDict.load_memmap(tmp_path / "ck")
    assert torch.equal(loaded["w1"], leaves["w1"] + 1)


@pytest.mark.parametrize(
    "offset, message",
    [(3, "is not a multiple of 64"), (-64, "is not a multiple of 64"), ("0", "offset")],
)
def test_bad_offsets_are_refused(tmp_path, offset, message):
    TensorDict(_leaves(), []).memmap(tmp_path / "ck")
    path = tmp_path / "ck" / "meta.json"
    meta = json.loads(path.read_text())
    meta["entries"]["w0"]["offset"] = offset
    path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=message):
        TensorDict.load_memmap(tmp_path / "ck")


def test_an_offset_past_the_end_of_the_file_is_refused(tmp_path):
    TensorDict(_leaves(), []).memmap(tmp_path / "ck")
    path = tmp_path / "ck" / "meta.json"
    meta = json.loads(path.read_text())
    meta["entries"]["w0"]["offset"] = 64 * 10_000
    path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"holds \d+ bytes, but its metadata needs 640004"):
        TensorDict.load_memmap(tmp_path / "ck")


def test_overlapping_tensors_in_a_shared_file_are_refused(tmp_path):
    TensorDict(_leaves(), []).memmap(tmp_path / "ck")
    path = tmp_path / "ck" / "meta.json"
    meta = json.loads(path.read_text())
    meta["entries"]["w5"]["offset"] = meta["entries"]["w4"]["offset"]
    path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"the bytes of keys '(w4|w5)' and '(w4|w5)' overlap"):
        TensorDict.load_memmap(tmp_path / "ck")
