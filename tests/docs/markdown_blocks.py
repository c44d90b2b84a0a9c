"""The fenced code blocks of the README and of the documentation pages.

A page's ```python blocks are its runnable examples: the tests run them in order, in
one namespace per page. A block is left out only when the line before its fence (blank
lines aside) is a comment giving the reason, ``<!-- no-run: why -->``.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

_FENCE_OPEN = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^`\n]*)$")
_NO_RUN = re.compile(r"^\s*<!--\s*no-run\s*:\s*(?P<reason>.*?)\s*-->\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    page: str  # path relative to the repository root
    line: int  # 1-based line of the first code line
    language: str
    code: str
    no_run_reason: str | None


def pages() -> list[pathlib.Path]:
    """README.md and every Markdown page under docs/ (the griffe extension folder aside)."""
    found = sorted(p for p in DOCS.rglob("*.md") if "_ext" not in p.relative_to(DOCS).parts)
    return [ROOT / "README.md", *found]


def blocks(path: pathlib.Path) -> list[Block]:
    lines = path.read_text().splitlines()
    page = path.relative_to(ROOT).as_posix()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE_OPEN.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence = match["indent"], match["fence"]
        language = match["info"].strip().split(" ")[0] if match["info"].strip() else ""
        close = re.compile(rf"^ {{0,{len(indent) + 3}}}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        if j == len(lines):
            raise ValueError(f"{page}:{i + 1}: code fence opened here is never closed")
        body = [
            line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : j]
        ]
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        marker = _NO_RUN.match(lines[k]) if k >= 0 else None
        found.append(
            Block(
                page, i + 2, language, "\n".join(body) + "\n", marker["reason"] if marker else None
            )
        )
        i = j + 1
    return found
