"""Summarise a gpu-check work folder: pass counts from JUnit XML, benchmark JSON, the machine.

    python scripts/gpu_summary.py WORK          # the summary of a work folder, as JSON
    python scripts/gpu_summary.py --merge FIRST AGAIN > MERGED.xml
        # a parallel run's JUnit XML with each test that ran again alone taking its
        # result from the second run (gpu-check tests)
    python scripts/gpu_summary.py --suite MERGED.xml   # one line of counts, the failures
    python scripts/gpu_summary.py --failed RUN.xml > IDS   # the failed tests' node ids
"""

from __future__ import annotations

import json
import pathlib
import sys
import xml.etree.ElementTree as ET


def counts(path: pathlib.Path) -> dict[str, int]:
    if not path.exists():
        return {"missing": 1}
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    out = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for s in suites:
        for k in out:
            out[k] += int(s.get(k, 0))
    out["passed"] = out["tests"] - out["failures"] - out["errors"] - out["skipped"]
    failed = [
        f"{c.get('classname')}::{c.get('name')}"
        + (" (failed in parallel; not re-run alone)"
           if c.get("alone") == "not run" else "")
        for s in suites for c in s.iter("testcase")
        if c.find("failure") is not None or c.find("error") is not None
    ]
    skipped = sorted({
        (sk.get("message") or "")[:120]
        for s in suites for c in s.iter("testcase") for sk in c.findall("skipped")
    })
    return {**out, "failed_tests": failed, "skip_reasons": skipped}  # type: ignore[dict-item]


def merge(first: pathlib.Path, again: pathlib.Path) -> ET.Element:
    """``first``'s test cases, each replaced by its namesake in ``again`` where there is one."""
    def cases(path: pathlib.Path) -> list[ET.Element]:
        if not path.exists():
            return []
        return list(ET.parse(path).getroot().iter("testcase"))

    def key(c: ET.Element) -> tuple[str | None, str | None]:
        return c.get("classname"), c.get("name")

    rerun = {key(c): c for c in cases(again)}
    merged = []
    for c in cases(first):
        alone = rerun.pop(key(c), None)
        if alone is None and (c.find("failure") is not None or c.find("error") is not None):
            c.set("alone", "not run")  # the re-run did not reach it: say so
        merged.append(c if alone is None else alone)
    merged.extend(rerun.values())
    suite = ET.Element("testsuite", name="suite")
    tally = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for c in merged:
        suite.append(c)
        tally["tests"] += 1
        for tag, k in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
            if c.find(tag) is not None:
                tally[k] += 1
    for k, v in tally.items():
        suite.set(k, str(v))
    root = ET.Element("testsuites")
    root.append(suite)
    return root


def failed_ids(path: pathlib.Path, root: pathlib.Path) -> list[str]:
    """The pytest node ids of the failed test cases of a JUnit XML file (run from ``root``).

    The ids are rebuilt from ``classname`` (``tests.test_x`` or ``tests.test_x.TestY``)
    and ``name``: the longest prefix of the class name that is a test file is the file.
    """
    if not path.exists():
        return []
    out = []
    for c in ET.parse(path).getroot().iter("testcase"):
        if c.find("failure") is None and c.find("error") is None:
            continue
        parts = (c.get("classname") or "").split(".")
        for i in range(len(parts), 0, -1):
            f = pathlib.Path(*parts[:i]).with_suffix(".py")
            if (root / f).is_file():
                out.append("::".join([f.as_posix(), *parts[i:], c.get("name") or ""]))
                break
    return list(dict.fromkeys(out))  # a test that failed and then errored at teardown: once


def main() -> None:
    if sys.argv[1] == "--failed":  # one node id per line, for the re-run
        print("\n".join(failed_ids(pathlib.Path(sys.argv[2]), pathlib.Path.cwd())))
        return
    if sys.argv[1] == "--merge":
        ET.dump(merge(pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])))
        return
    if sys.argv[1] == "--suite":
        c = counts(pathlib.Path(sys.argv[2]))
        print(f"suite: {c.get('passed', 0)} passed, "
              f"{c.get('failures', 0) + c.get('errors', 0)} failed, "
              f"{c.get('skipped', 0)} skipped (parallel, failures re-run alone)")
        for name in c.get("failed_tests", []):  # type: ignore[union-attr]
            alone = "not re-run alone" not in name
            print(f"  FAILED alone too: {name}" if alone else f"  FAILED: {name}")
        return
    work = pathlib.Path(sys.argv[1])
    summary: dict[str, object] = {
        "conformance": counts(work / "junit-conformance.xml"),
        "suite": counts(work / "junit-suite.xml"),
        "benchmarks": {},
    }
    for f in sorted((work / "results").glob("bench_*.json")):
        try:
            summary["benchmarks"][f.stem] = json.loads(f.read_text())  # type: ignore[index]
        except ValueError as exc:
            summary["benchmarks"][f.stem] = {"error": str(exc)}  # type: ignore[index]
    machine = work / "results" / "machine.json"
    if machine.exists():
        summary["machine"] = json.loads(machine.read_text())
    nb = work / "notebooks.log"
    if nb.exists():
        summary["notebooks"] = nb.read_text()[-2000:]
    print(json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":
    main()
