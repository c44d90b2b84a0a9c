"""How an ``Ensemble``'s inputs meet its members: ``in_dims`` and the member dim.

Every input is brought to the member-leading layout ``[K, ...]`` before the
batched plan runs (``K`` is the number of members that run: all ``N``, or a
selection). An input shared by the members (``in_dims=None``) is expanded (a
view, no copy); a per-member input must carry exactly ``K`` slices in its
member dim, or the call fails with an error that names the input.
"""

from __future__ import annotations

from typing import Any

import torch

# ``in_dims`` not given for this call: the module's default applies.
DEFAULT: Any = object()


def check_in_dims(in_dims: Any) -> Any:
    """``in_dims`` validated (a list becomes a tuple)."""
    if in_dims is None or (isinstance(in_dims, int) and not isinstance(in_dims, bool)):
        return in_dims
    if isinstance(in_dims, (tuple, list)):
        for entry in in_dims:
            if entry is not None and (not isinstance(entry, int) or isinstance(entry, bool)):
                raise TypeError(
                    f"Ensemble: every entry of in_dims must be None (shared) or an int (the "
                    f"member dim of that input); got {entry!r} in {in_dims!r}."
                )
        return tuple(in_dims)
    raise TypeError(
        f"Ensemble: in_dims must be None (input shared by all members), an int (the member "
        f"dim of every input, usually 0) or a tuple with one entry per positional input; got "
        f"{type(in_dims).__name__}."
    )


def lead_inputs(args: tuple, in_dims: Any, members: int) -> tuple:
    """The positional inputs with the member dim first (a shared input is expanded)."""
    if isinstance(in_dims, tuple) and len(in_dims) != len(args):
        raise ValueError(
            f"Ensemble: in_dims has {len(in_dims)} entries but the forward got "
            f"{len(args)} positional inputs; give one int | None per input."
        )
    out = []
    for position, value in enumerate(args):
        dim = in_dims[position] if isinstance(in_dims, tuple) else in_dims
        out.append(lead_input(value, dim, members, position))
    return tuple(out)


def lead_input(value: Any, dim: int | None, members: int, position: Any = None) -> Any:
    """One input in the member-leading layout (``position`` names it in errors)."""
    if isinstance(value, torch.Tensor):
        if dim is None:
            return value.expand(members, *value.shape)
        if not -value.dim() <= dim < value.dim():
            raise ValueError(
                f"Ensemble: input {_name(position)} has {value.dim()} dims, so it has no member "
                f"dim {dim} (in_dims). Pass in_dims=None for an input shared by all members."
            )
        if value.shape[dim] != members:
            raise ValueError(
                f"Ensemble: input {_name(position)} has size {value.shape[dim]} in its member "
                f"dim {dim} (in_dims={dim}), expected {members}: one slice per member that "
                f"runs. Pass in_dims=None if the input is shared by all members."
            )
        return value if dim == 0 else value.movedim(dim, 0)
    if getattr(type(value), "_is_tensor_collection", False):  # a TensorDict or TensorClass
        return _lead_collection(value, dim, members, position)
    if isinstance(value, (tuple, list, dict)):
        return torch.utils._pytree.tree_map(
            lambda v: lead_input(v, dim, members, position),
            value,
            is_leaf=lambda v: getattr(type(v), "_is_tensor_collection", False),
        )
    return value


def _lead_collection(value: Any, dim: int | None, members: int, position: Any) -> Any:
    # The member dim of a TensorDict is one of its batch dims: expanded or moved as a
    # whole, so that its batch size stays a prefix of every entry's shape.
    if dim is None:
        return value.expand(members, *value.batch_size)
    batch_dims = len(value.batch_size)
    if not -batch_dims <= dim < batch_dims:
        raise ValueError(
            f"Ensemble: input {_name(position)} is a {type(value).__name__} with batch size "
            f"{list(value.batch_size)}, so it has no member dim {dim} (in_dims): the member "
            f"dim must be a batch dim. Pass in_dims=None if it is shared by all members."
        )
    if value.batch_size[dim] != members:
        raise ValueError(
            f"Ensemble: input {_name(position)} has size {value.batch_size[dim]} in its member "
            f"dim {dim} (in_dims={dim}), expected {members}: one slice per member that runs. "
            f"Pass in_dims=None if the input is shared by all members."
        )
    return value if dim in (0, -batch_dims) else value.movedim(dim, 0)


def _name(position: Any) -> str:
    return "" if position is None else (f"{position}" if isinstance(position, int) else position)


def slice_members(value: Any, part: slice) -> Any:
    """``value``'s tensors restricted to the members in ``part`` (member dim first)."""
    return torch.utils._pytree.tree_map(
        lambda v: v[part] if isinstance(v, torch.Tensor) else v, value
    )
