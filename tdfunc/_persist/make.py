"""``make_memmap*``: add a memory-mapped entry to a container saved with ``memmap_``.

The new entry is written to a file in the container's directory and recorded in its
``meta.json`` (``load_memmap`` sees it); the container stays locked and memory-mapped.

Example:
    >>> import tempfile
    >>> td = TensorDict().memmap_(tempfile.mkdtemp())
    >>> td.make_memmap("a", [2, 3]).fill_(1.0).sum().item()
    6.0
"""

from __future__ import annotations

import os
import re
import warnings
from typing import Any

import torch

from .._core.helpers.nested_keys import unravel_key
from .filenames import encode_key
from .tensordict_read import is_tensordict_layout


def _parts(key: Any) -> tuple:
    key = unravel_key(key)
    return key if isinstance(key, tuple) else (key,)


def _strided_nested(components: list) -> torch.Tensor:
    with warnings.catch_warnings():  # torch warns that the strided layout is a prototype
        warnings.simplefilter("ignore", UserWarning)
        return torch.nested.nested_tensor(components)


class MakeMemmapMixin:
    """Methods of ``TensorDict``: make_memmap, make_memmap_from_tensor, ..._from_storage."""

    __slots__ = ()

    def _memmap_target(self, key: Any, api: str) -> tuple:
        """The key's parts, after checking this container can take a new mapped entry."""
        name = f"{type(self).__name__}.{api}"
        if self.saved_path is None or not self.is_memmap():  # type: ignore[attr-defined]
            raise RuntimeError(
                f"{name}: this {type(self).__name__} is not memory-mapped to a directory; "
                f"call memmap_(prefix) first."
            )
        parts = _parts(key)
        if key in self.keys(include_nested=True):  # type: ignore[attr-defined]
            raise RuntimeError(
                f"{name}: the key {key!r} already exists within the target tensordict; "
                f"write into the existing entry instead (it is memory-mapped)."
            )
        return parts

    def make_memmap_from_tensor(self, key: Any, tensor: torch.Tensor):
        """Add ``key`` as a memory-mapped copy of ``tensor`` and return that entry.

        The container must be memory-mapped to a directory (``memmap_(prefix)``); the
        entry's file goes there and ``load_memmap`` sees it.

        Example:
            >>> import tempfile
            >>> td = TensorDict().memmap_(tempfile.mkdtemp())
            >>> td.make_memmap_from_tensor(("b", "c"), torch.ones(2)).tolist()
            [1.0, 1.0]
        """
        api = "make_memmap_from_tensor"
        self._memmap_target(key, api)
        was_locked = self.is_locked  # type: ignore[attr-defined]
        self.unlock_()  # type: ignore[attr-defined]
        try:
            self.set(key, tensor.detach().clone())  # type: ignore[attr-defined]
            # in the directory's own layout (one call, one answer); in tdfunc's, the
            # existing entries are mapped already and memmap_ only writes the new one
            path = self.saved_path  # type: ignore[attr-defined]
            layout = "tensordict" if is_tensordict_layout(path) else "tdfunc"
            self.memmap_(path, format=layout)  # type: ignore[attr-defined]
        except BaseException:
            self.unlock_()  # type: ignore[attr-defined]
            self.pop(key, None)  # type: ignore[attr-defined]
            if was_locked:
                self.lock_()  # type: ignore[attr-defined]
            raise
        return self.get(key)  # type: ignore[attr-defined]

    def make_memmap(self, key: Any, shape: Any, *, dtype: torch.dtype | None = None):
        """Add ``key`` as a new (zero-filled) memory-mapped tensor and return it.

        ``shape`` is one shape, or a 2-d integer tensor with one row per component of
        a (strided) nested tensor.

        Example:
            >>> import tempfile
            >>> td = TensorDict().memmap_(tempfile.mkdtemp())
            >>> td.make_memmap("x", [2], dtype=torch.int64).tolist()
            [0, 0]
            >>> nested = td.make_memmap("n", torch.tensor([[1, 2], [1, 3]]))
            >>> [c.shape for c in nested.unbind()]
            [torch.Size([1, 2]), torch.Size([1, 3])]
        """
        dtype = dtype or torch.get_default_dtype()
        if isinstance(shape, torch.Tensor):
            if shape.dim() != 2 or shape.dtype.is_floating_point or shape.dtype.is_complex:
                raise ValueError(
                    f"{type(self).__name__}.make_memmap: a tensor of shapes must be a 2-d "
                    f"integer tensor (one row per component of the nested tensor), got "
                    f"{shape.dim()}-d {shape.dtype}."
                )
            components = [torch.zeros(row, dtype=dtype) for row in shape.tolist()]
            return self.make_memmap_from_tensor(key, _strided_nested(components))
        empty = torch.zeros(torch.Size(shape), dtype=dtype)
        return self.make_memmap_from_tensor(key, empty)

    def make_memmap_from_storage(
        self, key: Any, storage: torch.UntypedStorage, shape: Any, *, dtype: torch.dtype
    ):
        """Add ``key`` holding the values of ``storage`` (read as ``dtype`` and ``shape``).

        A storage that maps a file must map the file of that key in this container's
        directory (as after a ``memmap`` to the same directory); the values are written
        to the container's file for the key.

        Example:
            >>> import tempfile
            >>> td = TensorDict().memmap_(tempfile.mkdtemp())
            >>> storage = torch.arange(4.0).untyped_storage()
            >>> td.make_memmap_from_storage("a", storage, [2, 2], dtype=torch.float32).tolist()
            [[0.0, 1.0], [2.0, 3.0]]
        """
        api = "make_memmap_from_storage"
        parts = self._memmap_target(key, api)
        filename = getattr(storage, "filename", None)
        if filename is not None:
            directory = os.path.join(self.saved_path, *map(encode_key, parts[:-1]))  # type: ignore[attr-defined]
            stem = re.escape(encode_key(parts[-1]))
            own = os.path.dirname(os.path.abspath(filename)) == os.path.abspath(directory)
            if not own or not re.fullmatch(
                rf"{stem}(\.[0-9a-f]+)?\.memmap", os.path.basename(filename)
            ):
                raise RuntimeError(
                    f"{type(self).__name__}.{api}: Providing a storage with an associated "
                    f"filename ({filename}) that differs from the file of {key!r} in "
                    f"{self.saved_path} is not supported; pass a storage in memory, or use "  # type: ignore[attr-defined]
                    f"make_memmap_from_tensor."
                )
        values = torch.empty(0, dtype=dtype).set_(storage, 0, torch.Size(shape))
        return self.make_memmap_from_tensor(key, values)
