"""Containers as native pytree nodes, for ``torch.utils._pytree`` and optree.

``torch.func`` and ``torch.compile`` flatten a container into its tensor and
nested-container values, transform them, and unflatten. Transforms change
leaf shapes in between (vmap removes and re-adds the mapped dim, jacobians
add dims), so the batch size is not stored: it is inferred on unflatten from
the leaves, using the feature shapes recorded at flatten time. The spec
context compares by structure only (class, keys, non-tensor values) so that
the same container inside and outside a transform has equal specs.
"""

from __future__ import annotations

import json
from typing import Any

import optree
import torch
import torch.utils._pytree as torch_pytree
from torch._C import _functorch

from ._nontensor import NonTensorData

NAMESPACE = "tdfunc"
_is_compiling = torch.compiler.is_compiling


class Context:
    """What unflatten needs besides the leaves. Equality ignores every shape."""

    __slots__ = (
        "batch_size",
        "cls",
        "device",
        "feature_shapes",
        "keys",
        "level",
        "names",
        "non_tensor",
    )

    def __init__(
        self, cls, keys, non_tensor, batch_size, feature_shapes, device, names, level=None
    ):
        self.cls = cls
        self.keys = keys  # keys of the children, in order
        self.non_tensor = non_tensor  # ((key, python value), ...) kept out of the leaves
        self.batch_size = batch_size  # as recorded at flatten time (a fallback only)
        self.feature_shapes = feature_shapes  # per child: shape after the batch dims
        self.device = device
        self.names = names
        self.level = level  # functorch level at flatten time (None outside transforms)

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is Context
            and self.cls is other.cls
            and self.keys == other.keys
            and _same_non_tensor(self.non_tensor, other.non_tensor)
        )

    def __hash__(self) -> int:
        return hash((self.cls, self.keys, tuple(k for k, _ in self.non_tensor)))

    def __repr__(self) -> str:
        return (
            f"Context({self.cls.__name__}, keys={list(self.keys)}, "
            f"batch_size={list(self.batch_size)})"
        )


def _same_non_tensor(left: tuple, right: tuple) -> bool:
    if len(left) != len(right):
        return False
    for (lk, lv), (rk, rv) in zip(left, right):
        if lk != rk:
            return False
        try:
            if not bool(lv == rv):
                return False
        except Exception:
            if lv is not rv:
                return False
    return True


def flatten(container) -> tuple[list, Context]:
    """Children (tensors and nested containers, in key order) and the context."""
    view = container._to_tensordict_view()
    ndim = len(view._batch_size)
    keys = []
    children = []
    shapes = []
    non_tensor = []
    for key, value in view._data.items():
        if isinstance(value, NonTensorData):
            non_tensor.append((key, value.data))
            continue
        keys.append(key)
        children.append(value)
        shape = _shape_of(value)
        shapes.append(None if shape is None else shape[ndim:])
    context = Context(
        type(container),
        tuple(keys),
        tuple(non_tensor),
        view._batch_size,
        tuple(shapes),
        view._device,
        view._names,
        None if _is_compiling() else _functorch.maybe_current_level(),
    )
    return children, context


def _shape_of(child: Any) -> torch.Size | None:
    if isinstance(child, torch.Tensor):
        return child.shape
    if getattr(type(child), "_is_tensor_collection", False):
        return child.batch_size
    return None


def _leafless(child: Any) -> bool:
    """A container without any tensor below it: its batch size carries no information."""
    if isinstance(child, torch.Tensor):
        return False
    for value in child._to_tensordict_view()._data.values():
        if isinstance(value, torch.Tensor) or (
            getattr(type(value), "_is_tensor_collection", False) and not _leafless(value)
        ):
            return False
    return True


def infer_batch_size(children: list, context: Context) -> torch.Size:
    """The batch size that the (transformed) children imply; see the module docstring."""
    informative = [
        (_shape_of(child), feature)
        for child, feature in zip(children, context.feature_shapes)
        if not _leafless(child)
    ]
    shapes = [shape for shape, _ in informative]
    candidate = None
    disagree = False
    for shape, feature in informative:
        split = len(shape) - len(feature)
        if split < 0 or shape[split:] != feature:
            continue
        if candidate is None:
            candidate = shape[:split]
        elif candidate != shape[:split]:
            disagree = True
            break
    if (
        candidate is not None
        and not disagree
        and all(shape[: len(candidate)] == candidate for shape in shapes)
    ):
        return candidate
    recorded = context.batch_size
    if all(shape[: len(recorded)] == recorded for shape in shapes):
        return recorded
    if disagree:
        detail = ", ".join(f"{key!r}: {list(shape)}" for key, shape in zip(context.keys, shapes))
        raise ValueError(
            f"tdfunc: cannot infer the batch size of a {context.cls.__name__} from its "
            f"transformed leaves ({detail}); recorded batch size {list(recorded)}, feature "
            f"shapes {[list(f) for f in context.feature_shapes]}."
        )
    return _common_prefix(shapes)


