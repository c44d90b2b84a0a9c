"""Shared by the leafwise-math tests: nested containers of batch rank 0/1/2 and their
plain-tensor reference (``make``), and the leaf-by-leaf comparison (``assert_leafwise``).
"""

from __future__ import annotations

import torch

from tdfunc import TensorDict

BATCH = {0: [], 1: [3], 2: [3, 4]}
NAMES = {0: None, 1: ["x"], 2: ["x", "y"]}


def raw(rank: int, seed: int = 0, positive: bool = False) -> dict:
    """A nested dict of tensors whose leading dims are the batch of ``rank`` dims."""
    g = torch.Generator().manual_seed(seed)
    b = BATCH[rank]

    def t(*feature):
        shape = (*b, *feature)
        return torch.rand(shape, generator=g) if positive else torch.randn(shape, generator=g)

    return {"a": t(2), "b": t(), "n": {"c": t(5), "m": {"d": t(2, 3)}}}


def leaves(tree: dict, prefix: tuple = ()) -> dict:
    """``{key tuple: tensor}`` of a raw nested dict (no tdfunc involved)."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(leaves(value, prefix + (key,)))
        else:
            out[prefix + (key,)] = value
    return out


def make(rank: int, seed: int = 0, names: bool = False, lock: bool = False, positive=False):
    tree = raw(rank, seed, positive)
    td = TensorDict(tree, BATCH[rank], names=NAMES[rank] if names else None)
    if lock:
        td.lock_()
    return td, {k: v.clone() for k, v in leaves(tree).items()}  # unaffected by in-place ops


def assert_leafwise(result, expected: dict, batch_size) -> None:
    assert result.batch_size == torch.Size(batch_size)
    got = {k if isinstance(k, tuple) else (k,): v for k, v in result.items(True, True)}
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key].shape == value.shape, key
        torch.testing.assert_close(got[key], value, equal_nan=True)
    for _, nested in result.items(True):
        if isinstance(nested, TensorDict):  # every nested level carries the batch size
            assert nested.batch_size[: len(batch_size)] == torch.Size(batch_size)
