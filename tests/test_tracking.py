"""track(): events of every kind, live allocations, summaries, timelines, JSON, plots, threads.

Tracking must never change what an allocation does, and a failure inside it
must never lose or leak memory: both are tested by breaking the tracker on
purpose.
"""

from __future__ import annotations

import gc
import json
import pathlib
import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit._core import _resource
from cuda_memkit._observability import _observe, _tracking

MiB = 1 << 20
HERE = pathlib.Path(__file__).resolve()


def _line() -> int:
    """The caller's line number."""
    return sys._getframe(1).f_lineno


@pytest.fixture(scope="module", autouse=True)
def _default_pinned() -> None:
    """Make the process-wide pinned pool (and its stream) before the leak check's snapshots."""
    cm.HostBuffer.pooled(1).close()
    cm.MemoryPool.default_pinned().trim()


@pytest.fixture(autouse=True)
def _no_tracker_left() -> Iterator[None]:
    before = list(_resource.watchers)
    yield
    gc.collect()
    cm.MemoryPool.default_pinned().trim()
    assert _resource.watchers == before, "a tracker was left installed"


def _mine(events: list[cm.MemoryEvent]) -> list[cm.MemoryEvent]:
    """Events whose site is this file (or frees, which have none)."""
    return [e for e in events if e.site is None or pathlib.Path(e.site.file) == HERE]


@pytest.mark.uses_managed_memory
def test_every_kind_is_recorded_with_its_details(stream: cm.Stream) -> None:
    g = cm.granularity(0)
    pool = cm.MemoryPool.default(0)
    with cm.track() as t:
        line = _line() + 1
        d = cm.DeviceBuffer.empty(3 * MiB + 1)
        p = pool.allocate(12345, stream=stream)
        m = cm.ManagedBuffer.empty(8192)
        h = cm.HostBuffer.empty(1000)
        hp = cm.HostBuffer.pooled(3000)
        r = cm.register_host(np.zeros(16384, np.uint8))
        phys = cm.PhysicalMemory.create(g)
        rng = cm.AddressRange.reserve(2 * g)
        mp = rng.map(phys)
        ptrs = {"device": d.ptr, "pool": p.ptr, "managed": m.ptr, "pinned": h.ptr,
                "pinned_pooled": hp.ptr, "vmm_physical": phys.handle, "vmm_mapped": mp.ptr}
        for o in (d, m, h, hp, r, mp, rng, phys):
            o.close()
        p.free()
        stream.synchronize()
    ev = t.events()
    allocs = [e for e in ev if e.action == "alloc"]
    assert [(e.kind, e.nbytes) for e in allocs] == [
        ("device", 3 * MiB + 1), ("pool", 12345), ("managed", 8192), ("pinned", 1000),
        ("pinned_pooled", 3000), ("registered", 16384), ("vmm_physical", g), ("vmm_mapped", g)]
    assert [e.site.line for e in allocs if e.site] == [line, line + 1, line + 2, line + 3,
                                                       line + 4, line + 5, line + 6, line + 8]
    assert all(e.site is not None and pathlib.Path(e.site.file) == HERE for e in allocs)
    assert all(e.site.function == "test_every_kind_is_recorded_with_its_details"
               for e in allocs if e.site)
    frees = [e for e in ev if e.action == "free"]
    assert sorted((e.kind, e.nbytes) for e in frees) == sorted((e.kind, e.nbytes) for e in allocs)
    assert all(e.site is None and e.stack is None for e in frees)
    by_kind = {e.kind: e for e in allocs}
    assert {k: e.address for k, e in by_kind.items() if k in ptrs} == ptrs
    assert by_kind["device"].device == 0 and by_kind["vmm_physical"].device == 0
    assert by_kind["pinned"].device is None and by_kind["pinned_pooled"].device is None
    assert by_kind["pool"].pool == pool.handle and by_kind["pool"].stream == stream.handle
    assert by_kind["device"].stream is None
    assert all(e.thread == threading.get_ident() for e in ev)
    times = [e.time for e in ev]
    assert times == sorted(times) and 0 <= times[0] and times[-1] <= t.duration
    assert t.live() == []


