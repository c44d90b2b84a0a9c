"""Container classes known to tdfunc, by stable public name.

Persistence stores a class name in ``meta.json`` and serialized treespecs store
one too. Both must survive a reorganisation of tdfunc's private modules, so a
class defined inside tdfunc is named by its public name (``tdfunc.TensorDict``),
never by the private module that happens to define it; a user's TensorClass is
named ``<its module>.<its qualname>``. Names written by earlier versions load as
aliases.

Loading never imports a class from a name: it looks the name up here, and only
``TensorDict`` and TensorClass subclasses (registered when they are created)
are found.
"""

from __future__ import annotations

_CLASSES: dict[str, type] = {}

# names that earlier versions of tdfunc wrote (private module paths) -> stable names
ALIASES = {"tdfunc._container.TensorDict": "tdfunc.TensorDict"}


def class_name(cls: type) -> str:
    """The stable name of ``cls``: ``tdfunc.<Name>`` for tdfunc's own classes."""
    module = cls.__module__
    if module == "tdfunc" or module.startswith("tdfunc."):
        return f"tdfunc.{cls.__qualname__}"
    return f"{module}.{cls.__qualname__}"


def register_class(cls: type) -> None:
    _CLASSES[class_name(cls)] = cls


def lookup_class(name: str) -> type:
    """The registered container class called ``name``; ``ValueError`` when unknown."""
    try:
        return _CLASSES[ALIASES.get(name, name)]
    except KeyError:
        raise ValueError(
            f"tdfunc: {name!r} is not a TensorDict or a TensorClass known to tdfunc; "
            f"import the module that defines it before loading."
        ) from None
