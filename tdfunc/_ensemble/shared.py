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
    """Record ``tensors`` as held once for all members of an ensemble.

    By the mark alone where the tensor takes one: ``torch.utils.swap_tensors``
    (``.to()`` and ``load_state_dict`` with torch's swap-on-conversion setting)
    refuses a tensor that a weak reference points to. The swap gives the tensor the
    new one's attributes, so the stacked modules mark their shared tensors again
    after it (``layout._Stacked``).
    """
    for tensor in tensors:
        try:
            setattr(tensor, _MARK, True)
        except AttributeError:  # a tensor class without attributes: known by identity
            key = id(tensor)
            _SHARED[key] = weakref.ref(tensor, lambda ref, key=key: _forget(key, ref))


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
