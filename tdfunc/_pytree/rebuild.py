"""Unflatten for the pytree nodes of :mod:`tdfunc._pytree.node`: rebuild the containers
and infer their batch sizes.

Inference, level by level from the innermost, for the children of a level
that have a shape (tensors, and containers that hold a tensor somewhere below
them):

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
   for ``jacrev`` and ``jacfwd``. A nested container whose own batch size
   is such a guess proposes nothing at its parent's step 1 (``jacfwd`` and
   ``hessian`` rebuild nested levels from specs recorded inside their
   ``vmap``, whose batch size is only the number of input elements).

Children without a shape (vmap's ``in_dims`` trees hold ints and ``None``)
are held as they are; with no shaped child at all the recorded batch size is
used. A nested container without tensors takes its parent's batch size plus
its own extra dims. The shape ``(4,)`` of a leaf recorded as ``(4, 4)`` with
batch ``[4]`` is ambiguous; step 1 reads it as "the batch dim was reduced",
as in ``tree_map(lambda x: x.mean(0), params)``.

Speed: transforms unflatten on every call (vmap twice per argument: its
in_dims tree and the batched inputs), so the common cases take one pass: a
level of tensors is recognised by comparing all its shapes at once with the
recorded ones (or with the recorded feature shapes after one common prefix),
an in_dims tree (ints and ``None``) gets the recorded batch sizes without
inference, and the general inference, the leafless containers and the vmap
input check run only where needed.
"""

from __future__ import annotations

import math
from operator import eq as _eq
from typing import TYPE_CHECKING, Any

import torch
from torch._C import _functorch

from .._core.mixin import is_tensor_collection as _collection
from .._core.nontensor import NonTensorData, NonTensorStack, StackInTransform
from .symbolic import _FAKE, _get_mode, symbolic
from .symbolic import rebuild as symbolic_rebuild

if TYPE_CHECKING:
    from .node import NodeContext

_dynamo_compiling = torch.compiler.is_dynamo_compiling  # dynamo cannot run the level queries
_current_level = _functorch.maybe_current_level
_get_bdim = _functorch.maybe_get_bdim  # -1 for a tensor that is not batched
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


# ---------------------------------------------------------------- batch size
def _tensorless(child: Any) -> bool:
    """A container without any tensor below it: its batch size carries no information."""
    return not any(map(_shaped, child._to_tensordict_view()._data.values()))


def _shaped(value: Any) -> bool:
    """A tensor, or a container or tuple (a jacobian's blocks) with a tensor below it."""
    if isinstance(value, _Tensor):
        return True
    if _collection(value):
        return not _tensorless(value)
    if type(value) is tuple or type(value) is list:
        return any(map(_shaped, value))
    return False


def infer_batch_size(children: list, context: NodeContext, guessed=()) -> torch.Size:
    """The batch size that the (transformed) children of one level imply (module docstring).

    ``guessed``: positions of nested containers whose own batch size came from
    step 3 (a guess); they take part in steps 2 and 3 but propose nothing.
    """
    return _infer(children, context, guessed)[0]


def _infer(children: list, context: NodeContext, guessed=()) -> tuple:
    """:func:`infer_batch_size` and whether it is exact (steps 1 and 2) or a guess."""
    shapes = []
    tensors = []  # (shape, feature shape) of the tensors still of their recorded kind
    nested = []  # what the nested containers still of their kind propose (step 1)
    candidate = None
    disagree = False
    replaced = False  # a child came back of another kind, or with a guessed batch size
    for index, (child, feature, was_tensor) in enumerate(
        zip(children, context.feature_shapes, context.tensor_children)
    ):
        if isinstance(child, _Tensor):
            shape = child.shape
            is_tensor = True
        elif _collection(child) and not _tensorless(child):
            shape = child.batch_size
            is_tensor = False
        elif type(child) is tuple or type(child) is list:
            # a jacobian with ``argnums`` a tuple: one block per input
            blocks = _block_shapes(child)
            if blocks:
                shapes += blocks
                replaced = True
            continue
        else:
            continue
        shapes.append(shape)
        if is_tensor is not was_tensor or index in guessed:
            # a jacobian's blocks (tensors that came back as containers, containers
            # whose own batch size is a guess): the longest prefix shared decides
            replaced = True
            continue
        if is_tensor:
            tensors.append((shape, feature))
        split = len(shape) - len(feature)
        if split < 0 or shape[split:] != feature:
            continue
        proposal = shape[:split]
        if not is_tensor:
            nested.append(proposal)
        if candidate is None:
            candidate = proposal
        elif candidate != proposal:
            disagree = True
    if not shapes:
        return context.batch_size, True
    if candidate is not None and not disagree:
        size = len(candidate)
        if all(shape[:size] == candidate for shape in shapes):
            return candidate, True
    trailed = _trailing(tensors, nested, shapes)
    if trailed is not None:
        return trailed, True
    recorded = context.batch_size
    size = len(recorded)
    if not replaced and all(shape[:size] == recorded for shape in shapes):
        return recorded, True
    if not replaced and _basis_moved(tensors, shapes, recorded):
        return recorded[1:], True
    if disagree:
        raise _inconsistent(children, context)
    return _common_prefix(shapes), False


