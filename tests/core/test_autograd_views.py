"""``grad`` / ``data`` views (``_core/math/autograd.py``) and ``update_`` of a missing key."""

import pytest
import torch

from tdfunc import TensorDict


def test_grad_and_data_follow_the_lock():
    x = torch.randn(3, 4, requires_grad=True)
    y = torch.randn(3, 4, 5, requires_grad=True)
    td = TensorDict({"a": x, "b": {"c": y}}, [3, 4])
    ((td["a"] * 2).sum() + td["b", "c"].sum()).backward()
    assert not td.grad.is_locked and not td.data.is_locked
    assert td.grad is not td.grad
    assert torch.equal(td.grad["a"], torch.full_like(x, 2.0))
    assert torch.equal(td.grad["b", "c"], torch.ones_like(y))
    td.lock_()
    assert td.grad.is_locked and td.data.is_locked
    assert td.data["a"].data_ptr() == x.data_ptr()


def test_update_inplace_of_a_missing_key_says_so():
    td = TensorDict({"a": torch.zeros(3)}, [3])
    with pytest.raises(KeyError, match="was not found; use update to add it"):
        td.update_(b=torch.ones(3))
    with pytest.raises(KeyError, match="use set to add it"):
        td.set_("b", torch.ones(3))
    assert set(td.keys()) == {"a"}
