"""TensorClass persistence and modules: memmap/load methods, ``to_module``, ``from_module``.

The persistence methods share their implementation with ``TensorDict``
(:func:`tdfunc._persist.memmap_collection`, :func:`tdfunc._persist.load_collection`),
which record the class name on disk, so a saved instance loads back as its class.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

from .._core.container import TensorDict
from .._persist.api import load_collection, memmap_collection
from .._persist.save import saved_path_of
from .io import TensorClassIO

if TYPE_CHECKING:
    from torch import nn
    from typing_extensions import Self


class TensorClassPersist(TensorClassIO):
    """Memory-mapped persistence and parameter swapping of ``TensorClass`` instances."""

    __slots__ = ()

    @classmethod
    def from_module(cls, module: nn.Module) -> Self:
        """The parameters and buffers of ``module`` as an instance (fields = their names).

        Example:
            >>> class LinearParams(TensorClass["frozen"]):
            ...     weight: torch.Tensor
            ...     bias: torch.Tensor
            >>> LinearParams.from_module(torch.nn.Linear(3, 4)).weight.shape
            torch.Size([4, 3])
        """
        return cls.from_tensordict(TensorDict.from_module(module))

    @classmethod
    def from_modules(cls, *modules: nn.Module) -> Self:
        """The parameters of several identical modules, stacked along a new batch dim."""
        return cls.from_tensordict(TensorDict.from_modules(*modules))

    def to_module(self, module: nn.Module) -> Any:
        """Swap the fields into ``module``'s parameters (see ``TensorDict.to_module``).

        Example:
            >>> class LinearParams(TensorClass["frozen"]):
            ...     weight: torch.Tensor
            ...     bias: torch.Tensor
            >>> linear = torch.nn.Linear(3, 2)
            >>> p = LinearParams(weight=torch.zeros(2, 3), bias=torch.ones(2))
            >>> with p.to_module(linear):
            ...     linear(torch.randn(1, 3)).tolist()
            [[1.0, 1.0]]
        """
        return self._td.to_module(module)

    # ------------------------------------------------------------------ persistence
    def memmap(
        self,
        prefix: str | os.PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: bool = False,
        share_non_tensor: bool = False,
        existsok: bool = True,
        robust_key: bool | None = True,
        fsync: bool = False,
    ) -> Self:
        """A new, locked instance with its tensors in memory-mapped files under ``prefix``.

        The class name is recorded on disk, so :meth:`load_memmap` (of this class
        or of ``TensorDict``) gives back an instance of this class. Arguments as
        in ``TensorDict.memmap``.

        Example:
            >>> import tempfile
            >>> class Foo(TensorClass):
            ...     x: torch.Tensor
            >>> path = tempfile.mkdtemp()
            >>> saved = Foo(x=torch.zeros(3), batch_size=[3]).memmap(path)
            >>> type(TensorDict.load_memmap(path)).__name__
            'Foo'
        """
        return memmap_collection(
            self,
            prefix,
            copy_existing,
            api=f"{type(self).__name__}.memmap",
            num_threads=num_threads,
            return_early=return_early,
            share_non_tensor=share_non_tensor,
            existsok=existsok,
            robust_key=robust_key,
            fsync=fsync,
        )

    def memmap_(
        self,
        prefix: str | os.PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: bool = False,
        share_non_tensor: bool = False,
        existsok: bool = True,
        robust_key: bool | None = True,
        fsync: bool = False,
    ) -> Self:
        """Move the tensors into memory-mapped files under ``prefix`` (in place); locks."""
        self._check_mutable("memmap_")
        return memmap_collection(
            self,
            prefix,
            copy_existing,
            api=f"{type(self).__name__}.memmap_",
            inplace=True,
            num_threads=num_threads,
            return_early=return_early,
            share_non_tensor=share_non_tensor,
            existsok=existsok,
            robust_key=robust_key,
            fsync=fsync,
        )

    def memmap_like(
        self,
        prefix: str | os.PathLike | None = None,
        copy_existing: bool = False,
        *,
        existsok: bool = True,
        num_threads: int = 0,
        return_early: bool = False,
        share_non_tensor: bool = False,
        robust_key: bool | None = True,
        fsync: bool = False,
    ) -> Self:
        """A new instance with the same shapes in fresh, unwritten (sparse) memory-mapped files."""
        return memmap_collection(
            self,
            prefix,
            copy_existing,
            api=f"{type(self).__name__}.memmap_like",
            like=True,
            num_threads=num_threads,
            return_early=return_early,
            share_non_tensor=share_non_tensor,
            existsok=existsok,
            robust_key=robust_key,
            fsync=fsync,
        )

    def save(
        self,
        prefix: str | os.PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: bool = False,
        share_non_tensor: bool = False,
        robust_key: bool | None = True,
        fsync: bool = False,
    ) -> Self:
        """Save to disk (a proxy to :meth:`memmap`)."""
        return memmap_collection(
            self,
            prefix,
            copy_existing,
            api=f"{type(self).__name__}.save",
            num_threads=num_threads,
            return_early=return_early,
            share_non_tensor=share_non_tensor,
            robust_key=robust_key,
            fsync=fsync,
        )

    def dumps(
        self,
        prefix: str | os.PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: bool = False,
        share_non_tensor: bool = False,
        robust_key: bool | None = True,
        fsync: bool = False,
    ) -> Self:
        """Save to disk (a proxy to :meth:`memmap`)."""
        return memmap_collection(
            self,
            prefix,
            copy_existing,
            api=f"{type(self).__name__}.dumps",
            num_threads=num_threads,
            return_early=return_early,
            share_non_tensor=share_non_tensor,
            robust_key=robust_key,
            fsync=fsync,
        )

    @classmethod
    def load_memmap(
        cls,
        prefix: str | os.PathLike,
        device: torch.device | str | None = None,
        non_blocking: bool = False,
        *,
        out: Any = None,
        robust_key: bool | None = True,
        num_threads: int = 0,
    ) -> Self:
        """Load an instance saved with :meth:`memmap` (tensors stay memory-mapped).

        Data saved as a plain TensorDict (or another class) is wrapped in this class
        with :meth:`from_tensordict` (fields missing on disk get their defaults).
        """
        api = f"{cls.__name__}.load_memmap"
        if robust_key is False:
            raise ValueError(f"{api}: robust_key=False is not supported.")
        loaded = load_collection(
            None, prefix, device, non_blocking, out=out, num_threads=num_threads, api=api
        )
        if out is None and not isinstance(loaded, cls):
            loaded = cls.from_tensordict(loaded._to_tensordict_view())
        return loaded

    @classmethod
    def load(cls, prefix: str | os.PathLike, *args: Any, **kwargs: Any) -> Self:
        """Load from disk (a proxy to :meth:`load_memmap`)."""
        return cls.load_memmap(prefix, *args, **kwargs)

    def load_memmap_(
        self, prefix: str | os.PathLike, robust_key: bool | None = True, *, num_threads: int = 0
    ) -> Self:
        """Replace the content of this instance by the data saved in ``prefix``."""
        self._check_mutable("load_memmap_")
        api = f"{type(self).__name__}.load_memmap_"
        if robust_key is False:
            raise ValueError(f"{api}: robust_key=False is not supported.")
        return load_collection(None, prefix, out=self, num_threads=num_threads, api=api)

    def load_(self, prefix: str | os.PathLike, *args: Any, **kwargs: Any) -> Self:
        """Load from disk into this instance (a proxy to :meth:`load_memmap_`)."""
        return self.load_memmap_(prefix, *args, **kwargs)

    def memmap_refresh_(self) -> Self:
        """Re-read the files this instance was saved to or loaded from."""
        self._check_mutable("memmap_refresh_")
        path = self.saved_path
        if path is None:
            raise RuntimeError(
                f"{type(self).__name__}.memmap_refresh_: this instance has no saved path; only "
                f"an instance returned by memmap/memmap_/memmap_like(prefix) or load_memmap "
                f"can be refreshed."
            )
        return load_collection(None, path, out=self, api=f"{type(self).__name__}.memmap_refresh_")

    @property
    def saved_path(self) -> str | None:
        """The directory this instance was saved to or loaded from, else ``None``."""
        path = saved_path_of(self)
        return saved_path_of(self._td) if path is None else path

    def is_memmap(self) -> bool:
        """True when every tensor leaf is a ``MemoryMappedTensor`` (and there is one)."""
        return self._td.is_memmap()
