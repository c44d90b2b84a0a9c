"""The trusted fast paths of container operations agree with their general twins.

Each operation whose common case takes a faster path is run both ways over random
trees (``hot_trees.random_tree``: 1 to 100 leaves, depth 1 to 4, batch ranks 0 to 3,
locked, named, non-tensor, TensorClass, non-contiguous and grad-tracking leaves),
and checked against the plain tensors where the result is leafwise.
"""

from __future__ import annotations

import math
import random
import re

import pytest
import torch
from hot_trees import assert_same, random_tree

from tdfunc import NonTensorData, TensorDict
from tdfunc._core.helpers import torch_functions
from tdfunc._core.shape import shape_ops

SEEDS = range(40)


def _leaves(td, prefix=()):
    """``{key path: tensor}`` of every tensor leaf, TensorClass fields included."""
    out = {}
    for key, value in td.items():
        if isinstance(value, torch.Tensor):
            out[(*prefix, key)] = value
        elif hasattr(value, "keys"):
            out.update(_leaves(value, (*prefix, key)))
    return out


def _reshape_targets(batch: torch.Size) -> list:
    numel = math.prod(batch)
    targets = [(-1,), (numel,), ()] if numel == 1 else [(-1,), (numel,)]
    if len(batch) >= 2:
        targets.append(tuple(reversed(batch)))
        targets.append((batch[0], -1))
    return targets


@pytest.mark.parametrize("seed", SEEDS)
def test_reshape_matches_general_path_and_plain_tensors(seed):
    # twin: every nested level reshaped by its own ``reshape`` (``_reshaped`` with no
    # class to trust), which resolves the shape again and links back the same way
    rng = random.Random(seed)
    td = random_tree(rng)
    for target in _reshape_targets(td.batch_size):
        fast = td.reshape(*target)
        size = fast.batch_size
        general = shape_ops.write_back(shape_ops._reshaped(td, size, None), td)
        assert_same(fast, general)
        assert fast.names == [None] * len(size)  # reshape drops the names
        ndim = td.batch_dims
        for path, leaf in _leaves(td).items():
            assert fast.get(path).shape == size + leaf.shape[ndim:]
            assert torch.equal(fast.get(path), leaf.reshape((*size, *leaf.shape[ndim:])))
        # every level writes back into the level it came from
        for key, value in td.items(include_nested=True):
            if type(value) is TensorDict and not value.is_locked:
                assert fast.get(key)._last_op[0] is value


def test_reshape_write_back_reaches_nested_levels():
    td = TensorDict({"a": torch.zeros(2, 3), "n": {"b": torch.zeros(2, 3, 4)}}, [2, 3])
    with td.reshape(-1) as flat:
        flat["n", "c"] = torch.ones(6)
    assert torch.equal(td["n", "c"], torch.ones(2, 3))


def test_reshape_error_names_the_nested_key():
    class Refuses(torch.Tensor):
        def reshape(self, *shape):
            raise RuntimeError("no reshape here")

    inner = TensorDict({"bad": torch.zeros(4).as_subclass(Refuses)}, [4])
    td = TensorDict({"n": inner}, [4])
    with pytest.raises(RuntimeError, match="no reshape here") as info:
        td.reshape(2, 2)
    assert "('n', 'bad')" in "".join(info.value.__notes__)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("separator", [".", "/", "__"])
def test_flatten_keys_matches_joined_walk(seed, separator):
    # twin: the key walk ``_iter_items((), True, True)`` with each key path joined
    td = random_tree(random.Random(seed))
    flat = td.flatten_keys(separator)
    expected = {
        key if type(key) is str else separator.join(key): value
        for key, value in td._iter_items((), True, True)
    }
    assert list(flat._data) == list(expected)
    for name, value in expected.items():
        assert flat._data[name] is value
    assert flat.batch_size == td.batch_size and flat.names == td.names


def test_flatten_keys_bad_separator_keeps_its_error():
    td = TensorDict({"a": {"b": torch.zeros(())}})
    with pytest.raises(AttributeError):
        td.flatten_keys(None)


def _stack_inputs(td, count: int) -> list:
    return [td.apply(lambda x, i=i: x + i if x.is_floating_point() else x) for i in range(count)]


