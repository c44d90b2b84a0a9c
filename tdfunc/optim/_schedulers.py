"""``ReduceLROnPlateau`` per member: one metric per member, each member its own plateau.

``torch.optim.lr_scheduler.ReduceLROnPlateau`` reads one metric and one float
learning rate per group; with a per-member learning rate there is one of each
per member. This scheduler keeps, per member, what torch's keeps per optimizer
(best metric, bad epochs, cooldown), so that it gives every member what N
torch schedulers over N optimizers would give. The schedulers that scale the
learning rate by a factor (``StepLR``, ``MultiStepLR``, ``ExponentialLR``,
``LambdaLR``, ``MultiplicativeLR``, ``CosineAnnealingLR``, ...) work with
per-member learning rates as they are.
"""

from __future__ import annotations

import math
from typing import Any

import torch


class ReduceLROnPlateau:
    """Reduce each member's learning rate when its own metric has stopped improving.

    Arguments as ``torch.optim.lr_scheduler.ReduceLROnPlateau``; every group of
    ``optimizer`` must hold a per-member ``lr`` of shape ``[N]``, and
    ``step(metrics)`` takes one metric per member (a tensor or a sequence of N
    numbers).

    Example:
        >>> import torch
        >>> from tdfunc import optim
        >>> p = torch.nn.Parameter(torch.zeros(2, 3))
        >>> opt = optim.SGD([p], lr=torch.tensor([0.1, 0.1]))
        >>> scheduler = optim.ReduceLROnPlateau(opt, patience=0, factor=0.5)
        >>> scheduler.step(torch.tensor([1.0, 1.0]))
        >>> scheduler.step(torch.tensor([0.5, 2.0]))  # member 1 got worse
        >>> opt.param_groups[0]["lr"]
        PerMember([0.1000, 0.0500])
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        mode: str = "min",
        factor: float = 0.1,
        patience: int = 10,
        threshold: float = 1e-4,
        threshold_mode: str = "rel",
        cooldown: int = 0,
        min_lr: Any = 0.0,
        eps: float = 1e-8,
    ) -> None:
        api = "tdfunc.optim.ReduceLROnPlateau"
        if factor >= 1.0:
            raise ValueError(f"{api}: factor must be < 1.0, got {factor!r}.")
        if mode not in ("min", "max"):
            raise ValueError(f"{api}: mode must be 'min' or 'max', got {mode!r}.")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(
                f"{api}: threshold_mode must be 'rel' or 'abs', got {threshold_mode!r}."
            )
        sizes = set()
        for index, group in enumerate(optimizer.param_groups):
            lr = group["lr"]
            if not isinstance(lr, torch.Tensor) or lr.dim() != 1:
                raise ValueError(
                    f"{api}: param group {index} has lr={lr!r}, not one value per member; this "
                    f"scheduler reduces per-member learning rates (use "
                    f"torch.optim.lr_scheduler.ReduceLROnPlateau for a float lr)."
                )
            sizes.add(lr.shape[0])
        if len(sizes) != 1:
            raise ValueError(
                f"{api}: the groups' per-member lr have different lengths {sorted(sizes)}."
            )
        groups = len(optimizer.param_groups)
        min_lrs = list(min_lr) if isinstance(min_lr, (list, tuple)) else [min_lr] * groups
        if len(min_lrs) != groups:
            raise ValueError(f"{api}: expected {groups} min_lrs, got {len(min_lrs)}.")
        self.optimizer = optimizer
        self.num_members = sizes.pop()
        self.mode, self.factor, self.patience = mode, factor, patience
        self.threshold, self.threshold_mode = threshold, threshold_mode
        self.cooldown, self.min_lrs, self.eps = cooldown, min_lrs, eps
        self.last_epoch = 0
        worse = math.inf if mode == "min" else -math.inf
        self.best = [worse] * self.num_members
        self.num_bad_epochs = [0] * self.num_members
        self.cooldown_counter = [0] * self.num_members

    def _is_better(self, value: float, best: float) -> bool:
        if self.mode == "min":
            bound = (
                best * (1.0 - self.threshold)
                if self.threshold_mode == "rel"
                else best - self.threshold
            )
            return value < bound
        bound = (
            best * (self.threshold + 1.0) if self.threshold_mode == "rel" else best + self.threshold
        )
        return value > bound

    def step(self, metrics: Any) -> None:
        """Record one metric per member; reduce the lr of members on a plateau."""
        values = torch.as_tensor(metrics, dtype=torch.float64).detach().cpu().flatten().tolist()
        if len(values) != self.num_members:
            raise ValueError(
                f"tdfunc.optim.ReduceLROnPlateau.step: expected one metric per member "
                f"({self.num_members}), got {len(values)}."
            )
        self.last_epoch += 1
        reduce = []
        for member, value in enumerate(values):
            if self._is_better(value, self.best[member]):
                self.best[member] = value
                self.num_bad_epochs[member] = 0
            else:
                self.num_bad_epochs[member] += 1
            if self.cooldown_counter[member] > 0:
                self.cooldown_counter[member] -= 1
                self.num_bad_epochs[member] = 0
            if self.num_bad_epochs[member] > self.patience:
                reduce.append(member)
                self.cooldown_counter[member] = self.cooldown
                self.num_bad_epochs[member] = 0
        if reduce:
            self._reduce(reduce)

    def _reduce(self, members: list) -> None:
        for group, min_lr in zip(self.optimizer.param_groups, self.min_lrs):
            lr = group["lr"]
            values = lr.tolist()
            for member in members:
                old = values[member]
                floor = (
                    float(min_lr[member])
                    if isinstance(min_lr, (list, tuple, torch.Tensor))
                    else min_lr
                )
                new = max(old * self.factor, floor)
                if old - new > self.eps:
                    values[member] = new
            lr.fill_(torch.tensor(values, dtype=lr.dtype, device=lr.device))

    def get_last_lr(self) -> list:
        return [group["lr"].detach().clone() for group in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        return {key: value for key, value in self.__dict__.items() if key != "optimizer"}

    def load_state_dict(self, state_dict: dict) -> None:
        self.__dict__.update(state_dict)
