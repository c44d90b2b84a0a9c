"""Containers as native pytree nodes, for ``torch.utils._pytree`` and optree.

``torch.func`` and ``torch.compile`` flatten a container into its tensor and
nested-container values, transform them, and unflatten. Transforms change
leaf shapes in between (vmap removes and re-adds the mapped dim, jacobians
add dims), so the batch size is not stored: it is inferred on unflatten from
the leaves, using the feature shapes recorded at flatten time. The spec
context compares by structure only (class, keys, non-tensor values) so that
the same container inside and outside a transform has equal specs.

Inference, for the children that have a shape (tensors, and containers that
hold a tensor somewhere below them):

1. A child still of the kind it was at flatten time (tensor or container)
   whose shape ends in its recorded feature shape proposes the dims before
   it. If all proposals agree and every child starts with that prefix, it is
   the batch size. This is exact inside and outside ``vmap`` (any
   ``in_dims``/``out_dims`` among the batch dims) and for jacobians, also when
   a feature size equals a batch size.
2. Otherwise the recorded batch size, if every child still starts with it
   (a ``tree_map`` that reduced a feature dim).
3. Otherwise the longest prefix the children share, or an error when the
   proposals of step 1 contradict each other. This is also the rule for a
   jacobian, whose tensor children come back as containers (one block per
   input): its batch size is the longest prefix its blocks share, the same
   for ``jacrev`` and ``jacfwd``.

Children without a shape (vmap's ``in_dims`` trees hold ints and ``None``)
are held as they are; with no shaped child at all the recorded batch size is
used. The shape ``(4,)`` of a leaf recorded as ``(4, 4)`` with batch ``[4]``
is ambiguous; step 1 reads it as "the batch dim was reduced", as in
``tree_map(lambda x: x.mean(0), params)``.
"""

from __future__ import annotations

import json
from typing import Any

import optree
import torch
import torch.utils._pytree as torch_pytree
from torch._C import _functorch

from ._nontensor import NonTensorData, NonTensorStack

NAMESPACE = "tdfunc"
_is_compiling = torch.compiler.is_compiling
_Tensor = torch.Tensor
_NON_TENSOR_KINDS = {"data": NonTensorData, "stack": NonTensorStack}


class Context:
    """What unflatten needs besides the children. Equality ignores every shape.

    Never mutated after construction: transforms compare, hash and reuse it.
    """

    __slots__ = (
        "batch_size",
        "cls",
        "device",
        "feature_shapes",
        "keys",
        "level",
        "names",
        "non_tensor",
        "tensor_children",
    )

    def __init__(
        self,
        cls: Any,
        keys: tuple,
        non_tensor: tuple,
        batch_size: torch.Size,
        feature_shapes: tuple,
        tensor_children: tuple,
        device: torch.device | None,
        names: tuple | None,
        level: int | None = None,
    ) -> None:
        self.cls = cls
        self.keys = keys  # keys of the children, in order
        self.non_tensor = non_tensor  # ((key, python value, leaf class), ...), not children
        self.batch_size = batch_size  # as recorded at flatten time
        self.feature_shapes = feature_shapes  # per child: shape after the batch dims
        self.tensor_children = tensor_children  # per child: True for a tensor
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
        return hash((self.cls, self.keys, tuple(entry[0] for entry in self.non_tensor)))

    def __repr__(self) -> str:
        return (
            f"Context({self.cls.__name__}, keys={list(self.keys)}, "
            f"batch_size={list(self.batch_size)})"
        )


def _same_non_tensor(left: tuple, right: tuple) -> bool:
    if len(left) != len(right):
        return False
    for (left_key, left_value, left_cls), (right_key, right_value, right_cls) in zip(left, right):
        if left_key != right_key or left_cls is not right_cls:
            return False
        if left_value is right_value:
            continue
        try:
            if not bool(left_value == right_value):
                return False
        except Exception:  # values whose == is not a bool (arrays, tensors, ...)
            return False
    return True


def _collection(value: Any) -> bool:
    return getattr(type(value), "_is_tensor_collection", False)


