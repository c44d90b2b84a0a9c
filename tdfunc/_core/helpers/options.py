"""Process-wide switches: print options and the non-tensor rules.

Each switch is a context manager and a decorator that restores the previous value
on exit (nesting works as a stack), or is set for good with ``.set()``.

Example:
    >>> import torch
    >>> from tdfunc import TensorDict, set_printoptions
    >>> td = TensorDict({"a": torch.zeros(2)}, [2])
    >>> with set_printoptions(verbose=False):
    ...     print(td)
    TensorDict(
        fields={
            a: Tensor(shape=torch.Size([2]))},
        batch_size=torch.Size([2]))
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

__all__ = [
    "capture_non_tensor_stack",
    "get_printoptions",
    "list_to_stack",
    "set_capture_non_tensor_stack",
    "set_list_to_stack",
    "set_printoptions",
    "strtobool",
]

_DEFAULT_PRINT = {
    "show_batch_size": True,
    "show_device": True,
    "show_is_shared": True,
    "show_shape": True,
    "show_field_device": True,
    "show_dtype": True,
    "show_field_is_shared": True,
    "show_grad": False,
    "show_is_contiguous": False,
    "show_is_view": False,
    "show_storage_size": False,
    "plain": False,
    "sort_keys": "alphabetical",
}
PRINT = dict(_DEFAULT_PRINT)
_QUIET = (
    "show_device",
    "show_is_shared",
    "show_field_device",
    "show_dtype",
    "show_field_is_shared",
)

# tensordict's rules: a list written into a batched container becomes a stack of its
# items; equal non-tensor values stacked stay a stack (one entry per element)
_STATE = {"list_to_stack": True, "capture_non_tensor_stack": False}


def strtobool(value: str) -> bool:
    """``"yes"``/``"true"``/``"on"``/``"1"`` (any case) give True, their opposites False.

    Example:
        >>> strtobool("Yes"), strtobool("0")
        (True, False)
    """
    lowered = str(value).lower()
    if lowered in ("y", "yes", "t", "true", "on", "1"):
        return True
    if lowered in ("n", "no", "f", "false", "off", "0"):
        return False
    raise ValueError(
        f"strtobool: {value!r} is not a truth value (expected yes/no, true/false, 1/0)."
    )


class _Switch:
    """A setting changed inside ``with`` (or a decorated function) and restored after."""

    def _apply(self) -> Any:  # returns what to restore
        raise NotImplementedError

    def _restore(self, old: Any) -> None:
        raise NotImplementedError

    def set(self) -> None:
        """Change the setting for good (no restore)."""
        self._apply()

    def __enter__(self) -> None:
        self.__dict__.setdefault("_saved", []).append(self._apply())

    def __exit__(self, *exc: Any) -> None:
        self._restore(self._saved.pop())

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return wrapped


class set_printoptions(_Switch):
    """Choose what a container's ``repr`` shows (see :func:`get_printoptions` for the names).

    ``verbose=False`` hides devices, dtypes and sharing unless named explicitly.
    ``plain=True`` adds a short summary of each tensor's values (mean and std for
    floating and complex dtypes, min and max for the others, ``[]`` when empty).
    ``sort_keys`` is ``"alphabetical"`` (the default), ``"insertion"``, or a
    callable given each key, passed as ``key`` to :func:`sorted`.

    Example:
        >>> import torch
        >>> from tdfunc import TensorDict, get_printoptions, set_printoptions
        >>> with set_printoptions(show_dtype=False):
        ...     get_printoptions()["show_dtype"]
        False
    """

    def __init__(self, *, verbose: bool = True, **options: Any) -> None:
        unknown = sorted(set(options) - set(_DEFAULT_PRINT))
        if unknown:
            raise TypeError(
                f"set_printoptions: unknown option(s) {unknown}; the options are "
                f"{sorted(_DEFAULT_PRINT)}."
            )
        order = options.get("sort_keys", "alphabetical")
        if not callable(order) and order not in ("alphabetical", "insertion"):
            raise ValueError(
                "set_printoptions: sort_keys must be 'alphabetical', 'insertion' or a callable "
                f"(a key for sorted()), got {order!r}."
            )
        if not verbose:
            options = {**dict.fromkeys(_QUIET, False), **options}
        self._options = options

    def _apply(self) -> dict:
        old = dict(PRINT)
        PRINT.update(self._options)
        return old

    def _restore(self, old: dict) -> None:
        PRINT.clear()
        PRINT.update(old)


def get_printoptions() -> dict:
    """A copy of the current print options.

    Example:
        >>> get_printoptions()["show_shape"]
        True
    """
    return dict(PRINT)


class _StateSwitch(_Switch):
    _name = ""

    def __init__(self, mode: bool) -> None:
        self.mode = bool(mode)

    def _apply(self) -> bool:
        old = _STATE[self._name]
        _STATE[self._name] = self.mode
        return old

    def _restore(self, old: bool) -> None:
        _STATE[self._name] = old


class set_list_to_stack(_StateSwitch):
    """Whether a list written into a container with batch dims becomes a ``NonTensorStack``.

    On (the default), a list whose nesting matches the batch dims is stored as one
    value per element; off, the list is stored whole as one ``NonTensorData``.

    Example:
        >>> from tdfunc import TensorDict
        >>> with set_list_to_stack(False):
        ...     td = TensorDict({"a": ["x", "y"]}, [2])
        >>> td[0]["a"]
        ['x', 'y']
    """

    _name = "list_to_stack"


def list_to_stack() -> bool:
    """The current :class:`set_list_to_stack` rule."""
    return _STATE["list_to_stack"]


class set_capture_non_tensor_stack(_StateSwitch):
    """Whether stacking equal non-tensor values keeps one ``NonTensorData``.

    Off (the default), stacking non-tensor values always gives a ``NonTensorStack``
    (one value per element); on, equal values are kept as one ``NonTensorData``.

    Example:
        >>> import torch
        >>> from tdfunc import TensorDict
        >>> tds = [TensorDict({"label": "x"}), TensorDict({"label": "x"})]
        >>> torch.stack(tds)["label"]
        LinkedList(['x', 'x'])
        >>> with set_capture_non_tensor_stack(True):
        ...     torch.stack(tds)["label"]
        'x'
    """

    _name = "capture_non_tensor_stack"


def capture_non_tensor_stack() -> bool:
    """The current :class:`set_capture_non_tensor_stack` rule."""
    return _STATE["capture_non_tensor_stack"]
