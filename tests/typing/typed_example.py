"""A typed use of TensorClass, checked by mypy and pyright.

The check runs in ``tests/tensorclass/test_tensorclass_typing.py``.

mypy needs the plugin ``tdfunc.mypy_plugin`` for the bracket form
``TensorClass["frozen"]``; pyright understands it through ``__class_getitem__``.
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import assert_type

import tdfunc
from tdfunc import TensorClass


class Batch(TensorClass["frozen"]):
    obs: torch.Tensor
    reward: torch.Tensor
    label: str = "train"


class Flags(TensorClass["nocast", "frozen"]):
    integer: int


class Casting(TensorClass, autocast=True):
    count: int
    extra: Any = None


class Qualified(tdfunc.TensorClass["autocast"]):
    x: torch.Tensor


class Mutable(TensorClass):
    x: torch.Tensor


def mean_reward(batch: Batch) -> torch.Tensor:
    return batch.reward.mean()


batch = Batch(torch.zeros(4, 3), torch.ones(4), batch_size=[4], device="cpu")
assert_type(batch.obs, torch.Tensor)
assert_type(batch.label, str)
assert_type(batch[0], Batch)
assert_type(batch[1:], Batch)
assert_type(batch[batch.reward > 0], Batch)
assert_type(batch["obs"], Any)
assert_type(batch.reshape(2, 2), Batch)
assert_type(batch.unbind(0), tuple[Batch, ...])
assert_type(batch.batch_size, torch.Size)
assert_type(batch.device, torch.device | None)
assert_type(batch.to(torch.float64), Batch)
assert_type(batch.apply(lambda t: t * 2), Batch)
assert_type(batch.clone(), Batch)
assert_type(batch == batch, Batch)
assert_type(batch + 1, Batch)
assert_type(batch.to_tensordict(), tdfunc.TensorDict)
assert_type(Batch.from_tensordict(batch.to_tensordict()), Batch)
assert_type(Flags(integer=1).integer, int)
assert_type(Casting(count=3).count, int)
assert_type(Qualified(x=torch.zeros(2)).x, torch.Tensor)
reward: torch.Tensor = mean_reward(batch)
mutable = Mutable(torch.zeros(2), batch_size=[2])
mutable.x = torch.ones(2)
ensemble = tdfunc.Ensemble(torch.nn.Linear(3, 1), num_members=2)
assert_type(ensemble(torch.zeros(4, 3)), torch.Tensor)
assert_type(ensemble(torch.zeros(2, 4, 3), in_dims=0), torch.Tensor)
assert_type(ensemble.forward(torch.zeros(4, 3)), torch.Tensor)


class ReadOnly(TensorClass, frozen=True):  # the class keyword: read-only for pyright too
    x: torch.Tensor
