"""Batch-size inference for the containers rebuilt by :mod:`tdfunc._pytree.rebuild`.

Level by level from the innermost, for the children of a level that have a
shape (tensors, containers that hold a tensor somewhere below them, and the
tuples of blocks of a jacobian with several ``argnums``):

1. A child still of the kind it was at flatten time (tensor or container)
   whose shape ends in its recorded feature shape proposes the dims before
   it. If all proposals agree and every child starts with that prefix, it is
   the batch size. This is exact inside and outside ``vmap`` (any
   ``in_dims``/``out_dims`` among the batch dims) and for jacobians, also when
   a feature size equals a batch size.
2. Otherwise, when every tensor ends in its feature shape and then one common
   trailing shape (a jacobian with respect to a tensor appends the input's
   shape to every output leaf), the dims before them (the nested containers,
   rebuilt by the same rule, must agree).
3. Otherwise the recorded batch size, if every child still starts with it
   (a ``tree_map`` that reduced a feature dim), or the recorded batch size
   without its first dim when that dim moved behind every leaf's feature
   shape (``jacfwd`` records its output's spec with the dim of its ``vmap``
   over the input elements in front, then moves it to the end).
4. Otherwise the longest prefix the children share, or an error when the
   proposals of step 1 contradict each other. This is also the rule for a
   jacobian whose tensor children come back as containers or tuples (one
   block per input): its batch size is the longest prefix its blocks share,
   the same for ``jacrev`` and ``jacfwd``. A nested container whose own
   batch size is such a guess proposes nothing at its parent's step 1 and
   keeps the parent from taking its recorded batch size (step 3).

Children without a shape (vmap's ``in_dims`` trees hold ints and ``None``)
are held as they are; with no shaped child at all the recorded batch size is
used. The shape ``(4,)`` of a leaf recorded as ``(4, 4)`` with batch ``[4]``
is ambiguous; step 1 reads it as "the batch dim was reduced", as in
``tree_map(lambda x: x.mean(0), params)``.

May import: ``tdfunc._core`` only.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from .._core.helpers.mixin import is_tensor_collection as _collection

if TYPE_CHECKING:
    from .node import NodeContext

_Tensor = torch.Tensor


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
