"""The classes (and the function) the core uses without importing them are bound hooks,
never names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tdfunc
from tdfunc._core.helpers.hooks import HOOKS, Hooks, bind

ROOT = Path(__file__).resolve().parents[2] / "tdfunc"


def test_every_hook_is_bound_to_the_public_class():
    assert HOOKS.tensordict is tdfunc.TensorDict
    assert HOOKS.tensor_attrs is tdfunc.TensorAttrs
    assert HOOKS.from_dataclass is tdfunc.from_dataclass
    assert set(Hooks.__annotations__) == {"tensordict", "tensor_attrs", "from_dataclass"}


def test_an_unbound_hook_is_an_error_naming_it():
    with pytest.raises(RuntimeError, match=r"'tensordict' is not bound yet.*import tdfunc"):
        Hooks().tensordict
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        Hooks().nothing


def test_bind_takes_every_hook_and_only_classes():
    with pytest.raises(
        TypeError,
        match=r"expected exactly the hooks \['from_dataclass', 'tensor_attrs', 'tensordict'\]",
    ):
        bind(tensordict=tdfunc.TensorDict)
    function = tdfunc.from_dataclass
    with pytest.raises(TypeError, match="'tensor_attrs' must be a class, received int"):
        bind(tensordict=tdfunc.TensorDict, tensor_attrs=1, from_dataclass=function)
    with pytest.raises(TypeError, match="'from_dataclass' must be a function, received int"):
        bind(tensordict=tdfunc.TensorDict, tensor_attrs=tdfunc.TensorAttrs, from_dataclass=1)
    assert HOOKS.tensordict is tdfunc.TensorDict  # a refused bind changed nothing


def test_no_class_is_reached_by_a_constant_name():
    """``lookup_class`` is for names read from disk or a treespec, never a literal."""
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", None)) == "lookup_class"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not wrong, "use tdfunc._core.helpers.hooks.HOOKS:\n" + "\n".join(wrong)


def test_the_hooked_paths_build_the_public_class():
    import torch

    td = tdfunc.TensorDict({"a": torch.zeros(2)}, [2])
    parsed = tdfunc.parse_tensor_dict_string(repr(td))
    assert type(parsed) is tdfunc.TensorDict
    attrs = td.attrs() if callable(getattr(td, "attrs", None)) else None
    if attrs is not None:
        assert isinstance(attrs["a"], tdfunc.TensorAttrs) or attrs is not None
