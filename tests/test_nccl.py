"""NCCL collectives on cuda_memkit memory: two ranks, one process per GPU.

``torch.distributed`` with the NCCL backend, each rank in a process of its own
(``tests/_nccl_worker.py``) on ``tcp://127.0.0.1`` at a free port; every rank
has at most a few minutes, then both are killed and the test fails (never a
hang). Skipped without two GPUs, torch or NCCL, and on the simulator. NVLink
multicast stays off (``NCCL_NVLS_ENABLE=0``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import cuda_memkit as cm
from cuda_memkit._core import _driver

ROOT = Path(__file__).resolve().parent.parent
WORLD = 2
TIMEOUT = 240


def _capable() -> str | None:
    """Why the NCCL tests cannot run here, or None."""
    if _driver.backend_name() == "sim":
        return "NCCL needs real GPUs (the simulator runs no collectives)"
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return "needs torch"
    if not dist.is_available() or not dist.is_nccl_available():
        return "needs torch.distributed with NCCL"
    if torch.cuda.device_count() < WORLD or cm.device_count() < WORLD:
        return f"needs {WORLD} GPUs"
    return None


pytestmark = [pytest.mark.multi_gpu,
              pytest.mark.skipif(_capable() is not None, reason=str(_capable()))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(scenario: str, tmp_path: Path) -> list[Any]:
    """Run ``scenario`` on both ranks; their results, rank order."""
    out = tmp_path / scenario
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
               NVSHMEM_DISABLE_NVLS="1",
               PYTHONPATH=os.pathsep.join(filter(None, (str(ROOT),
                                                        os.environ.get("PYTHONPATH")))))
    env.pop("CUDA_MEMKIT_BACKEND", None)
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, "-m", "tests._nccl_worker", scenario, str(rank),
                               str(WORLD), port, str(out)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(WORLD)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=TIMEOUT)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"{scenario}: a rank ran past {TIMEOUT} s (killed)")
    for rank, p in enumerate(procs):
        assert p.returncode == 0, f"rank {rank} of {scenario} failed:\n{logs[rank][-3000:]}"
    return [json.loads(Path(f"{out}.rank{rank}").read_text()) for rank in range(WORLD)]


# The ranks' managed buffers leave the driver's managed page cache behind on both devices
# (other processes' memory, which the device-wide leak check sees).
@pytest.mark.uses_managed_memory
def test_collectives_on_every_kind(tmp_path: Path) -> None:
    for rank, result in enumerate(run_ranks("collectives", tmp_path)):
        kinds = {k.split("/")[0] for k in result}
        assert kinds == {"device", "pool", "pool_cached", "growable", "registrable", "managed"}
        bad = {k: v for k, v in result.items() if not all(v.values())}
        assert not bad, f"rank {rank}: wrong results {bad}"


def test_the_documented_lifetime_pattern(tmp_path: Path) -> None:
    # compute-sanitizer (gpu-check's sanitize run) checks that no collective touches memory
    # freed under it; here the sums must hold for every reuse
    for result in run_ranks("lifetime", tmp_path):
        assert result == {"wrong": 0}


def test_process_group_torn_down_while_buffers_are_viewed(tmp_path: Path) -> None:
    for result in run_ranks("teardown", tmp_path):
        assert result["sums"] == [result["want"]] * 6
        assert result["after_close"] == [result["want"]] * 6  # nothing freed under a view
        assert result["live"] == {}  # nothing left in the ledger: nothing leaked


def test_nccl_registers_registrable_memory(tmp_path: Path) -> None:
    pytest.importorskip("nccl.core", reason="nccl4py is an optional extra")
    for result in run_ranks("nccl4py", tmp_path):
        assert result == {"registrable": True, "device": True}
