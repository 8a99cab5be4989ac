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
        "  FAILED: tests.test_b::test_late (failed in parallel; not re-run alone)",
    ]


def test_the_failed_tests_node_ids_for_the_re_run(tmp_path: pathlib.Path) -> None:
    xml = tmp_path / "run.xml"
    xml.write_text(PARALLEL.replace(
        '<testcase classname="tests.test_a" name="test_ok"/>',
        '<testcase classname="tests.test_gpu_summary" name="test_x[a b-2**64]">'
        '<failure message="leaked"/></testcase>'
        '<testcase classname="tests.test_gpu_summary" name="test_x[a b-2**64]">'
        '<error message="teardown"/></testcase>'))
    out = subprocess.run([sys.executable, str(SCRIPT), "--failed", str(xml)], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    # test_a.py and test_b.py are not files of the checkout: their cases cannot be re-run
    assert out == ["tests/test_gpu_summary.py::test_x[a b-2**64]"]
