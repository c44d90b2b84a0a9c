"""Differential test: container methods against plain torch applied to each leaf.

Hypothesis draws a batch size (0 to 2 dims, sizes 0 to 3), a nested level with extra
batch dims of its own, leaves with feature dims, a dtype, and TensorDict or TensorClass;
then one op. Every leaf must equal torch's result on that leaf, and the batch size of
every level must be the shape torch gives a tensor of that level's batch shape (so it
describes the leaves). Where torch raises on some leaf, the container op must raise too.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tdfunc import TensorClass, TensorDict

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool, torch.complex64]


class Pair(TensorClass):
    a: torch.Tensor
    n: TensorDict


def _tensor(shape: tuple, dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=generator).to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=generator) > 0.5
    return torch.randint(-3, 4, shape, generator=generator, dtype=dtype)


@st.composite
def cases(draw):
    rank = draw(st.sampled_from([2, 1, 0]))  # shrinks towards the richer cases
    batch = tuple(draw(st.lists(st.integers(0, 3), min_size=rank, max_size=rank)))
    extra = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))
    feature = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=1)))
    dtype = draw(st.sampled_from(DTYPES))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    leaves = {
        ("a",): _tensor(batch + feature, dtype, generator),
        ("n", "b"): _tensor(batch + extra + feature, dtype, generator),
    }
    if draw(st.booleans()):  # a non-contiguous leaf
        t = leaves[("n", "b")]
        if t.dim() >= 2:
            leaves[("n", "b")] = t.transpose(0, -1).contiguous().transpose(0, -1)
    nested = TensorDict({"b": leaves[("n", "b")]}, list(batch + extra))
    if draw(st.booleans()):
        container = Pair(a=leaves[("a",)], n=nested, batch_size=list(batch))
    else:
        container = TensorDict({"a": leaves[("a",)], "n": nested}, list(batch))
    return container, leaves, {(): batch, ("n",): batch + extra}


def _dims(draw, rank: int):
    """A dim argument over the first ``rank`` batch dims: an int or a tuple, maybe negative."""
    dim = draw(st.integers(-rank, rank - 1))
    if draw(st.booleans()):
        return dim
    others = draw(st.lists(st.integers(0, rank - 1), max_size=rank, unique=True))
    dims = {dim % rank, *others}
    return tuple(d - rank if draw(st.booleans()) else d for d in sorted(dims))


def ops_for(draw, rank: int) -> tuple:
    """``(name, op on the container, op on one leaf)``: leaf ops see the top level's dims."""
    options = []
    if rank == 2:
        options += ["transpose", "flatten"]
    if rank:
        options += ["reduce", "quantile", "maxdim", "scan", "flip", "roll", "unsqueeze"]
        options += ["expand", "repeat", "stack", "cat", "where", "unbind", "split", "gather"]
        options += ["grow"]
    options += ["scalar", "pair", "eq", "clamp", "neg", "norm", "sum_all", "amax_all", "keep_all"]
    name = draw(st.sampled_from(options))
    if name == "scalar":
        value = draw(st.sampled_from([2, 0.5, -1]))
        return name, lambda x: x * value + 1, lambda t: t * value + 1
    if name == "pair":
        return name, lambda x: x - x * 2, lambda t: t - t * 2
    if name == "eq":
        return name, lambda x: (x == x.clone()) & (x >= 0), lambda t: (t == t) & (t >= 0)
    if name == "clamp":
        return name, lambda x: x.clamp(-1, 1), lambda t: t.clamp(-1, 1)
    if name == "neg":
        return name, lambda x: -x, lambda t: -t
    if name in ("norm", "sum_all", "amax_all"):
        method = {"norm": "norm", "sum_all": "sum", "amax_all": "amax"}[name]

        def leaf(t):
            return torch.linalg.vector_norm(t) if name == "norm" else getattr(t, method)()

        return name, lambda x: getattr(x, method)(), leaf
    if name == "keep_all":  # no dim, keepdim=True: every dim of every leaf kept with size 1
        method = draw(st.sampled_from(["sum", "mean", "amax", "std", "nansum"]))
        return (
            f"{method}(keepdim=True)",
            lambda x: getattr(x, method)(keepdim=True),
            lambda t: getattr(t, method)(dim=None, keepdim=True),
        )
    if name == "reduce":
        methods = ["sum", "mean", "amax", "amin", "prod", "std", "var", "nansum", "logsumexp"]
        method = draw(st.sampled_from(methods))
        dims, keep = _dims(draw, rank), draw(st.booleans())
        if method == "prod" and not isinstance(dims, int):
            dims = dims[0]  # torch.prod takes one dim
        kwargs = {"correction": draw(st.integers(0, 2))} if method in ("std", "var") else {}
        # negative dims count from the end of the batch dims, not of each leaf's dims
        leaf_dims = dims % rank if isinstance(dims, int) else tuple(x % rank for x in dims)
        return (
            f"{method}({dims}, keepdim={keep}, {kwargs})",
            lambda x: getattr(x, method)(dims, keepdim=keep, **kwargs),
            lambda t: getattr(t, method)(leaf_dims, keepdim=keep, **kwargs),
        )
    if name == "quantile":
        q = draw(st.sampled_from([0.3, (0.1, 0.9)]))
        dim, keep = draw(st.integers(-rank, rank - 1)), draw(st.booleans())

        def quantile(t):
            # tdfunc takes integer and bool leaves as floats; complex ones are refused
            t = t if t.is_floating_point() or t.is_complex() else t.float()
            qs = torch.tensor(q, dtype=t.dtype) if isinstance(q, tuple) else q
            return torch.quantile(t, qs, dim % rank, keep)

        return f"quantile({q}, {dim})", lambda x: x.quantile(q, dim, keep), quantile
    if name == "maxdim":
        method, part = draw(st.sampled_from(["max", "min"])), draw(st.sampled_from([0, 1]))
        dim, keep = draw(st.integers(-rank, rank - 1)), draw(st.booleans())
        return (
            f"{method}({dim})[{part}]",
            lambda x: getattr(x, method)(dim, keepdim=keep)[part],
            lambda t: getattr(t, method)(dim % rank, keepdim=keep)[part],
        )
    if name == "scan":
        method, dim = (
            draw(st.sampled_from(["cumsum", "cumprod", "softmax"])),
            draw(st.integers(-rank, rank - 1)),
        )
        leaf_dim = dim % rank
        return (
            f"{method}({dim})",
            lambda x: getattr(x, method)(dim),
            lambda t: getattr(t, method)(leaf_dim),
        )
    dim = draw(st.integers(-rank, rank - 1))
    d = dim % rank  # leaves have more dims than the batch: negative dims differ
    if name == "flip":
        return name, lambda x: x.flip(dim), lambda t: t.flip(d)
    if name == "roll":
        shift = draw(st.integers(-3, 3))
        return name, lambda x: x.roll(shift, dim), lambda t: t.roll(shift, d)
    if name == "unsqueeze":
        u = draw(st.integers(-rank - 1, rank))
        return name, lambda x: x.unsqueeze(u), lambda t: t.unsqueeze(u % (rank + 1))
    if name == "transpose":
        return name, lambda x: x.transpose(0, -1), lambda t: t.transpose(0, 1)
    if name == "flatten":
        return name, lambda x: x.flatten(0, -1), lambda t: t.flatten(0, 1)
    if name == "expand":
        return name, lambda x: x.expand(2, *x.batch_size), lambda t: t.expand(2, *t.shape)
    if name == "repeat":
        times = [1] * rank
        times[d] = 2
        return (
            name,
            lambda x: x.repeat(*times),
            lambda t: t.repeat(*times, *[1] * (t.dim() - rank)),
        )
    if name == "stack":  # a new dim: -1 is after the last batch dim
        s = draw(st.integers(-rank - 1, rank))
        return (
            name,
            lambda x: torch.stack([x, x + x], s),
            lambda t: torch.stack([t, t + t], s % (rank + 1)),
        )
    if name == "cat":
        return name, lambda x: torch.cat([x, x + x], dim), lambda t: torch.cat([t, t + t], d)
    if name == "where":
        mask = torch.arange(4).remainder(2).bool()

        def where_leaf(t):
            m = mask[: t.shape[0]].reshape(-1, *[1] * (t.dim() - 1))
            return torch.where(m, t, t + t)

        def where(x):
            m = mask[: x.batch_size[0]].reshape(-1, *[1] * (rank - 1)).expand(x.batch_size)
            return x.where(m, x + x)

        return name, where, where_leaf
    if name == "grow":  # a batch dim of size 1 broadcast by the other container
        return name, lambda x: x[:1] * x, lambda t: t[:1] * t
    if name == "unbind":
        return name, lambda x: x.unbind(dim), lambda t: t.unbind(d)
    if name == "split":
        return name, lambda x: x.split(2, dim), lambda t: t.split(2, d)
    # gather: an index along batch dim d, shaped like the batch
    return (
        name,
        lambda x: x.gather(dim, _gather_index(x.batch_size, d)),
        lambda t: t.gather(d, _expand_index(_gather_index(t.shape[:rank], d), t)),
    )