def _common_prefix(shapes: list) -> torch.Size:
    if not shapes:
        return torch.Size()
    prefix = []
    for dims in zip(*shapes):
        if any(d != dims[0] for d in dims):
            break
        prefix.append(dims[0])
    return torch.Size(prefix)


def _check_vmap_input(children: list, context: Context) -> None:
    """Refuse a vmap that maps a feature dim of a leaf instead of a batch dim.

    At vmap's input boundary the leaves were flattened outside the transform and
    come back as BatchedTensors of a deeper level; their physical mapped dim must
    be one of the batch dims. Anywhere else (flatten and unflatten at the same
    level, e.g. a tree_map inside vmap) there is nothing to check.
    """
    for child in children:
        if not isinstance(child, torch.Tensor) or not _functorch.is_batchedtensor(child):
            continue
        level = _functorch.maybe_get_level(child)
        if context.level is not None and level <= context.level:
            return
        bdim = _functorch.maybe_get_bdim(child)
        ndim = len(context.batch_size)
        if bdim >= ndim:
            raise ValueError(
                f"vmap: a {context.cls.__name__} with batch_size={list(context.batch_size)} "
                f"was mapped over dim {bdim}, which is not one of its batch dims. vmap can only "
                f"map over batch dims (here: {'none' if not ndim else f'dims 0..{ndim - 1}'}); "
                f"give the container a batch dim first, e.g. TensorDict(..., batch_size=[n])."
            )
        return


def unflatten(children, context: Context):
    """Rebuild a container; children that are not tensors are held without validation."""
    children = list(children)
    data = dict(zip(context.keys, children))
    if any(_shape_of(child) is None for child in children):
        # vmap's in_dims/out_dims trees (ints, None) and other non-tensor trees
        batch_size = context.batch_size
    else:
        if not _is_compiling():  # dynamo cannot trace the functorch level queries
            _check_vmap_input(children, context)
        batch_size = infer_batch_size(children, context)
        for child, feature in zip(children, context.feature_shapes):
            if not isinstance(child, torch.Tensor) and _leafless(child):
                # fresh from its own unflatten: give it the parent's inferred batch dims
                child._to_tensordict_view()._batch_size = batch_size + feature
    if context.non_tensor:
        for key, value in context.non_tensor:
            data[key] = NonTensorData._make(value, batch_size, context.device)
    names = (
        context.names
        if context.names is not None and len(context.names) == len(batch_size)
        else None
    )
    return context.cls._from_pytree(data, batch_size, _device_of(children, context), names)


def _device_of(children: list, context: Context):
    if context.device is None:
        return None
    for child in children:
        if isinstance(child, torch.Tensor):
            return child.device
    return context.device


def flatten_with_keys(container):
    children, context = flatten(container)
    return [(torch_pytree.MappingKey(k), c) for k, c in zip(context.keys, children)], context


# ---------------------------------------------------------------- serialisation
def to_dumpable_context(context: Context) -> str:
    non_tensor = []
    for key, value in context.non_tensor:
        try:
            json.dumps(value)
        except TypeError:
            raise TypeError(
                f"tdfunc: the non-tensor value at key {key!r} ({type(value).__name__}) cannot "
                f"be serialised in a treespec; only JSON values can."
            ) from None
        non_tensor.append([key, value])
    return json.dumps(
        {
            "class": f"{context.cls.__module__}.{context.cls.__qualname__}",
            "keys": list(context.keys),
            "non_tensor": non_tensor,
            "batch_size": list(context.batch_size),
            "feature_shapes": [list(s) for s in context.feature_shapes],
            "device": None if context.device is None else str(context.device),
            "names": None if context.names is None else list(context.names),
        }
    )


def _context_loader(cls):
    def from_dumpable_context(dumped: str) -> Context:
        raw = json.loads(dumped)
        return Context(
            cls,
            tuple(raw["keys"]),
            tuple((k, v) for k, v in raw["non_tensor"]),
            torch.Size(raw["batch_size"]),
            tuple(torch.Size(s) for s in raw["feature_shapes"]),
            None if raw["device"] is None else torch.device(raw["device"]),
            None if raw["names"] is None else tuple(raw["names"]),
        )

    return from_dumpable_context


# ---------------------------------------------------------------- registration
def _optree_flatten(container):
    children, context = flatten(container)
    return children, context, context.keys


def _optree_unflatten(context: Context, children):
    return unflatten(children, context)


def register(cls) -> None:
    """Register ``cls`` (TensorDict or a TensorClass subclass) with both pytree libraries."""
    torch_pytree.register_pytree_node(
        cls,
        flatten,
        unflatten,
        serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
        to_dumpable_context=to_dumpable_context,
        from_dumpable_context=_context_loader(cls),
        flatten_with_keys_fn=flatten_with_keys,
    )
    optree.register_pytree_node(cls, _optree_flatten, _optree_unflatten, namespace=NAMESPACE)
