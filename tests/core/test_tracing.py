"""One module answers "traced, compiled or transformed?" (``_core/helpers/tracing.py``).

Each answer is checked inside the context it names, against torch's own state, and
no other module of tdfunc asks torch these questions itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from tdfunc._core.helpers import tracing as tr

ROOT = Path(__file__).resolve().parents[2] / "tdfunc"


def _flags() -> dict:
    return {
        "dynamo": tr.dynamo_compiling(),
        "compiling": tr.compiling(),
        "fx": tr.fx_tracing(),
        "jit": tr.jit_tracing() is not None,
        "transformed": tr.transformed(),
        "level": tr.functorch_level() is not None,
        "fake": tr.fake_mode(),
        "fake_tracing": tr.fake_tracing(),
        "tracing": tr.tracing(),
    }


def test_plain_eager_is_none_of_them():
    assert not any(_flags().values()), _flags()


def test_inside_vmap_and_grad_only_the_transform_answers():
    seen = []

    def f(x):
        seen.append(_flags())
        return x.sum()

    torch.func.vmap(f)(torch.zeros(2, 3))
    torch.func.grad(f)(torch.zeros(3))
    for flags in seen:
        assert flags["transformed"] and flags["level"] and flags["tracing"], flags
        assert not (flags["dynamo"] or flags["fx"] or flags["jit"] or flags["fake"]), flags


def test_a_wrapped_tensor_and_its_level_inside_vmap():
    def f(x):
        assert tr.is_wrapped(x) and tr.tensor_level(x) == tr.functorch_level()
        assert tr.batch_dim_of(x) == 0
        return x

    torch.func.vmap(f)(torch.zeros(2, 3))
    plain = torch.zeros(2)
    assert not tr.is_wrapped(plain) and tr.batch_dim_of(plain) == -1


def test_under_torch_compile_dynamo_answers():
    def f(x):
        # dynamo folds these to constants while it traces; eager runs read False
        if tr.dynamo_compiling() and tr.compiling() and tr.tracing():
            return x + 1
        return x - 1

    compiled = torch.compile(f, backend="eager", fullgraph=True)
    assert compiled(torch.zeros(1)).item() == 1.0
    assert f(torch.zeros(1)).item() == -1.0


def test_fx_symbolic_trace_answers():
    seen = []

    def f(x):
        seen.append(tr.fx_tracing())
        return x + 1

    torch.fx.symbolic_trace(f)
    assert seen == [True]


def test_jit_trace_answers():
    seen = []

    def f(x):
        seen.append(tr.jit_tracing() is not None)
        return x + 1

    torch.jit.trace(f, torch.zeros(1))
    assert seen[0]  # the first run traces; the tracer then checks itself with eager runs


def test_tracing_counts_the_jit_tracer():
    # a cache asks tracing() alone: a tensor kept from an eager call would enter a
    # jit trace as a constant
    seen = []

    def f(x):
        seen.append(tr.tracing())
        return x + 1

    torch.jit.trace(f, torch.zeros(1), check_trace=False)
    assert seen == [True]
    assert not tr.tracing()


def test_fake_tensors_and_any_dispatch_mode_answer():
    with FakeTensorMode():
        assert tr.fake_mode() and tr.fake_tracing() and tr.tracing()

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Watch():
        assert tr.tracing() and not tr.fake_mode()
    assert not tr.tracing()


# What only the tracing module may read from torch.
_QUESTIONS = {
    "is_compiling",
    "is_dynamo_compiling",
    "is_exporting",
    "is_fx_tracing",
    "_get_tracing_state",
    "_get_dispatch_mode",
    "_len_torch_dispatch_stack",
    "_functorch",
}


def test_no_other_module_asks_torch_itself():
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT)
        if relative == Path("_core/helpers/tracing.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            name = node.attr if isinstance(node, ast.Attribute) else None
            if isinstance(node, ast.ImportFrom):
                names = {alias.name for alias in node.names}
                name = next(iter(names & _QUESTIONS), None)
            if name in _QUESTIONS:
                wrong.append(f"{relative}:{node.lineno}: {name}")
    assert not wrong, "ask tdfunc._core.helpers.tracing instead:\n" + "\n".join(wrong)