@pytest.mark.parametrize("seed", SEEDS)
def test_stack_matches_handler_and_plain_tensors(seed):
    # twin: the table's handler called directly (no torch dispatch, no class-dict copy
    # of __torch_function__); reference: torch.stack of each leaf
    rng = random.Random(seed)
    td = random_tree(rng)
    tds = _stack_inputs(td, rng.choice([1, 2, 10]))
    for dim in range(td.batch_dims + 1):
        fast = torch.stack(tds, dim)
        assert_same(fast, torch_functions.stack(tds, dim))
        assert fast.batch_size == torch.Size((*td.batch_size[:dim], len(tds), *td.batch_size[dim:]))
        for path in _leaves(td):
            expected = torch.stack([t.get(path) for t in tds], dim)
            assert torch.equal(fast.get(path).detach(), expected.detach())


@pytest.mark.parametrize("seed", SEEDS)
def test_unbind_matches_plain_tensors(seed):
    rng = random.Random(seed)
    td = random_tree(rng, rank=rng.randint(1, 3))
    for dim in range(-td.batch_dims, td.batch_dims):
        pieces = td.unbind(dim)
        positive = dim % td.batch_dims
        size = td.batch_size[:positive] + td.batch_size[positive + 1 :]
        assert len(pieces) == td.batch_size[dim]
        for index, piece in enumerate(pieces):
            assert piece.batch_size == size
            for path, leaf in _leaves(td).items():
                assert torch.equal(piece.get(path).detach(), leaf.unbind(positive)[index].detach())


_APPLY_FUNCTIONS = {
    "add": lambda x: x + 1,
    "drop ints": lambda x: x if x.is_floating_point() else None,
    "drop all": lambda x: None,
    "reduce a dim": lambda x: x.sum(-1) if x.dim() else x,
    "not a tensor": lambda x: 1.0,
    "raises": lambda x: x.bernoulli_(2.0),
}


@pytest.mark.parametrize("seed", SEEDS)
def test_clone_detach_apply_match_apply_tree(seed):
    # twin: the general engine, ``_apply_tree(fn, (), None, None, filter_empty, check=...)``
    rng = random.Random(seed)
    td = random_tree(rng)
    assert_same(td.clone(), td._apply_tree(torch.Tensor.clone, (), None, None, False, check=False))
    assert_same(
        td.detach(), td._apply_tree(torch.Tensor.detach, (), None, None, False, check=False)
    )
    clone = td.clone()
    for path, leaf in _leaves(td).items():
        copy = clone.get(path)
        assert copy.data_ptr() != leaf.data_ptr() or leaf.numel() == 0
        assert copy.stride() == leaf.stride()  # clone keeps the strides
        assert copy.requires_grad == leaf.requires_grad
    for name, fn in _APPLY_FUNCTIONS.items():
        for filter_empty in (None, False, True):
            try:
                expected = td._apply_tree(fn, (), None, None, filter_empty is not False)
                if filter_empty and not expected._data and td._data:
                    expected = None
            except Exception as error:  # the same error is expected of apply
                with pytest.raises(type(error)) as info:
                    td.apply(fn, filter_empty=filter_empty)
                assert str(info.value) == str(error), name
                assert getattr(info.value, "__notes__", None) == getattr(error, "__notes__", None)
                continue
            result = td.apply(fn, filter_empty=filter_empty)
            if expected is None:
                assert result is None, name
            else:
                assert_same(result, expected)


def _lock_states(td, prefix=()) -> dict:
    """``{key path: is_locked}`` of every level (a TensorClass by its inner TensorDict)."""
    out = {prefix: td._to_tensordict_view()._is_locked}
    for key, value in td.items():
        if hasattr(value, "_to_tensordict_view") and not isinstance(value, NonTensorData):
            out.update(_lock_states(value, (*prefix, key)))
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_lock_walks_match_the_lock_model(seed):
    # reference: the lock rules written out per level (lock_ locks every level, unlock_
    # unlocks every level, a `with` block restores each level's own state, a level locked
    # by its parent refuses unlock_)
    rng = random.Random(seed)
    td = random_tree(rng)
    for _ in range(6):
        before = _lock_states(td)
        op = rng.choice(["lock", "unlock", "with lock", "with unlock", "nested unlock"])
        if op == "lock":
            td.lock_()
            assert all(_lock_states(td).values())
        elif op == "unlock":
            td.unlock_()
            assert not any(_lock_states(td).values())
        elif op in ("with lock", "with unlock"):
            with td.lock_() if op == "with lock" else td.unlock_():
                assert all(map((op == "with lock").__eq__, map(bool, _lock_states(td).values())))
            assert _lock_states(td) == before
        else:
            nested = [v for v in td.values() if type(v) is TensorDict]
            if nested and td.is_locked:
                with pytest.raises(RuntimeError, match="locked TensorDict, which keeps it locked"):
                    nested[0].unlock_()
                assert _lock_states(td) == before
        states = _lock_states(td)
        for path in td.keys(include_nested=True):
            value = td.get(path)
            if isinstance(value, NonTensorData):  # a leaf is locked with its container
                level = path[:-1] if isinstance(path, tuple) else ()
                assert getattr(value, "_is_locked", False) == bool(states[level]), path


