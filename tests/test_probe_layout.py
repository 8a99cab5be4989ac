"""Layout of the driver probe (``scripts/gpu_probe.py`` + ``scripts/driver_probe/``).

The conformance tests and the simulator follow ``tests/conformance/h100_probe.json``,
recorded by the probe; a case of that file must never silently stop being
registered.  The last test runs the entry point (``--dry``) on two harmless
cases with a simulated child crash: the runner, its crash recovery and the
output shape.  With a real driver present, ``--dry`` makes the calls for real;
those two cases only read error strings and device attributes.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
ENTRY = SCRIPTS / "gpu_probe.py"
H100 = ROOT / "tests" / "conformance" / "h100_probe.json"
#: Answers of the two-device cases (section F), recorded on two H200s.
TWO_GPUS = ROOT / "tests" / "conformance" / "h200x2_probe.json"
SECTION = {"core": "A", "pinned": "B", "managed": "C", "vmm": "D", "pool": "E", "peer": "F",
           "capture": "G"}


@pytest.fixture(scope="module")
def pkg() -> ModuleType:
    """The ``driver_probe`` package with every feature module loaded (no driver call)."""
    pytest.importorskip("cuda.bindings.driver")
    name = "driver_probe"
    if name not in sys.modules:
        init = SCRIPTS / name / "__init__.py"
        spec = importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[str(init.parent)]
        )
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    mod = sys.modules[name]
    mod.load()
    importlib.import_module(name + "._runner")
    return mod


def registered(pkg: ModuleType) -> dict[str, Any]:
    return {p.name: p for p in sys.modules["driver_probe._framework"].CASES}


def test_every_recorded_case_is_registered(pkg: ModuleType) -> None:
    recorded = set(json.loads(H100.read_text())) - {"_meta"}
    runner_cases = set(sys.modules["driver_probe._runner"].RUNNER_CASES)
    names = set(registered(pkg))
    assert runner_cases <= recorded
    missing = sorted(recorded - runner_cases - names)
    assert not missing, f"cases of h100_probe.json no probe module registers: {missing}"
    if TWO_GPUS.exists():
        two = set(json.loads(TWO_GPUS.read_text())) - {"_meta"} - runner_cases
        assert two and all(n.startswith("F_") for n in two)
        assert not sorted(two - names), "cases of h200x2_probe.json no probe module registers"
    assert len(names) >= 50  # the 53 probes of the split; never fewer by accident


def test_each_feature_module_holds_its_section(pkg: ModuleType) -> None:
    assert tuple(pkg.FEATURES) == tuple(SECTION)
    seen = set()
    for p in sys.modules["driver_probe._framework"].CASES:
        module = p.fn.__module__.rpartition(".")[2]
        assert p.name.startswith(SECTION[module] + "_"), (p.name, module)
        seen.add(module)
    assert seen == set(SECTION)  # no feature module without cases


def test_duplicate_probe_name_is_refused(pkg: ModuleType) -> None:
    fw = sys.modules["driver_probe._framework"]
    n = len(fw.CASES)
    with pytest.raises(ValueError, match="registered twice"):
        fw.probe("A_memset")(lambda c: None)
    assert len(fw.CASES) == n


def test_case_selection(pkg: ModuleType) -> None:
    runner = sys.modules["driver_probe._runner"]
    names = [p.name for p in runner.select("B_host*,re:^E_pool_(ipc|access)$,A_memset")]
    # registration order is kept, not pattern order
    assert names == ["A_memset", "B_hostalloc_flags", "B_host_register", "E_pool_access",
                     "E_pool_ipc"]
    assert [p.name for p in runner.select(None, "timing")] == [
        "B_timing_hostalloc", "C_timing_prefetch", "D_timing", "E_timing"]
    assert len(runner.select(None, None)) == len(registered(pkg))
    with pytest.raises(ValueError, match="matches no registered case"):
        runner.select("A_memset,Z_*")


def _entry(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "GPU_PROBE_TEST_CRASH"}
    full_env.update(env)
    return subprocess.run([sys.executable, str(ENTRY), *args], capture_output=True, text=True,
                          timeout=60, env=full_env, cwd=str(ROOT))


def test_list_names_every_registered_case(pkg: ModuleType) -> None:
    proc = _entry("--list")
    assert proc.returncode == 0, proc.stderr
    listed = [line.split()[0] for line in proc.stdout.splitlines()]
    assert listed == list(registered(pkg))
    isolated = {line.split()[0] for line in proc.stdout.splitlines() if line.endswith("isolated")}
    assert isolated == {n for n, p in registered(pkg).items() if p.isolated}


def test_dry_subset_recovers_from_a_child_crash(tmp_path: Path) -> None:
    pytest.importorskip("cuda.bindings.driver")
    out = tmp_path / "probe.json"
    proc = _entry("--dry", "--cases", "A_error_strings,A_device_attributes", str(out),
                  GPU_PROBE_TEST_CRASH="A_error_strings:3")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert set(res) == {"_meta", "A_first_cuInit", "A_error_strings", "A_device_attributes"}
    assert res["_meta"]["dry"] is True
    assert res["_meta"]["crashed_cases"] == ["A_error_strings"]
    assert res["A_first_cuInit"]["result"] == "CUDA_SUCCESS"
    # the child died at call 3 (cuGetErrorString of the second CUresult); the re-run
    # skipped that call and went on with the next case of the batch
    crashes = res["A_error_strings"]["crashes"]
    assert [(x["call_index"], x["function"], x["rc"]) for x in crashes] == [
        (3, "cuGetErrorString", -11)]
    assert "died 1x" in res["A_error_strings"]["note"]
    table = res["A_error_strings"]["values"]["error_table"]
    skipped = [k for k, v in table.items() if isinstance(v["string"], dict)
               and isinstance(v["string"].get("result"), dict)
               and "crash" in v["string"]["result"]]
    assert len(skipped) == 1
    assert "A_device_attributes" not in res["_meta"]["crashed_cases"]
    assert "isolated" not in res["A_error_strings"]
    # the step labels are those of the H100 recording
    h100 = json.loads(H100.read_text())
    for name in ("A_error_strings", "A_device_attributes"):
        assert list(res[name]["result"]) == list(h100[name]["result"]), name
        assert set(res[name]["values"]) == set(h100[name]["values"]), name
