"""memory_stats() against the driver: cuMemGetInfo deltas and pool statistics.

memory_stats() reports the library's own bookkeeping (the bytes asked for);
these tests allocate known sizes of the kinds that take device memory and
compare with what the driver says it lost, on both backends:

* cuMemAlloc (DeviceBuffer), cuMemCreate (PhysicalMemory, and the chunks of a
  GrowableBuffer): free memory drops by the size for multiples of 2 MiB (the
  H100 maps device memory in 2 MiB pages: probes A_mem_alloc_free and
  D_create saw exactly 64 MiB for 64 MiB). An odd size drops free memory by
  the size rounded up to a 2 MiB page on the H100 (the simulator: the size),
  while the ledger keeps the size asked for.
* Pool buffers: the pool's USED_MEM_CURRENT grows by the ledger's bytes
  (exact for multiples of 4 KiB on the H100, probe E_pool_stats), and free
  memory by the pool's RESERVED_MEM_CURRENT (32 MiB chunks).

On the real driver free memory moves only by whole pages and other work can
move it a little: the tolerance is 2 MiB there, 0 on the simulator.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

import cuda_memkit as cm
from cuda_memkit._core import _driver

MiB = 1 << 20
PAGE = 2 * MiB
TOL = 0 if _driver.backend_name() == "sim" else 2 * MiB


def _free() -> int:
    dev = cm.Device(0)
    dev.synchronize()
    return dev.mem_info()[0]


def _ledger(kind: str) -> int:
    return cm.memory_stats(0).by_kind[kind].current


@pytest.fixture(scope="module", autouse=True)
def _default_pinned() -> None:
    """Make the process-wide pinned pool (and its stream) before the leak check's snapshots."""
    cm.HostBuffer.pooled(1).close()
    cm.MemoryPool.default_pinned().trim()


@pytest.fixture(autouse=True)
def _warm() -> Iterator[None]:
    """A context and the driver's own first allocations exist before the first reading."""
    cm.DeviceBuffer.empty(1).close()
    yield
    gc.collect()


@pytest.mark.parametrize("nbytes", [64 * MiB, 64 * MiB + 1, 3 * PAGE])
def test_device_buffer_matches_cumemgetinfo(nbytes: int) -> None:
    f0, s0 = _free(), _ledger("device")
    buf = cm.DeviceBuffer.empty(nbytes)
    lost, counted = f0 - _free(), _ledger("device") - s0
    buf.close()
    assert counted == nbytes  # the ledger: the bytes asked for
    pages = -(-nbytes // PAGE) * PAGE
    assert nbytes - TOL <= lost <= pages + TOL, (lost, nbytes)
    if nbytes % PAGE == 0:
        assert abs(lost - nbytes) <= TOL
    assert abs(f0 - _free()) <= TOL


def test_physical_memory_and_growable_match_cumemgetinfo() -> None:
    g = cm.granularity(0)
    n = 32 * g
    f0 = _free()
    p0, g0 = _ledger("vmm_physical"), _ledger("growable")
    phys = cm.PhysicalMemory.create(n)
    lost_phys = f0 - _free()
    assert _ledger("vmm_physical") - p0 == n and abs(lost_phys - n) <= TOL
    grow = cm.GrowableBuffer(4 * n, chunk=g)
    grow.resize(n - 1)  # maps whole chunks: the ledger counts the mapped bytes
    lost_both = f0 - _free()
    assert _ledger("growable") - g0 == grow.capacity == n
    assert abs(lost_both - 2 * n) <= TOL
    with cm.AddressRange.reserve(n) as rng, rng.map(phys):  # a mapping costs no memory
        assert abs(f0 - _free() - 2 * n) <= TOL
        assert cm.memory_stats(0).by_device[0].current - p0 - g0 - _ledger(
            "device") - _ledger("pool") - _ledger("managed") == 2 * n
    grow.close()
    phys.close()
    assert abs(f0 - _free()) <= TOL
    assert (_ledger("vmm_physical"), _ledger("growable")) == (p0, g0)


def test_pool_buffers_match_the_pool_statistics() -> None:
    stream = cm.Stream()
    with cm.MemoryPool(0) as pool:
        f0 = _free()
        sizes = [4 * MiB, 12 * 4096, MiB + 4096]
        bufs = [pool.allocate(n, stream=stream) for n in sizes]
        stream.synchronize()
        mine = cm.memory_stats(0).pool(pool)
        st = pool.stats()
        assert (mine.current, mine.live, mine.total) == (sum(sizes), 3, 3)
        assert st.used_current == mine.current == mine.peak
        assert abs((f0 - _free()) - st.reserved_current) <= TOL
        bufs.pop().free()
        stream.synchronize()
        assert pool.stats().used_current == cm.memory_stats(0).pool(pool).current
        assert cm.memory_stats(0).pool(pool).peak == st.used_high == sum(sizes)
        for b in bufs:
            b.free()
        stream.synchronize()
        assert pool.stats().used_current == cm.memory_stats(0).pool(pool).current == 0
    stream.close()


@pytest.mark.uses_managed_memory
def test_host_and_managed_kinds_count_their_sizes() -> None:
    """Memory the device does not hold (pinned, registered, managed until touched): the ledger."""
    import numpy as np

    before = cm.memory_stats()
    objs = [cm.HostBuffer.empty(3 * MiB), cm.HostBuffer.pooled(5000),
            cm.register_host(np.zeros(MiB, np.uint8)), cm.ManagedBuffer.empty(2 * MiB)]
    now = cm.memory_stats()
    for o in objs:
        o.close()
    delta = {k: now.by_kind[k].current - before.by_kind[k].current for k in cm.MEMORY_KINDS}
    assert delta == {"device": 0, "pool": 0, "managed": 2 * MiB, "pinned": 3 * MiB,
                     "pinned_pooled": 5000, "registered": MiB, "vmm_physical": 0,
                     "vmm_mapped": 0, "growable": 0, "shared_ring": 0,
                     "managed_resident": 0, "graph": 0, "graph_exec": 0}
    cm.MemoryPool.default_pinned().trim()
