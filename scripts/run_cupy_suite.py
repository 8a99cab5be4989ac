"""Run parts of CuPy's own test suite under CuPy's allocator and under cuda_memkit's (GPU).

    python scripts/run_cupy_suite.py --tests DIR [--json PATH] [--parts cuda_tests,...]
                                     [-n WORKERS] [--seconds S]

``DIR`` is the ``tests`` folder of a CuPy source tree of the *installed* CuPy
version (CuPy's wheels ship no tests; take them from the release's source, for
example ``git archive v14.2.0 tests/conftest.py tests/cupy_tests/cuda_tests
tests/cupy_tests/statistics_tests``). Each part (a folder under
``DIR/cupy_tests``) runs twice, each time in a fresh process: first with CuPy's
own allocators (the baseline), then with the memkit adaptors
(``cupy_allocator()``, ``cupy_pinned_allocator()``) installed in every test
process before any test runs. CuPy's tests rely on what CuPy's allocators
promise (for example that ``mem.size`` is the rounded block), so a test that
passes under CuPy's allocators and fails under ours is an adaptor defect.

Prints one table (passed / failed / skipped per part and allocator, and the
tests that fail only under cuda_memkit) and writes JSON to PATH, or to
``$OUT/cupy_suite.json`` when ``$OUT`` is set.

Exit status: 0 when every part ran and no test fails under cuda_memkit that
passes under CuPy's allocators; 1 otherwise; 2 when CuPy is not importable.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTS = ("cuda_tests", "statistics_tests")
#: CuPy's own pytest settings (its pyproject.toml) that its tests need: strict
#: xfail and the markers they use. Warnings are not made errors here: the
#: comparison is between two allocators, not a check of CuPy's warnings.
INI = """[pytest]
xfail_strict = true
markers =
    slow
    multi_gpu
    parallel_threads
    iterations
    thread_unsafe
"""

#: Loaded with ``-p`` in every pytest process (xdist's workers too): installs the memkit
#: adaptors before any test runs.
PLUGIN = """
def pytest_configure(config):
    import cupy
    from cuda_memkit.allocators import cupy_allocator, cupy_pinned_allocator
    cupy.cuda.set_allocator(cupy_allocator())
    cupy.cuda.set_pinned_memory_allocator(cupy_pinned_allocator())
"""


def outcomes(junit: str) -> dict[str, str]:
    """Test id -> "passed" / "failed" / "skipped" from a JUnit XML report."""
    result: dict[str, str] = {}
    if not os.path.exists(junit):
        return result
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        state = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                state = "failed"
            elif child.tag == "skipped":
                state = "skipped"
        result[name] = state
    return result


def run_part(tests: str, part: str, mode: str, workers: int, seconds: int,
             work: str) -> dict[str, Any]:
    junit = os.path.join(work, f"{part}-{mode}.xml")
    args = ["-q", "-p", "no:cacheprovider", "-c", os.path.join(work, "pytest.ini"),
            "--rootdir", tests, f"--junitxml={junit}",
            os.path.join(tests, "cupy_tests", part)]
    if workers > 1:
        args[:0] = ["-n", str(workers)]
    if mode == "memkit":
        args[:0] = ["-p", "memkit_cupy_plugin"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (work, ROOT, os.environ.get("PYTHONPATH", "")) if p))
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", *args], env=env,
                              capture_output=True, text=True, timeout=seconds)
        rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-1500:]
    except subprocess.TimeoutExpired as exc:
        rc = -1
        tail = f"timed out after {seconds} s\n{(exc.stdout or b'')[-1000:]!r}"
    got = outcomes(junit)
    counts = {s: sum(1 for v in got.values() if v == s) for s in ("passed", "failed", "skipped")}
    return {"rc": rc, "counts": counts, "outcomes": got, "tail": tail}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tests", required=True, help="CuPy's tests folder (its source tree)")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("-n", "--workers", type=int, default=8)
    ap.add_argument("--seconds", type=int, default=200, help="time limit of one run")
    ap.add_argument("--json", default=None)
    opts = ap.parse_args()
    try:
        import cupy
    except ImportError:
        print("CuPy is not importable: nothing to run")
        return 2
    work = tempfile.mkdtemp(prefix="cupy-suite-")
    with open(os.path.join(work, "pytest.ini"), "w") as f:
        f.write(INI)
    with open(os.path.join(work, "memkit_cupy_plugin.py"), "w") as f:
        f.write(PLUGIN)
    report: dict[str, Any] = {"cupy": cupy.__version__, "parts": {}}
    ok = True
    print(f"CuPy {cupy.__version__}; tests from {opts.tests}")
    print(f"{'part':<18}{'allocator':<12}{'passed':>8}{'failed':>8}{'skipped':>9}  rc")
    for part in opts.parts.split(","):
        runs = {mode: run_part(opts.tests, part, mode, opts.workers, opts.seconds, work)
                for mode in ("cupy", "memkit")}
        for mode, r in runs.items():
            c = r["counts"]
            print(f"{part:<18}{mode:<12}{c['passed']:>8}{c['failed']:>8}"
                  f"{c['skipped']:>9}  {r['rc']}")
        base, ours = runs["cupy"]["outcomes"], runs["memkit"]["outcomes"]
        only_ours = sorted(t for t, s in ours.items() if s == "failed" and base.get(t) == "passed")
        missing = sorted(set(base) - set(ours))
        ran = bool(base) and bool(ours) and all(r["rc"] in (0, 1) for r in runs.values())
        if not ran:
            for mode, r in runs.items():
                print(f"-- {part} under {mode} did not finish:\n{r['tail']}")
        for t in only_ours:
            print(f"   fails only under cuda_memkit: {t}")
        ok = ok and ran and not only_ours and not missing
        report["parts"][part] = {
            mode: {"rc": r["rc"], **r["counts"]} for mode, r in runs.items()}
        report["parts"][part]["fail_only_under_memkit"] = only_ours
        report["parts"][part]["not_run_under_memkit"] = missing
    path = opts.json or (os.path.join(os.environ["OUT"], "cupy_suite.json")
                         if os.environ.get("OUT") else None)
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=1)
    print("cupy suite:", "OK (no test fails only under cuda_memkit)" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
