"""``from_schema``: zero-filled containers preallocated from ``{key: (shape, dtype)}``."""

from __future__ import annotations

import pytest
import torch

from tdfunc import MemoryMappedTensor, TensorClass, TensorDict

SCHEMA = {
    "obs": ([3, 2], torch.uint8),
    "reward": ([], torch.float32),
    ("next", "done"): ([1], torch.bool),
}


def _reference(batch_size: list) -> dict:
    """The entries as plain zero tensors, keyed by path."""
    return {
        (key if isinstance(key, tuple) else (key,)): torch.zeros((*batch_size, *shape), dtype=dtype)
        for key, (shape, dtype) in SCHEMA.items()
    }


def _check(td, batch_size: list) -> None:
    assert td.batch_size == torch.Size(batch_size)
    reference = _reference(batch_size)
    leaves = {(k if isinstance(k, tuple) else (k,)): v for k, v in td.items(True, True)}
    assert leaves.keys() == reference.keys()
    for key, expected in reference.items():
        assert leaves[key].dtype == expected.dtype
        assert torch.equal(leaves[key], expected), key


@pytest.mark.parametrize("batch_size", [[], [0], [5], [2, 3]])
def test_plain_storage(batch_size):
    td = TensorDict.from_schema(SCHEMA, batch_size=batch_size)
    _check(td, batch_size)
    assert not td.is_locked


def test_memmap_storage_is_sparse_and_write_through(tmp_path):
    td = TensorDict.from_schema(SCHEMA, batch_size=[1000], storage="memmap", prefix=tmp_path)
    _check(td, [1000])
    assert td.is_memmap() and isinstance(td["obs"], MemoryMappedTensor)
    td[3] = TensorDict(
        {"obs": torch.ones(3, 2, dtype=torch.uint8), "reward": 1.5, ("next", "done"): [True]},
        [],
    )
    loaded = TensorDict.load_memmap(tmp_path)
    expected = torch.zeros(1000)
    expected[3] = 1.5
    assert torch.equal(loaded["reward"], expected)
    assert loaded["next", "done"].sum().item() == 1
    # preallocation writes no data: the files hold (almost) no blocks on disk
    path = tmp_path / "obs.memmap"
    assert path.exists()
    if hasattr(path.stat(), "st_blocks"):
        assert path.stat().st_blocks * 512 < 1000 * 6


def test_memmap_storage_forwards_memmap_like_arguments(tmp_path):
    TensorDict.from_schema(SCHEMA, batch_size=[2], storage="memmap", prefix=tmp_path)
    again = TensorDict.from_schema(
        SCHEMA, batch_size=[2], storage="memmap", prefix=tmp_path, existsok=True
    )
    _check(again, [2])


def test_shared_storage():
    td = TensorDict.from_schema(SCHEMA, batch_size=[4], storage="shared")
    _check(td, [4])
    assert td.is_shared() and td.is_locked


def test_on_a_tensorclass():
    class Transition(TensorClass):
        obs: torch.Tensor
        reward: torch.Tensor

    tc = Transition.from_schema(
        {"obs": ([4], torch.float32), "reward": ([], torch.float64)}, batch_size=[7]
    )
    assert isinstance(tc, Transition) and tc.batch_size == torch.Size([7])
    assert torch.equal(tc.obs, torch.zeros(7, 4)) and tc.reward.dtype == torch.float64


def test_errors():
    with pytest.raises(TypeError, match=r"from_schema: the schema entry 'a' must be"):
        TensorDict.from_schema({"a": torch.float32})
    with pytest.raises(TypeError, match=r"must be a torch\.dtype"):
        TensorDict.from_schema({"a": ([2], "float32")})
    with pytest.raises(NotImplementedError, match="not part of tdfunc"):
        TensorDict.from_schema({"a": ([2], torch.float32)}, storage="h5", filename="x.h5")
    with pytest.raises(ValueError, match="unknown storage 'nope'"):
        TensorDict.from_schema({"a": ([2], torch.float32)}, storage="nope")
    with pytest.raises(TypeError, match="takes no other keyword arguments"):
        TensorDict.from_schema({"a": ([2], torch.float32)}, prefix="/tmp/x")
    with pytest.raises(ValueError, match="lives on the CPU"):
        TensorDict.from_schema({"a": ([2], torch.float32)}, storage="memmap", device="meta")
