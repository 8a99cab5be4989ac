"""One owner, one free; no export reads freed memory.

Each test guards one way memory could be freed twice or read after its free
(the table in ``docs/reliability.md`` names them): copies and pickles refused,
exports keeping memory alive past ``close()`` and freeing it when the last one
goes, stale views refused by every copy path, a racing ``free()`` claimed
once, atomic file writes, typed DLPack of managed memory, plans refusing freed
buffers, numpy 2's ``__array__`` contract, integers past 64 bits, and a failed
``free()`` leaving the buffer allocated. The random sequences are in
``tests/test_ownership_stateful.py``; what only a GPU can tell (CuPy and torch
as DLPack consumers) in ``tests/test_ownership_gpu.py``.
"""

from __future__ import annotations

import copy
import gc
import os
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit._core import _driver, _resource

from ._helpers import all_driver_calls
from ._kinds import KINDS, Env, close_all, kind_params
from ._nothing import nothing_allocated

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.usefixtures("default_pinned", "flush_pinned")


def live_keys() -> set[int]:
    """Addresses (ids) of every allocation the ledger holds now."""
    return {int(key) for _acct, key, _n in _resource.live_allocations()}  # type: ignore[call-overload]


@pytest.fixture
def host_pool() -> Iterator[cm.MemoryPool]:
    pool = cm.MemoryPool(location=cm.Location.host())
    yield pool
    pool.close()


@pytest.fixture
def managed_pool() -> Iterator[cm.MemoryPool]:
    pool = cm.MemoryPool(managed=True)
    yield pool
    pool.close()


# -- hole 1: copy.copy, deepcopy and pickle make a second owner ------------------------------

#: Every owning kind (tests/_kinds.py) plus the pool kinds and internal owners it lacks.
OWNERS = sorted(KINDS)


@pytest.mark.parametrize("kind", kind_params(OWNERS))
@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle"])
def test_owners_refuse_copy_and_pickle(kind: str, how: str, stream: cm.Stream) -> None:
    obj = KINDS[kind](Env(stream))
    try:
        for o in obj if isinstance(obj, list) else [obj]:
            before = live_keys()
            action: Callable[[Any], Any] = {"copy": copy.copy, "deepcopy": copy.deepcopy,
                                            "pickle": pickle.dumps}[how]
            with pytest.raises(TypeError, match=r"cannot be (copied|pickled).*share"):
                action(o)
            assert not o.closed and live_keys() == before
    finally:
        close_all(obj)
        stream.synchronize()


@pytest.mark.parametrize("where", ["host", "managed"])
def test_pool_kinds_and_memory_owners_refuse_copy(where: str, host_pool: cm.MemoryPool,
                                                  managed_pool: cm.MemoryPool,
                                                  stream: cm.Stream) -> None:
    pool = host_pool if where == "host" else managed_pool
    buf = pool.allocate(4096, stream=stream)
    pooled = cm.HostBuffer.pooled(4096)
    in_pool = cm.HostBuffer.empty(4096, pool=host_pool)
    plain = cm.HostBuffer.empty(4096)
    # The objects behind a HostBuffer that free its memory in their __del__.
    owners = [buf, pooled, in_pool, plain, pooled._block, in_pool._block, plain._block]
    for o in owners:
        for action in (copy.copy, copy.deepcopy, pickle.dumps):
            with pytest.raises(TypeError, match="share"):
                action(o)
    stream.synchronize()
    for b in (buf, pooled, in_pool, plain):
        b.close()
        assert b.closed


# -- hole 2: close() frees memory a DLPack consumer still uses ---------------------------------


def _dlpack_kinds(host_pool: cm.MemoryPool, managed_pool: cm.MemoryPool,
                  stream: cm.Stream) -> dict[str, Any]:
    return {
        "ManagedBuffer": cm.ManagedBuffer.zeros(4096),
        "host PoolBuffer": host_pool.allocate(4096, stream=stream),
        "managed PoolBuffer": managed_pool.allocate(4096, stream=stream),
    }


