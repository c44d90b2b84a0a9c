"""One ``__torch_function__`` dispatch table for ``torch.stack``, ``torch.cat``, ...

Containers are not tensors; torch calls ``__torch_function__`` on them when
they appear in the arguments of a torch function, and this table routes the
call. Functions not in the table are not supported on containers.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from types import FunctionType
from typing import Any

import torch

from .dims import NO_DIM
from .frozen import is_frozen
from .leafwise import map_leaves, map_pairs
from .nontensor import NonTensorData, cat_non_tensor, stack_non_tensor
from .pointwise_names import PREDICATES, UNARY
from .sizes import BatchShapeError, normalize_dim
from .tracing import dynamo_compiling as _dynamo_compiling

HANDLED: dict[Callable, Callable] = {}


def implements(*funcs: Callable) -> Callable:
    def register(handler: Callable) -> Callable:
        for func in funcs:
            HANDLED[func] = handler
        return handler

    return register


class JoinKeysError(KeyError, RuntimeError):
    """Containers with different keys given to ``torch.stack`` / ``torch.cat``: the
    ``KeyError`` of a missing key, and the ``RuntimeError`` tensordict raises there."""


def _key_error(views: list, api: str) -> KeyError:
    keys = set(views[0]._data)
    for position, view in enumerate(views[1:], start=1):
        if set(view._data) != keys:
            diff = sorted(keys.symmetric_difference(view._data))
            return JoinKeysError(
                f"{api}: the containers at positions 0 and {position} have different keys; "
                f"these keys are only in one of them: {diff}."
            )
    return JoinKeysError(f"{api}: the containers have different keys.")


def _kind(value: Any) -> str:
    """What a container holds at a key, in the words an error message uses."""
    if isinstance(value, NonTensorData):
        return "non-tensor value"
    if isinstance(value, torch.Tensor):
        return "Tensor"  # any subclass: a Parameter joins a Tensor
    if getattr(type(value), "_is_tensordict", False):
        return "TensorDict"
    return type(value).__name__


def _named(path: tuple, key: str) -> str | tuple:
    """A key as users write it: the string at the top level, the tuple below."""
    return (*path, key) if path else key


def _same_kinds(values: list, path: tuple, api: str) -> None:
    """Every container holds the same kind of value at ``path``, or a TypeError names it."""
    first = _kind(values[0])
    for position, value in enumerate(values[1:], start=1):
        kind = _kind(value)
        if kind != first:
            raise TypeError(
                f"{api}: cannot join the entry {_named(path[:-1], path[-1])!r}: the container at "
                f"position 0 holds a {first} there and the one at position {position} a "
                f"{kind}. Every container must hold the same kind of value at a key."
            )


def _combined(views: list, dim: int, stacking: bool, api: str, path: tuple = ()) -> dict:
    """Stack (or concatenate) every value across ``views`` (TensorDicts), key by key."""
    datas = [view._data for view in views]
    first = datas[0]
    # (one C pass: about half the instructions of any() over a map of bound __ne__)
    if list(map(len, datas)).count(len(first)) != len(datas):
        raise _key_error(views, api)
    join = torch.stack if stacking else torch.cat
    data: dict[str, Any] = {}
    for key, value in first.items():
        try:
            values = list(map(itemgetter(key), datas))
        except KeyError:
            raise _key_error(views, api) from None
        # A tensor joined with a container (or two container kinds) would reach
        # the other's torch function and fail there without naming the key. For
        # tensors, the common case, the kinds are looked at only when torch fails.
        if isinstance(value, _Tensor):
            try:
                data[key] = join(values, dim)
            except (RuntimeError, TypeError, AttributeError) as error:
                _same_kinds(values, (*path, key), api)
                shapes = [
                    list(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
                    for v in values
                ]
                raise type(error)(
                    f"{api}: cannot join the entry {_named(path, key)!r} (leaf shapes {shapes}): "
                    f"{error}"
                ) from error
            continue
        kind = type(value)
        # one class at every position is one kind: the per-value names are for errors
        if list(map(type, values)).count(kind) != len(values):
            _same_kinds(values, (*path, key), api)
        if getattr(kind, "_is_tensordict", False):
            data[key] = _join(values, dim, stacking, api, (*path, key))
        elif isinstance(value, NonTensorData):
            data[key] = stack_non_tensor(values, dim) if stacking else cat_non_tensor(values, dim)
        else:  # another container kind (TensorClass): its own __torch_function__
            data[key] = torch.stack(values, dim) if stacking else torch.cat(values, dim)
    return data


def _check_sizes(sizes: list, dim: int, stacking: bool, api: str) -> torch.Size:
    """The batch size of the result; the inputs' batch sizes must agree (but in ``dim``)."""
    size = sizes[0]
    if stacking:
        if sizes.count(size) == len(sizes):  # one C pass in the common case
            if not dim:  # slicing a Size builds a Size: the common case does without
                return torch.Size((len(sizes), *size))
            return torch.Size((*size[:dim], len(sizes), *size[dim:]))
        for position, other in enumerate(sizes[1:], start=1):
            if other != size:
                raise BatchShapeError(
                    f"{api}: all TensorDicts must have the same batch size; position 0 has "
                    f"{list(size)} and position {position} has {list(other)}."
                )
        return torch.Size((*size[:dim], len(sizes), *size[dim:]))
    total = 0
    for position, other in enumerate(sizes):
        if (
            len(other) != len(size)
            or other[:dim] != size[:dim]
            or other[dim + 1 :] != size[dim + 1 :]
        ):
            raise BatchShapeError(
                f"{api}: batch sizes must match except in dim {dim}; position 0 has "
                f"{list(size)} and position {position} has {list(other)}."
            )
        total += other[dim]
    return torch.Size((*size[:dim], total, *size[dim + 1 :]))


