"""Unflatten for the pytree nodes of :mod:`tdfunc._pytree.node`: rebuild the containers
and infer their batch sizes.

The batch size of each level is inferred from the leaves
(:mod:`tdfunc._pytree.infer` has the rules). A nested container without
tensors takes its parent's batch size plus its own extra dims.

Speed: transforms unflatten on every call (vmap twice per argument: its
in_dims tree and the batched inputs), so the common cases take one pass: a
level of tensors is recognised by comparing all its shapes at once with the
recorded ones (or with the recorded feature shapes after one common prefix),
an in_dims tree (ints and ``None``) gets the recorded batch sizes without
inference, and the general inference, the leafless containers and the vmap
input check run only where needed.
"""

from __future__ import annotations

from operator import eq as _eq
from typing import TYPE_CHECKING, Any

import torch

from .._core.helpers.mixin import is_tensor_collection as _collection
from .._core.helpers.nontensor import NonTensorData, NonTensorStack, StackInTransform
from .._core.helpers.tracing import FAKE as _FAKE
from .._core.helpers.tracing import batch_dim_of as _get_bdim
from .._core.helpers.tracing import dispatch_modes as _modes
from .._core.helpers.tracing import (
    dynamo_compiling as _dynamo_compiling,  # dynamo cannot run the level queries
)
from .._core.helpers.tracing import functorch_level as _current_level
from .._core.helpers.tracing import get_dispatch_mode as _get_mode
from .._core.helpers.tracing import tensor_level as _tensor_level
from .infer import _infer, _shaped, _tensorless
from .symbolic import rebuild as symbolic_rebuild
from .symbolic import symbolic

if TYPE_CHECKING:
    from .node import NodeContext

_Tensor = torch.Tensor
_tensor_shape = _Tensor.shape.__get__  # type: ignore[attr-defined]  # TypeError for non-tensors
# Up to this many children a level's sizes are read into one tuple and compared at
# once; wider levels compare one size at a time (no sizes kept alive to count towards
# a garbage collection).
_FEW = 256
_HOLE = object()  # stands for a leafless nested container until its batch size is known
_SCALAR = torch.Size([])
_UNSHAPED = frozenset({int, bool, type(None)})  # the leaves of vmap's in_dims trees
# a level of children of these classes takes the one-pass path
_TENSOR_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})


def _check_vmap_input(children: list, context: NodeContext) -> None:
    """Refuse a vmap that maps a feature dim of a leaf instead of a batch dim.

    At vmap's input boundary the leaves were flattened outside the transform and
    come back as BatchedTensors of a deeper level, wrapping the very tensors
    that were flattened; their physical mapped dim must be one of the batch
    dims. Anywhere else (flatten and unflatten at the same level, e.g. a
    tree_map inside vmap, or a spec recorded outside rebuilt from tensors
    that already carry the batch dim) there is nothing to check.
    """
    ndim = len(context.batch_size)
    for key, child, feature in zip(context.keys, children, context.feature_shapes):
        if not isinstance(child, _Tensor):
            continue
        bdim = _get_bdim(child)
        if bdim < ndim:  # not batched (-1), or mapped over a batch dim
            continue
        if context.level is not None and _tensor_level(child) <= context.level:
            return
        if feature is None or child.dim() + 1 != ndim + len(feature):
            continue  # not the tensor that was flattened: it has the batch dim already
        name = context.cls.__name__
        dims = "it has none" if not ndim else f"they are dims 0..{ndim - 1}"
        raise ValueError(
            f"vmap: a {name} with batch_size={list(context.batch_size)} was mapped over "
            f"dim {bdim} (at key {key!r}), which is not one of its batch dims ({dims}). "
            f"vmap can only map a {name} over its batch dims: give it a batch dim first, "
            f"e.g. {name}(..., batch_size=[n]), or map another dim."
        )


