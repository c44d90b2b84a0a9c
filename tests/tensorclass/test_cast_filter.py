"""``cast_filter`` (a keyword of ``to`` and the dtype shorthands, and a TensorClass
option) and the ``skip_post_init_on_rebuild`` flag: compared with plain tensors cast one by
one, with tensordict 0.15.3 run in its own process, and their errors."""

# The probe below is one script run by both libraries; its lines are long.
# ruff: noqa: E501
from __future__ import annotations

import pytest
import tensordict_peer
import torch

from tdfunc import TensorClass, TensorDict, is_inexact, tensorclass

PROBE = r"""
import torch
from LIB import TensorDict, TensorClass, tensorclass, is_inexact
def dtypes(x):
    return sorted((str(k), str(v.dtype)) for k, v in x.items(True, True) if isinstance(v, torch.Tensor))
td = TensorDict(x=torch.zeros(3), i=torch.zeros(3, dtype=torch.long), b=torch.zeros(3, dtype=torch.bool), n=TensorDict(y=torch.zeros(3, dtype=torch.float64), j=torch.ones(3, dtype=torch.int32), batch_size=[3]), s="text", batch_size=[3])
seen = []
def spy(key, value):
    seen.append((key, str(value.dtype)))
    return key[0] != "n"
for cast in ("float", "double", "half", "bfloat16", "int"):
    print(cast, dtypes(getattr(td, cast)(cast_filter=is_inexact)), dtypes(getattr(td, cast)()))
print(dtypes(td.to(torch.float16, cast_filter=spy)), sorted(seen))
print(dtypes(td.to(torch.float16, cast_filter=None)), dtypes(td.to("cpu", cast_filter=spy)))
class Mesh(TensorClass, cast_filter=is_inexact):
    points: torch.Tensor
    cells: torch.Tensor
mesh = Mesh(points=torch.zeros(4, 3), cells=torch.zeros(2, 3, dtype=torch.long))
print(dtypes(mesh.bfloat16()), dtypes(mesh.bfloat16(cast_filter=None)), dtypes(mesh.to(torch.float64)), dtypes(mesh.double(cast_filter=lambda k, v: True)))
class Sub(Mesh):
    extra: torch.Tensor = None
print(dtypes(Sub(points=torch.zeros(1), cells=torch.zeros(1, dtype=torch.long), extra=torch.zeros(1, dtype=torch.int8)).half()))
print(dtypes(TensorDict(m=mesh).bfloat16()))
@tensorclass(cast_filter=lambda key, value: key != ("b",))
class R:
    a: torch.Tensor
    b: torch.Tensor
print(dtypes(R(a=torch.zeros(1), b=torch.zeros(1)).double()))
calls = []
class Foo(TensorClass["skip_post_init_on_rebuild"]):
    x: torch.Tensor
    def __post_init__(self):
        calls.append("init")
foo = Foo(x=torch.zeros(3), batch_size=[3])
for op in (lambda: foo.clone(), lambda: foo[:2], lambda: foo.to(torch.float64), lambda: foo.apply(lambda t: t + 1), lambda: torch.stack([foo, foo]), lambda: foo.unbind(0)):
    op()
print(calls)
Foo.from_tensordict(foo.to_tensordict()), Foo.from_dict({"x": torch.zeros(3)})
print(calls)
@tensorclass(skip_post_init_on_rebuild=True)
class Bar:
    x: torch.Tensor
    def __post_init__(self):
        calls.append("bar")
Bar(x=torch.zeros(2), batch_size=[2]).clone()[0]
print(calls)
"""


@pytest.mark.slow  # a tensordict process
def test_cast_filter_and_the_rebuild_flag_as_tensordict():
    expected, got = tensordict_peer.printed_by_both(PROBE)
    assert got == expected


def _reference(leaves: dict, dtype, keep) -> dict:
    """Each plain tensor cast, or not, by hand."""
    return {k: v if keep(k, v) else v.to(dtype) for k, v in leaves.items()}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64, torch.int32])
