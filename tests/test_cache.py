"""The block cache (``MemoryPool(cache=True)``): what "Caching" on the pools page promises."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import warnings
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cuda_memkit as cm
from cuda_memkit._pools import _cache

from ._helpers import driver_spy

KiB, MiB = 1 << 10, 1 << 20


@pytest.fixture
def pool() -> Any:
    p = cm.MemoryPool(0, cache=True)
    yield p
    p.close()


def used(pool: cm.MemoryPool) -> int:
    return pool.stats().used_current


def used_by(handle: int) -> int:
    """USED_MEM_CURRENT of a driver pool, asked directly (its MemoryPool may be closed)."""
    from cuda.bindings import driver as cu

    from cuda_memkit._core import _driver

    return int(_driver.call("cuMemPoolGetAttribute", cu.CUmemoryPool(handle),
                            cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_USED_MEM_CURRENT))


# -- sizes ----------------------------------------------------------------------------------


@given(st.integers(1, 1 << 40))
def test_round_size_bounds(n: int) -> None:
    r = _cache.round_size(n)
    assert r >= n
    if n <= MiB:
        assert r % 512 == 0 and r - n < 512
    else:
        assert r - n <= n // 8  # at most 12.5 % more
    assert _cache.round_size(r) == r  # a rounded size is its own class


def test_sizes_in_one_class_share_a_block(pool: cm.MemoryPool, stream: cm.Stream) -> None:
    a = pool.allocate(1000, stream=stream)
    ptr = a.ptr
    a.free()
    assert pool.cached_bytes == 1024
    b = pool.allocate(600, stream=stream)  # 1024 too
    assert b.ptr == ptr and b.nbytes == 600 and pool.cached_bytes == 0
    c = pool.allocate(1100, stream=stream)  # 1536: another class, another block
    assert c.ptr != ptr
    b.free()
    c.free()
    assert pool.cached_bytes == 1024 + 1536


def test_large_requests_are_not_cached(pool: cm.MemoryPool, stream: cm.Stream) -> None:
    big = _cache.DEFAULT_MAX_BLOCK + 1
    base = used(pool)
    pool.allocate(big, stream=stream).free()
    stream.synchronize()
    assert pool.cached_bytes == 0 and used(pool) == base


# -- per stream -------------------------------------------------------------------------------


def test_a_block_is_reused_only_on_its_stream(pool: cm.MemoryPool) -> None:
    s1, s2 = cm.Stream(), cm.Stream()
    try:
        a = pool.allocate(4 * KiB, stream=s1)
        ptr = a.ptr
        a.free()
        other = pool.allocate(4 * KiB, stream=s2)
        assert other.ptr != ptr  # s2 never gets s1's block while it is cached
        same = pool.allocate(4 * KiB, stream=s1)
        assert same.ptr == ptr
        other.free()
        same.free()
    finally:
        s1.close()
        s2.close()
    assert pool.cached_bytes == 0  # closing the streams gave their blocks back


def test_a_free_on_another_stream_goes_to_the_driver(pool: cm.MemoryPool,
                                                     stream: cm.Stream) -> None:
    a = pool.allocate(4 * KiB, stream=stream)
    a.free(stream=0)  # the legacy stream: not where it was allocated
    assert pool.cached_bytes == 0


@pytest.mark.parametrize("named", ["the Stream", "its handle", "a wrapper of its handle",
                                   "a foreign object"])
def test_naming_the_allocation_stream_caches_as_free_does(pool: cm.MemoryPool,
                                                          stream: cm.Stream,
                                                          named: str) -> None:
    same = {"the Stream": stream, "its handle": stream.handle,
            "a wrapper of its handle": cm.Stream.from_handle(stream.handle),
            "a foreign object": _Foreign(stream.handle)}[named]
    a = pool.allocate(1000, stream=stream)
    ptr = a.ptr
    a.free(stream=same)
    assert a.closed and pool.cached_bytes == 1024  # into its stream's cache, no driver call
    b = pool.allocate(1000, stream=stream)
    assert b.ptr == ptr
    b.free()
    by_handle = pool.allocate(1000, stream=stream.handle)  # allocated by handle, freed named
    by_handle.free(stream=stream)
    assert pool.cached_bytes == 1024


class _Foreign:
    """A stream object of another library (the ``__cuda_stream__`` protocol)."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


