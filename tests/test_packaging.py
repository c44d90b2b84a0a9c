"""Packaging metadata: every module tdfunc imports is a declared dependency, and the
version is written in one place.

A module that ``import tdfunc`` loads may import, at its top level, only the standard
library and the ``[project] dependencies``; anything else (``tqdm``, ``matplotlib``, the
mypy plugin's ``mypy``) must be imported inside a function or by a module that
``import tdfunc`` does not load, and be declared in an extra.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import json
import pathlib
import re
import subprocess
import sys

import pytest

tomllib = pytest.importorskip("tomllib") if sys.version_info < (3, 11) else __import__("tomllib")

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tdfunc"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    return _normalise(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement).group(0))


CORE = {_requirement_name(r) for r in PYPROJECT["project"]["dependencies"]}
EXTRAS = {
    _requirement_name(r)
    for requirements in PYPROJECT["project"]["optional-dependencies"].values()
    for r in requirements
}


def _imports(path: pathlib.Path) -> tuple[set[str], set[str]]:
    """Top-level names of the absolute imports of ``path``: (at module level, anywhere)."""
    tree = ast.parse(path.read_text(), str(path))
    everywhere: set[str] = set()
    module_level: set[str] = set()

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                names = [child.module]
            for name in names:
                top = name.split(".")[0]
                everywhere.add(top)
                if not in_function:
                    module_level.add(top)
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            visit(child, inner)

    visit(tree, False)
    return module_level, everywhere


def _third_party(modules: set[str]) -> set[str]:
    return {m for m in modules if m not in sys.stdlib_module_names and m != "tdfunc"}


@functools.cache
def _installed() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def _distributions(module: str) -> set[str]:
    found = _installed().get(module)
    assert found, f"{module!r} is imported under tdfunc/ but no installed distribution provides it"
    return {_normalise(d) for d in found}


def _files_loaded_by_import() -> set[pathlib.Path]:
    code = (
        "import json, sys, tdfunc, tdfunc.utils\n"
        "print(json.dumps([getattr(m, '__file__', None) for m in list(sys.modules.values())]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    files = {pathlib.Path(f).resolve() for f in json.loads(out) if f}
    return {f for f in files if PACKAGE in f.parents}


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_every_import_is_declared():
    undeclared = []
    for path in SOURCES:
        _, everywhere = _imports(path)
        for module in sorted(_third_party(everywhere)):
            if not _distributions(module) & (CORE | EXTRAS):
                undeclared.append(f"{path.relative_to(ROOT)} imports {module!r}")
    assert not undeclared, (
        "not in pyproject.toml's dependencies or optional-dependencies: " + "; ".join(undeclared)
    )


def test_import_tdfunc_needs_only_the_core_dependencies():
    loaded = _files_loaded_by_import()
    assert PACKAGE / "__init__.py" in loaded
    for path in sorted(loaded):
        module_level, _ = _imports(path)
        for module in sorted(_third_party(module_level)):
            assert _distributions(module) & CORE, (
                f"{path.relative_to(ROOT)} imports {module!r} at module level, so "
                f"`import tdfunc` needs it, but it is not in [project] dependencies"
            )


def test_one_version_source():
    assert "version" not in PYPROJECT["project"], "the version is read from tdfunc/_version.py"
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    attr = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    import tdfunc

    module, _, name = attr.rpartition(".")
    assert getattr(__import__(module, fromlist=[name]), name) == tdfunc.__version__
    written = [
        p.relative_to(ROOT).as_posix()
        for p in SOURCES
        if re.search(r"^__version__\s*=", p.read_text(), re.M)
    ]
    assert written == ["tdfunc/_version.py"]
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{tdfunc.__version__}]" in changelog


def test_license_and_urls():
    assert PYPROJECT["project"]["license"] == "MIT"
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert set(PYPROJECT["project"]["urls"]) >= {"Documentation", "Source", "Changelog"}
