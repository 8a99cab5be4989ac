"""Interpreter exit is silent whoever holds cuda_memkit's objects until teardown.

A module that outlives cuda_memkit (imported before it, like ``os`` or numpy,
whose globals are cleared after cuda_memkit's at shutdown) holds objects of
every kind until the very end: their finalizers then run with cuda_memkit's
module globals already cleared to ``None``, and must neither raise nor warn.
Each variant is one Python subprocess (either backend); stderr must be empty
and the exit status 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

#: Objects of every kind of this area, as the script's ``objects()`` makes them: owners,
#: closed owners whose exports are alive, views, capsules, copies in flight, batches.
_SCRIPT = """
import sys
import numpy as np
import cuda_memkit as cm
from cuda_memkit._core import _inflight

HOLDER = sys.argv[1]
IN_FLIGHT = sys.argv[2] == "in-flight"
s = cm.Stream()
g = cm.granularity(0)
N = 1 << 16


def closed_with(make, export):
    buf = make()
    view = export(buf)
    buf.close()  # released when the view goes: at teardown
    return view


def vmm():
    vr, pm = cm.AddressRange.reserve(2 * g), cm.PhysicalMemory.create(g)
    m = vr.map(pm)
    m.set_access(0, cm.Access.READWRITE)
    return [vr, pm, m, m.as_array()]


def batch(method):
    d, h = cm.DeviceBuffer.zeros(N), cm.HostBuffer.zeros(N)
    b = cm.CopyBatch().add(d, h, dst_offsets=[4096, 0], src_offsets=[0, 4096], sizes=4096)
    b.execute(stream=s, method=method)
    return b


def grow():
    buf = cm.GrowableBuffer(4 * g, chunk=g)
    buf.resize(3 * g)
    return [buf, buf.as_array()]


def objects():
    reg_array = np.ones(N, np.uint8)
    out = [
        cm.HostBuffer.empty(N), cm.HostBuffer.zeros(N).array,
        closed_with(lambda: cm.HostBuffer.empty(N), lambda b: b.array),
        cm.HostBuffer.empty(N, flags=cm.HostAllocFlags.DEVICEMAP),
        cm.HostBuffer.pooled(N),
        closed_with(lambda: cm.HostBuffer.pooled(N), lambda b: b.array[16:]),
        cm.register_host(reg_array), reg_array,
        closed_with(lambda: cm.register_host(np.ones(N, np.uint8)), lambda r: r.array),
        cm.DeviceBuffer.empty(N), cm.DeviceBuffer.zeros(N).as_array(),
        closed_with(lambda: cm.DeviceBuffer.empty(N), lambda b: b.__dlpack__()),
        cm.ManagedBuffer.zeros(N), cm.ManagedBuffer.zeros(N).array,
        closed_with(lambda: cm.ManagedBuffer.zeros(N), lambda b: np.from_dlpack(b)),
        closed_with(lambda: cm.ManagedBuffer.zeros(N), lambda b: b.__dlpack__()),
        cm.PrefetchPlan().add(cm.ManagedBuffer.zeros(N), cm.Location.device(0)),
        vmm(), cm.PhysicalMemory.create(g), cm.AddressRange.reserve(g), grow(),
        batch("kernel"), batch("driver"),
        s, cm.Stream(),
    ]
    for kw in ({}, {"cache": True}, {"location": cm.Location.host()}):
        pool = cm.MemoryPool(**kw)
        out += [pool, pool.allocate(N, stream=s), pool.allocate(N, stream=s).as_array()]
    big = np.ones(64 << 20, np.uint8)  # a staged pageable copy: the staging ring stays
    dev = cm.DeviceBuffer.empty(big.nbytes)
    cm.copy(dev, big)
    out.append(dev)
    return out


if IN_FLIGHT:  # every copy below is still running at exit: its operands stay held
    _inflight._event_done = lambda ev: False
held = objects()
if IN_FLIGHT:
    h, d = cm.HostBuffer.pooled(N), cm.DeviceBuffer.empty(N)
    cm.copy_async(d, h, stream=s)
    cm.copy_async(cm.DeviceBuffer.empty(N).as_array(), cm.HostBuffer.empty(N), stream=s)
    h.close()  # closed under the copy: released after it, i.e. never
    held += [h, d]
    assert _inflight.pending_count() >= 2
if HOLDER == "os":
    import os
    os.memkit_test_objects = held
elif HOLDER == "numpy":
    np.memkit_test_objects = held
else:
    assert HOLDER == "cycle in os"
    import os
    held.append(held)
    os.memkit_test_objects = held
    del held
print("ready")
"""


@pytest.mark.slow_subprocess
@pytest.mark.uses_managed_memory
@pytest.mark.parametrize("holder", ["os", "numpy", "cycle in os"])
@pytest.mark.parametrize("copies", ["finished", "in-flight"])
def test_objects_held_by_a_module_that_outlives_cuda_memkit_exit_quietly(
        holder: str, copies: str) -> None:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_SCRIPT), holder, copies],
                          env=dict(os.environ), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == "ready\n"
    assert proc.stderr == "", proc.stderr[-3000:]
