"""The allocation ledger: every owning object registers its memory and leaves on every path.

For each memory kind: the account (kind, device, pool) holds the allocation
with the size asked for while it is alive, and drops it when it is freed by
``close()``, ``with``, garbage collection or a pool's ``free()``; peaks and
totals follow.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit._core import _resource

MiB = 1 << 20


def acct(kind: str, device: int | None = None, pool: int | None = None) -> _resource.Account:
    return _resource.account(kind, device, pool)


def live(kind: str, device: int | None = None, pool: int | None = None) -> tuple[int, int]:
    a = acct(kind, device, pool)
    return len(a.live), a.current


@pytest.fixture
def stream() -> Iterator[cm.Stream]:
    s = cm.Stream()
    yield s
    s.synchronize()
    s.close()


def _gran() -> int:
    return cm.granularity(0)


# Each maker returns (object, kind, device, pool, nbytes it should register).
Maker = Callable[[], tuple[Any, str, int | None, int | None, int]]


def _host() -> tuple[Any, str, int | None, int | None, int]:
    return cm.HostBuffer.empty((3, 1000), np.float32), "pinned", None, None, 12000


def _pooled() -> tuple[Any, str, int | None, int | None, int]:
    return cm.HostBuffer.pooled(5000), "pinned_pooled", None, None, 5000


def _pooled_typed() -> tuple[Any, str, int | None, int | None, int]:
    return cm.HostBuffer.pooled((10, 10), np.float64), "pinned_pooled", None, None, 800


def _registered() -> tuple[Any, str, int | None, int | None, int]:
    return cm.register_host(np.zeros(8192, np.uint8)), "registered", None, None, 8192


def _device() -> tuple[Any, str, int | None, int | None, int]:
    return cm.DeviceBuffer.empty(3 * MiB + 1), "device", 0, None, 3 * MiB + 1


def _managed() -> tuple[Any, str, int | None, int | None, int]:
    return cm.ManagedBuffer.empty(4096), "managed", 0, None, 4096


def _physical() -> tuple[Any, str, int | None, int | None, int]:
    return cm.PhysicalMemory.create(_gran(), device=0), "vmm_physical", 0, None, _gran()


def _pool_buffer() -> tuple[Any, str, int | None, int | None, int]:
    pool = cm.MemoryPool.default(0)
    return pool.allocate(12345, stream=None), "pool", 0, pool.handle, 12345


MAKERS: dict[str, Maker] = {
    "HostBuffer": _host, "pooled": _pooled, "pooled typed": _pooled_typed,
    "registered": _registered, "DeviceBuffer": _device, "ManagedBuffer": _managed,
    "PhysicalMemory": _physical, "PoolBuffer": _pool_buffer,
}


@pytest.fixture(scope="module", autouse=True)
def _default_pinned() -> None:
    """Make the process-wide pinned pool (and its stream) before the leak check's snapshots."""
    cm.HostBuffer.pooled(1).close()
    cm.MemoryPool.default_pinned().trim()


@pytest.fixture(autouse=True)
def _settle() -> Iterator[None]:
    yield
    gc.collect()
    cm.MemoryPool.default_pinned().trim()
    cm.Device(0).synchronize()


@pytest.mark.uses_managed_memory
@pytest.mark.parametrize("how", ["close", "with", "gc"])
@pytest.mark.parametrize("what", list(MAKERS))
def test_every_kind_registers_and_leaves(what: str, how: str) -> None:
    obj, kind, dev, pool, n = MAKERS[what]()
    before_total = acct(kind, dev, pool).total
    count, nbytes = live(kind, dev, pool)
    assert count >= 1 and nbytes >= n
    a = acct(kind, dev, pool)
    key = next(k for k, v in a.live.items() if v == n)
    assert a.total == before_total and a.peak >= a.current
    if how == "close":
        obj.close()
    elif how == "with":
        with obj:
            pass
    else:
        del obj
        gc.collect()
    assert key not in a.live
    assert live(kind, dev, pool) == (count - 1, nbytes - n)


