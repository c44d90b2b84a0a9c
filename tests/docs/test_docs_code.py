"""Every ```python block of README.md and docs/ runs, page by page, in order.

The blocks of one page share one namespace (a page is one worked example read top to
bottom) and run in a fresh temporary working directory, so files they write go away.
Tracebacks point at the Markdown file and line.
"""

from __future__ import annotations

import functools
import re

import pytest
import torch
from markdown_blocks import ROOT, blocks, pages

PAGES = pages()


@pytest.fixture
def fast_compile(monkeypatch):
    """``torch.compile`` without a backend runs with ``aot_eager`` here: the same dynamo
    tracing (graph breaks, guards, recompilations are what the pages show), without
    inductor's code generation, which would take minutes on a small CI machine."""
    original = torch.compile

    def compile_(model=None, **kwargs):
        kwargs.setdefault("backend", "aot_eager")
        return original(model, **kwargs) if model is not None else original(**kwargs)

    monkeypatch.setattr(torch, "compile", functools.wraps(original)(compile_))


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_page_examples_run(page, tmp_path, monkeypatch, fast_compile):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    namespace: dict = {"__name__": "__docs__"}
    torch._dynamo.reset()
    for block in blocks(page):
        if block.language != "python" or block.no_run_reason is not None:
            continue
        # Pad with newlines so that line numbers in a traceback are the Markdown file's.
        source = "\n" * (block.line - 1) + block.code
        exec(compile(source, str(ROOT / block.page), "exec"), namespace)


def test_readme_and_docs_have_examples():
    runnable = [
        b for p in PAGES for b in blocks(p) if b.language == "python" and not b.no_run_reason
    ]
    assert any(b.page == "README.md" for b in runnable)
    assert len({b.page for b in runnable}) >= 8


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_no_python_hides_under_another_name(page):
    """A Python example must be fenced as ``python`` so that it runs; ``py``, ``python3``
    or ``pycon`` fences would be skipped silently."""
    for block in blocks(page):
        assert block.language not in {"py", "python3", "py3", "pycon", "ipython"}, (
            f"{block.page}:{block.line}: fence the block as ```python so the tests run it"
        )
        if block.language == "python" and block.no_run_reason is not None:
            assert block.no_run_reason, f"{block.page}:{block.line}: say why it does not run"


def test_no_run_is_rare():
    skipped = [b for p in PAGES for b in blocks(p) if b.no_run_reason is not None]
    assert len(skipped) <= 3, [f"{b.page}:{b.line}" for b in skipped]
    assert not re.search(r"no-run", (ROOT / "README.md").read_text())
