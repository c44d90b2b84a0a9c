"""Containers as native pytree nodes, for ``torch.utils._pytree`` and optree.

``torch.func`` and ``torch.compile`` flatten a container into its tensor
leaves, transform them, and unflatten. Transforms change leaf shapes in
between (vmap removes and re-adds the mapped dim, jacobians add dims), so the
batch size is not stored: it is inferred on unflatten from the leaves, using
the feature shapes recorded at flatten time. The spec context compares by
structure only (class, keys, non-tensor values) so that the same container
inside and outside a transform has equal specs.

One node per tree: for ``torch.utils._pytree`` a container flattens straight
to the leaves of all its nested containers, and its context describes the
nested levels. ``vmap`` walks the tree of its arguments four times per call
(flatten, rebuild and re-flatten its ``in_dims`` tree, unflatten), so every
nested container as a node of its own would cost four trips through torch's
Python pytree code. Key paths still name every level
(``tree_flatten_with_path`` gives ``['params']['weight']``: it walks
``flatten_with_keys``, which returns the nested containers as children), and
optree sees one node per container. What differs from nested nodes: an
``is_leaf`` given to ``torch.utils._pytree`` functions is called on the root
container and on the leaves, never on a nested container.

The batch size is inferred level by level on unflatten
(:mod:`tdfunc._pytree.infer` has the rules).
"""

from __future__ import annotations

import json
from operator import eq, is_
from typing import Any

import optree
import torch
import torch.utils._pytree as torch_pytree

from .._core.helpers.class_names import ALIASES, class_name, lookup_class
from .._core.helpers.mixin import is_tensor_collection as _collection
from .._core.helpers.nontensor import NonTensorData, NonTensorStack
from .._core.helpers.tracing import FAKE as _FAKE
from .._core.helpers.tracing import dispatch_modes as _modes
from .._core.helpers.tracing import (
    dynamo_compiling as _dynamo_compiling,  # dynamo cannot run the level queries
)
from .._core.helpers.tracing import fake_tracing
from .._core.helpers.tracing import functorch_level as _current_level
from .._core.helpers.tracing import get_dispatch_mode as _get_mode
from .rebuild import _FEW, _TENSOR_TYPES, _tensor_shape, unflatten
from .symbolic import concrete, symbolic

NAMESPACE = "tdfunc"
_Tensor = torch.Tensor
_NON_TENSOR_KINDS = {"data": NonTensorData, "stack": NonTensorStack}
_new = object.__new__
_NOTHING: tuple = ()
_UNSHAPED = frozenset({int, bool, type(None)})  # the leaves of vmap's in_dims trees
_ALL_TENSORS: dict[int, tuple] = {}  # width -> (True,) * width, shared by every context
# Contexts of earlier flattens, by what identifies a level besides its shapes: (class,
# keys, batch size, device, names, functorch level, depth below the container
# flattened). An entry is reused when the shapes (and, for a level with nested
# containers, the kinds of its children and the very contexts of its nested levels)
# are the ones it records; a level with non-tensor values is never reused. Flattening
# the same structure again then keeps no new object per leaf alive (a tree of 10,000
# leaves would otherwise keep 10,000 sizes per call, enough to start several garbage
# collections per call). Contexts are never mutated, so sharing one between calls is
# safe; while fake tensors are traced (symbolic sizes, rewritten in place by
# ``concrete``) and under dynamo no cache is used.
# Per key two entries, [level without nested containers, level with them]. Levels of
# one tree often share keys ("0", "1", ... or "k0", ...): the depth and the two
# entries keep them from evicting each other on every flatten.
_CONTEXTS: dict[tuple, list] = {}
_CONTEXTS_MAX = 4096  # emptied when full: a bound on memory, at the price of rebuilds
# The contexts of :func:`flatten_shallow` (one level each: optree's nodes, key paths), by
# (class, keys, batch size, device, names, functorch level), reused on the same terms.
_SHALLOW: dict[tuple, NodeContext] = {}


