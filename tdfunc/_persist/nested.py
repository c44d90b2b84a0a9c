"""Nested tensors in one data file: their components back to back, and their shapes.

A nested tensor (strided or jagged) is saved as the concatenation of its components,
each contiguous, in one ``.memmap`` file; ``meta.json`` records the layout and the
shape of every component. Loading maps the file once and builds the nested tensor as
a view of it, so writes into the loaded tensor reach the file::

    "x": {"kind": "nested", "file": "x.memmap", "dtype": "float32",
          "layout": "strided", "sizes": [[3, 4, 5], [3, 6, 5]]}

A jagged tensor is stored when its ragged dim is the one after the components (the
usual ``nested_tensor(..., layout=torch.jagged)``) and it has no holes.

Example:
    >>> nt = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    >>> layout, sizes = nested_parts(nt, "save", "x")
    >>> flat = nested_flat(nt)
    >>> layout, sizes, flat.tolist()
    ('strided', [[2], [3]], [1.0, 1.0, 1.0, 1.0, 1.0])
    >>> nested_view(flat, layout, sizes).unbind()[1].tolist()
    [1.0, 1.0, 1.0]
"""

from __future__ import annotations

import math

import torch

LAYOUTS = ("strided", "jagged")


def nested_numel(sizes: list) -> int:
    """How many elements the components of ``sizes`` hold together."""
    return sum(math.prod(size) for size in sizes)


def nested_parts(value: torch.Tensor, api: str, key) -> tuple[str, list]:
    """``(layout, the shapes of the components)``, or a clear error if not storable."""
    layout = "jagged" if value.layout is torch.jagged else "strided"
    if layout == "jagged" and (value._ragged_idx != 1 or value._lengths is not None):
        raise TypeError(
            f"{api}: cannot save the jagged tensor at key {key!r}: only a jagged tensor "
            f"whose ragged dim follows the components, without holes, is stored; rebuild "
            f"it with torch.nested.nested_tensor(list(t.unbind()), layout=torch.jagged)."
        )
    sizes = [list(component.shape) for component in value.unbind(0)]
    if not sizes:
        raise ValueError(f"{api}: cannot save the nested tensor at key {key!r}: it is empty.")
    return layout, sizes


def shape_sizes(shape, api: str) -> list | None:
    """The component shapes when ``shape`` describes a nested tensor, else ``None``.

    As in tensordict, a ``MemoryMappedTensor`` constructor given a 2-D integer tensor
    as its shape (one row per component, ``t._nested_tensor_size()``) builds a nested
    tensor; any other shape is an ordinary one.
    """
    if not isinstance(shape, torch.Tensor):
        return None
    if shape.dim() != 2 or shape.is_floating_point() or shape.is_complex() or not len(shape):
        raise TypeError(
            f"MemoryMappedTensor.{api}: a tensor shape describes a nested tensor: a 2-D "
            f"integer tensor with one row per component (e.g. torch.tensor([[2, 3], [2, 4]])), "
            f"got a {shape.dtype} tensor of shape {list(shape.shape)}."
        )
    sizes = shape.tolist()
    if any(dim < 0 for size in sizes for dim in size):
        raise ValueError(
            f"MemoryMappedTensor.{api}: the component shapes {sizes} have a negative dim."
        )
    return sizes


def component_sizes(value: torch.Tensor, shape, api: str) -> list:
    """The component shapes of the nested tensor ``value`` (to copy it whole: ``shape``, if
    given, must name the same shapes; a nested tensor is not broadcast)."""
    sizes = [list(component.shape) for component in value.unbind(0)]
    if not sizes:
        raise ValueError(f"MemoryMappedTensor.{api}: the nested tensor has no components.")
    wanted = shape_sizes(shape, api) if isinstance(shape, torch.Tensor) else shape
    if wanted is not None and wanted != sizes:
        raise ValueError(
            f"MemoryMappedTensor.{api}: shape={wanted} differs from the nested tensor's "
            f"component shapes {sizes}; a nested tensor is copied as it is."
        )
    return sizes


def like_shape(value: torch.Tensor):
    """The shape to build a tensor like ``value``: its ``shape``, or for a nested tensor
    the 2-D tensor of its component shapes (what :func:`shape_sizes` reads)."""
    if value.is_nested:
        return torch.tensor([list(component.shape) for component in value.unbind(0)])
    return value.shape


def nested_flat(value: torch.Tensor) -> torch.Tensor:
    """The components' values back to back, as one flat tensor (a copy)."""
    return torch.cat([component.detach().reshape(-1) for component in value.unbind(0)])


def nested_view(buffer: torch.Tensor, layout: str, sizes: list) -> torch.Tensor:
    """The nested tensor whose components are ``buffer`` cut into ``sizes`` (a view)."""
    if layout == "jagged":
        lengths = torch.tensor([size[0] for size in sizes])
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        values = buffer.view(int(offsets[-1]), *sizes[0][1:])
        return torch.nested.nested_tensor_from_jagged(values, offsets)
    shapes = torch.tensor(sizes, dtype=torch.int64)
    strides = torch.tensor([_contiguous_strides(size) for size in sizes], dtype=torch.int64)
    numels = torch.tensor([math.prod(size) for size in sizes], dtype=torch.int64)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), numels.cumsum(0)[:-1]])
    # the only public-free way to a strided nested tensor that views a given buffer
    return torch._nested_view_from_buffer(buffer, shapes, strides, offsets)


def nested_buffer(value: torch.Tensor) -> torch.Tensor | None:
    """The tensor a nested tensor views (its values, or the buffer it was built on)."""
    if value.layout is torch.jagged:
        return getattr(value, "_values", None)
    return value._base


def packed_buffer(value: torch.Tensor, sizes: list) -> torch.Tensor | None:
    """The flat tensor ``value`` views when it is exactly :func:`nested_view` of it
    (components back to back, in order, covering all of it); else None."""
    total = nested_numel(sizes)
    if value.layout is torch.jagged:
        values = getattr(value, "_values", None)
        if values is None or value._lengths is not None or not values.is_contiguous():
            return None
        base = values if values._base is None else values._base
        offsets = value.offsets()
        if (
            int(offsets[0]) != 0
            or base.dim() != 1
            or base.numel() != total
            or values.data_ptr() != base.data_ptr()
        ):
            return None
        return base
    base = value._base
    if base is None or base.dim() != 1 or base.numel() != total:
        return None
    numels = [math.prod(size) for size in sizes]
    starts = [sum(numels[:i]) for i in range(len(numels))]
    strides = [_contiguous_strides(size) for size in sizes]
    if (
        value._nested_tensor_storage_offsets().tolist() != starts
        or value._nested_tensor_strides().tolist() != strides
        or value.data_ptr() != base.data_ptr()
    ):
        return None
    return base


def _contiguous_strides(size: list) -> list[int]:
    strides, step = [], 1
    for length in reversed(size):
        strides.append(step)
        step *= length
    return strides[::-1]
