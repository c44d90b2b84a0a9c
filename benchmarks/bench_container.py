"""TensorDict core operations beside plain nested dicts (optree) and ``tensordict``.

Data: three leaves (one nested one level down), batch size ``[4, 6]``. The
baseline does the same work on plain nested dicts, with ``optree.tree_map``
where a map over leaves is needed. Targets (ratios of medians): indexing,
apply, reshape, stack, unbind, clone within 1.5x of the baseline; construction
at least 3x and nested get/set at least 2x faster than ``tensordict``.
"""

from __future__ import annotations

import optree
import pytest
import torch

from tdfunc import TensorDict

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
