"""Placeholder: send, recv, isend, irecv, broadcast, all_reduce (issue 6)."""

from __future__ import annotations


class DistributedMixin:
    """Methods of ``TensorDict``: send, recv, isend, irecv, broadcast, all_reduce (issue 6)."""

    __slots__ = ()