class NodeContext:
    """What unflatten needs besides the children. Equality ignores every shape.

    One per container level: ``nested`` holds the contexts of the nested
    containers that were flattened into this node. Never mutated after
    construction: transforms compare, hash and reuse it.
    """

    __slots__ = (
        "batch_size",
        "cls",
        "device",
        "feature_shapes",
        "keys",
        "leaf_shapes",
        "level",
        "names",
        "nested",
        "non_tensor",
        "order",
        "shapes",
        "tensor_children",
        "width",
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
        nested: tuple | None = None,
        width: int | None = None,
        shapes: tuple | None = None,
        order: tuple | None = None,
    ) -> None:
        self.cls = cls
        self.keys = keys  # keys of the tensor and container entries, in order
        self.non_tensor = non_tensor  # ((key, python value, leaf class), ...), not children
        self.batch_size = batch_size  # as recorded at flatten time
        self.feature_shapes = feature_shapes  # per key: shape after the batch dims
        self.tensor_children = tensor_children  # per key: True for a tensor
        self.device = device
        self.names = names
        self.level = level  # functorch level at flatten time (None outside transforms)
        # per key: the NodeContext of a nested container flattened into this node, or
        # None for a child of its own; None for all when no container was inlined
        self.nested = nested
        self.width = len(keys) if width is None else width  # children under this level
        if shapes is None:
            shapes = tuple(None if f is None else batch_size + f for f in feature_shapes)
        self.shapes = shapes  # per key: the whole shape (batch size for a container)
        # every key in the container's order, where a non-tensor entry sits before a
        # child (None: the children's keys, then the non-tensor ones, as they were)
        self.order = order
        self.leaf_shapes = leaf_shapes(self)

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is NodeContext
            and self.cls is other.cls
            and self.keys == other.keys
            and (
                self.non_tensor is other.non_tensor
                or _same_non_tensor(self.non_tensor, other.non_tensor)
            )
            and self.nested == other.nested
            and self.order == other.order
        )

    def __hash__(self) -> int:
        return hash((self.cls, self.keys, tuple(entry[0] for entry in self.non_tensor)))

    def __repr__(self) -> str:
        return (
            f"NodeContext({self.cls.__name__}, keys={list(self.keys)}, "
            f"batch_size={list(self.batch_size)})"
        )


def leaf_shapes(context: NodeContext) -> tuple | None:
    """The shape of every leaf below ``context``'s level, in leaf order, or ``None``
    when a leaf is not a tensor (an ``in_dims`` value, a nested container of optree's
    own level). Unflatten compares the leaves' shapes with it in one step.
    """
    kinds = context.tensor_children
    nested = context.nested
    if nested is None:
        return context.shapes if False not in kinds else None
    out: list = []
    for shape, is_tensor, inner in zip(context.shapes, kinds, nested):
        if inner is not None:
            below = inner.leaf_shapes
            if below is None:
                return None
            out += below
        elif is_tensor:
            out.append(shape)
        else:
            return None
    return tuple(out)


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


# ---------------------------------------------------------------- flatten
def _level() -> int | None:
    return None if _dynamo_compiling() else _current_level()


def _remember(cache: dict, key: tuple, context: NodeContext) -> None:
    pair = cache.get(key)
    if pair is None:
        if len(cache) >= _CONTEXTS_MAX:
            cache.clear()
        pair = cache[key] = [None, None]
    pair[context.nested is not None] = context


def _built(
    cls: type,
    keys: tuple,
    non_tensor: tuple,
    batch_size: torch.Size,
    shapes: tuple,
    feature_shapes: tuple,
    tensor_children: tuple,
    device: torch.device | None,
    names: tuple | None,
    level: int | None,
    nested: tuple | None,
    width: int,
    order: tuple | None,
) -> NodeContext:
    """A :class:`NodeContext` from fields the flatten walk computed already.

    The one setup of a context on the flatten path (every field given, none derived:
    ``NodeContext(...)`` derives ``width`` and ``shapes`` for the other callers). Its
    callers (plain tensors, an ``in_dims`` level, the general walk) build the same
    contexts: ``tests/pytree/test_node_setup_agrees.py`` compares them field by field.
    """
    context = _new(NodeContext)
    context.cls = cls
    context.keys = keys
    context.non_tensor = non_tensor
    context.batch_size = batch_size
    context.shapes = shapes
    context.feature_shapes = feature_shapes
    context.tensor_children = tensor_children
    context.device = device
    context.names = names
    context.level = level
    context.nested = nested
    context.width = width
    context.order = order
    context.leaf_shapes = leaf_shapes(context)
    return context


