"""A ``NonTensorStack`` seen inside a ``torch.func`` transform that maps its batch dims.

Inside ``vmap`` the function runs once for all the elements of the mapped dim, so a
stack that holds one value per element has no value to give for "this" element: its
values cannot follow the mapped dim the way a tensor's do. Reading it there would
give the whole list under a batch size that no longer describes it, and a comparison
such as ``td["label"] == "train"`` would be silently ``False``. The stack is rebuilt
inside the transform as :class:`StackInTransform`, which carries its values through
(out of ``vmap`` it is a ``NonTensorStack`` again) and refuses to be read.

Example:
    >>> td = TensorDict({"x": torch.zeros(2)}, [2])
    >>> td["label"] = NonTensorStack.from_list(["a", "b"])
    >>> def read(t):
    ...     return t["label"]
    >>> torch.func.vmap(read)(td)
    Traceback (most recent call last):
    ...
    RuntimeError: NonTensorStack: ...
    >>> list(torch.func.vmap(lambda t: t * 2)(td)["label"])  # carried through
    ['a', 'b']
"""

from __future__ import annotations

from typing import Any, NoReturn

from .leaves import NonTensorStack


class StackInTransform(NonTensorStack):
    """The values of a ``NonTensorStack`` inside a transform that maps its batch dims:
    carried, never read (module docstring)."""

    __slots__ = ()

    def _refuse(self) -> NoReturn:
        raise RuntimeError(
            "NonTensorStack: this entry holds one value per element of a batch dim that "
            "vmap (or another torch.func transform) maps over; the function runs once for "
            "all the elements, so no single element's value can be read inside it. Read "
            "the values outside the transform (and pass what the function needs as a "
            "tensor, e.g. a mask built from them), or use a NonTensorData (one value for "
            "the whole batch)."
        )

    def _value(self) -> Any:
        self._refuse()

    def tolist(self) -> list:
        self._refuse()

    def __getitem__(self, index: Any) -> Any:
        self._refuse()

    def __eq__(self, other: object) -> bool:
        self._refuse()

    def __ne__(self, other: object) -> bool:
        self._refuse()

    __hash__ = None  # type: ignore[assignment]
