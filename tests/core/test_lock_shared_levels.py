"""``with td.lock_():`` / ``with td.unlock_():`` restore levels that the walk reaches twice.

``lock_`` and ``unlock_`` save each level's state as their walk reaches it: a nested
container held under two keys is reached again after the walk changed it, and must
come back to what it was before the call, not to what the walk made of it. The
reference is each level's ``is_locked`` read before the block.
"""

from __future__ import annotations

import pytest
import torch

from tdfunc import TensorClass, TensorDict


class Frozen(TensorClass["frozen"]):
    x: torch.Tensor


def _tree():
    shared = TensorDict({"s": torch.zeros(2)}, [2])
    inner = TensorDict({"deep": {"t": torch.zeros(2)}}, [2])
    frozen = Frozen(x=torch.zeros(2), batch_size=[2])
    root = TensorDict({"a": shared, "b": inner, "c": shared, "f": frozen, "v": torch.zeros(2)}, [2])
    return root, [root, shared, inner, inner["deep"]]


@pytest.mark.parametrize("op", ["lock_", "unlock_"])
@pytest.mark.parametrize("start_locked", [False, True])
def test_a_level_held_twice_comes_back_as_it_was(op, start_locked):
    root, levels = _tree()
    if start_locked:
        root.lock_()
    before = [level.is_locked for level in levels]
    with getattr(root, op)():
        assert all(level.is_locked is (op == "lock_") for level in levels)
    assert [level.is_locked for level in levels] == before
    if not before[0]:  # every level can change again, as before the block
        root["b", "new"] = torch.ones(2)
        root["a", "new"] = torch.ones(2)
        assert torch.equal(root["c", "new"], torch.ones(2))


@pytest.mark.parametrize("op", ["lock_", "unlock_"])
def test_nested_blocks_over_shared_levels_unwind_in_order(op):
    root, levels = _tree()
    other = "unlock_" if op == "lock_" else "lock_"
    states = [[level.is_locked for level in levels]]
    with getattr(root, op)():
        states.append([level.is_locked for level in levels])
        with getattr(root, other)():
            pass
        assert [level.is_locked for level in levels] == states[-1]
    assert [level.is_locked for level in levels] == states[0]
