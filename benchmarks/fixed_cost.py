"""The fixed cost of one call: tdfunc beside its floor, each pair interleaved in one process.

Rows (each with its floor, timed in the same run):

- ``ensemble``: ``Ensemble`` forward (MLP 32-32-32-1, batch 16) / the hand-written
  ``baddbmm`` chain, N = 1, 4, 16, 64, 256; ``small``: the ``N8-w32`` model of
  ``bench_ensemble.py`` / its hand-written chain;
- ``swap``: ``with params.to_module(m):`` enter and exit / assigning the tensors by
  hand, 10, 100 and 1,000 leaves, and a model of nested blocks;
- ``pytree``: a round trip through ``torch.utils._pytree`` of a TensorDict / of
  the same dict, 1, 10 and 100 leaves, three nested levels, a TensorClass; and
  through optree (namespace ``"tdfunc"``) / of the same dicts;
- ``ops``: ``reshape``, ``unbind``, ``stack`` of 10, a slice, ``clone`` of a
  container / the same work on its plain tensors (``optree.tree_map`` over nested
  dicts), batch ranks 1 to 3;
- ``compile``: seconds to ``torch.compile`` (first call) a vmapped functional
  forward through ``to_module`` / through ``torch.func.functional_call`` with dicts.

Contenders alternate batch by batch and each batch is timed in CPU time of the
thread (``time.thread_time_ns``): time that other jobs take from the CPU is not
counted. The table gives the ratio of the medians. One thread::

    python benchmarks/fixed_cost.py [case ...]

``tensordict`` is compared in separate processes (importing it patches
``torch._functorch.vmap``): ``python benchmarks/fixed_cost.py versus PYTHON``
runs :data:`LIBRARY_OPS` with tdfunc and with ``tensordict`` (``PYTHON``: an
interpreter that has it) in alternating processes and prints tensordict / tdfunc
per operation (the lowest median of three processes each) and their geometric mean.

``--json PATH`` also writes the rows (medians and quartiles of both contenders, the
machine and the date) for ``plot_report.py --fixed PATH``.
"""

from __future__ import annotations

import copy
import datetime
import json
import math
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import optree
import torch
import torch.utils._pytree as torch_pytree
from torch import nn

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]
from ratios import interleaved_samples, machine  # noqa: E402

_clock = time.thread_time_ns


class Timing(float):
    """A median time (seconds per call) that also carries its quartiles ``q1``, ``q3``."""

    q1: float
    q3: float

    @classmethod
    def of(cls, values: list) -> Timing:
        quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
        timing = cls(statistics.median(values))
        timing.q1, timing.q3 = quartiles[0], quartiles[2]
        return timing


def interleaved(contenders: dict, batches: int = 31, number: int = 200) -> dict:
    """``{name: median seconds per call}`` (a :class:`Timing`), the contenders
    alternating batch by batch."""
    times = interleaved_samples(contenders, batches, number=number, warmup=1)
    return {name: Timing.of(values) for name, values in times.items()}


def _calls(seconds_each: float) -> int:
    """Calls per batch so that a batch takes about 2 ms."""
    return max(5, int(2e-3 / max(seconds_each, 1e-7)))


def _pair(ours, floor, batches: int = 31) -> tuple:
    start = _clock()
    ours()
    number = _calls((_clock() - start) / 1e9)
    medians = interleaved({"ours": ours, "floor": floor}, batches, number)
    return medians["ours"], medians["floor"]


# ---------------------------------------------------------------- ensembles
def ensemble_rows():
    from bench_ensemble import baddbmm_of, setup
    from bench_ensemble_rl import OVERHEAD_MEMBERS, baddbmm_chain, overhead_setup

    from tdfunc import Ensemble

    for members in OVERHEAD_MEMBERS:
        models, x = overhead_setup(members)
        ensemble = Ensemble(*copy.deepcopy(models))
        chain = baddbmm_chain(models)
        torch.testing.assert_close(ensemble(x), chain(x), rtol=1e-4, atol=1e-5)
        yield f"ensemble N={members}", *_pair(partial(ensemble, x), partial(chain, x))
    models, x, expected = setup("N8-w32")
    ensemble = Ensemble(*copy.deepcopy(models))
    forward, _ = baddbmm_of(models)
    torch.testing.assert_close(ensemble(x), expected, rtol=1e-4, atol=1e-5)
    yield "small ensemble N8 w32", *_pair(lambda: ensemble(x), lambda: forward(x))


