"""The ensemble's cache of derived leaves, and the test for "this call is being traced".

Derived leaves (``weight.mT``, a bias as a row, rows of a packed projection) are
recomputed only when something that changes them changed. An entry is reused
while, for every leaf, all of these are the same as when it was made:

- the object (``load_state_dict(assign=True)``, ``functional_call``);
- ``requires_grad``, in grad mode (a view made of a frozen leaf carries no graph:
  reusing it after unfreezing would leave every ``.grad`` at ``None``; a view made
  of a trainable leaf keeps a graph after freezing; without grad mode no view
  carries a graph);
- the memory and its layout: storage, offset, sizes and strides (``p.data = ...``
  and ``vector_to_parameters`` replace them in place of the object, and
  ``p.data = p.data.mT`` or ``p.data = p.data[:, :k]`` keep the storage and its
  address but not the layout): each leaf ``is_set_to`` an alias kept with the entry;
- the version counter, for leaves whose derived tensor is a copy rather than a
  view (a view sees in-place edits, a copy does not);

and the grad and inference modes are those of the entry, and the context and its
number of derivations are those it was made with (a plan built later, for the
other train/eval mode, can append derivations to the same context). Nothing is cached
while the call is traced (``torch.compile``, ``torch.export`` strict or not,
``torch.jit.trace``, fake tensors), runs under any torch dispatch mode
(functionalization, or a mode that must see every op) or inside a ``torch.func``
transform: a derived tensor made there is a fake or wrapped tensor that must not
reach a later eager call, and one made before must not enter a trace (the tracer
would take it for a constant).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from .._core.helpers.tracing import dispatch_modes as _dispatch_modes
from .._core.helpers.tracing import interpreter_stack as _interpreters
from .._core.helpers.tracing import tracing as tracing

if TYPE_CHECKING:
    from .registry import BatchContext

_PLAIN = frozenset((torch.Tensor, torch.nn.Parameter))
# Read per leaf on every call: C-level getters mapped over the leaves keep the
# check to a few hundred nanoseconds (it is a visible part of a small forward).
_requires_grad = operator.attrgetter("requires_grad")
_is_set_to = torch.Tensor.is_set_to  # same storage, offset, sizes and strides
_alias = torch.Tensor.detach
_version = operator.attrgetter("_version")
_is = operator.is_
_grad_enabled = torch.is_grad_enabled
_inference_mode = torch.is_inference_mode_enabled


def _aliases(derived: torch.Tensor, source: torch.Tensor) -> bool:
    """Whether ``derived`` is a view of ``source``'s memory (so it sees in-place edits)."""
    base = source if source._base is None else source._base
    return derived._base is base


class DerivedCache:
    """Derived leaves per (grad mode, inference mode), reused under the rules above."""

    # __weakref__: the stacked modules find the cache to clear it (layout.py)
    __slots__ = ("__weakref__", "entries")

    def __init__(self) -> None:
        # index grad mode + 2 * inference mode: (leaves, requires_grad per leaf or
        # True when every leaf requires grad, an alias of each leaf's memory and
        # layout, versions of the copied leaves (pick them, their versions) or None,
        # the extended leaves, the context, its number of derivations)
        self.entries: list = [None] * 4

    def clear(self) -> None:
        self.entries[:] = [None] * 4

    def extend(
        self,
        context: BatchContext,
        leaves: tuple,
        prepare: Callable | None = None,
        compiling: bool | None = None,
    ) -> tuple:
        """``context.extend(leaves)``, from the cache when nothing it depends on changed.

        ``prepare`` (views of the leaves, such as shared tensors expanded to the
        member dim) runs before the derivations and is cached with them;
        ``compiling``: ``False`` when the caller has read ``compiling()`` and the
        jit tracing state (both false), ``None`` to read them here.
        """
        if not context.derivations and prepare is None:
            return leaves
        # compiling=False: the caller has found that nothing compiles, exports (an
        # export sets compiling()) or jit-traces; what tracing() asks besides is
        # read here, inlined (this runs on every call of a small ensemble)
        if tracing() if compiling is None else (_dispatch_modes() or _interpreters() is not None):
            return context.extend(leaves if prepare is None else prepare(leaves))
        grad = _grad_enabled()
        entry = self.entries[grad + 2 * _inference_mode()]
        # Cheapest first: the objects (the same objects as when the entry was made
        # are of the plain classes it was made for), then one pass per property.
        # Without grad mode no view carries a graph, whatever requires_grad says.
        if (
            entry is not None
            and entry[5] is context
            and entry[6] == len(context.derivations)
            and all(map(_is, entry[0], leaves))
            and (
                not grad
                # one pass that stops early when every leaf trained (the usual case)
                or (
                    all(map(_requires_grad, leaves))
                    if entry[1] is True
                    else list(map(_requires_grad, leaves)) == entry[1]
                )
            )
            and all(map(_is_set_to, leaves, entry[2]))
            and (entry[3] is None or list(map(_version, entry[3][0](leaves))) == entry[3][1])
        ):
            return entry[4]
        if not _PLAIN.issuperset(map(type, leaves)):
            return context.extend(leaves if prepare is None else prepare(leaves))
        mode = grad + 2 * _inference_mode()
        extended = context.extend(leaves if prepare is None else prepare(leaves))
        count = len(leaves)
        copied = sorted(
            {
                i
                for offset, (_, i) in enumerate(context.derivations)
                if not _aliases(extended[count + offset], leaves[i])
            }
        )
        versions = None
        if copied:
            pick = operator.itemgetter(*copied) if len(copied) > 1 else _one(copied[0])
            versions = (pick, list(map(_version, pick(leaves))))
        grads: list | bool = list(map(_requires_grad, leaves))
        if all(grads):
            grads = True
        aliases = list(map(_alias, leaves))
        derivations = len(context.derivations)
        self.entries[mode] = (leaves, grads, aliases, versions, extended, context, derivations)
        return extended


def _one(index: int) -> Callable:
    """``itemgetter`` for one index, as a tuple (what it gives for several)."""
    return lambda values: (values[index],)