def _trailing(tensors: list, nested: list, shapes: list) -> torch.Size | None:
    """The batch size of a level whose tensors all end in their feature shape and then
    one common trailing shape (a jacobian with respect to a tensor appends the
    input's shape to every output leaf); ``None`` when they do not.

    ``tensors``: ``(shape, feature shape)`` of each tensor of the level;
    ``nested``: the batch sizes its nested containers propose (their own levels
    were rebuilt by the same rule, without the trailing dims). Without a nested
    container, two tensors at least (one alone fits any split); the longest
    batch size that fits them all, and starts every other shape, wins.
    """
    if not tensors or (len(tensors) < 2 and not nested):
        return None
    first, first_feature = tensors[0]
    if nested:
        if any(proposal != nested[0] for proposal in nested):
            return None
        sizes: Any = (len(nested[0]),)
    else:
        sizes = range(len(first) - len(first_feature) - 1, -1, -1)
    for size in sizes:
        end = size + len(first_feature)
        if end >= len(first) or first[size:end] != first_feature:
            continue
        prefix, tail = first[:size], first[end:]
        if nested and prefix != nested[0]:
            continue
        if all(shape == prefix + feature + tail for shape, feature in tensors) and all(
            shape[:size] == prefix for shape in shapes
        ):
            return prefix
    return None


def _basis_moved(tensors: list, shapes: list, recorded: torch.Size) -> bool:
    """Whether the first recorded batch dim moved behind every leaf's feature shape.

    ``jacfwd`` records its output's spec outside its ``vmap`` over the input
    elements (batch size ``[n, *batch]``), then moves that dim to the end of
    every leaf and unflattens it into the input's shape: the leaves are then
    ``batch + feature + input shape``, with ``n`` elements in the input shape.
    A level without tensors needs only its nested containers to start with
    ``batch`` (their own levels were rebuilt by this rule).
    """
    if not recorded:
        return False
    count, rest = recorded[0], recorded[1:]
    size = len(rest)
    if not all(shape[:size] == rest for shape in shapes):
        return False
    for shape, feature in tensors:
        end = size + len(feature)
        if shape[size:end] != feature or math.prod(shape[end:]) != count:
            return False
    return True


def _block_shapes(blocks: Any) -> list:
    """The shapes of the tensors and (tensorful) containers in a tuple of jacobian blocks."""
    found = []
    for block in blocks:
        if isinstance(block, _Tensor):
            found.append(block.shape)
        elif _collection(block):
            if not _tensorless(block):
                found.append(block.batch_size)
        elif type(block) is tuple or type(block) is list:
            found += _block_shapes(block)
    return found


def _inconsistent(children: list, context: NodeContext) -> ValueError:
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
        f"sub-container with batch_size=[] instead. A negative out_dims counts from the "
        f"end of each leaf, not of the batch dims: give the output dim as a non-negative "
        f"number."
    )


def _common_prefix(shapes: list) -> torch.Size:
    prefix = []
    for dims in zip(*shapes):
        if any(d != dims[0] for d in dims):
            break
        prefix.append(dims[0])
    return torch.Size(prefix)


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
        if context.level is not None and _functorch.maybe_get_level(child) <= context.level:
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
                if isinstance(child, _Tensor) and _functorch.maybe_get_level(child) == level:
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
    # an in_dims tree (ints and None) is recognised by its first child
    if children and type(children[0]) in _UNSHAPED and _UNSHAPED.issuperset(map(type, children)):
        return _recorded(children, 0, context)  # nothing to infer from
    if _dynamo_compiling():
        return _rebuild(children, 0, context, False, True)[0]
    if _get_mode(_FAKE) is not None and symbolic(children):  # torch.export with dynamic dims
        return symbolic_rebuild(children, 0, context)[0]
    level = _current_level()
    # only a deeper level than at flatten time can be vmap's input boundary
    check = level is not None and (context.level is None or level > context.level)
    return _rebuild(children, 0, context, check, False)[0]


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


def _rebuild(leaves: list, start: int, context: NodeContext, check: bool, traced: bool) -> tuple:
    """The container of ``context``'s level from ``leaves[start:]``.

    Returns ``(container, holds a tensor, batch size, exact)``; ``exact`` is
    False when the batch size is a guess (step 3 of the inference). A level of tensors
    that all end in their feature shapes after one common prefix (step 1 of
    the inference) is recognised by comparing all shapes at once; see
    :func:`_rebuild_nested` for levels with nested containers and
    :func:`_rebuild_general` for anything else. ``traced``: dynamo traces this call.
    """
    if context.nested is not None:
        return _rebuild_nested(leaves, start, context, check, traced)
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
                if shapes == context.shapes:
                    batch_size = recorded
        else:
            # The shape getter of tensors refuses anything else (a jacobian's block, an
            # object held by a transform), which the general rules handle: one read per
            # child, no separate type check, one size at a time in the common case.
            try:
                if len(children) <= _FEW:
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
    leaves: list, start: int, context: NodeContext, check: bool, traced: bool
) -> tuple:
    """:func:`_rebuild` for a level with nested containers: step 1 of the inference
    as the children are rebuilt, when they are tensors of their recorded kind,
    nested containers, or values without a shape."""
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
                shape = child.shape
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
            child, child_tensorful, shape, exact = _rebuild(leaves, start, inner, check, traced)
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
        if shape == full:
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
    if batch_size != context.batch_size:
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
