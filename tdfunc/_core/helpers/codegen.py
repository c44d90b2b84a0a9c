"""The one code generator: Python source that the plan builders write, made into functions.

Three builders write straight-line code for a fixed structure, so that the call
itself runs no loop and no test per element: a TensorClass's ``__init__`` and field
properties, a module-swap plan's ``read``/``enter``/``write``, an ensemble's chain of
steps. They all come here: the source is compiled under a ``<tdfunc ...>`` file name
(so a traceback says which generator wrote the frame) with ``constants`` as its
globals, and the functions it defines are returned by name. Callers keep the source
bounded (a plan past a size runs a loop instead), since ``compile`` costs grow with it.

Example:
    >>> add = define(["def add(x):", "    return x + K"], "example", {"K": 2})["add"]
    >>> add(1)
    3
"""

from __future__ import annotations

from typing import Any


def define(source: str | list[str], what: str, constants: dict[str, Any]) -> dict[str, Any]:
    """Run ``source`` (a string, or its lines) with ``constants`` as globals; return what
    it defines, by name. ``what`` names the generator in tracebacks: ``<tdfunc {what}>``."""
    if not isinstance(source, str):
        source = "\n".join(source)
    defined: dict[str, Any] = {}
    exec(compile(source, f"<tdfunc {what}>", "exec"), constants, defined)
    return defined