@pytest.mark.uses_managed_memory
@pytest.mark.parametrize("kind", ["ManagedBuffer", "host PoolBuffer", "managed PoolBuffer"])
def test_dlpack_consumer_keeps_memory_after_close(kind: str, host_pool: cm.MemoryPool,
                                                  managed_pool: cm.MemoryPool,
                                                  stream: cm.Stream) -> None:
    bufs = _dlpack_kinds(host_pool, managed_pool, stream)
    buf = bufs.pop(kind)
    for other in bufs.values():
        other.close()
    stream.synchronize()
    ptr = buf.ptr
    fill = buf.array
    fill[:] = 7
    del fill
    x = np.from_dlpack(buf)
    assert x.ctypes.data == ptr
    buf.close()
    assert buf.closed
    assert ptr in live_keys(), "close() freed memory a DLPack consumer still holds"
    newcomer = cm.ManagedBuffer.zeros(4096)  # cannot take the address: it is still ours
    assert newcomer.ptr != ptr
    assert int(x.sum()) == 7 * 4096
    del x
    gc.collect()
    assert ptr not in live_keys(), "the last consumer is gone: the memory must be freed"
    newcomer.close()


@pytest.mark.uses_managed_memory
def test_capsule_never_consumed_frees_after_close() -> None:
    m = cm.ManagedBuffer.zeros(4096)
    ptr = m.ptr
    cap = m.__dlpack__()
    m.close()
    assert ptr in live_keys()
    del cap
    gc.collect()
    assert ptr not in live_keys()


# -- hole 3: stale views pass copy() and copy_batch() ------------------------------------------


def test_stale_view_refused_by_every_copy_path(stream: cm.Stream) -> None:
    pool = cm.MemoryPool.default(0)
    buf = pool.allocate(4096, stream=stream)
    view = buf.as_array()
    buf.free()
    victim = pool.allocate(4096, stream=stream)  # may take the freed address
    cm.copy(victim, np.full(4096, 5, np.uint8))
    src = np.zeros(4096, np.uint8)
    name = r"PoolBuffer behind this view was freed"
    with pytest.raises(cm.ClosedError, match=name):
        cm.copy(view, src)
    with pytest.raises(cm.ClosedError, match=name):
        cm.copy_async(view, src, stream=stream, allow_pageable=True)
    with pytest.raises(cm.ClosedError, match=name):
        cm.copy_batch(view, victim, dst_offsets=[0], src_offsets=[0], sizes=[4096],
                      stream=stream)
    with pytest.raises(cm.ClosedError, match=name):
        view.ptr  # noqa: B018
    assert (victim.to_numpy() if hasattr(victim, "to_numpy") else _read(victim)).min() == 5
    victim.free()


def test_copybatch_refuses_view_freed_after_add(stream: cm.Stream) -> None:
    pool = cm.MemoryPool.default(0)
    buf = pool.allocate(4096, stream=stream)
    host = cm.HostBuffer.zeros(4096)
    batch = cm.CopyBatch()
    batch.add(host, buf.as_array(), dst_offsets=[0], src_offsets=[0], sizes=[4096])
    buf.free()
    with pytest.raises(cm.ClosedError, match="PoolBuffer"):
        batch.execute(stream=stream)
    stream.synchronize()
    host.close()


def _read(buf: Any) -> np.ndarray[Any, Any]:
    out = np.empty(buf.nbytes, np.uint8)
    cm.copy(out, buf)
    return out


# -- hole 4: two threads freeing one PoolBuffer ------------------------------------------------


