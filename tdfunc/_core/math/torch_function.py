"""``TorchFunctionMixin``: routes torch functions called on a container to their table."""

from __future__ import annotations

import torch

from ..helpers.torch_functions import _PYTHON_OPERATORS, HANDLED

_Tensor = torch.Tensor


_Tensor = torch.Tensor


class TorchFunctionMixin:
    """Routes the torch functions in :data:`HANDLED` to their container versions."""

    __slots__ = ()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        handler = HANDLED.get(func)
        if handler is None:
            handler = next((h for method, h in _PYTHON_OPERATORS if func is method), None)
            if handler is None:  # (see _PYTHON_OPERATORS)
                return NotImplemented
        return handler(*args, **(kwargs or {}))