def _names_of(views: list, dim: int, stacking: bool):
    names = views[0]._names
    if names is None:
        return None
    for view in views[1:]:
        if view._names != names:
            return None
    return names[:dim] + (None,) + names[dim:] if stacking else names


def _join(views: list, dim: int, stacking: bool, api: str, path: tuple = ()):
    """Stack or concatenate TensorDicts (``dim`` already normalized)."""
    new_size = _check_sizes([view._batch_size for view in views], dim, stacking, api)
    data = _combined(views, dim, stacking, api, path)
    first = views[0]
    # (_names_of, whose first question is inlined: most containers have no names)
    names = None if first._names is None else _names_of(views, dim, stacking)
    return first._like(data, new_size, names)


def _public_join(items, dim: int, out, stacking: bool):
    api = "torch.stack" if stacking else "torch.cat"
    items = list(items)
    if not items:
        raise ValueError(f"{api}: expected a non-empty list of TensorDicts.")
    first = items[0]
    kind = type(first)
    if getattr(kind, "_is_tensordict", False) and list(map(type, items)).count(kind) == len(items):
        views = items  # one TensorDict class: each is its own view
    elif all(getattr(kind, "_is_tensordict", False) for kind in set(map(type, items))):
        views = items
    else:
        for position, item in enumerate(items):
            if not hasattr(item, "_to_tensordict_view"):
                raise TypeError(
                    f"{api}: expected TensorDicts or TensorClass instances to join, got a "
                    f"{type(item).__name__} at position {position}."
                )
        views = [item._to_tensordict_view() for item in items]
    ndim = len(views[0]._batch_size)
    if not stacking and not ndim:
        raise ValueError(f"{api}: cannot concatenate TensorDicts with batch_size=[].")
    limit = ndim + 1 if stacking else ndim
    if dim.__class__ is not int or not 0 <= dim < limit:  # (the checks with their errors)
        dim = normalize_dim(dim, limit, api)
    new_size = _check_sizes([view._batch_size for view in views], dim, stacking, api)
    data = _combined(views, dim, stacking, api)
    names = None if views[0]._names is None else _names_of(views, dim, stacking)
    result = first._like(data, new_size, names)
    if out is not None:
        out.update(result, inplace=True)
        return out
    return result


@implements(torch.stack)
def stack(items, dim: int = 0, *, out=None):
    """Stack containers of equal batch size along a new batch dim.

    Example:
        >>> tds = [TensorDict({"a": torch.zeros(3, 4)}, [3]) for _ in range(2)]
        >>> torch.stack(tds, 1)["a"].shape
        torch.Size([3, 2, 4])
    """
    return _public_join(items, dim, out, True)


