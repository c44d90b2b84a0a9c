"""``TensorLikeMixin``: the tensor-like surface of a container, in one base class.

It gathers the reductions, pointwise math, extra shape and index ops, constructors
and conversions, autograd helpers and consolidation. Each piece reads the container
only through the attributes declared in ``mixin.py``, so TensorDict and every
TensorClass share one implementation.

Example:
    >>> td = TensorDict({"a": torch.tensor([1.0, -4.0])}, [2])
    >>> td.abs().sqrt().sum(reduce=True), td.isnan().any()
    (tensor(3.), False)
"""

from __future__ import annotations

from .convert.consolidate import ConsolidateMixin
from .convert.constructors import ConstructorsMixin
from .convert.interop import InteropMixin
from .convert.tabular import TabularMixin
from .math.autograd import AutogradMixin
from .math.pointwise import PointwiseMixin
from .math.reductions import ReductionsMixin
from .shape.index_ops import IndexOpsMixin


class TensorLikeMixin(
    ReductionsMixin,
    PointwiseMixin,
    IndexOpsMixin,
    ConstructorsMixin,
    InteropMixin,
    TabularMixin,
    AutogradMixin,
    ConsolidateMixin,
):
    """Reductions, pointwise math, index ops, constructors, conversions (arrays, pytrees,
    tables), autograd and consolidation."""

    __slots__ = ()