def _gather_index(batch: torch.Size, d: int) -> torch.Tensor:
    size = batch[d]
    return (torch.arange(int(torch.tensor(batch).prod())).reshape(batch) % max(size, 1)).flip(d)


def _expand_index(index: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    extra = t.dim() - index.dim()
    return index.reshape(*index.shape, *[1] * extra).expand(*index.shape, *t.shape[index.dim() :])


def _levels(out) -> dict:
    """``{level key: (batch size, {leaf key: tensor})}`` read from a result container."""
    td = out.to_tensordict() if isinstance(out, TensorClass) else out
    levels = {(): (tuple(td.batch_size), {})}
    for key, value in td.items(include_nested=True):
        key = key if isinstance(key, tuple) else (key,)
        if isinstance(value, torch.Tensor):
            levels[key[:-1]][1][key] = value
        else:
            levels[key] = (tuple(value.batch_size), {})
    return levels


def _check(out, leaves: dict, batches: dict, leaf_op, name: str) -> None:
    levels = _levels(out)
    assert set(levels) == set(batches), name
    for level, (batch, got) in levels.items():
        # the batch size torch gives a tensor of the level's batch shape
        expected = leaf_op(torch.zeros(batches[level], dtype=torch.float64)).shape
        if name in ("norm", "sum_all", "amax_all"):
            expected = torch.Size([])
        assert batch == tuple(expected), (name, level, batch, expected)
        for key, value in got.items():
            reference = leaf_op(leaves[key])
            assert value.shape == reference.shape and value.dtype == reference.dtype, (name, key)
            torch.testing.assert_close(value, reference, equal_nan=True, rtol=1e-3, atol=1e-3)
            assert value.shape[: len(batch)] == batch, (name, key)


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=cases(), data=st.data())
def test_container_ops_match_torch_on_each_leaf(case, data):
    container, leaves, batches = case
    rank = len(batches[()])
    name, op, leaf_op = ops_for(data.draw, rank)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own (std with too few elements...)
        try:
            references = [leaf_op(t) for t in leaves.values()]
            leaf_op(torch.zeros(batches[("n",)], dtype=torch.float64))
        except (RuntimeError, IndexError, TypeError, ValueError):
            references = None
        if references is None:  # torch refuses some leaf: the container must refuse too
            with pytest.raises((RuntimeError, IndexError, TypeError, ValueError)):
                op(container)
            return
        out = op(container)
    if isinstance(out, (tuple, list)):
        assert len(out) == len(leaf_op(leaves[("a",)])), name
        for i, piece in enumerate(out):
            _check(piece, leaves, batches, lambda t, i=i: leaf_op(t)[i], name)
        return
    assert type(out) is type(container), name
    _check(out, leaves, batches, leaf_op, name)
