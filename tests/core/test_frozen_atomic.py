"""Frozen is deep, writes through a parent never reach frozen data, writes are atomic."""

from __future__ import annotations

import pytest
import torch

from tdfunc import TensorClass, TensorDict


class Params(TensorClass["frozen"]):
    w: torch.Tensor
    sub: TensorDict


def _params() -> Params:
    return Params(
        w=torch.ones(3),
        sub=TensorDict({"x": torch.ones(3), "d": {"y": torch.ones(3)}}, [3]),
        batch_size=[3],
    )


def _snapshot(td) -> dict:
    """Plain copies of every tensor leaf, by key path (the reference, without tdfunc ops)."""
    return {key: td.get(key).clone() for key in td.keys(True, True)}


def _same(td, snapshot: dict) -> bool:
    return set(td.keys(True, True)) == set(snapshot) and all(
        torch.equal(td.get(key), value) for key, value in snapshot.items()
    )


@pytest.mark.parametrize(
    "write",
    [
        lambda s: s.set_("x", torch.zeros(3)),
        lambda s: s.__setitem__("x", torch.zeros(3)),
        lambda s: s.__setitem__(("d", "y"), torch.zeros(3)),
        lambda s: s.__setitem__(0, 0.0),
        lambda s: s.update_({"x": torch.zeros(3)}),
        lambda s: s.update({"x": torch.zeros(3)}),
        lambda s: s.set("new", torch.zeros(3)),
        lambda s: s["d"].set_("y", torch.zeros(3)),
        lambda s: s.apply_(lambda t: t * 0),
        lambda s: s.zero_(),
        lambda s: s.fill_("x", 0.0),
        lambda s: s.add_(1.0),
        lambda s: s.mul_(0.0),
        lambda s: s.unlock_().set("new", torch.zeros(3)),
        lambda s: s.memmap_(),
    ],
)
def test_a_nested_tensordict_of_a_frozen_tensorclass_is_frozen(write):
    params = _params()
    before = _snapshot(params.sub)
    with pytest.raises(RuntimeError, match="frozen"):
        write(params.sub)
    assert _same(params.sub, before)
    assert params.sub.is_locked


@pytest.mark.parametrize(
    "write",
    [
        lambda parent, path: parent.apply_(lambda t: t * 0),
        lambda parent, path: parent.load_memmap_(path),
        lambda parent, path: parent.memmap_(),
        lambda parent, path: parent.zero_(),
        lambda parent, path: parent.add_(1.0),
        lambda parent, path: parent.__setitem__(0, 0.0),
        lambda parent, path: parent.update_({"p": {"sub": {"x": torch.zeros(3)}}}),
        lambda parent, path: parent.detach_(),
    ],
)
def test_writes_through_a_parent_never_reach_a_frozen_child(tmp_path, write):
    parent = TensorDict({"a": torch.ones(3), "p": _params()}, [3])
    saved = parent.apply(lambda t: t * 5).memmap(tmp_path / "saved")
    before = _snapshot(parent)
    with pytest.raises(RuntimeError, match="frozen"):
        write(parent, tmp_path / "saved")
    assert _same(parent, before)  # nothing written, not even outside the frozen child
    assert saved["a"].tolist() == [5.0] * 3


def test_frozen_instances_rebuilt_by_operations_are_deep_frozen():
    params = _params()
    for rebuilt in (
        params[1:],
        params.clone(),
        torch.stack([params, params]),
        params.apply(lambda t: t + 1),
    ):
        with pytest.raises(RuntimeError, match="frozen"):
            rebuilt.sub.set_("x", torch.zeros(rebuilt.sub["x"].shape))


# ---------------------------------------------------------------------------- atomic writes
def _targets():
    leaf = torch.zeros(3, requires_grad=True)  # copy_ into it raises under grad mode
    expanded = torch.zeros(1).expand(3)  # copy_ into it raises (elements share memory)
    return leaf, expanded


@pytest.mark.parametrize("bad", ["requires_grad", "expanded"])
@pytest.mark.parametrize(
    "write",
    [
        lambda td, v: td.update_({"a": v, "b": v, "bad": v}),
        lambda td, v: td.update({"a": v, "new": v, "bad": v}, inplace=True),
        lambda td, v: td.set_("bad", v),
        lambda td, v: td.__setitem__(slice(None), TensorDict({"a": v, "b": v, "bad": v}, [3])),
        lambda td, v: td.__setitem__(0, 1.0),
    ],
)
def test_a_failing_copy_writes_nothing(bad, write):
    leaf, expanded = _targets()
    td = TensorDict(
        {
            "a": torch.zeros(3),
            "b": torch.zeros(3),
            "bad": leaf if bad == "requires_grad" else expanded,
        },
        [3],
    )
    before = {k: v.detach().clone() for k, v in td.items()}
    keys = set(td.keys())
    with pytest.raises(RuntimeError, match="Nothing was written"):
        write(td, torch.ones(3))
    assert set(td.keys()) == keys
    for key, value in before.items():
        assert torch.equal(td[key].detach(), value), key
    with torch.no_grad():  # the hint: under no_grad a leaf that requires grad is writable
        if bad == "requires_grad":
            td.set_("bad", torch.ones(3))
            assert leaf.tolist() == [1.0] * 3


# ---------------------------------------------------------------------------- unflatten_keys
@pytest.mark.parametrize(
    "data",
    [
        {"a": {"b": torch.zeros(())}, "a.b": torch.ones(())},
        {"a.b": torch.ones(()), "a": {"b": torch.zeros(())}},
        {"a.b": torch.ones(()), "a.b.c": torch.zeros(())},
        {"a.b.c": torch.ones(()), "a.b": torch.zeros(())},
    ],
)
def test_unflatten_keys_refuses_colliding_keys_like_flatten_keys(data):
    with pytest.raises(KeyError, match="both unflatten"):
        TensorDict(data).unflatten_keys(".")
    nested = TensorDict({"a": {"b": torch.zeros(())}, "a_b": torch.ones(())})
    with pytest.raises(KeyError, match="two keys flatten"):
        TensorDict({"a_b": torch.ones(()), **nested.to_dict()}).flatten_keys("_")


def test_unflatten_keys_merges_disjoint_keys():
    td = TensorDict({"a.b": torch.ones(()), "a.c": torch.zeros(()), "a": {"d": torch.ones(())}})
    out = td.unflatten_keys(".")
    assert sorted(out.keys(True, True)) == [("a", "b"), ("a", "c"), ("a", "d")]
