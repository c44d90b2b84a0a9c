"""``docs/internals.md`` says in which file every public method of TensorDict and
TensorClass is written, and stays right: the test walks both classes' public names,
finds the file that defines each one (through wrappers, ``classmethod`` and
``property``), and compares it with the page's tables."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import tdfunc

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "internals.md"
ROW = re.compile(r"^\| `(?P<file>[\w/.]+\.py)` \| (?P<names>.+) \|$")


def _defining_file(cls: type, name: str) -> str:
    for klass in cls.__mro__:
        if name not in klass.__dict__:
            continue
        found = klass.__dict__[name]
        found = getattr(found, "__func__", found)  # classmethod, staticmethod
        found = getattr(found, "fget", found)  # property
        if callable(found):
            found = inspect.unwrap(found)  # the mutability check wraps in-place methods
        try:
            path = inspect.getsourcefile(found)
        except TypeError:  # a value, not code: the class that holds it
            path = None
        if path is None or not Path(path).resolve().is_relative_to(REPO / "tdfunc"):
            path = inspect.getsourcefile(klass)
        return Path(path).resolve().relative_to(REPO).as_posix()
    raise AssertionError(f"{cls.__name__}.{name} is defined nowhere in its MRO")


def expected_files(cls: type) -> dict[str, str]:
    """Every public name of ``cls`` -> the file that defines it."""
    return {name: _defining_file(cls, name) for name in dir(cls) if not name.startswith("_")}


def _tables() -> dict[str, dict[str, str]]:
    """The page's three tables: section title -> {method: file}."""
    tables: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in PAGE.read_text().splitlines():
        if line.startswith("### "):
            current = tables.setdefault(line[4:].strip(), {})
        elif current is not None and (row := ROW.match(line)):
            for name in re.findall(r"`([^`]+)`", row["names"]):
                assert name not in current, f"{name} listed twice in {line[:60]}"
                current[name] = row["file"]
    return tables


def test_the_page_places_every_public_method_in_its_file():
    tables = _tables()
    shared = tables["Shared by TensorDict and TensorClass"]
    own = {
        tdfunc.TensorDict: tables["TensorDict's own"],
        tdfunc.TensorClass: tables["TensorClass's own"],
    }
    wrong = []
    for cls, its_own in own.items():
        expected = expected_files(cls)
        for name, path in sorted(expected.items()):
            listed = its_own.get(name, shared.get(name))
            if listed != path:
                wrong.append(f"{cls.__name__}.{name}: the page says {listed}, it is in {path}")
        stale = sorted(set(its_own) - set(expected))
        wrong += [f"{cls.__name__}.{name}: listed but not a public name" for name in stale]
    in_both = set(expected_files(tdfunc.TensorDict)) & set(expected_files(tdfunc.TensorClass))
    wrong += [f"{name}: not shared by both" for name in sorted(set(shared) - in_both)]
    assert not wrong, "update the method table of docs/internals.md:\n" + "\n".join(wrong)


def test_every_file_the_page_names_exists():
    for table in _tables().values():
        for name, path in table.items():
            assert (REPO / path).is_file(), (name, path)


def test_the_walk_sees_wrapped_methods_and_classmethods():
    files = expected_files(tdfunc.TensorDict)
    assert files["zero_"] == "tdfunc/_core/math/apply.py"  # wrapped by the mutability check
    assert files["from_dict"] == "tdfunc/_core/convert/constructors.py"  # a classmethod
    assert files["batch_size"] == "tdfunc/_core/shape/batch.py"  # a property
