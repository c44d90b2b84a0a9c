"""``dims_like``: per-key ``in_dims`` / ``out_dims`` for ``vmap`` over a container.

``vmap`` takes ``in_dims`` as a pytree that matches its input: for a
TensorDict input, a TensorDict of the same class and keys whose leaves are
ints or ``None``. The public constructor would turn ints into tensors, so such
a tree is built through the pytree machinery instead: the result *is* what
``torch.utils._pytree.tree_map(lambda _: 0, td)`` gives, with per-key choices.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch.utils._pytree as torch_pytree

from .._core.helpers.nested_keys import close_matches_hint, key_parts


def _check_dim(value: object, where: str) -> None:
    if value is not None and type(value) is not int:
        raise TypeError(
            f"dims_like: {where} must be an int (the dim to map) or None (not mapped), got "
            f"{type(value).__name__} {value!r}."
        )


def dims_like(tensordict, default: int | None = 0, overrides: Mapping | None = None):
    """A container shaped like ``tensordict`` whose leaves are vmap dims.

    Every tensor leaf gets ``default``; a key in ``overrides`` (a nested key,
    leaf or sub-container) gets its value instead, for every leaf below it.
    Pass the result as (part of) ``in_dims`` or ``out_dims`` of
    ``torch.func.vmap``. vmap maps a container over its batch dims only, so
    keys mapped differently must sit in sub-containers with their own batch
    sizes (mapped ones ``[n, ...]``, unmapped ones without that dim).

    Args:
        tensordict: a ``TensorDict`` or ``TensorClass`` instance.
        default: the dim for every leaf not named in ``overrides``
            (``int`` or ``None``).
        overrides: ``{nested key: int | None}``; the longest matching key wins.

    Returns:
        A container of the same class and keys, holding ints and ``None``.

    Raises:
        TypeError: ``tensordict`` is not a tensor collection, or a dim is
            neither an ``int`` nor ``None``.
        KeyError: a key of ``overrides`` is not in ``tensordict``.

    Example:
        >>> params = TensorDict({
        ...     "stacked": TensorDict({"w": torch.randn(5, 3)}, [5]),  # one per member
        ...     "shared": TensorDict({"b": torch.zeros(3)}, []),  # the same for all
        ... }, [])
        >>> in_dims = dims_like(params, 0, {"shared": None})
        >>> def f(p):
        ...     return p["stacked", "w"] + p["shared", "b"]
        >>> torch.func.vmap(f, (in_dims,))(params).shape
        torch.Size([5, 3])
    """
    if not getattr(type(tensordict), "_is_tensor_collection", False):
        raise TypeError(
            f"dims_like: expected a TensorDict or TensorClass instance, got "
            f"{type(tensordict).__name__}. For a plain tensor pass the int directly."
        )
    _check_dim(default, "default")
    chosen: dict[tuple, int | None] = {}
    for key, value in (overrides or {}).items():
        parts = key_parts(key)
        if parts not in tensordict.keys(include_nested=True):
            parent = tensordict.get(parts[:-1], None) if len(parts) > 1 else tensordict
            names = list(parent.keys()) if hasattr(parent, "keys") else []
            hint = close_matches_hint(parts[-1], names)
            raise KeyError(
                f"dims_like: the overrides name key {key!r}, which is not in the "
                f"{type(tensordict).__name__}.{hint}"
            )
        _check_dim(value, f"the dim for key {key!r}")
        chosen[parts] = value
    if not chosen:
        return torch_pytree.tree_map(lambda _: default, tensordict)

    def pick(path: tuple, _leaf: object) -> int | None:
        parts = tuple(entry.key for entry in path)
        for end in range(len(parts), 0, -1):
            if parts[:end] in chosen:
                return chosen[parts[:end]]
        return default

    return torch_pytree.tree_map_with_path(pick, tensordict)
