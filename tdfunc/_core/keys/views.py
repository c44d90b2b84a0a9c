"""Views of the keys and conversions: ``select``, ``exclude``, ``flatten_keys``, ``to_dict``, ...

A mixin of :class:`~tdfunc._core.ops.TensorOps`, so ``TensorDict`` and every
``TensorClass`` share it. Results are built with ``self._like`` (the same kind
of container as ``self``).

Example:
    >>> import torch
    >>> from tdfunc import TensorDict
    >>> td = TensorDict({"a": torch.zeros(()), "b": {"c": torch.ones(())}})
    >>> list(td.exclude("a").flatten_keys().keys())
    ['b.c']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from ..helpers.mixin import ContainerMixin, is_tensor_collection, read_value
from ..helpers.nested_keys import MISSING, key_parts, unravel_key
from ..helpers.nontensor import NonTensorData
from ..helpers.parents import write_back
from ..helpers.repr import td_repr
from ..helpers.writes import write_path

if TYPE_CHECKING:
    from typing_extensions import Self

    from ..._assembly import TensorDict

_NO_DEFAULT = MISSING


_Tensor = torch.Tensor
_read = read_value


class KeyViewsMixin(ContainerMixin):
    """Key selection, key flattening and conversions (``TensorDict`` and ``TensorClass``)."""

    __slots__ = ()

    # ------------------------------------------------------------------ key views
    @property
    def sorted_keys(self) -> list:
        """The keys of this level in alphabetical order (as ``sorted(td.keys())``).

        Computed on each read: unlike tensordict, no cache is kept while the
        container is locked (sorting a level's keys costs less than keeping a cache
        exact).

        Example:
            >>> TensorDict({"b": torch.zeros(()), "a": torch.zeros(())}).sorted_keys
            ['a', 'b']
        """
        return sorted(self.keys())

    def select(
        self, *keys, strict: bool = True, inplace: bool = False, as_tensordict: bool = False
    ) -> Self:
        """A TensorDict holding only ``keys`` (sharing the tensors).

        ``as_tensordict=True`` on a TensorClass returns a plain TensorDict
        instead of an instance whose other fields are unset (no effect on a
        TensorDict, nor with ``inplace=True``).

        Example:
            >>> td = TensorDict({"a": torch.zeros(()), "b": {"c": torch.zeros(()), "d": 0}})
            >>> list(td.select("a", ("b", "c")).keys(True, True))
            ['a', ('b', 'c')]
        """
        if inplace:  # the lock is the error to report, before a missing key
            self._check_writable("select", keys)
        out = self._like({})
        for key in keys:
            parts = key_parts(key, "TensorDict.select")
            value = self._get_nested(parts)
            if value is _NO_DEFAULT:
                if strict:
                    raise self._missing(key, "select")
                continue
            node, source = out._to_tensordict_view(), self._to_tensordict_view()
            for part in parts[:-1]:
                inner = source._data[part]
                if part not in node._data:  # the same class: a TensorClass stays one
                    node._data[part] = inner._like({})
                node = node._data[part]._to_tensordict_view()
                source = inner._to_tensordict_view()
            # a nested container is copied (a TensorClass too): the selection holds its own
            node._data[parts[-1]] = value._shallow_copy() if is_tensor_collection(value) else value
        if inplace:
            self._data = out._data
            return self
        if as_tensordict and not getattr(type(out), "_is_tensordict", False):
            return out._to_tensordict_view()._shallow_copy()
        return out

    def exclude(self, *keys, inplace: bool = False) -> Self:
        """A TensorDict without ``keys`` (sharing the tensors); missing keys are ignored."""
        if inplace and keys:
            self._check_writable("exclude", keys)
        out = self if inplace else self._shallow_copy()
        for key in keys:
            parts = key_parts(key, "TensorDict.exclude")
            node: Any = out
            for part in parts[:-1]:
                node = node._data.get(part)
                if not is_tensor_collection(node):  # missing, or a leaf in the way
                    node = None
                    break
                node = node._to_tensordict_view()  # through a TensorClass too
            if node is not None and parts[-1] in node._data:
                if inplace and node is not out:  # a locked level or a frozen TensorClass
                    node._check_writable("exclude", unravel_key(key))
                node._data.pop(parts[-1])
        return out

    def separates(
        self, *keys, default: Any = MISSING, strict: bool = True, filter_empty: bool = True
    ) -> Self:
        """Move the entries at ``keys`` out of this container into a new one; returns it.

        A missing key is a ``KeyError`` unless ``default`` is given (the new container
        then holds ``default`` there) or ``strict=False`` (it is skipped). With
        ``filter_empty`` (the default) nested containers left empty here are removed.

        Example:
            >>> td = TensorDict(a=0, b=TensorDict(c=0, d=0))
            >>> out = td.separates("a", ("b", "d"))
            >>> list(out.keys(True, True)), list(td.keys(True, True))
            (['a', ('b', 'd')], [('b', 'c')])
        """
        present, missing = [], []
        for key in keys:
            parts = key_parts(key, f"{type(self).__name__}.separates")
            (missing if self._get_nested(parts) is MISSING else present).append(parts)
        if missing and default is MISSING and strict:
            raise self._missing(missing[0], "separates")
        if present:
            self._check_writable("separates", present[0])
        out = self.select(*present)
        if default is not MISSING:
            for parts in missing:
                out.set(parts, default)
        self.exclude(*present, inplace=True)
        if filter_empty:
            self.filter_empty_()
        return out

    def _shallow_copy(self) -> Self:
        """A copy of the key structure (nested TensorDicts and TensorClasses too) sharing
        the leaves."""
        return self._like(
            {k: v._shallow_copy() if is_tensor_collection(v) else v for k, v in self._data.items()}
        )

    def copy(self) -> Self:
        """A shallow copy: new (nested) TensorDicts holding the same tensors."""
        return self._shallow_copy()

    __copy__ = copy

    def empty(
        self, recurse: bool = False, *, batch_size=None, device: Any = MISSING, names=MISSING
    ) -> Self:
        """A container with no keys (no leaves with ``recurse``: nested containers stay,
        empty), with this one's batch size, device and names unless given.

        With ``recurse``, the nested containers keep their own batch sizes, which must start
        with the new one.

        Example:
            >>> td = TensorDict({"a": torch.zeros(3), "b": {"c": torch.ones(3)}}, [3])
            >>> td.empty(batch_size=[]).batch_size, td.empty(recurse=True)["b"].batch_size
            (torch.Size([]), torch.Size([3]))
        """
        if not recurse:
            out = self._like({})
        else:
            # a nested TensorClass stays one (with its fields unset), as in tensordict
            out = self._like(
                {k: v.empty(True) for k, v in self._data.items() if is_tensor_collection(v)}
            )
        if batch_size is not None:
            out.batch_size = batch_size  # checked against the nested containers kept
        if names is not MISSING:
            out.names = names
        if device is not MISSING:
            out._set_device(device)
        return out

    def create_nested(self, key: Any) -> Self:
        """Set an empty TensorDict at ``key``, with this container's batch size, device
        and names (an entry already at ``key`` is replaced); returns self.

        Example:
            >>> td = TensorDict({"a": torch.zeros(2)}, [2]).create_nested(("b", "c"))
            >>> td["b", "c"].batch_size, td["b", "c"].is_empty()
            (torch.Size([2]), True)
        """
        names = self.names if any(n is not None for n in self.names) else None
        nested = self._plain_tensordict()(
            {}, batch_size=self.batch_size, device=self.device, names=names
        )
        self.set(key, nested)
        return self

    def entry_class(self, key: Any) -> type:
        """The class of the entry at ``key`` (``type(td.get(key))``).

        Example:
            >>> TensorDict({"a": torch.zeros(2), "s": "x"}, [2]).entry_class("s").__name__
            'NonTensorData'
        """
        return type(self.get(key))

    def filter_empty_(self) -> Self:
        """Delete, in place, the nested containers that hold no leaf (at any depth).

        Example:
            >>> td = TensorDict({"a": torch.zeros(()), "b": {"c": {}}})
            >>> list(td.filter_empty_().keys(True))
            ['a']
        """
        for key, value in list(self.items()):
            if is_tensor_collection(value) and value.filter_empty_().is_empty():
                del self[key]
        return self

    def flatten_keys(self, separator: str = ".", inplace: bool = False, is_leaf=None) -> Self:
        """Flatten nested keys into single keys joined by ``separator``.

        ``is_leaf`` (a function of a class) keeps a nested container whose class
        it accepts as one value instead of flattening it.

        Example:
            >>> td = TensorDict({"a": {"b": torch.zeros(())}}, [])
            >>> list(td.flatten_keys(".").keys())
            ['a.b']
        """
        if inplace:  # the lock is the error to report, before a clash of keys
            self._check_writable("flatten_keys", separator)
        data: dict = {}
        if is_leaf is None and type(separator) is str:
            _flatten_into(data, self, "", separator, self._plain_tensordict(), self)
        else:
            pairs = (
                self._iter_items((), True, True) if is_leaf is None else _leaf_items(self, is_leaf)
            )
            for key, value in pairs:
                name = key if type(key) is str else separator.join(key)
                if name in data:
                    raise _clash(self, name, separator)
                data[name] = value
        if inplace:
            self._data = data
            return self
        out = self._like(data)
        return write_back(out, self, lambda flat: flat.unflatten_keys(separator))

    def unflatten_keys(self, separator: str = ".", inplace: bool = False) -> Self:
        """Split keys on ``separator`` into nested TensorDicts.

        Example:
            >>> td = TensorDict({"a.b": torch.zeros(()), "c": torch.zeros(())})
            >>> list(td.unflatten_keys(".").keys(True, True))
            [('a', 'b'), 'c']
        """
        if inplace:  # the lock is the error to report, before a clash of keys
            self._check_writable("unflatten_keys", separator)
        out = self._like({})
        leaves: dict = {}  # every leaf path written, to the key it came from
        branches: set = set()  # every path that holds leaves below it
        plain = self._plain_tensordict()
        for key, value in self._data.items():
            parts = tuple(key.split(separator)) if separator in key else (key,)
            if type(value) is plain:
                value = value.unflatten_keys(separator)
            if is_tensor_collection(value):  # a TensorClass's fields stay as they are
                inner = value._to_tensordict_view()._iter_keys((), True, True)
                paths = [parts + unravel_key_tuple(k) for k in inner]
            else:
                paths = [parts]
            for path in paths:
                clash = leaves.get(path) or next(
                    (leaves[path[:i]] for i in range(1, len(path)) if path[:i] in leaves), None
                )
                if clash is None and path in branches:
                    clash = next(k for p, k in leaves.items() if p[: len(path)] == path)
                if clash is not None:
                    raise KeyError(
                        f"TensorDict.unflatten_keys: Unflattening key(s) in tensordict will "
                        f"override an existing for unflattened key: keys {clash!r} and {key!r} "
                        f"both unflatten to {path!r} (or one inside the other); rename one."
                    )
            for path in paths:
                leaves[path] = key
                branches.update(path[:i] for i in range(1, len(path)))
            write_path(out, parts, value, False, True, "unflatten_keys", [], [], ())
        if inplace:
            self._data = out._data
            return self
        return write_back(out, self, lambda nested: nested.flatten_keys(separator))

    # ------------------------------------------------------------------ misc
    def _to_tensordict_view(self) -> Self:
        return self

    def to_dict(self, *, retain_none: bool = True, convert_tensors=False) -> dict:
        """A nested ``dict`` of the values (non-tensor leaves as their Python values).

        Args:
            retain_none: keep the ``None`` fields of nested tensorclasses.
            convert_tensors: ``True`` turns tensors into lists, ``"numpy"`` into arrays.

        Example:
            >>> TensorDict({"a": torch.arange(2)}).to_dict(convert_tensors=True)
            {'a': [0, 1]}
        """
        out = {}
        for k, v in self._data.items():
            if is_tensor_collection(v):
                kwargs = {"convert_tensors": convert_tensors} if convert_tensors else {}
                out[k] = v.to_dict(retain_none=retain_none, **kwargs)
            elif isinstance(v, _Tensor) and convert_tensors:
                out[k] = v.numpy(force=True) if convert_tensors == "numpy" else v.tolist()
            else:
                out[k] = _read(v)
        if retain_none:
            for name in self._field_names:
                out.setdefault(name, None)
        return out

    def to_tensordict(self, *, retain_none: bool | None = None) -> TensorDict:
        """A copy as a plain ``TensorDict`` (tensors cloned, TensorClasses converted).

        Args:
            retain_none: unset fields of a TensorClass become non-tensor ``None``
                entries (the default), or are left out with ``False``.

        Example:
            >>> td = TensorDict({"a": torch.zeros(2)}, [2])
            >>> td.to_tensordict()["a"] is td["a"]
            False
        """
        data = {
            k: v.to_tensordict(retain_none=retain_none)
            if is_tensor_collection(v)
            else (v.clone() if isinstance(v, (_Tensor, NonTensorData)) else v)
            for k, v in self._data.items()
        }
        if retain_none is not False:
            for name in self._field_names:
                if name not in data:
                    data[name] = NonTensorData._make(None, self._batch_size, self._device)
        return self._plain_tensordict()._new_unsafe(
            data, self._batch_size, self._device, self._names
        )

    def state_dict(
        self, destination=None, prefix: str = "", keep_vars: bool = False, flatten: bool = True
    ):
        """An ``OrderedDict`` of the tensor leaves under dotted keys, like ``nn.Module``'s.

        The structure (batch sizes, devices, names, non-tensor values) is in its
        ``_metadata`` attribute; ``flatten=False`` nests the levels instead.

        Example:
            >>> sd = TensorDict({"a": {"b": torch.zeros(2)}}, [2]).state_dict()
            >>> list(sd), sd._metadata[""]["batch_size"]
            (['a.b'], [2])
        """
        from ..helpers.state_dict import td_state_dict

        return td_state_dict(self, destination, prefix, keep_vars, flatten)

    def load_state_dict(
        self,
        state_dict: Mapping[str, Any],
        strict: bool = True,
        assign: bool = False,
        from_flatten: bool | None = None,
    ) -> Self:
        """Load a state dict (flat, nested or legacy) into this TensorDict in place."""
        from ..helpers.state_dict import td_load_state_dict

        return td_load_state_dict(self, state_dict, strict, assign, from_flatten)

    def __repr__(self) -> str:
        return td_repr(self)


def unravel_key_tuple(key) -> tuple:
    """``key`` (a ``str`` or a tuple) as a tuple."""
    return (key,) if type(key) is str else tuple(key)


def _clash(td: Any, name: str, separator: str) -> KeyError:
    return KeyError(
        f"{type(td).__name__}.flatten_keys: Flattening keys in tensordict causes "
        f"keys to clash: two keys flatten to {name!r}; choose another separator "
        f"than {separator!r}."
    )


def _flatten_into(data: dict, node: Any, prefix: str, separator: str, plain: type, top) -> None:
    """``flatten_keys``: every leaf below ``node`` into ``data``, named by its joined path.

    Its twin is the walk of ``_iter_items(prefix, True, True)`` with each key tuple
    joined by ``separator``: the same leaves in the same order, the names built while
    descending instead of joined per leaf. ``prefix`` is the joined path of ``node``
    followed by the separator (``""`` at the top).
    """
    for key, value in node._data.items():
        kind = type(value)
        if kind is plain:
            _flatten_into(data, value, prefix + key + separator, separator, plain, top)
        elif getattr(kind, "_is_tensor_collection", False):  # a TensorClass: its fields
            view = value._to_tensordict_view()
            _flatten_into(data, view, prefix + key + separator, separator, plain, top)
        else:
            name = prefix + key if prefix else key
            if name in data:
                raise _clash(top, name, separator)
            data[name] = value


def _leaf_items(td, is_leaf, prefix: tuple = ()):
    """``(key path, value)`` below ``td``, stopping at containers ``is_leaf`` accepts."""
    for key, value in td._data.items():
        path = prefix + (key,)
        if is_tensor_collection(value) and not is_leaf(type(value)):
            yield from _leaf_items(value._to_tensordict_view(), is_leaf, path)
        else:
            yield (path if prefix else key), value
