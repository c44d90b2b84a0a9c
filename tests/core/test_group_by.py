"""``group_by``: the groups equal a Python loop over the rows, tensordict 0.15.3 gives the
same (run in its own process), and its errors name the function and the problem."""

# The probe below is one script run by both libraries; its lines are long.
# ruff: noqa: E501
from __future__ import annotations

import pytest
import tensordict_peer
import torch

from tdfunc import NonTensorStack, TensorDict, group_by, tensorclass

PROBE = r"""
import torch
from LIB import TensorDict, group_by, NonTensorStack
def run(f):
    try: return f()
    except Exception as e: return type(e).__name__
def show(r):
    values, groups = r
    v = values.tolist() if isinstance(values, torch.Tensor) else values
    return v, type(groups).__name__, [(type(g).__name__, list(g.batch_size), sorted((str(k), x.tolist()) for k, x in g.items(True, True) if isinstance(x, torch.Tensor))) for g in groups]
g = torch.Generator().manual_seed(0)
for n in (1, 5, 9):
    td = TensorDict(uid=torch.randint(0, 3, (n,), generator=g), r=torch.arange(float(n)), n=TensorDict(z=torch.randint(0, 2, (n, 2), generator=g), batch_size=[n, 2]), batch_size=[n])
    print(show(group_by(td, "uid")), show(group_by(td, ("n", "z"))))
print(show(group_by(TensorDict(k=torch.tensor([[1, 2], [0, 1], [1, 2]]), r=torch.arange(3), batch_size=[3]), "k")))
print(show(group_by(TensorDict(name=NonTensorStack("b", "a", "b"), r=torch.arange(3), batch_size=[3]), "name")))
print(show(group_by(TensorDict(name="same", r=torch.arange(3), batch_size=[3]), "name")))
print(show(group_by(TensorDict(u=torch.tensor([[1, 0], [1, 1]]), r=torch.arange(4).view(2, 2), batch_size=[2, 2]), "u")))
print(show(group_by(TensorDict(u=torch.tensor([0.5, float("nan"), 0.5, float("nan")]), batch_size=[4]), "u")))
print(show(group_by(TensorDict(u=torch.tensor([True, False, True]), batch_size=[3]), "u")))
print(show(group_by(TensorDict(u=torch.tensor([3, 1]), batch_size=[2])[:0], "u")))
td = TensorDict(u=torch.tensor([1, 0]), n=TensorDict(batch_size=[2]), s=NonTensorStack(1, "a"), batch_size=[2])
print(run(lambda: group_by(TensorDict(u=torch.ones(3)), "u")), run(lambda: group_by(td, "zz")), run(lambda: group_by(td, "n")), run(lambda: group_by(td, "s")))
"""


@pytest.mark.slow  # a tensordict process
def test_group_by_as_tensordict():
    expected, got = tensordict_peer.printed_by_both(PROBE)
    assert got == expected


def _loop_groups(rows: list, payload: list) -> tuple[list, list]:
    """The reference: a dict of lists filled row by row, its keys sorted."""
    found: dict = {}
    for row, item in zip(rows, payload, strict=True):
        found.setdefault(row, []).append(item)
    keys = sorted(found)
    return keys, [found[k] for k in keys]


@pytest.mark.parametrize("n", [0, 1, 2, 7, 40])
def test_groups_equal_a_loop_over_the_rows(n):
    g = torch.Generator().manual_seed(n)
    uid = torch.randint(0, 4, (n,), generator=g)
    pair = torch.randint(0, 2, (n, 2), generator=g)
    td = TensorDict(uid=uid, pair=pair, i=torch.arange(n), batch_size=[n])
    for key, rows in (("uid", uid.tolist()), ("pair", [tuple(r) for r in pair.tolist()])):
        values, groups = group_by(td, key)
        expected_values, expected_groups = _loop_groups(rows, list(range(n)))
        got_values = values.tolist()
        assert [tuple(v) if isinstance(v, list) else v for v in got_values] == expected_values
        assert [group["i"].tolist() for group in groups] == expected_groups
        assert all(type(group) is TensorDict for group in groups)


def test_a_batch_of_several_dims_and_a_nested_entry():
    td = TensorDict(
        u=torch.tensor([[1, 0], [0, 0], [1, 0]]),
        n=TensorDict(x=torch.arange(6).view(3, 2), batch_size=[3, 2]),
        batch_size=[3, 2],
        names=["row", "col"],
    ).lock_()
    values, groups = group_by(td, "u")
    assert values.tolist() == [[0, 0], [1, 0]]
    assert [group["n", "x"].tolist() for group in groups] == [[[2, 3]], [[0, 1], [4, 5]]]
    assert groups[1].batch_size == torch.Size([2, 2]) and groups[1].names == ["row", "col"]
    assert td.is_locked  # the input is unchanged


def test_non_tensor_values():
    td = TensorDict(name=NonTensorStack("b", "a", "b", "c"), i=torch.arange(4), batch_size=[4])
    values, groups = group_by(td, "name")
    assert values == ["a", "b", "c"]
    assert [group["i"].tolist() for group in groups] == [[1], [0, 2], [3]]
    lists = TensorDict(v=NonTensorStack([1, 2], [0], [1, 2]), batch_size=[3])
    assert group_by(lists, "v")[0] == [(0,), (1, 2)]
    same = TensorDict(v="x", i=torch.arange(3), batch_size=[3])
    values, groups = group_by(same, "v")
    assert values == ["x"] and groups[0]["i"].tolist() == [0, 1, 2]


@tensorclass
class _Episode:
    uid: torch.Tensor
    reward: torch.Tensor


def test_a_tensorclass_gives_groups_of_its_class():
    ep = _Episode(uid=torch.tensor([1, 0, 1]), reward=torch.arange(3.0), batch_size=[3])
    values, groups = group_by(ep, "uid")
    assert values.tolist() == [0, 1] and all(type(group) is _Episode for group in groups)
    assert [group.reward.tolist() for group in groups] == [[1.0], [0.0, 2.0]]


def test_the_groups_are_views_of_one_gather():
    td = TensorDict(u=torch.tensor([1, 0, 1, 0]), x=torch.arange(4.0), batch_size=[4])
    _, groups = group_by(td, "u")
    assert (
        groups[0]["x"].untyped_storage().data_ptr() == groups[1]["x"].untyped_storage().data_ptr()
    )


def test_errors_name_the_function_and_the_problem():
    td = TensorDict(
        u=torch.tensor([1, 0]),
        n=TensorDict(batch_size=[2]),
        s=NonTensorStack(1, "a"),
        batch_size=[2],
    )
    with pytest.raises(
        TypeError,
        match=r"tdfunc.group_by: expected a TensorDict or a TensorClass instance, got Tensor",
    ):
        group_by(torch.ones(3), "u")
    with pytest.raises(
        ValueError,
        match=r"tdfunc.group_by: the rows are taken along the first batch dim, and the container has none \(batch size \[\]\)",
    ):
        group_by(TensorDict(u=torch.ones(3)), "u")
    with pytest.raises(KeyError, match=r"tdfunc.group_by: the container has no entry 'zz'"):
        group_by(td, "zz")
    with pytest.raises(TypeError, match=r"tdfunc.group_by: the entry 'n' is a TensorDict"):
        group_by(td, "n")
    with pytest.raises(TypeError, match="must be hashable and sortable"):
        group_by(td, "s")
    with pytest.raises(TypeError, match="must be hashable and sortable"):
        group_by(TensorDict(v=NonTensorStack({"a": 1}, {"a": 2}), batch_size=[2]), "v")
