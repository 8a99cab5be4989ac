"""A replaced machine reaches the library: ``sim.reset()`` and ``_driver.reset_backend()``.

What the library keeps of one machine (retained primary contexts, peer access, the
default pools and their caches, the pinned block cache, loaded kernel modules) is
forgotten when the machine is replaced, and the library works on the new one. Each case
runs in its own interpreter: replacing the machine of this session would take the
memory of every test's fixtures with it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ._helpers import run_script

pytestmark = pytest.mark.sim_only


def _run(tmp_path: Path, body: str) -> None:
    script = tmp_path / "reset.py"
    script.write_text(textwrap.dedent(body))
    proc = run_script(script, CUDA_MEMKIT_BACKEND="sim")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("ok"), proc.stdout


def test_a_simulator_reset_forgets_the_old_machine_and_works_on_the_new(
        tmp_path: Path) -> None:
    _run(tmp_path, """
        import numpy as np
        import cuda_memkit as cm
        from cuda_memkit import sim
        from cuda_memkit._core import _context, _peer

        sim.reset(devices=2)
        cm.Device(0).enable_peer_access(1)
        pinned = cm.MemoryPool.default_pinned()
        cm.HostBuffer.pooled(4096).close()
        cm.MemoryPool.default(0).allocate(4096, stream=None).close()
        src = cm.DeviceBuffer.empty(4096, device=0)
        dst = cm.DeviceBuffer.empty(4096, device=1)
        cm.copy_batch(dst, src, dst_offsets=[0], src_offsets=[0], sizes=[4096], method="kernel")
        src.close(); dst.close()

        sim.reset(devices=2)
        assert _context.retained_context(0) is None, "a context of the old machine is kept"
        assert not _peer.enabled, "peer access of the old machine is kept"
        assert not cm.Device(0).peer_access_enabled(1)
        assert cm.MemoryPool.default_pinned() is not pinned, "the old pinned pool is kept"
        with cm.HostBuffer.pooled(4096) as h:
            h.array[:] = 7
            with cm.MemoryPool.default(0).allocate(4096, stream=None) as p:
                cm.copy(p, h)
                out = np.zeros(4096, np.uint8)
                cm.copy(out, p)
        assert (out == 7).all()
        src = cm.DeviceBuffer.empty(4096, device=0)
        dst = cm.DeviceBuffer.empty(4096, device=1)
        cm.copy_batch(dst, src, dst_offsets=[0], src_offsets=[0], sizes=[4096], method="kernel")
        src.close(); dst.close()
        print("ok")
    """)


def test_forgetting_the_backend_forgets_the_machine(tmp_path: Path) -> None:
    _run(tmp_path, """
        import cuda_memkit as cm
        from cuda_memkit._core import _context, _driver

        cm.DeviceBuffer.empty(64).close()
        assert _context.retained_context(0) is not None
        _driver.reset_backend()
        assert _context.retained_context(0) is None
        cm.DeviceBuffer.empty(64).close()  # the backend loads again, with a context
        print("ok")
    """)
