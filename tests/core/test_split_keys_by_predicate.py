"""``split_keys`` with functions of (key, value) as key sets, compared with tensordict 0.15.3
run in its own process, and with a loop over the leaves."""

# The probe below is one script run by both libraries; its lines are long.
# ruff: noqa: E501
from __future__ import annotations

import pytest
import tensordict_peer
import torch

from tdfunc import TensorDict

PROBE = r"""
import torch
from LIB import TensorDict
def run(f):
    try: return f()
    except Exception as e: return type(e).__name__
td = TensorDict(s=torch.zeros(10), v=torch.zeros(10, 3), m=torch.zeros(10, 4, 4), nested=TensorDict(t=torch.zeros(10, 3), u=torch.zeros(10), batch_size=[10]), txt="hello", batch_size=[10])
nb = td.batch_dims
def ks(x): return sorted(map(str, x.keys(True)))
seen = []
parts = td.split_keys(lambda k, v: (seen.append(k), v.ndim == nb)[1], lambda k, v: v.ndim == nb + 1)
print([ks(p) for p in parts], sorted(map(str, seen)))
print([ks(p) for p in td.split_keys(["nested"], lambda k, v: v.ndim == nb + 1)])
print([ks(p) for p in td.split_keys([("nested", "t")], lambda k, v: v.ndim >= nb)])
print([ks(p) for p in td.split_keys(lambda k, v: False)])
p = td.clone().split_keys(lambda k, v: k == ("s",), inplace=True); print([ks(x) for x in p])
"""


@pytest.mark.slow  # a tensordict process
def test_split_keys_with_functions_as_tensordict():
    expected, got = tensordict_peer.printed_by_both(PROBE)
    assert got == expected


def test_each_leaf_goes_to_the_first_set_that_takes_it():
    td = TensorDict(
        a=torch.zeros(4), b=torch.zeros(4, 2), n={"c": torch.zeros(4, 2, 2)}, batch_size=[4]
    )
    sets = [lambda k, v: v.ndim >= 2, lambda k, v: v.ndim >= 1]
    parts = td.split_keys(*sets)
    # the reference: a loop over the leaves, first matching set wins
    expected: list[set] = [set(), set(), set()]
    for key, value in td.items(True, True):
        parts_of_key = key if isinstance(key, tuple) else (key,)
        index = next((i for i, f in enumerate(sets) if f(parts_of_key, value)), 2)
        expected[index].add(key)
    assert [set(p.keys(True, True)) for p in parts] == expected
    for part in parts:
        for key in part.keys(True, True):
            assert part[key] is td[key]  # values are not copied
