"""The API reference lists every public method of the containers, each exactly once.

The Containers reference is split into pages by what methods do (``docs/api/
containers*.md``), each naming its members explicitly, so that a reader finds a method
by its purpose. A method added to ``TensorDict`` and to no page would silently vanish
from the site; one listed twice would give two anchors for one name.
"""

from __future__ import annotations

import collections
import re

from markdown_blocks import DOCS

import tdfunc

DIRECTIVE = re.compile(r"^::: (?P<path>[\w.]+)$", re.M)
# A table row that documents leafwise functions: | `abs` | `abs_` | torch.abs |
TABLE_ROW = re.compile(r"^\| `(?P<name>\w+)` \| (?:`(?P<inplace>\w+)`|—) \|", re.M)


def _listed(page_glob: str, owner: str) -> dict[str, list[str]]:
    """Member name -> pages that document it: with a ``::: owner.name`` directive, in
    the member list of a ``::: owner`` directive, or in a table row of leafwise
    functions."""
    listed = collections.defaultdict(list)
    for page in sorted((DOCS / "api").glob(page_glob)):
        text = page.read_text(encoding="utf-8")
        for match in DIRECTIVE.finditer(text):
            parent, _, name = match["path"].rpartition(".")
            if parent == owner:
                listed[name].append(page.name)
            elif match["path"] == owner:  # the class itself, with an explicit member list
                options = re.match(r"(?:\n    .*)*", text[match.end() :])[0]
                for member in re.findall(r"^\s+- (\w+)$", options, re.M):
                    listed[member].append(page.name)
        for match in TABLE_ROW.finditer(text):
            for name in filter(None, (match["name"], match["inplace"])):
                listed[name].append(page.name)
    return listed


def _public(cls) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def test_every_public_tensordict_member_is_on_exactly_one_page():
    listed = _listed("containers*.md", "tdfunc.TensorDict")
    public = _public(tdfunc.TensorDict)
    missing = sorted(public - set(listed))
    assert not missing, f"public TensorDict members on no docs/api/containers*.md page: {missing}"
    twice = {name: pages for name, pages in listed.items() if len(pages) > 1}
    assert not twice, f"listed on more than one page: {twice}"
    unknown = sorted(set(listed) - public)
    assert not unknown, f"listed but not public members of TensorDict: {unknown}"


def test_tensorclass_page_lists_what_tensordict_lacks():
    own = _public(tdfunc.TensorClass) - _public(tdfunc.TensorDict)
    text = (DOCS / "api" / "tensorclass.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\s+- (\w+)$", text, re.M))
    assert own <= listed, f"TensorClass's own members missing from its page: {own - listed}"


def test_no_container_page_is_a_wall():
    # The reason for the split: one page of 300 methods cannot be read or searched by eye.
    sizes = collections.Counter()
    for pages in _listed("containers*.md", "tdfunc.TensorDict").values():
        sizes[pages[0]] += 1
    assert len(sizes) >= 6, sizes
    assert max(sizes.values()) <= 100, sizes


def _roles():
    import importlib.util

    path = DOCS / "_ext" / "sphinx_roles.py"
    spec = importlib.util.spec_from_file_location("sphinx_roles", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    extension = module.SphinxRoles()
    extension.public = {"tdfunc.TensorDict.memmap", "tdfunc.Ensemble", "tdfunc.optim.adam"}
    faces = ["tdfunc.TensorDict"]
    return lambda text: module.ROLE.sub(lambda m: extension._render(m, faces), text)


def test_sphinx_roles_become_links_or_plain_code():
    render = _roles()
    # a relative name, looked up on the public class that inherits the method
    assert render(":meth:`memmap`") == (
        '<autoref identifier="tdfunc.TensorDict.memmap" optional><code>memmap</code></autoref>'
    )
    # ~ shows the last component; a private module path names the public object
    assert render(":class:`~tdfunc._ensemble.ensemble.Ensemble`") == (
        '<autoref identifier="tdfunc.Ensemble" optional><code>Ensemble</code></autoref>'
    )
    assert render(":func:`adam`").startswith('<autoref identifier="tdfunc.optim.adam"')
    # an explicit title, torch's documentation, and ! for no link
    assert render(":func:`the stack <torch.stack>`") == (
        '<a href="https://docs.pytorch.org/docs/stable/generated/torch.stack.html">'
        "<code>the stack</code></a>"
    )
    assert render(":meth:`!memmap`") == "<code>memmap</code>"
    # unknown and private names are plain code, never a broken link
    assert render(":func:`tdfunc._core.apply._helper`") == "<code>tdfunc._core.apply._helper</code>"
    assert render(":mod:`torch.func`") == "<code>torch.func</code>"
    assert render("a :data:`x & y` value") == "a <code>x &amp; y</code> value"