def test_lock_unlock_keeps_pickling_and_ends_consolidation():
    import pickle

    td = TensorDict({"a": torch.zeros(2), "n": {"b": torch.ones(2)}}, [2])
    td.lock_().unlock_()  # the unset slots are read, and set to None, here
    again = pickle.loads(pickle.dumps(td))
    assert_same(again, td)
    packed = td.consolidate()
    assert packed.is_locked and getattr(packed, "_consolidation", None) is not None
    packed.unlock_()
    assert getattr(packed, "_consolidation", None) is None
    packed.lock_()
    assert getattr(packed, "_consolidation", None) is None  # ended for good


def _plain_dict(td) -> dict:
    """The tensors and nested TensorDicts of ``td`` as nested dicts (others left out)."""
    out = {}
    for key, value in td.items():
        if type(value) is TensorDict:
            out[key] = _plain_dict(value)
        elif isinstance(value, torch.Tensor):
            out[key] = value
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_constructor_fast_path_matches_full_path(seed):
    # twin: the same entries through a read-only mapping, which the constructor's fast
    # path (plain dicts only) leaves to the validated write engine
    from types import MappingProxyType

    td = random_tree(random.Random(seed))
    source = _plain_dict(td)
    size = list(td.batch_size)
    general = TensorDict(MappingProxyType(source), batch_size=size)
    for batch_size in (size, tuple(size), torch.Size(size)):
        assert_same(TensorDict(source, batch_size=batch_size), general)
    if size:  # a batch the leaves do not start with: the same error both ways
        wrong = [size[0] + 1, *size[1:]]
        with pytest.raises(ValueError) as fast_error:
            TensorDict(source, batch_size=torch.Size(wrong))
        with pytest.raises(ValueError) as full_error:
            TensorDict(MappingProxyType(source), batch_size=wrong)
        assert str(fast_error.value) == str(full_error.value)


@pytest.mark.parametrize("stacking", [True, False])
def test_join_dims_out_of_range_are_refused(stacking):
    # the dims the inlined range test lets through are exactly normalize_dim's
    from tdfunc._core.helpers.sizes import normalize_dim

    tds = [TensorDict({"a": torch.zeros(2, 3, 4)}, [2, 3]) for _ in range(2)]
    join = torch.stack if stacking else torch.cat
    limit = 3 if stacking else 2
    for dim in (-limit - 1, -limit, -1, 0, limit - 1, limit):
        try:
            expected = normalize_dim(dim, limit, join.__name__)
        except Exception as error:  # the same refusal from the join
            with pytest.raises(type(error)):
                join(tds, dim)
            continue
        assert join(tds, dim).batch_size == join([t["a"] for t in tds], expected).shape[:limit]


@pytest.mark.parametrize("join", [torch.stack, torch.cat])
def test_join_refuses_different_keys_at_every_level(join):
    def make(**leaves):
        return TensorDict({k: torch.zeros(2) for k in leaves}, [2])

    base = TensorDict({"a": torch.zeros(2), "n": make(b=1)}, [2])
    extra = TensorDict({"a": torch.zeros(2), "n": make(b=1, c=1)}, [2])
    other = TensorDict({"a": torch.zeros(2), "n": make(c=1)}, [2])
    more = TensorDict({"a": torch.zeros(2), "z": torch.zeros(2), "n": make(b=1)}, [2])
    for pair, missing in (([base, extra], "['c']"), ([base, other], "['b', 'c']")):
        with pytest.raises(KeyError, match="different keys.*" + re.escape(missing)):
            join(pair, 0)
    with pytest.raises(KeyError, match=re.escape("['z']")):
        join([base, more, base], 0)


def test_torch_function_overrides_of_subclasses_are_kept():
    # each container class keeps a copy of the inherited __torch_function__ in its own
    # dict (torch's lookup of it is uncached): a subclass's own override must still win
    calls = []

    class Traced(TensorDict):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            calls.append(func)
            return super().__torch_function__(func, types, args, kwargs)

    class Below(Traced):
        pass

    for kind in (Traced, Below):
        tds = [kind({"a": torch.zeros(2, 3)}, [2]) for _ in range(3)]
        out = torch.stack(tds, 0)
        assert type(out) is kind and out.batch_size == (3, 2)
    assert calls == [torch.stack, torch.stack]
