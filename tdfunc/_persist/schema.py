"""``from_schema``: a zero-filled container preallocated from ``{key: (shape, dtype)}``.

The storage is chosen by name: ordinary tensors, memory-mapped files (sparse, so a
large dataset is allocated instantly) or shared memory.

Example:
    >>> td = TensorDict.from_schema({"obs": ([4], torch.float32)}, batch_size=[8])
    >>> td["obs"].shape
    torch.Size([8, 4])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

_STORAGES = (None, "memmap", "shared")
_NOT_IN_TDFUNC = {
    "h5": "H5 storage (PersistentTensorDict)",
    "zarr": "zarr storage (PersistentTensorDict)",
    "redis": "the Redis store (TensorDictStore)",
    "dragonfly": "the Dragonfly store (TensorDictStore)",
}


def _entries(schema: Any, api: str) -> list:
    """``[(key, element shape, dtype)]``, each entry checked."""
    if not isinstance(schema, Mapping):
        raise TypeError(
            f"{api}: expected a mapping from keys to (element_shape, dtype) pairs, got a "
            f"{type(schema).__name__}."
        )
    entries = []
    for key, spec in schema.items():
        if not (isinstance(spec, Sequence) and len(spec) == 2):
            raise TypeError(
                f"{api}: the schema entry {key!r} must be an (element_shape, dtype) pair, "
                f"got {spec!r}; e.g. {{{key!r}: ([84, 84, 3], torch.uint8)}}."
            )
        shape, dtype = spec
        if not isinstance(dtype, torch.dtype):
            raise TypeError(
                f"{api}: the dtype of schema entry {key!r} must be a torch.dtype, got {dtype!r}."
            )
        try:
            size = torch.Size(shape)
        except TypeError:
            raise TypeError(
                f"{api}: the element shape of schema entry {key!r} must be a sequence of ints, "
                f"got {shape!r}."
            ) from None
        entries.append((key, size, dtype))
    return entries


class SchemaMixin:
    """``from_schema``, a classmethod of every container."""

    __slots__ = ()

    @classmethod
    def from_schema(
        cls,
        schema: Mapping,
        *,
        batch_size: Sequence[int] | torch.Size | None = None,
        storage: str | None = None,
        device: Any = None,
        **kwargs: Any,
    ):
        """A zero-filled container preallocated from ``{key: (element_shape, dtype)}``.

        Each entry has the shape ``[*batch_size, *element_shape]``. ``storage`` picks
        where the values live: ``None`` (ordinary tensors on ``device``),
        ``"memmap"`` (memory-mapped files, allocated sparse; the keyword arguments go
        to :meth:`memmap_like`, e.g. ``prefix=``) or ``"shared"`` (shared memory,
        locked as ``share_memory_()`` leaves it). Keys may be nested (tuples). Called
        on a TensorClass, the schema names its fields.

        Example:
            >>> schema = {"obs": ([84, 84, 3], torch.uint8), "reward": ([], torch.float32)}
            >>> td = TensorDict.from_schema(schema, batch_size=[1000])
            >>> td["obs"].shape, td["reward"].dtype
            (torch.Size([1000, 84, 84, 3]), torch.float32)
            >>> TensorDict.from_schema(schema, batch_size=[10], storage="memmap").is_memmap()
            True
        """
        api = f"{cls.__name__}.from_schema"
        entries = _entries(schema, api)
        size = torch.Size(() if batch_size is None else batch_size)
        if storage in _NOT_IN_TDFUNC:
            raise NotImplementedError(
                f"{api}: storage={storage!r} needs {_NOT_IN_TDFUNC[storage]}, which is not "
                f"part of tdfunc; storage='memmap' keeps the data on disk."
            )
        if storage not in _STORAGES:
            raise ValueError(
                f"{api}: unknown storage {storage!r}; expected one of None, 'memmap', 'shared'."
            )
        if storage != "memmap" and kwargs:
            raise TypeError(
                f"{api}: storage={storage!r} takes no other keyword arguments, got "
                f"{sorted(kwargs)}; they are forwarded to memmap_like for storage='memmap'."
            )
        plain = cls._plain_tensordict()  # type: ignore[attr-defined]
        if storage == "memmap":
            if device is not None and torch.device(device).type != "cpu":
                raise ValueError(
                    f"{api}: memory-mapped storage lives on the CPU, got device={device!r}; "
                    f"map on the CPU, then .to(device)."
                )
            # expanded scalars allocate nothing; memmap_like writes sparse files
            source = {
                key: torch.zeros((), dtype=dtype).expand((*size, *shape))
                for key, shape, dtype in entries
            }
            prefix = kwargs.pop("prefix", None)
            td = plain(source, batch_size=size).memmap_like(prefix, **kwargs)
        else:
            source = {
                key: torch.zeros((*size, *shape), dtype=dtype, device=device)
                for key, shape, dtype in entries
            }
            td = plain(source, batch_size=size, device=device)
            if storage == "shared":
                td.share_memory_()
        if getattr(cls, "_is_tensordict", False):
            return td
        return cls.from_tensordict(td)  # type: ignore[attr-defined]
