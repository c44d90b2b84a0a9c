"""``TensorDictBase``: the abstract type of TensorDict-like containers.

tdfunc has one concrete TensorDict class (there are no lazy stacks or sub-views
to share an interface with), so ``TensorDictBase`` stays small: it exists for
``isinstance`` checks, annotations and the class-level loader of the seeds
(``TensorDictBase.load_memmap(path)``), which rebuilds whatever class the saved
``meta.json`` records.

Membership is structural: a class is a (virtual) subclass when it carries the
``_is_tensordict = True`` marker that ``TensorDict`` and its subclasses have. So
this module imports none of its subclasses, and ``TensorDict`` keeps the plain
``type`` metaclass (an ``ABCMeta`` base would slow down every
``isinstance(x, TensorDict)`` in the library). TensorClass instances are not
``TensorDictBase`` instances, as in the ``tensordict`` library.

Example:
    >>> import torch
    >>> from tdfunc import TensorDict, TensorDictBase
    >>> isinstance(TensorDict({"a": torch.zeros(2)}, [2]), TensorDictBase)
    True
"""

from __future__ import annotations

import abc
from typing import Any

from .._persist.api import PersistMixin


# abstract through __init__ (it has no abstract methods to declare); ABC for __subclasshook__
class TensorDictBase(abc.ABC):  # noqa: B024
    """Abstract type of ``TensorDict`` (and its subclasses); not instantiable.

    Example:
        >>> import tempfile, torch
        >>> from tdfunc import TensorDict, TensorDictBase
        >>> path = tempfile.mkdtemp()
        >>> _ = TensorDict({"a": torch.ones(2)}, [2]).memmap(path)
        >>> loaded = TensorDictBase.load_memmap(path)
        >>> type(loaded).__name__, loaded["a"].tolist()
        ('TensorDict', [1.0, 1.0])
    """

    __slots__ = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            "TensorDictBase: this is an abstract type (for isinstance checks and "
            "TensorDictBase.load_memmap); build a TensorDict instead, e.g. "
            "TensorDict({'a': torch.zeros(3)}, batch_size=[3])."
        )

    @classmethod
    def __subclasshook__(cls, subclass: type) -> bool:
        if cls is not TensorDictBase:
            return NotImplemented
        # the marker of TensorDict and its subclasses (TensorClass has none)
        return True if getattr(subclass, "_is_tensordict", False) else NotImplemented

    # One implementation of loading: the classmethods of PersistMixin (a TensorClass
    # saved on disk comes back as that TensorClass; nothing is converted).
    load_memmap = PersistMixin.__dict__["load_memmap"]
    load = PersistMixin.__dict__["load"]

    @classmethod
    def _adopt(cls, loaded: Any) -> Any:
        return loaded