# ---------------------------------------------------------------- names
def _names_after(context: NodeContext, batch_size: torch.Size, children) -> tuple | None:
    """The dim names of a level whose batch size changed from the recorded one.

    Dims that are still there keep their names, new dims have none (as
    tensordict does under ``vmap``). At vmap's input boundary the mapped dim is
    read from the leaves; anywhere else the recorded batch size must sit in
    the new one (or the reverse) in exactly one way, or no names are kept. With
    as many dims as recorded, the names stay if only unnamed dims changed size.
    """
    names: tuple = context.names  # type: ignore[assignment]  # not None here
    recorded = context.batch_size
    if len(batch_size) + 1 == len(recorded) and not _dynamo_compiling():
        level = _current_level()
        if level is not None and (context.level is None or level > context.level):
            for child in children:
                if isinstance(child, _Tensor) and _tensor_level(child) == level:
                    dim = _get_bdim(child)
                    left = recorded[:dim] + recorded[dim + 1 :]
                    if 0 <= dim < len(recorded) and left == batch_size:
                        return names[:dim] + names[dim + 1 :]
                    break
    if len(batch_size) == len(recorded):
        # the same dims, some of other sizes (vmap with a chunk_size concatenates its
        # chunks, whose mapped dim is unnamed): names stay where the sizes changed only
        # on unnamed dims
        changed = [name for name, old, new in zip(names, recorded, batch_size) if old != new]
        return names if not any(changed) else None
    if len(batch_size) > len(recorded):
        kept = _embedding(recorded, batch_size)
        if kept is None:
            return None
        out: list = [None] * len(batch_size)
        for name, position in zip(names, kept):
            out[position] = name
        return tuple(out)
    kept = _embedding(batch_size, recorded)
    if kept is None:
        return None
    return tuple(names[position] for position in kept)


def _embedding(short: torch.Size, long: torch.Size) -> tuple | None:
    """The positions of ``long`` that ``short`` occupies, if it fits in exactly one way."""
    found: list = []

    def place(i: int, j: int, taken: tuple) -> None:
        if len(found) > 1:
            return
        if i == len(short):
            found.append(taken)
            return
        for position in range(j, len(long) - (len(short) - i) + 1):
            if long[position] == short[i]:
                place(i + 1, position + 1, taken + (position,))

    place(0, 0, ())
    return found[0] if len(found) == 1 else None


def _non_tensor(kind: type, value: Any, batch_size: torch.Size, context: NodeContext) -> Any:
    """A non-tensor entry of a rebuilt level.

    A stack (one value per element) rebuilt inside a transform deeper than the one it
    was flattened in, with a batch size it no longer has, cannot give any element's
    value: it becomes a :class:`StackInTransform` (carried, refuses reads). Such a
    stack is a ``NonTensorStack`` again where the transform gives the batch dims back
    (its output: a longer batch size that its values fill exactly).
    """
    if issubclass(kind, NonTensorStack) and not _dynamo_compiling():
        now, then = _current_level(), context.level
        entering = now is not None and (then is None or now > then)
        if entering and batch_size != context.batch_size:
            kind = StackInTransform
        elif (
            kind is StackInTransform
            and len(batch_size) > len(context.batch_size)
            and _fills(value, batch_size)
        ):
            kind = NonTensorStack
    return kind._make(value, batch_size, context.device)


def _fills(values: Any, shape: torch.Size) -> bool:
    """Whether nested lists ``values`` have the leading dims ``shape``."""
    for size in shape:
        if not isinstance(values, list) or len(values) != size:
            return False
        if not size:
            return True
        values = values[0]
    return True


# ---------------------------------------------------------------- unflatten
def unflatten(children, context: NodeContext):
    """Rebuild a container; children that are not tensors are held without validation."""
    if type(children) is not list:
        children = list(children)
    shapes = context.leaf_shapes
    # Leaves (or, for a level whose nested containers came back as children, children)
    # that all have their recorded kinds and shapes: the inference concludes the
    # recorded batch sizes at any functorch level (vmap's input check refuses only a
    # leaf with one dim less than recorded), so they are rebuilt without it.
    if (
        children
        and type(children[0]) not in _UNSHAPED
        and not _dynamo_compiling()
        and (not _modes() or _get_mode(_FAKE) is None)  # no mode at all: not fake
    ):
        if shapes is None:  # nested containers as children (optree, key paths)
            if context.nested is None and _as_recorded(children, context):
                return _assemble(children, context, context.batch_size, None, None)
        elif type(children[0]) in _TENSOR_TYPES:
            # the shape getter refuses anything but a tensor: one read per leaf checks
            # its kind and its shape
            known = None
            try:
                if len(shapes) <= _FEW:
                    known = tuple(map(_tensor_shape, children))
                    same = known == shapes
                else:
                    same = all(map(_eq, map(_tensor_shape, children), shapes))
            except TypeError:
                same = False
            if same:
                if context.nested is not None or context.non_tensor or context.order:
                    return _unchanged(children, 0, context)[0]
                # ``_unchanged`` of a level of tensors only, without a call
                device = context.device
                if device is not None:
                    device = children[0].device
                data = dict(zip(context.keys, children))
                return context.cls._from_pytree(data, context.batch_size, device, context.names)
            level = _current_level()
            # only a deeper level than at flatten time can be vmap's input boundary
            check = level is not None and (context.level is None or level > context.level)
            return _rebuild(children, 0, context, check, False, known)[0]
    # an in_dims tree (ints and None) is recognised by its first child
    if children and type(children[0]) in _UNSHAPED and _UNSHAPED.issuperset(map(type, children)):
        return _recorded(children, 0, context)  # nothing to infer from
    if _dynamo_compiling():
        return _rebuild(children, 0, context, False, True)[0]
    # torch.export with dynamic dims: fake tensors, under the fake mode or (strict
    # export's input extraction) under no mode at all
    if (
        _get_mode(_FAKE) is not None or (children and type(children[0]) not in _TENSOR_TYPES)
    ) and symbolic(children):
        return symbolic_rebuild(children, 0, context)[0]
    level = _current_level()
    # only a deeper level than at flatten time can be vmap's input boundary
    check = level is not None and (context.level is None or level > context.level)
    return _rebuild(children, 0, context, check, False)[0]


