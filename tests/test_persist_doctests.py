"""The examples in the docstrings of the persistence modules run and print what they show."""

from __future__ import annotations

import doctest
import importlib

import pytest
import torch

from tdfunc import TensorDict

MODULES = ["tdfunc._persist", "tdfunc._memmap_tensor", "tdfunc._persist_keys"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(
        module,
        extraglobs={"torch": torch, "TensorDict": TensorDict},
        optionflags=doctest.ELLIPSIS,
        verbose=False,
    )
    assert result.attempted > 0
    assert result.failed == 0
