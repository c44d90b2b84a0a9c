"""A NumPy array as the other operand of leafwise arithmetic: plain torch's results, and
no warning from tdfunc's own call (NumPy 2 warns about torch's ``__array_wrap__``)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from tdfunc import TensorDict


@pytest.mark.parametrize(
    "op",
    [lambda x, a: x + a, lambda x, a: x * a, lambda x, a: x - a, lambda x, a: x / a],
    ids=["add", "mul", "sub", "div"],
)
def test_an_array_operand_gives_torch_results_without_a_warning(op):
    leaf, nested = torch.randn(3, 4), torch.randn(3, 4, 2)
    array = np.random.default_rng(0).standard_normal(4)
    td = TensorDict({"a": leaf, "n": {"b": nested[..., 0]}}, [3])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the reference: plain torch warns here
        expected_a, expected_b = op(leaf, array), op(nested[..., 0], array)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = op(td, array)
    for got, expected in ((out["a"], expected_a), (out["n", "b"], expected_b)):
        assert got.dtype == expected.dtype and torch.equal(got, expected)


def test_the_warning_filter_does_not_outlive_the_call():
    td = TensorDict({"a": torch.ones(2)}, [2])
    td + np.ones(2)
    with pytest.warns(UserWarning, match="still shown"):
        warnings.warn("still shown", UserWarning)
