"""The ``default=`` keyword of the binary methods (``add``, ``sub``, ``rsub``, ``mul``,
``div``, ``pow``, ``maximum``, ``minimum``, ``clamp_min``, ``clamp_max``, ``bitwise_and``,
``logical_and``): compared with plain tensors over random trees, with tensordict 0.15.3
run in its own process, and its errors."""

# The probe below is one script run by both libraries; its lines are long.
# ruff: noqa: E501
from __future__ import annotations

import random

import pytest
import tensordict_peer
import torch

from tdfunc import TensorDict, tensorclass

OPS = {
    "add": torch.add,
    "sub": torch.sub,
    "rsub": lambda a, b: torch.sub(b, a),
    "mul": torch.mul,
    "div": torch.div,
    "pow": torch.pow,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "clamp_min": torch.clamp_min,
    "clamp_max": torch.clamp_max,
}

PROBE = r"""
import random, torch
from LIB import TensorDict
OPS = ["add", "sub", "rsub", "mul", "div", "pow", "maximum", "minimum", "clamp_min", "clamp_max"]
def run(f):
    try: return f()
    except Exception as e: return type(e).__name__
def tree(rng, depth=0):
    # "x" is in every tree; "n" and "m" are trees wherever they occur, the others tensors
    out = {"x": torch.rand(3, 2, generator=g) + 0.5}
    for name in rng.sample("abmn", rng.randint(0, 4)):
        if name in "mn" and depth < 2:
            out[name] = tree(rng, depth + 1)
        elif name in "ab":
            out[name] = torch.rand(3, rng.randint(1, 2), generator=g) + 0.5
    return out
def flat(td):
    return sorted(("/".join(k) if isinstance(k, tuple) else k, [round(x, 4) for x in v.flatten().tolist()]) for k, v in td.items(True, True))
g = torch.Generator().manual_seed(0)
rng = random.Random(0)
for trial in range(12):
    a = TensorDict(tree(rng), batch_size=[3])
    b = TensorDict(tree(rng), batch_size=[3])
    op = OPS[trial % len(OPS)]
    print(op, run(lambda: flat(getattr(a, op)(b, default="intersection"))))
    print(op, run(lambda: flat(getattr(a, op)(b, default=torch.tensor(2.0)))))
    print(op, run(lambda: flat(getattr(a, op)(b))))
a = TensorDict(a=torch.ones(2), b=torch.full((2,), 2.0), batch_size=[2])
b = TensorDict(b=torch.full((2,), 3.0), c=torch.full((2,), 4.0), batch_size=[2])
print(flat(a.add(b, alpha=2, default=torch.tensor(1.0))), flat(a.sub(b, alpha=2, default=torch.tensor(1.0))), flat(a.rsub(b, alpha=2, default=torch.tensor(1.0))))
print(flat(a.add(b, default=torch.ones(2))), flat(a.add(1.0, default="intersection")), run(lambda: a.add(b, default=1.0)))
m = TensorDict(x=torch.tensor([True, False]), y=torch.tensor([True, True]), batch_size=[2])
n = TensorDict(x=torch.tensor([True, True]), z=torch.tensor([False, True]), batch_size=[2])
print(flat(m.logical_and(n, default="intersection")), flat(m.logical_and(n, default=torch.tensor(False))), flat(m.bitwise_and(n, default=torch.tensor(True))))
print(flat(TensorDict(a=torch.ones(1, 3), batch_size=[1]).add(TensorDict(a=torch.ones(4, 3), b=torch.ones(4), batch_size=[4]), default=torch.zeros(()))))
print(a.clone().refine_names("t").add(b, default=torch.zeros(())).names, a.add(b, default=torch.zeros((), dtype=torch.float64))["c"].dtype)
print(flat(TensorDict(n={"x": torch.ones(2)}).add(TensorDict(n={"z": torch.ones(2), "x": torch.ones(2)}), default=torch.zeros(()))))
"""


@pytest.mark.slow  # a tensordict process
def test_default_keys_as_tensordict():
    expected, got = tensordict_peer.printed_by_both(PROBE)
    assert got == expected


