"""The tensor-like surface on TensorClass: one implementation (``TensorLikeMixin``).

TensorClass gets these methods because it derives from the same mixins as TensorDict
(``tdfunc._core.ops.TensorOps``).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tdfunc import TensorClass, TensorDict
from tdfunc._core.tensor_like import TensorLikeMixin


def test_tensorclass_derives_from_the_shared_mixin():
    assert issubclass(TensorClass, TensorLikeMixin) and issubclass(TensorDict, TensorLikeMixin)


class Batch(TensorClass):
    x: torch.Tensor
    y: torch.Tensor


class Frozen(TensorClass["frozen"]):
    x: torch.Tensor
    y: torch.Tensor


def _pair(cls=Batch):
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(3, 4, 2, generator=g), torch.rand(3, 4, generator=g)
    return cls(x, y, batch_size=[3, 4]), TensorDict({"x": x, "y": y}, [3, 4])


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.sum(),
        lambda c: c.mean(0),
        lambda c: c.std(1, keepdim=True),
        lambda c: c.amax("feature"),
        lambda c: c.cumsum(1),
        lambda c: c.softmax(0),
        lambda c: c.exp(),
        lambda c: c.clamp(0.2, 0.4),
        lambda c: c.isnan(),
        lambda c: c.flip(1),
        lambda c: c.roll(1, 0),
        lambda c: c.tile(2),
        lambda c: c.pad([1, 0]),
        lambda c: c.where(torch.ones(3, 4, dtype=torch.bool), 0.0),
        lambda c: c.masked_fill(torch.ones(3, dtype=torch.bool), 0.0),
        lambda c: c.gather(1, torch.zeros(3, 2, dtype=torch.long)),
        lambda c: c.norm(),
        lambda c: torch.mean(c, 0),
        lambda c: c.new_zeros(2),
        lambda c: c.consolidate(),
    ],
)
def test_same_result_as_a_tensordict_and_same_class(call):
    instance, td = _pair()
    got, want = call(instance), call(td)
    assert type(got) is Batch
    assert got.batch_size == want.batch_size
    for key in ("x", "y"):
        torch.testing.assert_close(getattr(got, key), want[key])


def test_frozen_refuses_in_place_but_computes_out_of_place():
    frozen, td = _pair(Frozen)
    for call in (lambda c: c.exp_(), lambda c: c.clamp_(0, 1), lambda c: c.set_at_("x", 0.0, 0)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            call(frozen)
    torch.testing.assert_close(frozen.exp().x, td["x"].exp())
    assert type(frozen.sum(0)) is Frozen
