"""TensorDict core operations beside plain nested dicts (optree) and ``tensordict``.

Data: three leaves (one nested one level down), batch size ``[4, 6]``, unless a
section says otherwise. The baseline does the same work on plain nested dicts,
with ``optree.tree_map`` where a map over leaves is needed.

Sections: construction, nested get/set, indexing, apply, reshape, stack,
unbind, clone; keys of depth 1 to 4 (``[]``, ``get``/``set`` with tuples,
``in``, ``pop``); a container of ``nn.Parameter`` leaves (what ``from_module``
makes); batch rank 1 and 3; tensor and mask indexing.

Targets (ratios of medians in one run): every container case at least 2x
faster than ``tensordict`` and 3x in geometric mean; every shape op within
1.3x of optree on nested dicts. ``benchmarks/ratios.py`` prints the table::

    OMP_NUM_THREADS=1 .venv-bench/bin/python -m pytest benchmarks/bench_container.py \
        --benchmark-enable --benchmark-timer=time.thread_time --benchmark-min-time=0.0002 \
        --benchmark-json=/tmp/container.json -q
    .venv-bench/bin/python benchmarks/ratios.py /tmp/container.json

(``thread_time`` counts only this thread's CPU time, which keeps the ratios
readable on a shared machine; the longer rounds amortise its cost.)
"""

from __future__ import annotations

import functools

import optree
import pytest
import torch

from tdfunc import TensorDict

pytestmark = pytest.mark.usefixtures("one_thread")

STACK_N = 10
BATCH = (4, 6)  # the batch size of the fixtures in conftest.py


def _check_leaves(result, expected: dict) -> None:
    """The result (any of the three kinds) holds the tensors of ``expected``."""
    flat = optree.tree_leaves(expected)
    got = [result["a"], result["b"]["c"], result["b"]["d"]]
    assert len(got) == len(flat)
    for left, right in zip(got, flat):
        assert torch.equal(left, right)


# ---------------------------------------------------------------- construction
@pytest.mark.benchmark(group="construct")
def test_construct_tdfunc(benchmark, make_nested):
    leaves = make_nested()
    a, c, d = leaves["a"], leaves["b"]["c"], leaves["b"]["d"]
    td = benchmark(lambda: TensorDict({"a": a, "b": {"c": c, "d": d}}, batch_size=BATCH))
    assert td.batch_size == torch.Size(BATCH) and td["b"].batch_size == torch.Size(BATCH)
    _check_leaves(td, leaves)


@pytest.mark.benchmark(group="construct")
def test_construct_baseline(benchmark, make_nested):
    leaves = make_nested()
    a, c, d = leaves["a"], leaves["b"]["c"], leaves["b"]["d"]
    out = benchmark(lambda: {"a": a, "b": {"c": c, "d": d}})
    _check_leaves(out, leaves)


@pytest.mark.benchmark(group="construct")
def test_construct_tensordict(benchmark, make_nested, tensordict_lib):
    leaves = make_nested()
    a, c, d = leaves["a"], leaves["b"]["c"], leaves["b"]["d"]
    cls = tensordict_lib.TensorDict
    td = benchmark(lambda: cls({"a": a, "b": {"c": c, "d": d}}, batch_size=BATCH))
    _check_leaves(td, leaves)


# ---------------------------------------------------------------- nested get
@pytest.mark.benchmark(group="get_nested")
def test_get_nested_tdfunc(benchmark, nested_td):
    value = benchmark(lambda: nested_td["b", "c"])
    assert value is nested_td._data["b"]._data["c"]


@pytest.mark.benchmark(group="get_nested")
def test_get_nested_baseline(benchmark, nested_dict):
    value = benchmark(lambda: nested_dict["b"]["c"])
    assert value.shape == (*BATCH, 4, 5)


@pytest.mark.benchmark(group="get_nested")
def test_get_nested_tensordict(benchmark, nested_anchor):
    value = benchmark(lambda: nested_anchor["b", "c"])
    assert value.shape == (*BATCH, 4, 5)


# ---------------------------------------------------------------- nested set
@pytest.mark.benchmark(group="set_nested")
def test_set_nested_tdfunc(benchmark, nested_td):
    new = torch.zeros(*BATCH, 4, 5)

    def write():
        nested_td["b", "c"] = new

    benchmark(write)
    assert nested_td["b", "c"] is new