@pytest.mark.parametrize("given", ["handle", "from_handle", "foreign"])
@pytest.mark.parametrize("how", ["free", "close", "drop", "empty_cache"])
def test_memory_of_a_stream_closed_under_its_handle_is_not_lost(given: str,
                                                                how: str) -> None:
    # The stream was given by handle (or as another object over it) and closed before the
    # free: the blocks go back to the driver after the stream (the device synchronized),
    # they are never parked in the dropped stream's lists.
    pool = cm.MemoryPool(0, cache=True)
    s = cm.Stream()
    stream = {"handle": s.handle, "from_handle": cm.Stream.from_handle(s.handle),
              "foreign": _Foreign(s.handle)}[given]
    bufs = [pool.allocate(1000, stream=stream),
            pool.allocate(_cache.DEFAULT_MAX_BLOCK + 1, stream=stream)]  # not a cached size
    if how == "empty_cache":
        for b in bufs:
            b.free()  # cached while the stream lives
    s.close()
    if how == "free":
        for b in bufs:
            b.free()
    elif how == "close":
        for b in bufs:
            b.close()
    else:
        del bufs
        gc.collect()
    assert pool.cached_bytes == 0 and pool.empty_cache() == 0
    cm.Device(0).synchronize()
    assert used(pool) == 0
    pool.close()  # nothing in use


def test_a_closed_cache_keeps_no_foreign_stream_alive(stream: cm.Stream) -> None:
    import weakref

    pool = cm.MemoryPool(0, cache=True)
    foreign = _Foreign(stream.handle)
    ref = weakref.ref(foreign)
    pool.allocate(4096, stream=foreign).free()  # cached: the cache keeps the stream object
    del foreign
    gc.collect()
    assert ref() is not None
    pool.close()
    gc.collect()
    assert ref() is None  # the pool object is alive; its closed cache holds nothing
    live = pool  # noqa: F841  (the pool object outlives the check)


def test_a_forced_close_lets_foreign_streams_go(stream: cm.Stream) -> None:
    import weakref

    pool = cm.MemoryPool(0, cache=True)
    foreign = _Foreign(stream.handle)
    ref = weakref.ref(foreign)
    pool.allocate(4096, stream=foreign).free()
    buf = pool.allocate(100, stream=stream)  # keeps the pool from being destroyed
    del foreign
    pool.close(force=True)
    gc.collect()
    assert ref() is None
    buf.free()


def test_cache_limit_takes_any_integer(stream: cm.Stream) -> None:
    import numpy as np

    for limit in (np.int64(3 * KiB), np.uint32(3 * KiB)):
        with cm.MemoryPool(0, cache=True, cache_limit=limit) as pool:  # type: ignore[arg-type]
            bufs = [pool.allocate(KiB, stream=stream) for _ in range(4)]
            for b in bufs:
                b.free()
            assert pool.cached_bytes == 3 * KiB and type(pool.cache.limit) is int  # type: ignore[union-attr]
    for bad, error in ((np.float64(1024), TypeError), (np.int64(-1), ValueError),
                       (np.bool_(True), TypeError)):
        with pytest.raises(error, match="cache_limit"):
            cm.MemoryPool(0, cache=True, cache_limit=bad)  # type: ignore[arg-type]


def test_close_and_collection_give_the_block_back(pool: cm.MemoryPool, stream: cm.Stream) -> None:
    a = pool.allocate(8 * KiB, stream=stream)
    ptr = a.ptr
    a.close()
    assert pool.cached_bytes == 8 * KiB
    b = pool.allocate(8 * KiB, stream=stream)
    assert b.ptr == ptr
    del b
    gc.collect()
    assert pool.cached_bytes == 8 * KiB


