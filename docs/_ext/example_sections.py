"""Griffe extension: read tdfunc's ``Example:`` docstring sections as examples.

tdfunc's docstrings head their runnable snippet with ``Example:`` (singular); griffe's
Google parser knows only ``Examples:``, and would render the doctest as plain prose
(where ``x[0]`` reads as a Markdown link). Renaming the heading when griffe loads the
docstring renders it as a code example instead.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_SINGULAR = re.compile(r"^(\s*)Example:[ \t]*$", re.M)


class ExampleSections(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _SINGULAR.sub(r"\1Examples:", obj.docstring.value)
