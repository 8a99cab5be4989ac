"""mkdocs hooks of the docs build (``hooks:`` in mkdocs.yml).

- A page that is only ``<!-- include: NAME.md -->`` shows that file of the
  repository's root (CHANGELOG.md, CONTRIBUTING.md: one text, in the checkout
  and on the site), its links to ``docs/...`` made relative to the docs.
- The notebooks in ``examples/`` link to the docs as files of the checkout
  (``../docs/benchmarks.md#pool-pair``), which works in Jupyter and on a code
  host; on the site a notebook is the page ``examples/<name>/``, so those links
  are rewritten to the site's pages (``../../benchmarks/#pool-pair``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_INCLUDE = re.compile(r"^<!-- include: ([\w.-]+\.md) -->\s*$", re.M)
_DOCS_LINK = re.compile(r'href="\.\./docs/([\w./-]+?)\.md(#[^"]*)?"')


def included(markdown: str) -> str:
    """``markdown`` with each include line replaced by that root file, links made relative."""
    def text(m: re.Match[str]) -> str:
        body = (ROOT / m[1]).read_text(encoding="utf-8")
        return body.replace("](docs/", "](")

    return _INCLUDE.sub(text, markdown)


def notebook_links(html: str) -> str:
    """``html`` of a notebook page with its links to ``../docs/*.md`` made site links."""
    return _DOCS_LINK.sub(lambda m: f'href="../../{m[1]}/{m[2] or ""}"', html)


def on_page_markdown(markdown: str, **_kwargs: Any) -> str:
    """Put the root files in the pages that include them."""
    return included(markdown)


def on_page_content(html: str, page: Any, **_kwargs: Any) -> str:
    """Rewrite the docs links of the notebooks' pages."""
    if page.file.src_uri.endswith(".ipynb"):
        return notebook_links(html)
    return html
