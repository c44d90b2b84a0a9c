"""A subclass that turns a flag on is checked against the fields it inherits."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tdfunc import TensorClass, TensorDict


class Labelled(TensorClass):
    x: torch.Tensor
    label: str = "lab"


def test_tensor_only_subclass_of_a_non_tensor_field_is_refused_at_definition():
    with pytest.raises(TypeError, match=r"'label' \(inherited from Labelled\)"):

        class Fast(Labelled, tensor_only=True):
            y: torch.Tensor | None = None


def test_tensor_only_subclass_of_tensor_fields_is_accepted():
    class Pair(TensorClass):
        a: torch.Tensor
        b: int = 0

    class FastPair(Pair, tensor_only=True):
        pass

    obj = FastPair(torch.ones(2))
    assert torch.equal(obj.a, torch.ones(2))
    assert torch.equal(obj.b, torch.tensor(0))  # tensor_only stores the number as a tensor


class Scaled(TensorClass):
    x: torch.Tensor
    scale: dataclasses.InitVar[float] = 1.0

    def __post_init__(self, scale):
        self.x = self.x * scale


@dataclasses.dataclass
class ScaledReference:
    x: torch.Tensor
    scale: dataclasses.InitVar[float] = 1.0

    def __post_init__(self, scale):
        self.x = self.x * scale


def test_init_var_reaches_post_init_as_in_a_dataclass():
    for args, kwargs in [
        ((torch.ones(2),), {}),
        ((torch.ones(2), 3.0), {}),
        ((), {"x": torch.ones(2), "scale": 2.0}),
    ]:
        assert torch.equal(Scaled(*args, **kwargs).x, ScaledReference(*args, **kwargs).x)
    assert [f.name for f in dataclasses.fields(Scaled)] == ["x"]
    assert list(Scaled(torch.ones(2), 3.0).keys()) == ["x"]
    # other construction paths pass the default
    assert torch.equal(Scaled.from_tensordict(TensorDict(x=torch.ones(2))).x, torch.ones(2))


def test_init_var_without_default_in_from_tensordict_is_a_clear_error():
    class Needs(TensorClass):
        x: torch.Tensor
        scale: dataclasses.InitVar[float]

        def __post_init__(self, scale):
            self.x = self.x * scale

    assert torch.equal(Needs(torch.ones(2), 2.0).x, torch.full((2,), 2.0))
    with pytest.raises(TypeError, match="InitVars \\['scale'\\]"):
        Needs.from_tensordict(TensorDict(x=torch.ones(2)))


def test_init_var_order_follows_declaration():
    class Mixed(TensorClass):
        a: torch.Tensor
        k: dataclasses.InitVar[int]
        b: torch.Tensor

        def __post_init__(self, k):
            self.b = self.b + k

    @dataclasses.dataclass
    class MixedReference:
        a: torch.Tensor
        k: dataclasses.InitVar[int]
        b: torch.Tensor

        def __post_init__(self, k):
            self.b = self.b + k

    got = Mixed(torch.zeros(1), 5, torch.ones(1))
    want = MixedReference(torch.zeros(1), 5, torch.ones(1))
    assert torch.equal(got.a, want.a) and torch.equal(got.b, want.b)


class FastPoint(TensorClass["tensor_only"]):
    x: torch.Tensor


def test_tensor_only_casts_a_list_of_numbers_as_torch_does():
    for value in ([1.0, 2.0], (1, 2), [[1, 2], [3, 4]]):
        want = torch.as_tensor(value)
        got = FastPoint(x=value, batch_size=[2]).x
        assert got.dtype == want.dtype and torch.equal(got, want)
        obj = FastPoint(x=torch.zeros_like(want), batch_size=[2])
        obj.x = value
        assert torch.equal(obj.x, want)
    with pytest.raises(TypeError, match="tensor_only"):
        FastPoint(x=["a", "b"])
