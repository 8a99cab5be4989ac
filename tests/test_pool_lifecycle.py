"""Lifecycles on the allocation hot paths: every pool allocation freed exactly once.

Whichever way a :class:`PoolBuffer` goes (``free()``, ``close()``, ``with``,
garbage collection, numpy views outliving it, a closed allocation stream),
the driver sees exactly one ``cuMemFreeAsync`` and the ledger drops it once.
``HostBuffer.pooled(n)`` gives a full HostBuffer whose ``close()`` puts its
block back in the pool's cache.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from cuda.bindings.driver import CUresult

import cuda_memkit as cm
from cuda_memkit._core import _resource
from cuda_memkit._core._constants import STREAM_LEGACY, STREAM_PER_THREAD
from cuda_memkit._host import _pinned_pool
from cuda_memkit._pools import _cache, _pool

from ._helpers import driver_spy

MiB = 1 << 20


@pytest.fixture
def pool() -> Iterator[cm.MemoryPool]:
    p = cm.MemoryPool(0)
    yield p
    p.close(force=True)


@pytest.fixture
def host_pool() -> Iterator[cm.MemoryPool]:
    p = cm.MemoryPool(location=cm.Location.host())
    yield p
    p.close(force=True)


@pytest.fixture
def frees(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Every cuMemFreeAsync the library makes, by address (pools made later included)."""
    calls: list[int] = []
    with driver_spy(monkeypatch, lambda api, args, ok: api == "cuMemFreeAsync"
                    and calls.append(int(args[0]))):
        yield calls


def used(pool: cm.MemoryPool) -> int:
    return pool.stats().used_current


def ledger(pool: cm.MemoryPool) -> int:
    """Bytes the allocation ledger holds for the pool's buffers."""
    return _resource.account("pool", pool.device, pool.handle).current


# -- PoolBuffer: freed exactly once ------------------------------------------------------


def test_free_leaves_nothing_for_the_finalizer(pool: cm.MemoryPool, stream: cm.Stream,
                                               frees: list[int]) -> None:
    buf = pool.allocate(4096, stream=stream)
    assert type(buf) is cm.PoolBuffer and ledger(pool) == 4096
    ptr = buf.ptr
    buf.free()
    assert buf.closed and ledger(pool) == 0
    assert frees == [ptr]
    del buf
    gc.collect()
    assert frees == [ptr] and used(pool) == 0


@pytest.mark.parametrize("how", ["close", "with"])
def test_close_leaves_nothing_for_the_finalizer(pool: cm.MemoryPool, stream: cm.Stream,
                                                frees: list[int], how: str) -> None:
    buf = pool.allocate(4096, stream=stream)
    ptr = buf.ptr
    if how == "close":
        buf.close()
    else:
        with buf:
            pass
    assert buf.closed and ledger(pool) == 0
    buf.close()  # again: nothing
    del buf
    gc.collect()
    assert frees == [ptr] and used(pool) == 0


def test_unfreed_buffer_is_freed_once_by_gc(pool: cm.MemoryPool, stream: cm.Stream,
                                            frees: list[int]) -> None:
    bufs = [pool.allocate(4096, stream=stream) for _ in range(3)]
    ptrs = sorted(b.ptr for b in bufs)
    del bufs
    gc.collect()
    assert sorted(frees) == ptrs and used(pool) == 0 and ledger(pool) == 0


def test_free_on_another_stream_hands_over_too(pool: cm.MemoryPool, stream: cm.Stream,
                                               frees: list[int]) -> None:
    buf = pool.allocate(4096, stream=stream)
    ptr = buf.ptr
    with cm.Stream() as other:
        buf.free(stream=other)
        other.synchronize()
    del buf
    gc.collect()
    assert frees == [ptr]