@implements(torch.cat, torch.concat, torch.concatenate)
def cat(items, dim: int = 0, *, out=None):
    """Concatenate containers along an existing batch dim.

    Example:
        >>> tds = [TensorDict({"a": torch.zeros(3, 4)}, [3]) for _ in range(2)]
        >>> torch.cat(tds, 0)["a"].shape
        torch.Size([6, 4])
    """
    return _public_join(items, dim, out, False)


@implements(torch.unbind)
def unbind(item, dim: int = 0):
    return item.unbind(dim)


@implements(torch.split)
def split(item, split_size_or_sections, dim: int = 0):
    return item.split(split_size_or_sections, dim)


@implements(torch.chunk)
def chunk(item, chunks: int, dim: int = 0):
    return item.chunk(chunks, dim)


@implements(torch.squeeze)
def squeeze(item, dim=None):
    return item.squeeze(dim)


@implements(torch.unsqueeze)
def unsqueeze(item, dim: int):
    return item.unsqueeze(dim)


@implements(torch.permute)
def permute(item, dims):
    return item.permute(*dims)


@implements(torch.reshape)
def reshape(item, shape):
    return item.reshape(*shape)


@implements(torch.flatten)
def flatten(item, start_dim: int = 0, end_dim: int = -1):
    return item.flatten(start_dim, end_dim)


@implements(torch.unflatten)
def unflatten(item, dim: int, sizes):
    return item.unflatten(dim, sizes)


@implements(torch.transpose)
def transpose(item, dim0: int, dim1: int):
    return item.transpose(dim0, dim1)


@implements(torch.clone)
def clone(item, *, memory_format=None):
    return item.clone()


@implements(torch.zeros_like)
def zeros_like(item, **kwargs):
    return _like(item.apply(lambda t: torch.zeros_like(t, **kwargs)), kwargs)


@implements(torch.ones_like)
def ones_like(item, **kwargs):
    return _like(item.apply(lambda t: torch.ones_like(t, **kwargs)), kwargs)


@implements(torch.empty_like)
def empty_like(item, **kwargs):
    return _like(item.apply(lambda t: torch.empty_like(t, **kwargs)), kwargs)


@implements(torch.full_like)
def full_like(item, fill_value, **kwargs):
    return _like(item.apply(lambda t: torch.full_like(t, fill_value, **kwargs)), kwargs)


def _like(out, kwargs: dict):
    """A ``*_like`` result carries the ``device=`` it was asked for (its leaves are there)."""
    device = kwargs.get("device")
    return out if device is None else out.to(device)


@implements(torch.randn_like)
def randn_like(item, **kwargs):
    return _like(item.apply(lambda t: torch.randn_like(t, **kwargs)), kwargs)


@implements(torch.rand_like)
def rand_like(item, **kwargs):
    return _like(item.apply(lambda t: torch.rand_like(t, **kwargs)), kwargs)


# ---------------------------------------------------------------------- tensor-like surface
# Reductions, pointwise math, index ops (methods of TensorLikeMixin), autograd and losses.
def _method_handler(name: str) -> Callable:
    def handler(item, *args, **kwargs):
        if kwargs and "out" in kwargs and kwargs["out"] is None:
            del kwargs["out"]
        return getattr(item, name)(*args, **kwargs)

    handler.__name__ = name
    return handler


_METHODS = [
    "sum",
    "nansum",
    "mean",
    "nanmean",
    "prod",
    "amax",
    "amin",
    "max",
    "min",
    "cumsum",
    "cumprod",
    "cummax",
    "cummin",
    "logsumexp",
    "all",
    "any",
    "gather",
    "flip",
    "fliplr",
    "flipud",
    "roll",
    "rot90",
    "movedim",
    "moveaxis",
    "swapaxes",
    "swapdims",
    "narrow",
    "tile",
    "repeat_interleave",
    "broadcast_to",
    "tensor_split",
    "masked_select",
    "masked_fill",
    "atleast_1d",
    "atleast_2d",
    "atleast_3d",
    "clamp",
    "clamp_min",
    "clamp_max",
    "lerp",
    "addcmul",
    "addcdiv",
    "quantile",
    "add",
    "sub",
    "mul",
    "div",
    "pow",
    *PREDICATES,
    *UNARY,
]
for _name in _METHODS:
    HANDLED[getattr(torch, _name)] = _method_handler(_name)


