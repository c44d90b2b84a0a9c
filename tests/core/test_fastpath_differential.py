"""The key-access fast paths and their general twins give the same answers.

``tdfunc/_core/helpers/fastpath.py`` serves ``[]``, ``get``, ``in``, ``set``,
``[] =`` and ``pop`` for the common cases; everything else goes through the general
path (key normalisation, ``tdfunc/_core/helpers/writes.py``, the error messages).
Here every operation of a random sequence runs twice, on two equal containers: once
as shipped, once with the fast paths reporting "not handled" (so the general path
does all the work). Results, errors and the containers after each step must agree.
"""

from __future__ import annotations

import contextlib
import random
from typing import Any

import pytest
import torch

from tdfunc import TensorClass, TensorDict
from tdfunc._core.helpers.fastpath import get_path
from tdfunc._core.helpers.nested_keys import MISSING, key_parts
from tdfunc._core.keys import access

KEYS = ["a", ("a",), ("b", "c"), ("b", "d", "e"), ("b", ("d", "e")), ("x", "y"), ("a", "z"), ()]


@contextlib.contextmanager
def _general_only(monkeypatch):
    """Every fast path of key access reports "not handled"."""
    with monkeypatch.context() as patch:
        patch.setattr(access, "lookup_nested", lambda td, key, _missing=MISSING: MISSING)
        patch.setattr(access, "set_fast", lambda td, key, value: False)
        patch.setattr(access, "pop_fast", lambda td, key: MISSING)
        # ``contains_missed`` trusts the fast lookup for flat keys: in its place, the
        # general question (the key normalised, then looked up)
        patch.setattr(access, "contains_missed", _contains_general)
        yield


def _contains_general(td, key) -> bool:
    return get_path(td, key_parts(key)) is not MISSING


class _Pair(TensorClass):
    c: torch.Tensor
    d: Any = None


def _start(batch: tuple, locked: bool, tensorclass: bool = False) -> TensorDict:
    nested: Any = {"c": torch.ones(batch), "d": {"e": torch.ones(*batch, 3)}}
    if tensorclass:  # a TensorClass level on the way: the fast paths hand it over
        inner = TensorDict({"e": torch.ones(*batch, 3)}, batch)
        nested = _Pair(c=torch.ones(batch), d=inner, batch_size=batch)
    td = TensorDict({"a": torch.zeros(*batch, 2), "b": nested}, batch)
    return td.lock_() if locked else td


def _value(rng: random.Random, batch: tuple):
    kind = rng.choice(["tensor", "parameter", "wrong shape", "number", "text"])
    if kind == "tensor":
        return torch.full((*batch, rng.choice([1, 2])), float(rng.randint(0, 9)))
    if kind == "parameter":
        return torch.nn.Parameter(torch.zeros(batch))
    if kind == "wrong shape":
        return torch.zeros(7, *batch)
    return rng.randint(0, 9) if kind == "number" else "text"


def _do(td: TensorDict, op: str, key, value):
    if op == "getitem":
        return td[key]
    if op == "get":
        return td.get(key)
    if op == "contains":
        return key in td
    if op == "set":
        td.set(key, value)
    elif op == "setitem":
        td[key] = value
    elif op == "pop":
        return td.pop(key)
    return None


def _outcome(td: TensorDict, op: str, key, value):
    try:
        return ("ok", _do(td, op, key, value))
    except Exception as error:  # the same error, type and message, on both paths
        return ("error", type(error), str(error))


def _same(left, right) -> bool:
    if isinstance(left, torch.Tensor):
        return (
            isinstance(right, torch.Tensor)
            and type(left) is type(right)
            and left.shape == right.shape
            and torch.equal(left.detach(), right.detach())
        )
    if isinstance(left, TensorDict):
        return isinstance(right, TensorDict) and _same(left.to_dict(), right.to_dict())
    if isinstance(left, dict):
        return (
            isinstance(right, dict)
            and list(left) == list(right)
            and all(_same(left[k], right[k]) for k in left)
        )
    if isinstance(left, tuple):
        return isinstance(right, tuple) and len(left) == len(right) and all(map(_same, left, right))
    return left == right


@pytest.mark.parametrize("seed", range(40))
def test_random_sequences_agree_with_the_general_path(seed, monkeypatch):
    rng = random.Random(seed)
    batch = rng.choice([(), (4,), (2, 3)])
    locked, tensorclass = seed % 5 == 0, seed % 3 == 1
    fast, general = _start(batch, locked, tensorclass), _start(batch, locked, tensorclass)
    for step in range(60):
        op = rng.choice(["getitem", "get", "contains", "set", "setitem", "pop"])
        key = rng.choice(KEYS)
        value = _value(rng, batch)
        got = _outcome(fast, op, key, value)
        with _general_only(monkeypatch):
            want = _outcome(general, op, key, value)
        context = f"seed {seed}, step {step}: {op} {key!r}"
        assert got[0] == want[0], (context, got, want)
        if got[0] == "error":
            assert got[1:] == want[1:], context
        else:
            assert _same(got[1], want[1]), (context, got, want)
        assert _same(fast.to_dict(), general.to_dict()), context
        assert fast.is_locked == general.is_locked


def test_the_patch_really_disables_the_fast_paths(monkeypatch):
    td = TensorDict({"a": {"b": torch.zeros(2)}}, [2])
    calls = []
    with _general_only(monkeypatch):
        monkeypatch.setattr(access, "key_parts", lambda key, *a: calls.append(key) or key)
        td.get(("a", "b"))
    assert calls == [("a", "b")]  # the general path normalised the key