@pytest.mark.benchmark(group="set_nested")
def test_set_nested_baseline(benchmark, nested_dict):
    new = torch.zeros(*BATCH, 4, 5)

    def write():
        nested_dict["b"]["c"] = new

    benchmark(write)
    assert nested_dict["b"]["c"] is new


@pytest.mark.benchmark(group="set_nested")
def test_set_nested_tensordict(benchmark, nested_anchor):
    new = torch.zeros(*BATCH, 4, 5)

    def write():
        nested_anchor["b", "c"] = new

    benchmark(write)
    assert nested_anchor["b", "c"] is new


# ---------------------------------------------------------------- indexing
def _map(fn, tree):
    return optree.tree_map(fn, tree)


@pytest.mark.benchmark(group="index_int")
def test_index_int_tdfunc(benchmark, nested_td, nested_dict):
    out = benchmark(lambda: nested_td[1])
    assert out.batch_size == torch.Size(BATCH[1:])
    _check_leaves(out, _map(lambda x: x[1], nested_dict))


@pytest.mark.benchmark(group="index_int")
def test_index_int_baseline(benchmark, nested_dict):
    out = benchmark(lambda: optree.tree_map(lambda x: x[1], nested_dict))
    assert out["a"].shape == (BATCH[1], 3)


@pytest.mark.benchmark(group="index_int")
def test_index_int_tensordict(benchmark, nested_anchor):
    out = benchmark(lambda: nested_anchor[1])
    assert out.batch_size == torch.Size(BATCH[1:])


@pytest.mark.benchmark(group="index_slice")
def test_index_slice_tdfunc(benchmark, nested_td, nested_dict):
    out = benchmark(lambda: nested_td[1:3])
    assert out.batch_size == torch.Size([2, *BATCH[1:]])
    _check_leaves(out, _map(lambda x: x[1:3], nested_dict))


@pytest.mark.benchmark(group="index_slice")
def test_index_slice_baseline(benchmark, nested_dict):
    out = benchmark(lambda: optree.tree_map(lambda x: x[1:3], nested_dict))
    assert out["a"].shape == (2, BATCH[1], 3)


@pytest.mark.benchmark(group="index_slice")
def test_index_slice_tensordict(benchmark, nested_anchor):
    out = benchmark(lambda: nested_anchor[1:3])
    assert out.batch_size == torch.Size([2, *BATCH[1:]])


# ---------------------------------------------------------------- apply
@pytest.mark.benchmark(group="apply")
def test_apply_tdfunc(benchmark, nested_td, nested_dict):
    out = benchmark(lambda: nested_td.apply(lambda x: x + 1))
    _check_leaves(out, _map(lambda x: x + 1, nested_dict))


@pytest.mark.benchmark(group="apply")
def test_apply_baseline(benchmark, nested_dict):
    out = benchmark(lambda: optree.tree_map(lambda x: x + 1, nested_dict))
    assert out["a"].shape == (*BATCH, 3)


@pytest.mark.benchmark(group="apply")
def test_apply_tensordict(benchmark, nested_anchor):
    out = benchmark(lambda: nested_anchor.apply(lambda x: x + 1))
    assert out.batch_size == torch.Size(BATCH)


# ---------------------------------------------------------------- reshape
FLAT = (BATCH[0] * BATCH[1],)


def _reshape_leaf(x):
    return x.reshape(FLAT + x.shape[len(BATCH) :])


@pytest.mark.benchmark(group="reshape")
def test_reshape_tdfunc(benchmark, nested_td, nested_dict):
    out = benchmark(lambda: nested_td.reshape(-1))
    assert out.batch_size == torch.Size(FLAT)
    _check_leaves(out, _map(_reshape_leaf, nested_dict))


@pytest.mark.benchmark(group="reshape")
def test_reshape_baseline(benchmark, nested_dict):
    out = benchmark(lambda: optree.tree_map(_reshape_leaf, nested_dict))
    assert out["a"].shape == (*FLAT, 3)


@pytest.mark.benchmark(group="reshape")
def test_reshape_tensordict(benchmark, nested_anchor):
    out = benchmark(lambda: nested_anchor.reshape(-1))
    assert out.batch_size == torch.Size(FLAT)


