"""Summarise a gpu-check work folder: pass counts from JUnit XML, benchmark JSON, the machine."""

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
        for s in suites for c in s.iter("testcase")
        if c.find("failure") is not None or c.find("error") is not None
    ]
    skipped = sorted({
        (sk.get("message") or "")[:120]
        for s in suites for c in s.iter("testcase") for sk in c.findall("skipped")
    })
    return {**out, "failed_tests": failed, "skip_reasons": skipped}  # type: ignore[dict-item]


def main() -> None:
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
