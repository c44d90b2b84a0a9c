"""``TensorOps``: every core operation shared by ``TensorDict`` and ``TensorClass``.

This is the one place where the core's method mixins are put together (the
features' mixins, persistence, messages, ``map`` and module swapping, join them in
``tdfunc/_assembly.py``). ``TensorDict`` and ``TensorClass`` both derive from
:class:`TensorOps`, so a mixin added here serves both (and every TensorClass
subclass) with one implementation; the parity test (``tests/test_parity.py``)
checks that the two public APIs stay equal.

A mixin reads the container only through the state declared in
:class:`~tdfunc._core.helpers.mixin.ContainerMixin` (``_data``, ``_batch_size``,
``_device``, ``_names``, ``_is_locked``), builds results with ``self._like(...)``
and checks writes with ``self._check_writable(api, key)`` /
``self._check_mutable(api)``. ``TensorDict`` stores that state in slots; a
``TensorClass`` instance forwards it to its inner TensorDict.

Example:
    >>> import torch
    >>> from tdfunc import TensorClass, TensorDict
    >>> class Pair(TensorClass):
    ...     a: torch.Tensor
    >>> issubclass(TensorDict, TensorOps), issubclass(Pair, TensorOps)
    (True, True)
"""

from __future__ import annotations

from .convert.attrs import AttrsMixin
from .convert.casts import CastsMixin
from .convert.entries import EntriesMixin
from .keys.access import AccessMixin
from .keys.at_index import AtIndexMixin
from .keys.nontensor import NonTensorMixin
from .keys.views import KeyViewsMixin
from .math.apply import ApplyMixin
from .math.arith import ArithmeticMixin
from .math.torch_function import TorchFunctionMixin
from .shape.batch import BatchMixin
from .shape.combine import CombineMixin
from .shape.item import ItemMixin
from .shape.ragged import RaggedMixin
from .shape.shape_ops import ShapeOpsMixin
from .state.context import ContextMixin
from .state.locking import LockingMixin
from .tensor_like import TensorLikeMixin


class TensorOps(
    BatchMixin,
    AccessMixin,
    AtIndexMixin,
    LockingMixin,
    KeyViewsMixin,
    ItemMixin,
    ShapeOpsMixin,
    RaggedMixin,
    TensorLikeMixin,
    ArithmeticMixin,
    ApplyMixin,
    CastsMixin,
    TorchFunctionMixin,
    NonTensorMixin,
    ContextMixin,
    EntriesMixin,
    CombineMixin,
    AttrsMixin,
):
    """The core methods of ``TensorDict`` and ``TensorClass`` (add new core mixins here)."""

    __slots__ = ()
