"""The tensors that ensembles keep shared (no member dim), known by identity.

An optimizer given a plain list of an ensemble's parameters (``ensemble.parameters()``)
cannot tell a shared tensor from a stacked one by its size: a shared weight whose first
dim happens to equal the number of members looks stacked. A per-member hyperparameter
would then be applied along that dim, silently. Every ``Ensemble`` declares its shared
tensors here, so the optimizers can refuse that case instead of guessing.

Example:
    >>> import torch
    >>> from tdfunc._ensemble.shared import declare_shared, is_shared
    >>> weight = torch.nn.Parameter(torch.zeros(3, 2))
    >>> declare_shared([weight])
    >>> is_shared(weight), is_shared(torch.zeros(3, 2))
    (True, False)
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable

import torch

# id -> weak reference; a tensor's == is elementwise, so no container compares them
_SHARED: dict[int, weakref.ref] = {}
# Also a mark on the tensor itself: copies of the ensemble (``copy.deepcopy``,
# ``torch.save``/``torch.load``) copy a tensor's attributes, never its identity.
_MARK = "_tdfunc_ensemble_shared"


def _forget(key: int, ref: weakref.ref) -> None:
    if _SHARED.get(key) is ref:
        del _SHARED[key]


def declare_shared(tensors: Iterable[torch.Tensor]) -> None:
    """Record ``tensors`` as held once for all members of an ensemble."""
    for tensor in tensors:
        key = id(tensor)
        _SHARED[key] = weakref.ref(tensor, lambda ref, key=key: _forget(key, ref))
        with contextlib.suppress(AttributeError):  # a tensor class without attributes
            setattr(tensor, _MARK, True)


def is_shared(tensor: torch.Tensor) -> bool:
    """Whether an ensemble declared ``tensor`` shared (it has no member dim)."""
    if getattr(tensor, _MARK, False) is True:
        return True
    ref = _SHARED.get(id(tensor))
    return ref is not None and ref() is tensor


def is_marked_shared(tensor: torch.Tensor) -> bool:
    """:func:`is_shared` by the mark alone: what ``torch.compile`` can check without an id."""
    return getattr(tensor, _MARK, False) is True


def replaced(old: object, new: object) -> None:
    """``new`` takes the place of ``old`` in an ensemble (``load_state_dict(assign=True)``,
    an attribute set on a stacked module): it is shared if ``old`` was."""
    if (
        new is not old
        and isinstance(new, torch.Tensor)
        and isinstance(old, torch.Tensor)
        and is_shared(old)
    ):
        declare_shared([new])
