"""MemoryPool and PoolBuffer: allocation, freeing, lifetime, memory kinds, peers, bad input."""

from __future__ import annotations

import gc
import itertools
import threading
from collections.abc import Iterator

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit._core import _driver

from ._helpers import all_driver_calls

MiB = 1 << 20


@pytest.fixture
def pool() -> Iterator[cm.MemoryPool]:
    p = cm.MemoryPool(0)
    yield p
    p.close(force=True)


@pytest.fixture
def host_pool() -> Iterator[cm.MemoryPool]:
    p = cm.MemoryPool(location=cm.Location.host())
    p.set_access(0, cm.Access.READWRITE)
    yield p
    p.close(force=True)


def used(pool: cm.MemoryPool) -> int:
    return pool.stats().used_current


# -- allocation and freeing -------------------------------------------------------------


def test_allocate_and_free(pool: cm.MemoryPool, stream: cm.Stream) -> None:
    buf = pool.allocate(MiB, stream=stream)
    assert isinstance(buf, cm.PoolBuffer)
    assert buf.ptr != 0 and buf.nbytes == MiB and not buf.closed
    assert buf.pool is pool and buf.stream == stream.handle
    assert used(pool) == MiB
    buf.free()
    assert buf.closed and used(pool) == 0
    assert repr(buf) == f"<PoolBuffer freed nbytes={MiB}>"
    buf.close()  # idempotent after free


def test_allocations_do_not_overlap(pool: cm.MemoryPool, stream: cm.Stream) -> None:
    bufs = [pool.allocate(n, stream=stream) for n in (1000, 4096, MiB, 3)]
    spans = sorted((b.ptr, b.ptr + b.nbytes) for b in bufs)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    assert used(pool) > 0
    for b in bufs:
        b.free()


def test_free_is_stream_ordered_on_any_stream(pool: cm.MemoryPool, stream: cm.Stream) -> None:
    other = cm.Stream()
    try:
        buf = pool.allocate(4096, stream=stream)
        buf.free(stream=other)
        other.synchronize()
        assert used(pool) == 0
        buf2 = pool.allocate(4096, stream=stream.handle)  # int handles work too
        buf2.free(stream=0)  # the legacy default stream
    finally:
        other.close()


def test_default_stream_allocation(pool: cm.MemoryPool) -> None:
    buf = pool.allocate(4096, stream=None)
    assert buf.stream == 0
    buf.free()
    _driver.call("cuCtxSynchronize")


def test_numpy_int_sizes(pool: cm.MemoryPool, stream: cm.Stream) -> None:
    buf = pool.allocate(np.int64(4096), stream=stream)
    assert buf.nbytes == 4096 and type(buf.nbytes) is int
    buf.free()


def test_context_manager_and_close(pool: cm.MemoryPool, stream: cm.Stream) -> None:
    with pool.allocate(4096, stream=stream) as buf:
        assert used(pool) == 4096
    assert buf.closed and used(pool) == 0
    with pytest.raises(cm.ClosedError):
        with buf:
            pass


def test_garbage_collection_frees(pool: cm.MemoryPool, stream: cm.Stream) -> None:
    pool.allocate(4096, stream=stream)
    gc.collect()
    assert used(pool) == 0


def test_buffer_keeps_pool_alive(stream: cm.Stream) -> None:
    buf = cm.MemoryPool(0).allocate(4096, stream=stream)
    gc.collect()
    assert not buf.pool.closed
    buf.free()


