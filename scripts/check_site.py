"""Check a built docs site (``mkdocs build``) for what ``--strict`` does not catch.

Usage: ``python scripts/check_site.py SITE_DIR``; exit 1 with one line per problem.

- every ``href="#id"`` and ``href="page/#id"`` points at an ``id`` that exists on that page
  (mkdocs --strict checks Markdown links, not the tables of contents mkdocs-jupyter makes);
- no literal Sphinx role (``:meth:``, ``:class:``, ...) is left in the text of a page;
- no table has an empty header row.
"""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path
from urllib.parse import unquote, urljoin

HREF = re.compile(r'href="([^"]*)"')
ID = re.compile(r'\bid="([^"]*)"')
ROLE = re.compile(r":(?:meth|func|class|attr|data|exc|mod|obj):")
TAG = re.compile(r"<[^>]+>")
THEAD = re.compile(r"<thead>(.*?)</thead>", re.S)
CODE = re.compile(r"<(pre|code)\b.*?</\1>", re.S)


def check(site: Path) -> list[str]:
    """Return the problems found in the site under ``site``."""
    pages = {p: p.read_text(encoding="utf-8") for p in sorted(site.rglob("*.html"))}
    ids = {p: set(ID.findall(text)) for p, text in pages.items()}
    problems = []
    for page, text in pages.items():
        rel = page.relative_to(site)
        base = "/" + rel.as_posix()
        for href in set(HREF.findall(text)):
            href = html.unescape(href)
            if "#" not in href or href.startswith(("http:", "https:", "mailto:")):
                continue
            path, _, anchor = urljoin(base, href).partition("#")
            if not anchor:
                continue
            target = site / unquote(path).lstrip("/")
            if target.is_dir() or path.endswith("/"):
                target = target / "index.html"
            if target not in ids:
                problems.append(f"{rel}: link to a missing page: {href}")
            elif unquote(anchor) not in ids[target]:
                problems.append(f"{rel}: link to a missing heading: {href}")
        prose = TAG.sub(" ", CODE.sub(" ", text))
        for role in sorted(set(ROLE.findall(prose))):
            problems.append(f"{rel}: literal Sphinx role {role} in the text")
        for head in THEAD.findall(text):
            if not TAG.sub("", head).strip():
                problems.append(f"{rel}: a table with an empty header row")
    return problems


def main() -> int:
    """Check the site named on the command line."""
    site = Path(sys.argv[1])
    problems = check(site)
    for line in problems:
        print(line)
    print(f"{len(problems)} problem(s) in {site}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