def test_summary_finds_the_leak() -> None:
    kept = []
    with cm.track() as t:
        for i in range(20):
            with cm.DeviceBuffer.empty(1000 + i):
                pass
            if i % 5 == 0:
                leak_line = _line() + 1
                kept.append(cm.HostBuffer.pooled(4096))
            cm.HostBuffer.pooled(100).close()
    live = t.live()
    assert [(a.kind, a.nbytes) for a in live] == [("pinned_pooled", 4096)] * 4
    assert all(a.site is not None and a.site.line == leak_line for a in live)
    assert [a.address for a in live] == [b.ptr for b in kept]
    s = t.summary()
    top = s.sites[0]
    assert top.site is not None and top.site.line == leak_line
    assert (top.live, top.live_bytes, top.allocations, top.kinds) == (4, 4 * 4096, 4,
                                                                       ("pinned_pooled",))
    assert all(x.live == 0 for x in s.sites[1:])
    kinds = {k.kind: k for k in s.kinds}
    assert (kinds["device"].allocations, kinds["device"].frees) == (20, 20)
    assert kinds["device"].allocated_bytes == sum(1000 + i for i in range(20))
    assert kinds["device"].live == 0 and kinds["device"].peak_bytes >= 1019
    pp = kinds["pinned_pooled"]
    assert (pp.allocations, pp.frees, pp.live, pp.live_bytes) == (24, 20, 4, 4 * 4096)
    assert pp.end_bytes - pp.start_bytes == 4 * 4096
    text = str(s)
    assert f"test_tracking.py:{leak_line} in test_summary_finds_the_leak" in text
    assert text.splitlines()[0].startswith("cuda_memkit tracking summary")
    for b in kept:
        b.close()


def test_timeline_follows_the_ledger() -> None:
    """threads="all": each kind's timeline is what the ledger held, event by event."""
    seen: list[int] = []
    with cm.track() as t:
        start = cm.memory_stats().by_kind["device"].current
        bufs = []
        for n in (1, 2, 3):
            bufs.append(cm.DeviceBuffer.empty(n * MiB))
            seen.append(cm.memory_stats().by_kind["device"].current)
        for b in bufs:
            b.close()
            seen.append(cm.memory_stats().by_kind["device"].current)
    tl = t.timeline()["device"]
    assert tl.nbytes[0] == start == t.baseline["device"]
    assert list(tl.nbytes[1:-1]) == seen
    assert tl.peak == start + 6 * MiB and tl.nbytes[tl.times.index(tl.peak_time)] == tl.peak
    assert tl.times[0] == 0.0 and tl.times[-1] == pytest.approx(t.duration)
    assert list(tl.times) == sorted(tl.times)
    assert set(t.timeline()) == {"device"}


def test_stacks_start_at_the_caller() -> None:
    def helper() -> cm.DeviceBuffer:
        return cm.DeviceBuffer.empty(64)

    with cm.track(stacks=True) as t:
        helper().close()
        cm.MemoryPool.default(0).allocate(64, stream=None).free()
    with cm.track() as plain:
        cm.DeviceBuffer.empty(64).close()
    a, b = [e for e in t.events() if e.action == "alloc"]
    assert a.stack is not None and b.stack is not None
    assert a.stack[-1] == a.site and a.site.function == "helper"
    assert a.stack[-2].function == "test_stacks_start_at_the_caller"
    assert b.stack[-1].function == "test_stacks_start_at_the_caller"
    for e in (a, b):
        assert not e.stack[-1].file.startswith(_observe.PACKAGE_DIR)
        assert all(isinstance(f, cm.Frame) for f in e.stack)
        assert len(e.stack) <= _observe.MAX_FRAMES
    assert all(e.stack is None for e in plain.events())
    assert plain.events()[0].site is not None
    assert "line" in "\n".join(_observe.format_stack(a.stack))


