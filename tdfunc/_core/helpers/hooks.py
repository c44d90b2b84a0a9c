"""The public classes (and the one public function) the core builds with but may not
import, bound by ``tdfunc/_assembly.py``.

The core sits below the module that composes ``TensorDict`` (and ``TensorAttrs``)
from the core and its features, so a helper that must build "a plain TensorDict"
(not one like ``self``: a container method asks ``self`` through ``_like``) reads it
here. ``tdfunc/_assembly.py`` calls :func:`bind` once, after it defines the classes;
every read before that is an error naming the hook, never a guess.

Example:
    >>> import tdfunc
    >>> from tdfunc._core.helpers.hooks import HOOKS
    >>> HOOKS.tensordict is tdfunc.TensorDict
    True
"""

from __future__ import annotations

from typing import Any


class Hooks:
    """The bound classes, read as attributes (a plain attribute read on every use)."""

    tensordict: type
    tensor_attrs: type
    # tdfunc.from_dataclass, which TensorDict.from_dataclass(as_tensorclass=True) calls
    from_dataclass: Any

    def __getattr__(self, name: str) -> Any:
        # only reached while a declared hook is unbound (or for a name that is no hook)
        if name in Hooks.__annotations__:
            raise RuntimeError(
                f"tdfunc._core: the hook {name!r} is not bound yet; tdfunc/_assembly.py "
                f"binds it when `import tdfunc` runs. Hint: import tdfunc before using the core."
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


HOOKS = Hooks()
_FUNCTIONS = frozenset({"from_dataclass"})


def bind(**classes: type) -> None:
    """Bind every hook at once: ``bind(tensordict=TensorDict, tensor_attrs=TensorAttrs,
    from_dataclass=from_dataclass)``."""
    declared = set(Hooks.__annotations__)
    if set(classes) != declared:
        raise TypeError(
            f"tdfunc._core.helpers.hooks.bind: expected exactly the hooks {sorted(declared)}, "
            f"received {sorted(classes)}."
        )
    for name, cls in classes.items():
        if name in _FUNCTIONS:
            if not callable(cls):
                raise TypeError(
                    f"tdfunc._core.helpers.hooks.bind: the hook {name!r} must be a function, "
                    f"received {type(cls).__name__}."
                )
        elif not isinstance(cls, type):
            raise TypeError(
                f"tdfunc._core.helpers.hooks.bind: the hook {name!r} must be a class, "
                f"received {type(cls).__name__}."
            )
        setattr(HOOKS, name, cls)