def flatten(container) -> tuple[list, Context]:
    """Children (tensors and nested containers, in key order) and the context."""
    view = container._to_tensordict_view()
    batch_size = view._batch_size
    ndim = len(batch_size)
    keys = []
    children = []
    shapes: list[torch.Size | None] = []
    kinds = []
    non_tensor = []
    for key, value in view._data.items():
        if isinstance(value, _Tensor):
            keys.append(key)
            children.append(value)
            shapes.append(value.shape[ndim:])
            kinds.append(True)
        elif isinstance(value, NonTensorData):
            non_tensor.append((key, value.data, type(value)))
        else:
            keys.append(key)
            children.append(value)
            shapes.append(value.batch_size[ndim:] if _collection(value) else None)
            kinds.append(False)
    context = Context(
        type(container),
        tuple(keys),
        tuple(non_tensor),
        batch_size,
        tuple(shapes),
        tuple(kinds),
        view._device,
        view._names,
        None if _is_compiling() else _functorch.maybe_current_level(),
    )
    return children, context


def _leafless(child: Any) -> bool:
    """A container without any tensor below it: its batch size carries no information."""
    for value in child._to_tensordict_view()._data.values():
        if isinstance(value, _Tensor) or (_collection(value) and not _leafless(value)):
            return False
    return True


def infer_batch_size(children: list, context: Context) -> torch.Size:
    """The batch size that the (transformed) children imply; see the module docstring."""
    shapes = []
    candidate = None
    disagree = False
    replaced = False  # a tensor child came back as a container or the reverse
    for child, feature, was_tensor in zip(
        children, context.feature_shapes, context.tensor_children
    ):
        if isinstance(child, _Tensor):
            shape = child.shape
            is_tensor = True
        elif _collection(child) and not _leafless(child):
            shape = child.batch_size
            is_tensor = False
        else:
            continue
        shapes.append(shape)
        if is_tensor is not was_tensor:
            replaced = True
            continue
        split = len(shape) - len(feature)
        if split < 0 or shape[split:] != feature:
            continue
        if candidate is None:
            candidate = shape[:split]
        elif candidate != shape[:split]:
            disagree = True
    if not shapes:
        return context.batch_size
    if candidate is not None and not disagree:
        size = len(candidate)
        if all(shape[:size] == candidate for shape in shapes):
            return candidate
    recorded = context.batch_size
    size = len(recorded)
    if not replaced and all(shape[:size] == recorded for shape in shapes):
        return recorded
    if disagree:
        raise _inconsistent(children, context)
    return _common_prefix(shapes)


def _inconsistent(children: list, context: Context) -> ValueError:
    detail = ", ".join(
        f"{key!r}: {list(child.shape if isinstance(child, _Tensor) else child.batch_size)}"
        for key, child in zip(context.keys, children)
        if isinstance(child, _Tensor) or _collection(child)
    )
    features = ", ".join(
        f"{key!r}: {list(shape)}"
        for key, shape in zip(context.keys, context.feature_shapes)
        if shape is not None
    )
    return ValueError(
        f"tdfunc: cannot infer the batch size of a {context.cls.__name__} after a transform: "
        f"its leaves now have shapes {{{detail}}} but had batch size {list(context.batch_size)} "
        f"and feature shapes {{{features}}}, so they imply different batch sizes. Under vmap, "
        f"map every leaf of a container over the same batch dim (in_dims=None for a leaf "
        f"that has the batch dims leaves it inconsistent); give shared leaves their own "
        f"sub-container with batch_size=[] instead."
    )


def _common_prefix(shapes: list) -> torch.Size:
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
    ndim = len(context.batch_size)
    for key, child in zip(context.keys, children):
        if not isinstance(child, _Tensor) or not _functorch.is_batchedtensor(child):
            continue
        if context.level is not None and _functorch.maybe_get_level(child) <= context.level:
            return
        bdim = _functorch.maybe_get_bdim(child)
        if bdim >= ndim:
            name = context.cls.__name__
            dims = "it has none" if not ndim else f"they are dims 0..{ndim - 1}"
            raise ValueError(
                f"vmap: a {name} with batch_size={list(context.batch_size)} was mapped over "
                f"dim {bdim} (at key {key!r}), which is not one of its batch dims ({dims}). "
                f"vmap can only map a {name} over its batch dims: give it a batch dim first, "
                f"e.g. {name}(..., batch_size=[n]), or map another dim."
            )


