"""Every benchmark script runs to its table on the simulator (``--quick``).

The numbers come from the H100 (``scripts/gpu-check bench``); here only the scripts
themselves are checked, so that a rename cannot break one unnoticed until a device
run (``bench_pinned`` once called ``ctypes.fill``). Each runs in a subprocess with
warnings as errors, as the suite does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
