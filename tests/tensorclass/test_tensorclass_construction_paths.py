"""Every way of building an instance gives what the constructor gives.

``dataclasses.replace``, ``from_tensordict``, ``from_dict`` and the constructor with
``names=`` are checked against a plain dataclass (or the constructor itself) holding
the same values.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tdfunc import TensorClass, TensorDict


class Frozen(TensorClass["frozen"]):
    x: torch.Tensor
    label: str = "a"


class Plain(TensorClass):
    x: torch.Tensor
    label: str = "a"


@pytest.mark.parametrize("cls", [Plain, Frozen])
def test_names_in_the_constructor(cls):
    obj = cls(torch.zeros(2, 3), batch_size=[2], names=["b"])
    assert obj.names == ["b"]
    assert obj.batch_size == torch.Size([2])


@pytest.mark.parametrize("cls", [Plain, Frozen])
def test_dataclasses_replace_keeps_batch_size_device_and_names(cls):
    obj = cls(torch.zeros(2, 3), batch_size=[2], device="cpu", names=["b"])
    out = dataclasses.replace(obj, label="b")
    assert type(out) is cls
    assert out.batch_size == obj.batch_size
    assert out.device == obj.device
    assert out.names == ["b"]
    assert out.label == "b" and obj.label == "a"
    assert out.x is obj.x
    # the keywords are not fields: a dataclass of the same fields lists the same
    assert [f.name for f in dataclasses.fields(obj)] == ["x", "label"]
    assert dataclasses.asdict(obj).keys() == {"x", "label"}


class Auto(TensorClass["autocast"]):
    x: torch.Tensor
    n: int = 3


class Inner(TensorClass["autocast"]):
    a: torch.Tensor


class Outer(TensorClass["autocast"]):
    inner: Inner


def test_autocast_from_tensordict_casts_like_the_constructor():
    td = TensorDict(x=torch.zeros(()), n=4)
    built = Auto(torch.zeros(()), n=torch.tensor(4))
    wrapped = Auto.from_tensordict(td)
    assert type(built.n) is int and built.n == 4
    assert type(wrapped.n) is int and wrapped.n == 4
    outer = Outer.from_tensordict(TensorDict(inner=TensorDict(a=torch.ones(2))))
    assert type(outer.inner) is Inner
    assert torch.equal(outer.inner.a, torch.ones(2))


class Default(TensorClass):
    x: torch.Tensor
    n: int = 3


class NoCast(TensorClass["nocast"]):
    x: torch.Tensor
    n: int = 3
    s: str | None = None


@pytest.mark.parametrize("cls", [Plain, Default, Auto, NoCast])
def test_from_dict_casts_like_the_constructor(cls):
    fields = {f.name for f in dataclasses.fields(cls)}
    values = {"x": torch.zeros(2, 3), "n": 4, "label": "q", "s": "t"}
    values = {k: v for k, v in values.items() if k in fields}
    for size in ([2], []):
        built = cls(**values, batch_size=size)
        loaded = cls.from_dict(values, batch_size=size)
        for name in fields:
            got, want = getattr(loaded, name), getattr(built, name)
            assert type(got) is type(want), name
            if isinstance(want, torch.Tensor):
                assert torch.equal(got, want)
            else:
                assert got == want


class Normalised(TensorClass):
    x: torch.Tensor
    y: torch.Tensor | None = None

    def __post_init__(self):
        if (self.x < 0).any():
            raise ValueError("x must be non-negative")
        if self.y is None:
            self.y = self.x * 2


def test_post_init_runs_on_every_construction_path():
    x = torch.arange(3.0)
    for obj in (
        Normalised(x),
        Normalised.from_tensordict(TensorDict(x=x)),
        Normalised.from_dict({"x": x}),
    ):
        assert torch.equal(obj.y, x * 2)
    with pytest.raises(ValueError, match="non-negative"):
        Normalised.from_tensordict(TensorDict(x=-x - 1))
    with pytest.raises(ValueError, match="non-negative"):
        Normalised.from_dict({"x": -x - 1})


class TensorOnly(TensorClass["tensor_only"]):
    x: torch.Tensor
    opt: torch.Tensor | None = None


@pytest.mark.parametrize("cls", [TensorOnly, Plain, Auto, NoCast])
def test_from_tensordict_of_to_tensordict_keeps_unset_fields_unset(cls):
    obj = cls(torch.zeros(2, 3), batch_size=[2])
    unset = [f.name for f in dataclasses.fields(cls) if getattr(obj, f.name) is None]
    td = obj.to_tensordict()  # keeps the unset fields as None
    assert all(name in td for name in unset)
    back = cls.from_tensordict(td)
    for name in unset:
        assert getattr(back, name) is None
        assert name not in back.keys()  # noqa: SIM118 (the keys, not the fields)
    assert torch.equal(back.x, obj.x)


class FrozenDerived(TensorClass["frozen"]):
    x: torch.Tensor
    twice: torch.Tensor | None = None

    def __post_init__(self):
        if self.twice is None:
            object.__setattr__(self, "twice", self.x * 2)


@dataclasses.dataclass(frozen=True)
class FrozenDerivedReference:
    x: torch.Tensor
    twice: torch.Tensor | None = None

    def __post_init__(self):
        if self.twice is None:
            object.__setattr__(self, "twice", self.x * 2)


def test_frozen_post_init_sets_a_field_with_object_setattr_as_a_frozen_dataclass():
    x = torch.arange(3.0)
    want = FrozenDerivedReference(x).twice
    for obj in (FrozenDerived(x), FrozenDerived.from_tensordict(TensorDict(x=x))):
        assert torch.equal(obj.twice, want)
        # once built, every way of writing refuses
        for write in (
            lambda o: object.__setattr__(o, "twice", x),
            lambda o: object.__setattr__(o, "twice", None),
            lambda o: setattr(o, "twice", x),
            lambda o: o.set("twice", x),
        ):
            with pytest.raises(dataclasses.FrozenInstanceError):
                write(obj)
        assert torch.equal(obj.twice, want)


def test_frozen_post_init_plain_assignment_refuses_with_the_idiom_in_the_message():
    class Doubling(TensorClass["frozen"]):
        x: torch.Tensor

        def __post_init__(self):
            self.x = self.x * 2

    with pytest.raises(dataclasses.FrozenInstanceError, match=r"object\.__setattr__"):
        Doubling(torch.ones(2))


@pytest.mark.parametrize("cls", [Default, Auto, NoCast])
def test_from_dict_auto_batch_size_infers_from_what_the_constructor_stores(cls):
    values = {"x": torch.zeros(2, 3), "n": 4}
    want = cls(**values).auto_batch_size_()  # built with batch [], then inferred
    got = cls.from_dict(values, auto_batch_size=True)
    assert got.batch_size == want.batch_size
    assert type(got.n) is type(want.n)
    assert (torch.equal(got.n, want.n)) if isinstance(want.n, torch.Tensor) else got.n == want.n
