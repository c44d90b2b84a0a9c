"""Locks and shape operations as context managers, as tensordict documents them."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from tdfunc import TensorDict


def _td():
    return TensorDict(
        {"a": torch.arange(24.0).view(2, 3, 4), "n": {"b": torch.arange(6).view(2, 3)}}, [2, 3]
    )


def test_with_lock_unlocks_on_exit_even_after_an_error():
    td = _td()
    with td.lock_():
        assert td.is_locked and td["n"].is_locked
        with pytest.raises(RuntimeError, match="locked"):
            td.set("d", torch.zeros(2, 3))
        td.set("a", torch.zeros(2, 3, 4), inplace=True)  # in place: allowed
    assert not td.is_locked and not td["n"].is_locked
    with pytest.raises(ValueError), td.lock_():
        raise ValueError("inside")
    assert not td.is_locked


def test_with_unlock_relocks_on_exit():
    td = TensorDict(a=torch.zeros(3), batch_size=[3], lock=True)
    with td.unlock_():
        td["b"] = torch.ones(3)
    assert td.is_locked and sorted(td.keys()) == ["a", "b"]


def test_nested_unlock_refused_while_the_parent_is_locked():
    td = _td().lock_()
    with pytest.raises(RuntimeError, match="unlock that parent first"):
        td["n"].unlock_()
    assert td["n"].is_locked
    td.unlock_()
    assert not td["n"].is_locked
    td["n"].lock_()
    td["n"].unlock_()  # locked on its own: can be unlocked on its own


def test_is_locked_setter():
    td = _td()
    td.is_locked = True
    assert td.is_locked and td["n"].is_locked
    td.is_locked = False
    assert not td.is_locked and not td["n"].is_locked


def test_flatten_keys_block_writes_back():
    td = _td()
    with td.flatten_keys() as flat:
        assert set(flat.keys()) == {"a", "n.b"}
        flat["n.c"] = torch.ones(2, 3)
        flat["top"] = torch.zeros(2, 3)
    assert torch.equal(td["n", "c"], torch.ones(2, 3)) and "top" in td
    with td.flatten_keys("/") as flat:
        flat["n/b"] = flat["n/b"] * 10
    assert torch.equal(td["n", "b"], torch.arange(6).view(2, 3) * 10)


def test_unflatten_keys_block_writes_back():
    td = TensorDict({"x.y": torch.zeros(2)}, [2])
    with td.unflatten_keys() as nested:
        nested["x", "z"] = torch.ones(2)
    assert sorted(td.keys()) == ["x.y", "x.z"]


@pytest.mark.parametrize(
    ("op", "reference"),
    [
        (lambda td: td.permute(1, 0), lambda t: t.permute(1, 0, 2)),
        (lambda td: td.transpose(0, 1), lambda t: t.transpose(0, 1)),
        (lambda td: td.view(-1), lambda t: t.reshape(6, 4)),
        (lambda td: td.reshape(3, 2), lambda t: t.reshape(3, 2, 4)),
        (lambda td: td.flatten(0, 1), lambda t: t.flatten(0, 1)),
        (lambda td: td.unsqueeze(1), lambda t: t.unsqueeze(1)),
        (lambda td: td.unflatten(1, (3, 1)), lambda t: t.unflatten(1, (3, 1))),
    ],
    ids=["permute", "transpose", "view", "reshape", "flatten", "unsqueeze", "unflatten"],
)
def test_shape_op_blocks_write_new_entries_back_through_the_inverse(op, reference):
    td = _td()
    source = torch.randn(2, 3, 4)
    with op(td) as changed:
        assert torch.equal(changed["a"], reference(td["a"]))
        changed["new"] = reference(source)
    assert torch.equal(td["new"], source)
    assert td.batch_size == torch.Size([2, 3])


def test_squeeze_block_writes_back():
    td = TensorDict({"a": torch.zeros(2, 1, 3)}, [2, 1])
    with td.squeeze(1) as squeezed:
        squeezed["b"] = torch.ones(2, 5)
    assert td["b"].shape == torch.Size([2, 1, 5])


def test_results_used_without_with_pickle_and_copy_without_the_pending_action():
    td = _td()
    permuted = td.permute(1, 0)
    back = pickle.loads(pickle.dumps(permuted))
    assert torch.equal(back["a"], td["a"].permute(1, 0, 2))
    assert back.batch_size == torch.Size([3, 2])
    clone = copy.deepcopy(permuted)
    with clone:  # nothing pending: a no-op
        pass
    assert set(td.keys()) == {"a", "n"}


@pytest.mark.parametrize("op", ["flatten_keys", "view", "unsqueeze"])
def test_a_block_on_a_locked_container_writes_back_in_place(tmp_path, op):
    plain = {"a": torch.arange(24.0).view(2, 3, 4), ("n", "b"): torch.arange(6).view(2, 3)}
    for td in (_td().lock_(), _td().memmap(tmp_path / op)):
        stored = {key: td.get(key) for key in plain}
        args = {"flatten_keys": (), "view": (-1,), "unsqueeze": (0,)}[op]
        with getattr(td, op)(*args) as shaped:
            for value in shaped.values(True, True):
                value.mul_(2)  # the views share storage: the write-back copies them in place
        assert td.is_locked
        for key, ref in plain.items():
            assert td.get(key) is stored[key]  # the same tensors (memory-mapped ones too)
            assert torch.equal(td.get(key), ref * 2)
        with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
            with td.flatten_keys() as flat:
                flat["new"] = torch.zeros(2, 3)  # a new key cannot be written back
