"""Placeholder: memmap, memmap_, memmap_like, load_memmap, save, load, dumps (issue 5)."""

from __future__ import annotations


class PersistMixin:
    """Methods of ``TensorDict``: memmap, memmap_, memmap_like, load_memmap, save, load."""

    __slots__ = ()
