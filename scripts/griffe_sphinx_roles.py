"""Griffe extension for the docs build: cuda_memkit's docstrings as the API pages should show them.

Loaded by mkdocstrings (``extensions:`` in mkdocs.yml); the docstrings themselves are not
changed, so this keeps working whatever the other branches do to them.

- Sphinx roles (``:meth:`empty```, ``:class:`~cuda_memkit.HostBuffer```, ``:func:``,
  ``:attr:``, ``:data:``, ``:exc:``, ``:mod:``, ``:obj:``) become mkdocstrings cross-references
  (``[`empty()`][cuda_memkit.HostBuffer.empty]``) when the name resolves, from where the
  docstring is, to an object rendered on an API page; otherwise plain code (a private helper,
  numpy): never a literal ``:meth:``.
- ``Bases:`` names public classes only: a base defined in cuda_memkit that no API page renders
  (``Resource``, ``DeviceMemoryMixin``, ...) is left out of the list shown, and the public
  members it gives (``close()``, ``as_array()``, ...) are shown as the class's own.
- An attribute without a docstring takes its Sphinx ``#:`` comment (``MEMORY_KINDS``).

What "rendered" means is read from the ``::: name`` directives of docs/api/*.md: those objects
and their public members (with those taken over from private bases).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe

ROOT = Path(__file__).resolve().parents[1]
API_PAGES = ROOT / "docs" / "api"
PACKAGE = "cuda_memkit"

ROLE = re.compile(r":(?:py:)?(meth|func|class|attr|data|exc|mod|obj|const):`([^`]+)`")
CALLABLE_ROLES = {"meth", "func"}
DIRECTIVE = re.compile(r"^:::\s+([\w.]+)\s*$", re.M)


def rendered_roots() -> set[str]:
    """Return the identifiers of the ``::: name`` directives of the API pages."""
    return {m for page in sorted(API_PAGES.glob("*.md"))
            for m in DIRECTIVE.findall(page.read_text(encoding="utf-8"))}


def _target(obj: Any) -> Any:
    """Follow aliases (imports) to the object; None if that cannot be done."""
    try:
        return obj.final_target if obj.is_alias else obj
    except (griffe.AliasResolutionError, griffe.CyclicAliasError, KeyError):
        return None


def _member(obj: Any, name: str) -> Any:
    obj = _target(obj)
    if obj is None:
        return None
    members = obj.members
    if obj.is_class:
        try:
            members = obj.all_members  # inherited ones too
        except (griffe.AliasResolutionError, griffe.CyclicAliasError, KeyError, ValueError):
            members = obj.members
    return _target(members[name]) if name in members else None


def _lookup(scope: Any, dotted: str) -> Any:
    obj = scope
    for part in dotted.split("."):
        obj = _member(obj, part)
        if obj is None:
            return None
    return obj


class SphinxRoles(griffe.Extension):
    """Rewrite roles, hide private bases and read ``#:`` comments once the package is loaded."""

    def __init__(self) -> None:
        super().__init__()
        self.rendered: set[str] = set()
        self.public: dict[str, str] = {}  # canonical path -> rendered public path
        self.package: Any = None

    # -- which objects the pages render, under which name ----------------------------------

    def _index(self, pkg: Any) -> None:
        self.package = pkg
        self.rendered = set()
        for root in rendered_roots():
            if not root.startswith(PACKAGE + "."):
                continue
            obj = _lookup(pkg, root[len(PACKAGE) + 1:])
            if obj is None:
                continue
            self.rendered.add(root)
            self.public.setdefault(obj.path, root)
            for name, member in obj.members.items():
                target = _target(member)
                if name.startswith("_") or target is None or (obj.is_module and member.is_alias):
                    continue
                self.rendered.add(f"{root}.{name}")
                self.public.setdefault(target.path, f"{root}.{name}")

    def _public_path(self, obj: Any) -> str | None:
        path = self.public.get(obj.path)
        return path if path in self.rendered else None

    # -- roles ------------------------------------------------------------------------------

    def _scopes(self, obj: Any) -> list[Any]:
        scopes = []
        node = obj
        while node is not None:
            if node.is_class or node.is_module:
                scopes.append(node)
            node = node.parent
        scopes.append(self.package)
        allocators = self.package.members.get("allocators")
        if allocators is not None:
            scopes.append(allocators)
        return scopes

    def resolve(self, obj: Any, name: str) -> str | None:
        """Return the rendered public path that ``name``, written in ``obj``'s docstring, means."""
        if name.startswith(PACKAGE + "."):
            target = _lookup(self.package, name[len(PACKAGE) + 1:])
            return None if target is None else self._public_path(target)
        for scope in self._scopes(obj):
            target = _lookup(scope, name)
            if target is not None:
                return self._public_path(target)
        return None

    def rewrite(self, obj: Any, text: str) -> str:
        """Return ``text`` with every Sphinx role replaced (link or plain code)."""

        def one(match: re.Match[str]) -> str:
            role, body = match.group(1), match.group(2).strip()
            explicit = re.fullmatch(r"(.+?)\s*<(.+)>", body)
            if explicit:
                title, target = explicit.group(1), explicit.group(2)
            else:
                target = body.lstrip("!")
                shown = target.lstrip("~.")
                title = shown.rsplit(".", 1)[-1] if target.startswith("~") else shown
                if role in CALLABLE_ROLES and not title.endswith(")"):
                    title += "()"
            target = target.lstrip("!~.")
            path = None if body.startswith("!") else self.resolve(obj, target)
            return f"[`{title}`][{path}]" if path else f"`{title}`"

        return ROLE.sub(one, text)

    # -- hooks -------------------------------------------------------------------------------

    def on_package(self, *, pkg: Any, **kwargs: Any) -> None:
        """Hide private bases, index what the pages render, then fix every docstring."""
        if pkg.path != PACKAGE:
            return
        self.package = pkg
        roots = {obj.path for root in rendered_roots() if root.startswith(PACKAGE + ".")
                 if (obj := _lookup(pkg, root[len(PACKAGE) + 1:])) is not None}
        objects = self._walk(pkg)
        for cls in [o for o in objects if o.is_class and o.path in roots]:
            self._adopt_private_bases(cls, roots)
        self._index(pkg)
        for obj in objects:
            if obj.is_attribute and obj.docstring is None:
                self._doc_comment(obj)
            if obj.docstring is not None and ROLE.search(obj.docstring.value):
                obj.docstring.value = self.rewrite(obj, obj.docstring.value)

    def _adopt_private_bases(self, cls: Any, roots: set[str]) -> None:
        """Show members of private bases as the class's own; leave those bases out of Bases."""
        kept = []
        private = False
        for base in cls.bases:
            target = self._base(cls, base)
            if target is not None and target.path.startswith(PACKAGE + ".") and \
                    target.path not in roots:
                private = True
            else:
                kept.append(base)
        if not private:
            return
        for name, inherited in cls.inherited_members.items():
            origin = _target(inherited)
            if name.startswith("_") or origin is None or origin.parent is None:
                continue
            if origin.parent.path.startswith(PACKAGE + ".") and origin.parent.path not in roots:
                cls.set_member(name, griffe.Alias(name, origin, parent=cls))
        cls.bases = kept

    def _walk(self, obj: Any) -> list[Any]:
        found = [obj]
        for member in obj.members.values():
            if not member.is_alias:
                found += self._walk(member)
        return found

    @staticmethod
    def _base(cls: Any, base: Any) -> Any:
        """The class a base expression names, looked up from the class's module outwards."""
        scope = cls.parent
        while scope is not None:
            target = _lookup(scope, str(base))
            if target is not None:
                return target
            scope = scope.parent
        return None

    @staticmethod
    def _doc_comment(attr: Any) -> None:
        """Use the ``#:`` lines just above an attribute as its docstring (Sphinx's convention)."""
        try:
            lines = attr.lines_collection[attr.filepath]
        except (KeyError, ValueError, TypeError):
            return
        i = attr.lineno - 2  # the line above, 0-based
        comment: list[str] = []
        while i >= 0 and lines[i].strip().startswith("#:"):
            comment.insert(0, lines[i].strip()[2:].strip())
            i -= 1
        if comment:
            attr.docstring = griffe.Docstring(" ".join(comment), lineno=i + 2, parent=attr)
