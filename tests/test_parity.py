"""TensorClass offers TensorDict's public API: the same names, signatures and results.

Both classes take their methods from the shared mixins (the core's, ``tdfunc._core.ops``,
and the features', ``tdfunc._assembly.Features``); this test keeps it so. It walks
TensorDict's public API (methods, properties and the operators), checks that a
TensorClass has each name with the same signature (explicit, justified exceptions
below), and runs every name on a
TensorClass instance of the shared corpus and on the TensorDict holding the same
data, comparing the results leaf by leaf. A name without a case below is run
with no arguments when its signature allows it (so methods added to the shared
mixins are covered at once), and is reported otherwise.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import operator
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from corpus import Sample, sample
from torch import nn

from tdfunc import TensorClass, TensorDict, is_tensor_collection

# Not part of the API walked here: class plumbing every Python class has.
_PLUMBING = {
    "__annotations__",
    "__doc__",
    "__init__",
    "__init_subclass__",
    "__module__",
    "__slots__",
    "__subclasshook__",
    "__weakref__",
}

# TensorDict names a TensorClass does not have, and why.
MISSING_ON_TENSORCLASS: dict[str, str] = {}

# Names a TensorClass defines itself, and why; the signature must still match
# unless listed in SIGNATURE_DIFFERS.
OWN_ON_TENSORCLASS = {
    "__repr__": "lists the fields, unset ones as None",
    "set": "every write goes through the casting rules (no store-as-is fast path)",
    "from_module": "builds the class from its fields (from_tensordict)",
    "from_modules": "builds the class from its fields (from_tensordict)",
    "state_dict": "records the classes of nested tensorclasses and the unset fields",
    "load_state_dict": "restores the unset fields",
    "__hash__": "frozen classes are hashable (as frozen dataclasses)",
    "__getstate__": "pickles its inner TensorDict (which drops pending with-actions)",
}
SIGNATURE_DIFFERS = {
    # tensordict's TensorClass.state_dict has flatten=, which TensorDict.state_dict lacks;
    # the entry goes once both take it
    "state_dict",
}


def public_api(cls: type) -> list[str]:
    """The public names of ``cls``: no leading underscore, or an operator it defines."""
    names = []
    for name in dir(cls):
        if name in _PLUMBING:
            continue
        if name.startswith("__"):
            if getattr(cls, name, None) is getattr(object, name, None):
                continue
        elif name.startswith("_"):
            continue
        names.append(name)
    return sorted(names)


class Params(TensorClass):
    """A TensorClass matching ``nn.Linear(3, 2)``, for the module cases."""

    weight: torch.Tensor
    bias: torch.Tensor


def _linear() -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(3, 2)


def build(kind: str, which: str = "sample") -> Any:
    """The corpus sample as a TensorClass (``kind="tc"``) or as a TensorDict (``"td"``)."""
    if which == "module":
        params = TensorDict.from_module(_linear()).apply(lambda t: t.detach() + 1)
        return Params.from_tensordict(params) if kind == "tc" else params
    instance = sample()
    return instance if kind == "tc" else instance.to_tensordict()


def _cls(obj: Any) -> type:
    return type(obj)


def _inplace(op: Callable, value: Any) -> Callable:
    def run(o: Any) -> Any:
        out = o
        out = op(out, value)
        return out

    return run


def _set_item(o: Any) -> Any:
    o["obs"] = torch.zeros(4, 3, 2)
    o[0] = o[1]
    o[o["reward"] > 0] = o[0:1].expand(4, 3)[o["reward"] > 0]
    return o


def _delete(o: Any) -> Any:
    del o["obs"]
    return o


def _saved(method: str) -> Callable:
    def run(o: Any, tmp_path: Any) -> Any:
        return getattr(o, method)(str(tmp_path / method))

    return run


def _loaded(method: str) -> Callable:
    def run(o: Any, tmp_path: Any) -> Any:
        path = str(tmp_path / "saved")
        o.memmap(path)
        if method in ("load", "load_memmap"):
            return getattr(_cls(o), method)(path)
        return getattr(o.clone(), method)(path)

    return run


def _from_consolidated(o: Any, tmp_path: Any) -> Any:
    path = str(tmp_path / "consolidated.bin")
    o.consolidate(filename=path)
    return _cls(o).from_consolidated(path)


def _table(o: Any) -> Any:
    """``o``'s rows as a one-dim container whose leaves fit table columns."""
    return o[0].select("reward")


