"""The API pages: every public name has an entry, and the docs build's griffe extension
turns the docstrings' Sphinx roles into links (scripts/griffe_sphinx_roles.py; the built
site itself is checked by scripts/check_site.py in .ci/run)."""

from __future__ import annotations

import inspect
import json
import re
import sys
from pathlib import Path

import pytest

import cuda_memkit as cm

ROOT = Path(__file__).resolve().parents[1]
API = ROOT / "docs" / "api"


def _directives() -> set[str]:
    return {m for page in API.glob("*.md")
            for m in re.findall(r"^:::\s+([\w.]+)\s*$", page.read_text(), re.M)}


def test_every_public_name_has_an_api_entry() -> None:
    documented = _directives()
    missing = [n for n in cm.__all__ if f"cuda_memkit.{n}" not in documented]
    assert missing == []


def test_every_api_entry_names_something_public() -> None:
    modules = {p.stem for p in (ROOT / "cuda_memkit").iterdir()
               if not p.name.startswith("_") and (p.suffix == ".py" or p.is_dir())}
    for ident in _directives():
        if ident.startswith("cuda_memkit.") and ident.count(".") == 1:
            name = ident.split(".")[1]
            assert name in cm.__all__ or name in modules, ident


@pytest.fixture(scope="module")
def roles() -> object:
    griffe = pytest.importorskip("griffe", reason="the docs extra (griffe) renders the pages")
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import griffe_sphinx_roles as mod
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    ext = mod.SphinxRoles()
    pkg = griffe.load("cuda_memkit", search_paths=[str(ROOT)],
                      extensions=griffe.load_extensions(ext))
    return ext, pkg


def test_roles_become_links_or_code(roles: tuple[object, object]) -> None:
    ext, pkg = roles
    host = pkg["HostBuffer"]
    rw = ext.rewrite  # type: ignore[attr-defined]
    # Relative to the class, absolute, with ~ (last component) and an explicit title.
    assert rw(host, ":meth:`empty`") == "[`empty()`][cuda_memkit.HostBuffer.empty]"
    assert rw(host, ":class:`~cuda_memkit.MemoryPool`") == (
        "[`MemoryPool`][cuda_memkit.MemoryPool]")
    assert rw(host, ":meth:`the pool <MemoryPool.trim>`") == (
        "[`the pool`][cuda_memkit.MemoryPool.trim]")
    assert rw(host, ":func:`copy`") == "[`copy()`][cuda_memkit.copy]"
    # Private or foreign names: code, never a literal role nor a link that cannot resolve.
    assert rw(host, ":class:`ValueError`") == "`ValueError`"
    assert rw(host, ":mod:`cuda_memkit._resource`") == "`cuda_memkit._resource`"
    # No docstring of the package keeps a role.
    left = [o.path for o in ext._walk(pkg)  # type: ignore[attr-defined]
            if o.docstring is not None and _has_role(o.docstring.value)]
    assert left == []


def _has_role(text: str) -> bool:
    return re.search(r":(meth|func|class|attr|data|exc|mod|obj):`", text) is not None


def test_private_bases_are_hidden_and_their_members_shown(roles: tuple[object, object]) -> None:
    _ext, pkg = roles
    dev = pkg["DeviceBuffer"]
    assert [str(b) for b in dev.bases] == []  # Resource, DeviceMemoryMixin: private
    assert {"close", "as_array", "closed"} <= set(dev.members)
    err = pkg["CudaOutOfMemoryError"]
    assert [str(b) for b in err.bases] == ["CudaError", "MemoryError"]


def test_doc_comments_document_attributes(roles: tuple[object, object]) -> None:
    _ext, pkg = roles
    kinds = pkg["MEMORY_KINDS"]
    assert kinds.docstring is not None and "memory kind" in kinds.docstring.value


# -- signatures written in the guides are the code's ------------------------------------------

#: A signature on a line of its own, or opening a heading: `` `MemoryPool(device=0, *, ...)` ``.
SIGNATURE = re.compile(r"^(?:`|#+ `)(?P<name>[A-Za-z_][\w.]*)\((?P<params>[^`]*)\)`")
#: The class whose methods a page's bare method signatures (`` `advise(...)` ``) belong to.
PAGE_CLASS = {"managed.md": "ManagedBuffer"}


def _params(obj: object) -> str:
    """``obj``'s parameters as a guide writes them: names and defaults, no annotations."""
    parts, star = [], False
    for p in inspect.signature(obj).parameters.values():  # type: ignore[arg-type]
        if p.name == "self":
            continue
        if p.kind is p.VAR_POSITIONAL:
            parts.append(f"*{p.name}")
            star = True
            continue
        if p.kind is p.VAR_KEYWORD:
            parts.append(f"**{p.name}")
            continue
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        parts.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}")
    return ", ".join(parts)


def _written_signatures() -> list[tuple[str, int, str, str]]:
    found = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name == "decisions.md":  # headings name calls there, not signatures
            continue
        for i, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            m = SIGNATURE.match(line)
            alone = m is not None and (line.startswith("#") or m.end() == len(line.rstrip()))
            if m and alone and "..." not in m["params"] and not m["name"].startswith("cm."):
                found.append((page.name, i, m["name"], m["params"]))
    return found


