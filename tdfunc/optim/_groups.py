"""Param groups of the stateful optimizers: hyperparameters checked at every door.

A hyperparameter enters a group by the constructor, by ``add_param_group``, by
``load_state_dict``, by ``group[name] = value`` between steps and by a
scheduler's ``fill_``. :func:`check_group` is the one check for all of them:
Python numbers by range (:data:`~._hyper.RANGES`, as ``torch.optim``), a tensor
by dtype and shape: ``[]``, or ``[N]`` with one value per member along dim 0 of
every parameter of the group. A group declares whether its parameters carry
that member dim (``"member_dim"``, default ``True``): an ensemble's shared
tensors do not, and a per-member value is refused for them whatever their size.

Tensor hyperparameters are stored as :class:`PerMember`: the schedulers of
``torch.optim.lr_scheduler`` write new values with ``group["lr"].fill_(new)``,
which a plain tensor refuses for more than one value.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from .._core.helpers.tracing import compiling, cuda_capturing
from .._ensemble.shared import is_shared
from . import _hyper as H


class PerMember(torch.Tensor):
    """A plain tensor whose ``fill_`` also accepts a tensor of the same shape.

    Operations on it return plain tensors; ``state_dict()`` stores plain tensors.
    """

    __torch_function__ = torch._C._disabled_torch_function_impl

    def fill_(self, value):  # type: ignore[override]
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            if value.shape != self.shape:
                raise ValueError(
                    f"tdfunc.optim: a per-member hyperparameter of shape {list(self.shape)} "
                    f"was written with a tensor of shape {list(value.shape)}; a scheduler "
                    f"must give one value per member."
                )
            with torch.no_grad():
                return self.copy_(value)
        return super().fill_(value)

    def __deepcopy__(self, memo: dict) -> PerMember:
        return per_member(self.as_subclass(torch.Tensor))

    def __reduce_ex__(self, protocol):
        # pickled as a fresh kept value (its serial names this object only)
        return (per_member, (self.as_subclass(torch.Tensor).detach().clone(),))

    def __float__(self) -> float:
        if self.numel() != 1:
            raise TypeError(
                f"tdfunc.optim: a per-member hyperparameter (shape {list(self.shape)}) has no "
                f"single float value. torch.optim.lr_scheduler.ReduceLROnPlateau reads one: "
                f"use tdfunc.optim.ReduceLROnPlateau (one metric per member) instead."
            )
        return super().__float__()


_serials = itertools.count()


def per_member(value: torch.Tensor) -> PerMember:
    # each group its own copy: a scheduler writes into it in place
    kept = torch.Tensor._make_subclass(PerMember, value.detach().clone())
    # names this object for the optimizer's check of replaced values: under
    # torch.compile, ``is`` between two reads of a tensor subclass is not traced
    kept.serial = next(_serials)
    return kept


def plain(value: Any) -> Any:
    """``value`` as saved in a state dict: tensors plain, detached copies."""
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if isinstance(value, torch.Tensor):
        return value.as_subclass(torch.Tensor).detach().clone()
    return value


def check_group(
    api: str, group: dict, names: dict[str, str | tuple], numbers: tuple, flags: tuple = ()
) -> None:
    """Check every hyperparameter of ``group`` and store it in its kept form, in place.

    ``names`` maps the group keys that may hold tensors to their range kind (a
    tuple of kinds for a tuple such as ``betas``); ``numbers`` are the keys that
    must be Python numbers; ``flags`` the switches (``maximize``, ``amsgrad``), bools
    that default to ``False`` where a group lacks them (a state dict saved before
    the switch existed, as ``torch.optim`` loads one).
    """
    for name in flags:
        H.check_flag(api, name, group.setdefault(name, False))
    for name in numbers:
        value = group[name]
        if isinstance(value, torch.Tensor):
            raise TypeError(f"{api}: {name} must be a float, got a tensor.")
        _store(group, name, H.check(api, name, value))
    for name, kind in names.items():
        value = group[name]
        if isinstance(kind, tuple):
            if not isinstance(value, (tuple, list)) or len(value) != len(kind):
                what = "a pair (beta1, beta2)" if len(kind) == 2 else f"{len(kind)} values"
                raise TypeError(f"{api}: {name} must be {what}, got {value!r}.")
            checked = tuple(
                _checked(api, f"{name}[{i}]", k, v, group)
                for i, (v, k) in enumerate(zip(value, kind))
            )
            _store(group, name, checked)
        else:
            _store(group, name, _checked(api, name, kind, value, group))


def _store(group: dict, name: str, value: Any) -> None:
    group[name] = value


def _checked(api: str, name: str, kind: str, value: Any, group: dict) -> Any:
    value = H.check(api, name, value, kind)
    if not isinstance(value, torch.Tensor):
        return value
    if value.dim() > 1:
        raise ValueError(
            f"{api}: a tensor {name} must have shape [N] (one value per member) or [], "
            f"got shape {list(value.shape)}."
        )
    if value.dim() == 1:
        if not group.get("member_dim", True):
            raise ValueError(
                f"{api}: {name} holds one value per member (shape {list(value.shape)}), but "
                f"this group's parameters are declared without a member dim (member_dim=False: "
                f"tensors an ensemble keeps shared); give that group a float {name}."
            )
        for param in group["params"]:
            if is_shared(param):
                raise ValueError(
                    f"{api}: {name} holds one value per member (shape {list(value.shape)}), but "
                    f"the group holds a tensor an Ensemble keeps shared (shape "
                    f"{list(param.shape)}: it has no member dim, whatever its size). Put the "
                    f"shared tensors in a group of their own with member_dim=False and a float "
                    f"{name} (passing the Ensemble itself makes that split)."
                )
            if param.dim() == 0 or param.shape[0] != value.shape[0]:
                raise ValueError(
                    f"{api}: {name} has {value.shape[0]} values, but a parameter of the group "
                    f"has shape {list(param.shape)}: a per-member {name} needs one value per "
                    f"member along dim 0 of every parameter."
                )
    return per_member(value)


def member_rows(api: str, members: Any, count: int) -> torch.Tensor:
    """``members`` (indices, a slice, a bool mask or ``ens[...]``) as distinct row indices."""
    if isinstance(members, slice):
        members = list(range(*members.indices(count)))
    elif isinstance(getattr(members, "indices", None), list):  # ensemble[...]
        members = members.indices
    if isinstance(members, int) and not isinstance(members, bool):
        members = [members]
    given_as_tensor = isinstance(members, torch.Tensor)
    try:
        rows = torch.as_tensor(members)
    except (TypeError, RuntimeError, ValueError):
        rows = torch.zeros(1)  # refused below, with the message
    if rows.dtype == torch.bool:
        if rows.shape != (count,):
            raise ValueError(
                f"{api}: a member mask must have shape [{count}], got {list(rows.shape)}."
            )
        rows = rows.nonzero().flatten()
    if rows.dim() != 1 or rows.is_floating_point() or rows.is_complex():
        raise TypeError(f"{api}: members must be member indices or a bool mask, got {members!r}.")
    rows = rows.long()
    if given_as_tensor and _values_unreadable():
        raise TypeError(
            f"{api}: members given as a tensor of indices cannot be checked (range, repeats) "
            f"inside torch.compile or a CUDA graph capture: reading them is a device sync and "
            f"a graph break. Give a bool mask (functional update) or Python ints."
        )
    # checked as Python numbers: Python indices are never read back from a tensor
    python = isinstance(members, (list, tuple)) and all(
        isinstance(value, int) and not isinstance(value, bool) for value in members
    )
    values = list(members) if python else rows.tolist()
    if any(not -count <= value < count for value in values):
        raise IndexError(f"{api}: members {values} out of range for {count} members.")
    values = [value % count for value in values]
    if len(set(values)) != len(values):
        raise ValueError(
            f"{api}: members {values} repeat a member, which would step twice; "
            f"give each member once."
        )
    return rows % count


def _values_unreadable() -> bool:
    return compiling() or cuda_capturing()