class SlowStream:
    """A stream-like whose handle takes a while to read: both threads get past the checks."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        time.sleep(0.02)
        return (0, self.handle)


@pytest.mark.parametrize("where", ["device", "host"])
def test_racing_frees_free_once(where: str, stream: cm.Stream,
                                host_pool: cm.MemoryPool) -> None:
    pool = cm.MemoryPool.default(0) if where == "device" else host_pool
    slow = SlowStream(stream.handle)
    for _ in range(5):
        buf = pool.allocate(4096, stream=stream)
        ptr = buf.ptr
        outcome: list[str] = []
        gate = threading.Barrier(2)

        def free(buf: Any = buf, outcome: list[str] = outcome,
                 gate: threading.Barrier = gate) -> None:
            gate.wait()
            try:
                buf.free(slow)  # the loser's call does nothing (a second free() is a no-op)
                outcome.append("ok")
            except cm.CudaError as exc:  # a second cuMemFreeAsync of the same pointer
                outcome.append(f"driver error {exc}")

        threads = [threading.Thread(target=free) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert outcome == ["ok", "ok"]
        assert buf.closed and ptr not in live_keys()
        buf.close()  # a no-op: it must not free whichever buffer took the address
        nxt = pool.allocate(4096, stream=stream)
        buf.close()
        assert not nxt.closed and int(nxt._dptr) in live_keys()
        nxt.free()
    stream.synchronize()


@pytest.mark.parametrize("cached", [False, True])
def test_close_after_a_racing_free_frees_nothing(cached: bool, stream: cm.Stream,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """close() and the finalizer claim the ledger entry first, as free() does.

    A close() that read the pointer before a racing free() claimed it reaches the
    release with an entry already gone: it must free nothing (no second
    cuMemFreeAsync, no block put back in the cache twice).
    """
    pool = cm.MemoryPool(0, cache=cached)
    try:
        buf = pool.allocate(4096, stream=stream)
        d, sref, b = buf._dptr, buf._sref, buf._bin
        buf.free()  # the winner: claims the entry, frees (or caches) the block
        cached_before = pool.cached_bytes
        with all_driver_calls(monkeypatch) as calls:
            b.give(d, sref)  # the loser
        assert [c for c in calls if c[0] == "cuMemFreeAsync"] == []
        assert pool.cached_bytes == cached_before
        assert d not in b.account.live
    finally:
        stream.synchronize()
        pool.close()


# -- hole 5: Tracker.save deletes a file it did not create -------------------------------------

_SAVE_UNDER_LIMIT = """
import resource, signal, sys
import cuda_memkit as cm
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
with cm.track() as t:
    for _ in range(50):
        cm.HostBuffer.empty(64).close()
resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))
try:
    t.save(sys.argv[1])
except OSError as exc:
    print("refused:", exc)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE is Linux's")
def test_failed_save_keeps_the_existing_file(tmp_path: Path) -> None:
    target = tmp_path / "record.json"
    target.write_text("precious")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", _SAVE_UNDER_LIMIT, str(target)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=120, check=True)
    assert "refused:" in out.stdout and "cannot save the tracking record" in out.stdout
    assert target.read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]  # no temporary left


def test_save_replaces_and_keeps_mode(tmp_path: Path) -> None:
    target = tmp_path / "record.json"
    target.write_text("old")
    target.chmod(0o640)
    with cm.track() as t:
        cm.HostBuffer.empty(64).close()
    t.save(target)
    assert target.read_text().startswith("{") and (target.stat().st_mode & 0o777) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]
    link = tmp_path / "link.json"
    link.symlink_to(target)
    t.save(link)
    assert link.is_symlink()  # the file behind the link was replaced, not the link


# -- hole 6: ManagedBuffer's DLPack loses dtype and shape -------------------------------------


@pytest.mark.uses_managed_memory
def test_managed_dlpack_is_typed() -> None:
    src = np.arange(32, dtype=np.float32).reshape(4, 8)
    with cm.ManagedBuffer.from_array(src) as m:
        x = np.from_dlpack(m)
        assert x.shape == (4, 8) and x.dtype == np.float32
        assert m.__cuda_array_interface__["shape"] == x.shape
        np.testing.assert_array_equal(x, src)
        del x


# -- hole 7: a PrefetchPlan entry whose pool buffer was freed ----------------------------------


@pytest.mark.uses_managed_memory
@pytest.mark.parametrize("how", ["add", "add_ranges"])
def test_plan_refuses_freed_pool_buffer(how: str, managed_pool: cm.MemoryPool,
                                        stream: cm.Stream) -> None:
    buf = managed_pool.allocate(1 << 16, stream=stream)
    plan = cm.PrefetchPlan()
    if how == "add":
        plan.add(buf, cm.Location.device(0))
    else:
        plan.add_ranges(buf, cm.Location.device(0), [0, 4096], 4096)
    plan.execute(stream=stream)  # fine while the buffer is alive
    buf.free()
    heir = managed_pool.allocate(1 << 16, stream=stream)  # may take the address
    with pytest.raises(cm.ClosedError, match=r"plan entry 0 .*PoolBuffer was freed"):
        plan.execute(stream=stream)
    with pytest.raises(cm.ClosedError, match="plan entry 0"):
        plan.validate()
    heir.free()
    stream.synchronize()


# -- hole 8: after close(), memory freed only when the buffer object dies ---------------------


@pytest.mark.uses_managed_memory
@pytest.mark.parametrize("kind", ["HostBuffer", "HostBuffer.pooled", "ManagedBuffer",
                                  "host PoolBuffer"])