# ---------------------------------------------------------------- stack
@pytest.mark.benchmark(group="stack10")
def test_stack10_tdfunc(benchmark, make_nested):
    dicts = [make_nested(seed=i) for i in range(STACK_N)]
    tds = [TensorDict(d, batch_size=BATCH) for d in dicts]
    out = benchmark(lambda: torch.stack(tds, 0))
    assert out.batch_size == torch.Size([STACK_N, *BATCH])
    _check_leaves(out, optree.tree_map(lambda *xs: torch.stack(xs), *dicts))


@pytest.mark.benchmark(group="stack10")
def test_stack10_baseline(benchmark, make_nested):
    dicts = [make_nested(seed=i) for i in range(STACK_N)]
    out = benchmark(lambda: optree.tree_map(lambda *xs: torch.stack(xs), *dicts))
    assert out["a"].shape == (STACK_N, *BATCH, 3)


@pytest.mark.benchmark(group="stack10")
def test_stack10_tensordict(benchmark, make_nested, tensordict_lib):
    cls = tensordict_lib.TensorDict
    tds = [cls(make_nested(seed=i), batch_size=BATCH) for i in range(STACK_N)]
    out = benchmark(lambda: torch.stack(tds, 0))
    assert out.batch_size == torch.Size([STACK_N, *BATCH])


# ---------------------------------------------------------------- unbind
def _unbind_baseline(tree):
    leaves, spec = optree.tree_flatten(tree)
    pieces = [leaf.unbind(0) for leaf in leaves]
    return [optree.tree_unflatten(spec, list(group)) for group in zip(*pieces)]


@pytest.mark.benchmark(group="unbind")
def test_unbind_tdfunc(benchmark, nested_td, nested_dict):
    out = benchmark(lambda: nested_td.unbind(0))
    assert len(out) == BATCH[0]
    for item, expected in zip(out, _unbind_baseline(nested_dict)):
        assert item.batch_size == torch.Size(BATCH[1:])
        _check_leaves(item, expected)


@pytest.mark.benchmark(group="unbind")
def test_unbind_baseline(benchmark, nested_dict):
    out = benchmark(lambda: _unbind_baseline(nested_dict))
    assert len(out) == BATCH[0]


@pytest.mark.benchmark(group="unbind")
def test_unbind_tensordict(benchmark, nested_anchor):
    out = benchmark(lambda: nested_anchor.unbind(0))
    assert len(out) == BATCH[0]


# ---------------------------------------------------------------- clone
@pytest.mark.benchmark(group="clone")
def test_clone_tdfunc(benchmark, nested_td, nested_dict):
    out = benchmark(lambda: nested_td.clone())
    assert out["b", "c"] is not nested_td["b", "c"]
    _check_leaves(out, nested_dict)


@pytest.mark.benchmark(group="clone")
def test_clone_baseline(benchmark, nested_dict):
    out = benchmark(lambda: optree.tree_map(torch.clone, nested_dict))
    _check_leaves(out, nested_dict)


@pytest.mark.benchmark(group="clone")
def test_clone_tensordict(benchmark, nested_anchor):
    out = benchmark(lambda: nested_anchor.clone())
    assert out.batch_size == torch.Size(BATCH)


# ---------------------------------------------------------------- keys of any depth
# One leaf at each depth (``a``, ``b.c``, ``b.d.e``, ``b.d.f.g``), batch ``BATCH``.
# Each case: (the bound method that tdfunc and tensordict run, its arguments given the
# new leaves, what the plain nested dicts run). Bound methods are timed as they are, so
# that no lambda frame of the harness dilutes the difference. A write stores the same
# new tensor every round; ``pop`` puts the entry back.
def _pop_back(td, new):
    td.pop(("b", "d", "e"))
    td["b", "d", "e"] = new["e"]


def _pop_back_dict(tree, new):
    tree["b"]["d"].pop("e")
    tree["b"]["d"]["e"] = new["e"]


def _getitem(*key):
    return (lambda td: td.__getitem__, lambda new: (key if len(key) > 1 else key[0],))