def _random_tree(rng: random.Random, gen: torch.Generator, depth: int = 0) -> dict:
    out = {}
    for name in rng.sample("abcde", rng.randint(0, 4)):
        if depth < 2 and rng.random() < 0.3:
            out[name] = _random_tree(rng, gen, depth + 1)
        else:
            out[name] = torch.rand(2, 3, generator=gen) + 0.5
    return out


def _leaves(tree: dict, prefix: tuple = ()) -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_leaves(value, (*prefix, key)))
        else:
            out[(*prefix, key)] = value
    return out


def _reference(mine: dict, theirs: dict, fn, fill) -> dict:
    """The expected leaves, from plain tensors: paired by key path."""
    left, right = _leaves(mine), _leaves(theirs)
    out = {}
    for path in {*left, *right}:
        if path in left and path in right:
            out[path] = fn(left[path], right[path])
        elif fill is not None:
            out[path] = fn(left[path], fill) if path in left else fn(fill, right[path])
    return out


def _kinds_agree(mine: dict, theirs: dict) -> bool:
    # a key that is a tree on one side and a tensor on the other is refused with a tensor
    # default (tested on its own below)
    for key in mine.keys() & theirs.keys():
        if isinstance(mine[key], dict) != isinstance(theirs[key], dict):
            return False
        if isinstance(mine[key], dict) and not _kinds_agree(mine[key], theirs[key]):
            return False
    return True


@pytest.mark.parametrize("name", sorted(OPS))
def test_each_op_against_plain_tensors_over_random_trees(name):
    rng, gen = random.Random(name), torch.Generator().manual_seed(len(name))
    for _ in range(15):
        mine, theirs = _random_tree(rng, gen), _random_tree(rng, gen)
        a, b = TensorDict(mine, batch_size=[2]), TensorDict(theirs, batch_size=[2])
        for fill in (None, torch.tensor(0.75)):
            default = "intersection" if fill is None else fill
            if fill is not None and not _kinds_agree(mine, theirs):
                continue
            got = getattr(a, name)(b, default=default)
            expected = _reference(mine, theirs, OPS[name], fill)
            leaves = {k if isinstance(k, tuple) else (k,): v for k, v in got.items(True, True)}
            assert set(leaves) == set(expected)
            for path, value in expected.items():
                torch.testing.assert_close(leaves[path], value)
            assert got.batch_size == torch.Size([2])


def test_alpha_and_the_logical_ops_against_plain_tensors():
    x, y, z = torch.rand(3), torch.rand(3), torch.rand(3)
    a, b = TensorDict(x=x, y=y, batch_size=[3]), TensorDict(y=z, w=x, batch_size=[3])
    fill = torch.tensor(0.5)
    out = a.add(b, alpha=3, default=fill)
    torch.testing.assert_close(out["x"], x + 3 * fill)
    torch.testing.assert_close(out["y"], y + 3 * z)
    torch.testing.assert_close(out["w"], fill + 3 * x)
    out = a.rsub(b, alpha=2, default=fill)
    torch.testing.assert_close(out["x"], fill - 2 * x)
    torch.testing.assert_close(out["w"], x - 2 * fill)
    p = TensorDict(x=torch.tensor([1, 0, 1]), batch_size=[3])
    q = TensorDict(x=torch.tensor([1, 1, 0]), v=torch.tensor([3, 0, 3]), batch_size=[3])
    out = p.logical_and(q, default=torch.tensor(True))
    assert out["x"].tolist() == [True, False, False] and out["v"].tolist() == [True, False, True]
    assert list(p.bitwise_and(q, default="intersection").keys()) == ["x"]