def _as_recorded(children: list, context: NodeContext) -> bool:
    """Whether every child of a level whose nested containers came back as children
    (optree's nodes, torch's key paths) has its recorded kind and shape (a container:
    its recorded batch size). The inference then concludes the recorded batch size;
    ``tests/pytree/test_unchanged_leaves.py`` compares with it.
    """
    if len(children) != context.width:
        return False
    for child, shape, is_tensor in zip(children, context.shapes, context.tensor_children):
        if is_tensor:
            if type(child) not in _TENSOR_TYPES or child.shape != shape:
                return False
        elif (
            shape is None
            or not getattr(type(child), "_is_tensor_collection", False)
            or child.batch_size != shape
        ):
            return False
    return True


def _unchanged(leaves: list, start: int, context: NodeContext) -> tuple:
    """The container of ``context``'s level when every leaf below it has its recorded
    shape: every level keeps its recorded batch size and names, as the inference
    concludes (step 1), and takes its device from its first tensor, as
    :func:`_rebuild` and :func:`_assemble` do. Returns the container and the next
    position. ``tests/pytree/test_unchanged_leaves.py`` compares it with the
    inference's path (:func:`_rebuild`) over a corpus.
    """
    nested = context.nested
    first = None  # the first tensor of this level (not of a nested one)
    if nested is None:
        end = start + context.width
        children = leaves if not start and end == len(leaves) else leaves[start:end]
        data = dict(zip(context.keys, children))
        if children:
            first = children[0]
    else:
        data = {}
        for key, inner in zip(context.keys, nested):
            if inner is None:
                child = leaves[start]
                start += 1
                if first is None:
                    first = child
                data[key] = child
            else:
                data[key], start = _unchanged(leaves, start, inner)
        end = start
    batch_size = context.batch_size
    for key, value, kind in context.non_tensor:
        data[key] = _non_tensor(kind, value, batch_size, context)
    if context.order is not None:
        data = {key: data[key] for key in context.order}
    device = context.device
    if device is not None and first is not None:
        device = first.device
    return context.cls._from_pytree(data, batch_size, device, context.names), end


def _recorded(leaves: list, start: int, context: NodeContext) -> Any:
    """Every level with its recorded batch size (what inference gives without shapes)."""
    nested = context.nested
    if nested is None:
        data = dict(zip(context.keys, leaves[start:] if start else leaves))
    else:
        data = {}
        for key, inner in zip(context.keys, nested):
            if inner is None:
                data[key] = leaves[start]
                start += 1
            else:
                data[key] = _recorded(leaves, start, inner)
                start += inner.width
    batch_size = context.batch_size
    for key, value, kind in context.non_tensor:
        data[key] = _non_tensor(kind, value, batch_size, context)
    if context.order is not None:
        data = {key: data[key] for key in context.order}
    return context.cls._from_pytree(data, batch_size, context.device, context.names)


