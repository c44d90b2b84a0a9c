"""The pytree path: a TensorDict beside the same data as plain nested dicts.

Data: three leaves, one of them nested (``{"a", "b": {"c", "d"}}``, batch
``[4, 6]``, from ``conftest.py``). Every ``torch.func`` transform flattens
its arguments and unflattens its results through these functions, and
``vmap`` walks its argument tree four times per call, so their cost is the
overhead a TensorDict adds to a transform.

- ``flatten`` / ``unflatten``: ``torch.utils._pytree.tree_flatten`` and
  ``tree_unflatten``;
- ``tree_map``: ``tree_map(lambda x: x + 1, tree)``;
- ``vmap_identity``: ``torch.func.vmap(lambda t: t)(tree)`` (no compute: the
  pytree work and vmap's own);
- ``grad``: ``torch.func.grad`` of a small loss over the three leaves.

Each group times tdfunc, the plain-dict baseline and, when installed, the
``tensordict`` library (its benchmarks come last in this file: importing
``tensordict`` patches ``torch._functorch.vmap`` for the rest of the process).
Read the ratio of medians from one run:

    .venv-bench/bin/python -m pytest benchmarks/bench_pytree.py --benchmark-enable -q
"""

from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree
from torch.func import grad, vmap


def _same_leaves(tree, reference) -> None:
    got, want = pytree.tree_leaves(tree), pytree.tree_leaves(reference)
    assert len(got) == len(want)
    assert all(torch.allclose(a, b) for a, b in zip(got, want))


def _loss(tree):
    return tree["a"].sin().sum() + (tree["b"]["c"] ** 2).sum() + tree["b"]["d"].tanh().sum()


def _run(benchmark, group: str, tree, reference: dict):
    """Time ``group`` on ``tree`` and check the result against the same on ``reference``.

    Each operation runs once on the reference first: that also warms up
    ``torch.func`` (its first call loads decompositions), which would
    otherwise skew pytest-benchmark's calibration.
    """
    if group == "flatten":
        expected = pytree.tree_leaves(reference)
        leaves, _ = benchmark(pytree.tree_flatten, tree)
        _same_leaves(leaves, expected)
    elif group == "unflatten":
        expected = pytree.tree_unflatten(*pytree.tree_flatten(reference))
        leaves, spec = pytree.tree_flatten(tree)
        out = benchmark(pytree.tree_unflatten, leaves, spec)
        assert type(out) is type(tree)
        _same_leaves(out, expected)
    elif group == "tree_map":
        expected = pytree.tree_map(lambda x: x + 1, reference)
        out = benchmark(pytree.tree_map, lambda x: x + 1, tree)
        _same_leaves(out, expected)
    elif group == "vmap_identity":
        identity = vmap(lambda t: t)
        expected = identity(reference)
        out = benchmark(identity, tree)
        _same_leaves(out, expected)
    elif group == "grad":
        gradient = grad(_loss)
        expected = gradient(reference)
        out = benchmark(gradient, tree)
        _same_leaves(out, expected)
    else:
        raise ValueError(group)


GROUPS = ["flatten", "unflatten", "tree_map", "vmap_identity", "grad"]


@pytest.mark.parametrize("group", GROUPS)
def test_tdfunc(benchmark, group, nested_td, nested_dict):
    benchmark.group = group
    _run(benchmark, group, nested_td, nested_dict)


@pytest.mark.parametrize("group", GROUPS)
def test_baseline(benchmark, group, nested_dict):
    benchmark.group = group
    _run(benchmark, group, nested_dict, nested_dict)


# ---------------------------------------------------------------- tensordict (last)
@pytest.mark.parametrize("group", GROUPS)
def test_tensordict(benchmark, group, nested_anchor, nested_dict):
    benchmark.group = group
    _run(benchmark, group, nested_anchor, nested_dict)