def _spread(name: str) -> Callable:
    """``torch.std`` / ``torch.var``: torch's signatures, whose positional arguments after
    ``dim`` are ``unbiased`` then ``keepdim`` (the methods take ``keepdim`` second, as
    tensordict's do), and ``torch.std(input, unbiased)``."""

    def handler(input, *args, unbiased=None, correction=None, keepdim=False, dim=NO_DIM, out=None):
        if args and isinstance(args[0], bool):  # torch.std(input, unbiased)
            unbiased, args = args[0], args[1:]
        elif args:
            dim, args = args[0], args[1:]
            if args:
                unbiased, args = args[0], args[1:]
            if args:
                (keepdim,) = args
        if unbiased is not None:
            if correction is not None:
                raise TypeError(f"torch.{name}: pass unbiased or correction, not both.")
            correction = int(bool(unbiased))
        result = getattr(input, name)(
            dim, keepdim, correction=1 if correction is None else correction
        )
        if out is not None:
            out.update(result, inplace=True)
            return out
        return result

    handler.__name__ = name
    return handler


HANDLED[torch.std] = _spread("std")
HANDLED[torch.var] = _spread("var")
HANDLED[torch.negative] = _method_handler("neg")
HANDLED[torch.absolute] = _method_handler("abs")
HANDLED[torch.clip] = _method_handler("clamp")


def _is_container(value) -> bool:
    return getattr(type(value), "_is_tensor_collection", False)


def _pairwise(name: str) -> Callable:
    """``torch.maximum(a, b)`` and friends: elementwise, either side a container."""
    function = getattr(torch, name)

    def handler(input, other, *, out=None):

        if _is_container(input):
            result = map_pairs(input, other, function, name)
        else:
            result = map_pairs(other, input, lambda b, a: function(a, b), name)
        if out is not None:
            out.update(result, inplace=True)
            return out
        return result

    return handler


for _name in ("maximum", "minimum", "fmax", "fmin"):
    HANDLED[getattr(torch, _name)] = _pairwise(_name)


@implements(torch.where)
def _where(condition, input=None, other=None, *, out=None):
    if _is_container(input):
        return input.where(condition, other, out=out)
    if _is_container(other):
        return other.where(~condition, input, out=out)
    raise TypeError("torch.where: with containers, pass torch.where(condition, input, other).")


@implements(torch.softmax, torch.nn.functional.softmax)
def _softmax(input, dim=None, _stacklevel=3, dtype=None):
    return input.softmax(dim, dtype=dtype)


@implements(torch.log_softmax, torch.nn.functional.log_softmax)
def _log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    return input.log_softmax(dim, dtype=dtype)


@implements(torch.autograd.grad)
def _autograd_grad(outputs, inputs, grad_outputs=None, **kwargs):
    from .autograd import autograd_grad

    return autograd_grad(outputs, inputs, grad_outputs, **kwargs)


def _loss(function: Callable) -> Callable:
    def handler(input, target, *args, **kwargs):

        reduction = kwargs.get("reduction", "mean")
        each = reduction == "none"  # an element-wise loss keeps the leaves' shapes
        if _is_container(input):
            result = map_pairs(
                input,
                target,
                lambda a, b: function(a, b, *args, **kwargs),
                "loss",
                elementwise=each,
            )
        else:
            result = map_pairs(
                target,
                input,
                lambda b, a: function(a, b, *args, **kwargs),
                "loss",
                elementwise=each,
            )
        if reduction == "none":
            return result
        return map_leaves(result, lambda t: t, torch.Size(()), False, lambda names: None)

    handler.__name__ = function.__name__
    return handler


for _loss_fn in (
    torch.nn.functional.l1_loss,
    torch.nn.functional.mse_loss,
    torch.nn.functional.smooth_l1_loss,
    torch.nn.functional.huber_loss,
    torch.nn.functional.binary_cross_entropy,
    torch.nn.functional.binary_cross_entropy_with_logits,
    torch.nn.functional.kl_div,
    torch.nn.functional.soft_margin_loss,
    torch.nn.functional.poisson_nll_loss,
):
    HANDLED[_loss_fn] = _loss(_loss_fn)


