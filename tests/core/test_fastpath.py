"""The general fast paths: keys of any depth, tensor-subclass leaves, one index computation.

References are plain nested dicts (for keys) and plain tensors indexed leaf by leaf (for
indexing). Every case runs through the public API, so the fast path and the full path
behind it are both held to the same reference.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from tdfunc import TensorClass, TensorDict

BATCHES = [(4,), (4, 3), (2, 3, 4)]
DEEP_KEYS = [("a",), ("b", "c"), ("b", "d", "e"), ("b", "d", "f", "g")]


def _deep(batch: tuple) -> dict:
    g = torch.Generator().manual_seed(len(batch))
    leaf = lambda *feature: torch.randn(*batch, *feature, generator=g)  # noqa: E731
    return {"a": leaf(3), "b": {"c": leaf(4), "d": {"e": leaf(), "f": {"g": leaf(2)}}}}


def _at(tree: dict, key: tuple):
    for part in key:
        tree = tree[part]
    return tree


def _leaf_paths(tree: dict, prefix: tuple = ()) -> list[tuple]:
    paths = []
    for name, value in tree.items():
        if isinstance(value, dict):
            paths += _leaf_paths(value, prefix + (name,))
        else:
            paths.append(prefix + (name,))
    return paths


# ---------------------------------------------------------------- keys of any depth
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("key", DEEP_KEYS, ids=lambda k: f"depth{len(k)}")
def test_read_any_depth(batch, key):
    tree = _deep(batch)
    td = TensorDict(tree, batch_size=batch)
    expected = _at(tree, key)
    spelled = [key, key[0] if len(key) == 1 else (key[0], key[1:])]  # flat and nested tuples
    for k in spelled:
        assert td[k] is expected
        assert td.get(k) is expected
        assert td.get(k, None) is expected
        assert k in td
        assert k in td.keys(include_nested=True)


@pytest.mark.parametrize("key", [("b", "x"), ("b", "d", "x"), ("b", "d", "f", "g", "h")])
def test_missing_keys(key):
    td = TensorDict(_deep((4,)), batch_size=[4])
    assert key not in td
    assert td.get(key, "default") == "default"
    assert td.pop(key, "default") == "default"
    assert td.get(key) is None  # tensordict: get of a missing key gives None
    for read in (td.__getitem__, td.pop):
        with pytest.raises(KeyError):
            read(key)
    assert set(td.keys(True, True)) == {k if len(k) > 1 else k[0] for k in _leaf_paths(_deep((4,)))}


def test_a_leaf_in_the_way_and_bad_keys():
    td = TensorDict(_deep((4,)), batch_size=[4])
    with pytest.raises(KeyError, match="holds a Tensor"):
        td["a", "x"]
    assert ("a", "x") not in td
    for not_a_key in [("b", 3), (), 3]:  # a mistake, not a missing key (tensordict raises too)
        with pytest.raises(TypeError, match="NestedKey"):
            _ = not_a_key in td
    with pytest.raises(TypeError, match="NestedKey"):
        _ = [("b", "c")] in td  # a list is not a key
    with pytest.raises(TypeError, match="a key must be a str"):
        td.get(("b", 3))
    with pytest.raises(TypeError):
        td["b", 3]


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("key", DEEP_KEYS, ids=lambda k: f"depth{len(k)}")
def test_set_and_setitem_any_depth(batch, key):
    tree = _deep(batch)
    td = TensorDict(tree, batch_size=batch)
    for write in ("set", "setitem"):
        new = torch.randn_like(_at(tree, key))
        if write == "set":
            assert td.set(key, new) is td
        else:
            td[key] = new
        assert td[key] is new
        reference = _deep(batch)
        _at(reference, key[:-1])[key[-1]] = new
        for path in _leaf_paths(reference):
            assert torch.equal(td[path], _at(reference, path))


def test_set_new_levels_and_wrong_shapes():
    td = TensorDict(_deep((4, 3)), batch_size=[4, 3])
    td.set(("b", "d", "new", "deeper"), torch.zeros(4, 3, 2))  # levels created
    assert td["b", "d", "new"].batch_size == torch.Size([4, 3])
    with pytest.raises(ValueError, match="does not start with the batch size"):
        td.set(("b", "d", "e"), torch.zeros(4, 2))
    with pytest.raises(ValueError, match="does not start with the batch size"):
        td["b", "d", "f", "g"] = torch.zeros(4)  # fewer dims than the batch
    assert td["b", "d", "e"].shape == (4, 3)  # the failed writes changed nothing


def test_set_on_locked_or_device_containers_takes_the_full_path():
    td = TensorDict(_deep((4,)), batch_size=[4]).lock_()
    before = td["b", "d", "e"]
    td.set(("b", "d", "e"), torch.ones(4), inplace=True)
    assert td["b", "d", "e"] is before and torch.equal(before, torch.ones(4))
    with pytest.raises(RuntimeError, match="locked"):
        td.set(("b", "d", "e"), torch.ones(4))  # replacing the tensor is refused
    with pytest.raises(RuntimeError, match="locked"):
        td.set(("b", "d", "new"), torch.ones(4))
    with pytest.raises(RuntimeError, match="locked"):
        td.pop(("b", "d", "e"))
    on_device = TensorDict(_deep((4,)), batch_size=[4], device="cpu")
    value = torch.ones(4, dtype=torch.float64)
    on_device.set(("b", "d", "e"), value)
    assert on_device["b", "d", "e"] is value  # same device: stored as given


@pytest.mark.parametrize("key", DEEP_KEYS, ids=lambda k: f"depth{len(k)}")
def test_pop_any_depth(key):
    tree = _deep((2, 3, 4))
    td = TensorDict(tree, batch_size=[2, 3, 4])
    assert td.pop(key) is _at(tree, key)
    assert key not in td
    remaining = [p for p in _leaf_paths(tree) if p != key]
    assert set(td.keys(True, True)) == {p if len(p) > 1 else p[0] for p in remaining}


def test_keys_through_a_tensorclass():
    class Inner(TensorClass):
        x: torch.Tensor

    td = TensorDict({"tc": Inner(x=torch.zeros(3), batch_size=[3])}, batch_size=[3])
    assert td["tc", "x"].shape == (3,) and ("tc", "x") in td and ("tc", "y") not in td
    td.set(("tc", "x"), torch.ones(3))
    assert torch.equal(td["tc"].x, torch.ones(3))

    class Frozen(TensorClass["frozen"]):
        x: torch.Tensor

    frozen = TensorDict({"f": Frozen(x=torch.zeros(3), batch_size=[3])}, batch_size=[3])
    with pytest.raises(RuntimeError, match="frozen"):
        frozen.set(("f", "x"), torch.ones(3))


# ---------------------------------------------------------------- nn.Parameter leaves
def _params() -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    return {
        "0": {"weight": model[0].weight, "bias": model[0].bias},
        "2": dict(model[2].named_parameters()),
    }


def test_parameter_leaves_keep_their_type_and_are_not_copied():
    params = _params()
    td = TensorDict(params, batch_size=[])
    for path in _leaf_paths(params):
        assert td[path] is _at(params, path)
        assert td.get(path) is _at(params, path)
        assert type(td[path]) is nn.Parameter
    module = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    from_module = TensorDict.from_module(module)
    assert from_module["0", "weight"] is module[0].weight
    fresh = nn.Parameter(torch.zeros(4, 3))
    from_module.set(("0", "weight"), fresh)
    from_module["2", "bias"] = fresh[:2, 0]
    assert from_module["0", "weight"] is fresh and from_module.pop(("0", "weight")) is fresh


def test_parameter_leaves_with_a_batch():
    weight = nn.Parameter(torch.randn(4, 3))
    td = TensorDict({"w": weight, "n": {"w": weight}}, batch_size=[4])
    assert td["n", "w"] is weight and type(td["w"]) is nn.Parameter
    index = torch.tensor([3, 0])
    out = td[index]
    assert torch.equal(out["w"], weight[index]) and torch.equal(out["n", "w"], weight[index])
    with pytest.raises(ValueError, match="does not start with the batch size"):
        TensorDict({"w": weight}, batch_size=[3])


def test_other_tensor_subclasses_are_tensors():
    class Tagged(torch.Tensor):
        pass

    value = torch.zeros(4, 2).as_subclass(Tagged)
    td = TensorDict({"t": value}, batch_size=[4])
    assert td["t"] is value
    td.set(("n", "t"), value)
    td["n", "t"] = value
    assert td["n", "t"] is value
    assert torch.equal(td[torch.tensor([1, 2])]["t"], value[torch.tensor([1, 2])])


# ---------------------------------------------------------------- indexing once
def _mask(shape: tuple, every: int = 2) -> torch.Tensor:
    mask = torch.zeros(shape, dtype=torch.bool)
    mask.view(-1)[::every] = True
    return mask


def _indices(batch: tuple) -> list:
    n = batch[0]
    out = [
        torch.tensor([n - 1, 0, 0]),
        torch.tensor([-1, 0, -n]),  # negative positions
        torch.tensor([1, -1], dtype=torch.int32),
        torch.tensor([[0, 1], [1, 0]]),
        torch.tensor(1),
        [0, n - 1],
        [],
        _mask(batch),
        _mask(batch[:1]),
        torch.zeros(batch, dtype=torch.bool),  # empty mask
        torch.zeros(batch[:1], dtype=torch.bool),
        [True] * n,
        (Ellipsis, _mask(batch[-1:])),
    ]
    if len(batch) > 1:
        out += [
            (slice(None), torch.tensor([1, 0])),
            (slice(None), torch.tensor([-1])),
            (slice(None), _mask(batch[1:])),
            (torch.tensor([0, 1]), torch.tensor([1, 0])),
            (0, slice(None), torch.tensor([0]))[: len(batch)],
            (slice(1, None), torch.tensor([1])),
            (_mask(batch[:2]), Ellipsis),
        ]
    return out


def _explicit(index, ndim: int):
    """``index`` with its ellipsis spelled out over the batch dims."""
    if not isinstance(index, tuple) or Ellipsis not in index:
        return index
    used = sum(
        i.dim() if isinstance(i, torch.Tensor) and i.dtype is torch.bool else 1
        for i in index
        if i is not Ellipsis
    )
    at = index.index(Ellipsis)
    return index[:at] + (slice(None),) * (ndim - used) + index[at + 1 :]


def _case_ids(batch):
    return [f"{len(batch)}d-{i}" for i in range(len(_indices(batch)))]


CASES = [(batch, index) for batch in BATCHES for index in _indices(batch)]


@pytest.mark.parametrize(("batch", "index"), CASES, ids=[i for b in BATCHES for i in _case_ids(b)])
def test_advanced_index_equals_per_leaf_indexing(batch, index):
    tree = _deep(batch)
    tree["x"] = {"y": torch.randn(*batch, 2, 3)}
    td = TensorDict(tree, batch_size=batch)
    td["x"] = TensorDict(tree["x"], batch_size=(*batch, 2))  # one more batch dim inside
    td["note"] = "text"  # a non-tensor leaf
    out = td[index]
    expected_size = torch.zeros(batch)[index].shape
    assert out.batch_size == expected_size
    explicit = _explicit(index, len(batch))  # a leaf has feature dims after the batch
    for path in _leaf_paths(tree):
        expected = _at(tree, path)[explicit]
        assert out[path].shape == expected.shape and torch.equal(out[path], expected), path
    assert out["x"].batch_size == (*expected_size, 2)
    assert out["note"] == "text"


@pytest.mark.parametrize("batch", BATCHES)
def test_write_at_a_mask_equals_per_leaf_writes(batch):
    tree = _deep(batch)
    td = TensorDict(tree, batch_size=batch)
    mask = _mask(batch, 3)
    td[mask] = 7.0
    expected = _deep(batch)
    for path in _leaf_paths(expected):
        _at(expected, path[:-1])[path[-1]][mask] = 7.0
        assert torch.equal(td[path], _at(expected, path))
    empty = torch.zeros(batch, dtype=torch.bool)
    td[empty] = TensorDict({"a": torch.ones(0, 3)}, batch_size=[0])
    assert torch.equal(td["a"], _at(expected, ("a",)))


class _Ops(TorchDispatchMode):
    """Records every aten op and whether a bool tensor was among its arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, bool]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        flat = list(args) + list((kwargs or {}).values())
        has_bool = any(isinstance(a, torch.Tensor) and a.dtype is torch.bool for a in flat)
        self.ops.append((func.__name__, has_bool))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("batch", BATCHES)
