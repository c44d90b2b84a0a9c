"""``pack``: every leaf of a container in one tensor of features, and its :class:`PackLayout`.

Each leaf is flattened after the batch dims and the leaves are concatenated in sorted key
order (``keys(True, True, sort=True)``), so the columns depend on the set of keys only.
The layout records each leaf's columns, the nested containers and the classes, and
:meth:`PackLayout.unpack` rebuilds a container whose leaves are views of the packed tensor.

Example:
    >>> td = TensorDict(p=torch.zeros(5), v=torch.ones(5, 3), batch_size=[5])
    >>> flat, layout = td.pack()
    >>> flat.shape, layout.keys, layout.offsets
    (torch.Size([5, 4]), ('p', 'v'), (0, 1))
    >>> layout.unpack(flat[:2])["v"].shape
    torch.Size([2, 3])
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from .hooks import HOOKS
from .leafwise import is_collection
from .nested_keys import key_parts


def _size(shape: Any, what: str) -> torch.Size:
    if isinstance(shape, torch.Size):
        return shape
    if isinstance(shape, (list, tuple)) and all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
    ):
        return torch.Size(shape)
    raise TypeError(f"PackLayout: {what} must be a torch.Size or a list of ints, got {shape!r}.")


@dataclasses.dataclass(frozen=True)
class PackLayout:
    """The layout of a container packed by ``pack``: what :meth:`unpack` needs to rebuild it.

    Frozen, hashable and compared by value, so a module can cache it and
    ``torch.compile`` can treat it as a constant.

    Attributes:
        keys: the leaf keys, in column order.
        shapes: each leaf's shape after the batch dims (lists become ``torch.Size``).
        dim: the position of the packed dim, counted from the end (``pack`` stores it
            negative, so extra leading batch dims are allowed).
        nested: one ``(key, batch_shape, cls)`` per nested container: its batch shape
            after the root's batch dims, and its TensorClass, or ``None`` for a
            TensorDict.
        device: the device of the packed container.
        cls: the TensorClass of the packed container, or ``None``.
        offsets: the first column of each leaf.
        numel: the number of columns.

    Example:
        >>> flat, layout = TensorDict(p=torch.zeros(2), batch_size=[2]).pack()
        >>> layout == PackLayout(keys=("p",), shapes=([],)), layout.numel
        (True, 1)
    """

    keys: tuple
    shapes: tuple
    dim: int = -1
    nested: tuple = ()
    device: torch.device | None = None
    cls: type | None = None
    offsets: tuple = dataclasses.field(init=False)
    numel: int = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        keys = tuple(self.keys)
        shapes = tuple(_size(shape, "each of shapes") for shape in self.shapes)
        if len(keys) != len(shapes):
            raise ValueError(
                f"PackLayout: {len(keys)} keys but {len(shapes)} shapes; give one shape per key."
            )
        if isinstance(self.dim, bool) or not isinstance(self.dim, int):
            raise TypeError(f"PackLayout: dim must be an int, got {self.dim!r}.")
        nested = tuple(
            (key, _size(shape, "a nested batch shape"), cls) for key, shape, cls in self.nested
        )
        counts = [math.prod(shape) for shape in shapes]
        offsets = tuple(sum(counts[:i]) for i in range(len(counts)))
        device = None if self.device is None else torch.device(self.device)
        for name, value in (("keys", keys), ("shapes", shapes), ("nested", nested)):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "device", device)
        object.__setattr__(self, "offsets", offsets)
        object.__setattr__(self, "numel", sum(counts))

    def unpack(self, flat: torch.Tensor) -> Any:
        """Rebuild the container from a packed tensor; its leaves are views of ``flat``.

        The batch size is ``flat``'s shape without the packed dim, so ``flat`` may have
        other batch dims than the packed container (after an ``index_select``, say).

        Example:
            >>> td = TensorDict(p=torch.zeros(5), v=torch.ones(5, 3), batch_size=[5])
            >>> flat, layout = td.pack()
            >>> out = layout.unpack(flat)
            >>> bool((out == td).all()), out["p"].data_ptr() == flat.data_ptr()
            (True, True)
        """
        api = "PackLayout.unpack"
        if not isinstance(flat, torch.Tensor):
            raise TypeError(f"{api}: expected the packed tensor, got {type(flat).__name__}.")
        if not -flat.ndim <= self.dim < flat.ndim:
            raise ValueError(
                f"{api}: the layout packs along dim {self.dim}, which a tensor of shape "
                f"{list(flat.shape)} does not have."
            )
        if flat.shape[self.dim] != self.numel:
            raise ValueError(
                f"{api}: expected {self.numel} entries along dim {self.dim} of the packed "
                f"tensor, got {flat.shape[self.dim]} (shape {list(flat.shape)})."
            )
        columns = flat.movedim(self.dim, -1)
        batch = columns.shape[:-1]
        device = None if self.device is None else flat.device
        levels: dict[tuple, dict] = {(): {}}
        for key, _, _ in self.nested:
            levels[key_parts(key, api)] = {}
        for key, shape, start in zip(self.keys, self.shapes, self.offsets, strict=True):
            parts = key_parts(key, api)
            leaf = columns.narrow(-1, start, math.prod(shape)).reshape(*batch, *shape)
            levels.setdefault(parts[:-1], {})[parts[-1]] = leaf
        built = {(): (self.cls, torch.Size(batch))}
        for key, shape, cls in self.nested:
            built[key_parts(key, api)] = (cls, torch.Size((*batch, *shape)))
        # the deepest levels first: each becomes an entry of the level above it
        for parts in sorted(levels, key=len, reverse=True):
            cls, size = built.get(parts, (None, torch.Size(batch)))
            container = HOOKS.tensordict(levels[parts], batch_size=size, device=device)
            if cls is not None:
                container = cls._from_pytree(container._data, size, container._device, None)
            if not parts:
                return container
            levels.setdefault(parts[:-1], {})[parts[-1]] = container
        raise AssertionError("unreachable: the root level is always built")


def pack(self: Any, dim: int = -1, layout: PackLayout | None = None) -> tuple:
    """``(flat, layout)`` of a container (see the module's doc and ``TensorDict.pack``)."""
    api = f"{type(self).__name__}.pack"
    view = self._to_tensordict_view()
    batch = view.batch_size
    ndim = len(batch)
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{api}: dim must be an int, got {type(dim).__name__}.")
    if not -(ndim + 1) <= dim <= ndim:
        # IndexError, as torch.stack raises for a dim out of range
        raise IndexError(
            f"{api}: dim must be in [{-(ndim + 1)}, {ndim}] for the batch size "
            f"{list(batch)}, as for torch.stack; got {dim!r}."
        )
    stored = dim - (ndim + 1) if dim >= 0 else dim
    if layout is not None and not isinstance(layout, PackLayout):
        raise TypeError(f"{api}: layout must be a PackLayout, got {type(layout).__name__}.")
    if layout is not None and layout.dim != stored:
        raise ValueError(
            f"{api}: cannot pack along dim {stored} (counted from the end) with a layout "
            f"packed along dim {layout.dim}."
        )
    leaves: dict = {}
    nested = []
    dtype = device = first = None
    for key, value in view.items(True, False, sort=True):
        parts = key_parts(key, api)
        if value is None:  # an unset TensorClass field
            continue
        if is_collection(value):
            cls = None if getattr(type(value), "_is_tensordict", False) else type(value)
            nested.append((key, value.batch_size[ndim:], cls))
            continue
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"{api}: cannot pack the non-tensor entry {_shown(parts)}; drop the "
                f"non-tensor entries with filter_non_tensor_data() first."
            )
        if value.is_nested:
            raise TypeError(
                f"{api}: cannot pack the nested tensor at {_shown(parts)}: its rows have no "
                f"one feature count. Pad it first (torch.nested.to_padded_tensor) or drop it."
            )
        if first is None:
            dtype, device, first = value.dtype, value.device, parts
        elif value.dtype != dtype:
            raise TypeError(
                f"{api}: the leaves must share one dtype: {dtype} at {_shown(first)}, "
                f"{value.dtype} at {_shown(parts)}. Cast the container first, e.g. float()."
            )
        elif value.device != device:
            raise ValueError(
                f"{api}: the leaves must share one device: {device} at {_shown(first)}, "
                f"{value.device} at {_shown(parts)}."
            )
        leaves[key] = value
    owner = None if getattr(type(self), "_is_tensordict", False) else type(self)
    if layout is None:
        keys = tuple(leaves)
        shapes = tuple(leaf.shape[ndim:] for leaf in leaves.values())
        layout = PackLayout(keys, shapes, stored, tuple(nested), view.device, owner)
    else:
        _check_against(layout, leaves, ndim, api)
        # the columns follow the given layout; the rest describes this container, so
        # unpack rebuilds it and not the one the layout came from (its class, its
        # nested levels, its device)
        mine = PackLayout(layout.keys, layout.shapes, stored, tuple(nested), view.device, owner)
        layout = layout if mine == layout else mine
    # the feature count spelled out: -1 is ambiguous when a batch dim is 0
    pairs = zip(layout.keys, layout.shapes, strict=True)
    parts = [leaves[key].reshape(*batch, math.prod(shape)) for key, shape in pairs]
    if parts:
        flat = torch.cat(parts, dim=-1)
    else:
        flat = torch.empty(*batch, 0, device=view.device)
    if stored != -1:
        flat = flat.movedim(-1, stored).contiguous()
    elif not flat.is_contiguous():
        flat = flat.contiguous()
    return flat, layout