def test_nested_trackers_each_see_their_window() -> None:
    with cm.track() as outer:
        cm.DeviceBuffer.empty(100).close()
        with cm.track(stacks=True) as inner:
            cm.DeviceBuffer.empty(200).close()
        cm.DeviceBuffer.empty(300).close()
    assert [e.nbytes for e in outer.events() if e.action == "alloc"] == [100, 200, 300]
    assert [e.nbytes for e in inner.events() if e.action == "alloc"] == [200]
    assert all(e.stack is None for e in outer.events())  # stacks are per tracker
    assert inner.events()[0].stack is not None


def test_reentering_a_tracker_is_refused() -> None:
    t = cm.track()
    assert "not started" in repr(t) and not t.active and t.duration == 0.0
    with t:
        assert t.active and "recording" in repr(t)
        with pytest.raises(RuntimeError, match="already recording"), t:
            pass
        assert t.active  # the refused entry changed nothing
        cm.DeviceBuffer.empty(10).close()
    assert not t.active and "stopped" in repr(t)
    with pytest.raises(RuntimeError, match="finished recording"), t:
        pass
    with pytest.raises(RuntimeError, match="not recording"):
        t.stop()
    assert len(t.events()) == 2
    assert t not in _tracking.active_trackers()


def test_start_and_stop_without_with() -> None:
    t = cm.track().start()
    try:
        cm.DeviceBuffer.empty(10).close()
    finally:
        t.stop()
    assert [e.action for e in t.events()] == ["alloc", "free"]


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="stacks"):
        cm.track(stacks="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'all' or 'current'"):
        cm.track(threads="mine")
    with pytest.raises(TypeError, match="threads"):
        cm.track(threads=1)  # type: ignore[arg-type]


def _in_thread(fn: Any) -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # reported below
            errors.append(exc)

    th = threading.Thread(target=run)
    th.start()
    th.join(timeout=30)
    assert not th.is_alive() and not errors, errors


def test_threads_current_and_all() -> None:
    other: list[Any] = []
    with cm.track(threads="current") as mine, cm.track() as every:
        own = cm.DeviceBuffer.empty(111)
        _in_thread(lambda: other.append(cm.DeviceBuffer.empty(222)))
        _in_thread(own.close)  # my allocation, freed on another thread
        _in_thread(lambda: other.pop().close())
    assert [(e.action, e.nbytes) for e in mine.events()] == [("alloc", 111), ("free", 111)]
    assert [(e.action, e.nbytes) for e in every.events()] == [
        ("alloc", 111), ("alloc", 222), ("free", 111), ("free", 222)]
    me = threading.get_ident()
    ev = every.events()
    assert ev[0].thread == me and ev[1].thread != me and ev[2].thread != me


def test_many_threads_all_recorded() -> None:
    pool = cm.MemoryPool.default(0)

    def work() -> None:
        with cm.Stream() as s:
            for _ in range(200):
                pool.allocate(64, stream=s).free()
            s.synchronize()

    with cm.track() as t:
        threads = [threading.Thread(target=work) for _ in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=60)
    assert not any(th.is_alive() for th in threads)
    ev = t.events()
    assert sum(e.action == "alloc" for e in ev) == sum(e.action == "free" for e in ev) == 1200
    assert threading.get_ident() not in {e.thread for e in ev} and t.live() == []


