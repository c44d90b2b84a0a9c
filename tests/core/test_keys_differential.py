"""Differential test of key and entry operations: a TensorDict against nested dicts.

A hypothesis state machine applies random sequences of key operations (set, get,
get with a default, setdefault, pop, popitem, del, ``in``, update, select,
exclude, rename_key_, flatten_keys / unflatten_keys, keys / values / items,
empty, copy / clone / deepcopy, lock_ / unlock_, ``==``, to_dict / from_dict) to
a TensorDict and the same operations to a nested ``dict`` written here without
tdfunc. Keys include the awkward ones: ``""``, ``"."``, keys holding the
separator, and every spelling of a key (``"a"``, ``("a",)``, ``(("n",), "a")``).
After every step both must hold the same keys in the same order, the same values
(tensors and non-tensor values), the same lock state at every level, and an
operation the reference refuses must raise the same kind of error in the
container and leave it unchanged.

Reference rules (a dict's, plus tensordict's documented lock): a locked
container refuses every structural change (add, replace, delete, rename, pop,
in-place select/exclude/flatten), whether or not the key exists, with a
``RuntimeError``; a missing key is a ``KeyError``; a leaf where a path needs a
level is a ``KeyError`` naming it.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from keys_reference import (
    LEAF_RULES,
    ClassLevel,
    Refused,
    has,
    is_level,
    kind_of,
    kind_of_class,
    leaf_paths,
    limited_items,
    node_at,
    parent_for_write,
    spelled,
    structure_copy,
    tree_map,
    unflatten,
    walk,
    write,
)

from tdfunc import TensorClass, TensorDict, is_tensor_collection

BATCH = 2
NAMES = ["a", "b", "", ".", "x.y"]
PATHS = [
    ("a",),
    ("b",),
    ("",),
    (".",),
    ("x.y",),
    ("n",),
    ("n", "a"),
    ("n", ""),
    ("n", "x.y"),
    ("n", "m"),
    ("n", "m", "a"),
    ("n", "m", "."),
    ("a", "b"),
    ("p",),
    ("p", "a"),
    ("p", "b"),
    ("p", "q"),
]
SEPARATORS = [".", "/", "_"]


# ---------------------------------------------------------------------- the machine
class Pair(TensorClass):
    """The TensorClass that ``ClassLevel`` models."""

    a: torch.Tensor = None
    b: torch.Tensor = None


def unset_field(ref: dict, path: tuple) -> bool:
    parent = node_at(ref, path[:-1]) if has(ref, path[:-1]) else None
    return isinstance(parent, ClassLevel) and path[-1] in ClassLevel.FIELDS


def as_plain_dicts(tree: dict) -> dict:
    return {k: as_plain_dicts(v) if is_level(v) else v for k, v in tree.items()}


def build(tree: dict, cls=TensorDict):
    """The container holding a copy of ``tree`` (a ``ClassLevel`` becomes a ``Pair``)."""
    data = {
        k: build(v, Pair if isinstance(v, ClassLevel) else TensorDict) if is_level(v) else v
        for k, v in tree.items()
    }
    return cls(**data, batch_size=[BATCH]) if cls is Pair else cls(data, batch_size=[BATCH])


class KeysVersusDicts(RuleBasedStateMachine):
    """``self.pairs``: ``[(container, reference, lock flag holder)]``; copies join the list."""

    @initialize(seed=st.integers(0, 2**16))
    def build(self, seed):
        self.generator = torch.Generator().manual_seed(seed)
        ref = {
            "a": self._tensor(),
            "n": {"a": self._tensor(), "s": "text"},
            "": "empty",
            "p": ClassLevel(a=self._tensor()),
        }
        self.pairs = [[build(ref), ref, False]]
        self.counter = 0

    # -------------------------------------------------------------- helpers
    def _tensor(self, feature=()) -> torch.Tensor:
        return torch.randn(BATCH, *feature, generator=self.generator)

    def _value(self, kind: str):
        self.counter += 1
        if kind == "tensor":
            return self._tensor()
        if kind == "text":
            return f"v{self.counter}"
        return {"a": self._tensor(), "z": f"w{self.counter}"}

    @staticmethod
    def _stored(value):
        """What the reference stores for a written value (a dict is copied, as set copies
        the structure of a mapping it converts)."""
        return copy.deepcopy(value) if is_level(value) else value

    def _spell(self, path: tuple, how: int):
        """One of the spellings of ``path`` (they all name the same entry)."""
        if how == 0 or (len(path) > 1 and how == 1):
            return path if len(path) > 1 else path[0]
        if len(path) == 1:
            return (path[0],) if how == 1 else ((path[0],),)
        return ((path[0],), path[1:])

    def _run(self, index: int, action, reference):
        """Run ``reference`` on the dict; on ``Refused``, the container must refuse alike."""
        td, ref, _ = self.pairs[index]
        try:
            expected = reference(ref)
        except Refused as refused:
            before = self._state(td)
            with pytest.raises(refused.kind):
                action(td)
            assert self._state(td) == before, "a refused operation changed the container"
            return Refused
        return expected, action(td)

    def _state(self, td) -> list:
        """Keys in order with a comparable form of each value."""
        out = []
        for key in td.keys(include_nested=True):
            value = td[key]
            if isinstance(value, torch.Tensor):
                out.append((key, "tensor", tuple(value.flatten().tolist())))
            elif is_tensor_collection(value):
                out.append((key, type(value).__name__, value.is_locked))
            else:
                out.append((key, "value", value))
        return out

    @staticmethod
    def _expected_state(ref: dict, locked: bool) -> list:
        out = []
        for path, value in walk(ref):
            key = spelled(path)
            if isinstance(value, torch.Tensor):
                out.append((key, "tensor", tuple(value.flatten().tolist())))
            elif is_level(value):
                name = "Pair" if isinstance(value, ClassLevel) else "TensorDict"
                out.append((key, name, locked))
            else:
                out.append((key, "value", value))
        return out

    def _same(self, got, expected) -> None:
        if isinstance(expected, torch.Tensor):
            assert isinstance(got, torch.Tensor) and torch.equal(got, expected)
        elif is_level(expected):
            assert is_tensor_collection(got), got
            assert self._expected_state(expected, got.is_locked) == self._state(got)
        else:
            assert got == expected, (got, expected)

    @staticmethod
    def _refuse_if_locked(locked: bool) -> None:
        if locked:
            raise Refused(RuntimeError)

    # -------------------------------------------------------------- reads
    @rule(
        index=st.integers(0, 1),
        path=st.sampled_from(PATHS + [("zz",), ("n", "zz")]),
        how=st.integers(0, 2),
    )
    def read(self, index, path, how):
        index = min(index, len(self.pairs) - 1)
        key = self._spell(path, how)
        td, ref, _ = self.pairs[index]
        present = has(ref, path)
        assert (key in td) == present
        assert (key in td.keys(include_nested=True)) == present
        if len(path) == 1:
            assert (key in td.keys()) == present  # noqa: SIM118
        else:  # tensordict: a nested key asked of the top-level keys is a mistake
            with pytest.raises(TypeError):
                _ = key in td.keys()  # noqa: SIM118
        if present:
            value = node_at(ref, path)
            self._same(td[key], value)
            got = td.get(key)
            if isinstance(value, str):  # a TensorDict's get gives a NonTensorData
                assert got.data == value
            else:
                self._same(got, value)
            if not isinstance(value, str):
                self._same(td.get(key, "default"), value)
        elif unset_field(ref, path):  # a field of a TensorClass that holds nothing reads None
            assert td[key] is None and td.get(key) is None and td.get(key, "default") is None
        else:
            with pytest.raises(KeyError):
                td[key]
            assert td.get(key) is None
            assert td.get(key, "default") == "default"

    @rule(
        index=st.integers(0, 1),
        include_nested=st.booleans(),
        leaves_only=st.booleans(),
        sort=st.booleans(),
        leaf=st.sampled_from([None, *LEAF_RULES]),
    )
    def keys_values_items(self, index, include_nested, leaves_only, sort, leaf):
        index = min(index, len(self.pairs) - 1)
        td, ref, _ = self.pairs[index]
        # is_leaf(kind) says what leaves_only keeps and where the walk stops; by default
        # tensordict's leaves are tensors (not levels, not non-tensor values)
        rule_ = LEAF_RULES[leaf] if leaf else (lambda kind: kind == "tensor")
        pairs = [
            (p, v)
            for p, v in walk(ref, enter=lambda v: include_nested and not rule_(kind_of(v)))
            if not leaves_only or rule_(kind_of(v))
        ]
        if sort:
            pairs.sort(key=lambda pv: ".".join(pv[0]))
        expected_keys = [spelled(p) for p, _ in pairs]
        args = (include_nested, leaves_only)
        kwargs = {"sort": sort}
        if leaf:
            kwargs["is_leaf"] = lambda cls: LEAF_RULES[leaf](kind_of_class(cls))
        assert list(td.keys(*args, **kwargs)) == expected_keys
        assert len(td.keys(*args, **kwargs)) == len(expected_keys)
        items = list(td.items(*args, **kwargs))
        assert [k for k, _ in items] == expected_keys
        values = list(td.values(*args, **kwargs))
        assert len(values) == len(expected_keys)
        for (_, value), got, (_, item) in zip(pairs, values, items):
            if isinstance(value, str):
                assert got.data == value and item.data == value
            else:
                self._same(got, value)
                self._same(item, value)

    @rule(index=st.integers(0, 1))
    def to_dict_and_back(self, index):
        index = min(index, len(self.pairs) - 1)
        td, ref, _ = self.pairs[index]

        def same(got: dict, expected: dict, unset_fields: bool) -> None:
            if unset_fields and isinstance(expected, ClassLevel):  # retain_none: they read None
                expected = {**expected, **{f: None for f in ClassLevel.FIELDS if f not in expected}}
            assert sorted(got) == sorted(expected)
            for k, v in expected.items():
                if is_level(v):
                    same(got[k], v, unset_fields)
                elif isinstance(v, torch.Tensor):
                    assert torch.equal(got[k], v)
                else:
                    assert got[k] == v

        same(td.to_dict(), ref, True)
        plain = td.to_dict(retain_none=False)
        same(plain, ref, False)
        back = TensorDict.from_dict(plain, batch_size=[BATCH])  # a TensorClass comes back plain
        assert self._state(back) == self._expected_state(as_plain_dicts(ref), False)

    @rule(index=st.integers(0, 1), data=st.data())
    def equality(self, index, data):
        index = min(index, len(self.pairs) - 1)
        td, ref, _ = self.pairs[index]
        other = td.clone()
        assert (td == other).all() and not (td != other).any()
        paths = leaf_paths(ref)
        if not paths:
            return
        path = data.draw(st.sampled_from(paths))
        other.get(spelled(path))[0] += 1
        assert not (td == other).all() and (td != other).any()
        assert (td == other).any() == (len(paths) > 1 or BATCH > 1)

    # -------------------------------------------------------------- writes
    @rule(
        index=st.integers(0, 1),
        path=st.sampled_from(PATHS),
        how=st.integers(0, 2),
        kind=st.sampled_from(["tensor", "text", "level"]),
        api=st.sampled_from(["set", "setitem"]),
    )
    def set_entry(self, index, path, how, kind, api):
        index = min(index, len(self.pairs) - 1)
        value = self._value(kind)
        locked = self.pairs[index][2]

        def reference(ref):
            write(ref, [(path, value)], inplace=False, merge_levels=False, locked=locked)

        def action(td):
            if api == "set":
                assert td.set(self._spell(path, how), self._stored(value)) is td
            else:
                td[self._spell(path, how)] = self._stored(value)

        self._run(index, action, reference)

    @rule(
        index=st.integers(0, 1),
        path=st.sampled_from(PATHS),
        how=st.integers(0, 2),
        kind=st.sampled_from(["tensor", "text"]),
    )
    def setdefault(self, index, path, how, kind):
        index = min(index, len(self.pairs) - 1)
        value = self._value(kind)
        locked = self.pairs[index][2]

        def reference(ref):
            if has(ref, path):
                return node_at(ref, path)
            write(ref, [(path, value)], inplace=False, merge_levels=False, locked=locked)
            return value

        result = self._run(
            index, lambda td: td.setdefault(self._spell(path, how), value), reference
        )
        if result is not Refused:
            expected, got = result
            if isinstance(expected, str):
                got = got.data if hasattr(got, "data") and not isinstance(got, str) else got
            self._same(got, expected)

    @rule(
        index=st.integers(0, 1),
        path=st.sampled_from(PATHS + [("zz",)]),
        how=st.integers(0, 2),
        with_default=st.booleans(),
    )
    def pop(self, index, path, how, with_default):
        index = min(index, len(self.pairs) - 1)
        locked = self.pairs[index][2]

        def reference(ref):
            self._refuse_if_locked(locked)
            if not has(ref, path):
                if with_default:
                    return "default"
                raise Refused(KeyError)
            return node_at(ref, path[:-1]).pop(path[-1]) if len(path) > 1 else ref.pop(path[0])

        args = ("default",) if with_default else ()
        result = self._run(index, lambda td: td.pop(self._spell(path, how), *args), reference)
        if result is not Refused:
            self._same(result[1], result[0])

    @rule(index=st.integers(0, 1))
    def popitem(self, index):
        index = min(index, len(self.pairs) - 1)
        locked = self.pairs[index][2]

        def reference(ref):
            self._refuse_if_locked(locked)
            if not ref:
                raise Refused(KeyError)
            return ref.popitem()

        result = self._run(index, lambda td: td.popitem(), reference)
        if result is not Refused:
            (key, value), (got_key, got) = result
            assert key == got_key
            self._same(got, value)

    @rule(
        index=st.integers(0, 1),
        path=st.sampled_from(PATHS + [("zz",)]),
        how=st.integers(0, 2),
        api=st.sampled_from(["del_", "delitem"]),
    )
    def delete(self, index, path, how, api):
        index = min(index, len(self.pairs) - 1)
        locked = self.pairs[index][2]

        def reference(ref):
            self._refuse_if_locked(locked)
            if not has(ref, path):
                raise Refused(KeyError)
            del node_at(ref, path[:-1])[path[-1]]

        def action(td):
            if api == "del_":
                assert td.del_(self._spell(path, how)) is td
            else:
                del td[self._spell(path, how)]

        self._run(index, action, reference)

    @rule(
        index=st.integers(0, 1),
        entries=st.lists(
            st.tuples(st.sampled_from(PATHS), st.sampled_from(["tensor", "text", "level"])),
            max_size=3,
        ),
        as_nested_dicts=st.booleans(),
        inplace=st.booleans(),
        keys_to_update=st.none() | st.lists(st.sampled_from(PATHS + [("zz",)]), max_size=2),
    )
    def update(self, index, entries, as_nested_dicts, inplace, keys_to_update):
        index = min(index, len(self.pairs) - 1)
        locked = self.pairs[index][2]
        source: dict = {}
        for path, kind in entries:
            value = self._value(kind)
            if as_nested_dicts:
                try:
                    parent_for_write(source, path)[path[-1]] = value
                except Refused:
                    continue
            else:
                source[spelled(path)] = value

        def reference(ref):
            items = [(k if isinstance(k, tuple) else (k,), v) for k, v in source.items()]
            if keys_to_update is not None:
                items = limited_items(copy.deepcopy(ref), items, keys_to_update)
            write(ref, items, inplace=inplace, merge_levels=True, locked=locked)

        def action(td):
            wanted = None if keys_to_update is None else [spelled(p) for p in keys_to_update]
            assert td.update(copy.deepcopy(source), inplace=inplace, keys_to_update=wanted) is td

        self._run(index, action, reference)

    @rule(
        index=st.integers(0, 1),
        old=st.sampled_from(PATHS + [("zz",)]),
        new=st.sampled_from(PATHS + [("c",), ("n", "c")]),
        safe=st.booleans(),
    )
    def rename(self, index, old, new, safe):
        index = min(index, len(self.pairs) - 1)
        locked = self.pairs[index][2]

        def reference(ref):
            self._refuse_if_locked(locked)
            if not has(ref, old):
                raise Refused(KeyError)
            if old == new:
                return
            if new[: len(old)] == old:
                raise Refused(ValueError)
            if safe and has(ref, new):
                raise Refused(KeyError)
            for tree in (copy.deepcopy(ref), ref):  # the destination is checked first
                value = node_at(tree, old[:-1]).pop(old[-1])
                parent_for_write(tree, new)[new[-1]] = value

        def action(td):
            assert td.rename_key_(spelled(old), spelled(new), safe=safe) is td

        self._run(index, action, reference)

    # -------------------------------------------------------------- key views
    @rule(
        index=st.integers(0, 1),
        paths=st.lists(st.sampled_from(PATHS + [("zz",)]), max_size=3),
        strict=st.booleans(),
        inplace=st.booleans(),
    )
    def select(self, index, paths, strict, inplace):
        index = min(index, len(self.pairs) - 1)
        locked = self.pairs[index][2]

        def reference(ref):
            if inplace:
                self._refuse_if_locked(locked)
            out: dict = {}
            for path in paths:
                if not has(ref, path):
                    if strict:
                        raise Refused(KeyError)
                    continue
                node, source = out, ref
                for key in path[:-1]:
                    source = source[key]
                    node = node.setdefault(key, type(source)())  # a TensorClass stays one
                value = source[path[-1]]
                node[path[-1]] = structure_copy(value) if is_level(value) else value
            if inplace:
                ref.clear()
                ref.update(out)
            return out

        def action(td):
            got = td.select(*[spelled(p) for p in paths], strict=strict, inplace=inplace)
            assert (got is td) == inplace
            return got

        result = self._run(index, action, reference)
        if result is not Refused:
            expected, got = result
            assert self._state(got) == self._expected_state(expected, locked and inplace)

    @rule(
        index=st.integers(0, 1),
        paths=st.lists(st.sampled_from(PATHS + [("zz",), ("n", "zz")]), max_size=3),
        inplace=st.booleans(),
    )
    def exclude(self, index, paths, inplace):
        index = min(index, len(self.pairs) - 1)
        locked = self.pairs[index][2]

        def reference(ref):
            if inplace and paths:
                self._refuse_if_locked(locked)
            out = ref if inplace else structure_copy(ref)
            for path in paths:
                if has(out, path):
                    del node_at(out, path[:-1])[path[-1]]
            return out

        def action(td):
            got = td.exclude(*[spelled(p) for p in paths], inplace=inplace)
            assert (got is td) == inplace
            return got

        result = self._run(index, action, reference)
        if result is not Refused:
            expected, got = result
            assert self._state(got) == self._expected_state(expected, locked and inplace)

    @rule(index=st.integers(0, 1), separator=st.sampled_from(SEPARATORS), inplace=st.booleans())
    def flatten_then_unflatten(self, index, separator, inplace):
        index = min(index, len(self.pairs) - 1)
        locked = self.pairs[index][2]

        def flatten(ref):
            if inplace:
                self._refuse_if_locked(locked)
            out: dict = {}
            for path, value in walk(ref):
                if is_level(value):
                    continue  # a level goes; an empty one leaves nothing behind
                name = separator.join(path)
                if name in out:
                    raise Refused(KeyError)
                out[name] = value
            if inplace:
                ref.clear()
                ref.update(out)
            return out

        def action(td):
            got = td.flatten_keys(separator, inplace=inplace)
            assert (got is td) == inplace
            return got

        result = self._run(index, action, flatten)
        if result is Refused:
            return
        expected, got = result
        assert self._state(got) == self._expected_state(expected, locked and inplace)
        back = unflatten(expected, separator)
        if back is Refused:
            with pytest.raises(KeyError):
                got.unflatten_keys(separator)
            return
        again = got.unflatten_keys(separator)
        assert self._state(again) == self._expected_state(back, False)

    @rule(index=st.integers(0, 1), recurse=st.booleans())
    def empty(self, index, recurse):
        index = min(index, len(self.pairs) - 1)
        td, ref, _ = self.pairs[index]

        def levels(tree):
            return type(tree)((k, levels(v)) for k, v in tree.items() if is_level(v))

        expected = levels(ref) if recurse else {}
        got = td.empty(recurse=recurse)
        assert self._state(got) == self._expected_state(expected, False)
        assert got.batch_size == td.batch_size

    # -------------------------------------------------------------- copies and locks
    @precondition(lambda self: len(self.pairs) == 1)
    @rule(how=st.sampled_from(["copy", "copy.copy", "clone", "deepcopy", "clone(False)"]))
    def fork(self, how):
        td, ref, locked = self.pairs[0]
        if how == "copy":
            other, other_ref, other_locked = td.copy(), structure_copy(ref), False
        elif how == "copy.copy":
            other, other_ref, other_locked = copy.copy(td), structure_copy(ref), False
        elif how == "clone(False)":
            other, other_ref, other_locked = td.clone(False), structure_copy(ref), False
        elif how == "clone":
            cloned = {p: v.clone() for p, v in walk(ref) if isinstance(v, torch.Tensor)}
            other_ref = tree_map(ref, lambda p, v: cloned.get(p, v))
            other, other_locked = td.clone(), False
        else:
            other, other_ref, other_locked = copy.deepcopy(td), copy.deepcopy(ref), locked
        self.pairs.append([other, other_ref, other_locked])

    @precondition(lambda self: len(self.pairs) == 2)
    @rule()
    def drop_the_copy(self):
        self.pairs.pop()

    @rule(index=st.integers(0, 1), data=st.data())
    def add_in_place(self, index, data):
        """An in-place edit of a tensor reaches every container sharing it."""
        index = min(index, len(self.pairs) - 1)
        td, ref, _ = self.pairs[index]
        paths = leaf_paths(ref)
        if not paths:
            return
        path = data.draw(st.sampled_from(paths))
        td.get(spelled(path)).add_(1)
        node_at(ref, path).add_(1)

    @rule(index=st.integers(0, 1), lock=st.booleans())
    def lock_or_unlock(self, index, lock):
        index = min(index, len(self.pairs) - 1)
        td = self.pairs[index][0]
        assert (td.lock_() if lock else td.unlock_()) is td
        self.pairs[index][2] = lock

    @rule(index=st.integers(0, 1), path=st.sampled_from([("n",), ("n", "m")]))
    def nested_level_follows_the_lock(self, index, path):
        index = min(index, len(self.pairs) - 1)
        td, ref, locked = self.pairs[index]
        if not (has(ref, path) and is_level(node_at(ref, path))):
            return
        level = td[spelled(path)]
        assert level.is_locked == locked
        if locked:  # kept locked by its parent
            with pytest.raises(RuntimeError):
                level.unlock_()
            with pytest.raises(RuntimeError):
                level.set("new", self._tensor())
        assert level.is_locked == locked

    @invariant()
    def same_keys_values_and_locks(self):
        if not hasattr(self, "pairs"):
            return
        for td, ref, locked in self.pairs:
            assert self._state(td) == self._expected_state(ref, locked)
            assert td.is_locked == locked
            assert td.batch_size == torch.Size([BATCH])


KeysVersusDicts.TestCase.settings = settings(
    max_examples=50,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestKeysVersusDicts = KeysVersusDicts.TestCase
