"""Element-wise math and predicates, leaf by leaf, with their ``_`` in-place forms.

Out-of-place methods return a new container of the same class (batch size and names
kept); in-place methods write into every tensor leaf and return ``self``. In-place
writes are allowed on a locked TensorDict (they change no key) and refused on a
frozen TensorClass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..helpers.leafwise import (
    check_grown,
    in_place_write,
    inplace_leaves,
    is_collection,
    map_leaves,
    map_pairs,
    may_grow,
    others_data,
)
from ..helpers.missing_keys import check_default, map_pairs_default
from ..helpers.mixin import ContainerMixin
from ..helpers.operand import check_batch_aligned_operand


def _paired(self: Any, other: Any, fn: Callable, api: str, default: Any) -> Any:
    """``fn`` of every leaf with ``other``'s, ``default`` (not None) for the keys only one
    side has. The callers test ``default is None`` themselves: the common call then
    costs no extra frame."""
    check_default(default, api, type(self).__name__)
    if not is_collection(other):
        return map_pairs(self, other, fn, api)
    return map_pairs_default(self, other, fn, api, default)


_DEFAULT_DOC = """

        ``default`` is for a container ``other`` whose keys differ: ``None`` (a
        ``KeyError``), ``"intersection"`` (only the keys both have), or a tensor that
        stands in for the entry one side lacks (the result has the keys of both)."""


def _unary(name: str) -> Callable:
    method = getattr(torch.Tensor, name)

    def op(self):
        return map_leaves(self, method, None, True, None)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = (
        f"``torch.{name}`` of every tensor leaf (a new container).\n\n"
        f"        Example:\n"
        f"            >>> x = torch.tensor([0.5, 0.25])\n"
        f'            >>> (TensorDict({{"a": x}}, [2]).{name}()["a"] == torch.{name}(x)).all()\n'
        f"            tensor(True)\n"
    )
    return op


def _unary_(name: str) -> Callable:
    method = getattr(torch.Tensor, name + "_")

    def op(self):
        inplace_leaves(self, name + "_", method)
        return self

    op.__name__ = op.__qualname__ = name + "_"
    op.__doc__ = (
        f"``{name}`` of every tensor leaf, in place; returns self.\n\n"
        f"        Example:\n"
        f"            >>> x = torch.tensor([0.5, 0.25])\n"
        f'            >>> td = TensorDict({{"a": x.clone()}}, [2]).{name}_()\n'
        f'            >>> (td["a"] == torch.{name}(x)).all()\n'
        f"            tensor(True)\n"
    )
    return op


def _predicate(name: str) -> Callable:
    function = getattr(torch, name)

    def op(self):
        return map_leaves(self, function, None, True, None)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = (
        f"``torch.{name}`` of every tensor leaf: a container of boolean tensors.\n\n"
        f"        Example:\n"
        f'            >>> x = torch.tensor([1.0, float("nan"), float("inf"), -float("inf")])\n'
        f'            >>> (TensorDict({{"a": x}}, [4]).{name}()["a"] == torch.{name}(x)).all()\n'
        f"            tensor(True)\n"
    )
    return op


def _binary(name: str, function: Callable) -> Callable:
    def op(self, other, *, default=None):
        if default is None:
            return map_pairs(self, other, function, name)
        return _paired(self, other, function, name, default)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = (
        f"``torch.{name}`` of every tensor leaf with ``other`` (a container with the same "
        f"keys, a tensor or a number).{_DEFAULT_DOC}\n\n"
        f"        Example:\n"
        f'            >>> td = TensorDict({{"a": torch.tensor([1.0, 4.0])}}, [2])\n'
        f'            >>> td.{name}(torch.tensor([2.0, 3.0]))["a"].tolist() == '
        f"torch.{name}(td['a'], torch.tensor([2.0, 3.0])).tolist()\n"
        f"            True\n"
    )
    return op


def _binary_(name: str) -> Callable:
    method = getattr(torch.Tensor, name + "_", None)
    if method is None:  # maximum_, minimum_: no in-place form in torch
        function = getattr(torch, name)

        def method(leaf, other):
            return leaf.copy_(function(leaf, other))

    def op(self, other):
        in_place_write(self, other, method, name + "_")
        return self

    op.__name__ = op.__qualname__ = name + "_"
    op.__doc__ = (
        f"``{name}`` of every tensor leaf with ``other``, in place; returns self.\n\n"
        f"        Example:\n"
        f'            >>> td = TensorDict({{"a": torch.tensor([1.0, 4.0])}}, [2])\n'
        f'            >>> td.{name}_(torch.tensor([2.0, 3.0]))["a"].tolist() == '
        f"torch.{name}(torch.tensor([1.0, 4.0]), torch.tensor([2.0, 3.0])).tolist()\n"
        f"            True\n"
    )
    return op


def _add_scaled(leaf: torch.Tensor, other: Any, value: float) -> torch.Tensor:
    return leaf.add_(other, alpha=value)


class PointwiseMixin(ContainerMixin):
    """Element-wise math of a container: ``abs``, ``exp``, ``clamp``, ``isnan``, ...

    Example:
        >>> td = TensorDict({"a": torch.tensor([-1.0, 4.0])}, [2])
        >>> td.abs().sqrt()["a"].tolist(), td.clamp_min(0.0)["a"].tolist()
        ([1.0, 2.0], [0.0, 4.0])
    """

    __slots__ = ()

    abs = _unary("abs")
    acos = _unary("acos")
    asin = _unary("asin")
    atan = _unary("atan")
    ceil = _unary("ceil")
    cos = _unary("cos")
    cosh = _unary("cosh")
    erf = _unary("erf")
    erfc = _unary("erfc")
    erfinv = _unary("erfinv")
    exp = _unary("exp")
    expm1 = _unary("expm1")
    floor = _unary("floor")
    frac = _unary("frac")
    lgamma = _unary("lgamma")
    log = _unary("log")
    log10 = _unary("log10")
    log1p = _unary("log1p")
    log2 = _unary("log2")
    neg = _unary("neg")
    reciprocal = _unary("reciprocal")
    round = _unary("round")
    rsqrt = _unary("rsqrt")
    sigmoid = _unary("sigmoid")
    sign = _unary("sign")
    sin = _unary("sin")
    sinh = _unary("sinh")
    sqrt = _unary("sqrt")
    tan = _unary("tan")
    tanh = _unary("tanh")
    trunc = _unary("trunc")

    abs_ = _unary_("abs")
    acos_ = _unary_("acos")
    asin_ = _unary_("asin")
    atan_ = _unary_("atan")
    ceil_ = _unary_("ceil")
    cos_ = _unary_("cos")
    cosh_ = _unary_("cosh")
    erf_ = _unary_("erf")
    erfc_ = _unary_("erfc")
    erfinv_ = _unary_("erfinv")
    exp_ = _unary_("exp")
    expm1_ = _unary_("expm1")
    floor_ = _unary_("floor")
    frac_ = _unary_("frac")
    lgamma_ = _unary_("lgamma")
    log_ = _unary_("log")
    log10_ = _unary_("log10")
    log1p_ = _unary_("log1p")
    log2_ = _unary_("log2")
    neg_ = _unary_("neg")
    reciprocal_ = _unary_("reciprocal")
    round_ = _unary_("round")
    rsqrt_ = _unary_("rsqrt")
    sigmoid_ = _unary_("sigmoid")
    sign_ = _unary_("sign")
    sin_ = _unary_("sin")
    sinh_ = _unary_("sinh")
    sqrt_ = _unary_("sqrt")
    tan_ = _unary_("tan")
    tanh_ = _unary_("tanh")
    trunc_ = _unary_("trunc")

    isnan = _predicate("isnan")
    isfinite = _predicate("isfinite")
    isinf = _predicate("isinf")
    isposinf = _predicate("isposinf")
    isneginf = _predicate("isneginf")
    isreal = _predicate("isreal")

    maximum = _binary("maximum", torch.maximum)
    minimum = _binary("minimum", torch.minimum)
    maximum_ = _binary_("maximum")
    minimum_ = _binary_("minimum")
    pow_ = _binary_("pow")

    def clamp(self, min: Any = None, max: Any = None):
        """Clamp every tensor leaf to ``[min, max]`` (numbers, tensors or containers).

        Example:
            >>> TensorDict({"a": torch.tensor([-2.0, 0.5, 3.0])}, [3]).clamp(-1, 1)["a"]
            tensor([-1.0000,  0.5000,  1.0000])
        """
        if is_collection(min) or is_collection(max):
            # torch.clamp is min(max(x, lo), hi): the same two steps, paired key by key
            result = self if min is None else self.clamp_min(min)
            return result if max is None else result.clamp_max(max)
        for bound in (min, max):
            check_batch_aligned_operand(self, bound, "clamp")
        result = map_leaves(self, lambda t: torch.clamp(t, min, max), None, True, None)
        for bound in (min, max):
            if may_grow(self, bound):
                check_grown(result, bound, "clamp")
        return result

    def clamp_(self, min: Any = None, max: Any = None):
        """Clamp every tensor leaf to ``[min, max]`` in place; returns self.

        Example:
            >>> TensorDict({"a": torch.tensor([-2.0, 3.0])}, [2]).clamp_(max=1.0)["a"]
            tensor([-2.,  1.])
        """
        if is_collection(min) or is_collection(max):
            for bound in (min, max):  # both bounds' keys are checked before any write
                others_data(bound, self, "clamp_")
            if min is not None:
                self.clamp_min_(min)
            return self if max is None else self.clamp_max_(max)
        for bound in (min, max):
            check_batch_aligned_operand(self, bound, "clamp_")
        inplace_leaves(self, "clamp_", lambda leaf: leaf.clamp_(min, max))
        return self

    def clamp_min(self, min: Any, default: Any = None):
        """Clamp every tensor leaf from below (``min`` a number, tensor or container).

        ``default``: for a container ``min`` with other keys, as for :meth:`add`.

        Example:
            >>> TensorDict({"a": torch.tensor([-2.0, 3.0])}, [2]).clamp_min(0.0)["a"]
            tensor([0., 3.])
        """
        if default is None:
            return map_pairs(self, min, torch.clamp_min, "clamp_min")
        return _paired(self, min, torch.clamp_min, "clamp_min", default)

    def clamp_max(self, max: Any, *, default: Any = None):
        """Clamp every tensor leaf from above (``max`` a number, tensor or container).

        ``default``: for a container ``max`` with other keys, as for :meth:`add`.

        Example:
            >>> TensorDict({"a": torch.tensor([-2.0, 3.0])}, [2]).clamp_max(0.0)["a"]
            tensor([-2.,  0.])
        """
        if default is None:
            return map_pairs(self, max, torch.clamp_max, "clamp_max")
        return _paired(self, max, torch.clamp_max, "clamp_max", default)

    def clamp_min_(self, min: Any):
        """:meth:`clamp_min` in place; returns self.

        Example:
            >>> TensorDict({"a": torch.tensor([-2.0, 3.0])}, [2]).clamp_min_(0.0)["a"]
            tensor([0., 3.])
        """
        in_place_write(self, min, torch.Tensor.clamp_min_, "clamp_min_")
        return self

    def clamp_max_(self, max: Any):
        """:meth:`clamp_max` in place; returns self.

        Example:
            >>> TensorDict({"a": torch.tensor([-2.0, 3.0])}, [2]).clamp_max_(0.0)["a"]
            tensor([-2.,  0.])
        """
        in_place_write(self, max, torch.Tensor.clamp_max_, "clamp_max_")
        return self

    def lerp(self, end: Any, weight: Any):
        """``torch.lerp`` of every leaf towards ``end`` (a container with the same keys).

        Example:
            >>> td = TensorDict({"a": torch.zeros(2)}, [2])
            >>> td.lerp(td + 4, 0.25)["a"].tolist()
            [1.0, 1.0]
        """
        if is_collection(weight):
            raise TypeError(
                f"{type(self).__name__}.lerp: weight must be a number or a tensor, got a "
                f"{type(weight).__name__}. For a weight per entry, use "
                f"td.apply(torch.lerp, end, weight)."
            )
        check_batch_aligned_operand(self, weight, "lerp")
        result = map_pairs(self, end, lambda a, b: torch.lerp(a, b, weight), "lerp")
        if may_grow(self, weight):
            check_grown(result, weight, "lerp")
        return result

    def addcmul(self, tensor1: Any, tensor2: Any, *, value: float = 1):
        """``self + value * tensor1 * tensor2``, leaf by leaf.

        Example:
            >>> td = TensorDict({"a": torch.ones(2)}, [2])
            >>> td.addcmul(td * 2, td * 3, value=0.5)["a"].tolist()
            [4.0, 4.0]
        """
        return self + (tensor1 * tensor2) * value

    def addcdiv(self, tensor1: Any, tensor2: Any, *, value: float = 1):
        """``self + value * tensor1 / tensor2``, leaf by leaf.

        Example:
            >>> td = TensorDict({"a": torch.ones(2)}, [2])
            >>> td.addcdiv(td * 2, td * 4, value=2)["a"].tolist()
            [2.0, 2.0]
        """
        return self + (tensor1 / tensor2) * value

    def addcmul_(self, tensor1: Any, tensor2: Any, *, value: float = 1):
        """:meth:`addcmul` in place; returns self.

        Example:
            >>> td = TensorDict({"a": torch.ones(2)}, [2])
            >>> td.addcmul_(torch.full((2,), 2.0), torch.full((2,), 3.0))["a"].tolist()
            [7.0, 7.0]
        """
        in_place_write(self, tensor1 * tensor2, _add_scaled, "addcmul_", value)
        return self

    def addcdiv_(self, tensor1: Any, tensor2: Any, *, value: float = 1):
        """:meth:`addcdiv` in place; returns self.

        Example:
            >>> td = TensorDict({"a": torch.ones(2)}, [2])
            >>> td.addcdiv_(torch.full((2,), 2.0), torch.full((2,), 4.0))["a"].tolist()
            [1.5, 1.5]
        """
        in_place_write(self, tensor1 / tensor2, _add_scaled, "addcdiv_", value)
        return self

    def mul(self, other: Any, *, default: Any = None):
        """``self * other``, leaf by leaf (``default``: as for :meth:`add`).

        Example:
            >>> TensorDict({"a": torch.ones(2)}, [2]).mul(3)["a"].tolist()
            [3.0, 3.0]
        """
        if default is None:
            return map_pairs(self, other, torch.mul, "mul")
        return _paired(self, other, torch.mul, "mul", default)

    def add(self, other: Any, *, alpha: float | None = None, default: Any = None):
        """``self + alpha * other``, leaf by leaf.

        ``default`` is for a container ``other`` whose keys differ: ``None`` raises a
        ``KeyError``; ``"intersection"`` computes only the keys both have; a tensor stands
        in for the entry that one side lacks, and the result has the keys of both. The
        other binary methods (``sub``, ``mul``, ``div``, ``pow``, ``maximum``, ...) take
        it too.

        Example:
            >>> td = TensorDict({"a": torch.ones(2)}, [2])
            >>> td.add(3, alpha=2)["a"].tolist()
            [7.0, 7.0]
            >>> other = TensorDict({"a": torch.ones(2), "b": torch.ones(2)}, [2])
            >>> sorted(td.add(other, default="intersection").keys())
            ['a']
            >>> td.add(other, default=torch.tensor(10.0))["b"].tolist()
            [11.0, 11.0]
        """
        fn = torch.add if alpha is None else lambda a, b: torch.add(a, b, alpha=alpha)
        if default is None:
            return map_pairs(self, other, fn, "add")
        return _paired(self, other, fn, "add", default)

    def sub(self, other: Any, *, alpha: float | None = None, default: Any = None):
        """``self - alpha * other``, leaf by leaf (``default``: as for :meth:`add`).

        Example:
            >>> TensorDict({"a": torch.ones(2)}, [2]).sub(3)["a"].tolist()
            [-2.0, -2.0]
        """
        fn = torch.sub if alpha is None else lambda a, b: torch.sub(a, b, alpha=alpha)
        if default is None:
            return map_pairs(self, other, fn, "sub")
        return _paired(self, other, fn, "sub", default)

    def rsub(self, other: Any, *, alpha: float | None = None, default: Any = None):
        """``other - alpha * self``, leaf by leaf (``default``: as for :meth:`add`).

        Example:
            >>> TensorDict({"a": torch.ones(2)}, [2]).rsub(3, alpha=2)["a"].tolist()
            [1.0, 1.0]
        """
        scale = 1 if alpha is None else alpha

        def fn(a, b):
            return torch.sub(b, a, alpha=scale)

        if default is None:
            return map_pairs(self, other, fn, "rsub")
        return _paired(self, other, fn, "rsub", default)

    def div(self, other: Any, *, default: Any = None):
        """``self / other``, leaf by leaf (``default``: as for :meth:`add`).

        Example:
            >>> TensorDict({"a": torch.ones(2)}, [2]).div(4)["a"].tolist()
            [0.25, 0.25]
        """
        if default is None:
            return map_pairs(self, other, torch.div, "div")
        return _paired(self, other, torch.div, "div", default)

    def bitwise_and(self, other: Any, *, default: Any = None):
        """``torch.bitwise_and`` of every leaf with ``other`` (``default``: as for :meth:`add`).

        Example:
            >>> td = TensorDict({"a": torch.tensor([True, False])}, [2])
            >>> td.bitwise_and(torch.tensor([True, True]))["a"].tolist()
            [True, False]
        """
        if default is None:
            return map_pairs(self, other, torch.bitwise_and, "bitwise_and")
        return _paired(self, other, torch.bitwise_and, "bitwise_and", default)

    def logical_and(self, other: Any, *, default: Any = None):
        """``torch.logical_and`` of every leaf with ``other``: boolean leaves.

        ``default``: as for :meth:`add`.

        Example:
            >>> td = TensorDict({"a": torch.tensor([2.0, 0.0])}, [2])
            >>> td.logical_and(torch.tensor([1.0, 1.0]))["a"].tolist()
            [True, False]
        """
        if default is None:
            return map_pairs(self, other, torch.logical_and, "logical_and")
        return _paired(self, other, torch.logical_and, "logical_and", default)
