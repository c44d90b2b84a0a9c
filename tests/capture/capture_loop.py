"""The reference for captured steps: one ``torch.optim`` optimizer per member module."""

from __future__ import annotations

import copy

import torch
from torch import nn

MEMBERS, BATCH = 4, 8


def mlp(hidden: int = 16, dropout: float = 0.0) -> nn.Module:
    layers = [nn.Linear(3, hidden), nn.Tanh()]
    if dropout:
        layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers, nn.Linear(hidden, 1))


def members(count: int = MEMBERS, **kwargs) -> list[nn.Module]:
    torch.manual_seed(0)
    return [mlp(**kwargs) for _ in range(count)]


def batches(steps: int, count: int = MEMBERS, seed: int = 1) -> list[tuple]:
    """Per-member batches ``x [N, B, 3]``, ``y [N, B, 1]``."""
    generator = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(count, BATCH, 3, generator=generator),
         torch.randn(count, BATCH, 1, generator=generator))
        for _ in range(steps)
    ]  # fmt: skip


class OptimLoop:
    """N modules, N ``torch.optim`` optimizers: the loop a captured step must equal."""

    def __init__(self, models: list[nn.Module], make_optimizer) -> None:
        self.models = copy.deepcopy(models)
        self.optimizers = [make_optimizer(model.parameters()) for model in self.models]

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One step of every member on its own batch; the members' losses before it."""
        losses = []
        for index, (model, optimizer) in enumerate(zip(self.models, self.optimizers)):
            optimizer.zero_grad()
            loss = ((model(x[index]) - y[index]) ** 2).mean()
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        return torch.stack(losses)

    def stacked(self, key: str) -> torch.Tensor:
        return torch.stack([dict(m.named_parameters())[key].detach() for m in self.models])
