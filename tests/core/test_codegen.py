"""One code generator (``_core/helpers/codegen.py``) serves every plan builder."""

from __future__ import annotations

import ast
import traceback
from pathlib import Path

import pytest
import torch

import tdfunc
from tdfunc._core.helpers.codegen import define

ROOT = Path(__file__).resolve().parents[2] / "tdfunc"


def test_define_returns_the_functions_with_constants_as_globals():
    constants = {"K": 3}
    made = define(["def f(x):", "    return x * K", "def g():", "    return f(2)"], "t", constants)
    assert set(made) == {"f", "g"} and made["f"](2) == 6
    assert made["f"].__globals__ is constants
    assert "f" not in constants  # the caller's constants are not polluted
    with pytest.raises(NameError, match="f"):
        made["g"]()  # defined names are returned, not made globals


def test_a_generated_frame_names_its_generator():
    made = define("def boom():\n    raise ValueError('x')", "example plan", {})
    with pytest.raises(ValueError) as info:
        made["boom"]()
    assert "<tdfunc example plan>" in "".join(traceback.format_tb(info.tb))


def test_the_tensorclass_init_is_generated_here():
    class Point(tdfunc.TensorClass):
        x: torch.Tensor

    with pytest.raises(TypeError) as info:
        Point(1, 2, 3, batch_size=[])
    assert Point.__init__.__code__.co_filename == "<tdfunc Point.__init__>", info


def test_no_other_module_runs_exec():
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.relative_to(ROOT) == Path("_core/helpers/codegen.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "exec":
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not wrong, "generate code through tdfunc._core.helpers.codegen.define:\n" + "\n".join(
        wrong
    )
