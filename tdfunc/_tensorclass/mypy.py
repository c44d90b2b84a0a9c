"""mypy plugin: ``class Foo(TensorClass["frozen"])`` read as ``(TensorClass, frozen=True)``.

mypy reads the strings inside ``TensorClass[...]`` as forward references to
types named ``frozen``, ``nocast``... and reports them as undefined (pyright
follows ``__class_getitem__`` and needs nothing). This plugin rewrites the
bracket form of a class's bases into class keywords before mypy analyses the
file, so mypy sees the dataclass-style fields, the generated ``__init__`` and,
for ``frozen``, read-only fields. Modules with such bases are re-analysed on
every run (mypy's cache would lose the rewrite). Enable it in the mypy
configuration::

    [tool.mypy]
    plugins = ["tdfunc._tensorclass_mypy"]
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

from mypy.nodes import (
    Block,
    ClassDef,
    Decorator,
    Expression,
    FuncDef,
    Import,
    ImportFrom,
    IndexExpr,
    MemberExpr,
    MypyFile,
    NameExpr,
    Statement,
    StrExpr,
    TupleExpr,
)
from mypy.plugin import Plugin, ReportConfigContext

_MODULES = ("tdfunc", "tdfunc._tensorclass")
_FLAGS = frozenset({"autocast", "nocast", "tensor_only", "frozen", "shadow"})


class _Rewriter:
    """Finds the local names of ``TensorClass`` and rewrites bracketed bases.

    A plain walk over statements: mypy's own visitors are compiled traits that
    interpreted plugins cannot subclass.
    """

    def __init__(self) -> None:
        self.class_names: set[str] = set()
        self.module_names: set[str] = set()

    def walk(self, statements: list[Statement]) -> None:
        for statement in statements:
            self.visit(statement)

    def visit(self, node: Statement) -> None:
        if isinstance(node, ImportFrom):
            if node.id in _MODULES:
                for name, alias in node.names:
                    if name == "TensorClass":
                        self.class_names.add(alias or name)
        elif isinstance(node, Import):
            for module, alias in node.ids:
                if module in _MODULES:
                    self.module_names.add(alias or module)
        elif isinstance(node, ClassDef):
            self.rewrite(node)
            self.walk(node.defs.body)
        elif isinstance(node, Decorator):
            self.walk(node.func.body.body)
        elif isinstance(node, FuncDef):
            self.walk(node.body.body)
        else:
            # if/try/with/for/while: visit their blocks
            for value in vars(node).values() if hasattr(node, "__dict__") else ():
                self._visit_blocks(value)
            for slot in getattr(type(node), "__slots__", ()):
                self._visit_blocks(getattr(node, slot, None))

    def _visit_blocks(self, value: object) -> None:
        if isinstance(value, Block):
            self.walk(value.body)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, Block):
                    self.walk(item.body)

    def rewrite(self, node: ClassDef) -> None:
        bases = []
        for base in node.base_type_exprs:
            flags = self._flags_of(base)
            if flags is None:
                bases.append(base)
                continue
            assert isinstance(base, IndexExpr)
            bases.append(base.base)
            for flag in flags:
                true = NameExpr("True")
                true.set_line(base)
                node.keywords.setdefault(flag, true)
        node.base_type_exprs = bases

    def _is_tensorclass(self, expr: Expression) -> bool:
        if isinstance(expr, NameExpr):
            return expr.name in self.class_names
        if isinstance(expr, MemberExpr) and expr.name == "TensorClass":
            target = expr.expr
            dotted = []
            while isinstance(target, MemberExpr):
                dotted.append(target.name)
                target = target.expr
            if isinstance(target, NameExpr):
                dotted.append(target.name)
                return ".".join(reversed(dotted)) in self.module_names
        return False

    def _flags_of(self, base: Expression) -> list[str] | None:
        if not isinstance(base, IndexExpr) or not self._is_tensorclass(base.base):
            return None
        items = base.index.items if isinstance(base.index, TupleExpr) else [base.index]
        flags = [item.value for item in items if isinstance(item, StrExpr)]
        if len(flags) != len(items) or not set(flags) <= _FLAGS:
            return None  # leave it: mypy then reports the unknown name
        return flags


# A class statement with a bracketed base: ``class Foo(TensorClass["frozen"]):``.
_BRACKETED_BASE = re.compile(r"^\s*class\s+\w+\s*\([^)]*TensorClass\s*\[", re.MULTILINE)
_RUN = f"{os.getpid()}-{time.time_ns()}"


class TensorClassPlugin(Plugin):
    """Rewrites ``TensorClass[...]`` bases (see the module docstring)."""

    def get_additional_deps(self, file: MypyFile) -> list[tuple[int, str, int]]:
        # Called right after a file is parsed, before semantic analysis.
        _Rewriter().walk(file.defs)
        return []

    def report_config_data(self, ctx: ReportConfigContext) -> Any:
        """Keep modules with bracketed bases out of mypy's cache.

        mypy re-analyses a module whose imports changed from an AST kept in its
        cache, without calling :meth:`get_additional_deps`, so the rewrite would be
        lost; a value that changes every run makes mypy parse such modules again.
        """
        if ctx.id == "tdfunc" or ctx.id.startswith("tdfunc.") or not ctx.path.endswith(".py"):
            return None
        try:
            with open(ctx.path, encoding="utf-8") as file:
                source = file.read()
        except (OSError, UnicodeDecodeError):
            return None
        return _RUN if _BRACKETED_BASE.search(source) else None


def plugin(version: str) -> type[Plugin]:
    return TensorClassPlugin
