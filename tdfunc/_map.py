"""Placeholder: map over chunks in worker processes (issue 6)."""

from __future__ import annotations


class MapMixin:
    """Methods of ``TensorDict``: map over chunks in worker processes (issue 6)."""

    __slots__ = ()