def _rebuild(
    leaves: list,
    start: int,
    context: NodeContext,
    check: bool,
    traced: bool,
    known: tuple | None = None,
) -> tuple:
    """The container of ``context``'s level from ``leaves[start:]``.

    Returns ``(container, holds a tensor, batch size, exact)``; ``exact`` is
    False when the batch size is a guess (step 3 of the inference). A level of tensors
    that all end in their feature shapes after one common prefix (step 1 of
    the inference) is recognised by comparing all shapes at once; see
    :func:`_rebuild_nested` for levels with nested containers and
    :func:`_rebuild_general` for anything else. ``traced``: dynamo traces this call.
    ``known``: the shapes of all of ``leaves``, already read by the caller.
    """
    if context.nested is not None:
        return _rebuild_nested(leaves, start, context, check, traced, known)
    end = start + context.width
    children = leaves if not start and end == len(leaves) else leaves[start:end]
    if False not in context.tensor_children:
        recorded = context.batch_size
        features = context.feature_shapes
        batch_size = None
        shapes = None
        if traced:  # dynamo's form: plain tensors only, sizes compared as one tuple
            if _TENSOR_TYPES.issuperset(map(type, children)):
                shapes = tuple([child.shape for child in children])
                # no comparison with the recorded shapes: a symbolic size (a dynamic
                # dim) compared with its example value would be pinned to it; the
                # feature shapes below give the same batch size
        else:
            # The shape getter of tensors refuses anything else (a jacobian's block, an
            # object held by a transform), which the general rules handle: one read per
            # child, no separate type check, one size at a time in the common case.
            try:
                if known is not None:  # read by unflatten
                    shapes = known if children is leaves else known[start:end]
                    if shapes == context.shapes:
                        batch_size = recorded
                elif len(children) <= _FEW:
                    shapes = tuple(map(_tensor_shape, children))
                    if shapes == context.shapes:
                        batch_size = recorded  # unchanged (grad, a shape-preserving tree_map)
                elif all(map(_eq, map(_tensor_shape, children), context.shapes)):
                    batch_size = recorded
                else:
                    shapes = tuple(map(_tensor_shape, children))
            except TypeError:
                return _rebuild_general(children, context, check, None, None, ())
        if check and children and max(map(_get_bdim, children)) >= len(recorded):
            _check_vmap_input(children, context)  # perhaps mapped over a feature dim
        if shapes is not None and batch_size is None:
            if shapes == features:  # every batch dim mapped away (inside vmap)
                batch_size = _SCALAR
            elif shapes:  # the prefix of the first child, if every child has it
                split = len(shapes[0]) - len(features[0])
                if split >= 0:
                    candidate = shapes[0][:split]
                    if shapes == tuple([candidate + feature for feature in features]):
                        batch_size = candidate
        if batch_size is not None:
            names = context.names
            if names is not None and batch_size != recorded:
                names = _names_after(context, batch_size, children)
            device = context.device
            if device is not None and children:
                device = children[0].device
            data = dict(zip(context.keys, children))
            for key, value, kind in context.non_tensor:
                data[key] = _non_tensor(kind, value, batch_size, context)
            if context.order is not None:
                data = {key: data[key] for key in context.order}
            container = context.cls._from_pytree(data, batch_size, device, names)
            return container, bool(children), batch_size, True
        check = False  # checked above
    return _rebuild_general(children, context, check, None, None, ())


def _rebuild_nested(
    leaves: list,
    start: int,
    context: NodeContext,
    check: bool,
    traced: bool,
    known: tuple | None = None,
) -> tuple:
    """:func:`_rebuild` for a level with nested containers: step 1 of the inference
    as the children are rebuilt, when they are tensors of their recorded kind,
    nested containers, or values without a shape. ``known``: as for :func:`_rebuild`."""
    recorded = context.batch_size
    shapes, features, kinds = context.shapes, context.feature_shapes, context.tensor_children
    children: list = []
    holes = None  # positions of leafless nested containers, built at the end
    hollow = []  # positions of children that may be containers without tensors
    guessed: list = []  # positions of nested containers whose batch size is a guess
    tensorful = False
    candidate = None
    fast = True
    checked: bool | None = not check  # None: a child may map a feature dim
    nested: tuple = context.nested  # type: ignore[assignment]  # not None here
    for index, inner in enumerate(nested):
        if inner is None:
            child = leaves[start]
            start += 1
            children.append(child)
            if isinstance(child, _Tensor) and kinds[index]:
                tensorful = True
                shape = child.shape if known is None else known[start - 1]
                if not checked and _get_bdim(child) >= len(recorded):
                    checked = None  # check every child once they are all here
            elif type(child) in _UNSHAPED:
                continue
            else:  # a container or any other object where a leaf was
                fast = False
                if _collection(child):
                    hollow.append(index)
                continue
        elif inner.width:
            child, child_tensorful, shape, exact = _rebuild(
                leaves, start, inner, check, traced, known
            )
            start += inner.width
            children.append(child)
            if not child_tensorful:
                hollow.append(index)  # its batch size carries no information
                continue
            tensorful = True
            if not exact:  # a guessed batch size proposes nothing (the inference's step 3)
                guessed.append(index)
                fast = False
                continue
        else:  # no leaves below: built once this level's batch size is known
            children.append(_HOLE)
            if holes is None:
                holes = []
            holes.append(index)
            continue
        if not fast:
            continue
        full, feature = shapes[index], features[index]
        if not traced and shape == full:  # (traced: see _rebuild)
            proposal = recorded
        elif len(shape) == len(feature):
            if shape != feature:
                fast = False
                continue
            proposal = _SCALAR
        else:
            split = len(shape) - len(feature)
            if split < 0 or shape[split:] != feature:
                fast = False
                continue
            proposal = shape[:split]
        if candidate is None:
            candidate = proposal
        elif candidate != proposal:
            fast = False
    if checked is None:
        _check_vmap_input(children, context)
    if not fast:
        return _rebuild_general(children, context, checked is False, holes, hollow, guessed)
    batch_size = recorded if candidate is None else candidate
    container = _assemble(children, context, batch_size, holes, hollow)
    return container, tensorful, batch_size, True


