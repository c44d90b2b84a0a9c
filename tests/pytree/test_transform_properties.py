"""Property test: random containers through random compositions of ``torch.func`` transforms.

Hypothesis draws a nested container (TensorDict levels, some of them a TensorClass
with a non-tensor field between its tensors, a non-tensor entry at a random place,
dim names on the root), and a random composition of ``vmap`` (any ``in_dims`` /
``out_dims`` among the batch dims, ``chunk_size``, ``randomness``), ``jvp``,
``vjp``, ``grad`` and ``tree_map``. The same composition runs on the plain nested
dicts (torch's own pytree, no tdfunc): every leaf must be equal, and every level
must come back of its class, with its keys in order and the batch size and names
that the composition implies (a mapped dim moves from ``in_dims`` to ``out_dims``
and loses its name).

A second property: ``jacrev`` and ``jacfwd`` (container in, container out; tensor
in, container out; several ``argnums``) equal the plain-dict jacobians and give the
same containers. Its sizes are all distinct, so that no leaf shape can be read two
ways.
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.func import grad, jacfwd, jacrev, jvp, vjp, vmap

from tdfunc import NonTensorData, NonTensorStack, TensorClass, TensorDict, is_tensor_collection


class Node(TensorClass):
    a: torch.Tensor
    tag: str
    sub: TensorDict


# ---------------------------------------------------------------- containers
@st.composite
def _level(draw, batch: tuple, depth: int, sizes, generator: torch.Generator, small: bool):
    """``(container, plain dict)`` of one level with batch size ``batch``.

    ``sizes``: ``(strategy of feature sizes, strategy of extra batch sizes)``;
    ``small``: at most two entries a level, one level of nesting, one feature dim.
    """
    feature_sizes, extra_sizes = sizes
    data: dict = {}
    plain: dict = {}
    for index in range(draw(st.integers(1, 2 if small else 3))):
        key = f"k{index}"
        if depth < 2 - small and draw(st.integers(0, 3)) == 0:
            extra = tuple(draw(extra_sizes) for _ in range(draw(st.integers(0, 1))))
            data[key], plain[key] = draw(_level(batch + extra, depth + 1, sizes, generator, small))
        else:
            rank = draw(st.integers(0, 1 if small else 2))
            feature = tuple(draw(feature_sizes) for _ in range(rank))
            data[key] = plain[key] = torch.randn(batch + feature, generator=generator)
    if draw(st.booleans()):  # a non-tensor entry among the others
        items = list(data.items())
        items.insert(draw(st.integers(0, len(items))), ("note", f"depth {depth}"))
        data = dict(items)
    level = TensorDict(data, list(batch))
    if depth and draw(st.integers(0, 2)) == 0:
        a = torch.randn(batch, generator=generator)
        node = Node(a=a, tag="t", sub=level, batch_size=list(batch))
        return node, {"a": a, "sub": plain}
    return level, plain


@st.composite
def containers(draw, sizes, small: bool = False, feature_sizes=None):
    """``(container, plain dict)``; ``sizes``: (root batch sizes, extra batch sizes of
    nested levels); the root's are all different (with equal sizes the place where
    ``vmap`` put its dim, and so its name, cannot be told from the shapes).
    ``feature_sizes``: the leaves' feature sizes (by default the root's)."""
    rank = draw(st.integers(0, 1 if small else 2))
    batch = tuple(draw(st.lists(sizes[0], min_size=rank, max_size=rank, unique=True)))
    sizes = (sizes[0] if feature_sizes is None else feature_sizes, sizes[1])
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    container, plain = draw(_level(batch, 0, sizes, generator, small))
    if rank and draw(st.booleans()):
        container.names = [f"d{i}" for i in range(rank)]
    return container, plain


# ---------------------------------------------------------------- transforms
def _elementwise(tree):
    return pytree.tree_map(lambda x: x.sin() * 2 + x * x, tree)


def _total(tree):
    return sum(leaf.sum() for leaf in pytree.tree_leaves(tree))


@st.composite
def compositions(draw, ndim: int, depth: int = 0):
    """``(function, what it does to the root's batch dims and names, description)``.

    The action maps a list (sizes or names) to the output's list; a dim that
    ``vmap`` maps comes back unnamed (``None``) where it lands.
    """
    kinds = ["elementwise", "tree_map", "jvp", "vjp", "grad"] + ["vmap"] * 3 * (ndim > 0)
    kind = draw(st.sampled_from(kinds)) if depth < 3 else "elementwise"
    if kind == "elementwise":
        return _elementwise, (lambda dims, mapped: dims), "elementwise"
    if kind == "tree_map":
        return (lambda t: pytree.tree_map(lambda x: x * 3, t)), (lambda d, m: d), "tree_map"
    inner, act, text = draw(compositions(ndim - (kind == "vmap"), depth + 1))
    if kind == "jvp":

        def tangent(tree, inner=inner):
            return jvp(inner, (tree,), (pytree.tree_map(torch.ones_like, tree),))[1]

        return tangent, act, f"jvp({text})"
    if kind == "vjp":

        def pullback(tree, inner=inner):
            out, back = vjp(inner, tree)
            return back(pytree.tree_map(torch.ones_like, out))[0]

        return pullback, (lambda d, m: d), f"vjp({text})"
    if kind == "grad":
        return grad(lambda t, inner=inner: _total(inner(t))), (lambda d, m: d), f"grad({text})"
    in_dim = draw(st.integers(0, ndim - 1))
    out_dim = draw(st.integers(0, ndim - 1))
    chunk = draw(st.sampled_from([None, 1, 2]))
    randomness = draw(st.sampled_from(["error", "same", "different"]))

    def moved(dims, mapped, act=act, i=in_dim, o=out_dim):
        dims = list(dims)
        size = dims.pop(i)
        dims = list(act(dims, mapped))
        dims.insert(o, mapped(size))
        return dims

    mapped = vmap(inner, in_dims=in_dim, out_dims=out_dim, chunk_size=chunk, randomness=randomness)
    return mapped, moved, f"vmap({text}, {in_dim}, {out_dim}, chunk_size={chunk})"


# ---------------------------------------------------------------- checks
def _leaves(tree) -> dict:
    return {
        tuple(getattr(entry, "key", getattr(entry, "idx", None)) for entry in path): leaf
        for path, leaf in pytree.tree_flatten_with_path(tree)[0]
    }


def _assert_same_leaves(result, reference, what: str) -> None:
    got, want = _leaves(result), _leaves(reference)
    assert list(got) == list(want), what
    for key, expected in want.items():
        assert isinstance(got[key], torch.Tensor), (what, key)
        assert got[key].shape == expected.shape, (what, key)
        assert torch.allclose(got[key], expected, atol=1e-5), (what, key)


def _levels(container, at: tuple = ()) -> dict:
    """``{path: (class, keys, batch size, names)}`` of every level."""
    view = container._to_tensordict_view()
    out = {at: (type(container), list(view._data), tuple(view._batch_size), view.names)}
    for key, value in view._data.items():
        # a non-tensor leaf counts as a collection (as in tensordict) but is no level
        if is_tensor_collection(value) and not isinstance(value, (NonTensorData, NonTensorStack)):
            out.update(_levels(value, at + (key,)))
    return out


def _expected_levels(container, act) -> dict:
    root = container.batch_dims
    out = {}
    for at, (cls, keys, batch, names) in _levels(container).items():
        new_batch = tuple(act(list(batch[:root]), lambda size: size)) + batch[root:]
        new_names = list(act(list(names[:root]), lambda name: None)) + list(names[root:])
        out[at] = (cls, keys, new_batch, new_names)
    return out


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# root batch sizes 3 to 5, none equal to a chunk (1 or 2) or to an extra nested dim (6)
@given(
    case=containers((st.integers(3, 5), st.just(6)), feature_sizes=st.integers(1, 3)),
    data=st.data(),
)
def test_transform_compositions_match_plain_dicts(case, data):
    container, plain = case
    function, act, text = data.draw(compositions(container.batch_dims))
    torch.manual_seed(0)
    result = function(container)
    torch.manual_seed(0)
    reference = function(plain)
    _assert_same_leaves(result, reference, text)
    assert _levels(result) == _expected_levels(container, act), text


@st.composite
def jacobian_cases(draw):
    # every dim a size of its own (2 to 13): no leaf shape can be read two ways
    order = iter(draw(st.permutations(range(2, 14))))
    sizes = st.builds(lambda: next(order))
    container, plain = draw(containers((sizes, sizes), small=True))
    shape = tuple(next(order) for _ in range(draw(st.integers(0, 1))))
    x = torch.randn(shape, generator=torch.Generator().manual_seed(draw(st.integers(0, 99))))
    return container, plain, x


def _containers_of(tree, at: tuple = ()) -> dict:
    """``{path: (class, batch size)}`` of every container in ``tree`` (tuples too)."""
    out = {}
    if isinstance(tree, tuple):
        for index, item in enumerate(tree):
            out.update(_containers_of(item, at + (index,)))
    elif is_tensor_collection(tree) and not isinstance(tree, (NonTensorData, NonTensorStack)):
        out[at] = (type(tree), tuple(tree.batch_size))
        for key, value in tree._to_tensordict_view()._data.items():
            out.update(_containers_of(value, at + (key,)))
    return out


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=jacobian_cases())
def test_jacrev_and_jacfwd_match_plain_dicts_and_each_other(case):
    container, plain, x = case

    def of_tensor(tree):
        return lambda x: pytree.tree_map(lambda leaf: leaf * (x.sum().sin() + 2), tree)

    def two_args(tree, x):
        return pytree.tree_map(lambda leaf: leaf * x.sum(), _elementwise(tree))

    jobs = {
        "container to container": (lambda t: t, {}, lambda tree: (_elementwise, (tree,))),
        "argnums tuple": (lambda t: t, {"argnums": (0, 1)}, lambda tree: (two_args, (tree, x))),
        "tensor to container": (lambda t: t, {}, lambda tree: (of_tensor(tree), (x,))),
    }
    for name, (_, options, build) in jobs.items():
        found = {}
        for transform in (jacrev, jacfwd):
            function, args = build(container)
            result = transform(function, **options)(*args)
            function, args = build(plain)
            _assert_same_leaves(result, transform(function, **options)(*args), name)
            found[transform] = _containers_of(result)
        assert found[jacrev] == found[jacfwd], name
