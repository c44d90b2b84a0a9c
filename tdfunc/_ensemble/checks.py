"""Structural equality of an ensemble's members.

An ensemble runs one template's code with every member's tensors, so members
may differ in their parameter and buffer values only. Everything else that
changes the computation must be equal, or member ``k`` would silently compute
as member 0: the module class at every level, the submodule names, the
parameter and buffer slots (names, ``None``-ness, shapes, dtypes, devices,
``requires_grad``), the training flag, ``extra_repr()`` and every other entry
of each module's ``__dict__`` (activation choices, slopes, dropout rates,
strides, paddings, plain tensor attributes...). Hooks and the bookkeeping that
``nn.Module.__init__`` creates do not change the computation the ensemble runs
and are not compared.
"""

from __future__ import annotations

import types
import weakref
from typing import Any

import torch
from torch import nn

from .._modules.slots import iter_slots

# what nn.Module.__init__ puts in every module's __dict__ besides the compared
# entries: tensors and submodules are compared slot by slot, hooks are not run
# by the batched path, and the compiled call is a cache of the same code
_BOOKKEEPING = frozenset(nn.Module().__dict__) - {"training", "_non_persistent_buffers_set"}
_MAX_DEPTH = 4  # how deep plain objects held as attributes are compared


class _Member:
    """One member: its modules by path and its tensors (by identity) by slot name."""

    def __init__(self, model: nn.Module) -> None:
        self.modules = dict(model.named_modules(remove_duplicate=False))
        self.module_paths = {id(m): path for path, m in self.modules.items()}
        self.tensor_slots: dict[int, str] = {}
        for slot in iter_slots(model):
            if slot.value is not None:
                self.tensor_slots.setdefault(id(slot.value), slot.path)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor(shape={tuple(value.shape)}, dtype={value.dtype}, values={value!r})"
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _same(left: Any, right: Any, first: _Member, other: _Member, depth: int) -> bool:
    """Whether two attribute values make the same computation."""
    if left is right:
        return True
    if isinstance(left, torch.Tensor) or isinstance(right, torch.Tensor):
        if not (isinstance(left, torch.Tensor) and isinstance(right, torch.Tensor)):
            return False
        left_slot, right_slot = first.tensor_slots.get(id(left)), other.tensor_slots.get(id(right))
        if left_slot is not None or right_slot is not None:  # a member's own tensor
            return left_slot == right_slot
        return (
            left.shape == right.shape
            and left.dtype == right.dtype
            and left.device == right.device
            and (left.device.type == "meta" or bool(torch.equal(left, right)))
        )
    if isinstance(left, nn.Module) or isinstance(right, nn.Module):
        left_path = first.module_paths.get(id(left))
        right_path = other.module_paths.get(id(right))
        if left_path is not None or right_path is not None:
            return left_path == right_path
        return type(left) is type(right)
    if type(left) is not type(right):
        return False
    if isinstance(left, (list, tuple)):
        return len(left) == len(right) and all(
            _same(a, b, first, other, depth) for a, b in zip(left, right)
        )
    if isinstance(left, dict):
        return list(left) == list(right) and all(
            _same(left[k], right[k], first, other, depth) for k in left
        )
    if isinstance(left, weakref.ref):  # e.g. an RNN's references to its weights
        return _same(left(), right(), first, other, depth)
    if isinstance(left, types.FunctionType):
        return (
            left.__code__ is right.__code__
            and _same(left.__defaults__, right.__defaults__, first, other, depth)
            and _same(
                [c.cell_contents for c in left.__closure__ or ()],
                [c.cell_contents for c in right.__closure__ or ()],
                first,
                other,
                depth,
            )
        )
    if isinstance(left, types.MethodType):
        return left.__func__ is right.__func__ and (
            isinstance(left.__self__, nn.Module)
            or _same(left.__self__, right.__self__, first, other, depth)
        )
    if type(left).__eq__ is not object.__eq__:
        try:
            result = left == right
            return bool(result)
        except Exception:  # an == that is not a bool (arrays): compare the text
            return repr(left) == repr(right)
    # a plain object (no __eq__ of its own): the same class and the same attributes
    if depth >= _MAX_DEPTH:
        return True
    left_state = getattr(left, "__dict__", None)
    right_state = getattr(right, "__dict__", None)
    if left_state is None or right_state is None:
        return left_state is right_state
    return _same(left_state, right_state, first, other, depth + 1)