def test_a_mask_is_resolved_once_for_every_leaf(batch):
    td = TensorDict(_deep(batch), batch_size=batch)
    mask = _mask(batch)
    with _Ops() as recorded:
        out = td[mask]
    names = [name for name, _ in recorded.ops]
    assert names.count("nonzero.default") == 1  # one host sync on CUDA, not one per leaf
    assert [name for name, has_bool in recorded.ops if has_bool] == ["nonzero.default"]
    assert out.batch_size == (int(mask.sum()),)


@pytest.mark.parametrize(
    ("index", "op"),
    [
        (torch.tensor([True, False, True, True]), "index_select.default"),
        (torch.tensor([2, 0]), "index.Tensor"),
        (torch.tensor([[0], [1]]), "index.Tensor"),
    ],
)
def test_each_leaf_is_indexed_once(index, op):
    td = TensorDict(_deep((4, 3)), batch_size=[4, 3])
    with _Ops() as recorded:
        td[index]
    names = [name for name, _ in recorded.ops]
    assert names.count(op) == len(_leaf_paths(_deep((4, 3))))


@pytest.mark.parametrize("index", [torch.tensor([4]), torch.tensor([-5]), [0, 9]])
def test_out_of_range_tensor_indices_raise(index):
    td = TensorDict(_deep((4,)), batch_size=[4])
    with pytest.raises(IndexError):
        td[index]
