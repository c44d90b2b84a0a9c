"""``get_at``, ``set_at_``, ``update_at_``: the index selects batch dims, as ``td[index]`` does.

References index the plain tensors, with any ellipsis written out over the batch dims.
"""

from __future__ import annotations

import pytest
import torch

from tdfunc import TensorDict


def _td():
    a = torch.arange(24.0).reshape(3, 4, 2)
    b = torch.arange(12).reshape(3, 4)
    return TensorDict({"a": a.clone(), "n": {"b": b.clone()}}, [3, 4]), a, b


# (index, the same index written out for a leaf with feature dims)
CASES = [
    ((Ellipsis, 0), (slice(None), 0)),
    ((Ellipsis, torch.tensor([0, 3])), (slice(None), torch.tensor([0, 3]))),
    ((1, Ellipsis), (1,)),
    ((torch.tensor([2, 0]), Ellipsis, 1), (torch.tensor([2, 0]), 1)),
]


@pytest.mark.parametrize(("index", "explicit"), CASES, ids=repr)
def test_get_at_and_set_at_index_batch_dims_only(index, explicit):
    td, a, b = _td()
    assert torch.equal(td.get_at("a", index), a[explicit])
    assert torch.equal(td.get_at(("n", "b"), index), b[explicit])
    td.set_at_("a", -1.0, index)
    td.set_at_(("n", "b"), -1, index)
    a[explicit] = -1.0
    b[explicit] = -1
    assert torch.equal(td["a"], a) and torch.equal(td["n", "b"], b)


def test_set_at_number_and_tensor_of_another_dtype_at_a_tensor_index():
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
