"""Comparisons as tensordict documents them: with a dict, with other types, non-tensor leaves."""

from __future__ import annotations

import operator
import warnings

import pytest
import torch

from tdfunc import TensorDict

_OPS = [operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge]


def _values():
    return {"a": torch.tensor([1.0, 2.0, 3.0]), "n": {"b": torch.tensor([[0, 1], [2, 3], [4, 5]])}}


def _td():
    values = _values()
    return TensorDict({**values, "s": "text"}, [3])


@pytest.mark.parametrize("op", _OPS, ids=lambda op: op.__name__)
def test_compare_with_a_dict_pairs_keys(op):
    other = {"a": torch.tensor([1.0, 0.0, 5.0]), "n": {"b": torch.full((3, 2), 2)}, "s": "text"}
    out = op(_td(), other)
    assert torch.equal(out["a"], op(_values()["a"], other["a"]))
    assert torch.equal(out["n", "b"], op(_values()["n"]["b"], other["n"]["b"]))


def test_dict_comparison_compares_non_tensor_leaves_and_checks_keys():
    other = {"a": _values()["a"], "n": _values()["n"], "s": "text"}
    assert (_td() == other).all()
    assert not (_td() == {**other, "s": "other"}).all()
    with pytest.raises(KeyError, match="same keys"):
        _ = _td() == {"a": _values()["a"]}


@pytest.mark.parametrize(
    "other", ["z", None, object(), [1, 2]], ids=["str", "none", "object", "list"]
)
def test_other_types_give_false_and_true(other):
    td = _td()
    assert (td == other) is False
    assert (td != other) is True
    for op in (operator.lt, operator.le, operator.gt, operator.ge):
        with pytest.warns(FutureWarning, match="gives False"):
            assert op(td, other) is False


@pytest.mark.parametrize("op", _OPS, ids=lambda op: op.__name__)
@pytest.mark.parametrize("scalar", [2, 2.5, torch.tensor(2)], ids=repr)
def test_scalar_comparisons_leave_non_tensor_leaves_out(op, scalar):
    out = op(_td(), scalar)
    assert set(out.keys(True, True)) == {"a", ("n", "b")}
    assert torch.equal(out["a"], op(_values()["a"], scalar))
    assert torch.equal(out["n", "b"], op(_values()["n"]["b"], scalar))


def test_container_comparison_keeps_non_tensor_masks():
    td = _td()
    out = td == td.clone()
    assert out["s"].dtype == torch.bool and bool(out["s"].all())
    assert out.all()


def test_arithmetic_with_a_dict_stays_an_error():
    with pytest.raises(TypeError, match="convert it"):
        _ = _td() + {"a": 1}


def test_no_warning_for_supported_operands():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _ = _td() < 1
        _ = _td() < {"a": _values()["a"], "n": _values()["n"], "s": "text"}


def test_tensorclass_comparisons_follow_the_same_rules():
    from tdfunc import TensorClass

    class Point(TensorClass):
        x: torch.Tensor

    point = Point(x=torch.tensor([1.0, 2.0]), batch_size=[2])
    assert (point == "z") is False and (point != None) is True  # noqa: E711
    out = point == {"x": torch.tensor([1.0, 0.0])}
    assert type(out) is Point and out.x.tolist() == [True, False]
    assert (point > 1).x.tolist() == [False, True]
