"""What the lock rules ask of a container: refusals under a locked owner, unlock bookkeeping."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .mixin import is_tensor_collection

if TYPE_CHECKING:
    pass


def end_consolidation(container: Any) -> None:
    """Forget that ``container`` is consolidated (``unlock_``: its structure may change)."""
    view = container._to_tensordict_view()
    try:
        storage = view._consolidation
    except AttributeError:
        # unset: from now on None (read without the cost of raising, as parents.parent_ref)
        try:  # noqa: SIM105 (contextlib.suppress costs more on this path)
            view._consolidation = None
        except AttributeError:  # a container without the slot
            pass
        return
    if storage is not None:
        del view._consolidation


def refuse_if_owner_locked(td, parts: tuple, api: str) -> None:
    """Raise the lock error when the container that holds (or would hold) the key at
    ``parts`` is locked.

    A structural change (``del_``, ``pop``, ``rename_key_``) is refused before the key
    is looked up, as tensordict does, so a locked container gives the same error for a
    key it has, one it lacks and one behind a leaf.
    """
    node = td
    for part in parts[:-1]:
        inner = node._to_tensordict_view()._data.get(part)
        if not is_tensor_collection(inner):
            break
        node = inner
    if node._is_locked:
        key = parts[0] if len(parts) == 1 else parts
        # the container called names its own class; a nested one refuses as a level
        # reached through it (a frozen TensorClass inside: the RuntimeError of its view)
        (node if node is td else node._to_tensordict_view())._check_writable(api, key)
