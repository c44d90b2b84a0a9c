"""Random sequences of key and index operations against a reference without tdfunc.

The reference is a nested dict of plain tensors whose batch sizes are tracked by
hand; every index is applied to each plain tensor with its ellipsis written out
over the batch dims (so feature dims are never touched). After every step the
container must equal the reference: keys in order, values, batch sizes. A refused
write (a locked container, a value that does not fit) must leave it unchanged.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tdfunc import TensorDict

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BATCH = [3, 4]
NUMBERS = [0.1, -2, True, 2**40 + 1]


def _reference():
    """{key path: plain tensor} and {node path: batch size}: one nested level with an extra dim."""
    g = torch.Generator().manual_seed(0)
    leaves = {
        ("a",): torch.randn(3, 4, 2, generator=g, dtype=torch.float64),
        ("i",): torch.randint(0, 50, (3, 4), generator=g),
        ("n", "b"): torch.randn(3, 4, 2, generator=g),
        ("n", "m", "c"): torch.randint(0, 2, (3, 4, 2, 3), generator=g) == 1,
    }
    return leaves, {(): BATCH, ("n",): [3, 4, 2], ("n", "m"): [3, 4, 2]}


def _build(leaves, sizes, prefix=()):
    """The container holding a copy of the reference (``leaves`` nested, in order)."""
    data: dict = {}
    for key, value in leaves.items():
        if len(key) == 1:
            data[key[0]] = value.clone()
        else:
            data.setdefault(key[0], {})[key[1:]] = value
    return TensorDict(
        {
            k: v if isinstance(v, torch.Tensor) else _build(v, sizes, prefix + (k,))
            for k, v in data.items()
        },
        sizes[prefix],
    )


def _check(td, leaves, sizes):
    assert list(td.keys(True, True)) == [k[0] if len(k) == 1 else k for k in leaves]
    for key, value in leaves.items():
        got = td[key]
        assert got.dtype == value.dtype and torch.equal(got, value), key
    for node, size in sizes.items():
        assert list((td[node] if node else td).batch_size) == size, node


@st.composite
def batch_indices(draw):
    """(index for the container, the same index written out for a leaf)."""
    items, explicit, consumed = [], [], 0
    for size in BATCH:
        kind = draw(st.sampled_from(["int", "slice", "tensor", "list", "mask", "skip"]))
        if kind == "skip":
            break
        if kind == "int":
            item = draw(st.integers(-size, size - 1))
        elif kind == "slice":
            item = slice(
                draw(st.none() | st.integers(-4, 4)), None, draw(st.none() | st.integers(1, 3))
            )
        elif kind == "mask":
            item = torch.tensor(draw(st.lists(st.booleans(), min_size=size, max_size=size)))
        else:
            positions = draw(st.lists(st.integers(-size, size - 1), min_size=1, max_size=3))
            item = positions if kind == "list" else torch.tensor(positions)
        items.append(item)
        explicit.append(torch.as_tensor(item) if isinstance(item, list) else item)
        consumed += 1
        if sum(not isinstance(i, (int, slice)) for i in items) == 2:
            break
    for _ in range(draw(st.integers(0, 2))):  # None and bools add a dim, consume none
        extra = draw(st.sampled_from([None, True, False, torch.tensor(True)]))
        at = draw(st.integers(0, len(items)))
        items.insert(at, extra)
        explicit.insert(at, extra)
    if draw(st.booleans()):
        at = draw(st.integers(0, len(items)))
        items.insert(at, Ellipsis)
        explicit.insert(at, *[slice(None)] * 0 or [Ellipsis])
        fill = [slice(None)] * (len(BATCH) - consumed)
        explicit = explicit[:at] + fill + explicit[at + 1 :]
    else:
        explicit += [slice(None)] * (len(BATCH) - consumed)
    return tuple(items), tuple(explicit)


def _unique(explicit) -> bool:
    """Whether the index selects every position at most once (writes are then well defined)."""
    size = torch.zeros(BATCH)[explicit].shape
    probe = torch.full(BATCH, -1, dtype=torch.long)
    probe[explicit] = torch.arange(size.numel()).reshape(size)
    return bool(torch.equal(probe[explicit], torch.arange(size.numel()).reshape(size)))


@SETTINGS
@given(st.data())
def test_index_reads_and_writes_match_plain_tensors(data):
    leaves, sizes = _reference()
    td = _build(leaves, sizes)
    for _ in range(3):
        index, explicit = data.draw(batch_indices())
        try:
            selected = torch.zeros(BATCH)[explicit].shape
        except IndexError:  # index tensors that do not broadcast together
            with pytest.raises(IndexError):
                td[index]
            continue
        out = td[index]
        assert out.batch_size == selected
        for key, value in leaves.items():
            assert torch.equal(out[key], value[explicit]), key
        assert torch.equal(td.get_at(("n", "b"), explicit), leaves["n", "b"][explicit])
        if not _unique(explicit):
            continue
        how = data.draw(st.sampled_from(["number", "container", "set_at_", "update_at_"]))
        if how == "number":
            number = data.draw(st.sampled_from(NUMBERS))
            td[index] = number
            for value in leaves.values():
                value[explicit] = number
            _check(td, leaves, sizes)
            continue
        new = {k: torch.randint(-9, 9, v[explicit].shape).to(v.dtype) for k, v in leaves.items()}
        if how == "container":
            td[index] = TensorDict({k: v.clone() for k, v in new.items()}, selected)
        elif how == "set_at_":
            for key, value in new.items():  # the index applies to the entry itself
                td.set_at_(key, value.clone(), explicit)
        else:
            td.update_at_({k: v.clone() for k, v in new.items()}, explicit)
        for key, value in new.items():
            leaves[key][explicit] = value
        _check(td, leaves, sizes)


def _nested(leaves):
    """The reference as a nested dict (insertion order is key order, as in a dict)."""
    root: dict = {}
    for key, value in leaves.items():
        node = root
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = value
    return root


def _flat(root, prefix=()):
    for part, value in root.items():
        if isinstance(value, dict):
            yield from _flat(value, prefix + (part,))
        else:
            yield prefix + (part,), value


def _drop_levels(sizes: dict, key: tuple) -> None:
    for path in [p for p in sizes if p[: len(key)] == key]:
        del sizes[path]


NAMES = ["a", "i", "n", "b", "m", "c", "x"]
paths = st.lists(st.sampled_from(NAMES), min_size=1, max_size=3).map(tuple)


@SETTINGS
@given(
    st.lists(
        st.tuples(st.sampled_from(["set", "del", "rename", "update", "lock"]), paths, paths),
        max_size=12,
    )
)
def test_key_operations_match_a_nested_dict(steps):
    leaves, sizes = _reference()
    td = _build(leaves, sizes)
    root = _nested(leaves)
    locked = False
    for op, key, other in steps:
        if op == "lock":
            td.unlock_() if locked else td.lock_()
            locked = not locked
            continue
        # what the reference says: the level the key lands in (None: under a tensor)
        node = root
        for part in key[:-1]:
            node = node.get(part, {}) if isinstance(node, dict) else None
        fits = isinstance(node, dict)
        node_path = next(key[:n] for n in range(len(key) - 1, -1, -1) if key[:n] in sizes)
        shape = sizes[node_path]  # new levels get the batch size of their parent
        before = td.clone()
        if op == "rename" and other == key:  # renaming an entry to itself changes nothing
            if fits and key[-1] in node:
                if locked:  # a locked container refuses any rename first, as tensordict's
                    with pytest.raises(RuntimeError, match="locked"):
                        td.rename_key_(key, other)
                else:
                    td.rename_key_(key, other)
            _check(td, dict(_flat(root)), sizes)
            continue
        try:
            if op == "set":
                value = torch.full(shape, 5.0)
                td.set(key, value)
            elif op == "del":
                del td[key]
            elif op == "update":  # the second value never fits: nothing is written
                td.update({key: torch.full(shape, 7.0), "bad": torch.zeros(5)})
            else:
                td.rename_key_(key, other)
        except (KeyError, ValueError, RuntimeError):
            assert (td == before).all() and list(td.keys(True)) == list(before.keys(True))
            continue
        assert not locked and op != "update", f"{op} was accepted"
        if op == "set":
            assert fits, key  # a new key, or any entry replaced (a level too, as in a dict)
            _put(root, sizes, key, value)
        elif op == "del":
            assert fits and key[-1] in node, key
            node.pop(key[-1])
            _drop_levels(sizes, key)
        else:  # a new key goes last in its parent; a replaced one keeps its place
            assert fits and key[-1] in node, (key, other)
            assert other[: len(key)] != key, (key, other)  # not moved inside itself
            moved = node.pop(key[-1])
            levels = {p[len(key) :]: sizes[p] for p in sizes if p[: len(key)] == key}
            _drop_levels(sizes, key)
            _put(root, sizes, other, moved)
            sizes.update({other + rest: size for rest, size in levels.items()})
        _check(td, dict(_flat(root)), sizes)


def _put(root: dict, sizes: dict, key: tuple, value) -> None:
    """``root[key] = value``, creating the missing levels with their parent's batch size."""
    _drop_levels(sizes, key)
    parent = root
    for n, part in enumerate(key[:-1], 1):
        parent = parent.setdefault(part, {})
        sizes.setdefault(key[:n], sizes[key[: n - 1]])
    parent[key[-1]] = value  # a replaced entry keeps its place, as in a dict
