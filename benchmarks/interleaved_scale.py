"""``bench_scale.py``'s pytree and ``to_module`` cases and ``bench_ensemble_rl.py``'s
forward overhead, each side interleaved with its floor.

A pytest-benchmark run times one side, then the other: on a shared machine the
load moves between the two and so does their ratio. Here the two sides
alternate batch by batch in one process, timed in CPU time of the process
(``time.process_time``: time other jobs take from the CPU is not counted), and
the table gives the ratio of the medians and of the best batches. The
checkpoint case is left to ``bench_scale.py``: its cost is the disk's, which
CPU time does not see. Run with one thread::

    OMP_NUM_THREADS=1 python benchmarks/interleaved_scale.py [batches] [case ...]
"""

from __future__ import annotations

import copy
import statistics
import sys
import time
import timeit
from pathlib import Path

import torch
import torch.utils._pytree as torch_pytree
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ensemble_rl import OVERHEAD_MEMBERS, baddbmm_chain, overhead_setup
from bench_scale import PYTREE_SIZES, SWAP_SIZES, _collections, _nested
from conftest import pin_allocator

from tdfunc import Ensemble, TensorDict


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


def _ensemble_pair(members: int) -> tuple:
    """``Ensemble`` forward (MLP 32-32-32-1, batch 16) against a hand-written ``baddbmm`` chain."""
    models, x = overhead_setup(members)
    ensemble = Ensemble(*copy.deepcopy(models))
    chain = baddbmm_chain(models)
    return (lambda: ensemble(x)), (lambda: chain(x))


def _interleaved(ours, floor, batches: int, number: int) -> tuple:
    ours(), floor()
    times: dict = {"ours": [], "floor": []}
    for _ in range(batches):
        for name, function in (("ours", ours), ("floor", floor)):
            elapsed = timeit.timeit(function, number=number, timer=time.process_time)
            times[name].append(elapsed / number)
    median = statistics.median(times["ours"]) / statistics.median(times["floor"])
    best = min(times["ours"]) / min(times["floor"])
    return statistics.median(times["floor"]), median, best


CASES = {  # name -> (sizes, make the pair, calls per batch at a size)
    "to_module": (SWAP_SIZES, _swap_pair, lambda size: max(1, 20000 // size)),
    "pytree": (PYTREE_SIZES, _pytree_pair, lambda size: max(1, 20000 // size)),
    "ensemble": (OVERHEAD_MEMBERS, _ensemble_pair, lambda members: max(20, 2000 // members)),
}


def main(batches: int = 15, *cases: str) -> None:
    pin_allocator()
    torch.set_num_threads(1)
    print("| case | size | floor (µs) | median ratio | best ratio |")
    print("|---|---|---|---|---|")
    for case in cases or CASES:
        sizes, pair, number = CASES[case]
        for size in sizes:
            floor_time, median, best = _interleaved(*pair(size), batches, number(size))
            print(f"| {case} | {size:,} | {floor_time * 1e6:,.1f} | {median:.2f} | {best:.2f} |")
    if "pytree" not in (cases or CASES):
        return
    print("\ngarbage collections per 20 pytree round trips (tdfunc, torch's pytree on dicts):")
    for size in PYTREE_SIZES:
        tree = _nested(size)
        print(f"{size:,} leaves: {_collections(TensorDict(tree, []))}, {_collections(tree)}")


if __name__ == "__main__":
    main(*(int(arg) if arg.isdigit() else arg for arg in sys.argv[1:]))
