"""``get_at``, ``set_at_``, ``update_at_``: ``td.get(key)[index]``, read or written in place.

As in tensordict, the index applies to the entry itself (an ellipsis stands for all
of its dims, feature dims included). References index the plain tensors.
"""

from __future__ import annotations

import pytest
import torch

from tdfunc import TensorDict


def _td():
    a = torch.arange(24.0).reshape(3, 4, 2)
    b = torch.arange(12).reshape(3, 4)
    return TensorDict({"a": a.clone(), "n": {"b": b.clone()}}, [3, 4]), a, b


INDICES = [
    (Ellipsis, 0),
    (1, Ellipsis),
    (torch.tensor([2, 0]), 1),
    torch.tensor([True, False, True]),
]


@pytest.mark.parametrize("index", INDICES, ids=repr)
def test_get_at_and_set_at_index_the_entry(index):
    td, a, b = _td()
    assert torch.equal(td.get_at("a", index), a[index])
    assert torch.equal(td.get_at(("n", "b"), index), b[index])
    td.set_at_("a", -1.0, index)
    td.set_at_(("n", "b"), -1, index)
    a[index] = -1.0
    b[index] = -1
    assert torch.equal(td["a"], a) and torch.equal(td["n", "b"], b)


def test_set_at_number_and_tensor_of_another_dtype_at_a_tensor_index():
    # a number is written exactly; a tensor is cast to the entry's dtype, as at an int
    td = TensorDict({"a": torch.zeros(3, dtype=torch.float64)}, [3])
    td.set_at_("a", 0.1, torch.tensor([0, 2]))
    td.set_at_("a", torch.tensor([5, 6]), torch.tensor([True, True, False]))
    expected = torch.tensor([5.0, 6.0, 0.1], dtype=torch.float64)
    assert torch.equal(td["a"], expected)


def test_update_at_that_does_not_fit_writes_nothing():
    td, a, b = _td()
    with pytest.raises(ValueError, match=r"update_at_.*'a'"):
        # "n.b" fits and comes first; "a" does not fit: nothing may be written
        td.update_at_({("n", "b"): torch.full((4,), -1), "a": torch.ones(5)}, 0)
    assert torch.equal(td["a"], a) and torch.equal(td["n", "b"], b)
