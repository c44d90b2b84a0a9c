"""Every docstring example in tdfunc runs and prints what it shows.

One test per module, over every module of the package (found by walking it, so a new
module is covered without being listed here). The examples see ``torch``, ``nn`` and
tdfunc's public names, as a reader of the docs would have imported them.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from typing import Any

import pytest
import torch
from torch import nn

import tdfunc

SKIP = {"tdfunc.demo", "tdfunc.mypy_plugin", "tdfunc._tensorclass.mypy"}
MODULES = sorted(
    info.name for info in pkgutil.walk_packages(tdfunc.__path__, "tdfunc.") if info.name not in SKIP
)


def _globals() -> dict[str, Any]:
    names = {name: getattr(tdfunc, name) for name in dir(tdfunc) if not name.startswith("_")}
    names.update(torch=torch, nn=nn, Any=Any)
    return names


def test_every_module_is_walked():
    assert {"tdfunc._core.container", "tdfunc._tensorclass.tensorclass"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(
        module,
        extraglobs=_globals(),
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
        verbose=False,
    )
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
