"""Which modules and optimizers a step function can read, found by looking at it.

A captured step must refuse to run once a module or an optimizer it reads has
changed (``watch.py``); the user should not have to list them. Like
``torch.compile``'s guards, the search looks where a Python function can reach
objects: its closures, defaults and the globals its code names, and follows the
functions and plain objects found there (a method's ``self``, a partial's
arguments, a compiled function's original). It does not follow calls into
torch's or tdfunc's own code, nor objects reached through a call (a weak
reference, a registry lookup): those are named with ``capture_step(watch=...)``.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

import torch
from torch import nn

# Objects found in the step's closures and globals are followed this deep (a loss
# function at module level that reads a global ensemble is two levels down).
_DEPTH = 4
_LIBRARIES = ("torch", "tdfunc", "functools", "builtins")
# modules whose attributes a step may name (``math.pi``) but a user does not rebind
_STANDARD = ("math", "operator", "numpy", "typing", "collections", "itertools", "sys", "os")


def reachable(fn: Any, bindings: list | None = None) -> list[tuple[str, Any]]:
    """Modules and optimizers ``fn`` can read: its closures, defaults and globals, followed
    into the functions and objects they hold (not into torch's or tdfunc's own code).

    ``bindings``, when given, receives ``(name, holder, key, value)`` for every name the
    step reads a value through (a global, a closure cell, an attribute of a plain object
    that the code names, a dict or list entry): a replay keeps what these held at the
    capture, so rebinding one (``LR = 0.01``, ``cfg.scale = 2.0``, ``model = other``)
    makes the capture stale even though no watched object changed.
    """
    found: list[tuple[str, Any]] = []
    seen: set[int] = set()
    slots: list[tuple] = []
    names_read: set[str] = set()

    def visit(name: str, value: Any, depth: int, slot: tuple | None = None) -> None:
        if depth > _DEPTH:
            return
        if slot is not None:  # recorded even when seen before: each slot can be rebound
            slots.append((name, *slot, value))
        if id(value) in seen:
            return
        seen.add(id(value))
        try:
            look(name, value, depth)
        except Exception:  # an object whose attributes cannot be read holds nothing we know
            return

    def look(name: str, value: Any, depth: int) -> None:
        if isinstance(value, nn.Module) or _is_optimizer(value):
            found.append((name, value))
            return
        if isinstance(value, (list, tuple)) and len(value) <= 64:
            mutable = isinstance(value, list)
            for index, item in enumerate(value):
                visit(
                    f"{name}[{index}]", item, depth + 1, (value, index, False) if mutable else None
                )
            return
        if isinstance(value, dict) and len(value) <= 64:
            for key, item in value.items():
                visit(f"{name}[{key!r}]", item, depth + 1, (value, key, isinstance(key, str)))
            return
        function, held = _function_of(value)
        if function is not None:
            names_read.update(_global_names(function.__code__))
            names_read.update(_constant_strings(function.__code__))
            _visit_function(name, function, depth, visit)
            for label, item in held:  # bound objects and partial arguments on the way
                visit(f"{name}.{label}", item, depth + 1)
            return
        if _is_user_object(value):
            attributes = vars(value)
            for key, item in attributes.items():
                visit(f"{name}.{key}", item, depth + 1, (attributes, key, True))
            return
        if _is_user_module(value):  # ``import config`` and ``config.lr``: only what code names
            attributes = vars(value)
            for key in [key for key in attributes if key in names_read]:
                visit(f"{name}.{key}", attributes[key], depth + 1, (attributes, key, True))

    visit(getattr(fn, "__name__", "step"), fn, 0)
    if bindings is not None:
        # an attribute (or a dict's string key) counts only where some reached code names it:
        # the others of an object the step reads (a trainer's step counter) may change freely
        bindings += [
            (name, holder, key, value)
            for name, holder, key, attribute, value in slots
            if not attribute or key in names_read
        ]
    return found


def _is_optimizer(value: Any) -> bool:
    return (
        isinstance(getattr(value, "hyperparameters", None), dict)
        or isinstance(getattr(value, "param_groups", None), list)
        or (isinstance(getattr(value, "transforms", None), tuple) and hasattr(value, "update"))
    )


def _function_of(value: Any) -> tuple[types.FunctionType | None, list[tuple[str, Any]]]:
    """The Python function behind ``value`` (compiled, wrapped, bound, partial), if any,
    and the objects held on the way there (a method's ``self``, a partial's arguments)."""
    held: list[tuple[str, Any]] = []
    for _ in range(8):
        original = getattr(value, "_torchdynamo_orig_callable", None)
        if original is not None:
            value = original
            continue
        if isinstance(value, types.MethodType):
            if not isinstance(value.__self__, types.ModuleType):
                held.append(("__self__", value.__self__))
            value = value.__func__
            continue
        inner = getattr(value, "func", None)  # functools.partial
        if callable(inner) and isinstance(getattr(value, "args", None), tuple):
            held += [(f"args[{index}]", arg) for index, arg in enumerate(value.args)]
            keywords = getattr(value, "keywords", None) or {}
            held += list(keywords.items())
            value = inner
            continue
        wrapped = getattr(value, "__wrapped__", None)
        if wrapped is not None:
            value = wrapped
            continue
        break
    if isinstance(value, types.FunctionType) and not _from_library(value):
        return value, held
    return None, held


def _from_library(fn: types.FunctionType) -> bool:
    module = getattr(fn, "__module__", None) or ""
    return module.split(".")[0] in _LIBRARIES


def _visit_function(name: str, fn: types.FunctionType, depth: int, visit) -> None:
    code = fn.__code__
    for var, cell in zip(code.co_freevars, fn.__closure__ or ()):
        try:
            content = cell.cell_contents
        except ValueError:  # an empty cell (a name bound later)
            continue
        visit(var, content, depth + 1, (cell, None, False))
    for index, default in enumerate(fn.__defaults__ or ()):
        visit(f"{name}.__defaults__[{index}]", default, depth + 1)
    for key, default in (fn.__kwdefaults__ or {}).items():
        visit(f"{name}.{key}", default, depth + 1)
    namespace = fn.__globals__
    for global_name in _global_names(code):
        if global_name in namespace:
            visit(global_name, namespace[global_name], depth + 1, (namespace, global_name, False))


def _constant_strings(code: types.CodeType) -> set[str]:
    """The string constants of ``code`` and the functions inside it (``config["lr"]``)."""
    found = {const for const in code.co_consts if isinstance(const, str)}
    for const in code.co_consts:
        if inspect.iscode(const):
            found |= _constant_strings(const)
    return found


def _global_names(code: types.CodeType) -> list[str]:
    """Names ``code`` and the functions defined inside it may read as globals."""
    names = list(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names += _global_names(const)
    return list(dict.fromkeys(names))


def _is_user_module(value: Any) -> bool:
    if not isinstance(value, types.ModuleType):
        return False
    return (value.__name__ or "").split(".")[0] not in _LIBRARIES + _STANDARD


def _is_user_object(value: Any) -> bool:
    kind = type(value)
    module = getattr(kind, "__module__", "") or ""
    return (
        hasattr(value, "__dict__")
        and not isinstance(value, (type, types.ModuleType, torch.Tensor))
        and module.split(".")[0] not in _LIBRARIES
    )
