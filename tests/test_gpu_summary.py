"""The GPU runner's summary: a re-run takes the second result; a failure not re-run says so."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_summary.py"

PARALLEL = """<testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_ok"/>
<testcase classname="tests.test_a" name="test_flaky"><failure message="leaked"/></testcase>
<testcase classname="tests.test_a" name="test_broken"><failure message="wrong"/></testcase>
<testcase classname="tests.test_b" name="test_late"><error message="leaked"/></testcase>
</testsuite></testsuites>"""
ALONE = """<testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_flaky"/>
<testcase classname="tests.test_a" name="test_broken"><failure message="wrong"/></testcase>
</testsuite></testsuites>"""


def test_a_failure_not_re_run_is_not_called_a_failure_alone(tmp_path: pathlib.Path) -> None:
    (tmp_path / "first.xml").write_text(PARALLEL)
    (tmp_path / "again.xml").write_text(ALONE)
    merged = subprocess.run([sys.executable, str(SCRIPT), "--merge", str(tmp_path / "first.xml"),
                             str(tmp_path / "again.xml")], capture_output=True, text=True,
                            check=True).stdout
    (tmp_path / "merged.xml").write_text(merged)
    out = subprocess.run([sys.executable, str(SCRIPT), "--suite", str(tmp_path / "merged.xml")],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0].startswith("suite: 2 passed, 2 failed")
    assert out[1:] == [
        "  FAILED alone too: tests.test_a::test_broken",
        "  FAILED: tests.test_b::test_late (failed in parallel; not re-run alone: no time left)",
    ]
