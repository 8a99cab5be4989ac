"""Every Python block of README.md and docs/*.md runs as its page says (see tests/_snippets.py).

Each block runs in a fresh interpreter on the suite's backend (with the blocks it continues
before it), from an empty folder, so that a block can neither lean on the test process nor
leave settings behind for other tests. Once its names are gone, everything it allocated must
have been given back: a block that needs a GPU framework or several GPUs runs on the GPU only
(``scripts/gpu-check``'s suite); a known-failing block is a strict xfail, listed here until its
page is fixed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cuda_memkit._core import _driver

from . import _snippets
from ._snippets import ROOT, Block, MarkerError

BACKEND = _driver.backend_name()

# Runs the blocks, each compiled under its page:line (tracebacks name the page), then drops
# their names and reports what cuda_memkit still holds.
_RUNNER = r"""
import gc, json, sys
blocks = json.load(sys.stdin)
ns = {"__name__": "__main__"}
for name, source in blocks:
    exec(compile(source, name, "exec"), ns)
ns.clear()
gc.collect()
import cuda_memkit as cm
stats = cm.memory_stats()
live = {k: u.live for k, u in stats.by_kind.items() if u.live}
print("\n__memkit_left__ " + json.dumps(live))
"""

BLOCKS = _snippets.all_blocks()

#: Needs met on the real driver only (the simulator's memory is in-process, CPU-side).
GPU_ONLY = {"cupy", "torch", "numba", "processes=2"}


def _missing(needs: set[str]) -> str | None:
    """What of ``needs`` this machine lacks, or None."""
    import importlib.util

    import cuda_memkit as cm

    gpu_only = sorted(needs & GPU_ONLY)
    if gpu_only and BACKEND == "sim":
        return (f"{', '.join(_snippets.NEEDS[n] for n in gpu_only)}: runs on the GPU "
                "(gpu-check)")
    for need in sorted(needs):
        if need in ("cupy", "torch", "numba") and importlib.util.find_spec(need) is None:
            return _snippets.NEEDS[need]
        if need == "dask" and any(importlib.util.find_spec(m) is None
                                  for m in ("dask", "distributed")):
            return _snippets.NEEDS[need]
        if need.startswith("gpus=") and cm.device_count() < int(need[len("gpus="):]):
            return _snippets.NEEDS[need]
    return None


def _params() -> list[object]:
    params = []
    for block in BLOCKS:
        marks = []
        if block.skip:
            marks.append(pytest.mark.skip(reason=f"not meant to run: {block.skip}"))
        if block.xfail:
            marks.append(pytest.mark.xfail(reason=f"known failing, to fix: {block.xfail}",
                                           strict=True))
        params.append(pytest.param(block, id=block.name, marks=marks))
    return params


def child_pythonpath() -> str:
    """PYTHONPATH for a child interpreter: the checkout, then this process's PYTHONPATH."""
    inherited = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join([str(ROOT), *(p for p in inherited.split(os.pathsep) if p)])


#: Optional packages (extras) a block may import: missing in the child, the block is skipped.
OPTIONAL = ("cupy", "torch", "numba", "dask", "distributed", "dask_cuda", "rmm",
            "prometheus_client")


def _missing_optional(stderr: str) -> str | None:
    """The optional package whose import failed in the child, or None."""
    m = re.search(r"ModuleNotFoundError: No module named '([\w.]+)'", stderr)
    if m and m.group(1).split(".")[0] in OPTIONAL:
        return m.group(1).split(".")[0]
    return None