def unflatten(children, context: Context):
    """Rebuild a container; children that are not tensors are held without validation."""
    children = list(children)
    batch_size = _batch_size_of(children, context)
    data = dict(zip(context.keys, children))
    recorded = context.batch_size
    if batch_size != recorded:
        for key, child, feature in zip(context.keys, children, context.feature_shapes):
            # a leafless container's own unflatten could only guess its batch size
            if (
                feature is not None
                and _collection(child)
                and child.batch_size != batch_size + feature
                and _leafless(child)
            ):
                data[key] = _rebatched(child, batch_size + feature)
    for key, value, kind in context.non_tensor:
        data[key] = kind._make(value, batch_size, context.device)
    names = context.names if batch_size == recorded else None
    return context.cls._from_pytree(data, batch_size, _device_of(children, context), names)


def _batch_size_of(children: list, context: Context) -> torch.Size:
    if not _is_compiling():  # dynamo cannot trace the functorch level queries
        level = _functorch.maybe_current_level()
        # only a deeper level than at flatten time can be vmap's input boundary
        if level is not None and (context.level is None or level > context.level):
            _check_vmap_input(children, context)
    return infer_batch_size(children, context)


def _rebatched(child: Any, batch_size: torch.Size) -> Any:
    """A copy of a leafless container with ``batch_size`` (nested ones follow)."""
    view = child._to_tensordict_view()
    ndim = len(view._batch_size)
    data = {}
    for key, value in view._data.items():
        if _collection(value):
            value = _rebatched(value, batch_size + value.batch_size[ndim:])
        elif isinstance(value, NonTensorData):
            value = type(value)._make(value.data, batch_size, value.device)
        data[key] = value
    return type(child)._from_pytree(data, batch_size, view._device, None)


def _device_of(children: list, context: Context):
    if context.device is None:
        return None
    for child in children:
        if isinstance(child, _Tensor):
            return child.device
    return context.device


def flatten_with_keys(container):
    """Like :func:`flatten`, each child paired with its ``MappingKey`` (for key paths)."""
    children, context = flatten(container)
    return [(torch_pytree.MappingKey(k), c) for k, c in zip(context.keys, children)], context


# ---------------------------------------------------------------- serialisation
def to_dumpable_context(context: Context) -> str:
    """The context as JSON, for ``treespec_dumps`` and ``torch.export``."""
    non_tensor = []
    for key, value, kind in context.non_tensor:
        try:
            json.dumps(value)
        except TypeError:
            raise TypeError(
                f"treespec_dumps: the non-tensor value at key {key!r} of a "
                f"{context.cls.__name__} is a {type(value).__name__}, which cannot be written "
                f"to JSON; only JSON values (str, int, float, bool, None, lists and dicts of "
                f"them) can be serialised in a treespec."
            ) from None
        non_tensor.append([key, value, "stack" if kind is NonTensorStack else "data"])
    return json.dumps(
        {
            "class": f"{context.cls.__module__}.{context.cls.__qualname__}",
            "keys": list(context.keys),
            "non_tensor": non_tensor,
            "batch_size": list(context.batch_size),
            "feature_shapes": [None if s is None else list(s) for s in context.feature_shapes],
            "tensor_children": list(context.tensor_children),
            "device": None if context.device is None else str(context.device),
            "names": None if context.names is None else list(context.names),
        }
    )


def _context_loader(cls: type):
    def from_dumpable_context(dumped: str) -> Context:
        raw = json.loads(dumped)
        return Context(
            cls,
            tuple(raw["keys"]),
            tuple((k, v, _NON_TENSOR_KINDS[kind]) for k, v, kind in raw["non_tensor"]),
            torch.Size(raw["batch_size"]),
            tuple(None if s is None else torch.Size(s) for s in raw["feature_shapes"]),
            tuple(raw["tensor_children"]),
            None if raw["device"] is None else torch.device(raw["device"]),
            None if raw["names"] is None else tuple(raw["names"]),
        )

    return from_dumpable_context


# ---------------------------------------------------------------- registration
def _optree_flatten(container):
    """optree's form: (children, context, entries)."""
    children, context = flatten(container)
    return children, context, context.keys


def _optree_unflatten(context: Context, children):
    return unflatten(children, context)


def register(cls: type) -> None:
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
    optree.register_pytree_node(
        cls,
        _optree_flatten,
        _optree_unflatten,  # type: ignore[arg-type]
        namespace=NAMESPACE,
    )