# ---------------------------------------------------------------- operators, compiled
# ``td * tensor`` runs ``TensorDict.__mul__`` in Python. torch.compile traces an operator
# with a tensor operand and an operand that defines ``__torch_function__`` as a call of
# a tensor method through ``__torch_function__``, the tensor first: ``t - td`` as
# ``Tensor.sub(t, td)``, ``td - t`` as ``Tensor.__rsub__(t, td)``. These entries send
# each such call back to the container's operator, so compiled code gives what Python
# gives, in one graph. Per method: (the container's method when the container comes
# first, when it comes second), and whether dynamo also traces an in-place operator
# (``td -= t``) as this very call: it then cannot be told from the plain one.
_Base = torch._C.TensorBase
_Tensor = torch.Tensor
_OPERATORS: dict[Any, tuple[str, str, bool]] = {
    _Base.add: ("__add__", "__radd__", True),
    _Base.mul: ("__mul__", "__rmul__", True),
    _Base.sub: ("__sub__", "__rsub__", False),
    _Tensor.__rsub__: ("__rsub__", "__sub__", True),
    _Base.div: ("__truediv__", "__rtruediv__", False),
    _Tensor.__rdiv__: ("__rtruediv__", "__truediv__", True),
    _Tensor.__floordiv__: ("__floordiv__", "__rfloordiv__", False),
    _Tensor.__rfloordiv__: ("__rfloordiv__", "__floordiv__", True),
    _Base.remainder: ("__mod__", "__rmod__", False),
    _Tensor.__rmod__: ("__rmod__", "__mod__", True),
    _Tensor.__pow__: ("__pow__", "__rpow__", False),
    _Tensor.__rpow__: ("__rpow__", "__pow__", True),
    _Base.__and__: ("__and__", "__rand__", False),
    _Base.bitwise_and: ("__and__", "__rand__", True),
    _Base.__or__: ("__or__", "__ror__", False),
    _Base.bitwise_or: ("__or__", "__ror__", True),
    _Base.__xor__: ("__xor__", "__rxor__", False),
    _Base.bitwise_xor: ("__xor__", "__rxor__", True),
    _Base.__eq__: ("__eq__", "__eq__", False),
    _Base.ne: ("__ne__", "__ne__", False),
    _Base.lt: ("__lt__", "__gt__", False),
    _Base.le: ("__le__", "__ge__", False),
    _Base.gt: ("__gt__", "__lt__", False),
    _Base.ge: ("__ge__", "__le__", False),
}


def _operator(first: str, second: str, ambiguous: bool) -> Callable:
    def handler(left, right, *args, **kwargs):
        if args or kwargs:  # ``tensor.add(td, alpha=2)``: not an operator
            return NotImplemented
        if getattr(type(left), "_is_tensor_collection", False):
            method = getattr(type(left), first, None)
            return NotImplemented if method is None else method(left, right)
        if ambiguous and _dynamo_compiling() and not is_frozen(right):
            # ``td += t`` must update ``td`` in place and ``td + t`` must not; a frozen
            # container has no in-place form, so only it is safe to answer for
            name = type(right).__name__
            symbol, method = _SYMBOLS[second]
            hint = (
                f"td.{method}(t) for a new {name}, td.{method}_(t) to update it"
                if method
                else ("the torch function (torch.remainder, torch.bitwise_and, ...)")
            )
            raise TypeError(
                f"{name}: under torch.compile, `{symbol}` between a {name} and a tensor is "
                f"traced as the same call as its in-place form `{symbol}=`, so it cannot "
                f"tell whether to update the {name} in place. Write {hint}; or freeze the "
                f"container, which has no in-place form."
            )
        method = getattr(type(right), second, None)
        return NotImplemented if method is None else method(right, left)

    handler.__name__ = first
    return handler


_SYMBOLS = {  # operator symbol, method name
    "__radd__": ("+", "add"), "__rmul__": ("*", "mul"), "__sub__": ("-", "sub"),
    "__truediv__": ("/", "div"), "__pow__": ("**", "pow"), "__floordiv__": ("//", None),
    "__mod__": ("%", None), "__rand__": ("&", None), "__ror__": ("|", None),
    "__rxor__": ("^", None),
}  # fmt: skip

# The methods written in Python are kept out of HANDLED: dynamo does not find a
# Python function among a dict's keys while tracing (and then fails its own guard on
# the lookup), so the dispatch compares them by identity instead.
_PYTHON_OPERATORS = tuple(
    (method, _operator(*spec))
    for method, spec in _OPERATORS.items()
    if isinstance(method, FunctionType)
)
for _method, _spec in _OPERATORS.items():
    if not isinstance(_method, FunctionType):
        HANDLED.setdefault(_method, _operator(*_spec))