def test_growable_resizes() -> None:
    g = cm.granularity(0)
    before = cm.GrowableBuffer(8 * g)
    with cm.track() as t:
        before.resize(g)  # made before tracking: growth, not an allocation
        buf = cm.GrowableBuffer(8 * g)
        buf.resize(3 * g)
        buf.resize(g)
        live = t.live()
        buf.close()
        before.close()
    acts = [(e.action, e.nbytes, e.address) for e in t.events()]
    # shrinking unmaps (and tells the ledger) one chunk at a time
    assert acts == [("grow", g, before_ptr(t, 0)), ("alloc", 0, acts[1][2]),
                    ("grow", 3 * g, acts[1][2]), ("shrink", g, acts[1][2]),
                    ("shrink", g, acts[1][2]), ("free", g, acts[1][2]),
                    ("free", g, before_ptr(t, 0))]
    assert [(a.kind, a.nbytes) for a in live] == [("growable", g)]
    k = {x.kind: x for x in t.summary().kinds}["growable"]
    assert (k.allocations, k.frees, k.allocated_bytes, k.freed_bytes) == (1, 2, 4 * g, 4 * g)
    assert t.timeline()["growable"].peak == t.baseline["growable"] + 4 * g


def before_ptr(t: cm.Tracker, i: int) -> int:
    return t.events()[i].address


def test_garbage_collected_memory_is_a_free() -> None:
    with cm.track() as t:
        buf = cm.MemoryPool.default(0).allocate(4096, stream=None)
        addr = buf.ptr
        del buf
        gc.collect()
    assert [(e.action, e.address) for e in t.events()] == [("alloc", addr), ("free", addr)]
    assert t.live() == []


def test_save_writes_the_documented_schema(tmp_path: pathlib.Path) -> None:
    with cm.track(stacks=True) as t:
        kept = cm.DeviceBuffer.empty(2048)
        cm.HostBuffer.pooled(64).close()
    path = tmp_path / "track.json"
    t.save(path)
    data = json.loads(path.read_text())
    assert data["schema"] == "cuda_memkit.track/1"
    assert set(data) == {"schema", "backend", "started_at", "duration", "stacks", "threads",
                         "baseline", "events", "live", "summary", "errors"}
    assert data["backend"] == cm.backend_name() and data["stacks"] is True
    assert set(data["baseline"]) == set(cm.MEMORY_KINDS)
    assert [e["action"] for e in data["events"]] == ["alloc", "alloc", "free"]
    e0 = data["events"][0]
    assert set(e0) == {"time", "action", "kind", "device", "pool", "address", "nbytes",
                       "stream", "thread", "site", "stack"}
    assert e0["kind"] == "device" and e0["nbytes"] == 2048 and e0["address"] == kept.ptr
    assert e0["site"][0] == str(HERE) and e0["stack"][-1] == e0["site"]
    assert [a["address"] for a in data["live"]] == [kept.ptr]
    assert data["summary"]["sites"][0]["live_bytes"] == 2048 and data["errors"] == []
    t.save(str(tmp_path / "again.json"))
    kept.close()


def test_save_errors(tmp_path: pathlib.Path) -> None:
    with cm.track() as t:
        pass
    target = tmp_path / "missing-dir" / "t.json"
    with pytest.raises(OSError, match=r"cannot save the tracking record to .*missing-dir"):
        t.save(target)
    assert not target.exists()
    with pytest.raises(TypeError, match="path"):
        t.save(42)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(OSError, match="cannot save"):
        t.save(blocker / "x.json")


