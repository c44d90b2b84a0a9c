"""Elementwise arithmetic and comparisons, leaf by leaf.

The other operand is a container with the same keys, or anything a tensor
accepts (a number, a tensor broadcastable against every leaf).
"""

from __future__ import annotations

import numbers
import operator
import warnings
from collections.abc import Callable, Mapping
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..helpers.leaf_errors import note_key
from ..helpers.leafwise import in_place_write, like_pair
from ..helpers.missing_keys import check_default, map_pairs_default
from ..helpers.mixin import ContainerMixin
from ..helpers.nontensor import NonTensorData, eq_mask
from ..helpers.operand import check_batch_aligned_operand

if TYPE_CHECKING:
    from typing_extensions import Self


def _is_operand(other: Any) -> bool:
    """Whether ``other`` is something a leaf-by-leaf operation takes."""
    return isinstance(
        other, (torch.Tensor, numbers.Number, np.ndarray, np.generic, torch.SymInt, torch.SymFloat)
    )


def _pairs(self, other: Any, api: str) -> list:
    """``(key, leaf, other's value)`` for every key; ``other`` is a container or a dict."""
    if isinstance(other, Mapping) and not getattr(type(other), "_is_tensor_collection", False):
        other_data = other
    else:
        other_data = other._to_tensordict_view()._data
    if other_data.keys() != self._data.keys():
        # a None entry is an unset TensorClass field: the same as no entry
        only = [
            k
            for data in (self._data, other_data)
            for k in data
            if k not in self._data or k not in other_data
            if not _is_none(data[k])
        ]
        if only:
            raise KeyError(
                f"{type(self).__name__}.{api}: both operands must have the same keys; these "
                f"keys are only in one of them: {sorted(only, key=str)}."
            )
        return [(k, v, other_data[k]) for k, v in self._data.items() if k in other_data]
    return [(k, v, other_data[k]) for k, v in self._data.items()]


def _is_none(value: Any) -> bool:
    return value is None or (type(value) is NonTensorData and value.data is None)


_BITWISE = (operator.and_, operator.or_, operator.xor)


def _bitwise_values(value: Any, rhs: Any, op: Callable) -> Any:
    """``&``, ``|``, ``^`` of two non-tensor booleans or integers apply to the values (as
    on the Python values); any other op or value keeps the left operand's leaf."""
    if (
        op in _BITWISE
        and isinstance(rhs, NonTensorData)
        and isinstance(value.data, (bool, int))
        and isinstance(rhs.data, (bool, int))
    ):
        return type(value)(op(value.data, rhs.data), batch_size=value.batch_size)
    return value._fresh()


def _binary(self, other: Any, op: Callable, api: str, compare: bool = False):
    keyed = getattr(type(other), "_is_tensor_collection", False)
    if isinstance(other, Mapping) and not keyed:
        if not compare:
            raise TypeError(
                f"TensorDict.{api}: the other operand is a {type(other).__name__}; convert it "
                f"to a TensorDict first (TensorDict(other, batch_size=...))."
            )
        keyed = True  # comparisons pair a dict with the keys, as tensordict does
    if keyed:
        pairs = _pairs(self, other, api)
    elif compare and not _is_operand(other):
        # tensordict: == gives False, != True, and the orderings False with a warning
        if api not in ("__eq__", "__ne__"):
            warnings.warn(
                f"TensorDict.{api}: comparing with a {type(other).__name__} gives False; "
                f"compare with a TensorDict, a dict, a tensor or a number.",
                FutureWarning,
                stacklevel=3,
            )
        return api == "__ne__"
    else:
        check_batch_aligned_operand(self, other, api)
        pairs = [(k, v, other) for k, v in self._data.items()]
    data: dict[str, Any] = {}
    key = None
    try:
        with _numpy_operand() if isinstance(other, np.ndarray) else nullcontext():
            for key, value, rhs in pairs:
                if isinstance(value, NonTensorData):
                    if not compare:
                        data[key] = _bitwise_values(value, rhs, op)
                    elif keyed and api in ("__eq__", "__ne__"):
                        mask = eq_mask(value, rhs)
                        data[key] = mask if api == "__eq__" else ~mask
                    # a comparison with a number or a tensor leaves non-tensor leaves out
                    continue
                if (
                    compare
                    and isinstance(rhs, Mapping)
                    and not hasattr(value, "_to_tensordict_view")
                ):
                    raise TypeError(
                        f"TensorDict.{api}: key {key!r} holds a tensor in one operand and a "
                        f"{type(rhs).__name__} in the other."
                    )
                data[key] = op(value, rhs)
    except Exception as error:
        note_key(error, key)
        raise
    return like_pair(self, other, data, api)


@contextmanager
def _numpy_operand():
    # A leaf with a NumPy array goes through NumPy, which calls torch's
    # Tensor.__array_wrap__ and warns (NumPy 2) that its signature is old: torch's to
    # change, and plain torch warns the same. The results stay plain torch's.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "__array_wrap__ must accept", DeprecationWarning)
        yield


def _inplace(self, other: Any, method: str, *args: Any):
    """``leaf.<method>(other's leaf or other, *args)`` for every tensor leaf, or none."""
    in_place_write(self, other, getattr(torch.Tensor, method), method, *args)
    return self


