"""What a ``CopyBatch`` holds, and what every batch path checks before anything is issued.

* A closed batch holds none of its operands, whichever path (kernel or driver) ran.
* Raw addresses: address + offset + size stays below 2**64 on every side and path.
* ``allow_pageable`` is a bool; location hints name devices that exist, on every path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

import numpy as np
import pytest

import cuda_memkit as cm

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.usefixtures("default_pinned", "flush_pinned")

BLOCK = 4096


# -- a closed batch lets go of its operands -------------------------------------------------


@pytest.mark.parametrize("method", ["kernel", "driver", "auto"])
@pytest.mark.parametrize("on_stream", [False, True])
def test_a_closed_batch_holds_none_of_its_operands(method: str, on_stream: bool,
                                                   stream: cm.Stream) -> None:
    """After close() (and the stream's work), dropping the operands frees them: the batch
    keeps no reference, neither in its pairs nor in what it remembers of the kernel's pick."""
    h = cm.HostBuffer.zeros(8 * BLOCK)
    d = cm.DeviceBuffer.zeros(8 * BLOCK)
    b = cm.CopyBatch().add(d, h, dst_offsets=np.arange(8)[::-1] * BLOCK,
                           src_offsets=np.arange(8) * BLOCK, sizes=BLOCK)
    b.execute(stream=stream if on_stream else None, method=method)
    stream.synchronize()
    b.close()
    refs = [weakref.ref(h), weakref.ref(d)]
    del h, d
    assert [r() for r in refs] == [None, None]  # freed by reference counting, no cycle
    assert b.closed and b.device_nbytes == 0


@pytest.mark.slow_subprocess
def test_the_exit_report_does_not_name_a_closed_batchs_operands(tmp_path: Path) -> None:
    """Operands dropped after the batch that copied them (kernel path) was closed are freed:
    the leak report at exit finds nothing."""
    script = tmp_path / "closed_batch.py"
    script.write_text(textwrap.dedent("""
        import numpy as np
        import cuda_memkit as cm

        h, d = cm.HostBuffer.zeros(8 * 4096), cm.DeviceBuffer.zeros(8 * 4096)
        b = cm.CopyBatch().add(d, h, dst_offsets=np.arange(8)[::-1] * 4096,
                               src_offsets=np.arange(8) * 4096, sizes=4096)
        b.execute(method="kernel")
        b.close()
        del h, d
    """))
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDA_MEMKIT_LEAK_REPORT", "PYTEST_ADDOPTS")}
    env.update(CUDA_MEMKIT_LEAK_REPORT="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "no memory left at exit" in proc.stderr, proc.stderr

