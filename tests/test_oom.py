"""Out of memory: device, pool and VMM requests beyond what is available.

Each raises :class:`CudaOutOfMemoryError` (a ``MemoryError``), leaves nothing
allocated, and the next allocation succeeds. On the simulator the device is
shrunk to 512 MiB free for the test; on a GPU the real free memory is used.
Managed and pinned host memory are only exhausted on the simulator: never
oversubscribe managed memory on a real GPU.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit._core import _driver

from ._nothing import nothing_allocated

MiB = 1 << 20
GiB = 1 << 30


@pytest.fixture
def free() -> Iterator[int]:
    """Free bytes on device 0 (the simulator's device shrunk to 512 MiB free)."""
    if _driver.backend_name() == "sim":
        from cuda_memkit.sim import machine

        dev = machine().devices[0]
        total = dev.total_mem
        dev.total_mem = dev.used + 512 * MiB
        try:
            yield 512 * MiB
        finally:
            dev.total_mem = total
        return
    yield cm.Device(0).mem_info()[0]


def _still_works() -> None:
    with cm.DeviceBuffer.empty(MiB) as d:
        cm.copy(d, np.ones(MiB, np.uint8))
        out = np.zeros(MiB, np.uint8)
        cm.copy(out, d)
        assert out.all()


def _oom(monkeypatch: pytest.MonkeyPatch, fn: object, *, undone: bool = False
         ) -> cm.CudaOutOfMemoryError:
    with nothing_allocated(monkeypatch, driver_may_refuse=True, undone=undone), \
            pytest.raises(cm.CudaOutOfMemoryError) as info:
        fn()  # type: ignore[operator]
    err = info.value
    assert isinstance(err, MemoryError)
    assert err.name == "CUDA_ERROR_OUT_OF_MEMORY"
    return err


def test_device_buffer_beyond_free_memory(free: int, monkeypatch: pytest.MonkeyPatch) -> None:
    err = _oom(monkeypatch, lambda: cm.DeviceBuffer.empty(free + GiB))
    assert err.api == "cuMemAlloc"
    _still_works()


def test_device_buffer_when_the_device_is_nearly_full(free: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    big = cm.DeviceBuffer.empty(free * 3 // 4)
    try:
        _oom(monkeypatch, lambda: cm.DeviceBuffer.empty(free // 2))
        _still_works()
    finally:
        big.close()
    with cm.DeviceBuffer.empty(free // 2):  # fits again
        pass


def test_pool_beyond_max_size(monkeypatch: pytest.MonkeyPatch, stream: cm.Stream) -> None:
    with cm.MemoryPool(0, max_size=64 * MiB) as pool:
        a = pool.allocate(32 * MiB, stream=stream)
        err = _oom(monkeypatch, lambda: pool.allocate(48 * MiB, stream=stream))
        assert err.api == "cuMemAllocFromPoolAsync"
        _oom(monkeypatch, lambda: pool.allocate(65 * MiB, stream=stream))
        b = pool.allocate(16 * MiB, stream=stream)  # still fits in the second chunk
        a.free()
        b.free()
        stream.synchronize()
        assert pool.stats().used_current == 0
        c = pool.allocate(64 * MiB, stream=stream)  # the whole pool, once the rest is gone
        c.free()
        stream.synchronize()


def test_default_pool_beyond_free_memory(free: int, monkeypatch: pytest.MonkeyPatch,
                                         stream: cm.Stream) -> None:
    pool = cm.MemoryPool.default(0)
    _oom(monkeypatch, lambda: pool.allocate(free + GiB, stream=stream))
    buf = pool.allocate(MiB, stream=stream)
    buf.free()
    stream.synchronize()
    _still_works()


def test_physical_memory_beyond_free_memory(free: int, monkeypatch: pytest.MonkeyPatch) -> None:
    g = cm.granularity(0)
    size = -(-(free + GiB) // g) * g
    err = _oom(monkeypatch, lambda: cm.PhysicalMemory.create(size))
    assert err.api == "cuMemCreate"
    with cm.PhysicalMemory.create(g):
        pass
    _still_works()


def test_growable_buffer_growth_beyond_free_memory(free: int,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    g = cm.granularity(0)
    chunk = max(g, (free // 8) // g * g)  # about 8 chunks fit, then the device is full
    with cm.GrowableBuffer(2 * free + 2 * chunk, chunk=chunk) as buf:
        buf.resize(chunk)
        ptr, before = buf.ptr, (buf.nbytes, buf.capacity)
        _oom(monkeypatch, lambda: buf.resize(free + 2 * chunk), undone=True)
        assert (buf.ptr, buf.nbytes, buf.capacity) == (ptr, *before), "a failed grow changed it"
        buf.resize(2 * chunk)  # growing within what is free still works
        assert buf.capacity == 2 * chunk
        cm.copy(buf, np.ones(2 * chunk, np.uint8))
    _still_works()


@pytest.mark.sim_only
def test_pinned_and_managed_beyond_host_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    from cuda_memkit.sim import machine

    m = machine()
    room = m.host_memory - m.host_used
    _oom(monkeypatch, lambda: cm.HostBuffer.empty(room + MiB))
    _oom(monkeypatch, lambda: cm.ManagedBuffer.empty(room + MiB))
    _oom(monkeypatch, lambda: cm.HostBuffer.zeros((room + GiB) // 8, np.float64))
    with cm.HostBuffer.empty(MiB), cm.ManagedBuffer.empty(MiB):
        pass
