"""close() under an asynchronous copy in flight: every owner, every order of events.

Copies are held "running" on the simulator by the ``copies_in_flight`` fixture
(``_inflight._event_done`` answers not ready): the memory must stay allocated
(in the ledger) while a copy uses it, and be released exactly once after it,
quietly at exit too. The basic cases per kind are in ``tests/test_ownership.py``.
"""

from __future__ import annotations

import gc
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit._core import _inflight, _resource

from ._helpers import run_script

pytestmark = pytest.mark.usefixtures("default_pinned", "flush_pinned")


def live_keys() -> set[int]:
    """Addresses (ids) of every allocation the ledger holds now."""
    return {int(key) for _acct, key, _n in _resource.live_allocations()}  # type: ignore[call-overload]


def released_after_the_copy(ptr: int, stream: cm.Stream, finish: Callable[[], None]) -> None:
    """``ptr`` (of a closed owner) stays allocated while the work in flight runs, and goes
    once it has finished and ``stream.synchronize()`` let go of it."""
    assert ptr in live_keys(), "released under work still in flight"
    finish()
    stream.synchronize()
    assert ptr not in live_keys()


# -- defects ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mapping_closed_first", [False, True])
def test_closing_the_range_keeps_a_mapping_under_a_copy_mapped(
        mapping_closed_first: bool, stream: cm.Stream,
        copies_in_flight: Callable[[], None]) -> None:
    """AddressRange.close() unmaps the mappings still in it: one a copy in flight uses must
    stay mapped until the copy is done (as one DLPack consumers use does), also when the
    mapping's own close() already deferred its release."""
    g = cm.granularity(0)
    vr = cm.AddressRange.reserve(2 * g)
    pm = cm.PhysicalMemory.create(g)
    m = vr.map(pm, offset=g)
    m.set_access(0, cm.Access.READWRITE)
    host = cm.HostBuffer.empty(g)
    try:
        ptr = m.ptr
        if mapping_closed_first:
            cm.copy_async(host, m, stream=stream)
            m.close()
            assert ptr in live_keys()  # deferred by the mapping's own close()
        else:
            cm.copy_async(m, host, stream=stream)
        vr.close()
        assert m.closed
        released_after_the_copy(ptr, stream, copies_in_flight)
    finally:
        copies_in_flight()
        stream.synchronize()
        pm.close()
        host.close()


def test_the_leak_report_at_exit_lets_go_of_finished_copies(tmp_path: Path) -> None:
    """A buffer closed under a copy that has finished by exit, with no synchronize() since,
    is not a leak: the report at exit must reap the finished copies before it lists."""
    script = tmp_path / "closed_under_copy.py"
    script.write_text(textwrap.dedent("""
        import cuda_memkit as cm
        from cuda_memkit._core import _inflight

        done = _inflight._event_done
        _inflight._event_done = lambda ev: False   # the copy is still running at close()
        s = cm.Stream()
        h = cm.HostBuffer.empty(4096)
        d = cm.DeviceBuffer.empty(4096)
        cm.copy_async(d, h, stream=s)
        h.close()
        d.close()
        _inflight._event_done = done               # ... and has finished by exit
    """))
    proc = run_script(script, CUDA_MEMKIT_BACKEND="sim", CUDA_MEMKIT_LEAK_REPORT="1")
    assert proc.returncode == 0, proc.stderr
    assert "no memory left at exit" in proc.stderr, proc.stderr


