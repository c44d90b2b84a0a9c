"""One walk over the tensor slots of a module: every ``_parameters``/``_buffers`` entry.

Plans are built from this walk (swap plans, the ensemble's layout and batched
plan); the swaps themselves then run straight loops over the slots a plan
recorded, never this generator.

Example:
    >>> model = nn.Sequential(nn.Linear(2, 3))
    >>> [(slot.path, slot.kind) for slot in iter_slots(model)]
    [('0.weight', 'parameter'), ('0.bias', 'parameter')]
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

from torch import nn


class Slot(NamedTuple):
    """One parameter or buffer slot: ``owner[name]`` is ``value`` (``None`` for an empty slot)."""

    path: str  # dotted, from the walked module ("0.weight")
    module: nn.Module  # the module whose slot it is
    owner: dict  # that module's ``_parameters`` or ``_buffers``
    name: str
    value: Any
    kind: str  # "parameter" or "buffer"


def iter_slots(
    module: nn.Module, *, recurse: bool = True, remove_duplicate: bool = False
) -> Iterator[Slot]:
    """Every parameter and buffer slot of ``module`` (and its submodules), empty ones too.

    Args:
        module: the module to walk.
        recurse: also walk the submodules (``named_modules`` order); ``False``: only
            ``module``'s own slots.
        remove_duplicate: visit a submodule reachable under two names once
            (``nn.Module.named_modules``' flag); by default each name is visited.

    Example:
        >>> shared = nn.Linear(1, 1)
        >>> model = nn.Sequential(shared, shared)
        >>> len(list(iter_slots(model))), len(list(iter_slots(model, remove_duplicate=True)))
        (4, 2)
    """
    subs = module.named_modules(remove_duplicate=remove_duplicate) if recurse else (("", module),)
    for prefix, sub in subs:
        for kind, owner in (("parameter", sub._parameters), ("buffer", sub._buffers)):
            for name, value in owner.items():
                yield Slot(f"{prefix}.{name}" if prefix else name, sub, owner, name, value, kind)