def _inline(
    view: Any,
    cls: type,
    out: list,
    level: int | None,
    cache: dict | None,
    depth: int = 0,
    cache_key: tuple | None = None,
    pair: list | None = None,
) -> NodeContext:
    """Append the leaves of ``view`` and of its nested containers to ``out``.

    ``cache``: :data:`_CONTEXTS`, or ``None`` where contexts must be new; ``depth``:
    how deep ``view`` is nested in the container flattened (part of the cache key).
    ``cache_key`` and ``pair``: the key and its entry, when the caller looked them up.
    """
    data = view._data
    values = data.values()
    batch_size = view._batch_size
    ndim = len(batch_size)
    found = found_nested = None
    if cache is not None:
        if cache_key is None:
            cache_key = (cls, tuple(data), batch_size, view._device, view._names, level, depth)
            pair = cache.get(cache_key)
        if pair is not None:
            found, found_nested = pair
        if found is not None:
            # A level without nested containers seen before: the shape getter of tensors
            # refuses anything else, so one read per value checks its kind and its
            # shape (one size at a time, each freed after its comparison).
            try:
                shapes = found.shapes
                if (
                    tuple(map(_tensor_shape, values)) == shapes  # one C comparison
                    if len(shapes) <= _FEW
                    else all(map(eq, map(_tensor_shape, values), shapes))
                ):
                    out.extend(values)
                    return found
            except TypeError:
                pass
        if found_nested is not None:  # with nested containers: walked against what it was
            start = len(out)
            if _as_before(values, found_nested, out, level, cache, depth):
                return found_nested
            del out[start:]
    # plain tensors only: fewer steps per leaf (dynamo traces the general loop below)
    if _TENSOR_TYPES.issuperset(map(type, values)) and not _dynamo_compiling():
        out.extend(values)
        shapes = tuple([value.shape for value in values])
        width = len(shapes)
        kinds = _ALL_TENSORS.get(width)
        if kinds is None:
            kinds = (
                _ALL_TENSORS.setdefault(width, (True,) * width) if width < 4096 else (True,) * width
            )
        context = _built(
            cls,
            tuple(data),
            _NOTHING,
            batch_size,
            shapes,
            tuple([shape[ndim:] for shape in shapes]) if ndim else shapes,
            kinds,
            view._device,
            view._names,
            level,
            None,
            width,
            None,
        )
        if cache is not None:
            _remember(cache, cache_key, context)
        return context
    if data and _UNSHAPED.issuperset(map(type, values)):  # a level of an in_dims tree
        out.extend(values)
        unshaped = (None,) * len(data)
        return _built(
            cls,
            tuple(data),
            _NOTHING,
            view._batch_size,
            unshaped,
            unshaped,
            (False,) * len(data),
            view._device,
            view._names,
            level,
            None,
            len(data),
            None,
        )
    start = len(out)
    keys = []
    shapes: list[torch.Size | None] = []
    features: list[torch.Size | None] = []
    kinds = []
    nested: list[NodeContext | None] | None = None
    non_tensor: list | None = None
    for key, value in data.items():
        if isinstance(value, _Tensor):
            out.append(value)
            keys.append(key)
            shape = value.shape
            shapes.append(shape)
            features.append(shape[ndim:] if ndim else shape)
            kinds.append(True)
            if nested is not None:
                nested.append(None)
            continue
        kind = type(value)
        if kind not in _UNSHAPED:
            if getattr(kind, "_is_tensor_collection", False):
                if not getattr(kind, "_is_tensordict", False):
                    value = value._to_tensordict_view()
                if nested is None:
                    nested = [None] * len(keys)
                nested.append(_inline(value, kind, out, level, cache, depth + 1))
                keys.append(key)
                shape = value._batch_size
                shapes.append(shape)
                features.append(shape[ndim:] if ndim else shape)
                kinds.append(False)
                continue
            if isinstance(value, NonTensorData):
                if non_tensor is None:
                    non_tensor = []
                non_tensor.append((key, value.data, kind))
                continue
        # an int or None of an in_dims tree, or any object held by a transform
        out.append(value)
        keys.append(key)
        shapes.append(None)
        features.append(None)
        kinds.append(False)
        if nested is not None:
            nested.append(None)
    width = len(out) - start
    if cache is not None and non_tensor is None:
        # looked up above: without non-tensor values, the keys are the same
        context = found if nested is None else found_nested
        if (
            context is not None
            and context.width == width
            and context.tensor_children == tuple(kinds)
            and context.shapes == tuple(shapes)
            and (
                context.nested is None
                if nested is None
                else context.nested is not None and all(map(is_, context.nested, nested))
            )
        ):
            return context
    context = _built(
        cls,
        tuple(keys),
        _NOTHING if non_tensor is None else tuple(non_tensor),
        batch_size,
        tuple(shapes),
        tuple(features),
        tuple(kinds),
        view._device,
        view._names,
        level,
        None if nested is None else tuple(nested),
        width,
        None if non_tensor is None else _order(data, keys, non_tensor),
    )
    if cache is not None and non_tensor is None:
        _remember(cache, cache_key, context)
    return context


def _order(data: dict, keys: list, non_tensor: list) -> tuple | None:
    """The full key order, where it is not the children's keys then the non-tensor ones."""
    order = tuple(data)
    if order == (*keys, *(entry[0] for entry in non_tensor)):
        return None
    return order


