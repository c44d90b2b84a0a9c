"""TensorClass: class creation, flags, fields, the constructor, casting and printing."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from typing import Any, ClassVar, Optional

import numpy as np
import pytest
import torch

from tdfunc import NonTensorData, TensorClass, TensorDict, is_tensorclass, tensorclass
from tdfunc._core.helpers.class_names import class_name, lookup_class


class Foo(TensorClass):
    tensor: torch.Tensor
    non_tensor: Any
    nested: Any = None


class Pair(TensorClass):
    a: torch.Tensor
    b: torch.Tensor


class Params(TensorClass["frozen"]):
    weight: torch.Tensor
    bias: torch.Tensor


# ---------------------------------------------------------------------- the documented examples
def test_seed_repr_example():
    foo = Foo(tensor=torch.randn(3), non_tensor="a string!", nested=None, batch_size=[3])
    assert repr(foo) == (
        "Foo(\n"
        "    non_tensor=NonTensorData(data=a string!, batch_size=torch.Size([3]), device=None),\n"
        "    tensor=Tensor(shape=torch.Size([3]), device=cpu, dtype=torch.float32, "
        "is_shared=False),\n"
        "    nested=None,\n"
        "    batch_size=torch.Size([3]),\n"
        "    device=None,\n"
        "    is_shared=False)"
    )


def test_repr_nested_and_names():
    class Inner(TensorClass):
        x: torch.Tensor

    class Outer(TensorClass):
        inner: Inner
        y: torch.Tensor

    out = Outer(Inner(torch.zeros(2, 1), batch_size=[2]), torch.ones(2), batch_size=[2])
    out.names = ["n"]
    text = repr(out)
    assert text.startswith("Outer(\n    inner=Inner(\n        x=Tensor(shape=torch.Size([2, 1])")
    assert "names=['n']" in text
    assert text.index("inner=") < text.index("\n    y=") < text.rindex("batch_size=torch.Size([2])")


@pytest.mark.parametrize(
    ("flags", "value", "expected"),
    [
        ((), 1, "tensor"),
        (("autocast",), torch.ones(()), 1),
        (("nocast",), 1, 1),
        (("nocast", "frozen"), 1, 1),
    ],
)
def test_seed_flag_examples_bracket_form(flags, value, expected):
    base = TensorClass[flags] if flags else TensorClass

    class Foo(base):  # type: ignore[valid-type, misc]
        integer: int

    got = Foo(integer=value).integer
    if expected == "tensor":
        assert isinstance(got, torch.Tensor) and got.dtype == torch.int64 and got.item() == value
    else:
        assert type(got) is int and got == expected


def test_flags_as_class_keywords_and_decorator_are_equivalent():
    class A(TensorClass["autocast"]):
        integer: int

    class B(TensorClass, autocast=True):
        integer: int

    @tensorclass(autocast=True)
    class C:
        integer: int

    for cls in (A, B, C):
        assert cls._tc_flags["autocast"]
        value = cls(integer=torch.ones(())).integer
        assert type(value) is int and value == 1

    class D(TensorClass, nocast=True):
        integer: int

    assert type(D(integer=1).integer) is int


# ---------------------------------------------------------------------- class creation
def test_tensorclass_itself_is_not_a_tensorclass():
    assert not is_tensorclass(TensorClass)
    assert not is_tensorclass(TensorClass["frozen"])
    assert is_tensorclass(Foo) and is_tensorclass(Foo(torch.zeros(()), 1))
    assert not is_tensorclass(TensorDict())
    with pytest.raises(TypeError, match="not a tensorclass itself"):
        TensorClass()
    with pytest.raises(TypeError, match="not a tensorclass itself"):
        TensorClass["frozen"]()


def test_bracket_form_returns_a_cached_real_subclass():
    carrier = TensorClass["nocast", "frozen"]
    assert isinstance(carrier, type) and issubclass(carrier, TensorClass)
    assert TensorClass["frozen", "nocast"] is carrier
    assert TensorClass["frozen"] is not carrier


@pytest.mark.parametrize("combo", [("autocast", "nocast"), ("nocast", "tensor_only")])
def test_casting_flags_are_mutually_exclusive(combo):
    with pytest.raises(TypeError, match="mutually exclusive"):
        TensorClass[combo]
    with pytest.raises(TypeError, match="mutually exclusive"):

        class Bad(TensorClass, **dict.fromkeys(combo, True)):
            x: torch.Tensor

    with pytest.raises(TypeError, match="mutually exclusive"):
        tensorclass(**dict.fromkeys(combo, True))


def test_inherited_casting_flag_conflicts_unless_turned_off():
    class Base(TensorClass["autocast"]):
        x: int

    with pytest.raises(TypeError, match="mutually exclusive"):

        class Bad(Base, nocast=True):
            y: int

    class Ok(Base, autocast=False, nocast=True):
        y: int

    assert Ok._tc_flags["nocast"] and not Ok._tc_flags["autocast"]
    assert type(Ok(x=1, y=2).x) is int


def test_unknown_bracket_flag():
    with pytest.raises(ValueError, match="unknown flag 'frozn'"):
        TensorClass["frozn"]
    with pytest.raises(TypeError, match="flags are strings"):
        TensorClass[1]


def test_subclass_adds_frozen_and_inherits_autocast():
    class Base(TensorClass["autocast"]):
        x: int

    class Sub(Base, frozen=True):
        y: float

    sub = Sub(x=torch.ones(()), y=2)
    assert type(sub.x) is int and type(sub.y) is float and sub.y == 2.0
    assert Sub._tc_flags["autocast"] and Sub._tc_flags["frozen"]
    assert not Base._tc_flags["frozen"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        sub.x = 3
    base = Base(x=1)
    base.x = 3
    assert base.x == 3
    assert list(inspect.signature(Sub).parameters)[:2] == ["x", "y"]


def test_subclass_of_frozen_cannot_drop_frozen():
    with pytest.raises(TypeError, match="must be frozen too"):

        class Bad(Params, frozen=False):
            extra: torch.Tensor

    class Child(Params):
        extra: torch.Tensor

    assert Child._tc_flags["frozen"]
    child = Child(torch.zeros(2, 3), torch.zeros(2), torch.zeros(1))
    with pytest.raises(dataclasses.FrozenInstanceError):
        child.extra = torch.ones(1)


@pytest.mark.parametrize(
    "name", ["batch_size", "device", "names", "to", "reshape", "get", "_td", "shape", "apply"]
)
def test_reserved_field_names(name):
    with pytest.raises(AttributeError, match=f"field name '{name}' clashes"):
        type("Bad", (TensorClass,), {"__annotations__": {name: torch.Tensor}})


def test_shadow_allows_reserved_names():
    class Foo(TensorClass["shadow"]):
        data: torch.Tensor
        to: Any = None

    foo = Foo(data=torch.ones(3), to="there", batch_size=[3])
    assert torch.equal(foo.data, torch.ones(3)) and foo.to == "there"
    assert foo.batch_size == torch.Size([3])
    assert foo[:2].data.shape == torch.Size([2])


def test_field_order_rules_and_mutable_defaults():
    with pytest.raises(TypeError, match="non-default field 'b' follows default field 'a'"):

        class Bad(TensorClass):
            a: torch.Tensor = None
            b: torch.Tensor

    with pytest.raises(ValueError, match=r"use dataclasses\.field"):

        class Bad2(TensorClass):
            a: list = []

    class Good(TensorClass):
        a: Any = dataclasses.field(default_factory=list)

    first, second = Good(), Good()
    assert first.a == [] and first.a is not second.a


def test_classvar_is_not_a_field_and_post_init_runs():
    class Foo(TensorClass):
        scale: Any
        x: torch.Tensor
        counter: ClassVar[int] = 0

        def __post_init__(self):
            type(self).counter += 1

    foo = Foo(2, torch.ones(1))
    assert [f.name for f in Foo._tc_fields] == ["scale", "x"]
    assert Foo.counter == 1
    assert foo.scale.item() == 2 and Foo.__match_args__ == ("scale", "x")


def test_every_subclass_is_registered():
    assert lookup_class(class_name(Foo)) is Foo
    import torch.utils._pytree as torch_pytree

    assert Foo in torch_pytree.SUPPORTED_NODES
    assert Foo._is_tensor_collection


# ---------------------------------------------------------------------- constructor
def test_constructor_positional_keyword_defaults_and_signature():
    foo = Foo(torch.zeros(2, 4), "label", batch_size=[2])
    assert foo.non_tensor == "label" and foo.nested is None
    assert foo.tensor.shape == torch.Size([2, 4]) and foo.batch_size == torch.Size([2])
    sig = inspect.signature(Foo)
    assert str(sig) == (
        "(tensor: 'torch.Tensor', non_tensor: 'Any', nested: 'Any' = None, *, "
        "batch_size=None, device=None, names=None)"
    )
    with pytest.raises(TypeError):
        Foo(torch.zeros(2))  # a required field is missing
    with pytest.raises(TypeError):
        Foo(torch.zeros(2), 1, 2, 3)


def test_constructor_validates_batch_size():
    with pytest.raises(ValueError, match="field 'b' has shape \\[3\\]"):
        Pair(torch.zeros(2, 5), torch.zeros(3), batch_size=[2])
    with pytest.raises(TypeError, match="batch_size must be a sequence"):
        Pair(torch.zeros(2), torch.zeros(2), batch_size="2")


def test_constructor_device_and_names():
    pair = Pair(
        torch.zeros(2, 3), torch.zeros(2, 3), batch_size=[2, 3], device="cpu", names=["n", None]
    )
    assert pair.device == torch.device("cpu") and pair.names == ["n", None]
    with pytest.raises(ValueError, match="expected 2 names"):
        Pair(torch.zeros(2, 3), torch.zeros(2, 3), batch_size=[2, 3], names=["n"])


def test_non_tensor_optional_nested_fields():
    class Inner(TensorClass):
        x: torch.Tensor

    class Outer(TensorClass):
        inner: Inner
        td: TensorDict
        label: str
        maybe: Optional[torch.Tensor] = None  # noqa: UP045
        extra: Any = None

    out = Outer(
        Inner(torch.ones(3, 2), batch_size=[3]),
        TensorDict({"z": torch.zeros(3)}, [3]),
        "hello",
        batch_size=[3],
    )
    assert isinstance(out.inner, Inner) and out.label == "hello" and out.maybe is None
    assert isinstance(out.td, TensorDict) and out["td", "z"].shape == torch.Size([3])
    assert out.get(("inner", "x")).shape == torch.Size([3, 2])
    dict_out = Outer(
        Inner(torch.ones(3), batch_size=[3]), {"z": torch.zeros(3)}, "a", batch_size=[3]
    )
    assert isinstance(dict_out.td, TensorDict) and dict_out.td.batch_size == torch.Size([3])


def test_decorator_form_keeps_methods_and_super():
    class Mixin:
        def describe(self):
            return "mixin"

    @tensorclass
    class MyData(Mixin):
        image: torch.Tensor
        label: torch.Tensor

        def select_label(self, label):
            return self[self.label == label]

        def describe(self):
            return "data+" + super().describe()

    images = torch.randn(10, 3, 4)
    label = torch.arange(10) % 3
    data = MyData(images, label=label, batch_size=[10])
    sub = data.select_label(1)
    assert isinstance(sub, MyData) and torch.equal(sub.image, images[label == 1])
    assert data.describe() == "data+mixin"
    assert is_tensorclass(MyData) and MyData.__name__ == "MyData"
    with pytest.raises(TypeError, match="already a TensorClass"):
        tensorclass(Foo)


# ---------------------------------------------------------------------- casting
def test_default_casting():
    class Foo(TensorClass):
        x: Any
        y: Any = None

    assert isinstance(Foo(x=1.5).x, torch.Tensor)
    arr = np.arange(3.0)
    got = Foo(x=arr, batch_size=[3]).x
    assert isinstance(got, torch.Tensor) and torch.equal(got, torch.as_tensor(arr))
    assert Foo(x="s").x == "s"
    assert Foo(x=[1, 2]).x == [1, 2]
    # a Python number cannot carry batch dims: it stays a Python value
    assert Foo(x=3, batch_size=[4]).x == 3
    assert isinstance(Foo(x=3, batch_size=[4])._td._data["x"], NonTensorData)


def test_nocast_keeps_numbers_and_arrays():
    class Foo(TensorClass["nocast"]):
        x: Any

    arr = np.ones(2)
    assert Foo(x=arr).x is arr
    assert type(Foo(x=2.5).x) is float
    assert isinstance(Foo(x=torch.ones(2), batch_size=[2]).x, torch.Tensor)


def test_autocast_follows_annotations():
    class Inner(TensorClass):
        z: torch.Tensor

    class Foo(TensorClass["autocast"]):
        i: int
        f: float
        t: torch.Tensor
        s: str
        inner: Optional[Inner] = None  # noqa: UP045
        anything: Any = None

    foo = Foo(i=torch.tensor(3), f=2, t=[1.0, 2.0], s=5, inner={"z": torch.ones(())}, anything=4)
    assert type(foo.i) is int and foo.i == 3
    assert type(foo.f) is float and foo.f == 2.0
    assert isinstance(foo.t, torch.Tensor) and foo.t.tolist() == [1.0, 2.0]
    assert foo.s == "5"
    # a union (Optional included) names no one type: the value is kept as given
    assert type(foo.inner) is dict and foo.inner["z"].item() == 1.0
    foo.inner = Inner(z=torch.zeros(()))
    assert isinstance(foo.inner, Inner)
    assert isinstance(foo.anything, torch.Tensor)
    foo.i = torch.tensor(7.0)
    assert type(foo.i) is int and foo.i == 7
    with pytest.raises(TypeError, match=r"cannot cast .* field 'i' to its annotation int"):
        Foo(i=torch.ones(3), f=1, t=torch.zeros(()), s="a")


def test_tensor_only():
    class Fast(TensorClass["tensor_only"]):
        x: torch.Tensor
        y: Optional[torch.Tensor] = None  # noqa: UP045

    fast = Fast(x=np.ones(2), batch_size=[2])
    assert isinstance(fast.x, torch.Tensor) and fast.y is None
    with pytest.raises(TypeError, match=r"field 'x' expects a tensor .* got str"):
        Fast(x="not a tensor")
    with pytest.raises(TypeError, match="expects a tensor"):
        fast.y = "nope"
    fast.y = torch.ones(2)
    assert torch.equal(fast.y, torch.ones(2))
    with pytest.raises(TypeError, match="not a tensor type"):

        class Bad(TensorClass["tensor_only"]):
            s: str


# ---------------------------------------------------------------------- frozen and hashing
def test_frozen_instances_refuse_writes():
    p = Params(torch.zeros(2, 3), torch.zeros(2), batch_size=[])
    weight = p.weight
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.weight = torch.ones(2, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        del p.weight
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.other = 1
    writes = [
        lambda: p.set("weight", torch.ones(2, 3)),
        lambda: p.set("weight", torch.ones(2, 3), inplace=True),
        lambda: p.set_("weight", torch.ones(2, 3)),
        lambda: p.update({"bias": torch.ones(2)}),
        lambda: p.update_({"bias": torch.ones(2)}),
        lambda: p.zero_(),
        lambda: p.apply_(lambda t: t + 1),
        lambda: p.apply(lambda t: t + 1, inplace=True),
        lambda: p.add_(1.0),
        lambda: p.mul_(2.0),
        lambda: p.fill_("bias", 1.0),
        lambda: p.del_("bias"),
        lambda: p.pop("bias"),
        lambda: p.requires_grad_(),
        lambda: p.load_state_dict(p.state_dict()),
        lambda: p.__setitem__("bias", torch.ones(2)),
    ]
    for write in writes:
        with pytest.raises(dataclasses.FrozenInstanceError, match="frozen"):
            write()
    assert p.weight is weight and torch.equal(p.weight, torch.zeros(2, 3))
    assert p.is_locked


def test_frozen_in_place_operator_rebinds():
    p = Params(torch.zeros(2, 3), torch.zeros(2))
    original = p
    p += 1
    assert p is not original and torch.equal(original.weight, torch.zeros(2, 3))
    assert torch.equal(p.weight, torch.ones(2, 3)) and isinstance(p, Params)
    pair = Pair(torch.zeros(2), torch.zeros(2), batch_size=[2])
    same = pair
    pair += 1
    assert pair is same and torch.equal(same.a, torch.ones(2))


def test_frozen_results_stay_frozen():
    p = Params(torch.zeros(3, 2, 3), torch.zeros(3, 2), batch_size=[3])
    results = [
        p[0],
        p[torch.tensor([True, False, True])],
        p.reshape(3, 1),
        torch.stack([p, p]),
        torch.cat([p, p]),
        p.apply(lambda t: t + 1),
        p.clone(),
        p.unbind(0)[1],
    ]
    for result in results:
        assert type(result) is Params
        with pytest.raises(dataclasses.FrozenInstanceError):
            result.bias = torch.ones(2)


def test_hashing():
    p = Params(torch.zeros(2, 3), torch.zeros(2))
    q = Params(torch.zeros(2, 3), torch.zeros(2))
    assert hash(p) == hash(p) and len({p, q, p}) == 2
    assert {p: 1}[p] == 1
    pair = Pair(torch.zeros(2), torch.zeros(2))
    with pytest.raises(TypeError, match="unhashable"):
        hash(pair)
    equal = p == q
    assert isinstance(equal, Params) and equal.weight.dtype == torch.bool and equal.all()


def test_pickle_and_copy_roundtrip():
    import copy

    p = Params(torch.randn(2, 3), torch.randn(2))
    loaded = pickle.loads(pickle.dumps(p))
    assert type(loaded) is Params and torch.equal(loaded.weight, p.weight)
    with pytest.raises(dataclasses.FrozenInstanceError):
        loaded.bias = torch.zeros(2)
    shallow = copy.copy(p)
    assert shallow.weight is p.weight and shallow._td is not p._td
    deep = copy.deepcopy(p)
    assert deep.weight is not p.weight and torch.equal(deep.weight, p.weight)


def test_field_assignment_casts_and_validates():
    pair = Pair(torch.zeros(2), torch.zeros(2), batch_size=[2])
    pair.a = torch.ones(2)
    assert torch.equal(pair.a, torch.ones(2))
    with pytest.raises(ValueError, match="field 'a'"):
        pair.a = torch.ones(3)
    pair.b = None
    assert pair.b is None and "b" not in pair
    del pair.a
    assert pair.a is None


# ---------------------------------------------------------------------- tensordict's documentation
def test_seed_reward_data_style_class():
    class RewardData(TensorClass):
        input_ids: torch.Tensor
        attention_mask: torch.Tensor
        rewards: Optional[torch.Tensor] = None  # noqa: UP045
        end_scores: Optional[torch.Tensor] = None  # noqa: UP045

    ids = torch.arange(12).reshape(4, 3)
    data = RewardData(ids, ids > 2, batch_size=[4], names=["batch"])
    # torchrl's RewardData page's form (batch_size optional: the newer pages construct without one)
    assert str(inspect.signature(RewardData)) == (
        "(input_ids: 'torch.Tensor', attention_mask: 'torch.Tensor', "
        "rewards: 'Optional[torch.Tensor]' = None, end_scores: 'Optional[torch.Tensor]' = None, "
        "*, batch_size=None, device=None, names=None)"
    )
    assert data.names == ["batch"] and data.rewards is None
    rows = data.unbind(0)
    assert len(rows) == 4 and all(type(row) is RewardData for row in rows)
    rows[1].input_ids.fill_(-1)  # shares storage with data
    assert torch.equal(ids[1], torch.full((3,), -1))
    assert data.get("end_scores", "default") is None
    assert data.get("nope", "default") == "default"
    assert RewardData.from_tensordict(data.to_tensordict()).batch_size == torch.Size([4])


def test_frozen_instance_inside_a_tensordict_refuses_writes_through_the_parent():
    writes = [
        lambda td: td.set(("p", "extra"), torch.ones(2)),
        lambda td: td.__setitem__(("p", "extra"), torch.ones(2)),
        lambda td: td.set(("p", "weight"), torch.ones(2, 3)),
        lambda td: td.del_(("p", "bias")),
    ]
    for write in writes:
        p = Params(torch.zeros(2, 3), torch.zeros(2))
        weight = p.weight
        td = TensorDict({"p": p}, [])
        with pytest.raises(RuntimeError, match=r"frozen|locked"):
            write(td)
        assert sorted(p.keys()) == ["bias", "weight"]
        assert p.weight is weight and torch.equal(weight, torch.zeros(2, 3))
    p = Params(torch.zeros(2, 3), torch.zeros(2))
    assert p.is_locked and p.unlock_().is_locked
    assert TensorDict({"p": p}, []).lock_().unlock_()["p"] is p


def test_seed_readme_tensorclass_example():
    @tensorclass
    class MyData:
        image: torch.Tensor
        mask: torch.Tensor
        label: torch.Tensor

        def mask_image(self):
            return self.image[self.mask.expand_as(self.image)].view(*self.batch_size, -1)

        def select_label(self, label):
            return self[self.label == label]

    generator = torch.Generator().manual_seed(0)
    images = torch.randn(100, 3, 64, 64, generator=generator)
    label = torch.randint(10, (100,), generator=generator)
    mask = torch.zeros(1, 64, 64, dtype=torch.bool).bernoulli_(generator=generator)
    mask = mask.expand(100, 1, 64, 64)
    data = MyData(images, mask, label=label, batch_size=[100])
    selected = data.select_label(1)
    assert type(selected) is MyData
    assert selected.batch_size == torch.Size([int((label == 1).sum())])
    assert torch.equal(selected.image, images[label == 1])
    expected = images[mask.expand_as(images)].view(100, -1)
    assert torch.equal(data.mask_image(), expected)
    reshaped = data.reshape(10, 10)
    assert reshaped.batch_size == torch.Size([10, 10])
    assert reshaped.image.shape == torch.Size([10, 10, 3, 64, 64])
    assert reshaped.mask.shape == torch.Size([10, 10, 1, 64, 64])
    assert repr(reshaped).startswith(
        "MyData(\n    image=Tensor(shape=torch.Size([10, 10, 3, 64, 64])"
    )
