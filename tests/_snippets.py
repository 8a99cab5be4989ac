"""The Python blocks of README.md and docs/*.md, and how each is meant to run.

A block runs as written, on its own, unless the line right before its fence says otherwise:

``<!-- snippet: continue -->``
    runs after the page's previous block, in its namespace (and so after what that continues);
``<!-- snippet: needs cupy -->``
    needs CuPy (also ``torch``, ``numba``, ``processes=2``): runs on the GPU only, in
    gpu-check's suite; ``dask``: runs where dask and distributed import; ``gpus=2`` /
    ``gpus=3``: runs where there are that many devices (the simulator has two);
``<!-- snippet: skip: a fragment -->``
    not meant to run; the reason is required;
``<!-- snippet: xfail: NameError host_array -->``
    known failing, to fix: a strict xfail (the test fails once the block works, so that the
    marker goes).

Words combine with commas, a ``skip:`` or ``xfail:`` reason last (it may hold commas):
``<!-- snippet: continue, needs cupy, xfail: x is undefined, and y -->``. The comment is
invisible on the rendered page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w+-]*)\s*$")
MARKER = re.compile(r"^\s*<!--\s*snippet:\s*(?P<body>.*?)\s*-->\s*$")
#: What a ``needs`` word may ask for, and what it means.
NEEDS = {
    "cupy": "CuPy",
    "torch": "torch with CUDA",
    "numba": "numba-cuda",
    "gpus=2": "two GPUs",
    "gpus=3": "three GPUs",
    "processes=2": "two processes sharing memory (the real driver)",
    "dask": "dask and distributed (the dask extra)",
}


def page_name(page: Path) -> str:
    """The page's path from the repository root (``docs/pinned.md``), or its name if outside."""
    return page.relative_to(ROOT).as_posix() if page.is_relative_to(ROOT) else page.name


class MarkerError(ValueError):
    """A ``<!-- snippet: ... -->`` comment that does not parse."""


@dataclass
class Block:
    """One fenced Python block of a page."""

    page: Path
    line: int  # of the opening fence, 1-based
    source: str
    cont: bool = False
    needs: tuple[str, ...] = ()
    skip: str | None = None
    xfail: str | None = None
    previous: Block | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        """``docs/pinned.md:25``: the page and the line of the fence."""
        return f"{page_name(self.page)}:{self.line}"

    def chain(self) -> list[Block]:
        """The blocks to run for this one, first to last (itself and what it continues)."""
        blocks = [self]
        while blocks[0].cont:
            prev = blocks[0].previous
            if prev is None:
                raise MarkerError(f"{self.name}: 'continue' on a page's first block")
            if prev.skip:
                raise MarkerError(f"{self.name}: continues {prev.name}, which is not meant to run")
            blocks.insert(0, prev)
        return blocks


def parse_marker(body: str, where: str) -> dict[str, object]:
    """Return the settings of one ``snippet:`` comment (``continue``, ``needs``, ...)."""
    out: dict[str, object] = {}
    # A reason (after "skip:" or "xfail:") runs to the end of the comment, commas and all.
    m = re.search(r"\b(skip|xfail):", body)
    words = body[:m.start()] if m else body
    if m:
        reason = body[m.end():].strip()
        if not reason:
            raise MarkerError(f"{where}: '{m.group(1)}' needs a reason after the colon")
        out[m.group(1)] = reason
    for word in [w.strip() for w in words.split(",") if w.strip()]:
        if word == "continue":
            out["cont"] = True
        elif word.startswith("needs "):
            needs = tuple(word[len("needs "):].split())
            unknown = [n for n in needs if n not in NEEDS]
            if unknown or not needs:
                raise MarkerError(f"{where}: unknown needs {unknown}; known: {sorted(NEEDS)}")
            out["needs"] = needs
        else:
            raise MarkerError(f"{where}: unknown snippet word {word!r}")
    if "skip" in out and len(out) > 1:
        raise MarkerError(f"{where}: 'skip' goes alone (a skipped block is not run at all)")
    return out


def blocks(page: Path) -> list[Block]:
    """Return the Python blocks of ``page`` in order, with their markers."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or not m["lang"]:
            i += 1
            continue
        indent, lang, start = m["indent"], m["lang"], i
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != f"{indent}```":
            j += 1
        if j == len(lines):
            raise MarkerError(f"{page.name}:{start + 1}: unclosed ``` fence")
        if lang == "python":
            body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip()
                    for ln in lines[start + 1:j]]
            where = f"{page_name(page)}:{start + 1}"
            marker = MARKER.match(lines[start - 1]) if start else None
            settings = parse_marker(marker["body"], where) if marker else {}
            block = Block(page, start + 1, "\n".join(body) + "\n",
                          previous=found[-1] if found else None, **settings)  # type: ignore[arg-type]
            found.append(block)
        i = j + 1
    return found


def all_blocks() -> list[Block]:
    """Every Python block of README.md and docs/*.md."""
    return [b for page in PAGES for b in blocks(page)]