def test_a_release_that_reaps_inside_reap_pending_does_not_break_it(
        stream: cm.Stream, copies_in_flight: Callable[[], None],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Exports.__del__ now asks release_after_copies, which reaps: a garbage collection
    inside reap_pending's loop (here: during an event query) that collects the last numpy
    view of a closed buffer reaps re-entrantly, under the outer loop's feet."""
    h = cm.HostBuffer.empty(4096)
    src1, src2 = cm.HostBuffer.empty(4096), cm.HostBuffer.empty(4096)
    d1, d2 = cm.DeviceBuffer.empty(4096), cm.DeviceBuffer.empty(4096)
    s2 = cm.Stream()
    gc.disable()
    try:
        ptr = h.ptr
        cycle: list[Any] = [h.array]
        cycle.append(cycle)  # the view dies only in a garbage collection
        h.close()
        cm.copy_async(d1, src1, stream=stream)
        cm.copy_async(d2, src2, stream=s2)
        del cycle
        copies_in_flight()
        real = _inflight._event_done
        collected = []

        def query(ev: Any) -> bool:
            if not collected:
                collected.append(gc.collect())  # what an allocation in the loop may trigger
            return bool(real(ev))

        monkeypatch.setattr(_inflight, "_event_done", query)
        _inflight.reap_pending()
        assert collected and ptr not in live_keys()
        assert not _inflight.pending_operands
    finally:
        gc.enable()
        monkeypatch.undo()
        _inflight.reap_pending()
        s2.close()
        for b in (src1, src2, d1, d2):
            b.close()


def test_fill_on_a_stream_keeps_a_pool_buffer_until_the_memset_ran(
        stream: cm.Stream, copies_in_flight: Callable[[], None]) -> None:
    """fill(stream=) is an asynchronous cuMemsetD*Async cuda_memkit queued: closing a cached
    pool buffer under it gives the block to the next allocation on its stream while another
    stream's memset still writes it (the hazard the copies are now guarded from)."""
    pool = cm.MemoryPool(0, cache=True)
    try:
        with cm.Stream() as other:
            buf = pool.allocate(4096, stream=stream)
            ptr = buf.ptr
            buf.fill(7, stream=other)
            buf.close()
            again = pool.allocate(4096, stream=stream)
            try:
                assert again.ptr != ptr, "a block lent again under a memset in flight"
            finally:
                again.close()
                copies_in_flight()
                other.synchronize()
    finally:
        stream.synchronize()
        pool.close(force=True)


# -- scenarios that held ----------------------------------------------------------------------

#: Owners the tests of test_ownership.py leave out: pool buffers of every location, cached
#: and not, and HostBuffers on a pinned host pool.
POOL_KINDS = ["device", "device cached", "host", "host cached", "managed",
              "HostBuffer(pool=)", "HostBuffer.pooled(pool=)"]


def _make(kind: str, stream: cm.Stream) -> tuple[Any, cm.MemoryPool]:
    where = kind.split()[0]
    if where.startswith("HostBuffer"):
        pool = cm.MemoryPool(location=cm.Location.host())
        make = cm.HostBuffer.pooled if "pooled" in kind else cm.HostBuffer.empty
        return make(4096, pool=pool), pool
    loc = {"device": {}, "host": {"location": cm.Location.host()},
           "managed": {"managed": True}}[where]
    pool = cm.MemoryPool(**loc, cache="cached" in kind)  # type: ignore[arg-type]
    return pool.allocate(4096, stream=stream), pool


@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.uses_managed_memory)
                                  if k == "managed" else k for k in POOL_KINDS])
def test_every_pool_kind_is_released_once_after_the_copy(
        kind: str, stream: cm.Stream, copies_in_flight: Callable[[], None]) -> None:
    buf, pool = _make(kind, stream)
    other = cm.DeviceBuffer.empty(4096)
    try:
        ptr = buf.ptr
        before = cm.memory_stats().by_kind
        cm.copy_async(other, buf, stream=stream)
        buf.close()
        buf.close()  # again: nothing
        if hasattr(buf, "free"):
            buf.free()  # after a deferred close: nothing
        assert ptr in live_keys() and cm.memory_stats().by_kind == before
        again = (pool.allocate(4096, stream=stream) if hasattr(buf, "free")
                 else cm.HostBuffer.pooled(4096, pool=pool))
        assert again.ptr != ptr  # not lent again under the copy
        again.close()
        copies_in_flight()
        stream.synchronize()
        assert ptr not in live_keys()
        del buf
        gc.collect()
        assert ptr not in live_keys()
    finally:
        other.close()
        stream.synchronize()
        pool.close()


def test_a_deferred_pool_buffer_whose_stream_closed_first(
        copies_in_flight: Callable[[], None]) -> None:
    """The allocation stream is closed before the copy is reaped: freed once, after it."""
    pool = cm.MemoryPool(0, cache=True)
    other = cm.HostBuffer.empty(4096)
    try:
        s = cm.Stream()
        buf = pool.allocate(4096, stream=s)
        ptr = buf.ptr
        cm.copy_async(buf, other, stream=s)
        buf.close()
        s.close()
        assert ptr in live_keys()
        copies_in_flight()
        _inflight.wait_pending()
        assert ptr not in live_keys() and pool.stats().used_current == 0
    finally:
        other.close()
        pool.close()


def test_an_export_dropped_under_the_copy_then_the_copy_ends(
        stream: cm.Stream, copies_in_flight: Callable[[], None]) -> None:
    """close() with a view alive, the view dropped while the copy runs: one release, after
    the copy (the Exports record hands it to the copy's stand-in)."""
    h = cm.HostBuffer.pooled(4096)
    d = cm.DeviceBuffer.empty(4096)
    try:
        ptr = h.ptr
        view = h.array
        cm.copy_async(d, h, stream=stream)
        h.close()
        with pytest.raises(cm.ClosedError):
            h.array  # noqa: B018  (no new export of a closed buffer, so no second release)
        del view
        gc.collect()
        assert ptr in live_keys()
        copies_in_flight()
        stream.synchronize()
        assert ptr not in live_keys()
        again = cm.HostBuffer.pooled(4096)  # the block went back to the cache once
        assert _inflight.pending_count() == 0
        again.close()
    finally:
        d.close()


