"""Random containers for the differential tests of the hot paths (no test here).

:func:`random_tree` builds a TensorDict of 1 to 100 leaves, 1 to 4 levels deep,
batch rank 0 to 3, whose nested levels may carry extra batch dims, be locked, hold
non-tensor leaves, a TensorClass, non-contiguous or grad-tracking leaves, and have
named dims. :func:`assert_same` compares two results as deeply as users can tell
them apart: classes, batch sizes, names, lock state, devices, keys, and every leaf's
values, dtype, shape, strides, ``requires_grad`` and ``grad_fn`` class.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from tdfunc import NonTensorData, TensorClass, TensorDict


class HotPair(TensorClass):
    """A TensorClass level inside the random trees."""

    x: torch.Tensor
    label: str = "p"


SIZES = (1, 3, 10, 100)


def random_tree(rng: random.Random, leaves: int | None = None, rank: int | None = None) -> Any:
    """A random TensorDict (see the module docstring); ``leaves`` and ``rank`` as given."""
    leaves = rng.choice(SIZES) if leaves is None else leaves
    rank = rng.randint(0, 3) if rank is None else rank
    batch = tuple(rng.randint(1, 4) for _ in range(rank))
    depth = rng.randint(1, 4)
    names = [f"d{i}" for i in range(rank)] if rank and rng.random() < 0.2 else None
    counter = iter(range(10**6))
    td = _level(rng, batch, depth, leaves, counter)
    if names is not None:
        td.names = names
    return td


def _level(rng: random.Random, batch: tuple, depth: int, leaves: int, counter) -> TensorDict:
    data: dict = {}
    size = list(batch)
    while leaves > 0:
        key = f"k{next(counter)}"
        roll = rng.random()
        if depth > 1 and roll < 0.25 and leaves > 1:
            share = rng.randint(1, leaves - 1) if leaves > 2 else 1
            extra = (rng.randint(1, 3),) if rng.random() < 0.3 else ()
            inner = _level(rng, batch + extra, depth - 1, share, counter)
            if rng.random() < 0.15:
                inner.lock_()
            data[key] = inner
            leaves -= share
            continue
        leaves -= 1
        if roll < 0.3:
            data[key] = _tensor(rng, batch)
        elif roll < 0.35:
            data[key] = f"text{rng.randint(0, 9)}"
        elif roll < 0.4 and batch:
            data[key] = HotPair(x=_tensor(rng, batch), batch_size=list(batch))
        else:
            data[key] = _tensor(rng, batch)
    return TensorDict(data, size)


def _tensor(rng: random.Random, batch: tuple) -> torch.Tensor:
    feature = tuple(rng.randint(1, 3) for _ in range(rng.randint(0, 2)))
    generator = torch.Generator().manual_seed(rng.randint(0, 2**31))
    value = torch.randn((*batch, *feature), generator=generator)
    roll = rng.random()
    if roll < 0.15 and value.dim() >= 2:  # non-contiguous
        value = value.transpose(0, value.dim() - 1).contiguous().transpose(0, value.dim() - 1)
    elif roll < 0.25:
        value = (value.requires_grad_() * 2) if rng.random() < 0.5 else value.requires_grad_()
    elif roll < 0.3:
        value = torch.nn.Parameter(value)
    elif roll < 0.35:
        value = value.to(torch.int64)
    return value


def assert_same(a: Any, b: Any, path: tuple = ()) -> None:
    """``a`` and ``b`` agree in everything a user can observe (see the module docstring)."""
    assert type(a) is type(b), (path, type(a), type(b))
    if isinstance(a, (tuple, list)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, (*path, i))
        return
    if isinstance(a, torch.Tensor):
        assert a.shape == b.shape and a.dtype == b.dtype, (path, a.shape, b.shape)
        assert a.stride() == b.stride(), (path, a.stride(), b.stride())
        assert a.requires_grad == b.requires_grad, path
        assert type(a.grad_fn) is type(b.grad_fn), (path, a.grad_fn, b.grad_fn)
        assert torch.equal(a.detach(), b.detach()), path
        return
    if not hasattr(a, "batch_size"):
        assert a == b, (path, a, b)
        return
    assert a.batch_size == b.batch_size, (path, a.batch_size, b.batch_size)
    if isinstance(a, NonTensorData):
        assert a.data == b.data, path
        return
    assert a.names == b.names, (path, a.names, b.names)
    assert a.is_locked == b.is_locked, (path, a.is_locked, b.is_locked)
    assert a.device == b.device, path
    assert list(a.keys()) == list(b.keys()), (path, list(a.keys()), list(b.keys()))
    for key in a.keys():  # noqa: SIM118 (iterating a container walks its batch dim)
        assert_same(a.get(key), b.get(key), (*path, key))
