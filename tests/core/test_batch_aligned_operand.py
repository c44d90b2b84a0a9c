"""A tensor operand whose shape fits the batch size, against leaves with more dims.

tensordict aligns such a tensor with the batch dims; torch broadcasting aligns it with a
leaf's last dims. Where a leaf has dims beyond the batch size the two readings give
different numbers (or one fails), so every door refuses with a message that names both
ways to say which one is meant. References are computed on plain tensors.
"""

from __future__ import annotations

import operator

import pytest
import tensordict_peer
import torch
import torch._dynamo.testing

from tdfunc import TensorClass, TensorDict


def make():
    generator = torch.Generator().manual_seed(0)
    return TensorDict(
        a=torch.randn(3, 4, generator=generator),
        n={"b": torch.randn(3, 4, 4, generator=generator)},
        batch_size=[3, 4],
    )


AMBIGUOUS = [(4,), (1, 4), (3, 1), (3, 4)]


@pytest.mark.parametrize("shape", AMBIGUOUS)
@pytest.mark.parametrize(
    "door",
    [
        lambda td, w: td * w,
        lambda td, w: w + td,
        lambda td, w: td == w,
        lambda td, w: td.maximum(w),
        lambda td, w: torch.mul(td, w),
        lambda td, w: td.mul_(w),
        lambda td, w: operator.isub(td, w),
        lambda td, w: td.lerp(td * 0, w),
        lambda td, w: td.lerp_(td * 0, w),
        lambda td, w: td.clamp(min=w),
        lambda td, w: td.clamp_(max=w),
        lambda td, w: td.clamp_min_(w),
    ],
    ids=[
        "mul",
        "radd",
        "eq",
        "maximum",
        "torch.mul",
        "mul_",
        "isub",
        "lerp",
        "lerp_",
        "clamp",
        "clamp_",
        "clamp_min_",
    ],
)
def test_every_door_refuses_the_ambiguous_reading(shape, door):
    td = make()
    before = td.clone()
    w = torch.arange(1.0, 1 + torch.Size(shape).numel()).reshape(shape)
    with pytest.raises(ValueError) as caught:
        door(td, w)
    message = str(caught.value)
    assert f"of shape {list(shape)} fits the batch size [3, 4]" in message
    assert "('n', 'b') of shape [3, 4, 4]" in message
    assert "w.reshape(*w.shape, *[1] * (x.ndim - td.batch_dims))" in message
    assert (td == before).all()  # an in-place door wrote nothing


def batch_reading(td, w):
    return td.apply(lambda x: x * w.reshape(*w.shape, *[1] * (x.ndim - td.batch_dims)))


@pytest.mark.parametrize("shape", AMBIGUOUS)
def test_both_readings_can_be_asked_for_as_the_error_says(shape):
    td = make()
    w = torch.arange(1.0, 1 + torch.Size(shape).numel()).reshape(shape)
    a, b = td["a"], td["n", "b"]
    by_batch = batch_reading(td, w)
    assert torch.equal(by_batch["a"], a * w)
    assert torch.equal(by_batch["n", "b"], b * w.unsqueeze(-1))
    if shape in ((4,), (1, 4)):  # torch's reading fits every leaf only for these
        by_torch = td.apply(lambda x: x * w)
        assert torch.equal(by_torch["n", "b"], b * w)


@pytest.mark.parametrize(
    ("td", "w"),
    [
        (TensorDict(a=torch.ones(3, 4), b=torch.ones(3, 4), batch_size=[3, 4]), torch.arange(4.0)),
        (TensorDict(a=torch.ones(3, 5), batch_size=[3]), torch.arange(5.0)),  # features only
        (TensorDict(a=torch.ones(3, 4, 2), batch_size=[3, 4]), torch.full((1, 1), 2.0)),
        (TensorDict(a=torch.ones(4, 4), batch_size=[]), torch.arange(4.0)),
    ],
    ids=["leaves-are-the-batch", "fits-the-features", "one-element", "no-batch-dims"],
)
def test_operands_with_one_reading_still_broadcast_as_torch_does(td, w):
    for op in (operator.mul, operator.add, operator.lt):
        out = op(td, w)
        for key in td.keys():  # noqa: SIM118 (iterating a TensorDict walks its batch dim)
            assert torch.equal(out[key], op(td[key], w))


def test_a_tensorclass_refuses_too():
    class Pair(TensorClass):
        x: torch.Tensor
        y: torch.Tensor

    pair = Pair(x=torch.ones(2, 3), y=torch.ones(2, 3, 3), batch_size=[2, 3])
    with pytest.raises(ValueError, match=r"Pair.__mul__: .* the leaf 'y' of shape \[2, 3, 3\]"):
        pair * torch.arange(3.0)


PROBE = """
import torch
from LIB import TensorDict
td = TensorDict(a=torch.arange(12.).reshape(3, 4), b=torch.arange(48.).reshape(3, 4, 4),
                batch_size=[3, 4])
w = torch.tensor([1.0, -2.0, 3.0, 0.5])
out = td.apply(lambda x: x * w.reshape(*w.shape, *[1] * (x.ndim - td.batch_dims)))
if "LIB" == "tensordict":  # what tensordict computes for td * w
    assert (out == td * w).all()
print(out["a"].tolist(), out["b"].sum(-1).tolist())
print((td * torch.tensor([2.0]))["b"].sum().item())
"""


def test_the_batch_reading_the_error_names_is_what_tensordict_computes():
    theirs, mine = tensordict_peer.printed_by_both(PROBE)
    assert mine == theirs


def test_the_check_compiles_without_a_graph_break_and_vmap_sees_per_member_leaves():
    td = TensorDict(a=torch.ones(3, 4, 5), b=torch.ones(3, 4, 5), batch_size=[3, 4])
    w = torch.arange(5.0)

    def step(td, w):
        return td.mul(w).add(1.0).clamp(min=0.5)

    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(step, backend=counter, fullgraph=True)
    for _ in range(3):
        out = compiled(td, w)
    assert counter.frame_count == 1
    assert torch.equal(out["b"], torch.ones(3, 4, 5).mul(w).add(1.0).clamp(min=0.5))
    # inside vmap each member's container has no batch dims: one learning rate per member
    params = TensorDict(w=torch.ones(4, 3, 3), batch_size=[4])
    lrs = torch.tensor([1.0, 2.0, 3.0, 4.0])
    scaled = torch.func.vmap(lambda p, lr: p.mul(lr))(params, lrs)
    assert torch.equal(scaled["w"], torch.ones(4, 3, 3) * lrs[:, None, None])