def _check_against(layout: PackLayout, leaves: dict, ndim: int, api: str) -> None:
    mine = sorted(map(_sort_key, leaves))
    theirs = sorted(map(_sort_key, layout.keys))
    if mine != theirs:
        missing = [_shown(k) for k in sorted(set(theirs) - set(mine))]
        extra = [_shown(k) for k in sorted(set(mine) - set(theirs))]
        raise KeyError(
            f"{api}: the leaves differ from the layout's keys: missing "
            f"[{', '.join(missing)}], not in the layout [{', '.join(extra)}]."
        )
    by_parts = {_sort_key(key): value for key, value in leaves.items()}
    for key, shape in zip(layout.keys, layout.shapes, strict=True):
        found = by_parts[_sort_key(key)].shape[ndim:]
        if found != shape:
            raise ValueError(
                f"{api}: the leaf {key!r} has the feature shape {list(found)}; the layout "
                f"has {list(shape)}."
            )
    # the layout's own keys may be spelled otherwise (a 1-tuple for a str): use them
    for key in layout.keys:
        leaves[key] = by_parts[_sort_key(key)]


def _sort_key(key: Any) -> tuple:
    return key_parts(key)


def _shown(parts: tuple) -> str:
    return repr(parts[0] if len(parts) == 1 else parts)
