"""Differential test: a TensorDict against nested dicts of plain tensors.

A hypothesis state machine runs random sequences of what users do to one
container (set and delete nested keys, write rows through ``td[idx] = ...``,
edit a row view or a nested level in place, lock and unlock, update, rename,
clone, select, exclude) and does the same to a nested ``dict`` with plain
torch. After every step the two must hold the same keys and the same values.
A step that must fail (a wrong batch shape, a new key in a locked container, a
missing key) must raise and leave the container as it was.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.utils._pytree as torch_pytree
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tdfunc import TensorDict

BATCH = 3
PATHS = [("a",), ("b",), ("n", "x"), ("n", "y"), ("n", "m", "z"), ("k", "x")]
FEATURES = [(), (2,), (1, 2)]
ROWS = [0, 1, -1, slice(0, 2), slice(None, None, 2), slice(1, None)]
FAILURES = (KeyError, ValueError, TypeError, RuntimeError, IndexError)


def leaves(tree: dict, prefix: tuple = ()) -> dict:
    """Every path of a nested dict, mapped to its tensor or to ``None`` for a level."""
    out = {}
    for key, value in tree.items():
        out[(*prefix, key)] = None if isinstance(value, dict) else value
        if isinstance(value, dict):
            out.update(leaves(value, (*prefix, key)))
    return out


def tree_map(fn, tree: dict) -> dict:
    return {k: tree_map(fn, v) if isinstance(v, dict) else fn(v) for k, v in tree.items()}


def parent_of(tree: dict, path: tuple, create: bool) -> dict | None:
    """The dict that holds ``path[-1]``; ``None`` where a tensor is in the way."""
    node = tree
    for key in path[:-1]:
        child = node.get(key)
        if child is None:
            if not create:
                return None
            child = node[key] = {}
        if not isinstance(child, dict):
            return None
        node = child
    return node


class ContainerVersusDicts(RuleBasedStateMachine):
    @initialize(seed=st.integers(0, 2**16))
    def build(self, seed):
        self.generator = torch.Generator().manual_seed(seed)
        self.ref: dict = {"a": self._tensor((2,)), "n": {"x": self._tensor(())}}
        self.td = TensorDict(copy.deepcopy(self.ref), batch_size=[BATCH])
        self.locked = False

    def _tensor(self, feature: tuple, batch: tuple = (BATCH,)) -> torch.Tensor:
        return torch.randn(*batch, *feature, generator=self.generator)

    def _expect_failure(self, action) -> None:
        before = self._snapshot()
        with pytest.raises(FAILURES):
            action()
        self._compare(before)

    def _snapshot(self) -> dict:
        return {path: None if t is None else t.clone() for path, t in self._td_paths().items()}

    def _td_paths(self) -> dict:
        out = {}
        for key in self.td.keys(include_nested=True):
            path = key if isinstance(key, tuple) else (key,)
            value = self.td.get(path)
            out[path] = value if isinstance(value, torch.Tensor) else None
        return out

    def _compare(self, expected: dict) -> None:
        actual = self._td_paths()
        assert set(actual) == set(expected), (sorted(actual), sorted(expected))
        for path, tensor in expected.items():
            if tensor is None:
                assert actual[path] is None, path
            else:
                assert actual[path].shape == tensor.shape, path
                assert torch.equal(actual[path], tensor), path

    # ------------------------------------------------------------------ writes
    @precondition(lambda self: not self.locked)
    @rule(path=st.sampled_from(PATHS), feature=st.sampled_from(FEATURES))
    def set_key(self, path, feature):
        value = self._tensor(feature)
        parent = parent_of(self.ref, path, create=False)
        blocked = parent is None and any(
            isinstance(leaves(self.ref).get(path[: i + 1]), torch.Tensor)
            for i in range(len(path) - 1)
        )
        if blocked:  # a tensor where the path needs a level
            self._expect_failure(lambda: self.td.set(path, value))
            return
        self.td.set(path, value)
        parent_of(self.ref, path, create=True)[path[-1]] = value.clone()

    @rule(path=st.sampled_from(PATHS), feature=st.sampled_from(FEATURES))
    def set_with_a_wrong_batch_size(self, path, feature):
        value = self._tensor(feature, batch=(BATCH + 1,))
        self._expect_failure(lambda: self.td.set(path, value))

    @precondition(lambda self: self.locked)
    @rule(path=st.sampled_from(PATHS))
    def new_key_in_a_locked_container(self, path):
        if path in leaves(self.ref) or parent_of(self.ref, path, create=False) is None:
            return
        self._expect_failure(lambda: self.td.set(path, self._tensor(())))

    @precondition(lambda self: not self.locked)
    @rule(path=st.sampled_from(PATHS + [("n",), ("k",)]))
    def delete(self, path):
        parent = parent_of(self.ref, path, create=False)
        if parent is None or path[-1] not in parent:
            self._expect_failure(lambda: self.td.del_(path))
            return
        self.td.del_(path)
        del parent[path[-1]]

    @rule(row=st.sampled_from(ROWS), scale=st.sampled_from([-1.0, 0.5, 2.0]))
    def write_rows(self, row, scale):
        # td[row] = a container shaped like td[row]; plain: every leaf's leaf[row] = ...
        rows = tree_map(lambda t: t[row] * scale + 1, self.ref)
        size = torch.zeros(BATCH)[row].shape
        self.td[row] = TensorDict(copy.deepcopy(rows), batch_size=size)
        for path, tensor in leaves(self.ref).items():
            if tensor is not None:
                tensor[row] = leaves(rows)[path]

    @rule(row=st.sampled_from(ROWS))
    def edit_a_row_view_in_place(self, row):
        # basic indexing gives views: an in-place edit of td[row] reaches td
        self.td[row].apply_(lambda t: t.add_(3))
        for tensor in leaves(self.ref).values():
            if tensor is not None:
                tensor[row] += 3

    @rule(path=st.sampled_from(PATHS))
    def set_in_place(self, path):
        # set_ copies into the existing tensor: allowed in a locked container
        tensor = leaves(self.ref).get(path)
        if not isinstance(tensor, torch.Tensor):
            self._expect_failure(lambda: self.td.set_(path, self._tensor(())))
            return
        value = self._tensor(tuple(tensor.shape[1:]))
        self.td.set_(path, value)
        tensor.copy_(value)

    @rule(mask=st.lists(st.booleans(), min_size=BATCH, max_size=BATCH))
    def write_masked_rows(self, mask):
        mask = torch.tensor(mask)
        rows = tree_map(lambda t: t[mask] - 2, self.ref)
        self.td[mask] = TensorDict(copy.deepcopy(rows), batch_size=[int(mask.sum())])
        for path, tensor in leaves(self.ref).items():
            if tensor is not None:
                tensor[mask] = leaves(rows)[path]

    @precondition(lambda self: isinstance(self.ref.get("n"), dict))
    @rule()
    def zero_a_nested_level(self):
        self.td.get("n").zero_()
        for tensor in leaves(self.ref["n"]).values():
            if tensor is not None:
                tensor.zero_()

    @precondition(lambda self: not self.locked and isinstance(self.ref.get("n"), dict))
    @rule(name=st.sampled_from(["w", "x"]), feature=st.sampled_from(FEATURES))
    def set_through_a_nested_level(self, name, feature):
        level = self.td.get("n")
        value = self._tensor(feature)
        level.set(name, value)
        self.ref["n"][name] = value.clone()

    @precondition(lambda self: not self.locked)
    @rule(paths=st.lists(st.sampled_from(PATHS), max_size=3, unique=True))
    def update(self, paths):
        updates = {}
        for path in paths:
            if parent_of(self.ref, path, create=False) is None and any(
                isinstance(leaves(self.ref).get(path[: i + 1]), torch.Tensor)
                for i in range(len(path) - 1)
            ):
                return  # a tensor in the way: covered by set_key
            updates[path] = self._tensor(())
        self.td.update({path: value.clone() for path, value in updates.items()})
        for path, value in updates.items():
            parent_of(self.ref, path, create=True)[path[-1]] = value

    @precondition(lambda self: not self.locked)
    @rule(
        old=st.sampled_from(["a", "b", "n"]),
        new=st.sampled_from(["a", "b", "c"]),
        safe=st.booleans(),
    )
    def rename(self, old, new, safe):
        # safe=False (the default) replaces an entry already under the new name
        if old not in self.ref or (safe and new in self.ref and new != old):
            self._expect_failure(lambda: self.td.rename_key_(old, new, safe=safe))
            return
        self.td.rename_key_(old, new, safe=safe)
        self.ref[new] = self.ref.pop(old)

    @rule(lock=st.booleans())
    def lock_or_unlock(self, lock):
        if lock:
            self.td.lock_()
        else:
            self.td.unlock_()
        self.locked = lock

    # ------------------------------------------------------------------ new objects
    @rule()
    def clone_is_independent(self):
        copy_ = self.td.clone()
        copy_.apply_(lambda t: t.mul_(0).add_(7))
        # the invariant checks that self.td kept its values
        assert all((t == 7).all() for t in copy_.values(include_nested=True, leaves_only=True))

    @rule(path=st.sampled_from(PATHS))
    def select_and_exclude(self, path):
        if not isinstance(leaves(self.ref).get(path), torch.Tensor):
            return
        picked = self.td.select(path)
        dropped = self.td.exclude(path)
        assert torch.equal(picked.get(path), leaves(self.ref)[path])
        assert path not in {
            k if isinstance(k, tuple) else (k,) for k in dropped.keys(include_nested=True)
        }
        assert picked.is_locked == dropped.is_locked == False  # noqa: E712 - new objects

    @rule()
    def pytree_round_trip(self):
        flat, spec = torch_pytree.tree_flatten(self.td)
        back = torch_pytree.tree_unflatten(flat, spec)
        assert back.batch_size == self.td.batch_size
        assert (back == self.td).all()

    @invariant()
    def same_keys_and_values(self):
        if not hasattr(self, "td"):
            return
        self._compare(leaves(self.ref))
        assert self.td.batch_size == torch.Size([BATCH])
        assert self.td.is_locked == self.locked
        for path, tensor in leaves(self.ref).items():
            if tensor is None:  # every nested level follows the root's lock
                assert self.td.get(path).is_locked == self.locked, path


ContainerVersusDicts.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestContainerVersusDicts = ContainerVersusDicts.TestCase