KEY_CASES = {
    "getitem_depth1": (*_getitem("a"), lambda d, new: d["a"]),
    "getitem_depth2": (*_getitem("b", "c"), lambda d, new: d["b"]["c"]),
    "getitem_depth3": (*_getitem("b", "d", "e"), lambda d, new: d["b"]["d"]["e"]),
    "getitem_depth4": (*_getitem("b", "d", "f", "g"), lambda d, new: d["b"]["d"]["f"]["g"]),
    "get_tuple_depth2": (
        lambda td: td.get,
        lambda new: (("b", "c"),),
        lambda d, new: d["b"]["c"],
    ),
    "get_tuple_depth4": (
        lambda td: td.get,
        lambda new: (("b", "d", "f", "g"),),
        lambda d, new: d["b"]["d"]["f"]["g"],
    ),
    "set_tuple_depth2": (
        lambda td: td.set,
        lambda new: (("b", "c"), new["c"]),
        lambda d, new: d["b"].__setitem__("c", new["c"]),
    ),
    "set_tuple_depth4": (
        lambda td: td.set,
        lambda new: (("b", "d", "f", "g"), new["g"]),
        lambda d, new: d["b"]["d"]["f"].__setitem__("g", new["g"]),
    ),
    "setitem_depth3": (
        lambda td: td.__setitem__,
        lambda new: (("b", "d", "e"), new["e"]),
        lambda d, new: d["b"]["d"].__setitem__("e", new["e"]),
    ),
    "in_depth3": (
        lambda td: td.__contains__,
        lambda new: (("b", "d", "e"),),
        lambda d, new: "e" in d["b"]["d"],
    ),
    "in_missing_depth3": (
        lambda td: td.__contains__,
        lambda new: (("b", "d", "x"),),
        lambda d, new: "x" in d["b"]["d"],
    ),
    "pop_depth3": (lambda td: functools.partial(_pop_back, td), lambda new: (new,), _pop_back_dict),
}


def _new_leaves(batch=BATCH) -> dict:
    return {"c": torch.ones(*batch, 4), "e": torch.ones(*batch), "g": torch.ones(*batch, 2)}


def _deep_leaves(tree) -> list:
    """The four leaves of a deep tree (a container or nested dicts), in order."""
    return [tree["a"], tree["b"]["c"], tree["b"]["d"]["e"], tree["b"]["d"]["f"]["g"]]


def _check_key_case(case: str, result, td, make_deep, new: dict) -> None:
    """``td`` and ``result`` are what the same case gives on plain nested dicts."""
    tree = make_deep()
    expected = KEY_CASES[case][2](tree, new)
    for got, want in zip(_deep_leaves(td), _deep_leaves(tree)):
        assert torch.equal(got, want)
    if case.startswith("get"):
        assert torch.equal(result, expected)
    elif case.startswith("in"):
        assert result is expected


@pytest.mark.parametrize("case", KEY_CASES)
def test_keys_tdfunc(benchmark, case, make_deep):
    benchmark.group = case
    tree, new = make_deep(), _new_leaves()
    td = TensorDict(tree, batch_size=BATCH)
    method, args, _ = KEY_CASES[case]
    result = benchmark(method(td), *args(new))
    _check_key_case(case, result, td, make_deep, new)
    if case.startswith("get"):
        assert result is _deep_leaves(td)[int(case[-1]) - 1]  # the stored tensor itself


@pytest.mark.parametrize("case", KEY_CASES)
def test_keys_baseline(benchmark, case, make_deep):
    benchmark.group = case
    tree, new = make_deep(), _new_leaves()
    benchmark(KEY_CASES[case][2], tree, new)


@pytest.mark.parametrize("case", KEY_CASES)
def test_keys_tensordict(benchmark, case, make_deep, tensordict_lib):
    benchmark.group = case
    tree, new = make_deep(), _new_leaves()
    td = tensordict_lib.TensorDict(tree, batch_size=BATCH)
    method, args, _ = KEY_CASES[case]
    result = benchmark(method(td), *args(new))
    _check_key_case(case, result, td, make_deep, new)


# ---------------------------------------------------------------- nn.Parameter leaves
# The parameters of an MLP nested as ``from_module`` nests them (Parameter leaves).
PARAM_CASES = {  # (cls, params, container) -> (bound method, arguments)
    "params_construct": lambda cls, params, td: (cls, (params, [])),
    "params_getitem": lambda cls, params, td: (td.__getitem__, (("2", "weight"),)),
    "params_set": lambda cls, params, td: (td.set, (("2", "weight"), params["2"]["weight"])),
    "params_in": lambda cls, params, td: (td.__contains__, (("2", "weight"),)),
}