def test_totals_and_peaks() -> None:
    a = acct("device", 0)
    a.reset_peak()
    base_total, base = a.total, a.current
    bufs = [cm.DeviceBuffer.empty(MiB) for _ in range(4)]
    assert a.current == base + 4 * MiB and a.peak == base + 4 * MiB
    assert a.total == base_total + 4
    for b in bufs[:3]:
        b.close()
    assert a.current == base + MiB and a.peak == base + 4 * MiB
    a.reset_peak()
    assert a.peak == base + MiB
    bufs[3].close()
    assert a.current == base and a.total == base_total + 4


def test_zero_length_buffers_register_nothing() -> None:
    before = {k: (len(v.live), v.current) for k, v in _resource.LEDGER.items()}
    objs = [cm.HostBuffer.empty(0), cm.DeviceBuffer.empty(0), cm.ManagedBuffer.empty(0),
            cm.register_host(np.zeros(0))]
    after = {k: (len(v.live), v.current) for k, v in _resource.LEDGER.items()}
    assert {k: v for k, v in after.items() if v != before.get(k, (0, 0))} == {}
    for o in objs:
        o.close()


def test_pool_free_and_views(stream: cm.Stream) -> None:
    with cm.MemoryPool(location=cm.Location.host()) as pool:
        a = acct("pool", None, pool.handle)
        buf = pool.allocate(4096, stream=stream)
        assert a.live and a.current == 4096
        stream.synchronize()
        view = buf.array
        buf.close()  # deferred: the view still uses the memory
        assert a.current == 4096
        del view, buf
        gc.collect()
        assert a.current == 0 and not a.live
        pool.allocate(100, stream=stream).free()
        assert a.current == 0 and a.total == 2


def test_mappings_and_growable() -> None:
    g = _gran()
    phys = cm.PhysicalMemory.create(2 * g, device=0)
    rng = cm.AddressRange.reserve(4 * g)
    m = rng.map(phys)
    mptr = m.ptr
    assert acct("vmm_mapped", 0).live[mptr] == 2 * g
    rng.close()  # unmaps the mapping first
    assert m.closed and mptr not in acct("vmm_mapped", 0).live
    assert phys.handle in acct("vmm_physical", 0).live
    phys.close()
    buf = cm.GrowableBuffer(8 * g)
    a = acct("growable", 0)
    assert a.live[buf.ptr] == 0
    buf.resize(3 * g - 1)
    assert a.live[buf.ptr] == buf.capacity == 3 * g
    peak = a.peak
    buf.resize(g)
    assert a.live[buf.ptr] == g and a.peak == peak
    ptr = buf.ptr
    buf.close()
    assert ptr not in a.live


def test_threads_keep_exact_counts() -> None:
    """Adds and removes from 8 threads at once leave the account exact (no lock)."""
    pool = cm.MemoryPool.default(0)
    a = acct("pool", 0, pool.handle)
    base = (len(a.live), a.current, a.total)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            with cm.Stream() as s:
                for i in range(300):
                    bufs = [pool.allocate(64 + i, stream=s) for _ in range(3)]
                    for b in bufs:
                        b.free()
                s.synchronize()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and not any(t.is_alive() for t in threads)
    assert (len(a.live), a.current) == base[:2]
    assert a.total == base[2] + 8 * 300 * 3


def test_watchers_see_every_event() -> None:
    seen: list[tuple[str, int, bool]] = []

    def watch(account: _resource.Account, key: object, n: int, allocated: bool,
              stream: int | None) -> None:
        seen.append((account.kind, n, allocated))

    _resource.watchers.append(watch)
    try:
        with cm.DeviceBuffer.empty(1000):
            pass
        cm.MemoryPool.default(0).allocate(2000, stream=None).free()
        cm.HostBuffer.pooled(3000).close()
    finally:
        _resource.watchers.remove(watch)
    assert seen == [("device", 1000, True), ("device", 1000, False), ("pool", 2000, True),
                    ("pool", 2000, False), ("pinned_pooled", 3000, True),
                    ("pinned_pooled", 3000, False)]


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown memory kind"):
        _resource.account("nonsense")