def test_failed_free_keeps_the_finalizer(pool: cm.MemoryPool, stream: cm.Stream,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    buf = pool.allocate(4096, stream=stream)
    monkeypatch.setattr(_cache, "FREE", lambda d, c: (CUresult.CUDA_ERROR_INVALID_VALUE,))
    with pytest.raises(cm.CudaInvalidValueError):
        buf.free()
    assert not buf.closed  # still owns the memory
    monkeypatch.undo()
    assert used(pool) == 4096 and ledger(pool) == 4096
    del buf
    gc.collect()
    assert used(pool) == 0 and ledger(pool) == 0


def test_closed_stream_refused_after_its_handle_was_cached(pool: cm.MemoryPool) -> None:
    s = cm.Stream()
    pool.allocate(4096, stream=s).free()  # the stream now carries its CUstream
    s.synchronize()
    s.close()
    with pytest.raises(cm.ClosedError):
        pool.allocate(4096, stream=s)
    assert used(pool) == 0


def test_views_defer_the_free_to_the_finalizer(host_pool: cm.MemoryPool, stream: cm.Stream,
                                               frees: list[int]) -> None:
    buf = host_pool.allocate(4096, stream=stream)
    ptr = buf.ptr
    stream.synchronize()
    arr = buf.array
    buf.close()
    assert buf.closed and frees == [] and ledger(host_pool) == 4096
    arr[:] = 1
    del arr, buf
    gc.collect()
    assert frees == [ptr] and used(host_pool) == 0 and ledger(host_pool) == 0


def test_views_refuse_free_until_dropped(host_pool: cm.MemoryPool, stream: cm.Stream,
                                         frees: list[int]) -> None:
    """free() refuses while numpy views are alive, and frees once after they are gone."""
    buf = host_pool.allocate(4096, stream=stream)
    ptr = buf.ptr
    stream.synchronize()
    arr = buf.array
    with pytest.raises(BufferError):
        buf.free()
    assert frees == [] and not buf.closed
    del arr
    buf.free()
    assert frees == [ptr] and buf.closed
    buf.free()  # a second free() does nothing
    assert frees == [ptr]
    with pytest.raises(cm.ClosedError):
        _ = buf.array


def test_closed_stream_after_allocation(pool: cm.MemoryPool, frees: list[int]) -> None:
    """free() refuses a closed allocation stream; close() syncs and frees on the legacy stream."""
    s = cm.Stream()
    a = pool.allocate(4096, stream=s)
    b = pool.allocate(4096, stream=s)
    ptrs = sorted([a.ptr, b.ptr])
    handle = s.handle
    s.synchronize()
    s.close()
    assert a.stream == handle  # still reported after the stream is gone
    with pytest.raises(cm.ClosedError, match="allocated on is closed"):
        a.free()
    a.close()
    del b
    gc.collect()
    assert sorted(frees) == ptrs
    assert used(pool) == 0


class _ForeignStream:
    """A stream object of another library (the ``__cuda_stream__`` protocol)."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def test_foreign_stream_objects_kept_alive(pool: cm.MemoryPool, stream: cm.Stream) -> None:
    import weakref

    foreign = _ForeignStream(stream.handle)
    ref = weakref.ref(foreign)
    buf = pool.allocate(4096, stream=foreign)
    assert buf.stream == stream.handle
    del foreign
    gc.collect()
    assert ref() is not None  # the buffer may be freed on it later
    buf.free()
    del buf
    gc.collect()
    assert ref() is None and used(pool) == 0


@pytest.mark.parametrize("handle", [None, 0, STREAM_LEGACY, STREAM_PER_THREAD])
def test_int_and_default_streams(pool: cm.MemoryPool, handle: int | None) -> None:
    bufs = [pool.allocate(4096, stream=handle) for _ in range(3)]
    assert {b.stream for b in bufs} == {handle or 0}
    for b in bufs:
        b.free()
    cm.Device(0).synchronize()
    assert used(pool) == 0


def test_buffers_are_made_by_allocate(pool: cm.MemoryPool, stream: cm.Stream) -> None:
    """PoolBuffer() refuses; allocate() makes PoolBuffers."""
    buf = pool.allocate(MiB, stream=stream)
    assert type(buf) is cm.PoolBuffer and buf.pool is pool
    with pytest.raises(TypeError):
        cm.PoolBuffer()
    buf.free()


# -- HostBuffer.pooled(n) -----------------------------------------------------------------


@pytest.fixture
def default_cache(default_pinned: cm.MemoryPool) -> Iterator[Any]:
    yield _pool.find_cache(default_pinned, _pinned_pool.HostCache)
    gc.collect()
    default_pinned.trim()  # cached blocks go back, for the leak check


def cached_bytes(cache: Any) -> int:
    return sum(b.size * len(b.blocks or ()) for b in cache.bins.values())


def test_pooled_buffer_is_a_full_hostbuffer(default_cache: Any) -> None:
    h = cm.HostBuffer.pooled(4096)
    assert isinstance(h, cm.HostBuffer)
    assert h.shape == (4096,) and h.size == 4096 and len(h) == 4096 and h.nbytes == 4096
    assert h.dtype == np.uint8 and h.flags == cm.HostAllocFlags.DEFAULT
    assert "HostBuffer" in repr(h) and not h.closed
    with pytest.raises(ValueError, match="DEVICEMAP"):
        _ = h.device_ptr
    h.copy_from(np.full(4096, 7, np.uint8))
    assert h.to_numpy().sum() == 7 * 4096
    with h as same:
        assert same is h
    assert h.closed and "closed" in repr(h)
    with pytest.raises(cm.ClosedError, match="HostBuffer is closed"):
        _ = h.ptr
    with pytest.raises(cm.ClosedError):
        _ = h.array
    with pytest.raises(cm.ClosedError):
        with h:
            pass
    h.close()


def test_pooled_close_gives_the_block_back_once(default_cache: Any) -> None:
    h = cm.HostBuffer.pooled(4096)
    ptr = h.ptr
    before = default_cache.cached
    h.close()
    h.close()
    assert default_cache.cached == before + 4096 == cached_bytes(default_cache)
    del h
    gc.collect()  # a closed buffer has nothing left to give back
    assert default_cache.cached == before + 4096
    a = cm.HostBuffer.pooled(4096)
    b = cm.HostBuffer.pooled(4096)
    assert a.ptr == ptr and b.ptr != ptr  # the block is lent once
    a.close()
    b.close()
    assert default_cache.cached == cached_bytes(default_cache)


def test_pooled_accounting_over_size_classes(default_cache: Any) -> None:
    sizes = [1, 3, 4096, 5000, 65536, MiB, MiB + 1, 2 * MiB]
    for _ in range(3):
        bufs = [cm.HostBuffer.pooled(n) for n in sizes]
        assert len({b.ptr for b in bufs}) == len(sizes)
        for b in bufs:
            b.close()
        assert default_cache.cached == cached_bytes(default_cache) <= _pinned_pool.HOST_CACHE_LIMIT
    assert all(b.size <= _pinned_pool.HOST_CACHE_MAX_BLOCK and (b.size or not b.blocks)
               for b in default_cache.bins.values())


def test_pooled_from_a_given_pool(host_pool: cm.MemoryPool) -> None:
    h = cm.HostBuffer.pooled(100, pool=host_pool)
    ptr = h.ptr
    h.close()
    cache = _pool.find_cache(host_pool, _pinned_pool.HostCache)
    assert cache is not None and cache.cached == 512  # rounded to 512 B
    again = cm.HostBuffer.pooled(512, pool=host_pool)
    assert again.ptr == ptr
    again.close()
    host_pool.close()
    with pytest.raises(cm.ClosedError):
        cm.HostBuffer.pooled(100, pool=host_pool)  # its cache was emptied: the checks run


def test_pooled_buffer_collected_without_close(default_cache: Any) -> None:
    h = cm.HostBuffer.pooled(8192)
    ptr = h.ptr
    before = default_cache.cached
    del h
    gc.collect()
    assert default_cache.cached == before + 8192
    again = cm.HostBuffer.pooled(8192)
    assert again.ptr == ptr
    again.close()
