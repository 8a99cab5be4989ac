"""MemoryPool attributes: release threshold, reuse flags, max_size, stats, peaks, trim.

The numbers are the H100's (``h100_probe.json``, section E): memory is mapped
into a pool in 32 MiB chunks, allocations are placed first-fit one after the
other, and only chunks no live allocation touches are returned. Statistics
are read after a synchronize, where both backends agree.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import cuda_memkit as cm

KiB, MiB = 1 << 10, 1 << 20
CHUNK = 32 * MiB
U64_MAX = (1 << 64) - 1


@pytest.fixture
def pool() -> Iterator[cm.MemoryPool]:
    p = cm.MemoryPool(0)
    yield p
    p.close(force=True)


# -- release threshold ---------------------------------------------------------------------


def test_release_threshold_roundtrip(pool: cm.MemoryPool) -> None:
    assert pool.release_threshold == 0
    for value in (MiB, U64_MAX, 0):
        pool.release_threshold = value
        assert pool.release_threshold == value


def test_release_threshold_in_constructor(stream: cm.Stream) -> None:
    with cm.MemoryPool(0, release_threshold=U64_MAX) as p:
        assert p.release_threshold == U64_MAX
        p.allocate(MiB, stream=stream).free()
        stream.synchronize()
        assert p.stats().reserved_current == CHUNK  # kept
        p.trim()
        assert p.stats().reserved_current == 0


@pytest.mark.parametrize("value,exc", [
    ("1", TypeError), (1.0, TypeError), (None, TypeError), (True, TypeError),
    (-1, ValueError), (1 << 64, ValueError),
])
def test_release_threshold_bad_values(pool: cm.MemoryPool, value: object,
                                      exc: type[Exception]) -> None:
    with pytest.raises(exc):
        pool.release_threshold = value  # type: ignore[assignment]
    assert pool.release_threshold == 0


def test_release_threshold_effect(stream: cm.Stream) -> None:
    with cm.MemoryPool(0) as p:
        for threshold, kept in ((0, 0), (U64_MAX, 2 * CHUNK)):
            p.release_threshold = threshold
            bufs = [p.allocate(20 * MiB, stream=stream) for _ in range(3)]  # 60 MiB: 2 chunks
            stream.synchronize()
            assert p.stats().reserved_current == 2 * CHUNK
            for b in bufs:
                b.free()
            stream.synchronize()
            assert p.stats().reserved_current == kept, threshold
            p.trim()


# -- reuse flags ---------------------------------------------------------------------------

FLAGS = ("reuse_follow_event_dependencies", "reuse_allow_opportunistic",
         "reuse_allow_internal_dependencies")


@pytest.mark.parametrize("name", FLAGS)
def test_reuse_flags(pool: cm.MemoryPool, name: str) -> None:
    assert getattr(pool, name) is True
    setattr(pool, name, False)
    assert getattr(pool, name) is False
    setattr(pool, name, 1)
    assert getattr(pool, name) is True
    for bad in ("yes", 2, None):
        with pytest.raises(TypeError):
            setattr(pool, name, bad)


# -- read-only attributes -------------------------------------------------------------------


def test_read_only_attributes(pool: cm.MemoryPool) -> None:
    for name in ("max_size", "handle", "device", "location", "managed", "ipc", "owned"):
        with pytest.raises(AttributeError):
            setattr(pool, name, 0)
    assert pool.max_size == 0
    stats = pool.stats()
    with pytest.raises(AttributeError):
        stats.used_current = 1  # type: ignore[misc]


def test_max_size_is_whole_chunks() -> None:
    with cm.MemoryPool(0, max_size=64 * MiB) as p:
        assert p.max_size == 64 * MiB


# -- statistics --------------------------------------------------------------------------------

SIZES = (KiB, MiB, 3 * MiB, 33 * MiB, 100 * MiB)
RESERVED = (CHUNK, CHUNK, CHUNK, 2 * CHUNK, 5 * CHUNK)
USED = (1024, 1049600, 4195328, 38798336, 143655936)


@pytest.mark.parametrize("where", ["device", "host"])
def test_stats_growth(where: str, stream: cm.Stream) -> None:
    loc = cm.Location.host() if where == "host" else None
    with cm.MemoryPool(0, location=loc) as p:
        assert p.stats() == cm.PoolStats(0, 0, 0, 0)
        bufs = []
        for n, reserved, used in zip(SIZES, RESERVED, USED, strict=True):
            bufs.append(p.allocate(n, stream=stream))
            stream.synchronize()
            assert p.stats() == (reserved, reserved, used, used)
        bufs.pop(3).free()
        bufs.pop(0).free()
        stream.synchronize()
        s = p.stats()
        assert s.used_current == 109051904 and s.used_high == 143655936
        assert s.reserved_current == 5 * CHUNK  # every chunk still touched
        p.reset_peaks()
        assert p.stats() == (5 * CHUNK, 5 * CHUNK, 109051904, 109051904)
        for b in bufs:
            b.free()
        stream.synchronize()
        assert p.stats() == (0, 5 * CHUNK, 0, 109051904)  # threshold 0: all returned


def test_trim_keeps_what_is_asked(stream: cm.Stream) -> None:
    with cm.MemoryPool(0, release_threshold=U64_MAX) as p:
        bufs = [p.allocate(30 * MiB, stream=stream) for _ in range(3)]  # 3 chunks
        for b in bufs:
            b.free()
        stream.synchronize()
        assert p.stats().reserved_current == 3 * CHUNK
        p.trim(keep_bytes=2 * CHUNK)
        assert p.stats().reserved_current == 2 * CHUNK
        p.trim(keep_bytes=CHUNK + 1)  # never below keep_bytes
        assert p.stats().reserved_current == 2 * CHUNK
        p.trim()
        assert p.stats().reserved_current == 0


def test_trim_bad_input(pool: cm.MemoryPool) -> None:
    with pytest.raises(ValueError):
        pool.trim(-1)
    with pytest.raises(TypeError):
        pool.trim(1.5)  # type: ignore[arg-type]


def test_default_pool_stats(stream: cm.Stream) -> None:
    d = cm.MemoryPool.default(0)
    buf = d.allocate(8 * MiB, stream=stream)
    stream.synchronize()
    s = d.stats()
    assert s.reserved_current == CHUNK and s.used_current == 8 * MiB
    buf.free()
    stream.synchronize()
    assert d.stats()[0::2] == (0, 0)
