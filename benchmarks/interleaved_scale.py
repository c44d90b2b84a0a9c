"""``bench_scale.py``'s pytree and ``to_module`` cases, each side interleaved with its floor.

A pytest-benchmark run times one side, then the other: on a shared machine the
load moves between the two and so does their ratio. Here the two sides
alternate batch by batch in one process, timed in CPU time of the process
(``time.process_time``: time other jobs take from the CPU is not counted), and
the table gives the ratio of the medians and of the best batches. The
checkpoint case is left to ``bench_scale.py``: its cost is the disk's, which
CPU time does not see. Run with one thread::

    OMP_NUM_THREADS=1 python benchmarks/interleaved_scale.py [batches]
"""

from __future__ import annotations

import statistics
import sys
import time
import timeit
from pathlib import Path

import torch
import torch.utils._pytree as torch_pytree
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scale import PYTREE_SIZES, SWAP_SIZES, _collections, _nested
from conftest import pin_allocator

from tdfunc import TensorDict


def _pytree_pair(size: int) -> tuple:
    tree = _nested(size)
    td = TensorDict(tree, [])

    def ours():
        torch_pytree.tree_unflatten(*torch_pytree.tree_flatten(td))

    def floor():
        torch_pytree.tree_unflatten(*torch_pytree.tree_flatten(tree))

    return ours, floor


def _swap_pair(size: int) -> tuple:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(size // 2)])
    params = TensorDict.from_module(model).apply(torch.zeros_like)
    slots = [(layer._parameters, name) for layer in model for name in ("weight", "bias")]
    news = [params[str(i), name] for i in range(size // 2) for name in ("weight", "bias")]

    def ours():
        with params.to_module(model):
            pass

    def floor():
        olds = [owner[name] for owner, name in slots]
        for (owner, name), value in zip(slots, news):
            owner[name] = value
        for (owner, name), old in zip(slots, olds):
            owner[name] = old

    return ours, floor


def _interleaved(ours, floor, size: int, batches: int) -> tuple:
    ours(), floor()
    number = max(1, 20000 // size)
    times: dict = {"ours": [], "floor": []}
    for _ in range(batches):
        for name, function in (("ours", ours), ("floor", floor)):
            elapsed = timeit.timeit(function, number=number, timer=time.process_time)
            times[name].append(elapsed / number)
    median = statistics.median(times["ours"]) / statistics.median(times["floor"])
    best = min(times["ours"]) / min(times["floor"])
    return statistics.median(times["floor"]), median, best


def main(batches: int = 15) -> None:
    pin_allocator()
    torch.set_num_threads(1)
    print("| case | leaves | floor (µs) | median ratio | best ratio |")
    print("|---|---|---|---|---|")
    for case, sizes, pair in (
        ("to_module", SWAP_SIZES, _swap_pair),
        ("pytree", PYTREE_SIZES, _pytree_pair),
    ):
        for size in sizes:
            floor_time, median, best = _interleaved(*pair(size), size, batches)
            print(f"| {case} | {size:,} | {floor_time * 1e6:,.1f} | {median:.2f} | {best:.2f} |")
    print("\ngarbage collections per 20 pytree round trips (tdfunc, torch's pytree on dicts):")
    for size in PYTREE_SIZES:
        tree = _nested(size)
        print(f"{size:,} leaves: {_collections(TensorDict(tree, []))}, {_collections(tree)}")


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:]))
