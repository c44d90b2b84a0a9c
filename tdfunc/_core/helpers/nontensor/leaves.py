"""The two non-tensor leaf classes and the functions that build them from object arrays."""

from __future__ import annotations

import textwrap
from typing import Any

import numpy as np
import torch

from .. import options
from ..hooks import HOOKS
from ..sizes import checked_names, index_batch_size, normalize_dim, pad_plan, resolve_shape
from ..tracing import dynamo_compiling as _dynamo_compiling
from .entries import _NoEntries
from .saving import _Saving
from .values import (
    _check_nested,
    _copy_nested,
    _dims,
    _equal,
    _filled,
    _flat_shape,
    _is_basic,
    _meta,
    _nested_list,
    _positions,
    _size_of,
    join_nested,
    pick_nested,
    take,
)

_VALUES_SHOWN = 50  # characters of a NonTensorStack's values in its repr


class NonTensorData(_Saving, _NoEntries):
    """One Python value shared by every element of a batch.

    ``expand``, ``unsqueeze``, ``repeat`` and ``repeat_interleave`` give a
    ``NonTensorStack`` whose elements all reference the value, as tensordict does;
    rearrangements (``reshape``, ``permute``, ...) and selections (indexing,
    ``squeeze``, ``unbind``, ``split``) keep one ``NonTensorData``.

    Example:
        >>> leaf = NonTensorData("a string!", batch_size=[3])
        >>> leaf[0].data
        'a string!'
        >>> type(leaf.unsqueeze(0)).__name__, leaf.unsqueeze(0).tolist()
        ('NonTensorStack', [['a string!', 'a string!', 'a string!']])
    """

    # pickles (torch.save of a container holding one) name the public path, which no
    # reorganisation of the private modules moves
    __module__ = "tdfunc"
    # ``__dict__`` holds only what a leaf gains after construction (lock, shared and
    # memory-mapped marks, a write-back to its file): building one stays four stores.
    # ``_held``: the value, read through ``data`` (an element of a stack refreshes it).
    __slots__ = ("__dict__", "__weakref__", "_held", "_names", "batch_size", "device")
    _is_non_tensor = True  # what keys(leaves_only=True) leaves out, as tensordict does
    _is_locked = False  # set while a locked container holds it (lock_, share_memory_, memmap_)
    _is_shared = False  # set by the container's share_memory_()
    _is_memmap = False  # set when a container's memmap writes it to a file

    def __init__(self, data: Any, batch_size=(), device=None, names=None) -> None:
        if isinstance(data, NonTensorData):  # tensordict unwraps a NonTensorData
            data = data.data
        self.data = data
        self.batch_size = torch.Size(batch_size)
        self.device = None if device is None else torch.device(device)
        if names is not None:
            self.names = names

    @property
    def data(self) -> Any:
        """The value (for a stack, a nested list shaped like the batch).

        Elements read from a stack through an index (``stack[1:]``, ``td[0]`` of a
        container holding one) show the stack's current values, as a tensor view
        shows its base's: a write into the stack after the read is seen here.
        """
        if "_view_of" in self.__dict__:
            self._refresh()
        return self._held

    @data.setter
    def data(self, value: Any) -> None:
        self._held = value

    def _fresh(self) -> NonTensorData:
        """A new leaf holding the same value, for a container made by an op that makes new
        tensors: a write into that container at an index (in place into a stack that
        elements were read from) must not reach this leaf, as it reaches none of the
        tensors. Values are never changed inside their lists, so sharing them is safe."""
        leaf = type(self)._make(self.data, self.batch_size, self.device)
        names = getattr(self, "_names", None)
        if names is not None:
            leaf._names = names
        return leaf

    def _bump(self) -> None:
        """Count a change of value (what elements read from this leaf compare with)."""
        state = self.__dict__
        state["_version"] = state.get("_version", 0) + 1

    @property
    def names(self) -> list:
        """Names of the batch dims (``None`` for an unnamed dim)."""
        names = getattr(self, "_names", None)
        return list(names) if names is not None else [None] * len(self.batch_size)

    @names.setter
    def names(self, value) -> None:
        self._names = checked_names(value, self.batch_size, f"{type(self).__name__}.names")

    @classmethod
    def _make(cls, data: Any, batch_size: torch.Size, device) -> NonTensorData:
        """Trusted constructor: no conversion of its arguments."""
        self = object.__new__(cls)
        self._held = data
        self.batch_size = batch_size
        self.device = device
        return self

    @property
    def _tensordict(self) -> Any:
        """A ``TensorDict`` view holding this leaf under ``"data"`` (tensordict's layout).

        It shares this leaf (not a copy) and reports its lock, shared and memory-mapped
        state.

        Example:
            >>> NonTensorData("a", batch_size=[2])._tensordict["data"]
            'a'
        """
        view = HOOKS.tensordict._new_unsafe({"data": self}, self.batch_size, self.device, None)
        return view.lock_() if self._is_locked else view

    def update(self, other: Any, *, inplace: bool = False, non_blocking: bool = False, **kw):
        """Take the value of ``other`` (a ``NonTensorData``, or a mapping with ``"data"``).

        Every container holding this leaf sees the new value; a leaf written to a
        file by ``memmap`` writes it there too. A leaf held by a locked container
        refuses unless ``inplace=True`` (or :meth:`update_`), as tensordict's does.

        Example:
            >>> leaf = NonTensorData("a")
            >>> leaf.update(NonTensorData("b")).data
            'b'
        """
        if not inplace and self._is_locked:
            raise RuntimeError(
                f"{type(self).__name__}.update: this leaf belongs to a locked container; "
                f"use update_(...) or update(..., inplace=True) to change its value in place."
            )
        if isinstance(other, NonTensorData):
            if type(other) is NonTensorStack and type(self) is NonTensorData:
                raise ValueError(
                    f"NonTensorData.update: Cannot update a NonTensorDataBase object with a "
                    f"NonTensorStack: a NonTensorData holds one value for its whole batch. "
                    f"Hint: leaf.maybe_to_stack().update(stack) (a NonTensorStack of batch "
                    f"size {list(self.batch_size)})."
                )
            value = other._value()
        elif hasattr(other, "keys") and "data" in other:
            value = other["data"]
        else:
            raise TypeError(
                f"{type(self).__name__}.update: expected a NonTensorData or a mapping with a "
                f"'data' entry, got {type(other).__name__}."
            )
        if type(self) is not NonTensorData:  # a stack keeps one value per element
            size = tuple(self.batch_size)
            source = other if isinstance(other, NonTensorData) else value
            value = _nested_list(np.broadcast_to(as_array(source, self.batch_size), size))
        self._set_value(value)
        return self

    def _set_value(self, value: Any) -> None:
        """Replace the value in place (a memory-mapped leaf writes it to its file too).

        An element read from a ``NonTensorStack`` (``stack[0]``, ``stack[:, 1]``) writes
        its new value into the stack as well.
        """
        view = self.__dict__.get("_view_of")
        if view is not None:
            if self._is_memmaped_from_above():
                # tensordict's rule (and its words): the stack owns the file
                raise RuntimeError(
                    f"{type(self).__name__}: Cannot update a leaf NonTensorDataBase from a "
                    "memmaped parent NonTensorStack. This value was read from a "
                    "memory-mapped stack; write through the stack instead: "
                    "stack[index] = value (or stack.update_(...))."
                )
            parent, index = view
            parent[index] = type(self)._make(value, self.batch_size, self.device)
            self.__dict__["_seen"] = parent.__dict__.get("_version", 0)
        self._held = value
        self._bump()
        write_back = self.__dict__.get("_write_back")
        if write_back is not None:
            write_back(value, stack=type(self) is not NonTensorData)

    def _refresh(self) -> None:
        """An element read from a stack takes the stack's current values, when the stack
        changed since they were read (its ``_version``, after refreshing the stack)."""
        view = self.__dict__.get("_view_of")
        if view is None:
            return
        parent, index = view
        parent._refresh()
        version = parent.__dict__.get("_version", 0)
        state = self.__dict__
        if state.get("_seen") != version:
            self._held = parent._element(index)._held
            state["_seen"] = version
            self._bump()

    def __setitem__(self, index: Any, value: Any) -> None:
        """Write ``value`` (a value, a list or a non-tensor leaf) at ``index``, in place.

        A ``NonTensorData`` holds one value for its whole batch: a write that would
        leave different values in it is a ``TypeError`` (use a ``NonTensorStack``).

        Example:
            >>> stack = NonTensorStack("a", "b")
            >>> stack[0][...] = "c"  # stack[0] is an element of the stack: writes reach it
            >>> stack.tolist()
            ['c', 'b']
        """
        self._refresh()
        new = write_at(self, index, value)
        if type(self) is NonTensorData and type(new) is not NonTensorData:
            values = new._array().reshape(-1)
            if not all(_equal(v, values[0]) for v in values[1:]):
                raise TypeError(
                    f"NonTensorData.__setitem__: a NonTensorData holds one value for its whole "
                    f"batch {list(self.batch_size)}; writing {value!r} at {index!r} would leave "
                    f"different values in it. Hint: convert it first, e.g. "
                    f"leaf = NonTensorStack.from_list(leaf.tolist())."
                )
            new = NonTensorData._make(values[0], self.batch_size, self.device)
        self._set_value(new.data)

    def __getstate__(self) -> Any:
        # an element of a stack pickles as a plain leaf: its stack stays behind; a
        # pickled (or deep-copied) memory-mapped leaf is a copy of the value, as a pickled
        # MemoryMappedTensor is: its writes must not reach the file it was read from
        # (multiprocessing sends the file itself, see tdfunc/_persist/to_process.py)
        state = dict(self.__dict__)
        for link in ("_view_of", "_seen", "_version", "_viewed", "_write_back", "_is_memmap"):
            state.pop(link, None)
        slots = {
            name: getattr(self, name)
            for name in ("_names", "batch_size", "data", "device")
            if hasattr(self, name)
        }
        return state or None, slots

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the value (a function stored as non-tensor data), as tensordict does."""
        return self.data(*args, **kwargs)

    def update_at_(self, value: Any, index: Any, clone: bool = False) -> NonTensorData:
        """Write ``value`` at ``index`` in place (``self[index] = value``); returns self.

        Example:
            >>> NonTensorStack("a", "b").update_at_("c", 1).tolist()
            ['a', 'c']
        """
        self[index] = value
        return self

    def maybe_to_stack(self) -> NonTensorData:
        """This leaf as a ``NonTensorStack`` (one value per element); a stack, or a leaf
        without batch dims, is returned as it is.

        Example:
            >>> NonTensorData("a", batch_size=[2]).maybe_to_stack().tolist()
            ['a', 'a']
        """
        if type(self) is NonTensorStack or not self.batch_size:
            return self
        size = self.batch_size
        return NonTensorStack._make(_filled(self.data, tuple(size)), size, self.device)

    def update_(self, other: Any, *, non_blocking: bool = False, **kw):
        """:meth:`update` in place: allowed while a locked container holds the leaf."""
        return self.update(other, inplace=True, non_blocking=non_blocking, **kw)

    def tolist(self) -> Any:
        """The values as a nested list shaped like the batch (the value itself without one).

        Example:
            >>> NonTensorData("a", batch_size=[2]).tolist()
            ['a', 'a']
        """
        return _nested_list(self._array())

    def _value(self) -> Any:
        """What reading the entry returns: the value (a nested list for a stack)."""
        return self.data

    def _array(self) -> np.ndarray:
        """An object array of the batch shape holding the value at every position."""
        array = np.empty(tuple(self.batch_size), dtype=object)
        array.fill(self.data)
        return array

    # ------------------------------------------------------------------ tensor-like surface
    @property
    def shape(self) -> torch.Size:
        return self.batch_size

    def dim(self) -> int:
        return len(self.batch_size)

    ndim = property(dim)

    def numel(self) -> int:
        return self.batch_size.numel()

    def _with(self, batch_size) -> NonTensorData:
        return NonTensorData._make(self.data, _size_of(batch_size), self.device)

    def _spread(self, batch_size) -> NonTensorData:
        """The value laid out over a new batch, as tensordict does: a ``NonTensorStack``
        whose elements all reference ``self.data`` (no copies), unless the batch size is
        unchanged (the same leaf again) or has no dims (one value)."""
        size = _size_of(batch_size)
        if size == self.batch_size or not size:
            return self._with(size)
        return NonTensorStack._make(_filled(self.data, tuple(size)), size, self.device)

    def __getitem__(self, index) -> NonTensorData:
        return self._with(index_batch_size(self.batch_size, index))

    def reshape(self, *shape) -> NonTensorData:
        return self._with(resolve_shape(self.batch_size, shape))

    view = reshape

    def unsqueeze(self, dim: int) -> NonTensorData:
        return self._spread(_meta(self.batch_size).unsqueeze(dim).shape)

    def squeeze(self, dim=None) -> NonTensorData:
        meta = _meta(self.batch_size)
        return self._with((meta.squeeze() if dim is None else meta.squeeze(dim)).shape)

    def permute(self, *dims) -> NonTensorData:
        return self._with(_meta(self.batch_size).permute(_dims(dims)).shape)

    def transpose(self, dim0: int, dim1: int) -> NonTensorData:
        return self._with(_meta(self.batch_size).transpose(dim0, dim1).shape)

    def expand(self, *shape) -> NonTensorData:
        return self._spread(_meta(self.batch_size).expand(_dims(shape)).shape)

    def flatten(self, start_dim: int | None = 0, end_dim: int | None = -1) -> NonTensorData:
        """Flatten batch dims ``start_dim..end_dim`` (None: the first / the last)."""
        return self._with(_flat_shape(self.batch_size, start_dim, end_dim))

    def unflatten(self, dim: int, sizes) -> NonTensorData:
        return self._with(_meta(self.batch_size).unflatten(dim, sizes).shape)

    def unbind(self, dim: int = 0) -> tuple[NonTensorData, ...]:
        size = list(self.batch_size)
        n = size.pop(dim)
        new = torch.Size(size)
        return tuple(self._with(new) for _ in range(n))

    def split(self, split_size, dim: int = 0) -> tuple[NonTensorData, ...]:
        return tuple(self._with(p.shape) for p in _meta(self.batch_size).split(split_size, dim))

    def chunk(self, chunks: int, dim: int = 0) -> tuple[NonTensorData, ...]:
        return tuple(self._with(p.shape) for p in _meta(self.batch_size).chunk(chunks, dim))

    def _from(self, array: np.ndarray) -> NonTensorData:
        return from_array(array, self.device)

    def repeat(self, *repeats) -> NonTensorData:
        """Repeat along the batch dims, as ``Tensor.repeat``."""
        reps = _dims(repeats)
        if type(self) is NonTensorData:
            return self._spread(_meta(self.batch_size).repeat(reps).shape)
        return self._from(np.tile(self._array(), reps))

    def repeat_interleave(self, repeats, dim: int | None = None) -> NonTensorData:
        """Repeat each element ``repeats`` times along ``dim``, as ``Tensor.repeat_interleave``."""
        if type(self) is NonTensorData:
            return self._spread(_meta(self.batch_size).repeat_interleave(repeats, dim).shape)
        counts = repeats.cpu().numpy() if isinstance(repeats, torch.Tensor) else repeats
        return self._from(np.repeat(self._array(), counts, axis=dim))

    def where(self, condition, other, *, out=None, pad=None) -> NonTensorData:
        """``self`` where ``condition`` (over the batch dims) is true, ``other`` elsewhere.

        ``out`` and ``pad`` are accepted for compatibility with the container method.
        """
        mask = condition.cpu().numpy() if isinstance(condition, torch.Tensor) else condition
        size = torch.Size(np.broadcast_shapes(np.shape(mask), tuple(self.batch_size)))
        if type(self) is NonTensorData and type(other) is not NonTensorStack:
            theirs_value = other.data if type(other) is NonTensorData else other
            if _equal(self.data, theirs_value):
                return self._with(size)  # one value everywhere stays one value
        mine = np.broadcast_to(self._array(), tuple(size))
        theirs = np.broadcast_to(as_array(other, size), tuple(size))
        return self._from(np.where(np.broadcast_to(mask, tuple(size)), mine, theirs))

    def pad(self, pad_size, value: Any = None, *, inplace: bool = False, safe: bool = True):
        """Pad the batch dims as ``TensorDict.pad`` does; the new elements hold ``None``.

        A Python value has no numeric fill: ``value`` (the fill of tensor leaves) is not
        used. Negative sizes crop. Padding a ``NonTensorData`` gives a ``NonTensorStack``,
        so ``inplace=True`` keeps the identity of a stack (or of a crop) and refuses
        otherwise. ``safe`` is accepted for compatibility: the new batch size is always
        checked before anything changes.

        Example:
            >>> NonTensorStack("a", "b").pad([1, 1]).tolist()
            [None, 'a', 'b', None]
        """
        api = f"{type(self).__name__}.pad"
        pairs, size = pad_plan(self.batch_size, pad_size, api)
        if inplace and not any(p for pair in pairs for p in pair):
            return self
        new = padded(self, pairs, size)
        if not inplace:
            return new
        if type(new) is not type(self):
            raise RuntimeError(
                f"{api}: inplace=True cannot preserve the identity of a NonTensorData when "
                f"padding adds elements: the result is a NonTensorStack (the value, then None). "
                f"Use inplace=False and store the result."
            )
        self._check_resizable(api)
        self.data, self.batch_size = new.data, new.batch_size
        return self

    def _check_resizable(self, api: str) -> None:
        """Refuse an in-place change of batch size that a holder of this leaf relies on."""
        if self._is_locked:
            raise RuntimeError(f"{api}: this leaf belongs to a locked container.")
        if "_view_of" in self.__dict__ or self._is_memmap:
            raise RuntimeError(
                f"{api}: this leaf is an element of another stack or is memory-mapped, and "
                f"keeps its batch size; use inplace=False and store the result."
            )

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.stack, torch.cat):
            leaves = list(args[0] if args else kwargs["tensors"])
            dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
            if not all(isinstance(leaf, NonTensorData) for leaf in leaves):
                return NotImplemented
            ndim = len(leaves[0].batch_size)
            if func is torch.stack:
                return stack_non_tensor(leaves, normalize_dim(dim, ndim + 1, "torch.stack"))
            return cat_non_tensor(leaves, normalize_dim(dim, ndim, "torch.cat"))
        return NotImplemented

    def to(self, *args, **kwargs) -> NonTensorData:
        device = kwargs.get("device", args[0] if args else None)
        if isinstance(device, (str, torch.device)):
            out = self._with(self.batch_size)
            out.device = torch.device(device)
            return out
        return self

    def clone(self, *args, **kwargs) -> NonTensorData:
        out = self._with(self.batch_size)
        names = getattr(self, "_names", None)
        if names is not None:  # the same batch dims: the same names
            out._names = names
        return out

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NonTensorData):
            return type(other) is type(self) and _equal(self.data, other.data)
        return _equal(self.data, other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(data={self.data}, batch_size={self.batch_size}, "
            f"device={self.device})"
        )


class NonTensorStack(NonTensorData):
    """One Python value per batch element; ``.data`` is a nested list shaped like the batch.

    Every shape operation goes through a numpy object array, so indexing with
    tensors or masks, permutes and reshapes behave exactly as they do on a tensor.
    Indexing with ints, slices, ``None``, ``...`` and bools gives elements that
    behave as tensor views do: they show later writes to the stack (also those made
    through a container holding it, ``td[1] = ...``) and their own writes reach it.
    A ``NonTensorData`` (one value for a whole batch) has no elements to share: an
    index reads its value as it is then. Other operations (``reshape``, ``detach``,
    arithmetic, ...) give their result its own values, also where its tensors are
    views; ``select``, ``copy`` and ``exclude`` share the leaf, as they share tensors.

    Example:
        >>> stack = NonTensorStack(["a", "b", "c"], batch_size=[3])
        >>> stack[torch.tensor([2, 0])].data
        ['c', 'a']
    """

    __module__ = "tdfunc"  # the public path, as NonTensorData's
    __slots__ = ()

    def __init__(self, *values: Any, stack_dim: int = 0, batch_size=None, device=None) -> None:
        if batch_size is not None and len(values) == 1 and isinstance(values[0], list):
            # tdfunc 0.1's form: NonTensorStack(nested_list, batch_size=[...])
            data, size = values[0], torch.Size(batch_size)
            _check_nested(data, tuple(size))
        else:
            if not values:
                raise ValueError(
                    "NonTensorStack: expected at least one value to stack, e.g. "
                    "NonTensorStack('a', 'b'); use NonTensorStack.from_list([...]) for a list."
                )
            arrays = [as_array(v, torch.Size()) for v in values]
            shapes = {a.shape for a in arrays}
            if len(shapes) > 1:
                raise ValueError(
                    f"NonTensorStack: the stacked values must have the same batch size, got "
                    f"{sorted(list(s) for s in shapes)}."
                )
            dim = normalize_dim(stack_dim, arrays[0].ndim + 1, "NonTensorStack")
            array = np.stack(arrays, axis=dim)
            data, size = _nested_list(array), torch.Size(array.shape)
            if batch_size is not None and torch.Size(batch_size) != size:
                raise ValueError(
                    f"NonTensorStack: batch_size {list(batch_size)} does not match the stack "
                    f"of {len(values)} values, of batch size {list(size)}."
                )
            if device is None:
                first = values[0]
                device = first.device if isinstance(first, NonTensorData) else None
        super().__init__(data, size, device)

    @classmethod
    def from_list(cls, values: list, device=None, *, batch_size=None) -> NonTensorStack:
        """A stack of the items of a (nested) list; its batch size is the nesting shape.

        Example:
            >>> NonTensorStack.from_list([["a", "b"], ["c", "d"]]).batch_size
            torch.Size([2, 2])
        """
        if batch_size is None:
            shape: list[int] = []
            level: Any = values
            while isinstance(level, list):
                shape.append(len(level))
                if not level:
                    break
                level = level[0]
            batch_size = shape
        size = torch.Size(batch_size)
        _check_nested(values, tuple(size))
        return cls._make(
            _copy_nested(values), size, None if device is None else torch.device(device)
        )

    def tolist(self) -> list:
        return self.data

    def _value(self) -> Any:
        return self.data

    def _array(self) -> np.ndarray:
        shape = tuple(self.batch_size)
        array = np.empty(shape, dtype=object)
        for position in np.ndindex(*shape):
            item = self.data
            for i in position:
                item = item[i]
            array[position] = item
        return array

    def _with(self, batch_size) -> NonTensorData:
        # Only called with the same batch size (clone, to): copy the outer lists.
        return NonTensorStack._make(_copy_nested(self.data), _size_of(batch_size), self.device)

    def __getitem__(self, index) -> NonTensorData:
        """The elements at ``index``; with ints, slices, ``None``, ``...`` and bools (each
        element once, as a tensor view), writes to the result reach this stack."""
        out = self._element(index)
        if _is_basic(index):
            out._view_of = (self, index)
            out._seen = self.__dict__.get("_version", 0)
            self._viewed = True  # a container writing into this stack writes in place
            if self._is_locked:
                out._is_locked = True
        return out

    def _element(self, index) -> NonTensorData:
        if _dynamo_compiling():  # ints and slices: Python lists (see join_nested)
            parts = index if type(index) is tuple else (index,)
            if all(type(part) in (int, slice) for part in parts):
                size = index_batch_size(self.batch_size, parts)
                picked = pick_nested(self.data, parts)
                if not size:
                    return NonTensorData._make(picked, size, self.device)
                return NonTensorStack._make(picked, size, self.device)
        return self._from(take(self._array(), index))

    def reshape(self, *shape) -> NonTensorData:
        return self._from(self._array().reshape(tuple(resolve_shape(self.batch_size, shape))))

    view = reshape

    def unsqueeze(self, dim: int) -> NonTensorData:
        dim = normalize_dim(dim, len(self.batch_size) + 1, "NonTensorStack.unsqueeze")
        return self._from(np.expand_dims(self._array(), dim))

    def squeeze(self, dim=None) -> NonTensorData:
        array = self._array()
        if dim is None:
            return self._from(array.squeeze())
        dim = normalize_dim(dim, array.ndim, "NonTensorStack.squeeze")
        return self._from(array.squeeze(dim) if array.shape[dim] == 1 else array)

    def permute(self, *dims) -> NonTensorData:
        return self._from(self._array().transpose(_dims(dims)))

    def transpose(self, dim0: int, dim1: int) -> NonTensorData:
        return self._from(np.swapaxes(self._array(), dim0, dim1))

    def expand(self, *shape) -> NonTensorData:
        target = tuple(_meta(self.batch_size).expand(_dims(shape)).shape)
        return self._from(np.broadcast_to(self._array(), target).copy())

    def flatten(self, start_dim: int | None = 0, end_dim: int | None = -1) -> NonTensorData:
        target = _flat_shape(self.batch_size, start_dim, end_dim)
        return self._from(self._array().reshape(tuple(target)))

    def unflatten(self, dim: int, sizes) -> NonTensorData:
        target = _meta(self.batch_size).unflatten(dim, sizes).shape
        return self._from(self._array().reshape(tuple(target)))

    def unbind(self, dim: int = 0) -> tuple[NonTensorData, ...]:
        array = self._array()
        dim = normalize_dim(dim, array.ndim, "NonTensorStack.unbind")
        prefix = (slice(None),) * dim
        return tuple(self._from(take(array, prefix + (i,))) for i in range(array.shape[dim]))

    def split(self, split_size, dim: int = 0) -> tuple[NonTensorData, ...]:
        array = self._array()
        pieces = _meta(self.batch_size).split(split_size, dim)
        dim = normalize_dim(dim, array.ndim, "NonTensorStack.split")
        bounds = np.cumsum([p.shape[dim] for p in pieces])[:-1]
        return tuple(self._from(p) for p in np.split(array, bounds, axis=dim))

    def chunk(self, chunks: int, dim: int = 0) -> tuple[NonTensorData, ...]:
        sizes = [p.shape[dim] for p in _meta(self.batch_size).chunk(chunks, dim)]
        return self.split(sizes, dim)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NonTensorData):
            other = other._value()
        return _equal(self.data, other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        # tensordict's printed form cuts the values' text after 50 characters: a
        # stack of many (or long) values stays one line in a container's repr.
        values = repr(self.data)
        if len(values) > _VALUES_SHOWN:
            values = values[:_VALUES_SHOWN] + "..."
        values = textwrap.indent(values, "    ")
        return (
            f"{type(self).__name__}(\n{values},\n    batch_size={self.batch_size},\n"
            f"    device={self.device})"
        )


# ---------------------------------------------------------------------- builders
def from_array(array: np.ndarray, device) -> NonTensorData:
    """A leaf for an object array: a ``NonTensorData`` when 0-d, else a ``NonTensorStack``."""
    if array.ndim == 0:
        return NonTensorData._make(array[()], torch.Size(), device)
    return NonTensorStack._make(_nested_list(array), torch.Size(array.shape), device)


def padded(leaf: NonTensorData, pairs: list, size: torch.Size) -> NonTensorData:
    """``leaf`` with its leading batch dims padded by ``pairs`` to ``size``: the values
    where they were, ``None`` in the new slots; negative sizes crop."""
    if all(left == 0 and right == 0 for left, right in pairs):
        return leaf._with(size)  # a new leaf: the result never shares a stack with the input
    if type(leaf) is NonTensorData and all(left <= 0 and right <= 0 for left, right in pairs):
        return leaf._with(size)  # a crop keeps one value
    array = leaf._array()
    starts = [max(left, 0) for left, _ in pairs]
    kept = array[
        tuple(slice(max(-lo, 0), n - max(-hi, 0)) for (lo, hi), n in zip(pairs, array.shape))
    ]
    out = np.full(tuple(size), None, dtype=object)
    out[tuple(slice(s, s + k) for s, k in zip(starts, kept.shape))] = kept
    return from_array(out, leaf.device)


def as_array(leaf: NonTensorData | Any, batch_size: torch.Size) -> np.ndarray:
    """``leaf`` (a non-tensor leaf or a plain Python value) as an object array."""
    if isinstance(leaf, NonTensorData):
        return leaf._array()
    array = np.empty(tuple(batch_size), dtype=object)
    array.fill(leaf)
    return array


def write_at(leaf: NonTensorData, index: Any, value: Any) -> NonTensorData:
    """A new leaf equal to ``leaf`` with ``value`` (a leaf or a Python value) at ``index``."""
    if type(leaf) is NonTensorData:
        new = value.data if type(value) is NonTensorData else value
        if type(value) is not NonTensorStack and _equal(leaf.data, new):
            return leaf
    array = leaf._array().copy()  # C order; np.ascontiguousarray would make a 0-d array 1-d
    positions = _positions(array.shape, index)
    source = as_array(value, torch.Size(positions.shape))
    flat = array.reshape(-1)
    flat[positions.reshape(-1)] = np.broadcast_to(source, positions.shape).reshape(-1)
    return from_array(array, leaf.device)


def written(leaf: NonTensorData, index: Any, value: Any) -> NonTensorData:
    """``leaf`` with ``value`` written at ``index``, as a container's write leaves it.

    A leaf stored somewhere the write must reach is written in place: a stack that
    elements were read from through an index (``td[1:]``: they see the write and
    their own writes still reach it, as views of a tensor do), and a leaf written to
    a file by ``memmap`` (the file gets the new values, as a memory-mapped tensor's
    does; a saved single value given different values per element becomes a stack,
    in the file too). Any other leaf is replaced by a new one.
    """
    new = write_at(leaf, index, value)
    state = leaf.__dict__
    if new is leaf or not (state.get("_viewed") or "_write_back" in state):
        return new
    if type(new) is type(leaf):
        leaf._set_value(new._held)
        return leaf
    if type(leaf) is NonTensorData and type(new) is NonTensorStack:
        # one value per element now: a new stack, bound to the leaf's file (nothing
        # reads a single value through an index, so nothing else holds on to it)
        new.__dict__.update((name, state[name]) for name in _BINDING if name in state)
        new._set_value(new._held)
    return new


# what ties a leaf to the file it was saved in, and its container's lock
_BINDING = ("_is_memmap", "_write_back", "_is_locked")


def stack_non_tensor(leaves: list[NonTensorData], dim: int) -> NonTensorData:
    """Stack non-tensor leaves: equal values stay one value, others become a stack."""
    first = leaves[0]
    if (
        options.capture_non_tensor_stack()
        and all(type(leaf) is NonTensorData for leaf in leaves)
        and all(_equal(leaf.data, first.data) for leaf in leaves[1:])
    ):
        size = list(first.batch_size)
        size.insert(dim, len(leaves))
        return NonTensorData._make(first.data, torch.Size(size), first.device)
    if _dynamo_compiling():
        return _joined(leaves, dim, True)
    return from_array(np.stack([leaf._array() for leaf in leaves], axis=dim), first.device)


def cat_non_tensor(leaves: list[NonTensorData], dim: int) -> NonTensorData:
    """Concatenate non-tensor leaves along an existing batch dim."""
    first = leaves[0]
    if all(type(leaf) is NonTensorData for leaf in leaves) and all(
        _equal(leaf.data, first.data) for leaf in leaves[1:]
    ):
        size = list(first.batch_size)
        size[dim] = sum(leaf.batch_size[dim] for leaf in leaves)
        return NonTensorData._make(first.data, torch.Size(size), first.device)
    if _dynamo_compiling():
        return _joined(leaves, dim, False)
    return from_array(np.concatenate([leaf._array() for leaf in leaves], axis=dim), first.device)


def _joined(leaves: list[NonTensorData], dim: int, stacking: bool) -> NonTensorData:
    """:func:`stack_non_tensor` / :func:`cat_non_tensor` with Python lists (see
    ``join_nested``)."""
    nested = [
        _copy_nested(leaf.data)  # the result's lists are its own, as after np.stack
        if isinstance(leaf, NonTensorStack)
        else _filled(leaf.data, tuple(leaf.batch_size))
        if leaf.batch_size
        else leaf.data
        for leaf in leaves
    ]
    size = list(leaves[0].batch_size)
    dim %= len(size) + stacking  # (np.stack and np.concatenate take negative dims too)
    if stacking:
        size.insert(dim, len(leaves))
    else:
        size[dim] = sum(leaf.batch_size[dim] for leaf in leaves)
    data = join_nested(nested, dim, stacking)
    return NonTensorStack._make(data, torch.Size(size), leaves[0].device)


# The classes name the package face as their module, so doctest would not look for
# their examples here: name them.
__test__ = {"NonTensorData": NonTensorData, "NonTensorStack": NonTensorStack}
