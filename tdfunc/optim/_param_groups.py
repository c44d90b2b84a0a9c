"""The param groups of the stateful optimizers: every door checked, per-member values kept.

A hyperparameter enters a group by the constructor, ``add_param_group``,
``load_state_dict`` (:mod:`._state_dict`), ``group[name] = value`` between steps,
and a scheduler's ``fill_``. The check itself is :func:`~._groups.check_group`;
this mixin decides when it runs: on every door, and again at a step for a group
whose values were replaced (identity, a few comparisons per step).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from .._core.helpers.tracing import compiling as _is_compiling
from ._groups import PerMember, check_group


class ParamGroups:
    """The ``param_groups`` of a :class:`torch.optim.Optimizer`, checked at every door."""

    # group keys that may hold per-member tensors -> their range kind (a tuple for betas)
    _hypers: dict[str, Any] = {}
    # group keys that must be Python numbers
    _numbers: tuple[str, ...] = ()
    # group keys that are switches (bools, False where missing)
    _flags: tuple[str, ...] = ()
    _checked: list

    @property
    def param_groups(self) -> list:  # type: ignore[override]
        """The groups; a plain per-member tensor written into one is checked and kept here.

        ``torch.optim.lr_scheduler`` reads the groups through this attribute and
        writes a tensor hyperparameter with ``fill_``, which only a kept
        :class:`PerMember` accepts per member: a value written between steps is
        checked and kept before anyone reads it.
        """
        attributes = self.__dict__
        if "param_groups" in attributes:  # restored by torch.optim's __setstate__
            attributes["_groups"] = attributes.pop("param_groups")
        groups = attributes["_groups"]
        if not _is_compiling():
            for group in groups:
                for name in self._hypers:
                    value = group.get(name)
                    if isinstance(value, torch.Tensor) and not isinstance(value, PerMember):
                        # a bad value is refused by the next step; the groups stay readable
                        with contextlib.suppress(TypeError, ValueError):
                            check_group(
                                type(self).__name__, group, self._hypers, self._numbers, self._flags
                            )
                        break
        return groups

    @param_groups.setter
    def param_groups(self, groups: list) -> None:
        self.__dict__["_groups"] = groups

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        group.setdefault("member_dim", True)
        try:
            check_group(type(self).__name__, group, self._hypers, self._numbers, self._flags)
        except (TypeError, ValueError):
            # a refused group leaves the optimizer as it was (torch.optim appended it)
            self.param_groups.pop()
            raise
        # resolved now, eagerly: a compiled step then finds them ready
        self._checked = []
        self._resolved()

    def _resolved(self) -> list[tuple[dict, dict]]:
        """``(group, plan)`` per group: its hyperparameters for the rules, checked again
        where one was replaced, with what they decide made once (:meth:`_plan`).

        ``group["lr"] = value`` between steps is a door too (the group is the plain
        dict that ``torch.optim`` and ``torch.compile`` expect, so it cannot check
        writes itself). A group is checked again, and its plan made again, when any of
        its values is new (identity for tensors, value and type for numbers and flags):
        the plan is keyed on every value of the group, a few comparisons per step.
        Per-member tensors are handed to the rules as plain tensors sharing the kept
        :class:`PerMember`'s memory (a scheduler's ``fill_`` reaches them):
        ``torch.compile`` traces plain tensors.
        """
        # torch.optim's __getstate__ leaves it out of copies and pickles: made again here
        checked = self.__dict__.setdefault("_checked", [])
        groups = self.param_groups
        if len(checked) != len(groups):
            checked[:] = [None] * len(groups)
        out = []
        for index, group in enumerate(groups):
            seen = checked[index]
            if seen is None or seen[0] is not group or not _same_values(seen[1], group):
                check_group(
                    f"{type(self).__name__}.step", group, self._hypers, self._numbers, self._flags
                )
                seen = checked[index] = (group, dict(group), self._plan(_plain_views(group)))
            out.append((group, seen[2]))
        return out

    def _plan(self, views: dict) -> dict:
        """What a step reads of a group (``views``: its values, params left out).

        Subclasses add what the values decide (the stages to run, derived names),
        so that a step looks nothing up that its group has not changed.
        """
        return views


def _same_values(seen: dict, group: dict) -> bool:
    """``group`` holds what ``seen`` recorded: the same tensors, equal numbers and flags.

    Keys added since are not read by the rules (``torch.compile`` adds
    ``capturable`` to the groups of an optimizer whose step it traces).
    """
    if _is_compiling():  # traced once per guard set: the plain comparison, which dynamo follows
        for key, value in seen.items():
            if key not in group or not _same(value, group[key]):
                return False
        return True
    for key, value in seen.items():
        current = group.get(key, _MISSING)
        # identity first: the common case, and all a step costs when nothing changed
        if current is not value and (current is _MISSING or not _same(value, current)):
            return False
    return True


_MISSING = object()


def _same(left: Any, right: Any) -> bool:
    if isinstance(left, PerMember) and isinstance(right, PerMember):
        serial = getattr(left, "serial", None)
        return serial is not None and serial == getattr(right, "serial", None)
    if isinstance(left, torch.Tensor) or isinstance(right, torch.Tensor):
        return left is right
    if isinstance(left, (tuple, list)) and isinstance(right, (tuple, list)):
        return len(left) == len(right) and all(map(_same, left, right))
    # numbers by value and type (True == 1 == 1.0); equal numbers give equal steps
    return type(left) is type(right) and left == right


def _plain_views(group: dict) -> dict:
    """The group without its params, per-member tensors as plain tensors on their memory."""
    out = {}
    for key, value in group.items():
        if key == "params":
            continue
        if isinstance(value, tuple):
            value = tuple(_plain_view(v) for v in value)
        out[key] = _plain_view(value)
    return out


def _plain_view(value: Any) -> Any:
    if isinstance(value, PerMember):
        return value.as_subclass(torch.Tensor)
    return value