def test_signatures_in_the_guides_are_the_code() -> None:
    """A signature written out in a guide lists the parameters and defaults the code has."""
    found = _written_signatures()
    assert len(found) >= 5  # MemoryPool and the managed buffer's hints at least
    wrong = []
    for page, line, name, params in found:
        owner: object = cm
        if "." not in name and not hasattr(cm, name):
            owner = getattr(cm, PAGE_CLASS.get(page, ""), None)
        obj = owner
        for part in name.split("."):
            obj = getattr(obj, part, None)
        if obj is None:
            wrong.append(f"{page}:{line}: {name} is not a name of cuda_memkit")
        elif params != _params(obj):
            wrong.append(f"{page}:{line}: {name}({params}) but the code has ({_params(obj)})")
    assert wrong == []


# -- the docs speak to users and contributors: no project history, no numbers of their own ---

#: How the project was built, which a user or a contributor of the repository does not have:
#: work sessions, runs of the machine that lends GPUs and its tool, paths outside the
#: repository, issue numbers, the lent machines.
HISTORY = re.compile(r"\bsessions?\b|\bdevice (?:runs?|calls?|tool)\b|\bgpu runs? \d"
                     r"|\bruns? \d+ of\b|`carry`|\bcarry\b[^.\n]*\.whl|\.\./shared|\bissues? #?\d+"
                     r"|\blent (?:H100|H200|GPU|machine)|\brun of record\b", re.I)
#: A measured time or rate: guides link to the benchmark report's rows instead.
MEASURED = re.compile(r"\b\d+(?:\.\d+)?\s?(?:ns|us|µs|ms|GB/s|MB/s)\b")


def _user_pages() -> list[tuple[str, str]]:
    """(name, text) of every page a user reads: README, CONTRIBUTING, the guides, the notebooks'
    text. docs/decisions.md is history by design (checked below); the benchmark report is
    generated."""
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md",
             *(p for p in sorted((ROOT / "docs").glob("*.md"))
               if p.name not in ("decisions.md", "benchmarks.md"))]
    out = [(p.relative_to(ROOT).as_posix(), p.read_text(encoding="utf-8")) for p in pages]
    for nb in sorted((ROOT / "examples").glob("*.ipynb")):
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        out.append((nb.relative_to(ROOT).as_posix(), text))
    return out


def _page_params() -> list[object]:
    return [pytest.param(name, text, id=name) for name, text in _user_pages()]


def _hits(pattern: re.Pattern[str], text: str) -> list[str]:
    return [f"line {text.count(chr(10), 0, m.start()) + 1}: "
            f"...{text[max(0, m.start() - 40):m.end() + 20]!r}..."
            for m in pattern.finditer(text)]


@pytest.mark.parametrize("name, text", _page_params())
def test_user_docs_tell_no_history(name: str, text: str) -> None:
    """No sessions, runs of the lending machine or its tool, issue numbers, outside paths."""
    assert _hits(HISTORY, text) == []


#: A region the report's generator writes from the recorded results (README, index, why).
GENERATED = re.compile(r"<!-- bench-report:([\w-]+) -->\n.*?<!-- /bench-report:\1 -->", re.S)


@pytest.mark.parametrize("name, text", _page_params())
def test_user_docs_quote_no_measurements(name: str, text: str) -> None:
    """Times and rates live in the benchmark report (one run, one number per fact), or in
    regions its generator writes from the same results."""
    assert _hits(MEASURED, GENERATED.sub("", text)) == []


def test_decisions_tell_decisions_not_history() -> None:
    """docs/decisions.md: each entry a decision with its date and commit; no sessions, runs of
    the lending machine, tool names or issue numbers."""
    text = (ROOT / "docs" / "decisions.md").read_text(encoding="utf-8")
    assert _hits(HISTORY, text) == []
    entries = text.split("\n## ")[1:]
    assert len(entries) >= 30
    undated = [e.splitlines()[0] for e in entries
               if not re.search(r"^\*20\d\d-\d\d-\d\d\b.*\bcommits? [0-9a-f]{7}", e, re.M)]
    assert undated == []


def test_the_checks_see_what_they_look_for() -> None:
    for bad in ("the fifth session", "device run 8", "through the device tool",
                "name `.whl` in `carry`", "carry .whl with a wheel", "../shared/DESIGN.md",
                "The holes of issue 21", "the lent H100", "GPU run 5", "run 3 of 2026-11-24"):
        assert HISTORY.search(bad), bad
    for fine in ("the descriptor does not carry the size", "a reissued call",
                 "the test run", "No GPU run is recorded yet", "a block is lent again"):
        assert not HISTORY.search(fine), fine
    for bad in ("2.82 us", "about 0.7 ms", "55 GB/s", "1.6 µs", "40ns"):
        assert MEASURED.search(bad), bad
    for fine in ("64 KiB", "2 MiB", "bench_pool's rows", "usage: x", "10 minutes"):
        assert not MEASURED.search(fine), fine