# -- statistics -------------------------------------------------------------------------------


def test_statistics_split_in_use_and_cached(pool: cm.MemoryPool, stream: cm.Stream) -> None:
    bufs = [pool.allocate(1000, stream=stream) for _ in range(3)]
    s = cm.memory_stats().pool(pool)
    assert (s.current, s.live, s.cached) == (3000, 3, 0)
    bufs.pop().free()
    s = cm.memory_stats().pool(pool)
    assert (s.current, s.live, s.cached, s.peak) == (2000, 2, 1024, 3000)
    again = pool.allocate(900, stream=stream)  # a hit: in use again, out of the cache
    s = cm.memory_stats().pool(pool)
    assert (s.current, s.cached, s.total) == (2900, 0, 4)
    for b in [*bufs, again]:
        b.free()
    s = cm.memory_stats().pool(pool)
    assert (s.current, s.live, s.cached, s.cached_peak) == (0, 0, 3072, 3072)
    assert cm.memory_stats().cached >= 3072 and "cached" in repr(cm.memory_stats())
    stream.synchronize()
    assert used(pool) >= 3072  # the driver counts cached blocks as used
    assert pool.empty_cache() == 3072
    stream.synchronize()
    assert used(pool) == 0 and cm.memory_stats().pool(pool).cached == 0
    cm.reset_peak_stats()
    assert cm.memory_stats().pool(pool).cached_peak == 0


def test_track_sees_hits_and_frees(pool: cm.MemoryPool, stream: cm.Stream) -> None:
    pool.allocate(KiB, stream=stream).free()
    with cm.track() as t:
        pool.allocate(KiB, stream=stream).free()  # a hit and a free into the cache
    actions = [e.action for e in t.events()]
    assert actions == ["alloc", "free"]
    assert t.cached_baseline["pool"] >= KiB and t.cached()["pool"] >= KiB


# -- back to the driver -------------------------------------------------------------------------


def test_trim_empties_the_cache(pool: cm.MemoryPool, stream: cm.Stream) -> None:
    pool.allocate(MiB, stream=stream).free()
    assert pool.cached_bytes == MiB
    stream.synchronize()
    pool.trim()
    stream.synchronize()
    assert pool.cached_bytes == 0 and used(pool) == 0


def test_the_limit_bounds_what_is_cached(stream: cm.Stream) -> None:
    with cm.MemoryPool(0, cache=True, cache_limit=3 * KiB) as pool:
        bufs = [pool.allocate(KiB, stream=stream) for _ in range(5)]
        for b in bufs:
            b.free()
        assert pool.cached_bytes == 3 * KiB  # the last two went to the driver
        stream.synchronize()
        assert used(pool) == 3 * KiB
    with cm.MemoryPool(0, cache=True, cache_limit=0) as pool:
        pool.allocate(KiB, stream=stream).free()
        assert pool.cached_bytes == 0


def test_out_of_memory_flushes_and_retries(stream: cm.Stream) -> None:
    with cm.MemoryPool(0, max_size=64 * MiB, cache=True) as pool:
        other = cm.Stream()
        try:
            a = pool.allocate(32 * MiB, stream=other)
            a.free()  # cached on `other`: the pool has no room left for a second 48 MiB
            b = pool.allocate(48 * MiB, stream=stream)  # flushed, synchronized, retried
            assert pool.cached_bytes == 0 and pool.cache is not None
            assert pool.cache.released == 32 * MiB
            b.free()
            c = pool.allocate(16 * MiB, stream=stream)
            c.free()  # cached: 48 + 16 MiB
            with pytest.raises(cm.CudaOutOfMemoryError,
                               match=r"released \d+ cached bytes") as info:
                pool.allocate(65 * MiB, stream=stream)
            assert str(64 * MiB) in str(info.value)
            assert pool.cached_bytes == 0
        finally:
            other.close()


