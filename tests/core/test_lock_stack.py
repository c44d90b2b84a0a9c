"""Lock and unlock contexts nest like a stack, checked against a model (a Python list).

Every sequence of ``with td.lock_():`` / ``with td.unlock_():`` blocks, nested up to
depth 3 (siblings included), starting locked or unlocked, on a plain and on a
memory-mapped container: after each entry and each exit, the lock state of every
level equals the model's, and a memory-mapped container's writes still reach its file.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from tdfunc import TensorClass, TensorDict

OPS = ("lock_", "unlock_")


def _programs(depth: int = 3):
    """Block programs: a list of (op, children) at each level."""
    chains = [
        [(ops[0], [(ops[1], [(ops[2], [])])])] for ops in itertools.product(OPS, repeat=depth)
    ]
    shallow = [[(a, [])] for a in OPS] + [[(a, [(b, [])])] for a, b in itertools.product(OPS, OPS)]
    siblings = [[(a, [(b, []), (c, [])])] for a, b, c in itertools.product(OPS, repeat=3)]
    return shallow + chains + siblings


def _run(td, program, model: list, trace: list) -> None:
    for op, children in program:
        with getattr(td, op)():
            model.append(op == "lock_")  # entering pushes; the exit pops to what was there
            trace.append((td.is_locked, td["n"].is_locked, td["n", "m"].is_locked, model[-1]))
            _run(td, children, model, trace)
            model.pop()
        trace.append((td.is_locked, td["n"].is_locked, td["n", "m"].is_locked, model[-1]))


def _fresh():
    return TensorDict({"a": torch.zeros(3), "n": {"b": torch.zeros(3), "m": {}}}, [3])


@pytest.mark.parametrize("start_locked", [False, True])
@pytest.mark.parametrize("memmap", [False, True])
def test_every_program_restores_each_level_as_the_model_stack_says(tmp_path, memmap, start_locked):
    for number, program in enumerate(_programs()):
        td = _fresh()
        if memmap:
            td = td.memmap(tmp_path / str(number))  # locked
            if not start_locked:
                td.unlock_()
        elif start_locked:
            td.lock_()
        trace: list = []
        _run(td, program, [start_locked], trace)
        for top, nested, deep, expected in trace:
            assert top == nested == deep == expected, program
        if memmap and td.is_locked:
            leaf = td["a"]
            td.set_("a", torch.full((3,), float(number)))
            assert td["a"] is leaf  # written into the file, not replaced
            on_disk = TensorDict.load_memmap(tmp_path / str(number))["a"]
            assert torch.equal(on_disk, torch.full((3,), float(number)))


def test_the_issue_order_leaves_a_memmap_locked_and_writing_to_its_file(tmp_path):
    m = _fresh().memmap(tmp_path / "m")
    with m.unlock_():
        with m.lock_():
            pass
        assert not m.is_locked
    assert m.is_locked and m["n"].is_locked
    m.set_("a", torch.ones(3))
    assert torch.equal(TensorDict.load_memmap(tmp_path / "m")["a"], torch.ones(3))


def test_levels_added_inside_a_block_take_their_parents_restored_state():
    td = _fresh().lock_()
    with td.unlock_():
        td["x"] = {"y": torch.zeros(3)}
        with td.lock_():
            assert td["x"].is_locked
        assert not td["x"].is_locked
    assert td.is_locked and td["x"].is_locked
    with pytest.raises(RuntimeError, match="locked"):
        td["x"]["z"] = torch.zeros(3)


def test_an_exception_inside_nested_blocks_restores_every_level():
    td = _fresh()
    with pytest.raises(KeyError), td.lock_(), td.unlock_(), td.lock_():
        raise KeyError("boom")
    assert not td.is_locked and not td["n"].is_locked


class _Pair(TensorClass):
    x: torch.Tensor
    n: TensorDict


@pytest.mark.parametrize("start_locked", [False, True])
def test_a_tensorclass_restores_like_a_tensordict(start_locked):
    """The same programs on a TensorClass instance (its state lives in its TensorDict)."""
    for program in _programs():
        pair = _Pair(x=torch.zeros(3), n={"b": torch.zeros(3), "m": {}}, batch_size=[3])
        if start_locked:
            pair.lock_()
        trace: list = []
        _run(pair, program, [start_locked], trace)
        for top, nested, deep, expected in trace:
            assert top == nested == deep == expected, program