def _written(method: str) -> Callable:
    """``to_csv``/``to_json``/``to_parquet`` of the rows, then the same file read back."""

    def run(o: Any, tmp_path: Any) -> Any:
        tmp_path.mkdir(parents=True, exist_ok=True)
        path = tmp_path / f"rows.{method}"
        getattr(_table(o), method)(path)
        reader = "from_" + method.removeprefix("to_")
        return getattr(_cls(o), reader)(path)["reward"]

    return run


def _refresh(o: Any, tmp_path: Any) -> Any:
    saved = o.memmap(str(tmp_path / "refresh"))
    return saved.memmap_refresh_(), saved.saved_path is not None


def _map_double(chunk: Any) -> Any:
    return chunk * 2


def _to_module(o: Any) -> Any:
    module = _linear()
    with o.to_module(module):
        inside = module(torch.ones(1, 3))
    return inside, module.weight.clone()


_Plain = dataclasses.make_dataclass("_Plain", ["obs", "reward", "extra", "label"])


def _struct_array() -> np.ndarray:
    dtype = [("obs", "f4", (2,)), ("reward", "f4"), ("extra", [("value", "f4", (5,))])]
    array = np.zeros((4, 3), dtype=dtype)
    array["reward"] = np.arange(12, dtype=np.float32).reshape(4, 3)
    return array


