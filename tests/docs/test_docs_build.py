"""The documentation site builds with warnings as errors (mkdocs --strict), and the
built HTML is what a reader should see.

mkdocs' warnings cover a page missing from the nav, griffe's (a docstring parameter that
is not in the signature, an API page naming an object that does not resolve) and
broken Markdown links. The built pages are then checked as a browser would load them:
every internal link, anchor, image, stylesheet and script resolves, and no Sphinx role
(``:meth:`x```) reaches the reader as raw text.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_blocks import ROOT

RAW_ROLE = re.compile(r":(?:py:)?(?:meth|func|class|attr|mod|data|obj|exc|const):")
# What mkdocs-autorefs leaves behind for a cross-reference it could not resolve.
UNRESOLVED_REF = re.compile(r"\]\[[\w.]*\]|\[<code>[^<]*</code>\]\[")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site_dir = tmp_path_factory.mktemp("docs") / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return site_dir


class _Page(HTMLParser):
    """The ids a page defines, the URLs it refers to, and its visible text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.refs: list[tuple[str, str]] = []  # (tag, url)
        self.text: list[str] = []
        self.prose: list[str] = []  # the text outside code
        self._skip = 0
        self._code = 0

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if "id" in attributes:
            self.ids.add(attributes["id"])
        if tag in ("script", "style"):
            self._skip += 1
        if tag in ("code", "pre"):
            self._code += 1
        for name in ("href", "src"):
            if attributes.get(name) and tag in ("a", "img", "link", "script", "source"):
                self.refs.append((tag, attributes[name]))

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self._skip -= 1
        if tag in ("code", "pre"):
            self._code -= 1

    def handle_data(self, data):
        if not self._skip:
            self.text.append(data)
            if not self._code:
                self.prose.append(data)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def _pages(site: Path) -> list[Path]:
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 20, pages
    return pages


def _site_prefix() -> str:
    """The URL path the site is served under (404.html links through it)."""
    match = re.search(r"^site_url:\s*(\S+)", (ROOT / "mkdocs.yml").read_text(), re.M)
    return urlsplit(match[1]).path if match else "/"


def _target(site: Path, page: Path, url: str) -> Path:
    path = unquote(urlsplit(url).path)
    if path.startswith("/"):
        prefix = _site_prefix()
        assert path.startswith(prefix), f"{page}: {url} is outside the site's {prefix}"
        path = path[len(prefix) :]
        base = site
    else:
        base = page.parent
    target = (base / path.lstrip("/")).resolve() if path else page
    return target / "index.html" if target.is_dir() else target


@pytest.mark.slow
def test_mkdocs_build_strict(site):
    assert (site / "api" / "containers" / "index.html").is_file()
    assert (site / "api" / "containers-math" / "index.html").is_file()


@pytest.mark.slow
def test_no_raw_sphinx_role_or_unresolved_reference(site):
    problems = []
    for path in _pages(site):
        page = _parse(path)
        for pattern, text in ((RAW_ROLE, page.text), (UNRESOLVED_REF, page.prose)):
            text = "".join(text)
            for match in pattern.finditer(text):
                context = text[max(0, match.start() - 40) : match.end() + 40].replace("\n", " ")
                problems.append(f"{path.relative_to(site)}: ...{context}...")
    assert not problems, f"{len(problems)} raw roles or references, e.g.:\n" + "\n".join(
        problems[:20]
    )


@pytest.mark.slow
def test_role_links_resolve_to_the_documented_object(site):
    html = (site / "api" / "containers-math" / "index.html").read_text(encoding="utf-8")
    # "`:meth:addcdiv` in place" in a method table becomes a link to that method.
    assert re.search(r'href="#tdfunc\.TensorDict\.addcdiv"><code>addcdiv</code></a> in place', html)


@pytest.mark.slow
def test_every_internal_link_anchor_and_image_resolves(site):
    pages = {path.resolve(): _parse(path) for path in _pages(site)}
    broken = []
    for path, page in pages.items():
        for tag, url in page.refs:
            parts = urlsplit(url)
            if parts.scheme or parts.netloc or url.startswith(("mailto:", "data:", "#!")):
                continue
            target = _target(site, path, url)
            where = f"{path.relative_to(site.resolve())}: <{tag}> {url}"
            if not target.is_file():
                broken.append(f"{where} (no file {target})")
                continue
            fragment = unquote(parts.fragment)
            if fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if fragment not in ids:
                    broken.append(f"{where} (no id {fragment!r})")
    assert not broken, f"{len(broken)} broken, e.g.:\n" + "\n".join(broken[:20])