def test_free_twice_is_a_no_op(pool: cm.MemoryPool, stream: cm.Stream,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    buf = pool.allocate(4096, stream=stream)
    buf.free()
    with all_driver_calls(monkeypatch) as calls:
        buf.free()  # as a second close() does
        buf.close()
    assert calls == [] and buf.closed and used(pool) == 0
    with pytest.raises(cm.ClosedError):
        _ = buf.ptr
    assert buf.nbytes == 4096  # describing it is not using it


def test_free_on_a_closed_stream(pool: cm.MemoryPool) -> None:
    s = cm.Stream()
    buf = pool.allocate(4096, stream=s)
    other = cm.Stream()
    other.close()
    with pytest.raises(cm.ClosedError):
        buf.free(stream=other)
    s.close()
    with pytest.raises(cm.ClosedError, match="allocated on is closed"):
        buf.free()
    assert not buf.closed and used(pool) == 4096  # nothing was freed
    buf.close()  # synchronizes, then frees on the legacy stream
    assert buf.closed and used(pool) == 0


@pytest.mark.parametrize("how", ["free", "close", "collect"])
def test_stream_closed_by_another_thread_during_the_release(
        pool: cm.MemoryPool, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    # The owner closes the stream on another thread while a release is about to free on it:
    # the close waits until that free is done (freeing on a destroyed stream crashed the
    # H100), and no warning about a destroyed handle is given.
    from cuda_memkit._pools import _cache

    s = cm.Stream()
    buf = pool.allocate(4096, stream=s)
    real = _cache.FREE
    closer: list[threading.Thread] = []
    closed_during_free: list[bool] = []

    def racing_free(d: object, cus: object) -> object:
        if not closer:
            t = threading.Thread(target=s.close)
            closer.append(t)
            t.start()
            t.join(0.2)  # the close runs now, as far as it can
            closed_during_free.append(s.closed)
        return real(d, cus)

    monkeypatch.setattr(_cache, "FREE", racing_free)
    if how == "free":
        buf.free()
    elif how == "close":
        buf.close()
    else:
        del buf
        gc.collect()
    closer[0].join()
    assert closed_during_free == [False]  # the close waited for the free
    assert s.closed
    _driver.call("cuCtxSynchronize")
    assert used(pool) == 0


@pytest.mark.parametrize("how", ["free", "close", "collect"])
def test_cached_block_given_back_while_another_thread_closes_its_stream(
        how: str) -> None:
    # The block goes into its stream's free list just as the owner closes the stream on
    # another thread, whose close drains and drops those lists: the block must still go
    # back to the pool (not stay in a dropped list), the cache's count must not keep it.
    s = cm.Stream()
    with cm.MemoryPool(0, cache=True) as pool:
        cache = pool.cache
        assert cache is not None
        size = 4096

        class RacingList(list):  # type: ignore[type-arg]
            def append(self, block: object) -> None:
                t = threading.Thread(target=s.close)  # the close's drain runs first
                t.start()
                t.join()
                super().append(block)

        cache.bin(size, s.handle, s._custream).blocks = RacingList()
        buf = pool.allocate(size, stream=s)
        if how == "free":
            buf.free()
        elif how == "close":
            buf.close()
        else:
            del buf
            gc.collect()
        assert s.closed
        _driver.call("cuCtxSynchronize")
        assert cache.cached == 0
        assert used(pool) == 0  # back in the pool: close() needs no force


def test_gc_after_the_allocation_stream_closed(pool: cm.MemoryPool) -> None:
    s = cm.Stream()
    pool.allocate(4096, stream=s)
    s.close()
    gc.collect()
    assert used(pool) == 0


def test_thread_without_context(pool: cm.MemoryPool) -> None:
    out: list[object] = []

    def work() -> None:
        try:
            buf = pool.allocate(4096, stream=None)
            buf.free()
            _driver.call("cuCtxSynchronize")
            out.append("ok")
        except BaseException as exc:
            out.append(exc)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert out == ["ok"]


# -- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, -1, -(1 << 40)])
def test_non_positive_sizes(pool: cm.MemoryPool, stream: cm.Stream, n: int) -> None:
    with pytest.raises(ValueError, match="nbytes must be > 0"):
        pool.allocate(n, stream=stream)
    assert used(pool) == 0


@pytest.mark.parametrize("n", [1.5, "8", None, True])
def test_non_int_sizes(pool: cm.MemoryPool, stream: cm.Stream, n: object) -> None:
    with pytest.raises(TypeError):
        pool.allocate(n, stream=stream)  # type: ignore[arg-type]


def test_stream_is_required_and_checked(pool: cm.MemoryPool) -> None:
    with pytest.raises(TypeError):
        pool.allocate(4096)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        pool.allocate(4096, stream="s")
    with pytest.raises(ValueError):
        pool.allocate(4096, stream=-1)


def test_beyond_max_size_is_out_of_memory(stream: cm.Stream) -> None:
    with cm.MemoryPool(0, max_size=64 * MiB) as p:
        assert p.max_size == 64 * MiB
        full = p.allocate(64 * MiB, stream=stream)
        with pytest.raises(cm.CudaOutOfMemoryError) as info:
            p.allocate(1, stream=stream)
        assert isinstance(info.value, MemoryError)
        full.free()
        stream.synchronize()
        with pytest.raises(MemoryError):
            p.allocate(100 * MiB, stream=stream)


def test_huge_allocation_is_out_of_memory(pool: cm.MemoryPool, stream: cm.Stream) -> None:
    with pytest.raises(cm.CudaOutOfMemoryError):
        pool.allocate(1 << 60, stream=stream)


@pytest.mark.parametrize("kwargs,exc", [
    ({"device": -1}, ValueError),
    ({"device": "0"}, TypeError),
    ({"device": True}, TypeError),
    ({"max_size": -1}, ValueError),
    ({"max_size": 1 << 64}, ValueError),
    ({"max_size": 2**70}, ValueError),
    ({"max_size": 1.0}, TypeError),
    ({"ipc": 1}, TypeError),
    ({"managed": "yes"}, TypeError),
    ({"release_threshold": -1}, ValueError),
    ({"release_threshold": "big"}, TypeError),
    ({"location": "host"}, TypeError),
    ({"location": cm.Location.host_numa_current()}, ValueError),
    ({"location": cm.Location.host(), "ipc": True}, ValueError),
    ({"managed": True, "ipc": True}, ValueError),
    ({"managed": True, "max_size": MiB}, ValueError),
])
def test_constructor_bad_input(kwargs: dict[str, object], exc: type[Exception]) -> None:
    with pytest.raises(exc):
        cm.MemoryPool(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("keep", [-1, 1 << 64, 2**70])
def test_trim_out_of_range(pool: cm.MemoryPool, keep: int) -> None:
    with pytest.raises(ValueError, match="keep_bytes") as info:
        pool.trim(keep)
    assert not isinstance(info.value, cm.CudaError)
    pool.trim((1 << 64) - 1)  # the largest accepted value keeps everything


def test_bad_device_ordinal() -> None:
    with pytest.raises((cm.CudaInvalidDeviceError, cm.CudaInvalidValueError)):
        cm.MemoryPool(64)


# -- closing pools ----------------------------------------------------------------------


def test_close_refuses_live_buffers(stream: cm.Stream) -> None:
    p = cm.MemoryPool(0)
    buf = p.allocate(4096, stream=stream)
    with pytest.raises(BufferError, match="4096 bytes in live allocations"):
        p.close()
    assert not p.closed
    buf.free()
    p.close()
    p.close()
    assert p.closed
    with pytest.raises(cm.ClosedError):
        p.allocate(4096, stream=stream)
    with pytest.raises(cm.ClosedError):
        p.stats()
    assert repr(p) == "<MemoryPool closed>"


def test_force_close_keeps_buffers_valid(stream: cm.Stream) -> None:
    p = cm.MemoryPool(0)
    buf = p.allocate(4096, stream=stream)
    p.close(force=True)
    assert p.closed and not buf.closed
    cm.copy(buf, np.full(4096, 3, np.uint8))
    out = np.zeros(4096, np.uint8)
    cm.copy(out, buf)
    assert (out == 3).all()
    buf.free()
    stream.synchronize()


def test_pool_context_manager(stream: cm.Stream) -> None:
    with cm.MemoryPool(0) as p:
        p.allocate(4096, stream=stream).free()
    assert p.closed


def test_gc_destroys_the_pool(stream: cm.Stream) -> None:
    p = cm.MemoryPool(0)
    p.allocate(4096, stream=stream).free()
    del p
    gc.collect()  # the leak check verifies the pool is gone


# -- default pools ------------------------------------------------------------------------


def test_default_pool_is_not_owned(stream: cm.Stream) -> None:
    d = cm.MemoryPool.default(0)
    assert not d.owned and d.device == 0 and "default" in repr(d)
    assert d.release_threshold == 0
    buf = d.allocate(MiB, stream=stream)
    d.close()  # only the wrapper
    assert d.closed
    buf.free()
    stream.synchronize()
    d2 = cm.MemoryPool.default(cm.Device(0))
    assert d2.handle == d._handle and d2.stats().used_current == 0


def test_default_pool_bad_device() -> None:
    with pytest.raises(ValueError):
        cm.MemoryPool.default(-1)
    with pytest.raises(cm.CudaInvalidDeviceError):
        cm.MemoryPool.default(64)


# -- memory kinds -----------------------------------------------------------------------------


def test_device_buffer_interop(pool: cm.MemoryPool, stream: cm.Stream) -> None:
    buf = pool.allocate(4096, stream=stream)
    cai = buf.__cuda_array_interface__
    assert cai["data"] == (buf.ptr, False) and cai["shape"] == (4096,)
    view = buf.as_array(np.float32)
    assert view.shape == (1024,) and view.ptr == buf.ptr
    assert buf.__dlpack_device__() == (2, 0)
    with pytest.raises(TypeError, match="not host-accessible"):
        _ = buf.array
    buf.free()


def test_copy_roundtrip_through_a_device_pool(pool: cm.MemoryPool, stream: cm.Stream) -> None:
    src = np.arange(1024, dtype=np.float32)
    buf = pool.allocate(src.nbytes, stream=stream)
    stream.synchronize()
    cm.copy(buf, src)
    out = np.empty_like(src)
    cm.copy(out, buf)
    np.testing.assert_array_equal(out, src)
    buf.free()


def test_host_pool_buffers_are_numpy_arrays(host_pool: cm.MemoryPool,
                                            stream: cm.Stream, pool: cm.MemoryPool) -> None:
    assert host_pool.is_host and host_pool.device is None
    h = host_pool.allocate(4096, stream=stream)
    stream.synchronize()
    arr = h.array
    arr[:] = 7
    assert np.asarray(h)[0] == 7
    assert h.__dlpack_device__() == (3, 0)
    d = pool.allocate(4096, stream=stream)
    cm.copy(d, h)
    back = np.zeros(4096, np.uint8)
    cm.copy(back, d)
    assert (back == 7).all()
    d.free()
    del arr
    h.free()


def test_views_defer_the_free(host_pool: cm.MemoryPool, stream: cm.Stream) -> None:
    h = host_pool.allocate(4096, stream=stream)
    arr = h.array
    h.close()
    assert h.closed
    assert used(host_pool) == 4096  # the view still uses the memory
    arr[:] = 1
    del arr, h
    gc.collect()
    assert used(host_pool) == 0


def test_free_refuses_live_views(host_pool: cm.MemoryPool, stream: cm.Stream) -> None:
    h = host_pool.allocate(4096, stream=stream)
    stream.synchronize()
    arr = h.array
    with pytest.raises(BufferError, match="numpy views of this buffer are alive"):
        h.free()
    assert not h.closed and used(host_pool) == 4096  # still allocated and usable
    arr[:] = 3
    assert np.asarray(h)[4095] == 3
    del arr
    h.free()
    stream.synchronize()
    assert h.closed


@pytest.mark.uses_managed_memory
def test_managed_pool(stream: cm.Stream) -> None:
    try:
        p = cm.MemoryPool(managed=True)
    except cm.CudaNotSupportedError:
        pytest.skip("no managed memory pools here")
    with p:
        assert p.managed and p.device is None and p.location is None
        buf = p.allocate(4096, stream=stream)
        stream.synchronize()
        buf.array[:] = 5
        assert buf.__dlpack_device__() == (13, 0)
        out = np.zeros(4096, np.uint8)
        cm.copy(out, buf)
        assert (out == 5).all()
        buf.free()
        stream.synchronize()


@pytest.mark.uses_managed_memory
def test_managed_pool_with_preferred_location(stream: cm.Stream) -> None:
    with cm.MemoryPool(managed=True, location=cm.Location.device(0)) as p:
        assert p.location == cm.Location.device(0)
        p.allocate(MiB, stream=stream).free()
        stream.synchronize()


def test_host_numa_pool(stream: cm.Stream) -> None:
    with cm.MemoryPool(location=cm.Location.host_numa(0)) as p:
        h = p.allocate(4096, stream=stream)
        stream.synchronize()
        h.array[:] = 2
        assert (h.array == 2).all() and np.asarray(h).nbytes == 4096
        back = np.zeros(4096, np.uint8)
        cm.copy(back, h)
        assert (back == 2).all()
        h.free()


@pytest.mark.sim_only
def test_unsupported_host_pools_raise_clearly() -> None:
    from cuda.bindings import driver as cu

    from cuda_memkit.sim import machine

    attr = int(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED)
    m = machine()
    old = m.devices[0].attrs[attr]
    m.devices[0].attrs[attr] = 0
    cm.Device(0)._attrs.clear()
    try:
        with pytest.raises(cm.CudaNotSupportedError, match="host memory pools"):
            cm.MemoryPool(location=cm.Location.host())
    finally:
        m.devices[0].attrs[attr] = old
        cm.Device(0)._attrs.clear()


# -- peers (two devices) ------------------------------------------------------------------------


def test_peer_access(two_devices: None, stream: cm.Stream) -> None:
    with cm.MemoryPool(1) as p:
        assert p.device == 1 and p.location == cm.Location.device(1)
        assert p.access(1) is cm.Access.READWRITE
        assert p.access(0) is cm.Access.NONE
        p.set_access(0, cm.Access.READWRITE)
        assert p.access(cm.Device(0)) is cm.Access.READWRITE
        buf = p.allocate(4096, stream=stream)  # a stream of device 0
        cm.copy(buf, np.full(4096, 4, np.uint8))
        out = np.zeros(4096, np.uint8)
        cm.copy(out, buf)
        assert (out == 4).all()
        buf.free()
        stream.synchronize()
        p.set_access([0], cm.Access.NONE)
        assert p.access(0) is cm.Access.NONE
        with pytest.raises(cm.CudaInvalidDeviceError):
            p.set_access(1, cm.Access.NONE)  # the owner keeps its access
        with pytest.raises(cm.CudaNotSupportedError):
            p.set_access(0, cm.Access.READ)


def test_set_access_bad_input(pool: cm.MemoryPool) -> None:
    with pytest.raises(TypeError):
        pool.set_access(0, "rw")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        pool.set_access(0, 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no device"):
        pool.set_access([], cm.Access.READWRITE)
    with pytest.raises(TypeError):
        pool.set_access("gpu", cm.Access.READWRITE)  # type: ignore[arg-type]
    bad = cm.device_count() + 3
    for target in (bad, [0, bad], cm.Location.device(bad)):
        with pytest.raises(ValueError, match="does not exist") as info:
            pool.set_access(target, cm.Access.READWRITE)
        assert not isinstance(info.value, cm.CudaError)  # refused before the driver
    with pytest.raises(ValueError, match="does not exist") as info:
        pool.access(bad)
    assert not isinstance(info.value, cm.CudaError)
    assert pool.access(0) is cm.Access.READWRITE
    with pytest.raises(cm.CudaNotSupportedError):
        pool.set_access(cm.Location.host(), cm.Access.READWRITE)
    assert pool.access(cm.Location.host()) is cm.Access.NONE
