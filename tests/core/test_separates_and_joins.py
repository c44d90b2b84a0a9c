"""``separates`` (keys moved out into a new container) and ``cat_from_tensordict`` /
``stack_from_tensordict`` (every leaf joined into one tensor).

References are plain dicts and ``torch.cat`` / ``torch.stack`` of the plain tensors.
"""

from __future__ import annotations

import pytest
import torch

from tdfunc import TensorDict


def _plain() -> dict:
    return {"a": torch.arange(12.0).reshape(3, 4), ("b", "c"): torch.ones(3, 4)}


def _td() -> TensorDict:
    plain = _plain()
    return TensorDict({"a": plain["a"], "b": {"c": plain["b", "c"]}}, [3, 4])


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat_and_stack_from_tensordict(dim):
    plain = list(_plain().values())
    assert torch.equal(_td().cat_from_tensordict(dim=dim), torch.cat(plain, dim))
    assert torch.equal(_td().stack_from_tensordict(dim=dim), torch.stack(plain, dim))
    reverse = [("b", "c"), "a"]
    assert torch.equal(_td().cat_from_tensordict(sorted=reverse), torch.cat(plain[::-1]))
    out = torch.empty(6, 4)
    assert _td().cat_from_tensordict(out=out) is out and torch.equal(out, torch.cat(plain))


def test_separates_moves_keys_out():
    td = TensorDict(a=0, b=TensorDict(c=0, d=0), unique=TensorDict(val=0))
    out = td.separates("a", ("b", ("d",)), ("unique", "val"))
    assert sorted(out.keys(True, True), key=str) == sorted(
        ["a", ("b", "d"), ("unique", "val")], key=str
    )
    assert sorted(td.keys(True), key=str) == sorted(["b", ("b", "c")], key=str)
    with pytest.raises(KeyError):
        TensorDict(a=0).separates("a", "e")
    kept = TensorDict(a=0, unique=TensorDict(val=0))
    out = kept.separates("a", ("unique", "val"), "e", default=None, filter_empty=False)
    assert out["e"] is None and "unique" in kept and "a" not in kept
    assert sorted(TensorDict(a=0).separates("a", "e", strict=False).keys()) == ["a"]
