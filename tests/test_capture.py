"""Capture into CUDA graphs: the API, and memory a graph may use is never lent twice.

The corruption probe, for each allocation path: warm the path's cache on
stream ``s``, capture on ``s`` a graph that allocates ``y`` and writes 7 into
it, end the capture, drop ``y``, allocate ``w`` of the same size outside the
graph and write 1 into it, launch the graph: ``w`` must still hold 1 (the
graph wrote into memory nobody else was lent).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu

import cuda_memkit as cm
from cuda_memkit import allocators
from cuda_memkit._core import _capture, _driver, _resource

from . import _fake_frameworks as fake
from ._capture_state import trim_graph_memory  # noqa: F401 - autouse
from ._helpers import read

N = 64 << 10


@pytest.fixture
def cupy(monkeypatch: pytest.MonkeyPatch) -> Iterator[fake.FakeCupy]:
    module = fake.FakeCupy(cm.device_count())
    monkeypatch.setitem(sys.modules, "cupy", module)
    yield module


def graph_bytes() -> int:
    return sum(a.current for a in list(_resource.LEDGER.values()) if a.kind == "graph")


# -- the API ------------------------------------------------------------------------------


def test_capture_status_before_during_and_after(stream: cm.Stream) -> None:
    assert not stream.is_capturing
    stream.begin_capture()
    assert stream.is_capturing
    with stream.end_capture() as graph:
        assert not stream.is_capturing
        assert isinstance(graph, cm.Graph) and not graph.launched
        graph.launch(stream)
        assert graph.launched
    assert graph.closed


def test_work_issued_while_capturing_runs_at_each_launch(stream: cm.Stream) -> None:
    with cm.DeviceBuffer.zeros(N) as buf:
        stream.begin_capture()
        buf.fill(7, stream=stream)
        graph = stream.end_capture()
        assert not buf.to_numpy().any()  # recorded, not run
        graph.launch(stream)
        stream.synchronize()
        assert (buf.to_numpy() == 7).all()
        buf.fill(0)
        graph.launch(stream)
        stream.synchronize()
        assert (buf.to_numpy() == 7).all()
        graph.close()


def test_end_capture_without_a_capture_is_the_drivers_error(stream: cm.Stream) -> None:
    with pytest.raises(cm.CudaError, match="cuStreamEndCapture"):
        stream.end_capture()
    assert _capture.active == 0


def test_a_graph_is_closed_by_collection(stream: cm.Stream) -> None:
    stream.begin_capture()
    graph = stream.end_capture()
    exe = graph.exec_handle
    assert exe in _resource.account("graph_exec").live  # listed (leak reports name it)
    del graph
    assert exe not in _resource.account("graph_exec").live


def test_an_unclosed_graph_is_named_in_the_leak_report(stream: cm.Stream) -> None:
    from cuda_memkit._observability import _leak_report

    stream.begin_capture()
    with stream.end_capture() as graph:
        entries = [e for e in _resource.live_allocations() if e[0].kind == "graph_exec"]
        assert [int(e[1]) for e in entries] == [graph.exec_handle]
        assert "graph_exec" in _leak_report.format_leaks("leaks", entries)


# -- memory allocated during a capture -----------------------------------------------------


def corruption_probe(stream: cm.Stream, allocate: Callable[[], Any], ptr: Callable[[Any], int],
                     fill: Callable[[Any, int], None]) -> None:
    """The probe of the module docstring, for one allocation path (dropping frees)."""
    held = [allocate()]
    held.clear()  # the path's cache holds a block of this size on the stream now
    stream.synchronize()
    stream.begin_capture()
    held.append(allocate())
    fill(held[0], 7)
    graph = stream.end_capture()
    y_ptr = ptr(held[0])
    held.clear()  # before the graph ran: neither an error, nor a warning, nor a leak
    w = allocate()
    fill(w, 1)
    stream.synchronize()
    assert ptr(w) != y_ptr
    graph.launch(stream)
    stream.synchronize()
    assert (read(ptr(w), N) == 1).all()
    graph.launch(stream)  # a relaunch too
    stream.synchronize()
    assert (read(ptr(w), N) == 1).all()
    assert graph_bytes() == N  # y, kept until the graph is closed
    graph.close()
    assert graph_bytes() == 0
    del w


def memset(ptr: int, value: int, stream: cm.Stream) -> None:
    _driver.call("cuMemsetD8Async", cu.CUdeviceptr(ptr), value, N, stream.handle)


@pytest.mark.parametrize("cache", [True, False], ids=["cached", "uncached"])
def test_pool_memory_of_a_graph_is_never_lent_again(stream: cm.Stream, cache: bool) -> None:
    with cm.MemoryPool(0, cache=cache) as pool:
        corruption_probe(stream, lambda: pool.allocate(N, stream=stream), lambda b: b.ptr,
                         lambda b, v: memset(b.ptr, v, stream))


@pytest.mark.parametrize("cache", [True, False], ids=["cached", "uncached"])
def test_cupy_memory_of_a_graph_is_never_lent_again(cupy: fake.FakeCupy, cache: bool) -> None:
    stream = cm.Stream()
    cs = cupy.stream(stream.handle)
    with cm.MemoryPool(0) as pool:
        with allocators.use_with_cupy(pool, cache=cache), cs:
            corruption_probe(stream, lambda: cupy.cuda.alloc(N), lambda p: p.ptr,
                             lambda p, v: memset(p.ptr, v, stream))
    stream.close()


def test_memory_freed_inside_the_capture_is_a_free_node(stream: cm.Stream) -> None:
    with cm.MemoryPool(0, cache=True) as pool:
        stream.begin_capture()
        y = pool.allocate(N, stream=stream)
        memset(y.ptr, 7, stream)
        y.free()
        graph = stream.end_capture()
        assert graph_bytes() == 0
        for _ in range(2):
            graph.launch(stream)
            stream.synchronize()
        assert pool.cached_bytes == 0  # nothing of the graph went into the cache
        graph.close()


def test_memory_kept_after_the_graph_is_closed_is_freed_with_its_buffer(
        stream: cm.Stream) -> None:
    with cm.MemoryPool(0, cache=True) as pool:
        stream.begin_capture()
        y = pool.allocate(N, stream=stream)
        memset(y.ptr, 7, stream)
        graph = stream.end_capture()
        assert cm.memory_stats().by_kind["graph"].current == N  # its own kind
        graph.launch(stream)
        stream.synchronize()
        assert (read(y.ptr, N) == 7).all()  # the graph's output, readable between launches
        graph.close()
        y.free()
        assert graph_bytes() == 0


def test_a_foreign_capture_frees_what_was_dropped_once_the_graph_ran(
        cupy: fake.FakeCupy) -> None:
    stream = cm.Stream()
    cs = cupy.stream(stream.handle)
    with cm.MemoryPool(0) as pool:
        with allocators.use_with_cupy(pool), cs:
            cupy.cuda.alloc(N)  # warm
            cs.begin_capture()
            y = cupy.cuda.alloc(N)
            memset(y.ptr, 7, stream)
            graph = cs.end_capture()
            assert _capture.active == 0
            del y  # dropped before the graph ran: kept and accounted
            assert graph_bytes() == N
            w = cupy.cuda.alloc(N)
            memset(w.ptr, 1, stream)
            graph.launch(cs)
            stream.synchronize()
            assert (read(w.ptr, N) == 1).all()
            pool.empty_cache()  # the kept block is freed now: the graph ran
            assert graph_bytes() == 0
            graph.close()
            del w
    stream.close()


def test_watch_captures_sees_a_capture_begun_through_the_driver(stream: cm.Stream) -> None:
    cm.watch_captures(True)
    try:
        with cm.MemoryPool(0, cache=True) as pool:
            pool.allocate(N, stream=stream).free()
            _driver.call("cuStreamBeginCapture", stream.handle,
                         cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)
            y = pool.allocate(N, stream=stream)
            graph = _driver.call("cuStreamEndCapture", stream.handle)
            assert pool.cached_bytes == N  # the cached block was not lent to the capture
            exe = _driver.call("cuGraphInstantiate", graph, 0)
            _driver.call("cuGraphLaunch", exe, stream.handle)
            y.free()  # after a launch: freed at once
            assert graph_bytes() == 0
            _driver.call("cuGraphExecDestroy", exe)
            _driver.call("cuGraphDestroy", graph)
    finally:
        cm.watch_captures(False)
    assert _capture.active == 0


class _ForeignGraph:
    """A framework's graph class (as torch's ``CUDAGraph``), capturing through the driver."""

    def __init__(self, stream: cm.Stream) -> None:
        self.stream = stream

    def capture_begin(self) -> None:
        _driver.call("cuStreamBeginCapture", self.stream.handle,
                     cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)

    def capture_end(self) -> None:
        self.graph = _driver.call("cuStreamEndCapture", self.stream.handle)


def test_a_frameworks_capture_is_seen_once_a_pool_was_made(
        stream: cm.Stream, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's (and cuda.core's) capture entry points are wrapped: no watch_captures needed."""
    module = type(sys)("torch.cuda")
    module.CUDAGraph = type("CUDAGraph", (_ForeignGraph,), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch.cuda", module)
    with cm.MemoryPool(0, cache=True) as pool:
        assert _capture.watch_frameworks()["torch.cuda.CUDAGraph"]
        pool.allocate(N, stream=stream).free()
        g = module.CUDAGraph(stream)
        g.capture_begin()
        assert _capture.active == 1
        y = pool.allocate(N, stream=stream)
        memset(y.ptr, 7, stream)
        g.capture_end()
        assert _capture.active == 0
        assert pool.cached_bytes == N  # the cached block was not lent to the capture
        exe = _driver.call("cuGraphInstantiate", g.graph, 0)
        y_ptr = y.ptr
        y.free()  # before the graph ran: kept
        w = pool.allocate(N, stream=stream)
        memset(w.ptr, 1, stream)
        assert w.ptr != y_ptr
        _driver.call("cuGraphLaunch", exe, stream.handle)
        stream.synchronize()
        assert (read(w.ptr, N) == 1).all()
        w.free()
        pool.empty_cache()  # the kept block goes: the graph ran
        assert graph_bytes() == 0
        _driver.call("cuGraphExecDestroy", exe)
        _driver.call("cuGraphDestroy", g.graph)


def test_a_class_that_cannot_be_wrapped_is_said() -> None:
    assert _capture.wrap_entry_points(int, "bit_length", "bit_count") is False
    assert _capture.wrap_entry_points(_ForeignGraph, "no_such", "capture_end") is False


def test_pooled_pinned_memory_waits_for_the_graphs_of_our_captures(stream: cm.Stream) -> None:
    with cm.DeviceBuffer.zeros(N) as dst:
        stream.begin_capture()
        h = cm.HostBuffer.pooled(N)
        h.array[:] = 5
        cm.copy_async(dst, h, stream=stream)
        graph = stream.end_capture()
        h_ptr = h.ptr
        h.close()
        other = cm.HostBuffer.pooled(N)
        assert other.ptr != h_ptr  # not lent while the graph may read it
        other.array[:] = 9
        graph.launch(stream)
        stream.synchronize()
        assert (dst.to_numpy() == 5).all()
        other.close()
        graph.close()
        again = cm.HostBuffer.pooled(N)  # back in its pool once the graph is gone
        again.close()
    assert np.asarray(_capture.own_open()).size == 0


def test_copy_batch_descriptors_live_as_long_as_the_graph(
        stream: cm.Stream, monkeypatch: pytest.MonkeyPatch) -> None:
    n = 64
    offsets = np.arange(n, dtype=np.int64) * 512
    sizes: list[int] = []
    pooled = cm.HostBuffer.pooled

    def spy(nbytes: int, *args: Any, **kwargs: Any) -> cm.HostBuffer:
        sizes.append(nbytes)
        return pooled(nbytes, *args, **kwargs)

    with cm.HostBuffer.zeros(n * 512) as src, cm.DeviceBuffer.zeros(n * 512) as dst:
        src.array[:] = np.arange(n * 512) % 251
        stream.begin_capture()
        monkeypatch.setattr(cm.HostBuffer, "pooled", spy)
        cm.copy_batch(dst, src, dst_offsets=offsets[::-1].copy(), src_offsets=offsets,
                      sizes=512, stream=stream, method="kernel")
        monkeypatch.undo()
        graph = stream.end_capture()
        stream.synchronize()
        assert sizes  # the kernel's descriptors are pooled pinned buffers
        # Pinned blocks lent now, written over: never the descriptors the graph reads.
        others = [cm.HostBuffer.pooled(k) for k in sizes for _ in range(4)]
        for o in others:
            o.array[:] = 0xFF
        graph.launch(stream)
        stream.synchronize()
        want = src.array.reshape(n, 512)[::-1].reshape(-1)
        assert (dst.to_numpy() == want).all()
        for o in others:
            o.close()
        graph.close()


def test_an_invalidated_capture_leaves_nothing_behind(stream: cm.Stream) -> None:
    with cm.MemoryPool(0, cache=True) as pool:
        stream.begin_capture()
        y = pool.allocate(N, stream=stream)
        with pytest.raises(cm.CudaError, match="STREAM_CAPTURE_UNSUPPORTED"):
            _driver.call("cuMemAlloc", N)  # not allowed during a global capture
        with pytest.raises(cm.CudaError, match="STREAM_CAPTURE_INVALIDATED"):
            stream.end_capture()
        assert _capture.active == 0 and not stream.is_capturing
        y.free()  # its graph never existed: nothing to free, nothing kept
        assert graph_bytes() == 0
        pool.allocate(N, stream=stream).free()  # the pool works as before


def test_closing_a_graph_during_another_capture_leaves_that_capture_alone(
        stream: cm.Stream) -> None:
    with cm.MemoryPool(0, cache=True) as pool, cm.Stream() as other:
        stream.begin_capture()
        y = pool.allocate(N, stream=stream)
        memset(y.ptr, 7, stream)
        first = stream.end_capture()
        y.free()
        first.launch(stream)
        other.begin_capture()
        first.close()  # no synchronize now: it would invalidate the capture under way
        assert other.is_capturing
        assert graph_bytes() == N  # y, kept while the other capture runs
        second = other.end_capture()  # the capture ended: the first graph goes now
        second.close()
        assert graph_bytes() == 0


def test_a_pageable_copy_is_captured_by_the_driver_not_staged(stream: cm.Stream) -> None:
    before = cm.staging_settings()
    cm.configure_staging(threshold=1 << 16)
    try:
        a = np.full(4 * N, 3, np.uint8)
        with cm.DeviceBuffer.zeros(4 * N) as d:
            cm.copy(d, np.zeros_like(a))  # the staging ring exists now (made outside)
            stream.begin_capture()
            try:
                cm.copy_async(d, a, stream=stream, allow_pageable=True)
            except cm.CudaError:  # a driver that refuses pageable memory in a capture
                with pytest.raises(cm.CudaError):
                    stream.end_capture()
                return
            graph = stream.end_capture()
            assert not d.to_numpy().any()  # nothing copied at capture time
            a[:] = 5
            graph.launch(stream)
            stream.synchronize()
            assert (d.to_numpy() == 5).all()  # the array as it is at the launch
            graph.close()
    finally:
        cm.configure_staging(threshold=before.threshold)


def test_a_copy_batch_executed_again_can_be_captured(stream: cm.Stream) -> None:
    n = 16
    offsets = np.arange(n, dtype=np.int64) * 512
    with cm.HostBuffer.zeros(n * 512) as src, cm.DeviceBuffer.zeros(n * 512) as dst, \
            cm.CopyBatch() as batch:
        batch.add(dst, src, dst_offsets=offsets, src_offsets=offsets, sizes=512)
        batch.execute(stream=stream, method="kernel")  # picked once, outside the capture
        stream.synchronize()
        src.array[:] = 4
        stream.begin_capture()
        batch.execute(stream=stream, method="kernel")
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        assert (dst.to_numpy() == 4).all()
        graph.close()


def test_memory_from_before_a_capture_freed_during_it_goes_after_it(stream: cm.Stream) -> None:
    with cm.MemoryPool(0) as pool:  # no cache: a free is a driver call
        y = pool.allocate(N, stream=stream)
        stream.begin_capture()
        y.free()  # the driver refuses this free on a capturing stream: made after the capture
        assert stream.is_capturing
        graph = stream.end_capture()
        assert not _resource.account("pool", 0, pool.handle).live  # freed now
        graph.close()


def test_a_release_under_watch_captures_survives_a_destroyed_current_context() -> None:
    # While a capture may run, a pool free asks the driver whether its stream captures;
    # with a destroyed context current that query fails, and must not fail the free.
    from ._contexts import stale_context_current

    cm.watch_captures(True)
    try:
        with cm.MemoryPool(0) as pool:  # no cache: the free is a driver call
            acct = _resource.account("pool", 0, pool.handle)
            buf = pool.allocate(N, stream=None)  # the legacy stream: the current context's
            with stale_context_current():
                buf.free()
            assert not acct.live
    finally:
        cm.watch_captures(False)


def test_work_on_a_foreign_capturing_stream_given_by_handle() -> None:
    # The driver refuses cuStreamGetDevice on a capturing stream (torch's capture failed on
    # it): a stream known only by its handle is not asked its device while it captures.
    h = int(_driver.call("cuStreamCreate", 1))
    cm.watch_captures(True)
    try:
        with cm.MemoryPool(0, cache=True) as pool:
            _driver.call("cuStreamBeginCapture", h,
                         cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)
            y = pool.allocate(N, stream=h)
            y.fill(7, stream=h)
            y.free()  # a free node of the capture
            graph = _driver.call("cuStreamEndCapture", h)
            _driver.call("cuGraphDestroy", graph)
            pool.empty_cache()
    finally:
        cm.watch_captures(False)
        _driver.call("cuStreamSynchronize", h)
        _driver.call("cuStreamDestroy", h)
