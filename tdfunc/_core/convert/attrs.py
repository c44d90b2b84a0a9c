"""``attrs``: a container describing each leaf's device, dtype and shape, and
``to(attrs)``, which casts each leaf to what its description says.

The descriptions are ``TensorAttrs`` instances (a TensorClass with the fields
``tgt_device``, ``tgt_dtype``, ``tgt_shape``), found by their stable name: the core
does not import the classes composed above it.

Example:
    >>> td = TensorDict({"a": torch.zeros(3), "b": torch.zeros(3, dtype=torch.int32)}, [3])
    >>> target = TensorDict({"a": torch.zeros(3), "b": torch.zeros(3)}, [3])
    >>> target.to(td.attrs(fields=("dtype",)))["b"].dtype
    torch.int32
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..helpers.mixin import ContainerMixin
from ..helpers.rewrap import drop_device

if TYPE_CHECKING:
    from typing_extensions import Self
from ..helpers.attrs import _attrs_class

_FIELDS = ("device", "dtype", "shape")


def describe(tensor: torch.Tensor, fields: Sequence[str]) -> Any:
    """The ``TensorAttrs`` of ``tensor``, with the requested fields set."""
    values = {
        "tgt_device": tensor.device if "device" in fields else None,
        "tgt_dtype": tensor.dtype if "dtype" in fields else None,
        "tgt_shape": torch.Size(tensor.shape) if "shape" in fields else None,
    }
    return _attrs_class()(**values, batch_size=())


class AttrsMixin(ContainerMixin):
    """``attrs`` and the per-leaf form of ``to``, shared by every container."""

    __slots__ = ()

    def attrs(self, *, fields: Sequence[str] = _FIELDS, num_threads: int | None = None) -> Any:
        """A TensorDict (batch size ``[]``, no device) describing each tensor leaf.

        Each leaf becomes a :class:`~tdfunc.TensorAttrs` whose ``tgt_device``,
        ``tgt_dtype`` and ``tgt_shape`` hold the leaf's attributes named in
        ``fields`` (the others stay ``None``). Passed to :meth:`to`, it casts each
        leaf of another container with the same keys to its description, which a
        single device or dtype cannot do for leaves that differ. ``num_threads`` is
        accepted for tensordict's signature; the leaves are described in turn.

        Example:
            >>> td = TensorDict({"a": torch.zeros(3), "b": torch.zeros(3, dtype=torch.int32)}, [3])
            >>> attrs = td.attrs()
            >>> attrs["b"].tgt_dtype, attrs["b"].tgt_shape
            (torch.int32, torch.Size([3]))
        """
        api = f"{type(self).__name__}.attrs"
        if isinstance(fields, str) or not set(fields) <= set(_FIELDS):
            raise ValueError(
                f"{api}: fields must be a subset of {_FIELDS}, got {fields!r}; "
                f"e.g. fields=('device', 'dtype')."
            )
        plain = self._plain_tensordict()
        out = plain({}, batch_size=())
        for key, leaf in self.items(True, True):  # type: ignore[attr-defined]
            if isinstance(leaf, torch.Tensor):
                out.set(key, describe(leaf, tuple(fields)))
        return out

    def _to_per_leaf(self, attrs: Any, non_blocking: bool, inplace: bool) -> Self:
        """Each tensor leaf cast to the device and dtype its ``TensorAttrs`` gives;
        leaves without one (or with neither set) are kept as they are."""
        kind = _attrs_class()

        def target(key: Any) -> tuple:
            try:
                found = attrs.get(key)
            except KeyError:
                return None, None
            if not isinstance(found, kind):
                return None, None
            return found.tgt_device, found.tgt_dtype

        def cast(key: Any, tensor: Any) -> Any:
            if not isinstance(tensor, torch.Tensor):
                return tensor
            device, dtype = target(key)
            if device is None and dtype is None:
                return tensor
            return tensor.to(device=device, dtype=dtype, non_blocking=non_blocking)

        moved = self._apply_tree(cast, (), None, (), False, check=False)  # type: ignore[attr-defined]
        devices = {
            leaf.device for _, leaf in moved.items(True, True) if isinstance(leaf, torch.Tensor)
        }
        device = self._device if devices <= {self._device} else None
        if not inplace:
            if device is None:
                drop_device(moved)
            return moved
        for key, leaf in moved.items(True, True):
            if leaf is not self.get(key):  # type: ignore[attr-defined]
                self.set(key, leaf)  # type: ignore[attr-defined]
        if device is None:
            drop_device(self)
        return self
