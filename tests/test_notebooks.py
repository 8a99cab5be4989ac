"""Every example notebook runs top to bottom on the active backend.

On the simulator the notebooks take their simulated branches (and say so); on
a GPU they measure for real. ``scripts/run_notebooks.py`` executes each one in
a fresh process and fails if any cell raises.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "examples").glob("*.ipynb"))


def test_there_are_notebooks() -> None:
    assert len(NOTEBOOKS) >= 4


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: pathlib.Path, tmp_path: pathlib.Path, backend: str,
                       ndevices: int) -> None:
    pytest.importorskip("matplotlib", reason="the notebooks plot with matplotlib")
    # A notebook about several devices says how many it needs in its metadata ...
    meta = json.loads(path.read_text())["metadata"].get("cuda_memkit", {})
    needs = meta.get("needs_devices", 1)
    if ndevices < needs:
        pytest.skip(f"{path.stem} needs {needs} devices, {ndevices} visible")
    # ... and the optional packages it is about (the test extra installs them).
    missing = [m for m in meta.get("needs_modules", []) if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{path.stem} needs {', '.join(missing)}, not installed")
    env = {**os.environ, "CUDA_MEMKIT_BACKEND": backend, "MPLBACKEND": "Agg"}
    # --one: the in-process executor, no Jupyter kernel needed
    out = tmp_path / path.name
    # The checkout first, then this process's PYTHONPATH: packages installed there (dask,
    # say) stay visible to the notebook.
    pythonpath = os.pathsep.join([str(ROOT), *(p for p in os.environ.get(
        "PYTHONPATH", "").split(os.pathsep) if p)])
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "run_notebooks.py"), "--one", str(path),
         str(out)], env={**env, "PYTHONPATH": pythonpath}, capture_output=True, text=True,
        timeout=600, check=False)
    cells = ([c for c in json.loads(out.read_text())["cells"] if c["cell_type"] == "code"]
             if out.exists() else [])
    errors = [o for c in cells for o in c["outputs"] if o["output_type"] == "error"]
    assert proc.returncode == 0, (proc.stdout[-3000:] + proc.stderr[-3000:]
                                  + "".join(e["traceback"][-1] for e in errors)[-3000:])
    assert cells and all(c["execution_count"] for c in cells)
    assert not errors
