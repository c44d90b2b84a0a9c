"""Small public helpers of tensordict's ``tensordict.utils``: dtype predicates, leaf
rules, right-expansion and lenient key unravelling.

The dtype predicates test their last argument, so one function serves as ``fn(value)``
(inside ``apply``) and as ``fn(key, value)`` (a filter given keys and values).

Example:
    >>> import torch
    >>> is_inexact(torch.zeros(3)), is_inexact("a", torch.zeros(3, dtype=torch.long))
    (True, False)
    >>> expand_right(torch.arange(2), (2, 3)).tolist()
    [[0, 0, 0], [1, 1, 1]]
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .mixin import is_tensor_collection_or_class
from .nested_keys import unravel_key
from .nontensor import NonTensorData


def is_bool(*args) -> bool:
    """Whether the last argument is a boolean tensor."""
    return args[-1].dtype is torch.bool


def is_floating(*args) -> bool:
    """Whether the last argument is a floating-point tensor (complex is not)."""
    return args[-1].dtype.is_floating_point


def is_integer(*args) -> bool:
    """Whether the last argument is an integer tensor, signed or unsigned (bool is not)."""
    dtype = args[-1].dtype
    return not (dtype.is_floating_point or dtype.is_complex or dtype is torch.bool)


def is_inexact(*args) -> bool:
    """Whether the last argument is a floating-point or complex tensor."""
    dtype = args[-1].dtype
    return dtype.is_floating_point or dtype.is_complex


def default_is_leaf(cls: type) -> bool:
    """The default leaf rule of ``keys``/``items``/``apply``: anything but a container.

    Non-tensor data is a container here, so ``leaves_only=True`` skips it.
    """
    return not is_tensor_collection_or_class(cls)


def is_leaf_nontensor(cls: type) -> bool:
    """A leaf rule under which non-tensor data is a leaf too (``keys(is_leaf=...)``)."""
    return issubclass(cls, NonTensorData) or default_is_leaf(cls)


def expand_right(tensor: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """``tensor`` with dims added on the right, then expanded to ``shape`` (a view)."""
    expanded = tensor
    while expanded.ndim < len(shape):
        expanded = expanded.unsqueeze(-1)
    return expanded.expand(shape)


def expand_as_right(tensor, dest):
    """``tensor`` expanded on the right to the shape of ``dest`` (its batch size for a
    container); the leading dims must match or be 1."""
    shape = dest.shape
    if len(shape) < tensor.ndim or any(
        size not in (1, target) for size, target in zip(tensor.shape, shape, strict=False)
    ):
        raise RuntimeError(
            f"expand_as_right: cannot expand a tensor of shape {tuple(tensor.shape)} on the "
            f"right to {tuple(shape)}: its dims must match the leading dims of the "
            "destination or be 1."
        )
    return expand_right(tensor, shape)


def unravel_key_to_tuple(key) -> tuple[str, ...]:
    """``key`` as a flat tuple of str (``"a"`` gives ``("a",)``), or ``()`` when it is
    not a valid nested key."""
    if type(key) is tuple and _has_empty_part(key):
        return ()  # tensordict: an empty part makes the whole key invalid
    try:
        flat = unravel_key(key, "unravel_key_to_tuple")
    except (TypeError, KeyError):
        return ()
    return (flat,) if isinstance(flat, str) else flat


def _has_empty_part(key: tuple) -> bool:
    return any(type(part) is tuple and (not part or _has_empty_part(part)) for part in key)


def unravel_key_list(keys) -> list:
    """Every key of ``keys`` unravelled as ``unravel_key`` does."""
    if not isinstance(keys, (list, tuple)):
        raise TypeError(
            f"unravel_key_list: expected a list or a tuple of keys, got {type(keys).__name__}."
        )
    return [unravel_key(key, "unravel_key_list") for key in keys]