def test_hostile_inputs():
    # empty containers, 0-d batch, names, a locked operand, gradients
    empty = TensorDict()
    one = TensorDict(x=torch.ones(()))
    assert list(empty.add(one, default="intersection").keys()) == []
    assert empty.add(one, default=torch.tensor(2.0))["x"].item() == 3.0
    assert one.add(empty, default=torch.tensor(2.0))["x"].item() == 3.0
    named = TensorDict(a=torch.ones(2), batch_size=[2], names=["t"]).lock_()
    out = named.mul(TensorDict(b=torch.ones(2), batch_size=[2]), default=torch.tensor(3.0))
    assert out.names == ["t"] and named.is_locked and list(named.keys()) == ["a"]
    assert out["a"].tolist() == [3.0, 3.0] and out["b"].tolist() == [3.0, 3.0]
    leaf = torch.ones(2, requires_grad=True)
    TensorDict(a=leaf, batch_size=[2]).mul(
        TensorDict(b=torch.ones(2), batch_size=[2]), default=torch.tensor(2.0)
    )["a"].sum().backward()
    assert leaf.grad.tolist() == [2.0, 2.0]
    # batch sizes broadcast as without default
    small = TensorDict(a=torch.ones(1, 3), batch_size=[1])
    big = TensorDict(a=torch.ones(4, 3), b=torch.ones(4), batch_size=[4])
    out = small.add(big, default=torch.zeros(()))
    assert out.batch_size == torch.Size([4]) and out["b"].shape == (4,)
    # a number or a tensor operand: default has no keys to match
    assert small.add(1.0, default="intersection")["a"].tolist() == [[2.0, 2.0, 2.0]]


def test_non_tensor_values_pass_through():
    a = TensorDict(x=torch.ones(2), s="text", batch_size=[2])
    b = TensorDict(x=torch.ones(2), y=torch.ones(2), batch_size=[2])
    out = a.add(b, default=torch.tensor(1.0))
    assert out["s"] == "text" and out["y"].tolist() == [2.0, 2.0]
    assert sorted(a.add(b, default="intersection").keys()) == ["x"]
    assert a.add(a, default="intersection")["s"] == "text"


@tensorclass
class _Pair:
    x: torch.Tensor
    y: torch.Tensor = None


def test_a_tensorclass_keeps_its_fields():
    p = _Pair(x=torch.ones(2), y=torch.ones(2), batch_size=[2])
    out = p.add(TensorDict(x=torch.ones(2), batch_size=[2]), default="intersection")
    assert type(out) is _Pair and out.y is None and out.x.tolist() == [2.0, 2.0]
    out = p.add(TensorDict(x=torch.ones(2), batch_size=[2]), default=torch.tensor(5.0))
    assert out.y.tolist() == [6.0, 6.0]
    unset = _Pair(x=torch.ones(2), batch_size=[2])
    out = unset.mul(TensorDict(x=torch.ones(2), y=torch.full((2,), 3.0), batch_size=[2]),
                    default=torch.tensor(2.0))  # fmt: skip
    assert out.y.tolist() == [6.0, 6.0]
    with pytest.raises(ValueError, match=r"_Pair.add: the other operand has the entries \['z'\]"):
        p.add(TensorDict(x=torch.ones(2), z=torch.ones(2), batch_size=[2]), default=torch.zeros(()))
    # a TensorClass as the other operand: its fields are its keys
    out = TensorDict(x=torch.ones(2), z=torch.ones(2), batch_size=[2]).add(
        p, default=torch.zeros(())
    )
    assert sorted(out.keys()) == ["x", "y", "z"]


def test_errors_name_the_method_and_the_problem():
    a = TensorDict(a=torch.ones(2), n={"x": torch.ones(2)}, batch_size=[2])
    b = TensorDict(a=torch.ones(2), n=torch.ones(2), batch_size=[2])
    with pytest.raises(
        TypeError,
        match=r"TensorDict.add: default must be None, 'intersection' or a tensor, got a float",
    ):
        a.add(a, default=1.0)
    with pytest.raises(ValueError, match=r"TensorDict.sub: default='union' is not an option"):
        a.sub(a, default="union")
    with pytest.raises(TypeError, match=r"key 'n' holds a TensorDict in one operand and a tensor"):
        a.add(b, default=torch.zeros(()))
    # without a default, keys that differ are an error; with "intersection", a key that is
    # a tree on one side and a tensor on the other has no leaf in both
    with pytest.raises(KeyError, match=r"TensorDict.mul: both containers must have the same keys"):
        a.mul(TensorDict(a=torch.ones(2), batch_size=[2]))
    assert list(a.add(b, default="intersection").keys()) == ["a"]
    with pytest.raises(RuntimeError):
        a.add(TensorDict(c=torch.ones(2), batch_size=[2]), default=torch.ones(3))