@pytest.mark.sim_only  # it reads the simulator's stream table; the H100 runs the next test
def test_closing_a_stream_frees_its_blocks_on_it_first(pool: cm.MemoryPool,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from cuda_memkit.sim import machine

    s = cm.Stream()
    h = s.handle
    bufs = [pool.allocate(n * KiB, stream=s) for n in (1, 2, 3)]
    for b in bufs:
        b.free()
    seen: list[tuple[int, bool]] = []

    def free(api: str, args: tuple[Any, ...], ok: bool) -> None:
        if api == "cuMemFreeAsync":  # the stream still exists when its blocks are freed
            seen.append((int(args[1]), int(args[1]) in machine().streams))

    with driver_spy(monkeypatch, free):
        s.close()
    assert seen == [(h, True)] * 3
    assert pool.cached_bytes == 0 and h not in pool.cache.streams  # type: ignore[union-attr]


def test_a_collected_stream_frees_its_blocks_first(pool: cm.MemoryPool) -> None:
    s = cm.Stream()
    h = s.handle
    pool.allocate(KiB, stream=s).free()
    assert pool.cached_bytes == KiB
    del s
    gc.collect()
    assert pool.cached_bytes == 0 and h not in pool.cache.streams  # type: ignore[union-attr]


def test_pool_close_releases_the_cache(stream: cm.Stream) -> None:
    pool = cm.MemoryPool(0, cache=True)
    pool.allocate(KiB, stream=stream).free()
    cache = pool.cache
    assert cache is not None and cache.cached == KiB
    pool.close()  # no BufferError: cached blocks are not in use
    assert cache.cached == 0 and not cache.open


@pytest.mark.parametrize("how", ["free", "close", "drop"])
def test_a_buffer_freed_after_a_forced_close_goes_to_the_driver(stream: cm.Stream,
                                                                how: str) -> None:
    pool = cm.MemoryPool(0, cache=True)
    pool.allocate(4 * KiB, stream=stream).free()  # a cached block: the close releases it
    buf = pool.allocate(1000, stream=stream)
    cache, handle = pool.cache, pool.handle
    assert cache is not None
    pool.close(force=True)
    assert not cache.open and pool.cached_bytes == 0
    if how == "free":
        buf.free()
    elif how == "close":
        buf.close()
    else:
        del buf
        gc.collect()
    assert pool.cached_bytes == 0 and cache.cached == 0  # to the driver, not the closed cache
    stream.synchronize()
    assert used_by(handle) == 0
    del pool
    gc.collect()  # the pool's finalizer destroys it: nothing of it is in use


def test_a_forced_close_empties_the_pinned_cache_and_later_closes_free() -> None:
    hp = cm.MemoryPool(location=cm.Location.host())
    handle = hp.handle
    cm.HostBuffer.pooled(4096, pool=hp).close()
    h = cm.HostBuffer.pooled(1000, pool=hp)
    e = cm.HostBuffer.empty(300, pool=hp)
    assert hp.cached_bytes == 4096
    hp.close(force=True)
    assert hp.cached_bytes == 0
    h.close()
    del e
    gc.collect()
    assert hp.cached_bytes == 0
    cm.Device(0).synchronize()
    assert used_by(handle) == 0
    with pytest.raises(cm.ClosedError):
        cm.HostBuffer.pooled(1000, pool=hp)


# -- threads ----------------------------------------------------------------------------------


@settings(max_examples=15, deadline=None)
@given(st.lists(st.sampled_from([100, 512, 1000, 4096, 5000]), min_size=4, max_size=40),
       st.integers(2, 4))
def test_no_block_is_lent_twice(sizes: list[int], nthreads: int) -> None:
    pool = cm.MemoryPool(0, cache=True)
    s = cm.Stream()  # one shared stream: every thread competes for the same free lists
    live: set[int] = set()
    lock = threading.Lock()
    errors: list[str] = []

    def work() -> None:
        try:
            for _ in range(3):
                bufs = []
                for n in sizes:
                    b = pool.allocate(n, stream=s)
                    with lock:
                        if b.ptr in live:
                            errors.append(f"0x{b.ptr:x} lent twice")
                        live.add(b.ptr)
                    bufs.append(b)
                for b in bufs:
                    with lock:
                        live.discard(b.ptr)
                    b.free()
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(repr(exc))

    threads = [threading.Thread(target=work) for _ in range(nthreads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors
        stats = cm.memory_stats().pool(pool)
        assert stats.live == 0 and stats.current == 0
        cache = pool.cache
        assert cache is not None
        held = sum(len(b.blocks or ()) * b.size for lane in cache.streams.values()
                   for b in lane.values())
        assert cache.cached == held  # exact under the GIL
    finally:
        s.close()
        pool.close()


# -- interpreter exit -----------------------------------------------------------------------------


def test_exit_with_cached_blocks_is_quiet(tmp_path: Any) -> None:
    script = tmp_path / "exit_cached.py"
    script.write_text(
        "import cuda_memkit as cm\n"
        "pool = cm.MemoryPool(0, cache=True)\n"
        "s = cm.Stream()\n"
        "for n in (1000, 5000, 1 << 20):\n"
        "    pool.allocate(n, stream=s).free()\n"
        "cm.HostBuffer.pooled(4096).close()\n"
        "d = cm.MemoryPool.default(0, cache=True)\n"
        "d.allocate(4096, stream=s).free()\n"
        "assert pool.cached_bytes and d.cached_bytes\n"
        "print('ok')\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = dict(os.environ, PYTHONPATH=str(_root()))
        out = subprocess.run([sys.executable, "-W", "error", str(script)], capture_output=True,
                             text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok" and out.stderr == ""


def _root() -> Any:
    import pathlib

    return pathlib.Path(cm.__file__).resolve().parent.parent


def test_a_host_pool_with_a_cache_shares_it_with_pooled_buffers(stream: cm.Stream) -> None:
    with cm.MemoryPool(location=cm.Location.host(), cache=True, cache_limit=MiB) as hp:
        h = cm.HostBuffer.pooled(4096, pool=hp)
        ptr = h.ptr
        h.close()
        assert hp.cached_bytes == 4096  # in the pool's own cache (its limit applies)
        b = hp.allocate(4096, stream=stream)  # another stream's lists: not that block
        assert b.ptr != ptr
        b.free()
        assert hp.cached_bytes == 8192
        again = cm.HostBuffer.pooled(4000, pool=hp)
        assert again.ptr == ptr
        again.close()
        stream.synchronize()
    assert hp.cached_bytes == 0


def test_a_drain_on_another_thread_finishes_before_the_stream_is_destroyed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # empty_cache() frees a stream's cached blocks on that stream while its owner closes it
    # on another thread: the close's own drain (and the destroy after it) wait for the
    # first drain, so no block is freed on a destroyed stream (that crashed the H100).
    from cuda_memkit._core import _stream

    s = cm.Stream()
    destroyed: list[int] = []
    real_destroy = _stream.driver_release

    def recording_release(api: str, *args: Any) -> None:
        if api == "cuStreamDestroy":
            destroyed.append(int(args[0]))
        real_destroy(api, *args)

    monkeypatch.setattr(_stream, "driver_release", recording_release)
    with cm.MemoryPool(0, cache=True) as pool:
        pool.allocate(4096, stream=s).free()  # cached on s
        real_free = _cache.FREE
        seen: list[bool] = []
        closer: list[threading.Thread] = []

        def racing_free(block: Any, cus: Any) -> Any:
            if not closer:
                t = threading.Thread(target=s.close)
                closer.append(t)
                t.start()
                t.join(0.2)  # the close goes as far as it can meanwhile
                seen.append(bool(destroyed))
            return real_free(block, cus)

        monkeypatch.setattr(_cache, "FREE", racing_free)
        assert pool.empty_cache() == 4096
        closer[0].join()
        assert seen == [False]  # not destroyed while this thread freed on it
        assert destroyed and s.closed
        assert pool.cached_bytes == 0