def test_the_filtered_leaves_keep_their_dtype(dtype):
    leaves = {
        ("x",): torch.rand(2, 3),
        ("i",): torch.arange(2),
        ("n", "y"): torch.rand(2, dtype=torch.float64),
        ("n", "m", "z"): torch.ones(2, dtype=torch.uint8),
    }
    td = TensorDict(batch_size=[2])
    for key, value in leaves.items():
        td.set(key, value)

    def cast_filter(key, value):
        return key[-1] != "y" and value.is_floating_point()

    got = td.to(dtype, cast_filter=cast_filter)
    expected = _reference(leaves, dtype, lambda k, v: not cast_filter(k, v))
    for key, value in expected.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value)
    # in place too, and a locked container accepts it when no leaf changes
    td.to(dtype, cast_filter=cast_filter, inplace=True)
    for key, value in expected.items():
        assert td[key].dtype == value.dtype


class _Mesh(TensorClass, cast_filter=is_inexact):
    points: torch.Tensor
    cells: torch.Tensor


class _Tagged(_Mesh):
    tag: torch.Tensor = None


@tensorclass(cast_filter=is_inexact, frozen=True)
class _Frozen:
    points: torch.Tensor
    cells: torch.Tensor


def test_the_class_default_is_inherited_and_overridden_by_the_call():
    mesh = _Mesh(points=torch.zeros(4, 3), cells=torch.zeros(2, 3, dtype=torch.long))
    assert mesh.bfloat16().cells.dtype == torch.int64 and mesh.half().points.dtype == torch.float16
    assert mesh.bfloat16(cast_filter=None).cells.dtype == torch.bfloat16
    assert (
        mesh.to(torch.float64, cast_filter=lambda k, v: k == ("cells",)).points.dtype
        == torch.float32
    )
    tagged = _Tagged(
        points=torch.zeros(1),
        cells=torch.zeros(1, dtype=torch.long),
        tag=torch.zeros(1, dtype=torch.int8),
    )
    out = tagged.double()
    assert (out.points.dtype, out.cells.dtype, out.tag.dtype) == (
        torch.float64,
        torch.int64,
        torch.int8,
    )
    frozen = _Frozen(points=torch.zeros(1), cells=torch.zeros(1, dtype=torch.long)).half()
    assert frozen.cells.dtype == torch.int64 and frozen.points.dtype == torch.float16
    # the class's filter is for calls on the class itself, not on a container holding it
    assert TensorDict(m=mesh).bfloat16()["m"].cells.dtype == torch.bfloat16
    # a move without a dtype never asks the filter
    asked = []
    mesh.to("cpu", cast_filter=lambda k, v: asked.append(k) or True)
    assert asked == []


def test_rebuilds_keep_the_filter_and_the_flag():
    calls = []

    class Checked(TensorClass["skip_post_init_on_rebuild"], cast_filter=is_inexact):
        x: torch.Tensor
        i: torch.Tensor

        def __post_init__(self):
            calls.append(len(self.x))

    item = Checked(x=torch.zeros(3), i=torch.arange(3), batch_size=[3])
    assert calls == [3]
    rebuilt = torch.stack([item.clone(), item[:3]]).apply(lambda t: t + 1)
    assert calls == [3]  # the data was checked when it came in
    assert rebuilt.half().i.dtype == torch.int64
    Checked.from_dict({"x": torch.zeros(2), "i": torch.arange(2)}, batch_size=[2])
    assert calls == [3, 2]
    assert Checked._tc_flags["skip_post_init_on_rebuild"]


def test_errors_name_the_api_and_the_problem():
    with pytest.raises(
        TypeError,
        match=r"_Bad: cast_filter must be a function \(key, value\) -> bool or None, got str",
    ):

        class _Bad(TensorClass, cast_filter="floats"):
            x: torch.Tensor

    td = TensorDict(x=torch.zeros(2))
    with pytest.raises(
        TypeError, match=r"TensorDict.to: cast_filter must be a function .* got int"
    ):
        td.to(torch.float64, cast_filter=1)
    shared = torch.zeros(2)
    twice = TensorDict(a=shared, b=shared)
    with pytest.raises(
        ValueError,
        match=r"the same tensor is at \('a',\) and \('b',\), and cast_filter casts it at one key only",
    ):
        twice.double(cast_filter=lambda k, v: k == ("a",))
    with pytest.raises(ValueError, match=r"unknown flag 'skip_post_init'"):
        TensorClass["skip_post_init"]