def _as_before(
    values: Any, found: NodeContext, out: list, level: Any, cache: dict, depth: int
) -> bool:
    """Append the leaves of a level with nested TensorDicts to ``out`` if ``found`` (its
    cached context, without non-tensor values) still describes it: every tensor of its
    recorded shape, every nested TensorDict of its recorded class and batch size, whose
    own flatten gives the very context recorded. Anything else: ``False`` (the caller
    drops what was appended and takes the general path).
    """
    kinds = found.tensor_children
    for value, inner, shape, is_tensor in zip(values, found.nested, found.shapes, kinds):  # type: ignore[arg-type]
        if inner is None:
            if not is_tensor or type(value) not in _TENSOR_TYPES or value.shape != shape:
                return False
            out.append(value)
        elif (
            type(value) is not inner.cls
            or not getattr(inner.cls, "_is_tensordict", False)
            or value._batch_size != shape
            or _inline(value, inner.cls, out, level, cache, depth + 1) is not inner
        ):
            return False
    return True


def _concrete(context: NodeContext) -> None:
    """Record the example values of symbolic sizes, on every level (``concrete``)."""
    concrete(context)
    _relist(context)


def _relist(context: NodeContext) -> None:
    if context.nested is not None:
        for inner in context.nested:
            if inner is not None:
                _relist(inner)
    context.leaf_shapes = leaf_shapes(context)


def _flatten_view(view: Any, cls: type | None = None) -> tuple[list, NodeContext]:
    """The leaves and context of ``view`` (a TensorDict: the container itself, or the
    one a TensorClass ``cls`` holds)."""
    if cls is None:
        cls = type(view)
    leaves: list
    if _dynamo_compiling():
        leaves = []
        return leaves, _inline(view, cls, leaves, None, None)
    # no dispatch mode at all (one cheap query) means no fake mode either
    if not _modes() or _get_mode(_FAKE) is None:
        level = _current_level()
        data = view._data
        key = (cls, tuple(data), view._batch_size, view._device, view._names, level, 0)
        pair = _CONTEXTS.get(key)
        if pair is not None:
            found = pair[0]
            if found is not None:  # the first check of ``_inline``, without a call
                leaves = list(data.values())
                shapes = found.shapes
                try:
                    if (
                        tuple(map(_tensor_shape, leaves)) == shapes
                        if len(shapes) <= _FEW
                        else all(map(eq, map(_tensor_shape, leaves), shapes))
                    ):
                        return leaves, found
                except TypeError:
                    pass
                pair = [None, pair[1]]  # checked: the general walk would not reuse it
        leaves = []
        return leaves, _inline(view, cls, leaves, level, _CONTEXTS, 0, key, pair)
    leaves = []
    context = _inline(view, cls, leaves, _current_level(), None)
    if symbolic(leaves):
        _concrete(context)  # symbolic sizes are recorded as their example values
    return leaves, context


def flatten_node(container) -> tuple[list, NodeContext]:
    """The leaves (tensors, in key order, nested containers included) and the context."""
    return _flatten_view(container._to_tensordict_view(), type(container))


def _shallow_as_before(children: list, found: NodeContext) -> bool:
    """Whether the children of one level, some of them containers, have the kinds and
    shapes (a container: its batch size) that ``found``, the cached context of the
    level's keys, records."""
    for child, shape, is_tensor in zip(children, found.shapes, found.tensor_children):
        if is_tensor:
            if not isinstance(child, _Tensor) or child.shape != shape:
                return False
        elif not getattr(type(child), "_is_tensor_collection", False) or child.batch_size != shape:
            return False
    return True