def test_plot(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("matplotlib")
    with cm.track() as t:
        with cm.DeviceBuffer.empty(3 * MiB):
            cm.HostBuffer.pooled(4096).close()
    fig = t.plot(tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [ax.get_ylabel() for ax in fig.axes] == ["device\n(MiB)", "pinned_pooled\n(KiB)"]
    labels = [line.get_label() for ax in fig.axes for line in ax.get_lines()]
    tl = t.timeline()
    assert f"device (peak {_observe.format_bytes(tl['device'].peak)})" in labels
    assert f"pinned_pooled (peak {_observe.format_bytes(tl['pinned_pooled'].peak)})" in labels
    assert tl["device"].peak == t.baseline["device"] + 3 * MiB
    peak_marker = fig.axes[0].get_lines()[1]
    assert list(peak_marker.get_ydata()) == [tl["device"].peak / MiB]
    only = t.plot(tmp_path / "one.png", kinds="pinned_pooled")
    assert [ax.get_ylabel() for ax in only.axes] == ["pinned_pooled\n(KiB)"]
    with pytest.raises(ValueError, match="unknown memory kind"):
        t.plot(kinds=["gpu"])
    with cm.track() as empty:
        pass
    empty.plot(tmp_path / "empty.png")
    with pytest.raises(OSError, match="cannot save the plot"):
        t.plot(tmp_path / "nowhere" / "t.png")


def test_plot_without_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    with cm.track() as t:
        pass
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"needs matplotlib.*pip install matplotlib"):
        t.plot()


def test_a_failure_inside_tracking_loses_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(f: Any) -> Any:
        raise RuntimeError("stack capture broke")

    monkeypatch.setattr(_tracking, "capture_stack", broken)
    before = cm.memory_stats()
    with pytest.warns(cm.MemkitWarning, match=r"2 event.*stack capture broke"):
        with cm.track(stacks=True) as t, cm.track() as healthy:
            bufs = [cm.DeviceBuffer.empty(1000), cm.HostBuffer.pooled(500)]
            mid = cm.memory_stats()
            for b in bufs:
                b.close()
    assert mid.by_kind["device"].current - before.by_kind["device"].current == 1000
    assert mid.by_kind["pinned_pooled"].current - before.by_kind["pinned_pooled"].current == 500
    assert cm.memory_stats().current == before.current
    assert len(t.errors) == 2 and "broke" in str(t.errors[0])
    # events were still recorded (a failed stack capture only loses the stacks)
    assert [e.action for e in healthy.events()] == ["alloc", "alloc", "free", "free"]


def test_a_broken_tracker_does_not_affect_others_or_allocations() -> None:
    with cm.track() as good:
        bad = cm.track().start()

        def explode(*args: object) -> None:
            raise ValueError("tracker bug")

        bad._on = explode  # type: ignore[method-assign]
        buf = cm.DeviceBuffer.empty(777)
        assert buf.nbytes == 777 and not buf.closed
        buf.close()
        with pytest.warns(cm.MemkitWarning, match="tracker bug"):
            bad.stop()
    assert [(e.action, e.nbytes) for e in good.events()] == [("alloc", 777), ("free", 777)]


def test_tracking_does_not_change_allocations() -> None:
    huge = 1 << 50
    with pytest.raises(cm.CudaOutOfMemoryError) as plain:
        cm.DeviceBuffer.empty(huge)
    with cm.track(stacks=True) as t:
        with pytest.raises(cm.CudaOutOfMemoryError) as tracked:
            cm.DeviceBuffer.empty(huge)
        with pytest.raises(ValueError):
            cm.DeviceBuffer.empty(-1)
        b = cm.DeviceBuffer.empty(10)
        assert type(b) is cm.DeviceBuffer and b.nbytes == 10
        b.close()
    assert str(plain.value) == str(tracked.value)
    assert [e.action for e in t.events()] == ["alloc", "free"]  # failed calls: no event


def test_reprs() -> None:
    with cm.track() as t:
        b = cm.DeviceBuffer.empty(4096)
    ev = t.events()[0]
    assert "alloc 4.00 KiB device on device 0" in repr(ev)
    (a,) = t.live()
    assert "4.00 KiB device on device 0" in repr(a)
    assert a.describe().startswith("4.00 KiB (4096 bytes) of device on device 0")
    assert json.dumps(a.to_dict()) and json.dumps(ev.to_dict())
    assert str(ev.site).startswith(str(HERE)) and " in test_reprs" in str(ev.site)
    b.close()
    assert _observe.format_bytes(0) == "0 B" and _observe.format_bytes(3 << 30) == "3.00 GiB"
    assert _observe.format_bytes(1536) == "1.50 KiB" and _observe.format_bytes(100 << 20) == \
        "100.0 MiB"
