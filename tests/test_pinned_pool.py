"""Pinned buffers from memory pools: HostBuffer.pooled and HostBuffer.empty(pool=...)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit._host import _pinned_pool
from cuda_memkit._pools import _pool

MiB = 1 << 20


pytestmark = pytest.mark.usefixtures("default_pinned", "flush_pinned")


@pytest.fixture
def host_pool() -> Iterator[cm.MemoryPool]:
    p = cm.MemoryPool(location=cm.Location.host())
    yield p
    p.close(force=True)


def test_default_pinned_pool(default_pinned: cm.MemoryPool) -> None:
    p = cm.MemoryPool.default_pinned()
    assert p is default_pinned
    assert p.is_host and p.location == cm.Location.host() and p.device is None
    assert p.release_threshold == _pool.DEFAULT_PINNED_RELEASE_THRESHOLD
    for i in range(cm.device_count()):
        assert p.access(i) is cm.Access.READWRITE
    p.close()
    assert not p.closed  # shared by the process: close() does nothing


def test_pooled_buffer() -> None:
    h = cm.HostBuffer.pooled(4096)
    assert h.ptr != 0 and h.nbytes == 4096 and h.shape == (4096,)
    assert h.dtype == np.uint8 and h.flags == cm.HostAllocFlags.DEFAULT
    h.array[:] = 9
    assert np.asarray(h).sum() == 9 * 4096
    h.close()
    assert h.closed
    with pytest.raises(cm.ClosedError):
        _ = h.ptr
    h.close()


def test_pooled_bytes_shape_dtype_and_no_device_pointer() -> None:
    """A pooled byte buffer's shape, dtype and (absent) device pointer follow from its size.

    Both makers: the cache hit of the default pool and a block from another pool.
    """
    with cm.MemoryPool(location=cm.Location.host()) as pool:
        for n in (1, 3700, 4096, (1 << 20) + 1):
            for h in (cm.HostBuffer.pooled(n), cm.HostBuffer.pooled(n),  # miss, then hit
                      cm.HostBuffer.pooled(n, pool=pool)):
                assert h.shape == (n,) and len(h) == n and h.size == n and h.nbytes == n
                assert h.dtype == np.uint8 and h.array.shape == (n,)
                assert h.kind is cm.MemoryKind.PINNED_POOLED
                assert f"shape=({n},)" in repr(h) and "dtype=uint8" in repr(h)
                with pytest.raises(ValueError, match="DEVICEMAP"):
                    _ = h.device_ptr
                h.close()
                assert h.closed and h.shape == (n,)


def test_blocks_are_recycled_by_size_class() -> None:
    a = cm.HostBuffer.pooled(4096)
    ptr = a.ptr
    a.close()
    b = cm.HostBuffer.pooled(3700)  # rounded to 512 B: the same 4096-byte block
    assert b.ptr == ptr and b.nbytes == 3700
    b.close()
    odd = cm.HostBuffer.pooled(3000)  # rounded to 3072: another size, another block
    assert odd.ptr != ptr
    odd.close()
    b = cm.HostBuffer.pooled(4096)
    assert b.ptr == ptr
    c = cm.HostBuffer.pooled(4096)  # b holds the block: a new one
    assert c.ptr != ptr
    b.close()
    c.close()


def test_garbage_collection_returns_the_block() -> None:
    ptr = cm.HostBuffer.pooled(8192).ptr  # collected at once
    gc.collect()
    h = cm.HostBuffer.pooled(8192)
    assert h.ptr == ptr
    h.close()


def test_a_collected_buffer_leaves_the_ledger_and_fills_the_cache() -> None:
    # CuPy's pinned adaptor drops its buffers unclosed: the ledger and the cache
    # must count the dropped block exactly as close() would.
    from cuda_memkit._core._resource import account

    acct = account("pinned_pooled")
    _pinned_pool.take(None, 0)  # makes the default pool's cache
    cache = _pinned_pool._default_cache
    assert cache is not None
    before, cached = acct.current, cache.cached
    h = cm.HostBuffer.pooled(3000)  # rounded to 3072 in the cache
    ptr = h.ptr
    assert acct.current == before + 3000 and ptr in acct.live
    del h  # collected at once (no cycle)
    assert acct.current == before and ptr not in acct.live
    assert cache.cached == cached + 3072
    again = cm.HostBuffer.pooled(3000)
    assert again.ptr == ptr and cache.cached == cached
    again.close()


def test_buffers_collected_in_a_cycle_with_their_blocks_give_each_block_back_once() -> None:
    # In one garbage cycle the buffer's and its block's __del__ run in either order;
    # whichever runs second must not return the block again (it would be lent twice).
    for _ in range(5):
        ring: list[object] = [cm.HostBuffer.pooled(4096) for _ in range(8)]
        ring.append(ring)
        del ring
        gc.collect()
        lent = [cm.HostBuffer.pooled(4096) for _ in range(16)]
        assert len({b.ptr for b in lent}) == len(lent)
        for b in lent:
            b.close()


def test_views_keep_the_block() -> None:
    h = cm.HostBuffer.pooled(4096)
    ptr = h.ptr
    arr = h.array
    h.close()
    other = cm.HostBuffer.pooled(4096)
    assert other.ptr != ptr  # still in use by the view
    arr[:] = 1
    del arr, h
    gc.collect()
    again = cm.HostBuffer.pooled(4096)
    assert again.ptr == ptr
    other.close()
    again.close()


def test_pooled_shapes_and_dtypes() -> None:
    h = cm.HostBuffer.pooled((16, 16), np.float32)
    assert h.shape == (16, 16) and h.dtype == np.float32 and h.nbytes == 1024
    h.array[:] = 1.5
    assert h.array.sum() == 1.5 * 256
    h.close()
    z = cm.HostBuffer.pooled(0)
    assert z.ptr == 0 and z.nbytes == 0
    z.close()
    big = cm.HostBuffer.pooled(3 * MiB)  # above the cache's block size: straight to the pool
    big.array[-1] = 1
    big.close()


def test_empty_zeros_from_array_with_a_pool(host_pool: cm.MemoryPool) -> None:
    e = cm.HostBuffer.empty((4, 4), np.int32, pool=host_pool)
    assert e.nbytes == 64
    z = cm.HostBuffer.zeros(100, np.float64, pool=host_pool)
    assert not z.array.any()
    src = np.arange(10, dtype=np.int16)
    f = cm.HostBuffer.from_array(src, pool=host_pool)
    np.testing.assert_array_equal(f.array, src)
    p = cm.HostBuffer.pooled(10, pool=host_pool)
    for buf in (e, z, f, p):
        buf.close()
    assert host_pool.stats().used_current > 0  # cached blocks stay in the pool...
    host_pool.close()  # ...and go back when it closes
    assert host_pool.closed


def test_copies_with_pooled_buffers(stream: cm.Stream) -> None:
    src = cm.HostBuffer.pooled(MiB)
    src.array[:] = np.arange(MiB, dtype=np.uint64).astype(np.uint8)
    d = cm.DeviceBuffer.empty(MiB)
    cm.copy(d, src)
    dst = cm.HostBuffer.pooled(MiB)
    cm.copy(dst, d)
    np.testing.assert_array_equal(dst.array, src.array)
    cm.copy_async(dst, d, stream=stream)
    stream.synchronize()
    for b in (src, dst, d):
        b.close()


def test_cache_is_bounded(default_pinned: cm.MemoryPool) -> None:
    n = _pinned_pool.HOST_CACHE_LIMIT // _pinned_pool.HOST_CACHE_MAX_BLOCK + 4
    bufs = [cm.HostBuffer.pooled(_pinned_pool.HOST_CACHE_MAX_BLOCK) for _ in range(n)]
    for b in bufs:
        b.close()
    assert default_pinned.stats().used_current <= _pinned_pool.HOST_CACHE_LIMIT


@pytest.mark.parametrize("pool,exc", [
    ("pinned", TypeError),
    (object(), TypeError),
])
def test_bad_pools(pool: object, exc: type[Exception]) -> None:
    with pytest.raises(exc):
        cm.HostBuffer.pooled(4096, pool=pool)
    with pytest.raises(exc):
        cm.HostBuffer.empty(0, pool=pool)


def test_device_and_closed_pools_are_refused() -> None:
    with cm.MemoryPool(0) as dev_pool:
        with pytest.raises(TypeError, match="pinned host MemoryPool"):
            cm.HostBuffer.pooled(4096, pool=dev_pool)
    closed = cm.MemoryPool(location=cm.Location.host())
    closed.close()
    with pytest.raises(cm.ClosedError):
        cm.HostBuffer.pooled(4096, pool=closed)
    with pytest.raises(TypeError):
        cm.HostBuffer.pooled(4096, pool=cm.MemoryPool.default(0))


def test_flags_a_pool_cannot_give(host_pool: cm.MemoryPool) -> None:
    for flags in (cm.HostAllocFlags.DEVICEMAP, cm.HostAllocFlags.WRITECOMBINED):
        with pytest.raises(ValueError, match="pool=None"):
            cm.HostBuffer.empty(4096, flags=flags, pool=host_pool)
    h = cm.HostBuffer.empty(4096, flags=cm.HostAllocFlags.PORTABLE, pool=host_pool)
    h.close()


@pytest.mark.parametrize("shape,exc", [(-1, ValueError), (1.5, TypeError), ("4", TypeError)])
def test_bad_shapes(shape: object, exc: type[Exception]) -> None:
    with pytest.raises(exc):
        cm.HostBuffer.pooled(shape)  # type: ignore[arg-type]


def test_a_pooled_buffers_type_makes_buffers_as_host_buffer_does() -> None:
    # type(buf) of a pooled byte buffer is a HostBuffer subclass whose shape follows from
    # its size: its inherited constructors must still make ordinary buffers.
    buf = cm.HostBuffer.pooled(8)
    kind = type(buf)
    made = [kind.empty((2, 3), "float32"), kind.zeros(5), kind.pooled(16),
            kind.from_array(np.arange(4, dtype=np.int16))]
    try:
        assert [m.shape for m in made] == [(2, 3), (5,), (16,), (4,)]
        assert [str(m.dtype) for m in made] == ["float32", "uint8", "uint8", "int16"]
        assert all(isinstance(m, cm.HostBuffer) for m in made)
        assert int(made[1].array.sum()) == 0 and made[3].array.tolist() == [0, 1, 2, 3]
    finally:
        for m in made:
            m.close()
        buf.close()