def _check_params(case: str, result, params: dict, td) -> None:
    assert type(td["2", "weight"]) is torch.nn.Parameter
    assert td["2", "weight"] is params["2"]["weight"]
    if case == "params_construct":
        assert result["0", "bias"] is params["0"]["bias"]  # stored as given: not copied


@pytest.mark.parametrize("case", PARAM_CASES)
def test_params_tdfunc(benchmark, case, make_params):
    benchmark.group = case
    params = make_params()
    td = TensorDict(params, batch_size=[])
    method, args = PARAM_CASES[case](TensorDict, params, td)
    result = benchmark(method, *args)
    _check_params(case, result, params, td)


@pytest.mark.parametrize("case", PARAM_CASES)
def test_params_tensordict(benchmark, case, make_params, tensordict_lib):
    benchmark.group = case
    params = make_params()
    cls = tensordict_lib.TensorDict
    td = cls(params, batch_size=[])
    method, args = PARAM_CASES[case](cls, params, td)
    benchmark(method, *args)


# ---------------------------------------------------------------- batch rank 1 and 3
# Construction, a nested write and int / tensor / mask indexing for batch ``[4]`` and
# ``[2, 3, 4]`` (rank 2, ``BATCH``, is the rest of this file; tensor and mask indexing
# run at rank 2 too). A mask keeps every other element; the tensor index repeats one.
RANKS = {1: (4,), 2: BATCH, 3: (2, 3, 4)}
RANK_CASES = [
    *[(case, rank) for case in ("construct", "set_tuple", "index_int") for rank in (1, 3)],
    *[(case, rank) for case in ("index_tensor", "index_mask") for rank in (1, 2, 3)],
]
RANK_IDS = [f"{case}_rank{rank}" for case, rank in RANK_CASES]


def _index_for(case: str, batch: tuple):
    if case == "index_int":
        return 1
    if case == "index_tensor":
        return torch.tensor([0, 1, 1, batch[0] - 1])
    mask = torch.zeros(batch, dtype=torch.bool)
    mask.view(-1)[::2] = True
    return mask


def _rank_case(case: str, rank: int, make_nested, cls=None):
    """``(function to time, reference result computed on plain tensors)``."""
    batch = RANKS[rank]
    tree = make_nested(batch)
    a, c, d = tree["a"], tree["b"]["c"], tree["b"]["d"]
    if case == "construct":
        size = list(batch)
        if cls is None:
            return (lambda: {"a": a, "b": {"c": c, "d": d}}), tree
        return (lambda: cls({"a": a, "b": {"c": c, "d": d}}, batch_size=size)), tree
    if case == "set_tuple":
        new = torch.ones(*batch, 4, 5)
        expected = {"a": a, "b": {"c": new, "d": d}}
        if cls is None:
            return (lambda: tree["b"].__setitem__("c", new) or tree), expected
        td = cls(tree, batch_size=list(batch))
        return (lambda: td.set(("b", "c"), new)), expected
    index = _index_for(case, batch)
    expected = _map(lambda x: x[index], tree)
    if cls is None:
        return (lambda: optree.tree_map(lambda x: x[index], tree)), expected
    td = cls(tree, batch_size=list(batch))
    return (lambda: td[index]), expected


@pytest.mark.parametrize(("case", "rank"), RANK_CASES, ids=RANK_IDS)
def test_rank_tdfunc(benchmark, case, rank, make_nested):
    benchmark.group = f"{case}_rank{rank}"
    fn, expected = _rank_case(case, rank, make_nested, TensorDict)
    _check_leaves(benchmark(fn), expected)


@pytest.mark.parametrize(("case", "rank"), RANK_CASES, ids=RANK_IDS)
def test_rank_baseline(benchmark, case, rank, make_nested):
    benchmark.group = f"{case}_rank{rank}"
    fn, expected = _rank_case(case, rank, make_nested)
    _check_leaves(benchmark(fn), expected)


@pytest.mark.parametrize(("case", "rank"), RANK_CASES, ids=RANK_IDS)
def test_rank_tensordict(benchmark, case, rank, make_nested, tensordict_lib):
    benchmark.group = f"{case}_rank{rank}"
    fn, expected = _rank_case(case, rank, make_nested, tensordict_lib.TensorDict)
    _check_leaves(benchmark(fn), expected)