# name -> (function of the container, which corpus entry) ; functions taking
# ``tmp_path`` get a fresh directory.
CASES: dict[str, tuple[Callable, str]] = {
    "__abs__": (abs, "sample"),
    # the tensor-like surface: every method on the sample, with arguments
    "add": (lambda o: o.add(1.5), "sample"),
    "sub": (lambda o: o.sub(o), "sample"),
    "rsub": (lambda o: o.rsub(o, alpha=2), "sample"),
    "bitwise_and": (lambda o: (o > 0.5).bitwise_and(o > 0.2), "sample"),
    "logical_and": (lambda o: o.logical_and(o * 0), "sample"),
    "mul": (lambda o: o.mul(2), "sample"),
    "div": (lambda o: o.div(2), "sample"),
    "addcdiv": (lambda o: o.addcdiv(o, o + 2.0), "sample"),
    "addcdiv_": (lambda o: o.addcdiv_(o.clone(), o + 2.0), "sample"),
    "addcmul": (lambda o: o.addcmul(o, o), "sample"),
    "addcmul_": (lambda o: o.addcmul_(o.clone(), o.clone()), "sample"),
    "lerp": (lambda o: o.lerp(o * 0, 0.5), "sample"),
    "pow_": (lambda o: o.pow_(2), "sample"),
    "clamp_": (lambda o: o.clamp_(-0.5, 0.5), "sample"),
    "clamp_max": (lambda o: o.clamp_max(0.1), "sample"),
    "clamp_max_": (lambda o: o.clamp_max_(0.1), "sample"),
    "clamp_min": (lambda o: o.clamp_min(0.1), "sample"),
    "clamp_min_": (lambda o: o.clamp_min_(0.1), "sample"),
    "maximum": (lambda o: o.maximum(o * 0), "sample"),
    "maximum_": (lambda o: o.maximum_(o * 0), "sample"),
    "minimum": (lambda o: o.minimum(o * 0), "sample"),
    "minimum_": (lambda o: o.minimum_(o * 0), "sample"),
    "cummax": (lambda o: o.cummax(1), "sample"),
    "cummin": (lambda o: o.cummin(1), "sample"),
    "cumprod": (lambda o: o.cumprod(0), "sample"),
    "cumsum": (lambda o: o.cumsum(1), "sample"),
    "quantile": (lambda o: o.quantile(0.25, dim=1), "sample"),
    "__getitems__": (lambda o: o.__getitems__([3, 0]), "sample"),
    "cat_tensors": (lambda o: o.cat_tensors("obs", "obs", out_key="obs", dim=-1), "sample"),
    "stack_tensors": (
        lambda o: o.stack_tensors("reward", "reward", out_key="reward", dim=-1),
        "sample",
    ),
    "softmax": (lambda o: o.softmax(1), "sample"),
    "log_softmax": (lambda o: o.log_softmax(0), "sample"),
    "backward": (lambda o: o.apply(lambda t: t.requires_grad_()).sum().backward(), "sample"),
    "broadcast_to": (lambda o: o[:1].broadcast_to((2, 4, 3)), "sample"),
    "gather": (lambda o: o.gather(1, torch.zeros(4, 2, dtype=torch.long)), "sample"),
    "masked_fill": (lambda o: o.masked_fill(o["reward"] > 0, 0.0), "sample"),
    "masked_fill_": (lambda o: o.masked_fill_(o["reward"] > 0, 0.0), "sample"),
    "masked_select": (lambda o: o.masked_select(o["reward"] > 0), "sample"),
    "where": (lambda o: o.where(o["reward"] > 0, o * 0), "sample"),
    "movedim": (lambda o: o.movedim(0, 1), "sample"),
    "moveaxis": (lambda o: o.moveaxis(0, 1), "sample"),
    "swapaxes": (lambda o: o.swapaxes(0, 1), "sample"),
    "swapdims": (lambda o: o.swapdims(0, 1), "sample"),
    "narrow": (lambda o: o.narrow(0, 1, 2), "sample"),
    "pad": (lambda o: o.pad([1, 1]), "sample"),
    "repeat_interleave": (lambda o: o.repeat_interleave(2, dim=0), "sample"),
    "roll": (lambda o: o.roll(1, 0), "sample"),
    "tensor_split": (lambda o: o.tensor_split(2, dim=0), "sample"),
    "new_full": (lambda o: o.new_full((2,), 3.0), "sample"),
    "new_tensor": (lambda o: o.new_tensor(torch.ones(4, 3)), "sample"),
    "get_at": (lambda o: o.get_at("reward", 0), "sample"),
    "set_at_": (lambda o: o.set_at_("reward", torch.zeros(3), 0)["reward"], "sample"),
    "type": (lambda o: o.type(torch.float64), "sample"),
    "entry_class": (lambda o: o.entry_class("reward"), "sample"),
    "create_nested": (lambda o: o.create_nested("extra")["extra"].batch_size, "sample"),
    "update_at_": (lambda o: o.update_at_({"reward": torch.zeros(3)}, 0)["reward"], "sample"),
    "copy_at_": (lambda o: o.copy_at_(o[0] * 0, 1), "sample"),
    "from_dict": (lambda o: type(o).from_dict(o.to_dict(), batch_size=[4, 3]), "sample"),
    "fromkeys": (lambda o: type(o).fromkeys(["obs", "reward"], torch.ones(4, 3), [4]), "sample"),
    "stack": (lambda o: type(o).stack([o, o * 2], 1), "sample"),
    "cat": (lambda o: type(o).cat([o, o * 2], 0), "sample"),
    "pack": (lambda o: o.filter_non_tensor_data().pack()[0], "sample"),
    "maybe_dense_stack": (lambda o: type(o).maybe_dense_stack([o, o]), "sample"),
    "from_any": (lambda o: type(o).from_any(o.to_dict(), batch_size=[4, 3]), "sample"),
    "from_list": (
        lambda o: type(o).from_list([o[i].to_dict() for i in range(4)], batch_size=[4, 3]),
        "sample",
    ),
    "from_dataclass": (
        lambda o: type(o).from_dataclass(
            _Plain(o["obs"], o["reward"], o["extra"], "train"), batch_size=[4, 3]
        ),
        "sample",
    ),
    "from_namedtuple": (lambda o: type(o).from_namedtuple(o.to_namedtuple()), "sample"),
    "from_dict_instance": (lambda o: o.from_dict_instance(o.to_dict(), [4, 3]), "sample"),
    "from_tuple": (
        lambda o: type(o).from_tuple((o["obs"], (o["reward"],)), batch_size=[4, 3]),
        "sample",
    ),
    "from_schema": (
        lambda o: type(o).from_schema(
            {
                "obs": ([2], torch.float32),
                "reward": ([], torch.float64),
                ("extra", "value"): ([5], torch.float32),
            },
            batch_size=[4, 3],
        ),
        "sample",
    ),
    "from_pandas": (lambda o: _cls(o).from_pandas(_table(o).to_pandas())["reward"], "sample"),
    "to_pandas": (lambda o: torch.tensor(_table(o).to_pandas()["reward"].to_numpy()), "sample"),
    "to_csv": (_written("to_csv"), "sample"),
    "from_csv": (_written("to_csv"), "sample"),
    "to_json": (_written("to_json"), "sample"),
    "from_json": (_written("to_json"), "sample"),
    "to_parquet": (_written("to_parquet"), "sample"),
    "from_parquet": (_written("to_parquet"), "sample"),
    "from_pytree": (lambda o: type(o).from_pytree([o["obs"]]).to_pytree()[0], "sample"),
    "to_pytree": (lambda o: type(o).from_pytree({"r": o["reward"]}).to_pytree()["r"], "sample"),
    "to_struct_array": (lambda o: torch.as_tensor(o.to_struct_array()["obs"]), "sample"),
    "from_struct_array": (
        lambda o: type(o).from_struct_array(_struct_array()).select("obs", "reward", "extra"),
        "sample",
    ),
    "data_ptr": (lambda o: int(o.data_ptr()["obs"]) == o["obs"].data_ptr(), "sample"),
    "new_empty": (lambda o: o.new_empty((2,)).batch_size, "sample"),
    "numpy": (lambda o: torch.as_tensor(o.numpy()["obs"]), "sample"),
    "repeat": (lambda o: o.repeat(2, 1), "sample"),
    "to_namedtuple": (lambda o: (o.to_namedtuple().obs, o.to_namedtuple().extra.value), "sample"),
    "__exit__": (lambda o: o.__exit__(None, None, None), "sample"),
    "__getstate__": (lambda o: pickle.loads(pickle.dumps(o)), "sample"),
    "get_non_tensor": (lambda o: o.get_non_tensor("label"), "sample"),
    "is_non_tensor": (lambda o: (o.is_non_tensor("label"), o.is_non_tensor("obs")), "sample"),
    "set_non_tensor": (lambda o: o.set_non_tensor("label", "eval")["label"], "sample"),
    "__add__": (lambda o: o + 1, "sample"),
    "__and__": (lambda o: (o > 0) & (o > 0.5), "sample"),
    "__bool__": (bool, "sample"),
    "__contains__": (lambda o: ("obs" in o, ("extra", "value") in o, "nope" in o), "sample"),
    "__copy__": (copy.copy, "sample"),
    "__delitem__": (_delete, "sample"),
    "__eq__": (lambda o: o == o.clone(), "sample"),
    "__floordiv__": (lambda o: o // 0.5, "sample"),
    "__ge__": (lambda o: o >= 0, "sample"),
    "__getitem__": (
        lambda o: (o[0], o[1:], o[:, 0], o["obs"], o["extra", "value"], o[o["reward"] > 0]),
        "sample",
    ),
    "__gt__": (lambda o: o > 0, "sample"),
    "__iadd__": (_inplace(operator.iadd, 1), "sample"),
    "__imul__": (_inplace(operator.imul, 2), "sample"),
    "__invert__": (lambda o: ~(o > 0), "sample"),
    "__isub__": (_inplace(operator.isub, 1), "sample"),
    "__iter__": (list, "sample"),
    "__itruediv__": (_inplace(operator.itruediv, 2), "sample"),
    "__le__": (lambda o: o <= 0, "sample"),
    "__len__": (len, "sample"),
    "__lt__": (lambda o: o < 0, "sample"),
    "__mod__": (lambda o: o % 0.7, "sample"),
    "__mul__": (lambda o: o * 3, "sample"),
    "__ne__": (lambda o: o != o.clone(), "sample"),
    "__neg__": (operator.neg, "sample"),
    "__or__": (lambda o: (o > 0) | (o > 0.5), "sample"),
    "__pow__": (lambda o: abs(o) ** 2, "sample"),
    "__radd__": (lambda o: 1 + o, "sample"),
    "__rmul__": (lambda o: 2 * o, "sample"),
    "__rsub__": (lambda o: 1 - o, "sample"),
    "__rtruediv__": (lambda o: 1 / (abs(o) + 1), "sample"),
    "__rpow__": (lambda o: 2**o, "sample"),
    "__rfloordiv__": (lambda o: 3 // (abs(o) + 1), "sample"),
    "__rmod__": (lambda o: 3 % (abs(o) + 1), "sample"),
    "__setitem__": (_set_item, "sample"),
    "__sub__": (lambda o: o - 1, "sample"),
    "__torch_function__": (
        lambda o: (torch.stack([o, o]), torch.cat([o, o], 1), torch.unbind(o, 1)),
        "sample",
    ),
    "__truediv__": (lambda o: o / 2, "sample"),
    "__xor__": (lambda o: (o > 0) ^ (o > 0.5), "sample"),
    "__rand__": (lambda o: True & (o > 0), "sample"),
    "__ror__": (lambda o: False | (o > 0), "sample"),
    "__rxor__": (lambda o: True ^ (o > 0), "sample"),
    "add_": (lambda o: o.add_(o.clone(), alpha=2.0), "sample"),
    "all": (lambda o: (o.all(), (o == o).all()), "sample"),
    "all_reduce": (lambda o: o.all_reduce(), "sample"),
    "any": (lambda o: (o.any(), (o > 10).any()), "sample"),
    "apply": (lambda o: o.apply(lambda t: t * 2), "sample"),
    "apply_": (lambda o: o.apply_(lambda t: t * 2), "sample"),
    "broadcast": (lambda o: o.broadcast(0), "sample"),
    "all_gather": (lambda o: o.all_gather()[0], "sample"),
    "scatter": (lambda o: o.scatter(0, [o.clone() * 2]), "sample"),
    # without a process group both refuse alike (tests/distributed/test_remote_init.py)
    "init_remote": (lambda o: o.init_remote(1), "sample"),
    "from_remote_init": (lambda o: type(o).from_remote_init(1), "sample"),
    "chunk": (lambda o: o.chunk(2, 0), "sample"),
    "clamp": (lambda o: o.clamp(-0.5, 0.5), "sample"),
    "cuda": (lambda o: o.cuda() if torch.cuda.is_available() else o.cpu(), "sample"),
    "del_": (lambda o: o.del_(("extra", "value")), "sample"),
    "div_": (lambda o: o.div_(2), "sample"),
    "dumps": (_saved("dumps"), "sample"),
    "exclude": (lambda o: o.exclude("obs", ("extra", "value")), "sample"),
    "expand": (lambda o: o.expand(2, 4, 3), "sample"),
    "expand_as": (lambda o: o.expand_as(o.expand(2, 4, 3)), "sample"),
    "fill_": (lambda o: o.fill_("obs", 1.0), "sample"),
    "flatten": (lambda o: o.flatten(0, 1), "sample"),
    "from_module": (lambda o: _cls(o).from_module(_linear()), "module"),
    "from_modules": (lambda o: _cls(o).from_modules(_linear(), _linear()), "module"),
    "get": (lambda o: (o.get("obs"), o.get(("extra", "value")), o.get("nope", 0)), "sample"),
    "irecv": (lambda o: o.irecv(src=0), "sample"),
    "isend": (lambda o: o.isend(0), "sample"),
    "items": (lambda o: list(o.items(True, True)), "sample"),
    "keys": (lambda o: list(o.keys(True, True)), "sample"),
    "lerp_": (lambda o: o.lerp_(o.clone() * 0, 0.5), "sample"),
    "load": (_loaded("load"), "sample"),
    "load_": (_loaded("load_"), "sample"),
    "load_memmap": (_loaded("load_memmap"), "sample"),
    "load_memmap_": (_loaded("load_memmap_"), "sample"),
    "from_consolidated": (_from_consolidated, "sample"),
    "cat_from_tensordict": (lambda o: o.select("obs").cat_from_tensordict(dim=-1), "sample"),
    "stack_from_tensordict": (lambda o: o.select("obs").stack_from_tensordict(dim=1), "sample"),
    "__reduce_ex__": (lambda o: pickle.loads(pickle.dumps(o.consolidate())), "sample"),
    "load_state_dict": (lambda o: o.load_state_dict((o * 2).state_dict()), "sample"),
    "log": (lambda o: abs(o).log(), "sample"),
    "map": (lambda o: o.map(_map_double, dim=0, num_workers=1, chunksize=2), "sample"),
    "memmap": (_saved("memmap"), "sample"),
    "memmap_": (_saved("memmap_"), "sample"),
    "memmap_like": (lambda o, tmp_path: o.memmap_like(str(tmp_path / "like")), "sample"),
    "make_memmap": (
        lambda o, tmp_path: o.memmap_(str(tmp_path / "m")).make_memmap(("extra", "n"), [4, 3]),
        "sample",
    ),
    "make_memmap_from_tensor": (
        lambda o, tmp_path: o.memmap_(str(tmp_path / "t")).make_memmap_from_tensor(
            ("extra", "new"), torch.ones(4, 3)
        ),
        "sample",
    ),
    "make_memmap_from_storage": (
        lambda o, tmp_path: o.memmap_(str(tmp_path / "s")).make_memmap_from_storage(
            ("extra", "n"), torch.arange(12.0).untyped_storage(), [4, 3], dtype=torch.float32
        ),
        "sample",
    ),
    "memmap_refresh_": (_refresh, "sample"),
    "mul_": (lambda o: o.mul_(2), "sample"),
    "named_apply": (lambda o: o.named_apply(lambda k, t: t + len(k), nested_keys=True), "sample"),
    "permute": (lambda o: o.permute(1, 0), "sample"),
    "pin_memory": (lambda o: o.pin_memory() if torch.cuda.is_available() else o.cpu(), "sample"),
    "pop": (lambda o: (o.pop("obs"), o.pop("nope", None), o), "sample"),
    "pow": (lambda o: abs(o).pow(2), "sample"),
    "recv": (lambda o: o.recv(0), "sample"),
    "reduce": (lambda o: o.reduce(0), "sample"),
    "refine_names": (lambda o: o.refine_names("a", "b").names, "sample"),
    "rename": (lambda o: (o.rename("a", "b").rename(b="t").names, o.rename(None).names), "sample"),
    "rename_": (lambda o: o.rename_("a", ...).names, "sample"),
    "rename_key_": (lambda o: o.rename_key_(("extra", "value"), ("extra", "v")), "sample"),
    "rename_keys": (lambda o: o.rename_keys({("extra", "value"): ("extra", "v")}), "sample"),
    "reshape": (lambda o: o.reshape(12), "sample"),
    "save": (_saved("save"), "sample"),
    "saved_path": (lambda o, tmp_path: o.memmap(str(tmp_path / "p")).saved_path, "sample"),
    "select": (lambda o: o.select("obs", ("extra", "value")), "sample"),
    "send": (lambda o: o.send(0), "sample"),
    "set": (lambda o: o.set("obs", torch.ones(4, 3, 2)), "sample"),
    "set_": (lambda o: o.set_("obs", torch.ones(4, 3, 2)), "sample"),
    "setdefault": (lambda o: o.setdefault("obs", torch.zeros(4, 3)), "sample"),
    "size": (lambda o: (o.size(), o.size(1)), "sample"),
    "split": (lambda o: (o.split(2, 0), o.split([1, 2], 1)), "sample"),
    "sqrt": (lambda o: abs(o).sqrt(), "sample"),
    "state_dict": (
        lambda o: {k: v for k, v in o.state_dict().items() if k != "_metadata"},
        "sample",
    ),
    "sub_": (lambda o: o.sub_(1), "sample"),
    "to": (lambda o: o.to(torch.float64), "sample"),
    "to_module": (_to_module, "module"),
    "transpose": (lambda o: o.transpose(0, 1), "sample"),
    "unbind": (lambda o: o.unbind(1), "sample"),
    "unflatten": (lambda o: o.unflatten(0, (2, 2)), "sample"),
    "unflatten_keys": (lambda o: o.flatten_keys().unflatten_keys(), "sample"),
    "unsqueeze": (lambda o: o.unsqueeze(0), "sample"),
    "update": (
        lambda o: o.update({"obs": torch.ones(4, 3, 2), "extra": {"w": torch.ones(4, 3)}}),
        "sample",
    ),
    "update_": (lambda o: o.update_({"obs": torch.ones(4, 3, 2)}), "sample"),
    "copy_": (lambda o: o.copy_(o.clone() * 0), "sample"),
    "values": (lambda o: list(o.values(True, True)), "sample"),
    "view": (lambda o: o.view(12), "sample"),
}


def _callable_without_arguments(member: Any) -> bool:
    try:
        signature = inspect.signature(member)
    except (TypeError, ValueError):
        return False
    return all(
        p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in signature.parameters.values()
    )


def run_case(name: str, kind: str, tmp_path: Any) -> tuple[Any, Any]:
    """(the container the case ran on, its result or the exception it raised)."""
    function, which = CASES.get(name, (None, "sample"))
    obj = build(kind, which)
    try:
        if function is None:
            member = getattr(obj, name)
            result = member() if callable(member) else member
        elif inspect.isfunction(function) and "tmp_path" in inspect.signature(function).parameters:
            result = function(obj, tmp_path / kind)
        else:
            result = function(obj)
    except Exception as error:  # compared with the other path's exception
        return obj, error
    return obj, result


def _normal(value: Any, root: Any) -> Any:
    """A comparable form: containers as (kind, batch size, leaves), self as a marker."""
    if value is root:
        return ("self", _normal(value, None))
    if isinstance(value, BaseException):
        return ("raised", type(value).__name__)
    if is_tensor_collection(value):
        leaves = {
            key: _normal(leaf, None)
            for key, leaf in value.items(include_nested=True, leaves_only=True)
        }
        return ("container", tuple(value.batch_size), tuple(value.names), leaves)
    if isinstance(value, (tuple, list)):
        return type(value)(_normal(v, root) for v in value)
    if isinstance(value, dict):
        return {k: _normal(v, root) for k, v in value.items()}
    if isinstance(value, nn.Module):
        return type(value).__name__
    if isinstance(value, str) and "/" in value:
        return "<path>"
    return value


def _assert_same(got: Any, want: Any, where: str) -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), where
        torch.testing.assert_close(got, want, equal_nan=True, msg=where)
    elif isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want), (where, got, want)
        for index, (g, w) in enumerate(zip(got, want)):
            _assert_same(g, w, f"{where}[{index}]")
    elif isinstance(want, dict):
        assert got.keys() == want.keys(), (where, sorted(got, key=str), sorted(want, key=str))
        for key in want:
            _assert_same(got[key], want[key], f"{where}[{key!r}]")
    else:
        assert got == want, (where, got, want)