def _rebuild_general(
    children: list, context: NodeContext, check: bool, holes, hollow, guessed
) -> tuple:
    """:func:`_rebuild` through the whole inference (:func:`infer_batch_size`)."""
    if check:
        _check_vmap_input(children, context)
    batch_size, exact = _infer(children, context, guessed)
    tensorful = any(map(_shaped, children))
    container = _assemble(children, context, batch_size, holes, hollow)
    return container, tensorful, batch_size, exact


def _assemble(children: list, context: NodeContext, batch_size: torch.Size, holes, hollow) -> Any:
    """The container of one level once its batch size is known.

    ``holes``: positions of leafless nested containers, to build here;
    ``hollow``: positions of children that may be containers without tensors
    (``None``: any child).
    """
    data = dict(zip(context.keys, children))
    names = context.names
    # traced: a symbolic batch size is not compared with its example value (see _rebuild)
    if _dynamo_compiling() or batch_size != context.batch_size:
        if names is not None:
            names = _names_after(context, batch_size, children)
        if hollow is None:
            hollow = [i for i, child in enumerate(children) if _collection(child)]
        if hollow:
            _rebatch_tensorless(data, children, context, batch_size, hollow)
    if holes is not None:
        keys, features = context.keys, context.feature_shapes
        inners: tuple = context.nested  # type: ignore[assignment]  # holes are nested
        for index in holes:
            data[keys[index]] = _leafless(inners[index], batch_size + features[index])
    for key, value, kind in context.non_tensor:
        data[key] = _non_tensor(kind, value, batch_size, context)
    if context.order is not None:
        data = {key: data[key] for key in context.order}
    device = context.device
    if device is not None:
        for child in children:
            if isinstance(child, _Tensor):
                device = child.device
                break
    return context.cls._from_pytree(data, batch_size, device, names)


def _leafless(context: NodeContext, batch_size: torch.Size) -> Any:
    """A nested container that had no leaves, rebuilt with ``batch_size``."""
    data = {}
    if context.nested is not None:
        for key, inner, feature in zip(context.keys, context.nested, context.feature_shapes):
            data[key] = _leafless(inner, batch_size + feature)
    for key, value, kind in context.non_tensor:
        data[key] = _non_tensor(kind, value, batch_size, context)
    if context.order is not None:
        data = {key: data[key] for key in context.order}
    names = context.names
    if names is not None and batch_size != context.batch_size:
        names = _names_after(context, batch_size, ())
    return context.cls._from_pytree(data, batch_size, context.device, names)


def _rebatch_tensorless(
    data: dict, children: list, context: NodeContext, batch_size, where
) -> None:
    for index in where:
        key, child, feature = context.keys[index], children[index], context.feature_shapes[index]
        # a container without tensors could only guess its batch size when it was built
        if (
            feature is not None
            and getattr(type(child), "_is_tensor_collection", False)
            and child.batch_size != batch_size + feature
            and _tensorless(child)
        ):
            data[key] = _rebatched(child, batch_size + feature)


def _rebatched(child: Any, batch_size: torch.Size) -> Any:
    """A copy of a tensorless container with ``batch_size`` (nested ones follow)."""
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
