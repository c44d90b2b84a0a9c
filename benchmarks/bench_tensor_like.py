"""Reductions and pointwise math: a TensorDict beside ``optree.tree_map`` over nested dicts.

Data: three leaves, one level of nesting (``{"a", "b": {"c", "d"}}``, batch ``[4, 6]``,
from ``conftest.py``). Each group times the tdfunc method and ``optree.tree_map``
doing the same per-leaf work on the same data as plain nested dicts (the target is
tdfunc within 1.3x of optree). Run single-threaded, side by side, and read the ratio
of medians::

    OMP_NUM_THREADS=1 python -m pytest benchmarks/bench_tensor_like.py \
        --benchmark-enable -q --benchmark-columns=median
"""

from __future__ import annotations

import optree
import pytest
import torch

# (group, tdfunc call, the same per-leaf work on one tensor)
CASES = [
    ("sum_all", lambda td: td.sum(), lambda t: t.sum()),
    ("sum_dim0", lambda td: td.sum(0), lambda t: t.sum(0)),
    ("mean_dim1_keepdim", lambda td: td.mean(1, keepdim=True), lambda t: t.mean(1, keepdim=True)),
    ("std_dim0", lambda td: td.std(0), lambda t: t.std(0)),
    ("amax_all", lambda td: td.amax(), lambda t: t.amax()),
    ("max_dim0", lambda td: td.max(0), lambda t: t.max(0)),
    ("cumsum_dim1", lambda td: td.cumsum(1), lambda t: t.cumsum(1)),
    ("softmax_dim0", lambda td: td.softmax(0), lambda t: t.softmax(0)),
    ("exp", lambda td: td.exp(), torch.exp),
    ("abs", lambda td: td.abs(), torch.abs),
    ("clamp", lambda td: td.clamp(-0.5, 0.5), lambda t: t.clamp(-0.5, 0.5)),
    ("isnan", lambda td: td.isnan(), torch.isnan),
    ("torch_mean_dim0", lambda td: torch.mean(td, 0), lambda t: torch.mean(t, 0)),
    ("norm", lambda td: td.norm(), torch.linalg.vector_norm),
]
IN_PLACE = [
    ("exp_", lambda td: td.mul_(0.0).exp_(), lambda t: t.mul_(0.0).exp_()),
    ("clamp_", lambda td: td.clamp_(-0.5, 0.5), lambda t: t.clamp_(-0.5, 0.5)),
]


def _values(out):
    """The values of a ``(values, indices)`` named tuple, else ``out``."""
    return out.values if isinstance(out, tuple) and hasattr(out, "indices") else out


def _check(td_out, dict_out) -> None:
    """The container result equals the tree_map result, key path by key path."""
    got = {k if isinstance(k, tuple) else (k,): v for k, v in _values(td_out).items(True, True)}
    paths, leaves, _ = optree.tree_flatten_with_path(
        optree.tree_map(_values, dict_out, is_leaf=lambda x: hasattr(x, "indices"))
    )
    assert set(got) == set(paths)
    for path, leaf in zip(paths, leaves):
        torch.testing.assert_close(got[path], leaf)


@pytest.mark.parametrize("case", CASES + IN_PLACE, ids=[c[0] for c in CASES + IN_PLACE])
def test_tdfunc(benchmark, case, nested_td, nested_dict):
    group, td_call, leaf_call = case
    benchmark.group = group
    if case not in IN_PLACE:
        _check(td_call(nested_td), optree.tree_map(leaf_call, nested_dict))
    benchmark(td_call, nested_td)


@pytest.mark.parametrize("case", CASES + IN_PLACE, ids=[c[0] for c in CASES + IN_PLACE])
def test_optree_tree_map(benchmark, case, nested_dict):
    group, _, leaf_call = case
    benchmark.group = group
    benchmark(optree.tree_map, leaf_call, nested_dict)
