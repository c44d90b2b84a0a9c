"""TensorDict machinery on TensorClass instances: shape, indexing, apply, arithmetic.

Every method forwards to the inner TensorDict and wraps the result, without
validation, in the instance's class (frozen classes give frozen results).
Methods that write refuse on frozen instances. The process methods (``send``,
``recv``, the collectives, ``map``) forward to the functions of
:mod:`tdfunc._distributed` and :mod:`tdfunc._map`, which take any container.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, overload

import torch

from .._core.container import TensorDict
from .._core.keys import is_key
from .._core.torch_function import TorchFunctionMixin
from .._distributed import collectives as _distributed
from .._distributed.map import td_map
from .._distributed.work import DistributedWork

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import EllipsisType

    from typing_extensions import Self

_KEEP: Any = object()
_NO_DEFAULT: Any = object()  # "no argument given" (a default or names)


class TensorClassOps(TorchFunctionMixin):
    """Shape operations, indexing, ``apply`` and arithmetic of ``TensorClass`` instances.

    Example:
        >>> class Pair(TensorClass):
        ...     a: torch.Tensor
        ...     b: torch.Tensor
        >>> pair = Pair(torch.zeros(4, 3), torch.ones(4), batch_size=[4])
        >>> type(pair[1:]).__name__, pair.reshape(2, 2).a.shape
        ('Pair', torch.Size([2, 2, 3]))
        >>> torch.stack([pair, pair]).batch_size
        torch.Size([2, 4])
        >>> (pair.apply(lambda t: t * 2) == pair * 2).all()
        True
    """

    __slots__ = ()
    if TYPE_CHECKING:
        _td: TensorDict
        _tc_frozen: ClassVar[bool]

    # ------------------------------------------------------------------ trusted building
    def _wrap_td(self, td: TensorDict) -> Self:
        """An instance of this class around ``td`` (no copy, no validation)."""
        if td is self._td:
            return self
        out = object.__new__(type(self))
        object.__setattr__(out, "_td", td)
        if self._tc_frozen:
            td._is_locked = True  # writes through a parent TensorDict cannot restructure it
        return out

    @classmethod
    def _new_unsafe(cls, data: dict, batch_size: torch.Size, device=None, names=None) -> Self:
        out = object.__new__(cls)
        td = TensorDict._new_unsafe(data, batch_size, device, names)
        td._is_locked = cls._tc_frozen
        object.__setattr__(out, "_td", td)
        return out

    @classmethod
    def _from_pytree(cls, data: dict, batch_size: torch.Size, device, names) -> Self:
        """Rebuild after a pytree transform (leaves may be ints/None inside vmap specs)."""
        out = object.__new__(cls)
        td = TensorDict._new_unsafe(data, batch_size, device, names)
        td._is_locked = cls._tc_frozen
        object.__setattr__(out, "_td", td)
        return out

    def _like(self, data: dict, batch_size: torch.Size | None = None, names: Any = _NO_DEFAULT):
        """A new instance of this class with ``data`` (trusted)."""
        if names is _NO_DEFAULT:
            return self._wrap_td(self._td._like(data, batch_size))
        return self._wrap_td(self._td._like(data, batch_size, names))

    def _to_tensordict_view(self) -> TensorDict:
        """The inner TensorDict (shared, not a copy)."""
        return self._td

    @property
    def _data(self) -> dict:
        return self._td._data

    def _check_mutable(self, api: str, hint: str | None = None) -> None:
        if self._tc_frozen:
            name = type(self).__name__
            if hint is None:
                hint = f"use the out-of-place version (it returns a new {name})"
            raise dataclasses.FrozenInstanceError(
                f"{name}.{api}: {name} is frozen and cannot be modified; {hint}."
            )

    def _check_receives(self, api: str) -> None:
        """Refuse the distributed methods that write the tensors in place (on every rank)."""
        name = type(self).__name__
        self._check_mutable(
            api,
            f"{api} writes the received values into its tensors. Receive into a TensorDict "
            f"(td = instance.to_tensordict(); td.{api}(...)) and rebuild the instance with "
            f"{name}.from_tensordict(td)",
        )

    # ------------------------------------------------------------------ shape
    @property
    def batch_size(self) -> torch.Size:
        """The leading dims every field shares."""
        return self._td._batch_size

    @batch_size.setter
    def batch_size(self, value: Any) -> None:
        self._check_mutable("batch_size")
        self._td.batch_size = value

    @property
    def shape(self) -> torch.Size:
        return self._td._batch_size

    @property
    def batch_dims(self) -> int:
        return len(self._td._batch_size)

    @property
    def ndim(self) -> int:
        return len(self._td._batch_size)

    def dim(self) -> int:
        return len(self._td._batch_size)

    def numel(self) -> int:
        return self._td._batch_size.numel()

    def size(self, dim: int | None = None) -> Any:
        return self._td.size(dim)

    @property
    def device(self) -> torch.device | None:
        return self._td._device

    @property
    def names(self) -> list | None:
        return self._td.names

    @names.setter
    def names(self, value: Any) -> None:
        self._check_mutable("names")
        self._td.names = value

    def __len__(self) -> int:
        return len(self._td)

    def __iter__(self) -> Iterator[Self]:
        if not self._td._batch_size:
            raise TypeError(
                f"{type(self).__name__}: iteration over an instance with batch_size=[] is not "
                f"possible; give it a batch dim or read its fields."
            )
        return iter(self.unbind(0))

    def __bool__(self) -> bool:
        raise RuntimeError(
            f"{type(self).__name__}: the truth value of a tensorclass is ambiguous; use "
            f".all() or .any()."
        )

    # ------------------------------------------------------------------ indexing
    @overload
    def __getitem__(self, index: str) -> Any: ...

    @overload
    def __getitem__(
        self, index: int | slice | torch.Tensor | list[Any] | EllipsisType | None
    ) -> Self: ...

    @overload
    def __getitem__(self, index: tuple[Any, ...]) -> Any: ...

    def __getitem__(self, index: Any) -> Any:
        """A key (``str`` or tuple of ``str``) reads a value; anything else indexes the batch."""
        if type(index) is str or is_key(index):
            return self.get(index)  # type: ignore[attr-defined]
        return self._wrap_td(self._td._index(index))

    def __setitem__(self, index: Any, value: Any) -> None:
        self._check_mutable("__setitem__")
        if type(index) is str or is_key(index):
            self.set(index, value)  # type: ignore[attr-defined]
        else:
            self._td._set_at_index(index, value)

    def reshape(self, *shape: Any) -> Self:
        return self._wrap_td(self._td.reshape(*shape))

    def view(self, *shape: Any) -> Self:
        return self._wrap_td(self._td.view(*shape))

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Self:
        return self._wrap_td(self._td.flatten(start_dim, end_dim))

    def unflatten(self, dim: int, sizes: Any) -> Self:
        return self._wrap_td(self._td.unflatten(dim, sizes))

    def squeeze(self, dim: int | None = None) -> Self:
        return self._wrap_td(self._td.squeeze(dim))

    def unsqueeze(self, dim: int) -> Self:
        return self._wrap_td(self._td.unsqueeze(dim))

    def permute(self, *dims: Any) -> Self:
        return self._wrap_td(self._td.permute(*dims))

    def transpose(self, dim0: int, dim1: int) -> Self:
        return self._wrap_td(self._td.transpose(dim0, dim1))

    def expand(self, *shape: Any) -> Self:
        return self._wrap_td(self._td.expand(*shape))

    def expand_as(self, other: Any) -> Self:
        return self._wrap_td(self._td.expand(other.shape))

    def unbind(self, dim: int = 0) -> tuple[Self, ...]:
        """The instances along batch dim ``dim``; they share storage with this one.

        Example:
            >>> class Point(TensorClass):
            ...     xy: torch.Tensor
            >>> points = Point(torch.zeros(3, 2), batch_size=[3])
            >>> first = points.unbind(0)[0]
            >>> first.xy.fill_(1.0)
            tensor([1., 1.])
            >>> points.xy[0]
            tensor([1., 1.])
        """
        return tuple(self._wrap_td(td) for td in self._td.unbind(dim))

    def split(self, split_size: int | list[int], dim: int = 0) -> tuple[Self, ...]:
        return tuple(self._wrap_td(td) for td in self._td.split(split_size, dim))

    def chunk(self, chunks: int, dim: int = 0) -> tuple[Self, ...]:
        return tuple(self._wrap_td(td) for td in self._td.chunk(chunks, dim))

    # ------------------------------------------------------------------ apply
    def apply(
        self,
        fn: Callable,
        *others: Any,
        batch_size: Any = None,
        names: Any = _KEEP,
        inplace: bool = False,
        filter_empty: bool = True,
    ) -> Self:
        """A new instance with ``fn`` applied to every tensor leaf (see ``TensorDict.apply``)."""
        if inplace:
            return self.apply_(fn, *others)
        if names is _KEEP:
            result = self._td.apply(fn, *others, batch_size=batch_size, filter_empty=filter_empty)
        else:
            result = self._td.apply(
                fn, *others, batch_size=batch_size, names=names, filter_empty=filter_empty
            )
        return self._wrap_td(result)

    def named_apply(
        self, fn: Callable, *others: Any, nested_keys: bool = False, batch_size: Any = None
    ) -> Self:
        return self._wrap_td(
            self._td.named_apply(fn, *others, nested_keys=nested_keys, batch_size=batch_size)
        )

    def _apply_tree(self, fn, others, new_size, prefix, filter_empty) -> Self:
        return self._wrap_td(self._td._apply_tree(fn, others, new_size, prefix, filter_empty))

    def apply_(self, fn: Callable, *others: Any) -> Self:
        self._check_mutable("apply_")
        self._td.apply_(fn, *others)
        return self

    def clone(self, recurse: bool = True) -> Self:
        """A copy; with ``recurse=False`` the copy shares the tensors."""
        return self._wrap_td(self._td.clone(recurse))

    def copy(self) -> Self:
        return self._wrap_td(self._td._shallow_copy())

    def detach(self) -> Self:
        return self._wrap_td(self._td.detach())

    def detach_(self) -> Self:
        self._check_mutable("detach_")
        self._td.detach_()
        return self

    def contiguous(self) -> Self:
        return self._wrap_td(self._td.contiguous())

    def requires_grad_(self, requires_grad: bool = True) -> Self:
        self._check_mutable("requires_grad_")
        self._td.requires_grad_(requires_grad)
        return self

    def zero_(self) -> Self:
        self._check_mutable("zero_")
        self._td.zero_()
        return self

    def fill_(self, key: Any, value: Any) -> Self:
        self._check_mutable("fill_")
        self._td.fill_(key, value)
        return self

    def empty(self, recurse: bool = False) -> Self:
        return self._wrap_td(self._td.empty(recurse))

    def to(self, *args: Any, **kwargs: Any) -> Self:
        """Move and/or cast every tensor leaf, like ``Tensor.to``."""
        return self._wrap_td(self._td.to(*args, **kwargs))

    def _set_device(self, device: Any) -> None:
        self._td._set_device(device)

    def cpu(self) -> Self:
        return self.to("cpu")

    def cuda(self, device: Any = None) -> Self:
        return self.to("cuda" if device is None else device)

    def float(self) -> Self:
        return self.to(torch.float32)

    def double(self) -> Self:
        return self.to(torch.float64)

    def half(self) -> Self:
        return self.to(torch.float16)

    def bfloat16(self) -> Self:
        return self.to(torch.bfloat16)

    def share_memory_(self) -> Self:
        """Move the tensors to shared memory (values unchanged: allowed when frozen)."""
        self._td.share_memory_()
        return self

    def is_shared(self) -> bool:
        return self._td.is_shared()

    # ------------------------------------------------------------------ arithmetic
    def __add__(self, other: Any) -> Self:
        return self._wrap_td(self._td + other)

    def __radd__(self, other: Any) -> Self:
        return self._wrap_td(other + self._td)

    def __sub__(self, other: Any) -> Self:
        return self._wrap_td(self._td - other)

    def __rsub__(self, other: Any) -> Self:
        return self._wrap_td(other - self._td)

    def __mul__(self, other: Any) -> Self:
        return self._wrap_td(self._td * other)

    def __rmul__(self, other: Any) -> Self:
        return self._wrap_td(other * self._td)

    def __truediv__(self, other: Any) -> Self:
        return self._wrap_td(self._td / other)

    def __rtruediv__(self, other: Any) -> Self:
        return self._wrap_td(other / self._td)

    def __pow__(self, other: Any) -> Self:
        return self._wrap_td(self._td**other)

    def __neg__(self) -> Self:
        return self._wrap_td(-self._td)

    def __abs__(self) -> Self:
        return self._wrap_td(abs(self._td))

    def __eq__(self, other: object) -> Self:  # type: ignore[override]
        """Elementwise equality: an instance of this class holding bool tensors."""
        return _compared(self, self._td == other)

    def __ne__(self, other: object) -> Self:  # type: ignore[override]
        return _compared(self, self._td != other)

    def __lt__(self, other: Any) -> Self:
        return _compared(self, self._td < other)

    def __le__(self, other: Any) -> Self:
        return _compared(self, self._td <= other)

    def __gt__(self, other: Any) -> Self:
        return _compared(self, self._td > other)

    def __ge__(self, other: Any) -> Self:
        return _compared(self, self._td >= other)

    __hash__ = None  # type: ignore[assignment]  # frozen classes restore object.__hash__

    # In place: a frozen instance answers NotImplemented, so `p += x` rebinds p to p + x.
    def __iadd__(self, other: Any) -> Self:
        if self._tc_frozen:
            return NotImplemented
        self._td += other
        return self

    def __isub__(self, other: Any) -> Self:
        if self._tc_frozen:
            return NotImplemented
        self._td -= other
        return self

    def __imul__(self, other: Any) -> Self:
        if self._tc_frozen:
            return NotImplemented
        self._td *= other
        return self

    def __itruediv__(self, other: Any) -> Self:
        if self._tc_frozen:
            return NotImplemented
        self._td /= other
        return self

    def add_(self, other: Any, *, alpha: builtins.float | None = None) -> Self:
        self._check_mutable("add_")
        self._td.add_(other, alpha=alpha)
        return self

    def sub_(self, other: Any) -> Self:
        self._check_mutable("sub_")
        self._td.sub_(other)
        return self

    def mul_(self, other: Any) -> Self:
        self._check_mutable("mul_")
        self._td.mul_(other)
        return self

    def div_(self, other: Any) -> Self:
        self._check_mutable("div_")
        self._td.div_(other)
        return self

    def lerp_(self, end: Any, weight: builtins.float) -> Self:
        self._check_mutable("lerp_")
        self._td.lerp_(end, weight)
        return self

    def all(self) -> bool:
        """True when every element of every tensor leaf is true (non-zero)."""
        return self._td.all()

    def any(self) -> bool:
        """True when some element of some tensor leaf is true (non-zero)."""
        return self._td.any()

    def norm(self) -> torch.Tensor:
        return self._td.norm()

    # ------------------------------------------------------------------ processes
    def send(self, dst: int, *, group: Any = None, tag: int = 0) -> None:
        """Send every tensor field to rank ``dst`` (blocking); see ``TensorDict.send``.

        The receiver calls :meth:`recv` on an instance (or TensorDict) of the same
        structure. Non-tensor fields are not sent. Frozen instances can send.

        Example:
            >>> # on every rank: pair = Pair(x=torch.zeros(3), y=torch.zeros(3), batch_size=[3])
            >>> # rank 1: pair.send(dst=0)
            >>> # rank 0: pair.recv(src=1)  # pair now holds rank 1's values
        """
        _distributed.send(self, dst, group=group, tag=tag)

    def isend(self, dst: int, *, group: Any = None, tag: int = 0) -> DistributedWork:
        """Start sending to rank ``dst``; returns a handle (see ``TensorDict.isend``).

        Example:
            >>> # rank 1: work = pair.isend(dst=0); work.wait()
        """
        return _distributed.isend(self, dst, group=group, tag=tag)

    def recv(self, src: int | None = None, *, group: Any = None, tag: int = 0) -> int:
        """Receive into the tensor fields, in place; returns the sender's rank.

        Refused (``FrozenInstanceError``) on a frozen instance. See ``TensorDict.recv``.

        Example:
            >>> # rank 0: sender = pair.recv(src=1)
        """
        self._check_receives("recv")
        return _distributed.recv(self, src, group=group, tag=tag)

    def irecv(self, src: int | None = None, *, group: Any = None, tag: int = 0) -> DistributedWork:
        """Start receiving into the tensor fields; in place after ``handle.wait()``.

        Refused on a frozen instance. See ``TensorDict.irecv``.

        Example:
            >>> # rank 0: work = pair.irecv(src=1); ...; work.wait()
        """
        self._check_receives("irecv")
        return _distributed.irecv(self, src, group=group, tag=tag)

    def broadcast(self, src: int, *, group: Any = None, async_op: bool = False) -> Any:
        """Overwrite every rank's tensor fields with those of rank ``src`` (in place).

        Refused on a frozen instance (on every rank, so no rank waits for another).
        Returns self, or a :class:`DistributedWork` with ``async_op=True``.

        Example:
            >>> # every rank: params.broadcast(src=0)
        """
        self._check_receives("broadcast")
        return _distributed.broadcast(self, src, group=group, async_op=async_op)

    def all_reduce(self, op: Any = None, *, group: Any = None, async_op: bool = False) -> Any:
        """Reduce every tensor field across ``group``, in place on every rank.

        ``op`` is a ``torch.distributed.ReduceOp`` (default ``SUM``). Refused on a
        frozen instance. Returns self, or a handle with ``async_op=True``.

        Example:
            >>> # every rank: grads.all_reduce(torch.distributed.ReduceOp.AVG)
        """
        self._check_receives("all_reduce")
        return _distributed.all_reduce(self, op, group=group, async_op=async_op)

    def reduce(self, dst: int, op: Any = None, *, group: Any = None, async_op: bool = False) -> Any:
        """Reduce every tensor field across ``group`` into rank ``dst``'s instance.

        Refused on a frozen instance (on every rank). Returns self, or a handle
        with ``async_op=True``.

        Example:
            >>> # every rank: metrics.reduce(dst=0)  # rank 0 holds the sums
        """
        self._check_receives("reduce")
        return _distributed.reduce(self, dst, op, group=group, async_op=async_op)

    def map(
        self,
        fn: Callable,
        dim: int = 0,
        num_workers: int | None = None,
        chunksize: int | None = None,
        num_chunks: int | None = None,
        pool: Any = None,
        pbar: bool = False,
        mp_start_method: str | None = None,
    ) -> Any:
        """Apply ``fn`` to chunks along ``dim`` in worker processes (see ``TensorDict.map``).

        The tensors are first moved to shared memory in place; ``fn`` gets chunks
        of this class. Returns self when ``fn`` edits in place (returns ``None``),
        else the concatenated results.

        Example:
            >>> # def brighten(chunk): chunk.pixels.add_(1)  (at module level)
            >>> # frames.map(brighten, num_workers=2)
        """
        return td_map(
            self, fn, dim, num_workers, chunksize, num_chunks, pool, pbar, mp_start_method
        )


def _compared(instance: Any, result: Any) -> Any:
    """A comparison's result: a plain bool (another type of operand) stays a bool."""
    return result if isinstance(result, bool) else instance._wrap_td(result)
