"""Every flag combination, both class forms: a sequence of copies and round trips keeps
what each field reads, the class, the batch size and frozen-ness.

The expected reading of each field comes from the flag's documented rule, not from
tdfunc: autocast and nocast keep a Python ``int`` an ``int``; the default casts it to
a tensor (kept as a Python value when a 0-d tensor cannot carry the batch dims);
tensor_only stores tensors.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import itertools
import pickle

import torch
import torch.utils._pytree as pytree
from hypothesis import given, settings
from hypothesis import strategies as st

from tdfunc import TensorClass, tensorclass

CASTS = (None, "autocast", "nocast", "tensor_only")
CLASSES: dict[tuple, type] = {}


def _make(cast: str | None, frozen: bool, form: str) -> type:
    name = f"Combo_{cast}_{'frozen' if frozen else 'mutable'}_{form}"
    annotations = {"x": torch.Tensor, "n": int, "opt": "torch.Tensor | None"}
    namespace = {"__module__": __name__, "__qualname__": name, "n": 3, "opt": None}
    if cast != "tensor_only":
        annotations["label"] = str
        namespace["label"] = "lab"
    namespace["__annotations__"] = annotations
    flags = [flag for flag in (cast,) if flag] + (["frozen"] if frozen else [])
    if form == "bracket":
        cls = type(name, (TensorClass[tuple(flags)] if flags else TensorClass,), namespace)
    else:
        cls = tensorclass(**dict.fromkeys(flags, True))(type(name, (), namespace))
    globals()[name] = cls  # pickle finds the class by module and name
    return cls


for _key in itertools.product(CASTS, (False, True), ("bracket", "decorator")):
    CLASSES[_key] = _make(*_key)


def _expected_n(cast: str | None, n: int, size: list[int]):
    if cast in ("autocast", "nocast") or (cast is None and size):
        return n
    return torch.full(size, n) if size else torch.tensor(n)


def _saved(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def _state_dict_round_trip(obj):
    if type(obj)._tc_frozen:  # a frozen instance refuses load_state_dict: load a copy
        return type(obj).from_tensordict(obj.to_tensordict())
    target = obj.clone()
    target.x = torch.zeros_like(obj.x)
    target.load_state_dict(obj.state_dict())
    return target


def _pytree_round_trip(obj):
    leaves, spec = pytree.tree_flatten(obj)
    return pytree.tree_unflatten(leaves, spec)


OPS = {
    "clone": lambda o: o.clone(),
    "copy": copy.copy,
    "deepcopy": copy.deepcopy,
    "pickle": lambda o: pickle.loads(pickle.dumps(o)),
    "torch.save": _saved,
    "tensordict": lambda o: type(o).from_tensordict(o.to_tensordict()),
    "dict": lambda o: type(o).from_dict(o.to_dict(), batch_size=o.batch_size),
    "replace": dataclasses.replace,
    "state_dict": _state_dict_round_trip,
    "pytree": _pytree_round_trip,
    "vmap": lambda o: torch.vmap(lambda t: t)(o) if o.batch_size else o,
    "index": lambda o: o[:] if o.batch_size else o,
    "apply": lambda o: o.apply(lambda t: t),
}


def _same(got, want) -> bool:
    if isinstance(want, torch.Tensor):
        return type(got) is torch.Tensor and got.shape == want.shape and torch.equal(got, want)
    return type(got) is type(want) and got == want


@settings(max_examples=60, deadline=None)
@given(
    key=st.sampled_from(sorted(CLASSES, key=str)),
    batch=st.sampled_from([[], [2]]),
    n=st.integers(-5, 5),
    ops=st.lists(st.sampled_from(sorted(OPS)), min_size=1, max_size=4),
)
def test_flag_combinations_survive_copies_and_round_trips(key, batch, n, ops):
    cls = CLASSES[key]
    cast, frozen, _ = key
    x = torch.arange(6.0).reshape(*batch, -1)
    given_n = torch.full(batch, n) if (cast == "tensor_only" and batch) else n
    obj = cls(x=x, n=given_n, batch_size=batch)
    want = {"x": x, "n": _expected_n(cast, n, batch), "opt": None}
    if cast != "tensor_only":
        want["label"] = "lab"
    for name in ops:
        obj = OPS[name](obj)
        assert type(obj) is cls, name
        assert obj.batch_size == torch.Size(batch), name
        for field, value in want.items():
            got = getattr(obj, field)
            assert (got is None) if value is None else _same(got, value), (name, field, got)
        if frozen:
            for write in (lambda o: setattr(o, "x", x), lambda o: o.set("x", x)):
                try:
                    write(obj)
                except dataclasses.FrozenInstanceError:
                    continue
                raise AssertionError(f"a frozen instance accepted a write after {name}")
