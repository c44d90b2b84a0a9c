"""``rename_keys``: several keys renamed at once (swaps, chains, nested moves, emptied
levels removed), compared with tensordict 0.15.3 run in its own process."""

from __future__ import annotations

import pytest
import tensordict_peer
import torch

from tdfunc import TensorDict

PROBE = r"""
import torch
from LIB import TensorDict, TensorClass
def run(f):
    try: return f()
    except Exception as e: return type(e).__name__
def keys(td): return sorted(map(str, td.keys(True)))
td = TensorDict(a=torch.zeros(()), b=torch.ones(()), n=TensorDict(x=torch.zeros(()), e={}), s="str")
swapped = td.rename_keys({"a": "b", "b": "a"})
print(swapped["a"].item(), swapped["b"].item(), td["a"].item())
print(run(lambda: keys(td.rename_keys({"a": "b", "b": "c"}))))
print(run(lambda: keys(td.rename_keys({("n", "x"): "x"}))))
print(run(lambda: keys(td.rename_keys({"n": ("m", "k")}))))
print(run(lambda: keys(td.rename_keys({"s": ("n", "s")}))))
print(run(lambda: td.rename_keys({"s": "t"})["t"]))
print(run(lambda: td.rename_keys({"zz": "y"})))
print(run(lambda: keys(td.rename_keys({"zz": "y"}, strict=False))))
print(run(lambda: td.rename_keys({"a": "b"})))
print(run(lambda: td.rename_keys({"a": "c", "b": "c"})))
print(run(lambda: td.rename_keys({"n": "m", ("n", "x"): "y"})))
print(run(lambda: td.rename_keys({"a": ("q", "r"), "b": "q"})))
print(run(lambda: td.rename_keys({(): "q"})))
locked = td.clone().lock_()
print(run(lambda: locked.rename_keys({"a": "z"}).is_locked))
print(run(lambda: td.rename_keys({"a": "z"})["z"] is td["a"]))
class Foo(TensorClass):
    x: torch.Tensor
    y: torch.Tensor
foo = Foo(x=torch.zeros(3), y=torch.ones(3), batch_size=[3])
print(run(lambda: foo.rename_keys({"x": "y", "y": "x"}).x.tolist()))
print(run(lambda: type(foo.rename_keys({"x": "y", "y": "x"})).__name__))
print(run(lambda: foo.rename_keys({"x": "z"})))
print(run(lambda: foo.rename_keys({"x": "y"})))
"""


@pytest.mark.slow  # a tensordict process
def test_rename_keys_renames_as_tensordict_does():
    expected, got = tensordict_peer.printed_by_both(PROBE)
    assert got == expected


def test_the_source_is_unchanged_and_the_leaves_are_shared():
    td = TensorDict(a=torch.zeros(3), n={"x": torch.ones(3)}, batch_size=[3]).lock_()
    out = td.rename_keys({("n", "x"): "x", "a": ("m", "a")})
    assert set(td.keys(True)) == {"a", "n", ("n", "x")} and td.is_locked
    assert set(out.keys(True, True)) == {"x", ("m", "a")} and not out.is_locked
    assert out["x"] is td["n", "x"] and out["m", "a"] is td["a"]
    assert out["m"].batch_size == torch.Size([3])


def test_a_refused_renaming_names_the_keys():
    td = TensorDict(a=torch.zeros(()), b=torch.ones(()))
    with pytest.raises(ValueError, match=r"rename_keys: the sources 'a' and 'b' have the same"):
        td.rename_keys({"a": "c", "b": "c"})
    with pytest.raises(ValueError, match=r"destination 'b' is already present"):
        td.rename_keys({"a": "b"})
    with pytest.raises(KeyError, match="zz"):
        td.rename_keys({"zz": "y"})
    with pytest.raises(TypeError, match="expected a mapping"):
        td.rename_keys([("a", "b")])


def test_a_frozen_tensorclass_gives_a_new_frozen_instance():
    import dataclasses

    from tdfunc import TensorClass

    class Frozen(TensorClass["frozen"]):
        x: torch.Tensor
        y: torch.Tensor
        n: TensorDict = None

    source = Frozen(
        x=torch.zeros(2), y=torch.ones(2), n=TensorDict(a=torch.zeros(2), batch_size=[2]),
        batch_size=[2],
    )  # fmt: skip
    out = source.rename_keys({"x": "y", "y": "x", ("n", "a"): ("n", "b")})
    assert type(out) is Frozen and out.x is source.y and out.y is source.x
    assert list(out.n.keys()) == ["b"] and list(source.n.keys()) == ["a"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.x = torch.zeros(2)
    with pytest.raises(RuntimeError):
        out.n["c"] = torch.zeros(2)  # frozen is deep in the result too
    with pytest.raises(AttributeError, match="'z' is not a field of Frozen"):
        source.rename_keys({"x": "z"})
