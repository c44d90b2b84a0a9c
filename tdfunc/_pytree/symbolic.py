"""Containers in traced programs whose sizes are symbolic (``torch.export`` with dynamic dims).

While ``torch.export`` traces with fake tensors, a dim marked dynamic is a
``SymInt``. Two things in the pytree node must not touch such a size:

- unflatten infers batch sizes by comparing the leaves' shapes with the
  recorded ones; comparing a symbolic size with the recorded example size
  (``s0 == 4``) adds a guard that specialises the dim to the example. In a
  trace the leaves come back in the recorded structure (no vmap moved dims), so
  the batch size of each level is read from the rank of its first child
  instead: the dims before the child's recorded feature shape;
- flatten records sizes in the spec context, which is compared, hashed and
  written to JSON (``torch.export.save``): symbolic sizes are recorded as
  their example values (the spec then reads like one of the runs; unflatten of
  real tensors infers their sizes from the leaves).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .node import NodeContext

_Tensor = torch.Tensor


def symbolic(values) -> bool:
    """Whether a tensor among ``values`` has a symbolic size."""
    for value in values:
        if isinstance(value, _Tensor):
            for size in value.shape:
                if type(size) is not int:
                    return True
    return False


def _hinted(size: Any) -> Any:
    if size is None:
        return None
    if all(type(d) is int for d in size):
        return size
    hint = _size_hint()
    return torch.Size([d if type(d) is int else hint(d) for d in size])


def _size_hint() -> Any:
    """torch's example value for a symbolic size (-1 where it has none)."""
    # imported here: the module costs about 0.3 s of `import tdfunc` and only symbolic
    # sizes (torch.export with dynamic shapes) ever reach this line
    from torch.fx.experimental import symbolic_shapes

    # optimization_hint from torch 2.13; before it, hint_int (which torch 2.11 keeps
    # with a FutureWarning)
    for name in ("optimization_hint", "hint_int"):
        hint = getattr(symbolic_shapes, name, None)
        if hint is not None:
            break
    return lambda size: hint(size, fallback=-1)


def concrete(context: NodeContext) -> NodeContext:
    """Replace the symbolic sizes recorded in ``context`` (and its nested levels) in place."""
    context.batch_size = _hinted(context.batch_size)
    context.shapes = tuple(_hinted(s) for s in context.shapes)
    context.feature_shapes = tuple(_hinted(s) for s in context.feature_shapes)
    if context.nested is not None:
        for inner in context.nested:
            if inner is not None:
                concrete(inner)
    return context


def rebuild(leaves: list, start: int, context: NodeContext) -> tuple:
    """The container of ``context``'s level from ``leaves[start:]`` and the next position."""
    nested = context.nested
    data = {}
    batch_size = None
    for index, key in enumerate(context.keys):
        inner = None if nested is None else nested[index]
        feature = context.feature_shapes[index]
        if inner is None:
            child = leaves[start]
            start += 1
            shape = child.shape if isinstance(child, _Tensor) else None
        else:
            child, start = rebuild(leaves, start, inner)
            shape = child.batch_size if inner.width else None  # leafless: no information
        if batch_size is None and shape is not None and feature is not None:
            split = len(shape) - len(feature)
            if split >= 0:
                batch_size = torch.Size(shape[:split])
        data[key] = child
    recorded = context.batch_size
    if batch_size is None:
        batch_size = recorded
    for key, value, kind in context.non_tensor:
        data[key] = kind._make(value, batch_size, context.device)
    if context.order is not None:
        data = {key: data[key] for key in context.order}
    names = context.names if len(batch_size) == len(recorded) else None
    container = context.cls._from_pytree(data, batch_size, context.device, names)
    return container, start
