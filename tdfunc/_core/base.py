"""``TensorDictBaseCore``: the abstract type of TensorDict-like containers.

tdfunc has one concrete TensorDict class (there are no lazy stacks or sub-views
to share an interface with), so ``TensorDictBase`` stays small: it exists for
``isinstance`` checks, annotations and the class-level loader of tensordict's documentation
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


# abstract through __init__ (it has no abstract methods to declare); ABC for __subclasshook__
class TensorDictBaseCore(abc.ABC):  # noqa: B024
    """The core of ``TensorDictBase``: not instantiable, the virtual-subclass rule.

    The public ``TensorDictBase`` (``tdfunc/_assembly.py``) adds the loaders of
    the persistence feature and marks itself as the class the rule serves.

    Example:
        >>> import torch
        >>> from tdfunc import TensorDict, TensorDictBase
        >>> issubclass(TensorDictBase, TensorDictBaseCore), isinstance(TensorDict(), TensorDictBase)
        (True, True)
    """

    __slots__ = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            "TensorDictBase: this is an abstract type (for isinstance checks and "
            "TensorDictBase.load_memmap); build a TensorDict instead, e.g. "
            "TensorDict({'a': torch.zeros(3)}, batch_size=[3])."
        )

    _marks_tensordicts = False  # True on the public class only (not on its subclasses)
    # the abstract type is a tensor collection (is_tensor_collection(TensorDictBase))
    _is_tensor_collection = True

    @classmethod
    def __subclasshook__(cls, subclass: type) -> bool:
        if not cls.__dict__.get("_marks_tensordicts", False):
            return NotImplemented
        # the marker of TensorDict and its subclasses (TensorClass has none)
        return True if getattr(subclass, "_is_tensordict", False) else NotImplemented

    @classmethod
    def _adopt(cls, loaded: Any) -> Any:
        return loaded