def _kinds_match(got: Any, want: Any, tc_class: type) -> None:
    """Where the TensorDict path gives a TensorDict, the TensorClass path gives the class."""
    if type(want) is TensorDict and want is not None:
        assert isinstance(got, (tc_class, TensorDict)), (type(got), type(want))
    if isinstance(want, (tuple, list)) and isinstance(got, (tuple, list)):
        for g, w in zip(got, want):
            _kinds_match(g, w, tc_class)


API = public_api(TensorDict)


def test_tensorclass_has_every_name_of_tensordict():
    missing = [n for n in API if not hasattr(Sample, n) and n not in MISSING_ON_TENSORCLASS]
    assert not missing, f"TensorClass lacks TensorDict's {missing}"
    stale = [n for n in MISSING_ON_TENSORCLASS if hasattr(Sample, n)]
    assert not stale, f"remove {stale} from MISSING_ON_TENSORCLASS"


@pytest.mark.parametrize("name", [n for n in API if n not in MISSING_ON_TENSORCLASS])
def test_same_member_or_a_listed_own_one(name):
    ours = inspect.getattr_static(TensorDict, name)
    theirs = inspect.getattr_static(Sample, name)
    if theirs is ours:
        return  # the shared implementation itself
    assert name in OWN_ON_TENSORCLASS, (
        f"TensorClass defines its own {name!r}: share TensorDict's (a mixin of "
        f"tdfunc._core.ops.TensorOps or tdfunc._assembly.Features) or list it in "
        f"OWN_ON_TENSORCLASS with the reason"
    )
    if name in SIGNATURE_DIFFERS or not callable(getattr(TensorDict, name)):
        return
    if getattr(TensorDict, name) is None:  # __hash__ = None
        return
    assert inspect.signature(getattr(Sample, name)) == inspect.signature(
        getattr(TensorDict, name)
    ), name