def flatten_shallow(container) -> tuple[list, NodeContext]:
    """Children of one level: tensors and nested containers (for key paths and optree).

    As in :func:`_inline`, the context of a level seen before is reused when its
    children have the recorded kinds and shapes (:data:`_SHALLOW`; never while dynamo
    or fake tensors trace, never for a level with non-tensor values).
    """
    view = container._to_tensordict_view()
    data = view._data
    cache_key = None
    if not _dynamo_compiling() and (not _modes() or _get_mode(_FAKE) is None):
        cache_key = (
            type(container),
            tuple(data),
            view._batch_size,
            view._device,
            view._names,
            _current_level(),
        )
        found = _SHALLOW.get(cache_key)
        if found is not None:
            children = list(data.values())
            if found.leaf_shapes is not None:  # tensors only: the first check, without a call
                try:
                    if tuple(map(_tensor_shape, children)) == found.shapes:
                        return children, found
                except TypeError:
                    pass
            elif _shallow_as_before(children, found):
                return children, found
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
            shapes.append(value.shape)
            kinds.append(True)
        elif isinstance(value, NonTensorData):
            non_tensor.append((key, value.data, type(value)))
        else:
            keys.append(key)
            children.append(value)
            shapes.append(value.batch_size if _collection(value) else None)
            kinds.append(False)
    context = NodeContext(
        type(container),
        tuple(keys),
        tuple(non_tensor),
        batch_size,
        tuple(None if shape is None else shape[ndim:] for shape in shapes),
        tuple(kinds),
        view._device,
        view._names,
        _level(),
        shapes=tuple(shapes),
        order=_order(view._data, keys, non_tensor) if non_tensor else None,
    )
    if fake_tracing() and symbolic(children):
        _concrete(context)
    elif cache_key is not None and not non_tensor and None not in shapes:
        # (``None``: an object that is neither a tensor nor a container)
        if len(_SHALLOW) >= _CONTEXTS_MAX:
            _SHALLOW.clear()
        _SHALLOW[cache_key] = context
    return children, context


def flatten_with_keys(container):
    """:func:`flatten_shallow`, each child paired with its ``MappingKey`` (for key paths)."""
    children, context = flatten_shallow(container)
    return [(torch_pytree.MappingKey(k), c) for k, c in zip(context.keys, children)], context


# ---------------------------------------------------------------- serialisation
def _dumpable(context: NodeContext) -> dict:
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
        non_tensor.append([key, value, "stack" if issubclass(kind, NonTensorStack) else "data"])
    return {
        "class": class_name(context.cls),
        "keys": list(context.keys),
        "non_tensor": non_tensor,
        "batch_size": list(context.batch_size),
        "feature_shapes": [None if s is None else list(s) for s in context.feature_shapes],
        "tensor_children": list(context.tensor_children),
        "device": None if context.device is None else str(context.device),
        "names": None if context.names is None else list(context.names),
        "nested": None
        if context.nested is None
        else [None if inner is None else _dumpable(inner) for inner in context.nested],
        "width": context.width,
        "order": None if context.order is None else list(context.order),
    }


def to_dumpable_context(context: NodeContext) -> str:
    """The context as JSON, for ``treespec_dumps`` and ``torch.export``."""
    return json.dumps(_dumpable(context))


def _loaded(raw: dict, cls: type) -> NodeContext:
    nested = raw.get("nested")
    return NodeContext(
        cls,
        tuple(raw["keys"]),
        tuple((k, v, _NON_TENSOR_KINDS[kind]) for k, v, kind in raw["non_tensor"]),
        torch.Size(raw["batch_size"]),
        tuple(None if s is None else torch.Size(s) for s in raw["feature_shapes"]),
        tuple(raw["tensor_children"]),
        None if raw["device"] is None else torch.device(raw["device"]),
        None if raw["names"] is None else tuple(raw["names"]),
        None,
        None
        if nested is None
        else tuple(
            None if inner is None else _loaded(inner, lookup_class(inner["class"]))
            for inner in nested
        ),
        raw.get("width"),
        order=None if raw.get("order") is None else tuple(raw["order"]),
    )


def _context_loader(cls: type):
    def from_dumpable_context(dumped: str) -> NodeContext:
        return _loaded(json.loads(dumped), cls)

    return from_dumpable_context


# ---------------------------------------------------------------- registration
def _optree_flatten(container):
    """optree's form: (children, context, entries), one node per container level."""
    children, context = flatten_shallow(container)
    return children, context, context.keys


def _optree_unflatten(context: NodeContext, children):
    return unflatten(children, context)


def register(cls: type) -> None:
    """Register ``cls`` (TensorDict or a TensorClass subclass) with both pytree libraries."""
    torch_pytree.register_pytree_node(
        cls,
        # a TensorDict is its own view: one call less on every flatten
        _flatten_view if getattr(cls, "_is_tensordict", False) else flatten_node,
        unflatten,
        serialized_type_name=class_name(cls),
        to_dumpable_context=to_dumpable_context,
        from_dumpable_context=_context_loader(cls),
        flatten_with_keys_fn=flatten_with_keys,
    )
    # treespecs written by earlier versions name private module paths: load them too
    # (an entry in torch's name table for our own class, not a change to torch's code)
    for old, new in ALIASES.items():
        if new == class_name(cls):
            torch_pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE.setdefault(old, cls)
    optree.register_pytree_node(
        cls,
        _optree_flatten,
        _optree_unflatten,  # type: ignore[arg-type]
        namespace=NAMESPACE,
    )