def _slot(value: Any) -> tuple:
    if value is None:
        return (None,)
    return (tuple(value.shape), value.dtype, value.device, value.requires_grad)


def _first_difference(path: str, left: nn.Module, right: nn.Module, first, other):
    """``(what, left value, right value)`` for the first difference of two modules, or None."""
    if type(left) is not type(right):
        return "the module class", type(left).__qualname__, type(right).__qualname__
    if list(left._modules) != list(right._modules):
        return "the submodules", list(left._modules), list(right._modules)
    for kind in ("_parameters", "_buffers"):
        left_slots, right_slots = getattr(left, kind), getattr(right, kind)
        if list(left_slots) != list(right_slots):
            return f"the {kind[1:]}", list(left_slots), list(right_slots)
        for name in left_slots:
            a, b = _slot(left_slots[name]), _slot(right_slots[name])
            if a != b:
                label = "(shape, dtype, device, requires_grad)"
                return f"{kind[1:-1]} {name!r} {label}", a, b
    left_dict, right_dict = left.__dict__, right.__dict__
    names = [k for k in left_dict if k not in _BOOKKEEPING]
    names += [k for k in right_dict if k not in _BOOKKEEPING and k not in left_dict]
    for name in names:
        if name not in left_dict or name not in right_dict:
            return (
                f"attribute {name!r}",
                _describe(left_dict[name]) if name in left_dict else "(not set)",
                _describe(right_dict[name]) if name in right_dict else "(not set)",
            )
        if not _same(left_dict[name], right_dict[name], first, other, 0):
            return f"attribute {name!r}", _describe(left_dict[name]), _describe(right_dict[name])
    try:
        left_repr, right_repr = left.extra_repr(), right.extra_repr()
    except Exception:  # an extra_repr that fails says nothing about the structure
        return None
    if left_repr != right_repr:
        return "extra_repr()", repr(left_repr), repr(right_repr)
    return None


def check_members(models) -> None:
    """Raise ``ValueError`` (``TypeError`` for a different class) naming the first
    structural difference between members.

    Example:
        >>> try:
        ...     check_members([nn.LeakyReLU(0.1), nn.LeakyReLU(0.2)])
        ... except ValueError as error:
        ...     print(str(error).split(":")[1].strip())
        member 1 differs from member 0 at the model itself (LeakyReLU) in attribute 'negative_slope'
    """
    if len(models) < 2:
        return
    first = _Member(models[0])
    for index in range(1, len(models)):
        other = _Member(models[index])
        for path, module in first.modules.items():
            counterpart = other.modules.get(path)
            where = f"`{path}`" if path else "the model itself"
            if counterpart is None:
                found = ("the submodule", type(module).__qualname__, "(missing)")
            else:
                found = _first_difference(path, module, counterpart, first, other)
            if found is not None:
                what, left, right = found
                # a different class is a TypeError, as for any argument of the wrong type
                error = TypeError if what == "the module class" else ValueError
                raise error(
                    f"Ensemble: member {index} differs from member 0 at {where} "
                    f"({type(module).__name__}) in {what}: {left} in member 0, {right} in "
                    f"member {index}. An ensemble runs one architecture (the same class at "
                    f"every level) with one setting of every hyper-parameter; only parameter "
                    f"and buffer values may differ between members. Build every member the "
                    f"same way (and call .train() or .eval() on all of them), or use separate "
                    f"modules."
                )
        extra = [path for path in other.modules if path not in first.modules]
        if extra:
            raise ValueError(
                f"Ensemble: member {index} has submodules that member 0 lacks: {extra[:5]}. "
                f"Every member must have the same architecture."
            )
