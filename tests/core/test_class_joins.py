"""``stack`` / ``cat`` / ``maybe_dense_stack`` / ``fromkeys`` called on a container class.

Each result is compared leaf by leaf with ``torch.stack`` / ``torch.cat`` of the plain
tensors (and ``dict.fromkeys``); called on a TensorClass, or on TensorDict with
TensorClass inputs, the result has the class of the inputs.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tdfunc import TensorClass, TensorDict


class Pair(TensorClass):
    foo: Any
    bar: Any


class PairChild(Pair):
    pass


def _plain(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"foo": torch.randn(3, 2, generator=g), "bar": torch.randn(3, generator=g)}


@pytest.mark.parametrize("cls", [TensorDict, Pair, PairChild])
@pytest.mark.parametrize(("name", "torch_fn"), [("stack", torch.stack), ("cat", torch.cat),
                                                 ("maybe_dense_stack", torch.stack)])  # fmt: skip
@pytest.mark.parametrize("dim", [0, -1])
def test_joins_match_torch_per_leaf(cls, name, torch_fn, dim):
    plains = [_plain(0), _plain(1), _plain(2)]
    items = [cls.from_dict(p, batch_size=[3]) for p in plains]
    out = getattr(cls, name)(items, dim)
    assert type(out) is cls
    for key in ("foo", "bar"):
        # dim counts batch dims: -1 of batch [3] is batch dim 0 (0 for stack: a new last one)
        leaf_dim = dim if dim >= 0 else (1 if torch_fn is torch.stack else 0)
        expected = torch_fn([p[key] for p in plains], leaf_dim)
        assert torch.equal(out[key], expected)


def test_the_inputs_class_wins_over_the_called_class():
    items = [Pair.from_dict(_plain(i), batch_size=[3]) for i in range(2)]
    assert type(TensorDict.stack(items)) is Pair
    assert type(TensorDict.cat(items)) is Pair


def test_tensors_join_as_torch_joins_them():
    tensors = [torch.arange(3.0), torch.ones(3)]
    assert torch.equal(TensorDict.stack(tensors, 1), torch.stack(tensors, 1))
    assert torch.equal(Pair.cat(tensors), torch.cat(tensors))


def test_stack_into_out_writes_in_place():
    plains = [_plain(0), _plain(1)]
    out = TensorDict.from_dict(
        {"foo": torch.zeros(2, 3, 2), "bar": torch.zeros(2, 3)}, batch_size=[2, 3]
    )
    before = {k: v.data_ptr() for k, v in out.items()}
    result = TensorDict.stack([TensorDict.from_dict(p, batch_size=[3]) for p in plains], out=out)
    assert result is out
    assert {k: v.data_ptr() for k, v in out.items()} == before
    assert torch.equal(out["foo"], torch.stack([p["foo"] for p in plains]))


def test_maybe_dense_stack_of_different_structures_is_an_error():
    a = TensorDict({"x": torch.zeros(3)}, [3])
    b = TensorDict({"y": torch.zeros(3)}, [3])
    with pytest.raises((KeyError, ValueError, RuntimeError)):
        TensorDict.maybe_dense_stack([a, b])


@pytest.mark.parametrize("cls", [TensorDict, Pair, PairChild])
def test_fromkeys_matches_dict_fromkeys(cls):
    value = torch.arange(4.0)
    out = cls.fromkeys(["foo", "bar"], value, batch_size=[4])
    assert type(out) is cls and out.batch_size == torch.Size([4])
    reference = dict.fromkeys(["foo", "bar"], value)
    for key, expected in reference.items():
        assert torch.equal(out[key], expected)
        assert out[key].data_ptr() != value.data_ptr()  # each key gets its own copy
    assert torch.equal(cls.fromkeys(["foo", "bar"])["bar"], torch.tensor(0))


def test_fromkeys_nested_keys_on_tensordict():
    out = TensorDict.fromkeys(["a", ("nested", "e")], 1.5)
    assert out["nested", "e"].item() == 1.5 and out["a"].item() == 1.5
