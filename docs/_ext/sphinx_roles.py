"""Griffe extension: render Sphinx cross-reference roles as links.

tdfunc's docstrings name other objects the way tensordict's documentation does, with
Sphinx roles (``:meth:`memmap```, ``:class:`~tdfunc.Ensemble```, ``:func:`torch.stack```).
Markdown knows no roles, so without this extension they reach the page as raw text.
Rewriting the docstrings is not an option (they are also read by ``help()``, where the
roles are the convention), so the roles are turned into links when the site is built:

- a tdfunc object becomes an mkdocs-autorefs cross-reference to where it is documented,
  marked optional so that an object the site does not document (a private helper)
  renders as plain code instead of a broken link;
- a torch object links to PyTorch's documentation;
- anything else (``!`` prefix, private modules, unknown names) is plain code.

Relative names (``:meth:`memmap``` in a method of a mixin) are looked up on the public
classes that inherit the method, then on ``tdfunc`` and ``tdfunc.optim``. A ``~``
prefix shows only the last component, as in Sphinx.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

ROLE = re.compile(
    r":(?:py:)?(?P<role>meth|func|class|attr|mod|data|obj|exc|const):"
    r"`(?:(?P<title>[^`<]*?)\s*<(?P<explicit>[^`>]+)>|(?P<target>[^`]+))`"
)
TORCH_DOCS = "https://docs.pytorch.org/docs/stable/generated/{}.html"
# Namespaces whose public names are documented on the site.
PUBLIC_NAMESPACES = ("tdfunc", "tdfunc.optim")


def _public_classes(pkg: griffe.Module) -> dict[str, griffe.Class]:
    """Public path -> class, for every class exported by a documented namespace."""
    classes = {}
    for namespace in PUBLIC_NAMESPACES:
        module = pkg if namespace == pkg.path else pkg.get_member(namespace.split(".", 1)[1])
        for name, member in module.members.items():
            if name.startswith("_"):
                continue
            try:
                target = member.final_target if member.is_alias else member
            except griffe.AliasResolutionError:
                continue
            if target.is_class:
                classes[f"{namespace}.{name}"] = target
    return classes


def _public_names(pkg: griffe.Module, classes: dict[str, griffe.Class]) -> set[str]:
    names = set()
    for namespace in PUBLIC_NAMESPACES:
        module = pkg if namespace == pkg.path else pkg.get_member(namespace.split(".", 1)[1])
        names.update(f"{namespace}.{n}" for n in module.members if not n.startswith("_"))
    for path, cls in classes.items():
        try:
            members = cls.all_members
        except Exception:  # an unresolvable base: its own members still count
            members = cls.members
        names.update(f"{path}.{n}" for n in members if not n.startswith("_"))
    return names


class SphinxRoles(griffe.Extension):
    """Replace Sphinx roles in every docstring of the package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.path != "tdfunc":
            return
        self.classes = _public_classes(pkg)
        self.public = _public_names(pkg, self.classes)
        self._walk(pkg)

    def _walk(self, obj: griffe.Object) -> None:
        if obj.docstring is not None and ":" in obj.docstring.value:
            context = self._faces(obj)
            obj.docstring.value = ROLE.sub(lambda m: self._render(m, context), obj.docstring.value)
        for member in obj.members.values():
            if not member.is_alias:
                self._walk(member)

    def _faces(self, obj: griffe.Object) -> list[str]:
        """Public class paths under which a member of ``obj``'s class is documented."""
        owner = obj if obj.is_class else obj.parent
        if owner is None or not owner.is_class:
            return []
        faces = []
        for path, cls in self.classes.items():
            try:
                lineage = [cls, *cls.mro()]
            except Exception:
                lineage = [cls]
            if any(c.path == owner.path for c in lineage):
                faces.append(path)
        # TensorDict first: it is where the shared container methods are documented.
        return sorted(faces, key=lambda p: (p != "tdfunc.TensorDict", p))

    def resolve(self, target: str, context: list[str]) -> str | None:
        """The documented identifier ``target`` names, or None."""
        if target in self.public:
            return target
        candidates = [f"{face}.{target}" for face in context]
        candidates += [f"{namespace}.{target}" for namespace in PUBLIC_NAMESPACES]
        # A path through a private module names a public object by its last parts.
        if target.startswith("tdfunc.") and "._" in target:
            parts = target.split(".")
            for start in range(len(parts) - 1, 0, -1):
                candidates += [f"{ns}.{'.'.join(parts[start:])}" for ns in PUBLIC_NAMESPACES]
        return next((c for c in candidates if c in self.public), None)

    def _render(self, match: re.Match, context: list[str]) -> str:
        raw = (match["explicit"] or match["target"]).strip()
        plain = raw.startswith("!")
        short = raw.startswith("~")
        target = raw.lstrip("~!").removesuffix("()")
        title = match["title"] or (target.rsplit(".", 1)[-1] if short else target)
        code = f"<code>{html.escape(title)}</code>"
        if plain:
            return code
        if target.startswith("torch.") and "._" not in target and match["role"] != "mod":
            return f'<a href="{TORCH_DOCS.format(target)}">{code}</a>'
        identifier = self.resolve(target, context)
        if identifier is None:
            return code
        return f'<autoref identifier="{identifier}" optional>{code}</autoref>'
