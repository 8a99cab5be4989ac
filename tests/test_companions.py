"""Internal paths that reach a plug-in module before the package loaded it.

``cuda_memkit`` loads its feature modules lazily, each with the modules that
plug into it. Code inside the package that imports a module directly (the
copy kernel takes its descriptors from ``HostBuffer.pooled``) must work in a
process that never touched the public name that loads the plug-in: each case
runs in a fresh interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DEVICE_ONLY_KERNEL = """
import numpy as np
import cuda_memkit as cm
n, b = 64, 4096
src, dst = cm.DeviceBuffer.empty(n * b), cm.DeviceBuffer.empty(n * b)
src.copy_from(np.arange(n * b, dtype=np.uint64).astype(np.uint8))
off = np.random.default_rng(1).permutation(n) * b
with cm.Stream() as s:
    cm.copy_batch(dst, src, dst_offsets=off, src_offsets=np.arange(n) * b, sizes=b,
                  stream=s, method="kernel")
    s.synchronize()
want = np.empty(n * b, np.uint8)
want.reshape(n, b)[off // b] = src.to_numpy().reshape(n, b)
assert (dst.to_numpy() == want).all()
import sys
assert "cuda_memkit._host._pinned_pool" in sys.modules
print("ok")
"""

INTERNAL_POOLED = """
import cuda_memkit
from cuda_memkit._host._pinned import HostBuffer
buf = HostBuffer.pooled(4096)
buf.array[:] = 7
assert int(buf.array.sum()) == 7 * 4096
buf.close()
print("ok")
"""


@pytest.mark.parametrize("script", [DEVICE_ONLY_KERNEL, INTERNAL_POOLED],
                         ids=["kernel-path-device-buffers-only", "pooled-through-internal-import"])
def test_plug_in_loads_on_first_internal_use(script: str) -> None:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("CUDA_MEMKIT_BACKEND", "sim")
    proc = subprocess.run([sys.executable, "-W", "error", "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")