def test_close_on_a_thread_without_a_context_and_the_reap_on_another(
        stream: cm.Stream, copies_in_flight: Callable[[], None]) -> None:
    bufs = [cm.HostBuffer.pooled(4096), cm.DeviceBuffer.empty(4096),
            cm.MemoryPool.default(0).allocate(4096, stream=stream)]
    other = cm.HostBuffer.empty(4096)
    d = cm.DeviceBuffer.empty(4096)
    try:
        ptrs = [b.ptr for b in bufs]
        for b in bufs:
            cm.copy_async(d if b is bufs[0] else other, b, stream=stream)
        errors: list[BaseException] = []

        def close_all() -> None:
            try:
                for b in bufs:
                    b.close()
            except BaseException as exc:  # reported by the assertion below
                errors.append(exc)

        t = threading.Thread(target=close_all)
        t.start()
        t.join()
        assert not errors and all(p in live_keys() for p in ptrs)
        copies_in_flight()
        t = threading.Thread(target=_inflight.reap_pending)
        t.start()
        t.join()
        assert not any(p in live_keys() for p in ptrs)
    finally:
        other.close()
        d.close()


def test_track_records_one_free_after_the_copy(
        stream: cm.Stream, copies_in_flight: Callable[[], None]) -> None:
    d = cm.DeviceBuffer.empty(4096)
    try:
        with cm.track() as t:
            h = cm.HostBuffer.pooled(4096)
            ptr = h.ptr
            cm.copy_async(d, h, stream=stream)
            h.close()
            assert [e.action for e in t.events() if e.address == ptr] == ["alloc"]
            copies_in_flight()
            stream.synchronize()
        assert [e.action for e in t.events() if e.address == ptr] == ["alloc", "free"]
    finally:
        d.close()


def test_copy_batch_descriptors_outlive_close_until_the_launch_ran(
        stream: cm.Stream, copies_in_flight: Callable[[], None]) -> None:
    h = cm.HostBuffer.zeros(8 * 4096)
    d = cm.DeviceBuffer.zeros(8 * 4096)
    try:
        b = cm.CopyBatch()
        b.add(d, h, dst_offsets=np.arange(8)[::-1] * 4096, src_offsets=np.arange(8) * 4096,
              sizes=4096)
        b.execute(stream=stream, method="kernel")
        desc = b._memo.resident.buf.ptr
        b.close()
        assert desc in live_keys()
        copies_in_flight()
        stream.synchronize()
        assert desc not in live_keys()
    finally:
        h.close()
        d.close()


def test_exit_with_a_buffer_closed_under_a_running_copy_is_quiet(tmp_path: Path) -> None:
    """At interpreter exit the copy's stand-in and the pooled buffer are collected after
    module teardown: neither may print "Exception ignored" (sys and the ledger are None)."""
    script = tmp_path / "exit_under_copy.py"
    script.write_text(textwrap.dedent("""
        import cuda_memkit as cm
        from cuda_memkit._core import _inflight

        _inflight._event_done = lambda ev: False   # still running at exit
        s = cm.Stream()
        d = cm.DeviceBuffer.empty(4096)
        h = cm.HostBuffer.pooled(4096)
        cm.copy_async(d, h, stream=s)
        h.close()
    """))
    proc = run_script(script, CUDA_MEMKIT_BACKEND="sim")
    assert proc.returncode == 0, proc.stderr
    assert "Exception ignored" not in proc.stderr, proc.stderr


@pytest.mark.uses_managed_memory
@pytest.mark.parametrize(("kind", "how"), [
    *[("ManagedBuffer", h) for h in ("prefetch", "discard", "discard_and_prefetch", "hints",
                                     "hints discard", "plan")],
    ("managed PoolBuffer", "plan")])
def test_a_queued_prefetch_or_discard_holds_its_buffer_like_a_copy(
        how: str, kind: str, stream: cm.Stream, copies_in_flight: Callable[[], None]) -> None:
    """A managed pool buffer closed on its own stream after a prefetch queued on another
    would be freed under the migration: prefetches, discards and plans hold their
    buffers until their stream ran them, as copies do."""
    pool = cm.MemoryPool(managed=True) if kind != "ManagedBuffer" else None
    with cm.Stream() as other:
        buf: Any = (cm.ManagedBuffer.zeros(1 << 16) if pool is None
                    else pool.allocate(1 << 16, stream=other))
        try:
            ptr = buf.ptr
            if how == "plan":
                cm.PrefetchPlan().add(buf, 0).execute(stream)
            elif how.startswith("hints"):
                hints = cm.ManagedMemoryHints.for_buffer(buf)
                if how == "hints":
                    hints.prefetch_to(0, stream)
                else:
                    hints.discard(stream)
                del hints
            elif how == "prefetch":
                buf.prefetch(0, stream=stream)
            elif how == "discard":
                buf.discard(stream=stream)
            else:
                buf.discard_and_prefetch(0, stream=stream)
            buf.close()
            released_after_the_copy(ptr, stream, copies_in_flight)
        finally:
            copies_in_flight()
            stream.synchronize()
            other.synchronize()
            if pool is not None:
                pool.close()
