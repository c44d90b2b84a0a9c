"""``apply`` with ``is_leaf`` / ``call_on_nested``: what ``fn`` returns for a value
given whole is validated and stored as ``set`` stores it; extra arguments must be
containers.

References are plain tensors and Python values.
"""

from __future__ import annotations

import pytest
import torch

from tdfunc import NonTensorData, TensorClass, TensorDict


def _labelled():
    return TensorDict({"x": torch.arange(2.0), "s": "cat", "n": {"y": torch.ones(2)}}, [2])


def _non_tensor(cls):
    return issubclass(cls, NonTensorData)


def test_python_value_returned_for_a_whole_leaf_is_stored_as_a_leaf():
    td = _labelled()
    out = td.apply(lambda v: "dog" if isinstance(v, NonTensorData) else v, is_leaf=_non_tensor)
    assert isinstance(out._data["s"], NonTensorData)
    assert out["s"] == "dog"
    # the stored leaf behaves like one written with set(): it indexes with the batch
    assert out[1]["s"] == "dog"
    assert out["x"].tolist() == [0.0, 1.0]


def test_tensor_returned_for_a_whole_leaf_must_start_with_the_batch_size():
    td = _labelled()
    with pytest.raises(ValueError, match="key 's'"):
        td.apply(
            lambda v: torch.ones(5) if isinstance(v, NonTensorData) else v, is_leaf=_non_tensor
        )
    ok = td.apply(
        lambda v: torch.full((2,), 7.0) if isinstance(v, NonTensorData) else v, is_leaf=_non_tensor
    )
    assert ok["s"].tolist() == [7.0, 7.0]


def test_whole_leaf_follows_a_new_batch_size():
    td = _labelled()
    out = td.apply(
        lambda v: v if isinstance(v, NonTensorData) else v[0], batch_size=[], is_leaf=_non_tensor
    )
    assert out.batch_size == torch.Size([])
    assert out._data["s"].batch_size == torch.Size([])
    assert out["s"] == "cat"
    assert out["x"].item() == 0.0


def test_call_on_nested_result_with_a_wrong_batch_size_is_an_error():
    td = _labelled()

    def fn(value):
        if isinstance(value, TensorDict):
            return TensorDict({"y": torch.ones(3)}, [3])  # not the parent's batch [2]
        return value

    with pytest.raises(ValueError, match="key 'n'"):
        td.apply(fn, call_on_nested=True)


@pytest.mark.parametrize("api", ["apply", "apply_", "named_apply"])
def test_extra_argument_that_is_not_a_container_is_a_clear_error(api):
    td = TensorDict({"x": torch.ones(2)}, [2])
    other = {"x": torch.ones(2)}
    fn = (lambda k, x, y: x + y) if api == "named_apply" else (lambda x, y: x + y)
    with pytest.raises(TypeError, match=rf"{api}: the argument at position 1 .* dict"):
        getattr(td, api)(fn, other)


def test_tensorclass_extra_argument_still_accepted():
    class Pair(TensorClass):
        x: torch.Tensor

    a = Pair(x=torch.ones(2), batch_size=[2])
    b = Pair(x=torch.full((2,), 3.0), batch_size=[2])
    assert a.apply(lambda x, y: x + y, b).x.tolist() == [4.0, 4.0]