# -- the pages users look for ------------------------------------------------------------------

ENV_VAR = re.compile(r"\bCUDA_MEMKIT_[A-Z][A-Z_]*[A-Z]\b")


def _read_env_vars(folder: str) -> set[str]:
    return {v for path in (ROOT / folder).rglob("*.py")
            for v in ENV_VAR.findall(path.read_text(encoding="utf-8"))}


@pytest.mark.parametrize("folder", ["cuda_memkit", "tests", "scripts", "benchmarks"])
def test_every_environment_variable_is_on_its_page(folder: str) -> None:
    """A variable the code reads and the environment page does not list is a variable no user
    can find."""
    page = set(ENV_VAR.findall((ROOT / "docs" / "environment.md").read_text(encoding="utf-8")))
    found = _read_env_vars(folder)
    if folder == "cuda_memkit":
        assert {"CUDA_MEMKIT_BACKEND", "CUDA_MEMKIT_LEAK_REPORT"} <= found  # the scan sees them
    assert sorted(found - page) == []


def test_api_pages_show_public_names_only() -> None:
    private = [f"{page.name}: {ident}" for page in API.glob("*.md")
               for ident in re.findall(r"^:::\s+([\w.]+)\s*$", page.read_text(), re.M)
               if any(part.startswith("_") and part != "__version__"
                      for part in ident.split("."))]
    assert private == []
    calls = [page.name for page in API.glob("*.md") if "_driver." in page.read_text()]
    assert calls == []


#: Addresses that do not exist while the project is unpublished.
UNPUBLISHED = re.compile(r"github\.com/cuda-memkit|cuda-memkit\.github\.io"
                         r"|pip install [\"']?cuda[_-]memkit\b")


def _linking_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md",
            ROOT / "pyproject.toml", *sorted((ROOT / "docs").rglob("*.md")),
            *sorted((ROOT / "examples").glob("*.ipynb")),
            *sorted((ROOT / "cuda_memkit").rglob("*.py"))]  # docstrings render on the site


def test_no_link_or_install_line_points_where_nothing_is() -> None:
    bad = [f"{p.relative_to(ROOT)}: {m[0]}" for p in _linking_files()
           for m in UNPUBLISHED.finditer(p.read_text(encoding="utf-8"))]
    assert bad == []


def test_relative_links_of_the_readme_and_notebooks_lead_to_files() -> None:
    """The README's and the notebooks' links work from a checkout (the site build checks the
    docs' own)."""
    link = re.compile(r"\]\((?!https?:|mailto:|#)([^)#\s]+)(?:#[^)]*)?\)")
    missing = []
    for path in [ROOT / "README.md", ROOT / "CONTRIBUTING.md",
                 *sorted((ROOT / "examples").glob("*.ipynb"))]:
        for target in link.findall(path.read_text(encoding="utf-8")):
            if not (path.parent / target).exists():
                missing.append(f"{path.relative_to(ROOT)}: {target}")
    assert missing == []


def _nav_pages() -> list[str]:
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = text.split("\nnav:\n", 1)[1].split("\nplugins:", 1)[0]
    return re.findall(r":\s+([\w/.-]+\.(?:md|ipynb))\s*$", nav, re.M)


def test_the_pages_users_look_for_are_in_the_navigation() -> None:
    pages = _nav_pages()
    for page in ("install.md", "environment.md", "faq.md", "migrating.md", "changelog.md",
                 "contributing.md"):
        assert page in pages, page
    # How the library was made is for contributors: after every page a user reads.
    dev = pages.index("contributing.md")
    assert all(pages.index(p) > dev for p in ("decisions.md", "architecture.md", "changelog.md"))
    assert pages.index("benchmarks.md") < dev


@pytest.mark.parametrize("name", ["changelog.md", "contributing.md"])
def test_the_site_includes_the_root_files(name: str) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import mkdocs_hooks
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    page = (ROOT / "docs" / name).read_text(encoding="utf-8")
    text = mkdocs_hooks.included(page)
    source = (ROOT / name.upper().replace(".MD", ".md")).read_text(encoding="utf-8")
    assert text.strip() == source.replace("](docs/", "](").strip()
    assert mkdocs_hooks.notebook_links('<a href="../docs/benchmarks.md#pool-pair">') == (
        '<a href="../../benchmarks/#pool-pair">')


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.ipynb")),
                         ids=lambda p: p.stem)
def test_each_notebook_names_the_gpu_of_its_outputs(path: Path) -> None:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    outputs = " ".join("".join(o.get("text", "")) for c in cells if c["cell_type"] == "code"
                       for o in c.get("outputs", []))
    gpus = set(re.findall(r"NVIDIA [A-Z]\d+\w*", outputs))
    assert len(gpus) <= 1, f"outputs of more than one GPU: {sorted(gpus)}"
    if gpus:
        text = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        assert f"outputs saved with this notebook come from an {gpus.pop()}" in text
