"""The ``default=`` keyword of the binary leaf-by-leaf methods (``add``, ``mul``, ...).

Two containers whose keys differ are an error by default. ``default="intersection"``
computes the entries both operands have and leaves the others out; a tensor ``default``
stands in for the entry that one side lacks, so the result has the entries of both.
Entries are matched by key path at every level, never by position.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .leaf_errors import note_key
from .leafwise import is_collection, like_pair, map_leaves
from .nontensor import NonTensorData
from .rewrap import rewrap

INTERSECTION = "intersection"


def check_default(default: Any, api: str, owner: str) -> None:
    """Refuse a ``default=`` that is neither ``None``, ``"intersection"`` nor a tensor."""
    if default is None or isinstance(default, torch.Tensor) or default is INTERSECTION:
        return
    if isinstance(default, str) and default == INTERSECTION:
        return
    if isinstance(default, str):
        raise ValueError(
            f"{owner}.{api}: default={default!r} is not an option; pass "
            f'default="intersection" to compute only the keys both operands have, or a '
            f"tensor that stands in for a missing entry."
        )
    raise TypeError(
        f"{owner}.{api}: default must be None, 'intersection' or a tensor, got a "
        f"{type(default).__name__}. For a number, pass torch.tensor(value) with the dtype "
        f"you want."
    )


def map_pairs_default(self: Any, other: Any, fn: Callable, api: str, default: Any) -> Any:
    """``fn(leaf, other's leaf)`` of two containers whose keys may differ (see module doc).

    ``default`` is ``"intersection"`` or a tensor (checked by :func:`check_default`).
    ``other`` must be a container; anything else goes through the ordinary path.
    """
    fill = None if isinstance(default, str) else default
    data = _pairs(self, other, fn, api, fill, ())
    return like_pair(self, other, data, api)


class _Refused:
    """Marks the errors this module raises itself: they name their key path already."""

    @staticmethod
    def mark(error: Exception) -> Exception:
        error._tdfunc_refused = True  # type: ignore[attr-defined]
        return error


def _is_absent(value: Any) -> bool:
    # an unset TensorClass field is held as None: the same as no entry
    return value is None or (type(value) is NonTensorData and value.data is None)


def _pairs(node: Any, other: Any, fn: Callable, api: str, fill: Any, prefix: tuple) -> dict:
    mine, theirs = node._to_tensordict_view()._data, other._to_tensordict_view()._data
    # a TensorClass keeps every field (None where unset); a TensorDict leaves keys out
    fields = not getattr(type(node), "_is_tensordict", False)
    out: dict[str, Any] = {}
    key = None
    try:
        for key, value in mine.items():
            rhs = theirs.get(key)
            if _is_absent(value):
                if _is_absent(rhs) or fill is None:
                    out[key] = None if fields else _skip
                else:
                    out[key] = _one_side(rhs, lambda t: fn(fill, t))
            elif _is_absent(rhs):
                if fill is not None:
                    out[key] = _one_side(value, lambda t: fn(t, fill))
                else:
                    out[key] = None if fields else _skip
            else:
                both = _both(value, rhs, fn, api, fill, (*prefix, key))
                out[key] = None if both is _skip and fields else both
        extra = [k for k, v in theirs.items() if k not in mine and not _is_absent(v)]
        if fill is not None and extra:
            unknown = [k for k in extra if k not in getattr(type(node), "_tc_field_names", ())]
            if fields and unknown:
                name = type(node).__name__
                where = f" at key {prefix!r}" if prefix else ""
                raise _Refused.mark(
                    ValueError(
                        f"{name}.{api}: the other operand has the entries {sorted(unknown)}"
                        f"{where} that {name} has no field for, and default= would add "
                        f"them; use default='intersection', or convert with "
                        f"to_tensordict() first."
                    )
                )
            for key in extra:
                out[key] = _one_side(theirs[key], lambda t: fn(fill, t))
    except Exception as error:
        if not getattr(error, "_tdfunc_refused", False):
            note_key(error, key)
        raise
    return {k: v for k, v in out.items() if v is not _skip}


_skip = object()


def _both(value: Any, rhs: Any, fn: Callable, api: str, fill: Any, path: tuple) -> Any:
    if isinstance(value, torch.Tensor) and isinstance(rhs, torch.Tensor):
        return fn(value, rhs)
    if is_collection(value) and is_collection(rhs):
        data = _pairs(value, rhs, fn, api, fill, path)
        return rewrap(value, value._to_tensordict_view()._like(data))
    if isinstance(value, NonTensorData) and isinstance(rhs, NonTensorData):
        return value._fresh()  # non-tensor values pass through arithmetic unchanged
    if fill is None:
        # the two sides hold different kinds of entry: no leaf is in both
        return _skip
    key = path[0] if len(path) == 1 else path
    raise _Refused.mark(
        TypeError(
            f"TensorDict.{api}: key {key!r} holds a {_kind(value)} in one operand and a "
            f"{_kind(rhs)} in the other; default= fills only entries that one side lacks."
        )
    )


def _one_side(value: Any, fn: Callable) -> Any:
    """The result for an entry only one operand has, with ``fn`` closing over the fill."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if is_collection(value):
        return rewrap(value, map_leaves(value._to_tensordict_view(), fn, None, True, None))
    return value._fresh() if isinstance(value, NonTensorData) else value


def _kind(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return "tensor"
    return type(value).__name__