class ArithmeticMixin(ContainerMixin):
    """Operators of ``TensorDict``: ``+ - * / ** == != < <= > >=``, ``all``, ``any``.

    Example:
        >>> td = TensorDict({"a": torch.ones(2)}, [2])
        >>> (td * 2 + 1)["a"].tolist()
        [3.0, 3.0]
        >>> (td == 1).all()
        True
    """

    __slots__ = ()

    def __add__(self, other) -> Self:
        return _binary(self, other, operator.add, "__add__")

    def __radd__(self, other) -> Self:
        return _binary(self, other, lambda a, b: b + a, "__radd__")

    def __sub__(self, other) -> Self:
        return _binary(self, other, operator.sub, "__sub__")

    def __rsub__(self, other) -> Self:
        return _binary(self, other, lambda a, b: b - a, "__rsub__")

    def __mul__(self, other) -> Self:
        return _binary(self, other, operator.mul, "__mul__")

    def __rmul__(self, other) -> Self:
        return _binary(self, other, lambda a, b: b * a, "__rmul__")

    def __truediv__(self, other) -> Self:
        return _binary(self, other, operator.truediv, "__truediv__")

    def __rtruediv__(self, other) -> Self:
        return _binary(self, other, lambda a, b: b / a, "__rtruediv__")

    def __pow__(self, other) -> Self:
        return _binary(self, other, operator.pow, "__pow__")

    def __rpow__(self, other) -> Self:
        return _binary(self, other, lambda a, b: b**a, "__rpow__")

    def __floordiv__(self, other) -> Self:
        return _binary(self, other, operator.floordiv, "__floordiv__")

    def __rfloordiv__(self, other) -> Self:
        return _binary(self, other, lambda a, b: b // a, "__rfloordiv__")

    def __mod__(self, other) -> Self:
        return _binary(self, other, operator.mod, "__mod__")

    def __rmod__(self, other) -> Self:
        return _binary(self, other, lambda a, b: b % a, "__rmod__")

    def __and__(self, other) -> Self:
        return _binary(self, other, operator.and_, "__and__")

    def __or__(self, other) -> Self:
        return _binary(self, other, operator.or_, "__or__")

    def __xor__(self, other) -> Self:
        return _binary(self, other, operator.xor, "__xor__")

    def __rand__(self, other) -> Self:
        return _binary(self, other, lambda a, b: b & a, "__rand__")

    def __ror__(self, other) -> Self:
        return _binary(self, other, lambda a, b: b | a, "__ror__")

    def __rxor__(self, other) -> Self:
        return _binary(self, other, lambda a, b: b ^ a, "__rxor__")

    def __invert__(self) -> Self:
        return self._apply_tree(operator.invert, (), None, None, False, check=False)

    def __neg__(self) -> Self:
        return self._apply_tree(operator.neg, (), None, None, False, check=False)

    def __abs__(self) -> Self:
        return self._apply_tree(torch.abs, (), None, None, False, check=False)

    def pow(self, exponent: Any, *, default: Any = None) -> Self:
        """``self ** exponent``, leaf by leaf (``default``: as for :meth:`add`).

        Example:
            >>> TensorDict({"a": torch.full((2,), 3.0)}, [2]).pow(2)["a"].tolist()
            [9.0, 9.0]
        """
        if default is None or not getattr(type(exponent), "_is_tensor_collection", False):
            check_default(default, "pow", type(self).__name__)
            return _binary(self, exponent, operator.pow, "pow")
        check_default(default, "pow", type(self).__name__)
        return map_pairs_default(self, exponent, torch.pow, "pow", default)

    def __eq__(self, other) -> Self:  # type: ignore[override]
        if other is None:
            return False
        return _binary(self, other, operator.eq, "__eq__", compare=True)

    def __ne__(self, other) -> Self:  # type: ignore[override]
        if other is None:
            return True
        return _binary(self, other, operator.ne, "__ne__", compare=True)

    def __lt__(self, other) -> Self:
        return _binary(self, other, operator.lt, "__lt__", compare=True)

    def __le__(self, other) -> Self:
        return _binary(self, other, operator.le, "__le__", compare=True)

    def __gt__(self, other) -> Self:
        return _binary(self, other, operator.gt, "__gt__", compare=True)

    def __ge__(self, other) -> Self:
        return _binary(self, other, operator.ge, "__ge__", compare=True)

    # A frozen TensorClass answers NotImplemented, so `p += x` rebinds p to p + x.
    def __iadd__(self, other) -> Self:
        return NotImplemented if self._frozen else _inplace(self, other, "add_")

    def __isub__(self, other) -> Self:
        return NotImplemented if self._frozen else _inplace(self, other, "sub_")

    def __imul__(self, other) -> Self:
        return NotImplemented if self._frozen else _inplace(self, other, "mul_")

    def __itruediv__(self, other) -> Self:
        return NotImplemented if self._frozen else _inplace(self, other, "div_")

    def add_(self, other, *, alpha: float | None = None) -> Self:
        if alpha is not None:
            other = other * alpha
        return _inplace(self, other, "add_")

    def sub_(self, other) -> Self:
        return _inplace(self, other, "sub_")

    def mul_(self, other) -> Self:
        return _inplace(self, other, "mul_")

    def div_(self, other) -> Self:
        return _inplace(self, other, "div_")

    def lerp_(self, end, weight: float) -> Self:
        if not getattr(type(end), "_is_tensor_collection", False):
            raise TypeError(
                f"{type(self).__name__}.lerp_: end must be a TensorDict with the same keys."
            )
        if getattr(type(weight), "_is_tensor_collection", False):
            raise TypeError(
                f"{type(self).__name__}.lerp_: weight must be a number or a tensor, got a "
                f"{type(weight).__name__}. For a weight per entry, use "
                f"td.apply_(torch.lerp, end, weight)."
            )
        check_batch_aligned_operand(self, weight, "lerp_")
        return _inplace(self, end, "lerp_", weight)

    def _tensor_leaves(self):
        for value in self._data.values():
            if isinstance(value, torch.Tensor):
                yield value
            elif getattr(type(value), "_is_tensor_collection", False):
                yield from value._to_tensordict_view()._tensor_leaves()
