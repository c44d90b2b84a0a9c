"""Property tests: indexing and shape ops on a TensorDict commute with the same op on each leaf.

The reference never goes through tdfunc: each leaf is cut into batch-shaped
tensors, one per feature element (``leaf[..., f]`` after flattening the
feature dims), the op is applied to each with plain torch, and the results are
stacked back. That is "the op on the batch dims, with the feature dims kept",
by construction.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tdfunc import TensorDict

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DTYPES = [torch.float32, torch.int64, torch.bool, torch.float64]


# ---------------------------------------------------------------- reference
def per_feature(tensors: list[torch.Tensor], ndim: int, op):
    """Apply ``op`` (batch-shaped tensors -> tensor or tuple) to every feature element."""
    first = tensors[0]
    feature = first.shape[ndim:]
    count = math.prod(feature)
    flat = [t.reshape((*t.shape[:ndim], count)) for t in tensors]
    if count == 0:
        probe = op([torch.zeros(t.shape[:ndim]) for t in tensors])

        def make(r):
            return torch.empty((*r.shape, *feature), dtype=first.dtype)

        return tuple(make(r) for r in probe) if isinstance(probe, (tuple, list)) else make(probe)
    outs = [op([x[..., f] for x in flat]) for f in range(count)]
    if isinstance(outs[0], (tuple, list)):
        return tuple(
            torch.stack([o[i] for o in outs], -1).reshape((*outs[0][i].shape, *feature))
            for i in range(len(outs[0]))
        )
    return torch.stack(outs, -1).reshape((*outs[0].shape, *feature))


def batch_result(batch: list[int], op, copies: int = 1):
    """What ``op`` does to the batch shape (a stand-in tensor with only batch dims)."""
    probe = op([torch.zeros(batch) for _ in range(copies)])
    if isinstance(probe, (tuple, list)):
        return [p.shape for p in probe]
    return probe.shape


# ---------------------------------------------------------------- strategies
@st.composite
def structures(draw, min_dims: int = 0, max_dims: int = 3, min_size: int = 0):
    """(plain nested dict of tensors, batch size, extra batch dims of the nested dict)."""
    batch = draw(st.lists(st.integers(min_size, 4), min_size=min_dims, max_size=max_dims))
    features = st.lists(st.integers(0, 3), min_size=0, max_size=2)
    extra = draw(st.lists(st.integers(1, 2), max_size=1))
    counter = [0]

    def leaf(shape):
        dtype = draw(st.sampled_from(DTYPES))
        numel = math.prod(shape)
        values = torch.arange(counter[0], counter[0] + numel).reshape(shape)
        counter[0] += numel
        return values % 2 == 0 if dtype is torch.bool else values.to(dtype)

    source = {"a": leaf(batch + draw(features))}
    if draw(st.booleans()):
        source["n"] = {
            "b": leaf(batch + extra + draw(features)),
            "m": {"c": leaf(batch + extra + draw(features))},
        }
    return source, batch, extra


def to_td(source: dict, batch: list[int], extra: list[int], with_text: bool = False):
    source = dict(source)
    if "n" in source:
        source["n"] = TensorDict(source["n"], batch_size=batch + extra)
    td = TensorDict(source, batch_size=batch)
    if with_text:
        td["s"] = "text"
    return td


def leaf_paths(source: dict, prefix=()):
    for key, value in source.items():
        if isinstance(value, dict):
            yield from leaf_paths(value, prefix + (key,))
        else:
            yield prefix + (key,), value


@st.composite
def indices(draw, batch: list[int], allow_advanced: bool = True, unique: bool = False):
    """An index over the batch dims: ints, slices, None, ..., masks, int tensors, lists."""
    parts = []
    for size in batch:
        options = ["slice"]
        if size > 0:
            options.append("int")
        if allow_advanced:
            options += ["mask", "tensor", "list"] if size > 0 else ["mask"]
        kind = draw(st.sampled_from(options))
        if kind == "int":
            parts.append(draw(st.integers(-size, size - 1)))
        elif kind == "slice":
            start = draw(st.none() | st.integers(-size - 1, size + 1))
            stop = draw(st.none() | st.integers(-size - 1, size + 1))
            step = draw(st.none() | st.integers(1, 3))
            parts.append(slice(start, stop, step))
        elif kind == "mask":
            parts.append(torch.tensor(draw(st.lists(st.booleans(), min_size=size, max_size=size))))
        else:
            values = st.integers(-size, size - 1)
            chosen = draw(
                st.lists(values, min_size=0, max_size=3, unique_by=lambda i, n=size: i % n)
                if unique
                else st.lists(values, min_size=0, max_size=3)
            )
            parts.append(torch.tensor(chosen, dtype=torch.long) if kind == "tensor" else chosen)
    # use fewer components than batch dims (the rest is implicit)
    parts = parts[: draw(st.integers(0, len(parts)))]
    if parts and draw(st.booleans()):
        cut = draw(st.integers(0, len(parts)))
        width = draw(st.integers(0, len(parts) - cut))
        parts = parts[:cut] + [Ellipsis] + parts[cut + width :]
    if not unique:
        for _ in range(draw(st.integers(0, 2))):
            parts.insert(draw(st.integers(0, len(parts))), None)
    if len(parts) == 1 and draw(st.booleans()):
        return parts[0]
    return tuple(parts)


def _same(left: torch.Tensor, right: torch.Tensor) -> None:
    assert left.dtype == right.dtype
    assert left.shape == right.shape, (left.shape, right.shape)
    assert torch.equal(left, right)


def check_against_reference(result, source, batch, extra, op, copies_sources=None):
    """``result`` (a TensorDict) equals ``op`` applied per leaf, feature dims kept."""
    ndim = len(batch)
    expected_batch = batch_result(batch, op, len(copies_sources or [source]))
    assert result.batch_size == expected_batch
    for path, value in leaf_paths(source):
        tensors = [value]
        if copies_sources is not None:
            tensors = [dict(leaf_paths(s))[path] for s in copies_sources]
        expected = per_feature(tensors, ndim, op)
        _same(result[path], expected)
    if "n" in source:
        assert result["n"].batch_size == expected_batch + torch.Size(extra)


def text_after(before: list[int], after: torch.Size):
    """What reading the text entry gives after ``expand`` lays it over a new batch: the
    value itself when the batch shape is unchanged or has no dims, else a nested list
    of it shaped like the new batch (one element per batch element)."""
    if list(after) == list(before) or not after:
        return "text"
    array = np.empty(tuple(after), dtype=object)
    array.fill("text")
    return array.tolist()


def _index_or_error(fn):
    try:
        return fn(), None
    except (IndexError, RuntimeError, ValueError) as error:
        return None, error


# ---------------------------------------------------------------- indexing
@SETTINGS
@given(data=st.data(), structure=structures())
def test_getitem_matches_per_leaf_indexing(data, structure):
    source, batch, extra = structure
    index = data.draw(indices(batch))
    td = to_td(source, batch, extra, with_text=True)
    _, error = _index_or_error(lambda: torch.zeros(batch)[index])
    if error is not None:
        try:
            td[index]
        except (IndexError, RuntimeError, ValueError) as got:
            assert type(got) is type(error) or isinstance(got, IndexError)
        else:
            raise AssertionError(f"td[{index!r}] should fail like torch: {error}")
        return
    result = td[index]
    check_against_reference(result, source, batch, extra, lambda xs: xs[0][index])
    assert result["s"] == "text"


@SETTINGS
@given(data=st.data(), structure=structures(min_dims=1))
def test_setitem_matches_per_leaf_writes(data, structure):
    source, batch, extra = structure
    index = data.draw(indices(batch, unique=True))
    try:
        target = torch.zeros(batch)[index].shape
    except IndexError:
        return
    td = to_td(source, batch, extra)
    # the value: new numbers with the indexed shape of every leaf
    value_source = {}
    for path, leaf in leaf_paths(source):
        shape = target + leaf.shape[len(batch) :]
        new = (torch.arange(math.prod(shape)).reshape(shape) + 1000).to(leaf.dtype)
        node = value_source
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = new
    value = TensorDict(value_source, batch_size=target)
    td[index] = value
    for path, leaf in leaf_paths(source):
        expected = leaf.clone()
        new = dict(leaf_paths(value_source))[path]
        count = math.prod(leaf.shape[len(batch) :])
        if count:
            flat = expected.reshape((*batch, count))
            flat_new = new.reshape((*target, count))
            for f in range(count):
                view = flat[..., f]
                view[index] = flat_new[..., f]
            expected = flat.reshape(leaf.shape)
        _same(td[path], expected)


# ---------------------------------------------------------------- shape ops
@st.composite
def reshape_targets(draw, batch: list[int]):
    numel = math.prod(batch)
    options = [[numel], [-1], list(reversed(batch)), [1, *batch], [*batch, 1]]
    if numel:
        options.append([1, -1])
    return draw(st.sampled_from(options))


@SETTINGS
@given(data=st.data(), structure=structures())
def test_reshape_and_view(data, structure):
    source, batch, extra = structure
    shape = data.draw(reshape_targets(batch))
    td = to_td(source, batch, extra, with_text=True)
    result = td.reshape(*shape)
    check_against_reference(result, source, batch, extra, lambda xs: xs[0].reshape(shape))
    assert result["s"] == "text"
    viewed = td.view(shape)
    check_against_reference(viewed, source, batch, extra, lambda xs: xs[0].view(shape))


@SETTINGS
@given(data=st.data(), structure=structures(min_dims=1))
def test_permute_transpose(data, structure):
    source, batch, extra = structure
    ndim = len(batch)
    dims = data.draw(st.permutations(list(range(ndim))))
    td = to_td(source, batch, extra, with_text=True)
    permuted = td.permute(*dims)
    check_against_reference(permuted, source, batch, extra, lambda xs: xs[0].permute(dims))
    assert permuted["s"] == "text"
    d0 = data.draw(st.integers(-ndim, ndim - 1))
    d1 = data.draw(st.integers(-ndim, ndim - 1))
    result = td.transpose(d0, d1)
    check_against_reference(result, source, batch, extra, lambda xs: xs[0].transpose(d0, d1))
    assert result["s"] == "text"


@SETTINGS
@given(data=st.data(), structure=structures())
def test_unsqueeze_squeeze(data, structure):
    source, batch, extra = structure
    ndim = len(batch)
    td = to_td(source, batch, extra, with_text=True)
    dim = data.draw(st.integers(-ndim - 1, ndim))
    check_against_reference(
        td.unsqueeze(dim), source, batch, extra, lambda xs: xs[0].unsqueeze(dim)
    )
    check_against_reference(td.squeeze(), source, batch, extra, lambda xs: xs[0].squeeze())
    if ndim:
        sdim = data.draw(st.integers(-ndim, ndim - 1))
        result = td.squeeze(sdim)
        check_against_reference(result, source, batch, extra, lambda xs: xs[0].squeeze(sdim))
        assert result["s"] == "text"


@SETTINGS
@given(data=st.data(), structure=structures(min_dims=1))
def test_flatten_unflatten(data, structure):
    source, batch, extra = structure
    ndim = len(batch)
    td = to_td(source, batch, extra)
    start = data.draw(st.integers(0, ndim - 1))
    end = data.draw(st.integers(start, ndim - 1))
    check_against_reference(
        td.flatten(start, end), source, batch, extra, lambda xs: xs[0].flatten(start, end)
    )
    dim = data.draw(st.integers(-ndim, ndim - 1))
    size = batch[dim]
    sizes = data.draw(st.sampled_from([(size,), (1, size), (size, 1), (-1, 1)]))
    check_against_reference(
        td.unflatten(dim, sizes), source, batch, extra, lambda xs: xs[0].unflatten(dim, sizes)
    )


@SETTINGS
@given(data=st.data(), structure=structures(max_dims=2, min_size=1))
def test_expand(data, structure):
    source, batch, extra = structure
    # make some dims 1 so that they can grow
    ones = data.draw(st.lists(st.booleans(), min_size=len(batch), max_size=len(batch)))
    batch = [1 if one else size for one, size in zip(ones, batch)]
    source = _resliced(source, batch, extra)
    new = [data.draw(st.integers(1, 3)) if size == 1 else size for size in batch]
    lead = data.draw(st.lists(st.integers(1, 2), max_size=1))
    shape = lead + new
    td = to_td(source, batch, extra, with_text=True)
    result = td.expand(*shape)
    check_against_reference(result, source, batch, extra, lambda xs: xs[0].expand(shape))
    assert result["s"] == text_after(batch, result.batch_size)


def _resliced(source: dict, batch: list[int], extra) -> dict:
    """``source`` with every leaf cut (or kept) to ``batch`` leading dims."""
    out = {}
    for key, value in source.items():
        if isinstance(value, dict):
            out[key] = _resliced(value, batch, extra)
        else:
            index = tuple(slice(0, size) for size in batch)
            out[key] = value[index].clone()
    return out


@SETTINGS
@given(data=st.data(), structure=structures(min_dims=1))
def test_unbind_split_chunk(data, structure):
    source, batch, extra = structure
    ndim = len(batch)
    td = to_td(source, batch, extra, with_text=True)
    dim = data.draw(st.integers(-ndim, ndim - 1))
    size = data.draw(st.integers(1, 3))
    chunks = data.draw(st.integers(1, 3))
    for name, op in [
        ("unbind", lambda xs: xs[0].unbind(dim)),
        ("split", lambda xs: xs[0].split(size, dim)),
        ("chunk", lambda xs: xs[0].chunk(chunks, dim)),
    ]:
        if name == "unbind":
            pieces = td.unbind(dim)
        elif name == "split":
            pieces = td.split(size, dim)
        else:
            pieces = torch.chunk(td, chunks, dim)
        shapes = batch_result(batch, op)
        assert [p.batch_size for p in pieces] == shapes
        for i, piece in enumerate(pieces):
            assert piece["s"] == "text"
            for path, value in leaf_paths(source):
                _same(piece[path], per_feature([value], ndim, op)[i])


@SETTINGS
@given(data=st.data(), structure=structures(min_dims=0, max_dims=2, min_size=1))
def test_stack_and_cat(data, structure):
    source, batch, extra = structure
    ndim = len(batch)
    count = data.draw(st.integers(1, 3))
    sources = [{k: v for k, v in _shifted(source, 10 * i).items()} for i in range(count)]
    tds = [to_td(s, batch, extra, with_text=True) for s in sources]
    dim = data.draw(st.integers(-ndim - 1, ndim))
    stacked = torch.stack(tds, dim)
    check_against_reference(
        stacked, source, batch, extra, lambda xs: torch.stack(xs, dim), copies_sources=sources
    )
    # equal values stacked: one per element (a NonTensorStack), as tensordict does
    assert all(x == "text" for x in np.asarray(stacked.get("s").tolist(), dtype=object).flat)
    assert list(stacked.get("s").batch_size) == list(stacked.batch_size)
    if ndim:
        cdim = data.draw(st.integers(-ndim, ndim - 1))
        result = torch.cat(tds, cdim)
        check_against_reference(
            result, source, batch, extra, lambda xs: torch.cat(xs, cdim), copies_sources=sources
        )
        assert result["s"] == "text"


def _shifted(source: dict, offset: int) -> dict:
    out = {}
    for key, value in source.items():
        if isinstance(value, dict):
            out[key] = _shifted(value, offset)
        elif value.dtype is torch.bool:
            out[key] = ~value if offset % 20 else value.clone()
        else:
            out[key] = value + offset
    return out


@SETTINGS
@given(structure=structures())
def test_unflatten_keys_inverts_flatten_keys(structure):
    source, batch, extra = structure
    td = to_td(source, batch, extra, with_text=True)
    flat = td.flatten_keys("/")
    expected_keys = {"/".join(path) for path, _ in leaf_paths(source)} | {"s"}
    assert set(flat.keys()) == expected_keys
    back = flat.unflatten_keys("/")
    for path, value in leaf_paths(source):
        _same(back[path], value)
    assert back["s"] == "text"


def test_setting_names_names_the_dims_nested_levels_share():
    inner = TensorDict({"b": torch.zeros(3, 2)}, [3, 2], names=[None, "x"])
    td = TensorDict({"n": {"a": torch.zeros(3, 4)}, "m": inner}, [3])
    td.names = ["batch"]
    # the reference: each level's names are the parent's, then its own further dims'
    assert td["n"].names == ["batch"] and td["m"].names == ["batch", "x"]
    td.lock_()
    td.names = ["time"]  # a lock does not fix names
    assert td["n"].names == ["time"] and td["m"].names == ["time", "x"]
    with pytest.raises(ValueError, match="names must be unique"):
        td.names = ["x"]  # would name two dims of "m" "x": nothing changes
    assert td.names == ["time"] and td["m"].names == ["time", "x"]
    td.names = None
    assert td["n"].names == [None] and td["m"].names == [None, "x"]
