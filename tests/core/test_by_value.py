"""``tdfunc.utils.isin``, ``remove_duplicates`` and ``assert_close``, compared with
tensordict 0.15.3 run in its own process over random values, and their errors."""

# The probe below is one script run by both libraries; its lines are long.
# ruff: noqa: E501
from __future__ import annotations

import pytest
import tensordict_peer
import torch

from tdfunc import TensorDict
from tdfunc.utils import assert_close, isin, remove_duplicates

PROBE = r"""
import torch
from LIB import TensorDict, assert_close
from LIB.utils import isin, remove_duplicates
def run(f):
    try: return f()
    except Exception as e: return type(e).__name__
g = torch.Generator().manual_seed(0)
for n in range(8):
    x = torch.randint(0, 4, (7, 2), generator=g)
    td = TensorDict(x=x, y=torch.arange(7), n={"z": torch.arange(14).view(7, 2)}, batch_size=[7])
    ref = TensorDict(x=torch.randint(0, 4, (5, 2), generator=g), batch_size=[5])
    print(isin(td, ref, "x").tolist())
    out, idx = remove_duplicates(td, "x", return_indices=True)
    print(out["x"].tolist(), out["y"].tolist(), out["n", "z"].tolist(), idx.tolist())
m = TensorDict(x=torch.randint(0, 3, (3, 4), generator=g), batch_size=[3, 4])
print(remove_duplicates(m, "x", dim=1)["x"].tolist(), run(lambda: remove_duplicates(m, "x", dim=2)), run(lambda: remove_duplicates(m, "q")))
print(isin(m, m[:, :2], "x", dim=1).tolist(), run(lambda: isin(m, TensorDict(x=torch.zeros(3)), "x")))
print(isin(m, m[:2], "x", dim=-2).tolist())
a = TensorDict(x=torch.zeros(3), y=torch.ones(3), s="a")
b = TensorDict(x=torch.full((3,), 0.01), y=torch.ones(3), s="b")
print(assert_close(a, a.clone()), assert_close(a, b, atol=0.1, rtol=0), run(lambda: assert_close(a, b)))
print(run(lambda: assert_close(a, TensorDict(x=torch.zeros(3)))), assert_close(a, TensorDict(x=torch.zeros(3)), intersection=True))
print(run(lambda: assert_close(a, 1)), run(lambda: assert_close(a, TensorDict(x=torch.zeros(3, dtype=torch.float64), y=torch.ones(3)))))
print(assert_close(TensorDict(x=torch.tensor([float("nan")])), TensorDict(x=torch.tensor([float("nan")]))))
"""


@pytest.mark.slow  # a tensordict process
def test_the_results_are_tensordict_s():
    expected, got = tensordict_peer.printed_by_both(PROBE)
    assert got == expected


def test_remove_duplicates_against_a_python_loop():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 5, (40, 3), generator=g)
    td = TensorDict(x=x, i=torch.arange(40), batch_size=[40])
    out, where = remove_duplicates(td, "x", return_indices=True)
    first: dict = {}
    for i, row in enumerate(x.tolist()):
        first.setdefault(tuple(row), i)
    order = sorted(first)  # the result is ordered by value
    assert out["x"].tolist() == [list(row) for row in order]
    assert out["i"].tolist() == [first[row] for row in order]
    assert [order[j] for j in where.tolist()] == [tuple(row) for row in x.tolist()]
    reference = TensorDict(x=x[::3], batch_size=[len(x[::3])])
    seen = {tuple(row) for row in x[::3].tolist()}
    assert isin(td, reference, "x").tolist() == [tuple(r) in seen for r in x.tolist()]


def test_errors_name_the_function_and_the_problem():
    td = TensorDict(x=torch.zeros(3), s="a", batch_size=[3])
    with pytest.raises(KeyError, match="remove_duplicates: the input has no tensor at key 's'"):
        remove_duplicates(td, "s")
    with pytest.raises(ValueError, match=r"isin: dim must be a batch dim of the batch size \[3\]"):
        isin(td, td, "x", dim=1)
    with pytest.raises(ValueError, match="as many batch dims"):
        isin(td, TensorDict(x=torch.zeros(3)), "x")
    with pytest.raises(AssertionError, match=r"assert_close: key 'x' does not match"):
        assert_close(td, TensorDict(x=torch.ones(3), s="a", batch_size=[3]))
