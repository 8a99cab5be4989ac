"""Pool memory held until interpreter exit: the exit is silent, for every kind that lends it.

A module that outlives cuda_memkit holds the object (``sys``, whose globals
Python clears last at exit), and every cuda_memkit module is kept alive until
then: Python clears the globals of those modules first, then ``sys``'s, which
drops the object: its finalizer then runs with cuda_memkit's module globals
gone (``None``), and must use none of them ("Exception ignored in ...
__del__" otherwise). Each script checks that the globals of the object's
module and of the allocation core were gone when the object was dropped, so
the test cannot pass without meeting that situation.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

import cuda_memkit as cm

ROOT = pathlib.Path(cm.__file__).resolve().parent.parent

_SCRIPT = """
import sys
import numpy as np
import cuda_memkit as cm
{setup}

class Probe:
    # Dropped just before the object: were cuda_memkit's module globals gone by then?
    def __init__(self, *names):
        self.globals = [vars(sys.modules[name]) for name in names]

    def __del__(self, _print=print):
        _print("globals gone:", all(g.get("__name__") is None for g in self.globals), flush=True)

obj = {make}
# Every cuda_memkit module stays alive until the globals of live modules are cleared.
sys._memkit_exit_modules = [m for n, m in sys.modules.items() if n.startswith("cuda_memkit")]
sys._memkit_exit_probe = Probe("cuda_memkit._pools._cache", type(obj).__module__)
sys._memkit_exit_object = obj  # dropped after the probe
del obj
print("made", flush=True)
"""

_CUPY = """
from tests import _fake_frameworks as fake
sys.modules["cupy"] = fake.FakeCupy(cm.device_count())
from cuda_memkit import allocators
"""

_NUMBA = """
from tests import _fake_frameworks as fake
numba = fake.FakeNumba()
sys.modules.update(numba.modules())
from cuda_memkit.allocators import numba as plugin
numba.set_memory_manager(plugin.MemkitNumbaManager)
ctx = numba.current_context()
"""

#: kind -> (setup code, expression making the object the holder keeps)
KINDS = {
    "PoolBuffer": ("", "cm.MemoryPool(0).allocate(1000, stream=cm.Stream())"),
    "PoolBuffer, cached": ("", "cm.MemoryPool(0, cache=True).allocate(1000, stream=cm.Stream())"),
    "PoolBuffer, above the cache's sizes": (
        "", "cm.MemoryPool(0, cache=True).allocate(65 << 20, stream=cm.Stream())"),
    "PoolBuffer, the default pool's cache": (
        "", "cm.MemoryPool.default(0, cache=True).allocate(1000, stream=None)"),
    "PoolBuffer, host pool, closed under a numpy view": (
        "buf = cm.MemoryPool(location=cm.Location.host()).allocate(4096, stream=None)\n"
        "view = buf.array\nbuf.close()\ndel buf", "view"),
    "HostBuffer.pooled": ("", "cm.HostBuffer.pooled(4096)"),
    "HostBuffer.pooled, large": ("", "cm.HostBuffer.pooled(2 << 20)"),
    "HostBuffer.pooled of a pool": (
        "", "cm.HostBuffer.pooled(4096, pool=cm.MemoryPool(location=cm.Location.host()))"),
    "HostBuffer.empty(pool=...)": (
        "", "cm.HostBuffer.empty((8, 8), np.float32, pool=cm.MemoryPool.default_pinned())"),
    "CuPy memory, cached": (_CUPY, "[allocators.cupy_allocator(), 0][0](1000)"),
    "CuPy memory, uncached": (_CUPY, "allocators.cupy_allocator(cache=False)(1000)"),
    "CuPy pinned memory": (_CUPY, "allocators.cupy_pinned_allocator()(3000)"),
    "numba memory": (_NUMBA, "ctx.memalloc(1000)"),
    "numba pinned memory": (_NUMBA, "ctx.memhostalloc(3000)"),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_held_until_exit_is_silent(kind: str, tmp_path: pathlib.Path) -> None:
    setup, make = KINDS[kind]
    script = tmp_path / "held.py"
    script.write_text(_SCRIPT.format(setup=setup, make=make))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-W", "error", str(script)], capture_output=True,
                         text=True, timeout=120, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["made", "globals", "gone:", "True"], out.stdout
    assert out.stderr == ""