# ---------------------------------------------------------------- swaps
def swap_rows():
    from tdfunc import TensorDict

    for size in (10, 100, 1000):
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(size // 2)])
        yield f"to_module enter+exit, {size} leaves", *_swap_pair(TensorDict, model)
    torch.manual_seed(0)
    model = nn.Sequential(*[_Block() for _ in range(4)])
    yield "to_module enter+exit, nested blocks (24 leaves)", *_swap_pair(TensorDict, model)


class _Block(nn.Module):
    """Two levels of submodules below the root: a swap walks nested levels."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.Linear(2, 2)
        self.mlp = nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2))


def _swap_pair(td_class, model: nn.Module) -> tuple:
    params = td_class.from_module(model).apply(torch.zeros_like)
    flat = params.flatten_keys(".")
    slots, news = [], []
    for prefix, module in model.named_modules():
        for name in module._parameters:
            slots.append((module._parameters, name))
            news.append(flat[f"{prefix}.{name}" if prefix else name])

    def ours(params=params, model=model):
        with params.to_module(model):
            pass

    # What a careful user writes: the slots and the new tensors found once, then save,
    # assign, and put back in ``finally`` (as ``with`` does on an exception). It
    # checks nothing: ``to_module`` also checks that the keys and the module still
    # match the plan it cached.
    def floor(slots=slots, news=news):
        olds = [owner[name] for owner, name in slots]
        try:
            for (owner, name), value in zip(slots, news):
                owner[name] = value
        finally:
            for (owner, name), old in zip(slots, olds):
                owner[name] = old

    return _pair(ours, floor)


# ---------------------------------------------------------------- pytree
def _nested_tree() -> dict:
    """Three levels, ten leaves."""
    leaf = partial(torch.zeros, 2)
    deepest = {"g": leaf(), "h": leaf(), "i": leaf(), "j": leaf()}
    return {"a": leaf(), "b": leaf(), "c": {"d": leaf(), "e": leaf(), "f": deepest}, "k": leaf()}


def _as_tensordict(td_class, tree: dict):
    return td_class(
        {k: _as_tensordict(td_class, v) if isinstance(v, dict) else v for k, v in tree.items()}, []
    )


def _torch_round_trip(tree):
    flatten, unflatten = torch_pytree.tree_flatten, torch_pytree.tree_unflatten
    return lambda: unflatten(*flatten(tree))


def _optree_round_trip(tree, namespace: str):
    def round_trip():
        leaves, spec = optree.tree_flatten(tree, namespace=namespace)
        return optree.tree_unflatten(spec, leaves)

    return round_trip


def pytree_rows():
    from tdfunc import TensorClass, TensorDict

    for size in (1, 10, 100):
        tree = {f"k{i}": torch.zeros(2) for i in range(size)}
        td = TensorDict(tree, [])
        ours, floor = _pair(_torch_round_trip(td), _torch_round_trip(tree))
        yield f"pytree round trip, {size} leaves", ours, floor
    tree = _nested_tree()
    td = _as_tensordict(TensorDict, tree)
    yield (
        "pytree round trip, nested (3 levels, 10 leaves)",
        *_pair(_torch_round_trip(td), _torch_round_trip(tree)),
    )

    class Ten(TensorClass):
        a: torch.Tensor
        b: torch.Tensor
        c: torch.Tensor
        d: torch.Tensor
        e: torch.Tensor
        f: torch.Tensor
        g: torch.Tensor
        h: torch.Tensor
        i: torch.Tensor
        j: torch.Tensor

    tree = {name: torch.zeros(2) for name in "abcdefghij"}
    instance = Ten(**tree, batch_size=[])
    yield (
        "pytree round trip, TensorClass of 10 fields",
        *_pair(_torch_round_trip(instance), _torch_round_trip(tree)),
    )
    tree = {f"k{i}": torch.zeros(2) for i in range(10)}
    yield (
        "optree round trip, 10 leaves",
        *_pair(_optree_round_trip(TensorDict(tree, []), "tdfunc"), _optree_round_trip(tree, "")),
    )
    tree = _nested_tree()
    yield (
        "optree round trip, nested (3 levels, 10 leaves)",
        *_pair(
            _optree_round_trip(_as_tensordict(TensorDict, tree), "tdfunc"),
            _optree_round_trip(tree, ""),
        ),
    )


# ---------------------------------------------------------------- container ops
RANK_BATCHES = {1: (4,), 2: (4, 6), 3: (2, 3, 4)}


def _tree(batch: tuple) -> dict:
    generator = torch.Generator().manual_seed(0)
    return {
        "a": torch.randn(*batch, 3, generator=generator),
        "b": {
            "c": torch.randn(*batch, 4, 5, generator=generator),
            "d": torch.randn(*batch, generator=generator),
        },
    }


def _leafwise(fn, *trees):
    # optree: the fastest map over nested dicts (torch's pytree is several times slower)
    return optree.tree_map(fn, *trees)


def op_pairs(td_class, batch: tuple) -> dict:
    """``{op: (on the container, on the plain tensors)}`` for one batch size."""
    tree = _tree(batch)
    td = td_class(tree, batch_size=list(batch))
    rank = len(batch)
    flat = (math.prod(batch),)
    tds = [td_class(_tree(batch), batch_size=list(batch)) for _ in range(10)]
    trees = [_tree(batch) for _ in range(10)]

    def unbind_plain():
        parts = _leafwise(lambda x: x.unbind(0), tree)
        return [
            {"a": parts["a"][i], "b": {"c": parts["b"]["c"][i], "d": parts["b"]["d"][i]}}
            for i in range(batch[0])
        ]

    return {
        "reshape": (
            lambda: td.reshape(-1),
            lambda: _leafwise(lambda x: x.reshape(flat + x.shape[rank:]), tree),
        ),
        "unbind": (lambda: td.unbind(0), unbind_plain),
        "stack10": (
            lambda: torch.stack(tds, 0),
            lambda: _leafwise(lambda *xs: torch.stack(xs), *trees),
        ),
        "slice": (lambda: td[1:3], lambda: _leafwise(lambda x: x[1:3], tree)),
        "clone": (lambda: td.clone(), lambda: _leafwise(torch.clone, tree)),
    }


def ops_rows():
    from tdfunc import TensorDict

    for rank, batch in RANK_BATCHES.items():
        for op, (ours, floor) in op_pairs(TensorDict, batch).items():
            yield f"{op}, batch rank {rank}", *_pair(ours, floor, batches=21)


# ---------------------------------------------------------------- compile time
def compile_rows():
    from torch.func import functional_call

    from tdfunc import TensorDict

    torch.manual_seed(0)
    models = [nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4)) for _ in range(4)]
    template = copy.deepcopy(models[0]).to("meta")
    params = TensorDict.from_modules(*models)
    dicts = {k: v.detach().clone() for k, v in params.flatten_keys(".").items()}
    x = torch.randn(5, 8)

    def ours(p, x):
        with p.to_module(template):
            return template(x)

    def floor(p, x):
        return functional_call(template, p, (x,))

    def compile_seconds(fn, p) -> float:
        torch._dynamo.reset()
        compiled = torch.compile(torch.func.vmap(fn, (0, None)), backend="eager")
        start = _clock()  # compiling runs in this thread: its CPU time is the cost
        compiled(p, x)
        return (_clock() - start) / 1e9

    times: dict = {"ours": [], "floor": []}
    for _ in range(5):
        times["ours"].append(compile_seconds(ours, params))
        times["floor"].append(compile_seconds(floor, dicts))
    yield (
        "torch.compile (dynamo, eager backend) of a vmapped forward",
        Timing.of(times["ours"]),
        Timing.of(times["floor"]),
    )


CASES = {
    "ensemble": ensemble_rows,
    "swap": swap_rows,
    "pytree": pytree_rows,
    "ops": ops_rows,
    "compile": compile_rows,
}


def main(cases: list, json_path: str | None = None) -> None:
    torch.set_num_threads(1)
    print("| case | tdfunc (µs) | floor (µs) | ratio of medians |")
    print("|---|---|---|---|")
    rows = []
    for case in cases or CASES:
        for name, ours, floor in CASES[case]():
            print(f"| {name} | {ours * 1e6:,.2f} | {floor * 1e6:,.2f} | {ours / floor:.2f} |")
            sys.stdout.flush()
            rows.append(
                {"case": case, "name": name, "tdfunc": _stats(ours), "floor": _stats(floor)}
            )
    if json_path:
        run = {"machine": _machine(), "date": datetime.date.today().isoformat(), "rows": rows}
        Path(json_path).write_text(json.dumps(run, indent=1))


def _stats(timing: float) -> dict:
    return {
        "median": float(timing),
        "q1": getattr(timing, "q1", float(timing)),
        "q3": getattr(timing, "q3", float(timing)),
    }


def _machine() -> str:
    """The CPU, its cores and torch's version (for the figure's title)."""
    return f"{machine()}, torch {torch.__version__.split('+')[0]}"


# ---------------------------------------------------------------- versus tensordict
def library_ops(td_class) -> dict:
    """18 container operations of ``bench_container.py`` on ``td_class``, as callables."""
    batch = (4, 6)
    td = td_class(_tree(batch), batch_size=list(batch))
    tree = _tree(batch)
    a, c, d = tree["a"], tree["b"]["c"], tree["b"]["d"]
    new = torch.zeros(*batch, 4, 5)
    tds = [td_class(_tree(batch), batch_size=list(batch)) for _ in range(10)]
    deep = td_class(
        {"a": a, "b": {"c": c, "d": {"e": d, "f": {"g": torch.zeros(*batch, 2)}}}},
        batch_size=list(batch),
    )
    g = torch.ones(*batch, 2)
    return {
        "construct": lambda: td_class({"a": a, "b": {"c": c, "d": d}}, batch_size=batch),
        "get_nested": lambda: td["b", "c"],
        "set_nested": lambda: td.__setitem__(("b", "c"), new),
        "index_int": lambda: td[1],
        "index_slice": lambda: td[1:3],
        "apply": lambda: td.apply(lambda x: x + 1),
        "reshape": lambda: td.reshape(-1),
        "stack10": lambda: torch.stack(tds, 0),
        "unbind": lambda: td.unbind(0),
        "clone": lambda: td.clone(),
        "getitem_depth1": lambda: deep["a"],
        "getitem_depth3": lambda: deep["b", "d", "e"],
        "getitem_depth4": lambda: deep["b", "d", "f", "g"],
        "get_tuple_depth4": lambda: deep.get(("b", "d", "f", "g")),
        "set_tuple_depth4": lambda: deep.set(("b", "d", "f", "g"), g),
        "in_depth3": lambda: ("b", "d", "e") in deep,
        "lock_unlock": lambda: deep.lock_().unlock_(),
        "flatten_keys": lambda: deep.flatten_keys("."),
    }


def _library_medians(library: str) -> dict:
    if library == "tensordict":
        from tensordict import TensorDict
    else:
        from tdfunc import TensorDict
    torch.set_num_threads(1)
    ops = library_ops(TensorDict)
    out = {}
    for name, function in ops.items():
        start = _clock()
        function()
        number = _calls((_clock() - start) / 1e9)
        out[name] = interleaved({name: function}, 21, number)[name]
    return out


def versus(python: str, runs: int = 3) -> None:
    best: dict = {"tdfunc": {}, "tensordict": {}}
    root = Path(__file__).resolve().parent.parent
    for _ in range(runs):
        for library in best:
            text = subprocess.run(
                [python, __file__, "_library", library],
                cwd=root,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            for name, value in json.loads(text).items():
                best[library][name] = min(best[library].get(name, value), value)
    print("| operation | tdfunc (µs) | tensordict (µs) | tensordict / tdfunc |")
    print("|---|---|---|---|")
    ratios = []
    for name, mine in best["tdfunc"].items():
        theirs = best["tensordict"][name]
        ratios.append(theirs / mine)
        print(f"| {name} | {mine * 1e6:.2f} | {theirs * 1e6:.2f} | {theirs / mine:.2f}x |")
    mean = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print(f"\ngeometric mean over {len(ratios)}: {mean:.2f}x; lowest {min(ratios):.2f}x")


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["_library"]:
        print(json.dumps(_library_medians(args[1])))
    elif args[:1] == ["versus"]:
        versus(args[1] if len(args) > 1 else sys.executable)
    else:
        json_path = None
        if "--json" in args:
            at = args.index("--json")
            json_path = args[at + 1]
            del args[at : at + 2]
        main(args, json_path)
