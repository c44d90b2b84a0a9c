"""Saving a non-tensor leaf on its own (``memmap``, ``memmap_``, ``load_memmap``).

The persistence layer sits above the core, so it is reached through the registered
``TensorDict`` class, never imported."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..hooks import HOOKS

if TYPE_CHECKING:
    from .leaves import NonTensorData


class _Saving:
    """The saving methods of ``NonTensorData`` and ``NonTensorStack``."""

    __slots__ = ()

    def _is_memmaped_from_above(self) -> bool:
        """True for an element read from a memory-mapped ``NonTensorStack`` (read-only).

        Example:
            >>> NonTensorStack("a", "b")[0]._is_memmaped_from_above()
            False
        """
        view = self.__dict__.get("_view_of")
        if view is None:
            return False
        parent = view[0]
        return bool(parent._is_memmap) or parent._is_memmaped_from_above()

    # ------------------------------------------------------------------ saving on its own
    def memmap(
        self,
        prefix=None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: bool = False,
        share_non_tensor: bool = False,
        existsok: bool = True,
        robust_key: bool | None = True,
        fsync: bool = False,
        format: str = "tdfunc",
    ) -> NonTensorData:
        """Save the leaf in the directory ``prefix``; returns the saved leaf (locked).

        ``TensorDict.load_memmap(prefix)`` (or ``type(leaf).load_memmap``) gives it back;
        ``format="tensordict"`` writes tensordict's layout (JSON values only). The keywords
        are ``TensorDict.memmap``'s; those about tensors (threads, early return, key
        checks) have nothing to act on in a leaf with no tensor; ``num_threads`` is still
        checked as there (an int >= 0).

        Example:
            >>> import tempfile
            >>> path = tempfile.mkdtemp()
            >>> saved = NonTensorStack("a", "b").memmap(path)
            >>> saved.is_memmap(), NonTensorStack.load_memmap(path).tolist()
            (True, ['a', 'b'])
        """
        return self._save(prefix, False, existsok, fsync, format, num_threads)

    def memmap_(
        self,
        prefix=None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: bool = False,
        share_non_tensor: bool = False,
        existsok: bool = True,
        robust_key: bool | None = True,
        fsync: bool = False,
        format: str = "tdfunc",
    ) -> NonTensorData:
        """:meth:`memmap` in place: this leaf becomes the saved one (locked); its
        in-place updates (``update_``, ``update(..., inplace=True)``) reach the file.

        Example:
            >>> import tempfile
            >>> path = tempfile.mkdtemp()
            >>> leaf = NonTensorStack("a", "b").memmap_(path)
            >>> _ = leaf.update_(NonTensorStack("c", "d"))
            >>> NonTensorStack.load_memmap(path).tolist()
            ['c', 'd']
        """
        return self._save(prefix, True, existsok, fsync, format, num_threads)

    def _save(self, prefix, inplace, existsok: bool, fsync: bool, format: str, num_threads):
        # the persistence layer sits above the core: reach it through the registered class
        return HOOKS.tensordict._memmap_leaf(
            self,
            prefix,
            api=f"{type(self).__name__}.{'memmap_' if inplace else 'memmap'}",
            inplace=inplace,
            existsok=existsok,
            fsync=fsync,
            format=format,
            num_threads=num_threads,
        )

    @classmethod
    def load_memmap(cls, prefix, *args: Any, **kwargs: Any) -> NonTensorData:
        """The leaf saved in ``prefix`` by :meth:`memmap` (arguments of
        ``TensorDict.load_memmap``); ``TypeError`` if ``prefix`` holds a container."""
        api = f"{cls.__name__}.load_memmap"
        return HOOKS.tensordict._load_leaf(prefix, api, cls, *args, **kwargs)

    def is_memmap(self) -> bool:
        """True once the leaf was saved by ``memmap``/``memmap_`` or loaded from a save."""
        return bool(self._is_memmap)