def test_signatures_differ_only_where_listed():
    for name in SIGNATURE_DIFFERS:
        assert inspect.signature(getattr(Sample, name)) != inspect.signature(
            getattr(TensorDict, name)
        ), f"{name} now has TensorDict's signature: remove it from SIGNATURE_DIFFERS"


def test_every_name_has_a_case_or_runs_without_arguments():
    unreachable = [
        n
        for n in API
        if n not in CASES
        and n not in MISSING_ON_TENSORCLASS
        and n not in ("__repr__", "__hash__")
        and callable(getattr(TensorDict, n))
        and not isinstance(inspect.getattr_static(TensorDict, n), property)
        and not _callable_without_arguments(getattr(build("td"), n))
    ]
    assert not unreachable, f"add a case to CASES for {unreachable}"


RUN = [n for n in API if n not in MISSING_ON_TENSORCLASS and n not in ("__repr__", "__hash__")]
# the cases that raise on both paths: the same exception type is the expected result
RAISES = {"__bool__", "all_gather"}  # all_gather: the sample holds a non-tensor entry
_COLLECTIVES = {"all_gather", "all_reduce", "broadcast", "reduce", "scatter"}
_POINT_TO_POINT = {"send", "recv", "isend", "irecv", "init_remote", "from_remote_init"}


