"""One ``__torch_function__`` dispatch table for ``torch.stack``, ``torch.cat``, ...

Containers are not tensors; torch calls ``__torch_function__`` on them when
they appear in the arguments of a torch function, and this table routes the
call. Functions not in the table are not supported on containers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._nontensor import NonTensorData, cat_non_tensor, stack_non_tensor
from ._shapes import normalize_dim

HANDLED: dict[Callable, Callable] = {}


def implements(*funcs: Callable) -> Callable:
    def register(handler: Callable) -> Callable:
        for func in funcs:
            HANDLED[func] = handler
        return handler

    return register


def _check_same_keys(items: list, api: str) -> list[str]:
    keys = list(items[0]._to_tensordict_view()._data)
    reference = set(keys)
    for position, item in enumerate(items[1:], start=1):
        other = item._to_tensordict_view()._data.keys()
        if other != reference:
            diff = sorted(reference.symmetric_difference(other))
            raise KeyError(
                f"{api}: the containers at positions 0 and {position} have different keys; "
                f"these keys are only in one of them: {diff}."
            )
    return keys


def _combine(values: list, dim: int, api: str) -> Any:
    first = values[0]
    if isinstance(first, NonTensorData):
        if api == "torch.stack":
            return stack_non_tensor(values, dim)
        return cat_non_tensor(values, dim)
    if api == "torch.stack":
        return torch.stack(values, dim)
    return torch.cat(values, dim)


@implements(torch.stack)
def stack(items, dim: int = 0, *, out=None):
    """Stack containers of equal batch size along a new batch dim."""
    items = list(items)
    if not items:
        raise ValueError("torch.stack: expected a non-empty list of TensorDicts.")
    first = items[0]
    size = first.batch_size
    for position, item in enumerate(items[1:], start=1):
        if item.batch_size != size:
            raise ValueError(
                f"torch.stack: all TensorDicts must have the same batch size; position 0 has "
                f"{list(size)} and position {position} has {list(item.batch_size)}."
            )
    dim = normalize_dim(dim, len(size) + 1, "torch.stack")
    views = [item._to_tensordict_view() for item in items]
    keys = _check_same_keys(items, "torch.stack")
    data = {key: _combine([v._data[key] for v in views], dim, "torch.stack") for key in keys}
    new_size = torch.Size(list(size[:dim]) + [len(items)] + list(size[dim:]))
    result = first._like(data, new_size, None)
    if out is not None:
        out.update_(result)
        return out
    return result


@implements(torch.cat, torch.concat, torch.concatenate)
def cat(items, dim: int = 0, *, out=None):
    """Concatenate containers along an existing batch dim."""
    items = list(items)
    if not items:
        raise ValueError("torch.cat: expected a non-empty list of TensorDicts.")
    first = items[0]
    size = first.batch_size
    dim = normalize_dim(dim, len(size), "torch.cat")
    for position, item in enumerate(items[1:], start=1):
        other = item.batch_size
        if (
            len(other) != len(size)
            or other[:dim] != size[:dim]
            or other[dim + 1 :] != size[dim + 1 :]
        ):
            raise ValueError(
                f"torch.cat: batch sizes must match except in dim {dim}; position 0 has "
                f"{list(size)} and position {position} has {list(other)}."
            )
    views = [item._to_tensordict_view() for item in items]
    keys = _check_same_keys(items, "torch.cat")
    data = {key: _combine([v._data[key] for v in views], dim, "torch.cat") for key in keys}
    total = sum(item.batch_size[dim] for item in items)
    new_size = size[:dim] + torch.Size([total]) + size[dim + 1 :]
    result = first._like(data, new_size, None)
    if out is not None:
        out.update_(result)
        return out
    return result


@implements(torch.unbind)
def unbind(item, dim: int = 0):
    return item.unbind(dim)


@implements(torch.split)
def split(item, split_size_or_sections, dim: int = 0):
    return item.split(split_size_or_sections, dim)


@implements(torch.chunk)
def chunk(item, chunks: int, dim: int = 0):
    return item.chunk(chunks, dim)


@implements(torch.squeeze)
def squeeze(item, dim=None):
    return item.squeeze(dim)


@implements(torch.unsqueeze)
def unsqueeze(item, dim: int):
    return item.unsqueeze(dim)


@implements(torch.permute)
def permute(item, dims):
    return item.permute(*dims)


@implements(torch.reshape)
def reshape(item, shape):
    return item.reshape(*shape)


@implements(torch.flatten)
def flatten(item, start_dim: int = 0, end_dim: int = -1):
    return item.flatten(start_dim, end_dim)


@implements(torch.transpose)
def transpose(item, dim0: int, dim1: int):
    return item.transpose(dim0, dim1)


@implements(torch.clone)
def clone(item, *, memory_format=None):
    return item.clone()


@implements(torch.zeros_like)
def zeros_like(item, **kwargs):
    return item.apply(lambda t: torch.zeros_like(t, **kwargs))


@implements(torch.ones_like)
def ones_like(item, **kwargs):
    return item.apply(lambda t: torch.ones_like(t, **kwargs))


@implements(torch.empty_like)
def empty_like(item, **kwargs):
    return item.apply(lambda t: torch.empty_like(t, **kwargs))


@implements(torch.full_like)
def full_like(item, fill_value, **kwargs):
    return item.apply(lambda t: torch.full_like(t, fill_value, **kwargs))


@implements(torch.randn_like)
def randn_like(item, **kwargs):
    return item.apply(lambda t: torch.randn_like(t, **kwargs))


@implements(torch.rand_like)
def rand_like(item, **kwargs):
    return item.apply(lambda t: torch.rand_like(t, **kwargs))


class TorchFunctionMixin:
    """Routes the torch functions in :data:`HANDLED` to their container versions."""

    __slots__ = ()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        handler = HANDLED.get(func)
        if handler is None:
            return NotImplemented
        return handler(*args, **(kwargs or {}))
