"""``state_dict`` and ``load_state_dict`` of the stateful optimizers.

A state dict saved by ``torch.optim`` (or by another class of ``tdfunc.optim``)
loads only if it describes the same update: its groups are checked against the
parameters they will drive before anything is loaded. As in ``torch.optim``, the
saved groups' options (``maximize``, ``amsgrad``) replace the optimizer's own.
"""

from __future__ import annotations

from typing import Any

from ._groups import check_group, plain


class StateDict:
    """State dicts with plain tensors, and loads checked before they change anything."""

    _hypers: dict[str, Any]
    _numbers: tuple[str, ...]
    _flags: tuple[str, ...]
    _checked: list

    def state_dict(self) -> dict[str, Any]:
        packed = super().state_dict()
        for group in packed["param_groups"]:
            for name in self._hypers:
                group[name] = plain(group[name])
        return packed

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        api = f"{type(self).__name__}.load_state_dict"
        saved_groups = state_dict.get("param_groups", ())
        for saved, group in zip(saved_groups, self.param_groups):
            self._check_loaded_group(saved)
            # checked against the parameters it will drive, before anything is loaded
            trial = {**saved, "params": group["params"]}
            trial.setdefault("member_dim", group.get("member_dim", True))
            check_group(api, trial, self._hypers, self._numbers, self._flags)
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            group.setdefault("member_dim", True)
            check_group(api, group, self._hypers, self._numbers, self._flags)
        self._checked = []
        self._resolved()

    def _check_loaded_group(self, group: dict) -> None:
        """Refuse a saved group that describes another update (none by default)."""
