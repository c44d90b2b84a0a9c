"""``key_transform=`` of the reductions renames the result's keys at every level; the
values are those of torch's reductions of each leaf."""

from __future__ import annotations

import pytest
import torch

from tdfunc import TensorClass, TensorDict


def _leaves() -> dict:
    g = torch.Generator().manual_seed(0)
    return {"a": torch.randn(3, 4, generator=g), "c": torch.randn(3, 2, generator=g)}


@pytest.mark.parametrize(
    ("name", "reference", "args"),
    [
        ("sum", lambda t: t.sum(0), ()),
        ("nansum", lambda t: t.nansum(0), ()),
        ("mean", lambda t: t.mean(0), ()),
        ("nanmean", lambda t: t.nanmean(0), ()),
        ("std", lambda t: t.std(0), ()),
        ("var", lambda t: t.var(0), ()),
        ("quantile", lambda t: torch.quantile(t, 0.5, 0), (0.5,)),
    ],
)
def test_key_transform_renames_every_level(name, reference, args):
    leaves = _leaves()
    td = TensorDict({"a": leaves["a"], "b": {"c": leaves["c"]}}, [3])
    out = getattr(td, name)(*args, dim=0, key_transform=lambda key: f"avg_{key}")
    assert set(out.keys(include_nested=True, leaves_only=True)) == {"avg_a", ("avg_b", "avg_c")}
    torch.testing.assert_close(out["avg_a"], reference(leaves["a"]))
    torch.testing.assert_close(out["avg_b", "avg_c"], reference(leaves["c"]))
    assert set(td.keys()) == {"a", "b"}  # the source keeps its keys


def test_key_transform_is_ignored_when_reduced_to_a_tensor():
    leaves = _leaves()
    td = TensorDict(leaves, [3])
    total = td.sum(reduce=True, key_transform=lambda key: f"x_{key}")
    torch.testing.assert_close(total, leaves["a"].sum() + leaves["c"].sum())


def test_key_transform_on_a_tensorclass_gives_a_tensordict_of_new_keys():
    class Pair(TensorClass):
        a: torch.Tensor

    pair = Pair(a=torch.arange(6.0).reshape(3, 2), batch_size=[3])
    out = pair.mean(key_transform=str.upper)
    assert list(out.keys()) == ["A"]
    torch.testing.assert_close(out["A"], torch.arange(6.0).mean())
