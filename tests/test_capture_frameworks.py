"""CUDA graphs captured by CuPy and torch over memkit memory, for real (GPU only).

The corruption probe of ``test_capture.py`` through the frameworks' own
capture APIs: memory allocated from memkit during their capture is never lent
to anyone else while the graph may run; CuPy's memory sizes are multiples of
512 bytes, as under CuPy's own allocators.
"""

from __future__ import annotations

import gc
import importlib

import pytest

import cuda_memkit as cm
from cuda_memkit import allocators
from cuda_memkit._core import _capture, _driver, _resource

from ._capture_state import trim_graph_memory  # noqa: F401 - autouse

if _driver.backend_name() == "sim":
    pytest.skip("the frameworks need a GPU (simulator backend)", allow_module_level=True)

pytestmark = pytest.mark.framework_kernels

N = 1 << 20


def graph_bytes() -> int:
    return sum(a.current for a in list(_resource.LEDGER.values()) if a.kind == "graph")


def test_cupy_capture_over_memkit_never_lends_the_graphs_memory() -> None:
    cupy = pytest.importorskip("cupy")
    s = cupy.cuda.Stream(non_blocking=True)
    with allocators.use_with_cupy(), s:
        warm = cupy.full(N, 7, dtype=cupy.uint8)  # kernels loaded, a block cached
        del warm
        s.synchronize()
        s.begin_capture()
        y = cupy.full(N, 7, dtype=cupy.uint8)
        graph = s.end_capture()
        y_ptr = y.data.ptr
        del y  # before the graph ran
        w = cupy.ones(N, dtype=cupy.uint8)
        s.synchronize()
        assert w.data.ptr != y_ptr
        graph.launch(s)
        s.synchronize()
        assert int(w.sum()) == N
        del w, graph
        gc.collect()
        cm.MemoryPool.default(0).empty_cache()  # the kept block: freed, the graph ran
        s.synchronize()
    assert graph_bytes() == 0


def test_cupy_memory_sizes_are_multiples_of_512() -> None:
    cupy = pytest.importorskip("cupy")
    with allocators.use_with_cupy():
        arrays = [cupy.empty(n, dtype=cupy.uint8) for n in (1, 100, 513, 4097, 3 << 20)]
        assert all(a.data.mem.size % 512 == 0 and a.data.mem.size >= a.nbytes for a in arrays)
        del arrays


@pytest.mark.parametrize("watch", [True, False], ids=["watch_captures", "wrapped"])
def test_torch_capture_over_memkit_never_lends_the_graphs_memory(watch: bool) -> None:
    """Without ``watch_captures`` the pool, made after torch was imported, wrapped its capture."""
    torch = pytest.importorskip("torch")
    stream = torch.cuda.Stream()
    cm.watch_captures(watch)
    try:
        with cm.MemoryPool(0, cache=True) as pool:
            assert _capture.watch_frameworks()["torch.cuda.CUDAGraph"]
            pool.allocate(N, stream=stream).free()  # a block cached on the stream
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                y = pool.allocate(N, stream=torch.cuda.current_stream())
                y.fill(7, stream=torch.cuda.current_stream())
            assert _capture.active == int(watch)  # the capture's own flag is down again
            y_ptr = y.ptr
            y.free()  # before the graph ran
            w = pool.allocate(N, stream=stream)
            w.fill(1, stream=stream)
            stream.synchronize()
            assert w.ptr != y_ptr
            graph.replay()
            torch.cuda.synchronize()
            assert (w.to_numpy() == 1).all()
            w.free()
            pool.empty_cache()
            torch.cuda.synchronize()
            del graph
            gc.collect()
    finally:
        cm.watch_captures(False)
    assert graph_bytes() == 0


def test_cuda_core_capture_over_memkit_never_lends_the_graphs_memory() -> None:
    core = pytest.importorskip("cuda.core")
    for module in ("cuda.core", "cuda.core.graph", "cuda.core.experimental"):
        try:
            builder = getattr(importlib.import_module(module), "GraphBuilder", None)
        except ImportError:
            continue
        if builder is not None:
            break
    else:
        pytest.skip("this cuda.core has no GraphBuilder")
    dev = core.Device(0)
    dev.set_current()
    s = dev.create_stream()
    try:
        with cm.MemoryPool(0, cache=True) as pool:
            if not _capture.watch_frameworks()[f"{module}.GraphBuilder"]:
                pytest.skip("cuda.core's GraphBuilder is an extension type: watch_captures() "
                            "covers its captures")
            pool.allocate(N, stream=s).free()
            gb = s.create_graph_builder()
            gb.begin_building()
            y = pool.allocate(N, stream=gb.stream)
            y.fill(7, stream=gb.stream)
            graph = gb.end_building().complete()
            assert _capture.active == 0
            y_ptr = y.ptr
            y.free()
            w = pool.allocate(N, stream=s)
            w.fill(1, stream=s)
            s.sync()
            assert w.ptr != y_ptr
            graph.launch(s)
            s.sync()
            assert (w.to_numpy() == 1).all()
            w.free()
            graph.close()
            gb.close()
            pool.empty_cache()
            s.sync()
            gc.collect()
    finally:
        s.close()
    assert graph_bytes() == 0
