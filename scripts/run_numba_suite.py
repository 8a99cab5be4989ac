"""Run numba-cuda's own memory tests with the cuda_memkit EMM plugin selected (GPU).

    python scripts/run_numba_suite.py [--json PATH] [--no-baseline]

Finds the test modules of the installed ``numba.cuda.tests.cudadrv`` package
whose names match the memory areas (EMM plugins, deallocation, pinned memory,
host allocation, managed allocation, and the CUDA memory API), and runs them
with ``unittest`` in a fresh process with
``NUMBA_CUDA_MEMORY_MANAGER=cuda_memkit.allocators.numba``; then again with
numba's own manager (the baseline), so that failures of this environment (the
GPU image's numba-cuda cannot compile kernels with numpy 2.5) are told apart
from failures of the plugin. Prints one table (ran / passed / failed / errors
/ skipped, and how many failures are kernel-compilation failures) and writes
JSON to PATH, or to ``$OUT/numba_suite.json`` when ``$OUT`` is set.

Exit status: 0 when every test that ran under the plugin passed or failed
only to compile a kernel *and* the baseline shows the same compilation
failures; 1 otherwise; 2 when numba-cuda is not importable.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AREAS = ("emm", "dealloc", "pinned", "host_alloc", "managed_alloc", "cuda_memory")
PLUGIN = "cuda_memkit.allocators.numba"
#: Traceback text that marks a kernel that could not be compiled (not a memory failure).
COMPILE = re.compile(r"row_stack|numba\.core\.errors|TypingError|LoweringError|NvvmError|"
                     r"NVVM|nvjitlink|LinkerError|cudadrv\.error\.NvrtcError|"
                     r"numba\.cuda\.core\.errors|compile_ptx|CompilerError")


def discover() -> list[str]:
    import pkgutil

    import numba.cuda.tests.cudadrv as pkg

    names = sorted(m.name for m in pkgutil.iter_modules(pkg.__path__)
                   if m.name.startswith("test_") and any(a in m.name for a in AREAS))
    return [f"{pkg.__name__}.{n}" for n in names]


def stub_filecheck() -> bool:
    """``numba.cuda.testing`` imports ``filecheck`` (a numba-cuda test extra) at import time.

    The memory tests never use it; where it is not installed, stand-in modules
    with its names let them load. Returns whether the stand-in was needed.
    """
    import importlib.util
    import types

    if importlib.util.find_spec("filecheck") is not None:
        return False

    class Missing:
        def __init__(self, *a: Any, **k: Any) -> None:
            raise RuntimeError("filecheck is not installed (stand-in for numba's memory tests)")

    names = {"matcher": ["Matcher"], "options": ["Options"],
             "parser": ["Parser", "pattern_for_opts"], "finput": ["FInput"]}
    root = types.ModuleType("filecheck")
    sys.modules["filecheck"] = root
    for sub, attrs in names.items():
        mod = types.ModuleType(f"filecheck.{sub}")
        for a in attrs:
            setattr(mod, a, Missing)
        setattr(root, sub, mod)
        sys.modules[f"filecheck.{sub}"] = mod
    return True


def child(mode: str, modules: list[str], out: str) -> None:
    """Run the modules in this process (``mode``: "memkit" or "numba") and write JSON."""
    import traceback
    import unittest

    report: dict[str, Any] = {"mode": mode, "modules": {}, "calls": {}}
    report["filecheck_stubbed"] = stub_filecheck()
    if mode == "memkit":
        import importlib

        plugin = importlib.import_module(PLUGIN)
        calls = report["calls"]
        for name in ("memalloc", "memhostalloc", "mempin", "memallocmanaged", "get_ipc_handle",
                     "get_memory_info", "reset", "defer_cleanup"):
            real = getattr(plugin.MemkitNumbaManager, name)

            def counted(self: Any, *a: Any, _real: Any = real, _n: str = name, **k: Any) -> Any:
                calls[_n] = calls.get(_n, 0) + 1
                return _real(self, *a, **k)

            setattr(plugin.MemkitNumbaManager, name, counted)
    import numba.cuda

    class Result(unittest.TestResult):
        def __init__(self) -> None:
            super().__init__()
            self.rows: list[dict[str, Any]] = []

        def _row(self, test: Any, outcome: str, detail: str = "") -> None:
            self.rows.append({"test": test.id(), "outcome": outcome,
                              "compile": bool(outcome in ("fail", "error")
                                              and COMPILE.search(detail)),
                              "detail": detail[-1500:]})

        def addSuccess(self, test: Any) -> None:
            super().addSuccess(test)
            self._row(test, "pass")

        def addFailure(self, test: Any, err: Any) -> None:
            super().addFailure(test, err)
            self._row(test, "fail", "".join(traceback.format_exception(*err)))

        def addError(self, test: Any, err: Any) -> None:
            super().addError(test, err)
            self._row(test, "error", "".join(traceback.format_exception(*err)))

        def addSkip(self, test: Any, reason: str) -> None:
            super().addSkip(test, reason)
            self._row(test, "skip", reason)

        def addExpectedFailure(self, test: Any, err: Any) -> None:
            super().addExpectedFailure(test, err)
            self._row(test, "pass", "expected failure")

        def addUnexpectedSuccess(self, test: Any) -> None:
            super().addUnexpectedSuccess(test)
            self._row(test, "fail", "unexpected success")

    loader = unittest.TestLoader()
    for name in modules:
        t0 = time.perf_counter()
        try:
            suite = loader.loadTestsFromName(name)
        except Exception:
            report["modules"][name] = {"import_error": traceback.format_exc()[-2000:]}
            continue
        result = Result()
        suite.run(result)
        report["modules"][name] = {"rows": result.rows, "seconds": time.perf_counter() - t0}
    try:
        mgr = numba.cuda.current_context().memory_manager
        report["manager"] = f"{type(mgr).__module__}.{type(mgr).__name__}"
    except Exception as exc:
        report["manager"] = f"unknown: {exc!r}"[:300]
    versions = {"numba-cuda": getattr(numba.cuda, "__version__", None)}
    try:
        import importlib.metadata as md

        for dist in ("numba", "numba-cuda", "numpy", "cuda-bindings"):
            try:
                versions[dist] = md.version(dist)
            except md.PackageNotFoundError:
                pass
    except Exception:
        pass
    report["versions"] = versions
    with open(out, "w") as f:
        json.dump(report, f, indent=1)


def counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    c = {"ran": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0, "compile": 0}
    for r in rows:
        o = r["outcome"]
        if o == "skip":
            c["skipped"] += 1
            continue
        c["ran"] += 1
        c["passed"] += o == "pass"
        c["failed"] += o == "fail"
        c["errors"] += o == "error"
        c["compile"] += bool(r["compile"])
    return c


def run_mode(mode: str, modules: list[str], tmp: str) -> dict[str, Any]:
    env = {**os.environ, "CUDA_MEMKIT_BACKEND": "cuda", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("NUMBA_CUDA_MEMORY_MANAGER", None)
    if mode == "memkit":
        env["NUMBA_CUDA_MEMORY_MANAGER"] = PLUGIN
    out = os.path.join(tmp, f"numba_suite_{mode}.json")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", mode, out, *modules], env=env,
                              capture_output=True, text=True, timeout=240, check=False)
    except subprocess.TimeoutExpired as exc:
        return {"mode": mode, "crashed": True, "rc": "timeout after 240 s",
                "stderr": str(exc.stderr or "")[-4000:], "stdout": str(exc.stdout or "")[-2000:]}
    if not os.path.exists(out):
        return {"mode": mode, "crashed": True, "rc": proc.returncode,
                "stderr": proc.stderr[-4000:], "stdout": proc.stdout[-2000:]}
    with open(out) as f:
        report: dict[str, Any] = json.load(f)
    report["rc"] = proc.returncode
    report["seconds"] = time.perf_counter() - t0
    report["stderr_tail"] = proc.stderr[-2000:]
    return report


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[4:], sys.argv[3])
        return 0
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--json", help="write the results here (default: $OUT/numba_suite.json)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the run with numba's manager")
    args = ap.parse_args()
    try:
        modules = discover()
    except ImportError as exc:
        print(f"numba-cuda is not importable: {exc}")
        return 2
    import tempfile

    tmp = tempfile.mkdtemp(prefix="numba_suite_")
    modes = ["memkit"] if args.no_baseline else ["memkit", "numba"]
    reports = {m: run_mode(m, modules, tmp) for m in modes}

    print(f"numba-cuda memory tests ({len(modules)} modules from numba.cuda.tests.cudadrv)")
    header = f"{'module':44} {'mode':7} {'ran':>4} {'pass':>5} {'fail':>5} {'err':>4} " \
             f"{'skip':>5} {'compile':>8}"
    print(header)
    totals: dict[str, dict[str, int]] = {}
    for name in modules:
        short = name.rsplit(".", 1)[1]
        for mode, rep in reports.items():
            if rep.get("crashed"):
                continue
            mod = rep["modules"].get(name, {})
            if "import_error" in mod:
                print(f"{short:44} {mode:7} import error: {mod['import_error'].splitlines()[-1]}")
                continue
            c = counts(mod.get("rows", []))
            t = totals.setdefault(mode, dict.fromkeys(c, 0))
            for k, v in c.items():
                t[k] += v
            print(f"{short:44} {mode:7} {c['ran']:4} {c['passed']:5} {c['failed']:5} "
                  f"{c['errors']:4} {c['skipped']:5} {c['compile']:8}")
    ok = True
    for mode, rep in reports.items():
        if rep.get("crashed"):
            print(f"{mode}: the test process died (rc={rep['rc']}):\n{rep['stderr']}")
            ok = False
            continue
        t = totals.get(mode, {})
        print(f"TOTAL {mode:7} ran {t.get('ran', 0)}, passed {t.get('passed', 0)}, failed "
              f"{t.get('failed', 0)}, errors {t.get('errors', 0)}, skipped {t.get('skipped', 0)};"
              f" {t.get('compile', 0)} of the failures/errors are kernel compilation; "
              f"manager at the end: {rep.get('manager')}")
    mk = reports.get("memkit", {})
    if not mk.get("crashed"):
        print(f"plugin calls: {mk.get('calls')}")
        if mk.get("filecheck_stubbed"):
            print("note: filecheck (numba-cuda's test extra) is not installed; a stand-in let "
                  "numba.cuda.testing import (the memory tests do not use it)")
        print(f"versions: {mk.get('versions')}")
        rows = [r for m in mk["modules"].values() for r in m.get("rows", [])]
        other = [r for r in rows if r["outcome"] in ("fail", "error") and not r["compile"]]
        base = reports.get("numba", {})
        base_bad = {r["test"] for m in base.get("modules", {}).values()
                    for r in m.get("rows", []) if r["outcome"] in ("fail", "error")}
        compile_only = {r["test"] for r in rows if r["compile"]}
        for r in other:
            tag = " (fails with numba's manager too)" if r["test"] in base_bad else ""
            print(f"FAILED under the plugin{tag}: {r['test']}\n    "
                  + r["detail"].strip().splitlines()[-1][:300])
        if other or (base and not base.get("crashed") and not compile_only <= base_bad):
            ok = False
        cannot = sorted(compile_only)
        if cannot:
            print(f"could not run (kernels cannot compile here): {len(cannot)}")
            for name in cannot:
                print(f"    {name}")
        skipped = [r for r in rows if r["outcome"] == "skip"]
        for r in skipped:
            print(f"skipped: {r['test']}: {r['detail'][:120]}")
        if not mk.get("calls", {}).get("memalloc"):
            print("the plugin's memalloc was never called: the plugin was not in use")
            ok = False
    path = args.json or (os.path.join(os.environ["OUT"], "numba_suite.json")
                         if os.environ.get("OUT") else None)
    if path:
        with open(path, "w") as f:
            json.dump({"modules": modules, "totals": totals, "reports": reports}, f, indent=1)
        print(f"wrote {path}")
    print("numba suite:", "OK" if ok else "PROBLEMS")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
