"""Saving + loading with ``memmap``/``load_memmap`` beside ``torch.save``/``torch.load``.

Each benchmark times one save followed by one load of the same data. Loads are
lazy on both sides: ``load_memmap`` maps the files, ``torch.load(mmap=True)``
maps the archive. Two situations:

- *new*: every round saves to a new directory (a new file for ``torch.save``);
  earlier rounds' outputs stay on disk until the end.
- *overwrite*: every round saves to the same location (a checkpoint being
  replaced), after two warm-up rounds. tdfunc writes new files and removes the
  old ones in a background thread once the new ``meta.json`` is committed;
  ``torch.save`` rewrites its archive in place (a crash there loses both).

Cases: ``weights`` (16 ``Linear(256, 256)``: 32 leaves, 4 MB; target: at least as
fast as ``torch.save`` on a new directory), ``tiny`` (1,000 leaves of 4 floats; target
on a new directory: at most 1.2x ``torch.save`` + ``torch.load(mmap=True)``),
``large`` (three 64 MB tensors, ``num_threads=3``; target: 3x faster).

Nothing is ``fsync``-ed on either side (``torch.save`` does not either). Run with
``OMP_NUM_THREADS=1``; compare medians within one run.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from tdfunc import TensorDict

THREADS = 4
WARMUP = 2
WEIGHT_ROUNDS = 40
TINY_ROUNDS = 15
LARGE_ROUNDS = 7


def _weights() -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(16)])
    return {k: v.detach() for k, v in model.state_dict().items()}


def _tiny() -> dict:
    generator = torch.Generator().manual_seed(0)
    return {f"leaf{i}": torch.randn(4, generator=generator) for i in range(1000)}


def _large() -> dict:
    generator = torch.Generator().manual_seed(0)
    return {f"t{i}": torch.randn(16 * 2**20, generator=generator) for i in range(3)}


def _nested(flat: dict) -> TensorDict:
    """The model layout of ``from_module``: ``"0.weight"`` -> ``td["0", "weight"]``."""
    return TensorDict(flat, []).unflatten_keys(".")


def _check(loaded, flat: dict, nested: bool = True) -> None:
    for key, value in flat.items():
        got = loaded[tuple(key.split("."))] if nested and "." in key else loaded[key]
        assert torch.equal(got, value)


def _tdfunc(benchmark, tmp_path, flat: dict, num_threads: int, rounds: int):
    td = _nested(flat)
    path = tmp_path / "td"

    def run():
        td.memmap(path, num_threads=num_threads)
        return TensorDict.load_memmap(path)

    loaded = benchmark.pedantic(run, rounds=rounds, iterations=1, warmup_rounds=WARMUP)
    _check(loaded, flat)


def _baseline(benchmark, tmp_path, flat: dict, rounds: int):
    path = tmp_path / "state.pt"

    def run():
        torch.save(flat, path)
        return torch.load(path, mmap=True, weights_only=True)

    loaded = benchmark.pedantic(run, rounds=rounds, iterations=1, warmup_rounds=WARMUP)
    _check(loaded, flat, nested=False)


def _tensordict(benchmark, tmp_path, flat: dict, lib, num_threads: int, rounds: int):
    td = lib.TensorDict(flat, []).unflatten_keys(".")
    path = tmp_path / "anchor"

    def run():
        td.memmap(path, num_threads=num_threads)
        return lib.TensorDict.load_memmap(path)

    loaded = benchmark.pedantic(run, rounds=rounds, iterations=1, warmup_rounds=WARMUP)
    _check(loaded, flat)


def _fresh(tmp_path, suffix: str = ""):
    """A ``setup`` for ``benchmark.pedantic``: a new path each round.

    Earlier rounds' outputs are left in place (removed with ``tmp_path``): removing
    them between rounds would time the file system's block freeing (slow with
    online discard) instead of the save.
    """
    counter = itertools.count()

    def setup():
        return (tmp_path / f"new{next(counter)}{suffix}",), {}

    return setup


def _tdfunc_new(benchmark, tmp_path, flat: dict, num_threads: int, rounds: int):
    td = _nested(flat)

    def run(path):
        td.memmap(path, num_threads=num_threads)
        return TensorDict.load_memmap(path)

    loaded = benchmark.pedantic(run, setup=_fresh(tmp_path), rounds=rounds, warmup_rounds=WARMUP)
    _check(loaded, flat)


def _baseline_new(benchmark, tmp_path, flat: dict, rounds: int):
    def run(path):
        torch.save(flat, path)
        return torch.load(path, mmap=True, weights_only=True)

    setup = _fresh(tmp_path, ".pt")
    loaded = benchmark.pedantic(run, setup=setup, rounds=rounds, warmup_rounds=WARMUP)
    _check(loaded, flat, nested=False)


# ---------------------------------------------------------------- new directory
@pytest.mark.benchmark(group="persist_weights_new")
def test_persist_weights_new_tdfunc(benchmark, tmp_path):
    _tdfunc_new(benchmark, tmp_path, _weights(), 0, WEIGHT_ROUNDS)


@pytest.mark.benchmark(group="persist_weights_new")
def test_persist_weights_new_tdfunc_threads(benchmark, tmp_path):
    _tdfunc_new(benchmark, tmp_path, _weights(), THREADS, WEIGHT_ROUNDS)


@pytest.mark.benchmark(group="persist_weights_new")
def test_persist_weights_new_baseline(benchmark, tmp_path):
    _baseline_new(benchmark, tmp_path, _weights(), WEIGHT_ROUNDS)


@pytest.mark.benchmark(group="persist_large_new")
def test_persist_large_new_tdfunc(benchmark, tmp_path):
    _tdfunc_new(benchmark, tmp_path, _large(), 3, LARGE_ROUNDS)


@pytest.mark.benchmark(group="persist_large_new")
def test_persist_large_new_baseline(benchmark, tmp_path):
    _baseline_new(benchmark, tmp_path, _large(), LARGE_ROUNDS)


@pytest.mark.benchmark(group="persist_tiny_new")
def test_persist_tiny_new_tdfunc(benchmark, tmp_path):
    _tdfunc_new(benchmark, tmp_path, _tiny(), 0, TINY_ROUNDS)


@pytest.mark.benchmark(group="persist_tiny_new")
def test_persist_tiny_new_baseline(benchmark, tmp_path):
    _baseline_new(benchmark, tmp_path, _tiny(), TINY_ROUNDS)


# ---------------------------------------------------------------- model weights
@pytest.mark.benchmark(group="persist_weights")
def test_persist_weights_tdfunc(benchmark, tmp_path):
    _tdfunc(benchmark, tmp_path, _weights(), 0, WEIGHT_ROUNDS)


@pytest.mark.benchmark(group="persist_weights")
def test_persist_weights_tdfunc_threads(benchmark, tmp_path):
    _tdfunc(benchmark, tmp_path, _weights(), THREADS, WEIGHT_ROUNDS)


@pytest.mark.benchmark(group="persist_weights")
def test_persist_weights_baseline(benchmark, tmp_path):
    _baseline(benchmark, tmp_path, _weights(), WEIGHT_ROUNDS)


@pytest.mark.benchmark(group="persist_weights")
def test_persist_weights_tensordict(benchmark, tmp_path, tensordict_lib):
    _tensordict(benchmark, tmp_path, _weights(), tensordict_lib, THREADS, WEIGHT_ROUNDS)


# ---------------------------------------------------------------- 1,000 tiny leaves
@pytest.mark.benchmark(group="persist_tiny")
def test_persist_tiny_tdfunc(benchmark, tmp_path):
    _tdfunc(benchmark, tmp_path, _tiny(), 0, TINY_ROUNDS)


@pytest.mark.benchmark(group="persist_tiny")
def test_persist_tiny_tdfunc_threads(benchmark, tmp_path):
    _tdfunc(benchmark, tmp_path, _tiny(), THREADS, TINY_ROUNDS)


@pytest.mark.benchmark(group="persist_tiny")
def test_persist_tiny_baseline(benchmark, tmp_path):
    _baseline(benchmark, tmp_path, _tiny(), TINY_ROUNDS)


@pytest.mark.benchmark(group="persist_tiny")
def test_persist_tiny_tensordict(benchmark, tmp_path, tensordict_lib):
    _tensordict(benchmark, tmp_path, _tiny(), tensordict_lib, THREADS, TINY_ROUNDS)


# ---------------------------------------------------------------- a few 64 MB tensors
@pytest.mark.benchmark(group="persist_large")
def test_persist_large_tdfunc(benchmark, tmp_path):
    _tdfunc(benchmark, tmp_path, _large(), 3, LARGE_ROUNDS)


@pytest.mark.benchmark(group="persist_large")
def test_persist_large_baseline(benchmark, tmp_path):
    _baseline(benchmark, tmp_path, _large(), LARGE_ROUNDS)


@pytest.mark.benchmark(group="persist_large")
def test_persist_large_tensordict(benchmark, tmp_path, tensordict_lib):
    _tensordict(benchmark, tmp_path, _large(), tensordict_lib, 3, LARGE_ROUNDS)
