"""Container classes known to tdfunc, by qualified name.

Persistence stores a class name in ``meta.json`` and must never import an
arbitrary class from it: loading looks the name up here, and only
``TensorDict`` and TensorClass subclasses (registered when they are created)
are found.
"""

from __future__ import annotations

_CLASSES: dict[str, type] = {}


def class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def register_class(cls: type) -> None:
    _CLASSES[class_name(cls)] = cls


def lookup_class(name: str) -> type:
    """The registered container class called ``name``; ``ValueError`` when unknown."""
    try:
        return _CLASSES[name]
    except KeyError:
        raise ValueError(
            f"tdfunc: {name!r} is not a TensorDict or a TensorClass known to tdfunc; "
            f"import the module that defines it before loading."
        ) from None