def run_chain(block: Block, tmp: Path) -> subprocess.CompletedProcess[str]:
    """Run ``block`` after the blocks it continues, in a fresh interpreter under ``tmp``."""
    payload = json.dumps([(b.name, b.source) for b in block.chain()])
    # The child sees what this process sees: the checkout first, then this environment's
    # PYTHONPATH (packages installed there, such as the optional frameworks, stay visible).
    env = {**os.environ, "PYTHONPATH": child_pythonpath(), "CUDA_MEMKIT_BACKEND": BACKEND,
           "MPLBACKEND": "Agg"}
    env.pop("CUDA_MEMKIT_LEAK_REPORT", None)
    return subprocess.run([sys.executable, "-c", _RUNNER], input=payload, cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow_subprocess
@pytest.mark.parametrize("block", _params())
def test_snippet_runs(block: Block, tmp_path: Path) -> None:
    lacking = _missing({n for b in block.chain() for n in b.needs})
    if lacking:
        pytest.skip(f"needs {lacking}")
    proc = run_chain(block, tmp_path)
    optional = _missing_optional(proc.stderr) if proc.returncode else None
    if optional:
        pytest.skip(f"needs {optional} (an optional package, missing here)")
    assert proc.returncode == 0, f"{block.name} failed:\n{proc.stderr[-4000:]}"
    left = json.loads(proc.stdout.rsplit("__memkit_left__ ", 1)[1])
    assert left == {}, f"{block.name}: still allocated once its names were gone: {left}"


# -- the mechanism itself --------------------------------------------------------------------


def test_pages_have_python_blocks() -> None:
    assert len(BLOCKS) >= 25
    assert {b.page.name for b in BLOCKS} >= {"README.md", "pinned.md", "pools.md"}


def test_every_marker_is_right_before_a_python_block() -> None:
    for page in _snippets.PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if _snippets.MARKER.match(line):
                nxt = lines[i + 1] if i + 1 < len(lines) else ""
                assert nxt.strip() == "```python", f"{page.name}:{i + 1}: marker not before a block"


def _page(tmp_path: Path, text: str) -> list[Block]:
    page = tmp_path / "page.md"
    page.write_text(text, encoding="utf-8")
    return _snippets.blocks(page)


def test_markers_parse(tmp_path: Path) -> None:
    found = _page(tmp_path, "\n".join([
        "# t", "```python", "a = 1", "```", "text",
        "<!-- snippet: continue, needs cupy gpus=2 -->", "```python", "b = a + 1", "```",
        "<!-- snippet: skip: a fragment -->", "```python", "...", "```",
        "<!-- snippet: xfail: NameError c, and d -->", "```python", "c", "```",
        "```bash", "echo not python", "```",
        "- item", "", "    ```python", "    indented = True", "    ```",
    ]))
    first, second, skipped, failing, indented = found
    assert (first.line, first.source, first.cont) == (2, "a = 1\n", False)
    assert second.cont and second.needs == ("cupy", "gpus=2") and second.chain() == [first, second]
    assert skipped.skip == "a fragment"
    assert failing.xfail == "NameError c, and d" and failing.chain() == [failing]
    assert indented.source == "indented = True\n" and not indented.cont


@pytest.mark.parametrize("marker, message", [
    ("continue", "first block"),
    ("needs gpu", "unknown needs"),
    ("xfail:", "needs a reason"),
    ("continue, skip: x", "goes alone"),
    ("skip: x -->\n```python\npass\n```\n<!-- snippet: continue", "not meant to run"),
    ("contineu", "unknown snippet word"),
])
def test_bad_markers_are_refused(tmp_path: Path, marker: str, message: str) -> None:
    with pytest.raises(MarkerError, match=message):
        [b.chain() for b in _page(tmp_path, f"<!-- snippet: {marker} -->\n```python\npass\n```\n")]


@pytest.mark.slow_subprocess
def test_runner_reports_failures_and_leftovers(tmp_path: Path) -> None:
    """The runner fails a raising block (naming its page and line) and reports what is held."""
    page = ROOT / "docs" / "x.md"
    bad = Block(page, 7, "import cuda_memkit as cm\nraise KeyError('boom')\n")
    proc = run_chain(bad, tmp_path)
    assert proc.returncode == 1 and 'File "docs/x.md:7", line 2' in proc.stderr
    held = Block(page, 9, "import cuda_memkit as cm\nimport builtins\n"
                          "builtins.keep = cm.DeviceBuffer.empty(64)\n")
    proc = run_chain(held, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.rsplit("__memkit_left__ ", 1)[1]) == {"device": 1}
    cont = Block(page, 12, "assert x == 2\n", cont=True, previous=Block(page, 3, "x = 2\n"))
    assert run_chain(cont, tmp_path).returncode == 0
