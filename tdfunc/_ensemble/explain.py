"""What path each part of an ensemble's template takes, and the warning when some fall back.

A plan (``plan.py``) records one :class:`Route` per submodule it meets: run by a
batched implementation, traced (a custom ``forward`` rewritten to the
member-leading layout), or run under ``vmap`` (with the reason), and one per op
of a traced ``forward`` that runs under ``vmap``. ``Ensemble.explain()`` shows
them; an ensemble whose plan has a fallback says so once, with an
:class:`EnsembleFallbackWarning`.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import NamedTuple

__all__ = ["EnsembleFallbackWarning", "Explanation", "Route", "has_fallbacks", "warn_fallbacks"]

BATCHED, TRACED, VMAP = "batched", "traced", "vmap"


class EnsembleFallbackWarning(UserWarning):
    """Part of an :class:`~tdfunc.Ensemble`'s template runs under ``torch.func.vmap``.

    The results are the same, but ``vmap`` pays a per-op cost that a batched
    kernel does not: the ensemble is slower than it could be (often slower than
    a Python loop over the members). ``ensemble.explain()`` lists which parts and
    why; :func:`~tdfunc.register_batched` adds a batched form for a layer type.
    Emitted once per ensemble. To silence it::

        import warnings
        from tdfunc import EnsembleFallbackWarning

        warnings.filterwarnings("ignore", category=EnsembleFallbackWarning)
    """


class Route(NamedTuple):
    """One row of :meth:`Ensemble.explain`.

    Attributes:
        path: the submodule's name in the template (``""`` for the template
            itself); for an op, the module whose ``forward`` holds it.
        module: the module's type name, or ``"op <name>"`` for an op of a traced
            ``forward``.
        route: ``"batched"`` (a batched implementation), ``"traced"`` (a custom
            ``forward`` rewritten to run batched; its submodules and ops have rows
            of their own) or ``"vmap"``.
        reason: why it runs under ``vmap`` (empty otherwise).
    """

    path: str
    module: str
    route: str
    reason: str = ""


class Explanation(tuple):
    """The routes of an ensemble's plan (a tuple of :class:`Route`), printed as a table."""

    @property
    def fallbacks(self) -> tuple:
        """The rows that run under ``vmap``."""
        return tuple(row for row in self if row.route == VMAP)

    def __str__(self) -> str:
        if not self:
            return "(nothing to run)"
        rows = [("path", "module", "route", "why")]
        rows += [(row.path or "<template>", row.module, row.route, row.reason) for row in self]
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        lines = [
            "  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths)) + "  " + row[3]
            for row in rows
        ]
        return "\n".join(line.rstrip() for line in lines)

    def __repr__(self) -> str:
        return str(self)


def _describe(row: Route) -> str:
    where = row.path or "<template>"
    if row.module.startswith("op "):
        return f"{row.module} in `{where}` ({row.reason})"
    return f"`{where}` ({row.module}: {row.reason})"


def has_fallbacks(report) -> bool:
    """Whether a plan's report has a part that runs under ``vmap``."""
    return any(row.route == VMAP for row in report.routes)


def warn_fallbacks(routes, template_name: str) -> bool:
    """Warn (an :class:`EnsembleFallbackWarning`) when some route is ``vmap``; True if it did."""
    fallbacks = [row for row in routes if row.route == VMAP]
    if not fallbacks:
        return False
    shown = ", ".join(_describe(row) for row in fallbacks[:4])
    more = f" and {len(fallbacks) - 4} more" if len(fallbacks) > 4 else ""
    warnings.warn(
        f"Ensemble({template_name}): {len(fallbacks)} part(s) of the model run under vmap, "
        f"with the same results but slower than batched kernels: {shown}{more}. "
        f"ensemble.explain() lists every part; register_batched adds a batched form for a "
        f"layer type; warnings.filterwarnings('ignore', category=EnsembleFallbackWarning) "
        f"silences this.",
        EnsembleFallbackWarning,
        stacklevel=_user_stacklevel(),
    )
    return True


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _user_stacklevel() -> int:
    """The stack level of the first frame outside tdfunc and torch (the user's call)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        frame, level = frame.f_back, level + 1
    return level


def _internal_prefixes() -> tuple:
    import torch

    return (_PACKAGE + os.sep, os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)


_INTERNAL = _internal_prefixes()
