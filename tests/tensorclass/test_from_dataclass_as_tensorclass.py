"""``TensorDict.from_dataclass(..., as_tensorclass=True)``: the conversion of the function
``from_dataclass``, compared with the fields read by hand, with tensordict 0.15.3 run in its
own process, and its errors."""

# The probe below is one script run by both libraries; its lines are long.
# ruff: noqa: E501
from __future__ import annotations

import dataclasses

import pytest
import tensordict_peer
import torch

from tdfunc import TensorClass, TensorDict, is_tensorclass

PROBE = r"""
import dataclasses, torch
from LIB import TensorDict, TensorClass, is_tensorclass
def run(f):
    try: return f()
    except Exception as e: return isinstance(e, TypeError), isinstance(e, RuntimeError)
@dataclasses.dataclass
class Data:
    obs: torch.Tensor
    reward: torch.Tensor
    tag: str = "x"
data = Data(obs=torch.arange(12.0).view(3, 4), reward=torch.ones(3))
for kwargs in ({"batch_size": [3]}, {"auto_batch_size": True}, {"auto_batch_size": True, "batch_dims": 1}, {}, {"device": "cpu"}):
    tc = TensorDict.from_dataclass(data, as_tensorclass=True, **kwargs)
    print(is_tensorclass(tc), list(tc.batch_size), tc.obs.tolist(), tc.reward.tolist(), tc.tag, str(tc.device))
    td = TensorDict.from_dataclass(data, **kwargs)
    print(type(td).__name__, list(td.batch_size))
cls = TensorDict.from_dataclass(Data, as_tensorclass=True)
print(isinstance(cls, type), is_tensorclass(cls), sorted(f.name for f in dataclasses.fields(cls)))
class Dest(TensorClass):
    obs: torch.Tensor
    reward: torch.Tensor
    tag: str
out = TensorDict.from_dataclass(data, as_tensorclass=True, dest_cls=Dest, batch_size=[3])
print(type(out) is Dest, out.obs.shape, out.tag)
print(type(TensorDict.from_dataclass(data, dest_cls=Dest)).__name__)
print(run(lambda: TensorDict.from_dataclass({"a": 1}, as_tensorclass=True)), run(lambda: TensorDict.from_dataclass(data, as_tensorclass=True, batch_size=[4])))
"""


@pytest.mark.slow  # a tensordict process
def test_as_tensorclass_as_tensordict():
    expected, got = tensordict_peer.printed_by_both(PROBE)
    assert got == expected


@dataclasses.dataclass
class _Step:
    obs: torch.Tensor
    reward: torch.Tensor
    info: dict = dataclasses.field(default_factory=dict)


class _Dest(TensorClass):
    obs: torch.Tensor
    reward: torch.Tensor
    info: TensorDict = None


def test_the_fields_are_the_dataclass_s():
    step = _Step(
        obs=torch.randn(4, 2),
        reward=torch.randn(4),
        info={"done": torch.zeros(4, dtype=torch.bool)},
    )
    tc = TensorDict.from_dataclass(step, as_tensorclass=True, auto_batch_size=True)
    assert is_tensorclass(tc) and tc.batch_size == torch.Size([4])
    assert torch.equal(tc.obs, step.obs) and torch.equal(tc.reward, step.reward)
    assert torch.equal(tc.info["done"], step.info["done"])
    out = TensorDict.from_dataclass(step, as_tensorclass=True, dest_cls=_Dest, batch_size=[4])
    assert type(out) is _Dest and torch.equal(out.obs, step.obs)
    # a type gives the TensorClass type; its instances take the same fields
    made = TensorDict.from_dataclass(_Step, as_tensorclass=True)
    assert is_tensorclass(made) and isinstance(made, type)
    assert made(obs=torch.zeros(2), reward=torch.zeros(2), batch_size=[2]).batch_size == torch.Size(
        [2]
    )
    # without the flag, dest_cls is not used: a plain TensorDict, as tensordict documents
    assert type(TensorDict.from_dataclass(step, dest_cls=_Dest)) is TensorDict


def test_a_default_factory_field_keeps_its_factory():
    made = TensorDict.from_dataclass(_Step, as_tensorclass=True)
    first = made(obs=torch.zeros(2), reward=torch.zeros(2), batch_size=[2])
    second = made(obs=torch.zeros(2), reward=torch.zeros(2), batch_size=[2])
    # each instance gets its own value from the factory, as the dataclass's do
    assert first.info == {} and second.info == {} and first.info is not second.info


def test_errors_are_the_function_s():
    step = _Step(obs=torch.randn(4, 2), reward=torch.randn(4))
    with pytest.raises(
        TypeError, match="from_dataclass: expected a dataclass or a dataclass instance"
    ):
        TensorDict.from_dataclass({"obs": 1}, as_tensorclass=True)
    with pytest.raises(Exception, match=r"\[5\]"):
        TensorDict.from_dataclass(step, as_tensorclass=True, batch_size=[5])


def test_a_dest_cls_without_a_field_of_the_dataclass_is_refused():
    # the instance of dest_cls carried the dataclass's extra field as an undeclared entry
    @dataclasses.dataclass
    class Sample:
        obs: torch.Tensor
        step: int

    class ObsOnly(TensorClass):
        obs: torch.Tensor

    sample = Sample(torch.zeros(3), 1)
    with pytest.raises(ValueError, match=r"the entries \['step'\] are not fields of ObsOnly"):
        TensorDict.from_dataclass(sample, as_tensorclass=True, dest_cls=ObsOnly)
    for build in (
        lambda: ObsOnly.from_dict({"obs": torch.zeros(3), "step": torch.ones(3)}),
        lambda: ObsOnly.from_tensordict(TensorDict(obs=torch.zeros(3), step=torch.ones(3))),
    ):
        with pytest.raises(ValueError, match=r"its fields are \['obs'\]"):
            build()

    # the fields it has are read from the dataclass, and a field it lacks gets its default
    class WithExtra(TensorClass):
        obs: torch.Tensor
        step: int
        note: str = "none"

    out = TensorDict.from_dataclass(sample, as_tensorclass=True, dest_cls=WithExtra)
    assert type(out) is WithExtra and out.note == "none"
    assert torch.equal(out.obs, sample.obs) and out.step.item() == 1


@pytest.mark.parametrize("dest_cls", [3, dict, "ObsOnly"])
def test_a_dest_cls_that_is_no_container_class_is_a_type_error(dest_cls):
    @dataclasses.dataclass
    class Sample:
        obs: torch.Tensor

    with pytest.raises(TypeError, match="from_dataclass: dest_cls must be a TensorClass subclass"):
        TensorDict.from_dataclass(Sample(torch.zeros(3)), as_tensorclass=True, dest_cls=dest_cls)