def test_close_frees_when_last_view_goes(kind: str, host_pool: cm.MemoryPool,
                                         stream: cm.Stream) -> None:
    if kind == "host PoolBuffer":
        buf: Any = host_pool.allocate(4096, stream=stream)
        stream.synchronize()
    else:
        buf = KINDS[kind](Env(stream))
    ptr = buf.ptr
    a = buf.array
    sub = a[8:16]
    del a
    buf.close()
    assert buf.closed and ptr in live_keys()  # the sub-view still holds it
    sub[:] = 1
    del sub
    # `buf` is still referenced here: the memory must go with the last view anyway.
    assert ptr not in live_keys()
    with pytest.raises(cm.ClosedError):
        buf.array  # noqa: B018


# -- hole 9: numpy 2's __array__ contract --------------------------------------------------------


@pytest.mark.uses_managed_memory
@pytest.mark.parametrize("kind", ["HostBuffer", "HostBuffer.pooled", "ManagedBuffer",
                                  "host PoolBuffer", "managed PoolBuffer"])
def test_array_protocol_one_rule(kind: str, host_pool: cm.MemoryPool,
                                 managed_pool: cm.MemoryPool, stream: cm.Stream) -> None:
    if kind.endswith("PoolBuffer"):
        buf: Any = (host_pool if kind.startswith("host") else managed_pool).allocate(
            4096, stream=stream)
        stream.synchronize()
    else:
        buf = KINDS[kind](Env(stream))
    view = buf.array
    view[:] = 3
    assert not np.shares_memory(np.array(buf), view)  # np.array copies
    assert np.shares_memory(np.asarray(buf), view)  # copy=None views
    assert not np.shares_memory(np.asarray(buf, copy=True), view)
    assert np.shares_memory(np.asarray(buf, copy=False), view)
    with pytest.raises(ValueError, match="needs a copy"):
        np.asarray(buf, dtype=np.float32, copy=False)
    conv = np.asarray(buf, dtype=np.uint16)
    assert conv.dtype == np.uint16 and int(conv[0]) == 3
    del view, conv
    buf.close()


# -- hole 10: integers past 64 bits ------------------------------------------------------------

BIG = 1 << 64


