"""mypy plugin: ``class Foo(TensorClass["frozen"])`` read as ``(TensorClass, frozen=True)``.

It also reads the decorator form, ``@tensorclass`` / ``@tensorclass(frozen=True)``
on a plain class, as that class deriving from ``TensorClass`` with those
keywords, so the decorated class's ``__init__`` takes ``batch_size=``,
``device=`` and ``names=`` and it has every TensorClass method.

mypy reads the strings inside ``TensorClass[...]`` as forward references to
types named ``frozen``, ``nocast``... and reports them as undefined (pyright
follows ``__class_getitem__`` and needs nothing). This plugin rewrites the
bracket form of a class's bases into class keywords before mypy analyses the
file, so mypy sees the dataclass-style fields, the generated ``__init__`` and,
for ``frozen``, read-only fields. Modules with such bases are re-analysed on
every run (mypy's cache would lose the rewrite). Enable it in the mypy
configuration::

    [tool.mypy]
    plugins = ["tdfunc.mypy_plugin"]
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

from mypy.nodes import (
    Block,
    CallExpr,
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
_FLAGS = frozenset(
    {"autocast", "nocast", "tensor_only", "frozen", "shadow", "skip_post_init_on_rebuild"}
)


class _Rewriter:
    """Finds the local names of ``TensorClass`` and rewrites bracketed bases.

    A plain walk over statements: mypy's own visitors are compiled traits that
    interpreted plugins cannot subclass.
    """

    def __init__(self) -> None:
        self.class_names: set[str] = set()
        self.module_names: set[str] = set()
        self.decorator_names: set[str] = set()
        self.file: MypyFile | None = None
        self.base_name: str | None = None  # a name bound to TensorClass for decorated classes

    def walk(self, statements: list[Statement]) -> None:
        for statement in statements:
            self.visit(statement)

    def visit(self, node: Statement) -> None:
        if isinstance(node, ImportFrom):
            if node.id in _MODULES:
                for name, alias in node.names:
                    if name == "TensorClass":
                        self.class_names.add(alias or name)
                    elif name == "tensorclass":
                        self.decorator_names.add(alias or name)
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
        self._rewrite_decorator(node)
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

    def _rewrite_decorator(self, node: ClassDef) -> None:
        for position, decorator in enumerate(node.decorators):
            call = decorator if isinstance(decorator, CallExpr) else None
            target = call.callee if call is not None else decorator
            if not self._is_name(target, "tensorclass", self.decorator_names):
                continue
            if call is not None and call.args and call.arg_names[0] is None:
                continue  # tensorclass(cls) called by hand: leave it to mypy
            del node.decorators[position]
            base = NameExpr(self._base_name())
            base.set_line(node)
            node.base_type_exprs.append(base)
            if call is not None:
                for name, value in zip(call.arg_names, call.args):
                    if name is not None:
                        node.keywords.setdefault(name, value)
            return

    def _base_name(self) -> str:
        """A module-level name bound to TensorClass (an import is added once)."""
        if self.base_name is None:
            self.base_name = "_tdfunc_TensorClass_"
            assert self.file is not None
            statement = ImportFrom("tdfunc", 0, [("TensorClass", self.base_name)])
            statement.set_line(1)
            self.file.defs.insert(0, statement)
            self.file.imports.append(statement)
        return self.base_name

    def _is_name(self, expr: Expression, name: str, local: set[str]) -> bool:
        if isinstance(expr, NameExpr):
            return expr.name in local
        if isinstance(expr, MemberExpr) and expr.name == name:
            target = expr.expr
            dotted = []
            while isinstance(target, MemberExpr):
                dotted.append(target.name)
                target = target.expr
            if isinstance(target, NameExpr):
                dotted.append(target.name)
                return ".".join(reversed(dotted)) in self.module_names
        return False

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
# Or a class decorated with ``@tensorclass``.
_BRACKETED_BASE = re.compile(
    r"^\s*(class\s+\w+\s*\([^)]*TensorClass\s*\[|@(\w+\.)*tensorclass\b)", re.MULTILINE
)
_RUN = f"{os.getpid()}-{time.time_ns()}"


class TensorClassPlugin(Plugin):
    """Rewrites ``TensorClass[...]`` bases (see the module docstring)."""

    def get_additional_deps(self, file: MypyFile) -> list[tuple[int, str, int]]:
        # Called right after a file is parsed, before semantic analysis.
        rewriter = _Rewriter()
        rewriter.file = file
        rewriter.walk(list(file.defs))
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
