"""Placeholder: from_module, from_modules and to_module (issue 3)."""

from __future__ import annotations


class ModuleSwapMixin:
    """Methods of ``TensorDict``: from_module, from_modules and to_module (issue 3)."""

    __slots__ = ()
