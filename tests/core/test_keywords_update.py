"""tensordict keyword forms: ``update(is_leaf=, update_batch_size=)``,
``to_module(use_state_dict=)`` and ``select(as_tensordict=)``.

References are computed without tdfunc: plain dicts of tensors and
``nn.Module.state_dict``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tdfunc import TensorClass, TensorDict


def _flat(td) -> dict:
    return {k: v for k, v in td.items(include_nested=True, leaves_only=True)}


def _same(td, reference: dict) -> None:
    got = _flat(td)
    assert set(got) == set(reference)
    for key, value in reference.items():
        assert torch.equal(got[key], value), key


class Pair(TensorClass):
    a: torch.Tensor
    n: TensorDict | None = None


# ------------------------------------------------------------------ update(is_leaf=)
def test_update_is_leaf_writes_nested_whole():
    x, y, z = torch.zeros(2), torch.ones(2), torch.full((2,), 2.0)
    td = TensorDict({"n": {"x": x, "y": y}}, [2])
    td.update(TensorDict({"n": {"x": z}}, [2]), is_leaf=lambda cls: issubclass(cls, TensorDict))
    _same(td, {("n", "x"): z})  # replaced: "y" is gone


def test_update_is_leaf_false_merges_as_default():
    x, y, z = torch.zeros(2), torch.ones(2), torch.full((2,), 2.0)
    merged = TensorDict({"n": {"x": x, "y": y}}, [2])
    merged.update({"n": {"x": z}}, is_leaf=lambda cls: False)
    default = TensorDict({"n": {"x": x, "y": y}}, [2]).update({"n": {"x": z}})
    reference = {("n", "x"): z, ("n", "y"): y}
    _same(merged, reference)
    _same(default, reference)


def test_update_is_leaf_asks_about_mappings_as_tensordict():
    seen = []

    def is_leaf(cls):
        seen.append(cls)
        return True

    td = TensorDict({"n": {"x": torch.zeros(()), "y": torch.zeros(())}})
    td.update({"n": {"x": torch.ones(())}}, is_leaf=is_leaf)
    assert TensorDict in seen
    assert list(td.keys(True, True)) == [("n", "x")]


def test_update_is_leaf_on_tensorclass():
    obj = Pair(a=torch.zeros(2), n=TensorDict({"x": torch.zeros(2), "y": torch.zeros(2)}, [2]))
    obj.update({"n": {"x": torch.ones(2)}}, is_leaf=lambda cls: True)
    assert sorted(obj.n.keys()) == ["x"]


# ------------------------------------------------------------------ update(update_batch_size=)
def test_update_batch_size_takes_the_other_batch_size():
    a5, c5, x5 = torch.ones(5, 2), torch.ones(5), torch.ones(5, 4)
    td = TensorDict({"a": torch.zeros(3, 2), "n": {"x": torch.zeros(3)}}, [3])
    other = TensorDict({"a": a5, "c": c5, "n": TensorDict({"x": x5}, [5, 4])}, [5])
    out = td.update(other, update_batch_size=True)
    assert out is td
    assert td.batch_size == torch.Size([5])
    assert td["n"].batch_size == torch.Size([5, 4])  # merged nested ones follow too
    _same(td, {"a": a5, "c": c5, ("n", "x"): x5})


def test_update_batch_size_refuses_kept_entry_and_writes_nothing():
    before = {"a": torch.zeros(3, 2), "k": torch.zeros(3)}
    td = TensorDict(dict(before), [3])
    other = TensorDict({"a": torch.ones(5, 2)}, [5])
    with pytest.raises(ValueError, match="'k'"):
        td.update(other, update_batch_size=True)
    assert td.batch_size == torch.Size([3])
    _same(td, before)


def test_update_batch_size_false_keeps_the_old_check():
    td = TensorDict({"a": torch.zeros(3)}, [3])
    with pytest.raises(ValueError):
        td.update(TensorDict({"a": torch.ones(5)}, [5]))


@pytest.mark.parametrize("cls", ["td", "tc"])
def test_mismatched_batch_sizes_refused_even_without_entries(cls):
    # an empty source says nothing about entries, but its batch size still disagrees
    def make(size):
        if cls == "td":
            return TensorDict(batch_size=size)
        return Pair(a=torch.zeros(size), batch_size=size)

    td = make([3])
    with pytest.raises(RuntimeError, match="update_batch_size=True"):
        td.update(make([4]))
    assert td.batch_size == torch.Size([3])
    td.update(TensorDict(batch_size=[3, 2]))  # leading dims agree: allowed, as before
    td.update(TensorDict(batch_size=[]))
    assert td.batch_size == torch.Size([3])


def test_update_batch_size_in_place_refused_when_the_size_changes():
    before = {"a": torch.zeros(3)}
    td = TensorDict(dict(before), [3])
    with pytest.raises(RuntimeError, match="inplace=True"):
        td.update(TensorDict({"a": torch.ones(4)}, [4]), update_batch_size=True, inplace=True)
    _same(td, before)
    td.update(TensorDict({"a": torch.ones(3)}, [3]), update_batch_size=True, inplace=True)
    _same(td, {"a": torch.ones(3)})


def test_update_batch_size_locked_raises():
    td = TensorDict({"a": torch.zeros(3)}, [3]).lock_()
    with pytest.raises(RuntimeError, match="locked"):
        td.update(TensorDict({"a": torch.ones(5)}, [5]), update_batch_size=True)
    assert td.batch_size == torch.Size([3])


def test_update_batch_size_on_tensorclass():
    obj = Pair(a=torch.zeros(3), batch_size=[3])
    obj.update(TensorDict({"a": torch.ones(4, 2)}, [4, 2]), update_batch_size=True)
    assert obj.batch_size == torch.Size([4, 2])
    assert torch.equal(obj.a, torch.ones(4, 2))


# ------------------------------------------------------------------ to_module(use_state_dict=)
def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))


def test_to_module_use_state_dict_loads_and_returns_old_values():
    model = _model()
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    weight = model[0].weight
    params = TensorDict.from_module(model).apply(torch.zeros_like)
    old = params.to_module(model, use_state_dict=True)
    assert model[0].weight is weight  # loaded into the existing parameter
    for key, value in model.state_dict().items():
        assert torch.equal(value, torch.zeros_like(reference[key])), key
    _same(old, {tuple(k.split(".")): v for k, v in reference.items()})
    # the old values are copies: putting them back restores the module
    old.to_module(model, use_state_dict=True)
    for key, value in model.state_dict().items():
        assert torch.equal(value, reference[key]), key


def test_to_module_use_state_dict_runs_hooks():
    model = _model()
    calls = []
    model.register_load_state_dict_post_hook(lambda module, keys: calls.append(module))
    TensorDict.from_module(model).apply(torch.ones_like).to_module(model, use_state_dict=True)
    assert calls == [model]


def test_to_module_use_state_dict_subset_of_keys():
    model = _model()
    bias = model[0].bias.detach().clone()
    old = TensorDict({"0": {"weight": torch.ones(3, 2)}}).to_module(model, use_state_dict=True)
    assert torch.equal(model[0].weight.detach(), torch.ones(3, 2))
    assert torch.equal(model[0].bias.detach(), bias)
    assert list(old.keys(True, True)) == [("0", "weight")]


def test_to_module_use_state_dict_unknown_key():
    model = _model()
    with pytest.raises(KeyError, match="nope"):
        TensorDict({"nope": torch.ones(())}).to_module(model, use_state_dict=True)


def test_to_module_use_state_dict_refused_inside_vmap():
    model = _model()
    params = TensorDict.from_module(model)
    with pytest.raises(RuntimeError, match="vmap"):
        torch.func.vmap(lambda x: params.to_module(model, use_state_dict=True) and x)(
            torch.zeros(2)
        )


# ------------------------------------------------------------------ select(as_tensordict=)
def test_select_as_tensordict_on_tensorclass():
    a = torch.zeros(2)
    obj = Pair(a=a, n=TensorDict({"x": torch.ones(2)}, [2]), batch_size=[2])
    out = obj.select("a", as_tensordict=True)
    assert type(out) is TensorDict
    assert out.batch_size == torch.Size([2])
    assert list(out.keys()) == ["a"] and out["a"] is a
    assert type(obj.select("a")) is Pair


def test_select_as_tensordict_no_effect_on_tensordict():
    td = TensorDict({"a": torch.zeros(2), "b": torch.ones(2)}, [2])
    plain = td.select("a")
    flagged = td.select("a", as_tensordict=True)
    assert type(flagged) is TensorDict
    _same(flagged, _flat(plain))


def _plain_update(dest: dict, source: dict, wanted: list) -> dict:
    """tensordict's keys_to_update rule on plain nested dicts: a source leaf is written
    when it lies under a wanted key, or when a level leading to a wanted key is missing
    from ``dest`` (that level then comes whole)."""

    def leaves(tree, prefix=()):
        for k, v in tree.items():
            yield from leaves(v, prefix + (k,)) if isinstance(v, dict) else [(prefix + (k,), v)]

    def has(tree, parts):
        for p in parts:
            if not isinstance(tree, dict) or p not in tree:
                return False
            tree = tree[p]
        return True

    out = dict(leaves(dest))
    for parts, value in list(leaves(source)):
        for w in wanted:
            shared = [d for d in range(1, min(len(w), len(parts))) if parts[:d] == w[:d]]
            if parts[: len(w)] == w or any(not has(dest, parts[:d]) for d in shared):
                out[parts] = value
                break
    return {k[0] if len(k) == 1 else k: v for k, v in out.items()}  # keys as td gives them


@pytest.mark.parametrize(
    "wanted",
    [
        [("my", "father", "was"), ("my", "relentlessly")],
        [("my", "relentlessly")],
        [("n", "b")],
        [("n", "new", "deep")],
        [("x",), ("my",)],
    ],
)
def test_update_keys_to_update_brings_missing_levels_whole(wanted):
    def source() -> dict:
        return {
            "my": {
                "father": {"was": torch.ones(2), "a": torch.ones(2)},
                "relentlessly": torch.ones(2),
            },
            "n": {"b": torch.full((2,), 3.0), "c": torch.ones(2), "new": {"deep": torch.ones(2)}},
            "x": torch.full((2,), 5.0),
        }

    dest = {"n": {"b": torch.zeros(2), "c": torch.zeros(2)}, "x": torch.zeros(2)}
    td = TensorDict({"n": dict(dest["n"]), "x": dest["x"]}, [2])
    td.update(TensorDict(source(), [2]), keys_to_update=wanted)
    _same(td, _plain_update(dest, source(), wanted))
    mixed = TensorDict({"n": dict(dest["n"]), "x": dest["x"]}, [2])
    mixed.update(source(), keys_to_update=[(w[0], w[1:]) if len(w) > 1 else w for w in wanted])
    _same(mixed, _plain_update(dest, source(), wanted))
