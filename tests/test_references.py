"""Docstrings and comments name only what exists, and only what is in the repository.

Every ``tdfunc.`` dotted path mentioned in a docstring or comment of ``tdfunc/`` or
``tests/`` imports (and its attributes exist); every ``*.py`` file name mentioned is a
file of the repository; no docstring or comment sends the reader to a document
outside the repository (the project's notes, a machine's paths): such text says
what it means instead ("tensordict's documentation", the rule itself).
"""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from pathlib import Path

import pytest

from tdfunc._core.helpers.class_names import ALIASES
from tdfunc._core.helpers.legacy_paths import OLD_PATHS

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted(
    path for folder in ("tdfunc", "tests", "benchmarks") for path in (REPO / folder).rglob("*.py")
)
FILES = sorted(
    str(path.relative_to(REPO))
    for path in REPO.rglob("*")
    if path.is_file() and ".git" not in path.parts
)

# a dotted path not inside quotes (a quoted one is a value: a format name, a stable name)
DOTTED = re.compile(r"(?<![\w./\"'])tdfunc(?:\.[A-Za-z_]\w*)+")
PY_FILE = re.compile(r"(?<![\w-])[\w./-]*\w\.py\b")
OUTSIDE = re.compile(
    r"the seeds|seeds'|seed doc|seeds/|\bseed 00\d|\bseeds? \d{3}\b|\bdesign (section )?\d"
    r"|design\.md|attack\.md|style\.md|/work/|\bshared/",
    re.IGNORECASE,
)


def _texts(path: Path) -> list[tuple[int, str]]:
    """The comments and docstrings of ``path``, with their first line numbers."""
    source = path.read_text()
    found = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                found.append((node.body[0].lineno, docstring))
    return found


TEXTS = {path: _texts(path) for path in SOURCES}


def _where(path: Path, line: int) -> str:
    return f"{path.relative_to(REPO)}:{line}"


def _resolves(dotted: str) -> bool:
    # names older versions wrote, which still load as aliases, are history, not paths
    if any(old == dotted or old.startswith(dotted + ".") for old in (*ALIASES, *OLD_PATHS)):
        return True
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def _is_file(name: str, mentioned_in: Path) -> bool:
    """A path with a folder anywhere in the repository; a bare file name in the package of
    the file that mentions it (``tdfunc/_ensemble``...), or, from a test, in ``tdfunc``."""
    name = name.lstrip("./")
    if "/" not in name:
        parts = mentioned_in.relative_to(REPO).parts
        scopes = ["tdfunc/"] if parts[0] != "tdfunc" else []
        scopes.append("/".join(parts[:2]) + "/" if len(parts) > 2 else parts[0] + "/")
        return any(
            (file.endswith("/" + name) or file == name) and file.startswith(tuple(scopes))
            for file in FILES
        ) or any(file == f"{parts[0]}/{name}" for file in FILES)
    return any(file == name or file.endswith("/" + name) for file in FILES)


def test_every_dotted_tdfunc_path_resolves():
    wrong = [
        f"{_where(path, line)}: {match.group(0)}"
        for path, texts in TEXTS.items()
        for line, text in texts
        for match in DOTTED.finditer(text)
        if not _resolves(match.group(0).rstrip("."))
    ]
    assert not wrong, "names that do not exist:\n" + "\n".join(wrong)


def test_every_python_file_named_exists():
    wrong = [
        f"{_where(path, line)}: {match.group(0)}"
        for path, texts in TEXTS.items()
        for line, text in texts
        for match in PY_FILE.finditer(text)
        if not _is_file(match.group(0), path)
    ]
    assert not wrong, "files that do not exist:\n" + "\n".join(wrong)


def test_no_reference_to_documents_outside_the_repository():
    wrong = [
        f"{_where(path, line)}: {match.group(0)!r}"
        for path, texts in TEXTS.items()
        for line, text in texts
        for match in OUTSIDE.finditer(text)
    ]
    assert not wrong, "say what the outside document means instead:\n" + "\n".join(wrong)


@pytest.mark.parametrize(
    "text, bad",
    [
        ("see tdfunc._registry", True),
        ("see tdfunc._core.helpers.writes.write", False),
        ('{"format": "tdfunc.memmap"}', False),
        ("tdfunc._container.TensorDict (an older name)", False),
    ],
)
def test_the_path_check_tells_names_apart(text, bad):
    names = [match.group(0) for match in DOTTED.finditer(text)]
    assert any(not _resolves(name) for name in names) is bad
