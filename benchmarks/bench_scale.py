"""How the cost grows with the size of the work, each case beside its floor.

Every size is its own group (``scale-<case>-<size>``), holding tdfunc and the
floor (``baseline``): the same work done by hand in the same run, so the
ratio of medians per size is read from one run and the growth is visible:

- ``to_module``: ``with params.to_module(model): pass`` on
  ``nn.Sequential(*[nn.Linear(2, 2)] * (leaves // 2))`` against assigning the
  same tensors into the same ``_parameters`` dicts by hand (save, assign,
  put back). 10, 100, 1,000, 5,000 leaves.
- ``pytree``: ``tree_unflatten(*tree_flatten(td))`` of a nested TensorDict
  (ten entries per level) against ``torch.utils._pytree`` on the same nested
  dicts. 10, 100, 1,000, 10,000 leaves.
- ``checkpoint``: ``td.memmap(new directory)`` + ``TensorDict.load_memmap``
  against ``torch.save`` (a new file) + ``torch.load(mmap=True)``. 1,000
  leaves of 1 KB, 32 weights of 256 x 256, 4 leaves of 32 MB.
- ``ensemble``: ``Ensemble`` forward at N = 1 to 256 lives in
  ``bench_ensemble.py``.

``conftest.py`` pins glibc's ``mallopt`` thresholds at import (as
``benchmarks/conftest.py`` describes), so that freed memory is not handed back
to the system between rounds and then faulted in again. Run with one thread::

    OMP_NUM_THREADS=1 python -m pytest benchmarks/bench_scale.py --benchmark-enable \\
        --benchmark-json=/tmp/scale.json -q
    python benchmarks/plot_scale.py /tmp/scale.json
"""

from __future__ import annotations

import gc
import itertools

import pytest
import torch
import torch.utils._pytree as torch_pytree
from torch import nn

from tdfunc import TensorDict

SWAP_SIZES = (10, 100, 1000, 5000)
PYTREE_SIZES = (10, 100, 1000, 10000)
CHECKPOINTS = {
    "1000x1KB": (1000, (256,)),
    "32x256x256": (32, (256, 256)),
    "4x32MB": (4, (8 << 20,)),
}


pytestmark = pytest.mark.usefixtures("one_thread")


def _group(case: str, size) -> pytest.MarkDecorator:
    return pytest.mark.benchmark(group=f"scale-{case}-{size}")


def _sized(case: str, sizes) -> pytest.MarkDecorator:
    return pytest.mark.parametrize(
        "size", [pytest.param(s, marks=_group(case, s), id=str(s)) for s in sizes]
    )


# ---------------------------------------------------------------- to_module
def _model(leaves: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(2, 2) for _ in range(leaves // 2)])


@_sized("to_module", SWAP_SIZES)
def test_to_module_tdfunc(benchmark, size):
    model = _model(size)
    params = TensorDict.from_module(model).apply(torch.zeros_like)

    def enter_exit():
        with params.to_module(model):
            pass

    enter_exit()
    benchmark(enter_exit)
    assert model[0].weight is not params["0", "weight"]
    with params.to_module(model):
        assert model[-1].bias is params[str(size // 2 - 1), "bias"]


@_sized("to_module", SWAP_SIZES)
def test_to_module_baseline(benchmark, size):
    model = _model(size)
    params = TensorDict.from_module(model).apply(torch.zeros_like)
    slots = [(layer._parameters, name) for layer in model for name in ("weight", "bias")]
    news = [params[str(i), name] for i in range(size // 2) for name in ("weight", "bias")]

    def enter_exit():
        olds = [owner[name] for owner, name in slots]
        for (owner, name), value in zip(slots, news):
            owner[name] = value
        for (owner, name), old in zip(slots, olds):
            owner[name] = old

    benchmark(enter_exit)
    assert model[0].weight is not params["0", "weight"]


# ---------------------------------------------------------------- pytree
def _nested(leaves: int, fan: int = 10) -> dict:
    """Nested dicts with ``leaves`` tensors, ``fan`` entries per level."""
    if leaves <= fan:
        return {f"k{i}": torch.zeros(2) for i in range(leaves)}
    per = -(-leaves // fan)
    out, index = {}, 0
    while leaves > 0:
        take = min(per, leaves)
        out[f"k{index}"] = _nested(take, fan)
        leaves -= take
        index += 1
    return out


def _round_trip(tree):
    leaves, spec = torch_pytree.tree_flatten(tree)
    return torch_pytree.tree_unflatten(leaves, spec)


def _collections(tree, rounds: int = 20) -> int:
    """Garbage collections started during ``rounds`` round trips (what a tree allocates
    and keeps per call shows up here: pauses that the median hides)."""
    started = [0]

    def count(phase: str, _info: dict) -> None:
        started[0] += phase == "start"

    gc.callbacks.append(count)
    try:
        for _ in range(rounds):
            _round_trip(tree)
    finally:
        gc.callbacks.remove(count)
    return started[0]


@_sized("pytree", PYTREE_SIZES)
def test_pytree_tdfunc(benchmark, size):
    td = TensorDict(_nested(size), [])
    benchmark.extra_info["gc_collections_per_20"] = _collections(td)
    out = benchmark(_round_trip, td)
    assert len(torch_pytree.tree_leaves(out)) == size


@_sized("pytree", PYTREE_SIZES)
def test_pytree_baseline(benchmark, size):
    tree = _nested(size)
    benchmark.extra_info["gc_collections_per_20"] = _collections(tree)
    out = benchmark(_round_trip, tree)
    assert len(torch_pytree.tree_leaves(out)) == size


# ---------------------------------------------------------------- checkpoint
def _checkpoint(case: str) -> dict:
    count, shape = CHECKPOINTS[case]
    generator = torch.Generator().manual_seed(0)
    return {f"leaf{i}": torch.randn(*shape, generator=generator) for i in range(count)}


def _rounds(case: str) -> int:
    return 5 if case == "4x32MB" else 15


@_sized("checkpoint", CHECKPOINTS)
def test_checkpoint_tdfunc(benchmark, size, tmp_path):
    flat = _checkpoint(size)
    td = TensorDict(flat, [])
    counter = itertools.count()

    def save_load():
        path = tmp_path / f"ckpt{next(counter)}"
        td.memmap(path)
        return TensorDict.load_memmap(path)

    loaded = benchmark.pedantic(save_load, rounds=_rounds(size), iterations=1, warmup_rounds=1)
    assert all(torch.equal(loaded[key], value) for key, value in flat.items())


@_sized("checkpoint", CHECKPOINTS)
def test_checkpoint_baseline(benchmark, size, tmp_path):
    flat = _checkpoint(size)
    counter = itertools.count()

    def save_load():
        path = tmp_path / f"ckpt{next(counter)}.pt"
        torch.save(flat, path)
        return torch.load(path, mmap=True, weights_only=True)

    loaded = benchmark.pedantic(save_load, rounds=_rounds(size), iterations=1, warmup_rounds=1)
    assert all(torch.equal(loaded[key], value) for key, value in flat.items())
