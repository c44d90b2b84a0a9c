"""Dim names of the wrong length, at every door, against tensordict.

A wrong number of names is refused with a ``ValueError`` that says how many the batch
size needs (tensordict raises ``ValueError`` too), and nothing is renamed. A
TensorClass constructor refuses them as well (tensordict 0.15.3 accepts them there).
"""

from __future__ import annotations

import pytest
import tensordict_peer
import torch

from tdfunc import TensorClass, TensorDict

PROBE = """
import torch
from LIB import TensorDict, TensorClass

class C(TensorClass):
    x: torch.Tensor

def make():
    nested = TensorDict({"y": torch.zeros(2, 3, 5)}, [2, 3, 5])
    return TensorDict({"x": torch.zeros(2, 3, 4), "n": nested}, [2, 3])

doors = {
    "setter": lambda names: setattr(make(), "names", names),
    "nested setter": lambda names: setattr(make()["n"], "names", names),
    "index view": lambda names: setattr(make()[0], "names", names),
    "stacked": lambda names: setattr(torch.stack([make(), make()]), "names", names),
    "constructor": lambda names: TensorDict({"x": torch.zeros(2, 3)}, [2, 3], names=names),
    "rename": lambda names: make().rename(*names),
    "rename_": lambda names: make().rename_(*names),
    "tensorclass": lambda names: setattr(C(x=torch.zeros(2, 3), batch_size=[2, 3]), "names", names),
}
for door, call in doors.items():
    for names in (["a"], ["a", "b", "c", "d"], [], [None], [None] * 4):
        try:
            call(names)
            print(door, names, "accepted")
        except ValueError:
            print(door, names, "ValueError")
td = make()
td.names = ["p", "q"]
for names in (["a"], ["a", "b", "c"]):
    try:
        td.names = names
    except ValueError:
        pass
print("kept", td.names, td["n"].names)
"""


@pytest.mark.slow  # a tensordict process
def test_wrong_lengths_are_refused_as_tensordict_refuses_them():
    expected, got = tensordict_peer.printed_by_both(PROBE)
    assert got == expected


@pytest.mark.parametrize("names", [["a"], ["a", "b", "c"], [None], [None, None, None]])
def test_the_error_says_how_many_names_the_batch_size_needs(names):
    td = TensorDict({"x": torch.zeros(2, 3)}, [2, 3], names=["p", "q"])
    with pytest.raises(
        ValueError, match=r"TensorDict.names: expected 2 names for batch size \[2, 3\]"
    ):
        td.names = names
    assert td.names == ["p", "q"]

    class C(TensorClass):
        x: torch.Tensor

    with pytest.raises(ValueError, match=r"^C.names: expected 2 names"):
        C(x=torch.zeros(2, 3), batch_size=[2, 3], names=names)


def test_rename_with_no_names_is_a_wrong_count():
    td = TensorDict({"x": torch.zeros(2, 3)}, [2, 3], names=["p", "q"])
    for call in (td.rename, td.rename_):
        with pytest.raises(ValueError, match=r"rename_?: expected 2 names .* got none"):
            call()
    assert td.names == ["p", "q"]
    assert td.rename(None).names == [None, None]  # None alone removes them
    assert TensorDict({}, []).rename().names == []
