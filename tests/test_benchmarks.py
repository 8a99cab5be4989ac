"""Every benchmark script runs to its table on the simulator (``--quick``).

The numbers come from the H100 (``scripts/gpu-check bench``); here only the scripts
themselves are checked, so that a rename cannot break one unnoticed until a device
run (``bench_pinned`` once called ``ctypes.fill``). Each runs in a subprocess with
warnings as errors, as the suite does.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "benchmarks").glob("bench_*.py"))


def test_every_benchmark_is_listed() -> None:
    assert len(SCRIPTS) >= 9, [p.name for p in SCRIPTS]


@pytest.mark.sim_only
@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_benchmark_runs_on_the_simulator(script: Path, tmp_path: Path) -> None:
    env = {**os.environ, "CUDA_MEMKIT_BACKEND": "sim", "PYTHONPATH": str(ROOT)}
    out = tmp_path / "result.json"
    args = [sys.executable, "-W", "error", str(script), "--quick"]
    if "--json" in script.read_text():
        args += ["--json", str(out)]
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert f"{script.stem}" in proc.stdout and "sim" in proc.stdout, proc.stdout[:500]
    if "--json" in args:
        assert out.stat().st_size > 0


def _harness() -> Any:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import harness
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return harness


def test_paired_ratio_takes_each_samples_ratio_not_the_ratio_of_medians() -> None:
    harness = _harness()
    # One sample drifted for the case only: the medians' ratio says 1.1, the samples 1.0.
    times = {"case": [1.0, 2.2, 3.0], "floor": [1.0, 2.0, 3.0]}
    assert statistics.median(times["case"]) / statistics.median(times["floor"]) == 1.1
    assert harness.paired_ratio(times, "case", "floor") == 1.0
    assert harness.paired_ratio({"case": [1.0, 2.0], "floor": [1.0]}, "case", "floor") is None
    assert harness.paired_ratio(times, "case", "absent") is None


def test_measure_hands_out_every_sample() -> None:
    harness = _harness()
    ran: list[str] = []
    out: dict[str, list[float]] = {}
    medians = harness.measure({"a": lambda n: ran.append("a"), "b": lambda n: ran.append("b"),
                               "none": None}, {"a": 1, "b": 1, "none": 1}, 5, lambda: None, 0,
                              out)
    assert sorted(out) == ["a", "b"] and all(len(v) == 5 for v in out.values())
    assert medians["none"] is None and medians["a"] == statistics.median(out["a"])
    assert ran.count("a") == ran.count("b") == 5 + 1  # the samples and the warm-up


def test_floor_target_on_a_paired_ratio_says_blocked_only_above_the_bound() -> None:
    harness = _harness()
    text, ok = harness.floor_target(1.07, 1.0, 1.05, 1.06, 1.08)
    assert ok is False and "BLOCKED: the promised work alone is 1.06x" in text
    text, ok = harness.floor_target(1.07, 1.0, 1.05, 1.04, 1.05)
    assert ok is False and "BLOCKED" not in text and "1.04x" in text
    assert harness.floor_target(1.03, 1.0, 1.05, 1.04, 1.05) == (
        "<= 1.05x its floor + ledger (1.03x)", True)


def test_paired_target_and_ablation_target_pair_each_floor_with_the_case() -> None:
    harness = _harness()
    times = {"memkit": [1.2, 2.3, 3.6], "floor": [1.0, 2.0, 3.0],
             "floor + promises": [1.1, 2.2, 3.3], "floor + promises + path": [1.3, 2.6, 3.9]}
    text, ok = harness.paired_target(times, "memkit", "floor", 1.15, "floor + promises")
    assert ok is False  # 1.2, 1.15, 1.2: median 1.2
    assert text == ("<= 1.15x its floor + ledger (1.20x); the promised work alone is 1.10x, "
                    "with the one release path 1.30x")
    assert harness.paired_target(times, "memkit", "floor", 1.25) == (
        "<= 1.25x its floor + ledger (1.20x)", True)
    assert harness.ablation_target(times, "floor + promises + path", "floor", 1.25) == (
        "ablation: 1.30x, ABOVE the 1.25x bound")
    assert harness.ablation_target(times, "floor + promises", "floor", 1.25) == (
        "ablation: 1.10x, within the 1.25x bound")
    assert harness.ablation_target(times, "absent", "floor", 1.25) == "ablation"


@pytest.mark.sim_only
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_every_ring_of_the_loader_benchmark_runs_as_many_passes_as_the_loaders() -> None:
    # A ring shared by two cases ran twice the passes of the Loader's, and a pass is what
    # mapped its pages in the workers: the floor came out ahead for that alone.
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_loader
        from harness import backend
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    import cuda_memkit as cm

    _name, simulated, raw = backend()
    cases = bench_loader.Cases(cm, raw, 4096, 4, 1, simulated)
    try:
        runs = cases.cases()
        for _ in range(4):  # two passes on each instance
            for case in ("loader", "both", "fill"):
                runs[case]()
        rings = cases.loaders + cases.floors + cases.fills
        assert len({id(r) for r in rings}) == 6
        assert {r._epochs.epoch for r in rings} == {cases.loaders[0]._epochs.epoch}
        assert {r._epochs.epoch for r in cases.loaders} != {0}
    finally:
        cases.close()