def _past_64_calls(env: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    pool = cm.MemoryPool.default(0)
    buf, h, m = env["buf"], env["host"], env["managed"]
    return {
        "allocate(stream=2**64)": lambda: pool.allocate(64, stream=BIG),
        "free(2**64)": lambda: buf.free(BIG),
        "Stream.from_handle(2**64)": lambda: cm.Stream.from_handle(BIG),
        "copy(2**64 + ptr)": lambda: cm.copy(BIG + h.ptr, np.zeros(64, np.uint8)),
        "copy(2**64)": lambda: cm.copy(BIG, np.zeros(64, np.uint8)),
        "copy(src=2**64)": lambda: cm.copy(h, BIG, nbytes=64),
        "copy_async(2**64)": lambda: cm.copy_async(BIG, h, stream=env["stream"]),
        "add_ranges(sizes=2**64)": lambda: cm.PrefetchPlan().add_ranges(m, 0, [0], BIG),
        "add_ranges(offsets=[2**64])": lambda: cm.PrefetchPlan().add_ranges(m, 0, [BIG], 64),
        "PrefetchPlan.add(2**64)": lambda: cm.PrefetchPlan().add(BIG, 0),
        "configure_staging(chunk=2**64)": lambda: cm.configure_staging(chunk=BIG),
        "configure_staging(buffers=10**6)": lambda: cm.configure_staging(buffers=10**6),
        "Stream.from_handle(-1)": lambda: cm.Stream.from_handle(-1),
    }


NAMES_64 = list(_past_64_calls({"buf": None, "host": None, "managed": None, "stream": None}))


@pytest.mark.uses_managed_memory
@pytest.mark.parametrize("name", NAMES_64)
def test_integers_past_64_bits_raise_value_error(name: str, stream: cm.Stream,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"buf": cm.MemoryPool.default(0).allocate(64, stream=stream),
           "host": cm.HostBuffer.zeros(64), "managed": cm.ManagedBuffer.zeros(4096),
           "stream": stream}
    before = cm.staging_settings()
    with nothing_allocated(monkeypatch):
        with pytest.raises(ValueError, match=r"64 bits|2\*\*63|negative|must be <="):
            _past_64_calls(env)[name]()
    assert cm.staging_settings() == before
    assert not env["buf"].closed  # free(2**64) left it allocated
    env["buf"].free()
    env["host"].close()
    env["managed"].close()
    stream.synchronize()


@pytest.mark.sim_only
def test_simulator_refuses_wide_addresses_without_crashing() -> None:
    # The bindings refuse such ints before the call (OverflowError); the
    # simulator does the same instead of wrapping them onto live memory.
    with cm.HostBuffer.zeros(64) as h:
        for bad in (BIG, BIG + h.ptr, -1):
            with pytest.raises(OverflowError):
                _driver.call("cuMemcpy", bad, h.ptr, 8)
        assert not h.array.any()


# -- hole 11: a failed free() leaves the buffer allocated ---------------------------------------


@pytest.mark.sim_only  # an invented handle could crash the real driver
def test_free_on_a_bad_stream_raises_and_keeps_the_buffer(stream: cm.Stream) -> None:
    buf = cm.MemoryPool.default(0).allocate(64, stream=stream)
    ptr = buf.ptr
    with pytest.raises(cm.CudaError):  # no fallback to the legacy stream (nor its warning)
        buf.free(stream=12345)
    assert not buf.closed and ptr in live_keys()
    buf.free()
    assert buf.closed and ptr not in live_keys()
    stream.synchronize()


# -- siblings of holes 2 and 8 in virtual memory -----------------------------------------------


def test_range_close_leaves_an_exported_mapping_mapped() -> None:
    g = cm.granularity(0)
    vr = cm.AddressRange.reserve(2 * g)
    pm = cm.PhysicalMemory.create(g)
    m = vr.map(pm, offset=g)
    m.set_access(0, cm.Access.READWRITE)
    ptr = m.ptr
    cap = m.__dlpack__()  # a consumer's capsule (on a GPU: a CuPy or torch array)
    vr.close()  # closing a range unmaps its mappings, but not one a consumer holds
    pm.close()
    assert m.closed and ptr in live_keys()
    with pytest.raises(cm.ClosedError):
        m.__dlpack__()
    del cap
    gc.collect()
    assert ptr not in live_keys()


def test_growable_refuses_to_shrink_under_a_consumer() -> None:
    g = cm.granularity(0)
    with cm.GrowableBuffer(4 * g, chunk=g) as buf:
        buf.resize(2 * g)
        cap = buf.__dlpack__()
        with pytest.raises(BufferError, match="DLPack consumers"):
            buf.resize(g)
        assert buf.nbytes == 2 * g
        buf.resize(3 * g)  # growing leaves the exported memory where it is
        del cap
        buf.resize(g)
        assert buf.nbytes == g


# -- close() while an asynchronous copy still uses the memory --------------------------------

COPYABLE = ["HostBuffer", "HostBuffer.pooled", "RegisteredHost", "DeviceBuffer",
            "ManagedBuffer", "PoolBuffer", "GrowableBuffer"]


@pytest.mark.parametrize("kind", kind_params(COPYABLE))
@pytest.mark.parametrize("role", ["source", "destination"])
def test_close_during_an_async_copy_releases_after_it(
        kind: str, role: str, stream: cm.Stream,
        copies_in_flight: Callable[[], None]) -> None:
    """close() under a copy in flight: the memory is neither freed nor lent again until the
    copy is done (a pooled block reused at once would be written by the host under the
    DMA); then it goes, without the buffer object having to die."""
    buf = KINDS[kind](Env(stream))
    other = cm.DeviceBuffer.empty(buf.nbytes) if kind in (
        "HostBuffer", "HostBuffer.pooled", "RegisteredHost") else cm.HostBuffer.empty(buf.nbytes)
    try:
        ptr = buf.ptr
        if role == "source":
            cm.copy_async(other, buf, stream=stream)
        else:
            cm.copy_async(buf, other, stream=stream)
        buf.close()
        assert buf.closed and ptr in live_keys()
        if kind == "HostBuffer.pooled":
            again = cm.HostBuffer.pooled(buf.nbytes)
            assert again.ptr != ptr  # not lent again under the copy
            again.close()
        copies_in_flight()
        stream.synchronize()  # lets go of the finished copy's operands
        assert ptr not in live_keys()  # `buf` is still referenced here
    finally:
        other.close()


def test_close_during_copies_on_two_streams_waits_for_both(
        stream: cm.Stream, copies_in_flight: Callable[[], None],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from cuda_memkit._core import _inflight

    h = cm.HostBuffer.pooled(4096)
    d1, d2 = cm.DeviceBuffer.empty(4096), cm.DeviceBuffer.empty(4096)
    with cm.Stream() as s2:
        try:
            ptr = h.ptr
            cm.copy_async(d1, h, stream=stream)
            cm.copy_async(d2, h, stream=s2)
            h.close()
            first = _inflight.pending_operands[stream.handle][0][0]
            with monkeypatch.context() as m:  # the first copy is done, the second is not
                m.setattr(_inflight, "_event_done", lambda ev, first=first: ev is first)
                _inflight.reap_pending()
            assert ptr in live_keys()  # the second still reads it
            copies_in_flight()
            s2.synchronize()
            assert ptr not in live_keys()
        finally:
            d1.close()
            d2.close()


def test_close_during_a_copy_batch_releases_after_it(
        stream: cm.Stream, copies_in_flight: Callable[[], None]) -> None:
    h = cm.HostBuffer.pooled(8192)
    d = cm.DeviceBuffer.empty(8192)
    try:
        ptr = h.ptr
        cm.copy_batch(d, h, dst_offsets=[4096, 0], src_offsets=[0, 4096], sizes=4096,
                      stream=stream)
        h.close()
        assert ptr in live_keys()
        copies_in_flight()
        stream.synchronize()
        assert ptr not in live_keys()
    finally:
        d.close()


def test_shrinking_a_growable_buffer_waits_for_its_copies_first(
        stream: cm.Stream, copies_in_flight: Callable[[], None],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """resize() down unmaps the tail: under a copy still running that faults the device, so
    it waits on the copy's event first (and never on copies of other buffers)."""
    from ._helpers import call_order

    g = cm.granularity(0)
    buf = cm.GrowableBuffer(4 * g, chunk=g)
    other = cm.DeviceBuffer.empty(4096)
    host = cm.HostBuffer.empty(g)
    try:
        buf.resize(2 * g)
        cm.copy_async(other, host, nbytes=4096, stream=stream)  # a copy of other buffers
        cm.copy_async(buf, host, nbytes=g, stream=stream)
        with call_order(monkeypatch) as order:
            buf.resize(g)
        assert order.count("cuEventSynchronize") == 1  # the copy into buf, not the other one
        assert order.index("cuEventSynchronize") < order.index("cuMemUnmap")
    finally:
        copies_in_flight()
        stream.synchronize()
        for b in (buf, other, host):
            b.close()


def test_a_pool_closes_after_the_copies_its_closed_buffers_were_in(
        stream: cm.Stream, copies_in_flight: Callable[[], None],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every buffer closed, one still under a copy in flight: close() of the pool waits for
    the copy instead of refusing with "live allocations"."""
    from cuda_memkit._pools import _pool

    pool = cm.MemoryPool(0)
    host = cm.HostBuffer.empty(4096)
    try:
        buf = pool.allocate(4096, stream=stream)
        cm.copy_async(buf, host, stream=stream)
        buf.close()
        waited = []
        real_wait = _pool.wait_pending

        def wait() -> None:  # on the simulator the copy ends when it is waited for
            waited.append(True)
            copies_in_flight()
            real_wait()

        monkeypatch.setattr(_pool, "wait_pending", wait)
        pool.close()
        assert pool.closed and waited
    finally:
        copies_in_flight()
        stream.synchronize()
        host.close()
        pool.close(force=True)


def test_closing_a_buffer_no_copy_uses_asks_nothing_of_the_copies_in_flight(
        stream: cm.Stream, copies_in_flight: Callable[[], None],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With many copies in flight, close() of a buffer none of them uses neither queries
    their events nor scans them (a loop of copy_async + close stays linear)."""
    from ._helpers import no_driver_calls

    dev = cm.DeviceBuffer.empty(4096)
    hosts = [cm.HostBuffer.pooled(4096) for _ in range(50)]
    try:
        for h in hosts:
            cm.copy_async(dev, h, stream=stream)
        mine = cm.HostBuffer.pooled(4096)
        with no_driver_calls(monkeypatch):
            mine.close()
        assert mine.closed
    finally:
        copies_in_flight()
        stream.synchronize()
        for h in hosts:
            h.close()
        dev.close()
