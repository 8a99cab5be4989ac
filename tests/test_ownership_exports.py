"""close() under a copy in flight, when the copy was given a view or an export of the buffer.

The copy machinery holds the release of the memory's owner whatever object named the
memory: the buffer itself, a numpy view of it (or a sub-view), an ``as_array()`` view, a
DLPack consumer, or, for registered host memory, the registered array. Every kind, every
path that queues work on a stream (``copy_async``, ``copy_batch`` by the driver and by
the kernel, ``CopyBatch.execute``, ``PrefetchPlan.execute``), and ``GrowableBuffer``
shrinking under a copy of its view. Copies are held "running" by ``copies_in_flight``.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit._core import _driver, _inflight, _operands, _resource

pytestmark = pytest.mark.usefixtures("default_pinned", "flush_pinned")

N = 8192  # bytes per buffer: two blocks of 4096 for the batch paths


def live_keys() -> set[int]:
    return {int(key) for _a, key, _n in _resource.live_allocations()}  # type: ignore[call-overload]


class DLPackConsumer:
    """What a framework keeps of a DLPack export (CuPy, torch): the capsule and the address."""

    def __init__(self, buf: Any) -> None:
        self.capsule = buf.__dlpack__()
        self.__cuda_array_interface__ = dict(buf.__cuda_array_interface__)


# kind -> (factory(stream) -> (buffer, extra objects to close after it), host memory?)
def _pool(stream: cm.Stream, closers: list[Any], **kw: Any) -> Any:
    pool = cm.MemoryPool(**kw)
    closers.append(pool)
    return pool.allocate(N, stream=stream)


def _growable(stream: cm.Stream, closers: list[Any]) -> Any:
    g = cm.granularity(0)
    buf = cm.GrowableBuffer(4 * g, chunk=g)
    buf.resize(N)
    return buf


def _mapping(stream: cm.Stream, closers: list[Any]) -> Any:
    g = cm.granularity(0)
    vr, pm = cm.AddressRange.reserve(g), cm.PhysicalMemory.create(g)
    closers += [pm, vr]
    m = vr.map(pm)
    m.set_access(0, cm.Access.READWRITE)
    return m


def _registered(stream: cm.Stream, closers: list[Any]) -> Any:
    return cm.register_host(np.zeros(N, np.uint8))


MAKERS: dict[str, Callable[[cm.Stream, list[Any]], Any]] = {
    "HostBuffer": lambda s, c: cm.HostBuffer.empty(N),
    "HostBuffer.pooled": lambda s, c: cm.HostBuffer.pooled(N),
    "RegisteredHost": _registered,
    "DeviceBuffer": lambda s, c: cm.DeviceBuffer.empty(N),
    "ManagedBuffer": lambda s, c: cm.ManagedBuffer.zeros(N),
    "PoolBuffer": lambda s, c: _pool(s, c, device=0),
    "PoolBuffer.cached": lambda s, c: _pool(s, c, device=0, cache=True),
    "host PoolBuffer": lambda s, c: _pool(s, c, location=cm.Location.host()),
    "host PoolBuffer.cached": lambda s, c: _pool(s, c, location=cm.Location.host(),
                                                 cache=True),
    "managed PoolBuffer": lambda s, c: _pool(s, c, managed=True),
    "GrowableBuffer": _growable,
    "Mapping": _mapping,
}
HOST = {"HostBuffer", "HostBuffer.pooled", "RegisteredHost"}
HOST_VISIBLE = HOST | {"ManagedBuffer", "host PoolBuffer", "host PoolBuffer.cached",
                       "managed PoolBuffer"}
DLPACK = {"DeviceBuffer", "ManagedBuffer", "PoolBuffer", "PoolBuffer.cached",
          "managed PoolBuffer", "GrowableBuffer", "Mapping"}


def _exports(kind: str) -> list[str]:
    out = []
    if kind not in HOST:
        out.append("as_array")
    if kind in HOST_VISIBLE:
        out += ["numpy view", "numpy sub-view"]
    if kind == "RegisteredHost":
        out.append("the registered array")
    if kind in DLPACK:
        out.append("DLPack consumer")
    if kind == "ManagedBuffer":
        out.append("np.from_dlpack")
    return out


def _export(kind: str, how: str, buf: Any, array: Any) -> Any:
    if how == "as_array":
        return buf.as_array(np.uint8)
    if how == "numpy view":
        return np.asarray(buf).view(np.uint8)
    if how == "numpy sub-view":
        return np.asarray(buf).view(np.uint8)[:N // 2]
    if how == "the registered array":
        return array
    if how == "DLPack consumer":
        return DLPackConsumer(buf)
    assert how == "np.from_dlpack"
    return np.from_dlpack(buf).view(np.uint8)


PATHS = ["copy_async source", "copy_async destination", "copy_batch driver",
         "copy_batch kernel", "CopyBatch"]
#: The paths that write the export (the others read it).
WRITES = {"copy_async destination", "CopyBatch"}
CASES = [pytest.param(k, e, marks=[pytest.mark.uses_managed_memory] if "anaged" in k else [],
                      id=f"{k}-{e}") for k in MAKERS for e in _exports(k)]


def _issue(path: str, export: Any, other: Any, stream: cm.Stream, held: list[Any]) -> None:
    n = min(N, int(_operands.operand(export, False).nbytes))  # type: ignore[arg-type]
    if path == "copy_async source":
        cm.copy_async(other, export, nbytes=n, stream=stream)
    elif path == "copy_async destination":
        cm.copy_async(export, other, nbytes=n, stream=stream)
    elif path.startswith("copy_batch"):
        cm.copy_batch(other, export, dst_offsets=[0, n // 2], src_offsets=[n // 2, 0],
                      sizes=n // 2, stream=stream, method=path.split()[1].replace(
                          "kernel", "auto"))
    else:
        b = cm.CopyBatch().add(export, other, dst_offsets=[n // 2, 0],
                               src_offsets=[0, n // 2], sizes=n // 2)
        b.execute(stream=stream)
        held.append(b)


@pytest.fixture
def closers() -> Iterator[list[Any]]:
    out: list[Any] = []
    yield out
    for obj in out:
        obj.close()


def _close_under_one_copy(kind: str, how: str, path: str, stream: cm.Stream,
                          finish: Callable[[], None]) -> None:
    closers: list[Any] = []
    buf = MAKERS[kind](stream, closers)
    array = buf.array if kind == "RegisteredHost" else None
    other = cm.DeviceBuffer.zeros(N) if kind in HOST else cm.HostBuffer.zeros(N)
    held: list[Any] = []
    running = _inflight.pending_count()
    try:
        ptr = buf.ptr
        export = _export(kind, how, buf, array)
        _issue(path, export, other, stream, held)
        assert _inflight.pending_count() == running + 1, "the copy is not held as running"
        del export
        buf.close()
        assert buf.closed and ptr in live_keys(), f"{path}: released under the copy"
        if hasattr(buf, "free"):  # a pool: the next block of that size on that stream
            again = closers[0].allocate(N, stream=stream)
            assert again.ptr != ptr, f"{path}: lent again under the copy"
            again.close()
        finish()
        stream.synchronize()
        for b in held:
            b.close()
        held.clear()
        assert ptr not in live_keys(), f"{path}: not released after the copy"
    finally:
        finish()
        stream.synchronize()
        for b in held:
            b.close()
        other.close()
        buf.close()
        for obj in closers:
            obj.close()


@pytest.mark.parametrize(("kind", "how"), CASES)
def test_close_under_a_copy_of_an_export_releases_after_it(
        kind: str, how: str, stream: cm.Stream, monkeypatch: pytest.MonkeyPatch) -> None:
    """On every path: the export is the copy's operand, dropped by the caller after issuing
    (the copy holds it), then the owner is closed: its memory stays allocated (in the
    ledger, not lent again) until the copy is done, then goes once."""
    running = [True]
    done = _inflight._event_done
    monkeypatch.setattr(_inflight, "_event_done", lambda ev: not running[0] and done(ev))
    for path in PATHS:
        if how == "np.from_dlpack" and path in WRITES:
            continue  # numpy's DLPack arrays are read-only
        running[0] = True
        _close_under_one_copy(kind, how, path, stream, lambda: running.__setitem__(0, False))


@pytest.mark.parametrize("kind", ["DeviceBuffer", "PoolBuffer.cached", "GrowableBuffer",
                                  "Mapping", "RegisteredHost"])
def test_an_export_the_caller_keeps_does_not_change_the_wait(
        kind: str, stream: cm.Stream, closers: list[Any],
        copies_in_flight: Callable[[], None]) -> None:
    """The review's case: the caller still holds the view (``v = pb.as_array(); copy_async(v,
    ...); pb.close()``); the memory goes after the copy even though ``v`` lives on."""
    buf = MAKERS[kind](stream, closers)
    array = buf.array if kind == "RegisteredHost" else None
    other = cm.DeviceBuffer.zeros(N) if kind in HOST else cm.HostBuffer.zeros(N)
    try:
        ptr = buf.ptr
        view = array if kind == "RegisteredHost" else buf.as_array(np.uint8)
        cm.copy_async(view, other, nbytes=N, stream=stream)
        buf.close()
        assert ptr in live_keys()
        copies_in_flight()
        stream.synchronize()
        assert ptr not in live_keys()
        if kind != "RegisteredHost":
            with pytest.raises(cm.ClosedError):
                cm.copy_async(view, other, nbytes=N, stream=stream)
        del view
    finally:
        copies_in_flight()
        stream.synchronize()
        other.close()


@pytest.mark.uses_managed_memory
@pytest.mark.parametrize("kind", ["ManagedBuffer", "managed PoolBuffer"])
def test_a_plan_prefetching_a_view_holds_its_owner(
        kind: str, stream: cm.Stream, closers: list[Any],
        copies_in_flight: Callable[[], None]) -> None:
    buf = MAKERS[kind](stream, closers)
    try:
        ptr = buf.ptr
        plan = cm.PrefetchPlan().add(buf.as_array(np.uint8), cm.Location.device(0))
        plan.execute(stream)
        buf.close()
        assert ptr in live_keys()
        with pytest.raises(cm.ClosedError):
            plan.execute(stream)  # the view's owner is closed: refused, never prefetched
        copies_in_flight()
        stream.synchronize()
        del plan
        gc.collect()
        assert ptr not in live_keys()
    finally:
        copies_in_flight()
        stream.synchronize()


def test_shrinking_a_growable_buffer_waits_for_copies_of_its_view(
        stream: cm.Stream, copies_in_flight: Callable[[], None],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """resize() down unmaps the tail: a copy still writing it through an ``as_array()``
    view is waited for first (on its event), as one through the buffer itself is."""
    from ._helpers import call_order

    g = cm.granularity(0)
    buf = cm.GrowableBuffer(4 * g, chunk=g)
    host = cm.HostBuffer.empty(2 * g)
    try:
        buf.resize(2 * g)
        cm.copy_async(buf.as_array(np.uint8), host, stream=stream)
        with call_order(monkeypatch) as order:
            buf.resize(g)
        assert "cuEventSynchronize" in order and "cuMemUnmap" in order
        assert order.index("cuEventSynchronize") < order.index("cuMemUnmap")
    finally:
        copies_in_flight()
        stream.synchronize()
        buf.close()
        host.close()


def test_a_copy_of_an_unrelated_array_holds_no_owner(
        stream: cm.Stream, copies_in_flight: Callable[[], None]) -> None:
    """Owners are found exactly: a registration elsewhere, or a buffer at another address,
    is not held by a copy of a plain array (its close() is not deferred)."""
    reg = cm.register_host(np.zeros(N, np.uint8))
    plain = cm.register_host(np.zeros(N, np.uint8))
    dev = cm.DeviceBuffer.zeros(N)
    try:
        cm.copy_async(dev, plain.array, stream=stream)
        ptr = reg.ptr
        reg.close()
        assert ptr not in live_keys()
        assert _inflight.pending_count() == 1
    finally:
        copies_in_flight()
        stream.synchronize()
        plain.close()
        dev.close()


def test_a_registered_array_copied_again_after_close_waits_for_both_copies(
        stream: cm.Stream, monkeypatch: pytest.MonkeyPatch) -> None:
    """The array outlives its registration object: a copy of it issued after ``close()``
    (still registered: the unregistration waits for the first copy) holds the
    unregistration too, which happens once the last of the copies has finished."""
    array = np.zeros(N, np.uint8)
    reg = cm.register_host(array)
    dev = cm.DeviceBuffer.zeros(N)
    running: set[Any] = set()
    done = _inflight._event_done
    monkeypatch.setattr(_inflight, "_event_done", lambda ev: ev not in running and done(ev))
    real_keep = _inflight.keep_alive

    def keep(stream_: int, refs: tuple[Any, ...]) -> None:  # every new copy starts running
        real_record = _driver.call

        def record(api: str, *args: Any) -> Any:
            out = real_record(api, *args)
            if api == "cuEventCreate":
                running.add(out)
            return out

        with monkeypatch.context() as m:
            m.setattr(_driver, "call", record)
            real_keep(stream_, refs)

    monkeypatch.setattr(_inflight, "keep_alive", keep)
    import cuda_memkit._transfer._transfers as transfers
    monkeypatch.setattr(transfers, "keep_alive", keep)
    try:
        ptr = reg.ptr
        cm.copy_async(dev, array, stream=stream)
        first = set(running)
        reg.close()
        assert ptr in live_keys()
        cm.copy_async(dev, array, stream=stream)  # registered still: a second copy
        running.difference_update(first)  # the first copy ends
        _inflight.reap_pending()
        assert ptr in live_keys(), "unregistered under the second copy"
        running.clear()
        stream.synchronize()
        assert ptr not in live_keys()
    finally:
        running.clear()
        stream.synchronize()
        dev.close()