@pytest.fixture
def one_rank_group():
    """A gloo process group of one rank (this process), for the collectives."""
    import socket

    import torch.distributed as dist

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("name", RUN)
def test_same_result_as_tensordict(name, tmp_path, request):
    if name in _COLLECTIVES:
        request.getfixturevalue("one_rank_group")
    td, want = run_case(name, "td", tmp_path)
    tc, got = run_case(name, "tc", tmp_path)
    _kinds_match(got, want, type(tc))
    if isinstance(want, BaseException) or isinstance(got, BaseException):
        # point-to-point methods need a second process
        # (tests/distributed/test_tensorclass_distributed.py);
        # here both paths must refuse the same way
        assert name in RAISES | _POINT_TO_POINT, (name, got, want)
        assert type(got) is type(want), (name, got, want)
        return
    _assert_same(_normal(got, tc), _normal(want, td), name)
    # the container each ran on is left in the same state too
    _assert_same(_normal(tc, None), _normal(td, None), f"{name} (after)")


def test_results_keep_the_class_and_frozen_stays_frozen():
    class Frozen(TensorClass["frozen"]):
        x: torch.Tensor

    frozen = Frozen(torch.ones(4, 2), batch_size=[4])
    for result in (frozen[1:], frozen.reshape(2, 2), frozen * 2, frozen.apply(torch.neg)):
        assert type(result) is Frozen and result.is_locked
    with pytest.raises(Exception, match="frozen"):
        frozen.zero_()
    with pytest.raises(Exception, match="frozen"):
        frozen.set("x", torch.zeros(4, 2))
    assert torch.equal(frozen.x, torch.ones(4, 2))


def test_error_texts_name_the_tensorclass():
    instance = sample()
    with pytest.raises(KeyError, match=r"^.Sample\.__getitem__: key 'nope' not found"):
        instance["nope"]
    with pytest.raises(RuntimeError, match=r"^Sample: the truth value of a Sample"):
        bool(instance)
    with pytest.raises(ValueError, match=r"^Sample\.batch_size: cannot set batch size"):
        instance.batch_size = [5]
    with pytest.raises(RuntimeError, match=r"^Sample\.del_: cannot add, replace, delete or rename"):
        instance.lock_().del_("obs")
    with pytest.raises(AttributeError, match=r"^Sample\.set: 'ob' is not a field of Sample"):
        instance.set("ob", torch.zeros(4, 3))
