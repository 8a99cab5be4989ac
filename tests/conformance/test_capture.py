"""Stream capture and graph memory through the gateway: exact class and CUresult.

Expected answers are the H200's (``h100_probe.json``, section G: the cases
named in each test). They run on whichever backend is active; the simulator
must agree.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from cuda.bindings import driver as cu

import cuda_memkit as cm
from cuda_memkit._core import _driver

from .._capture_state import trim_graph_memory  # noqa: F401 - autouse
from ._helpers import expect

pytestmark = pytest.mark.usefixtures("ctx")

R = cu.CUresult
MODE = cu.CUstreamCaptureMode
GM = cu.CUgraphMem_attribute
MiB = 1 << 20

INVALID = (cm.CudaInvalidValueError, R.CUDA_ERROR_INVALID_VALUE)
ILLEGAL_STATE = (cm.CudaError, R.CUDA_ERROR_ILLEGAL_STATE)
UNSUPPORTED = (cm.CudaError, R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
INVALIDATED = (cm.CudaError, R.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)


@pytest.fixture
def s() -> Iterator[int]:
    h = int(_driver.call("cuStreamCreate", 1))
    yield h
    _driver.call("cuStreamSynchronize", h)
    _driver.call("cuStreamDestroy", h)




def status(h: int) -> int:
    return int(_driver.call("cuStreamIsCapturing", h))


def begin(h: int, mode: Any = MODE.CU_STREAM_CAPTURE_MODE_GLOBAL) -> None:
    _driver.call("cuStreamBeginCapture", h, mode)


def graph_mem(attr: Any) -> int:
    return int(_driver.call("cuDeviceGetGraphMemAttribute", cu.CUdevice(0), attr))


def test_capture_status_before_during_and_after(s: int) -> None:  # G_capture_status
    assert status(s) == 0
    begin(s)
    assert status(s) == 1
    info = _driver.call("cuStreamGetCaptureInfo", s)
    assert int(info[0]) == 1 and int(info[1]) != 0
    expect(ILLEGAL_STATE, "cuStreamBeginCapture", s, MODE.CU_STREAM_CAPTURE_MODE_GLOBAL)
    graph = _driver.call("cuStreamEndCapture", s)
    assert status(s) == 0
    _driver.call("cuGraphDestroy", graph)
    expect(ILLEGAL_STATE, "cuStreamEndCapture", s)


def test_free_nodes_need_graph_allocations(s: int) -> None:  # G_alloc_free_nodes
    pool = _driver.call("cuDeviceGetMemPool", cu.CUdevice(0))
    pre = _driver.call("cuMemAllocFromPoolAsync", MiB, pool, s)
    dev = _driver.call("cuMemAlloc", MiB)
    _driver.call("cuStreamSynchronize", s)
    begin(s)
    a = _driver.call("cuMemAllocAsync", MiB, s)
    _driver.call("cuMemsetD8Async", a, 7, MiB, s)
    _driver.call("cuMemFreeAsync", a, s)  # a free node
    expect(INVALID, "cuMemFreeAsync", pre, s)  # not a graph allocation
    expect(INVALID, "cuMemFreeAsync", dev, s)
    graph = _driver.call("cuStreamEndCapture", s)
    expect(INVALID, "cuPointerGetAttribute",  # no memory behind it before a launch
           cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a)
    exe = _driver.call("cuGraphInstantiate", graph, 0)
    for _ in range(2):  # freed by the graph: it can run again
        _driver.call("cuGraphLaunch", exe, s)
        _driver.call("cuStreamSynchronize", s)
    _driver.call("cuGraphExecDestroy", exe)
    _driver.call("cuGraphDestroy", graph)
    _driver.call("cuMemFreeAsync", pre, s)
    _driver.call("cuMemFree", dev)


def test_a_graph_allocation_is_freed_outside_only_after_a_launch(s: int) -> None:
    # G_free_outside_graph, step by step
    other = int(_driver.call("cuStreamCreate", 1))
    _driver.call("cuDeviceGraphMemTrim", cu.CUdevice(0))
    before = graph_mem(GM.CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)
    begin(s)
    a = _driver.call("cuMemAllocAsync", MiB, s)
    _driver.call("cuMemsetD8Async", a, 7, MiB, s)
    graph = _driver.call("cuStreamEndCapture", s)
    exe = _driver.call("cuGraphInstantiate", graph, 0)
    expect(INVALID, "cuMemFreeAsync", a, other)  # not launched: nothing allocated yet
    expect(INVALID, "cuMemFree", a)
    _driver.call("cuGraphLaunch", exe, s)
    _driver.call("cuStreamSynchronize", s)
    assert graph_mem(GM.CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) >= before + MiB
    expect(INVALID, "cuGraphLaunch", exe, s)  # its allocation is still allocated
    _driver.call("cuMemFreeAsync", a, other)  # freed outside, on another stream
    _driver.call("cuStreamSynchronize", other)
    # freed, but the device keeps its graph memory (counted as used) until a trim
    assert graph_mem(GM.CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) >= before + MiB
    expect(INVALID, "cuMemFreeAsync", a, other)  # once only
    _driver.call("cuGraphLaunch", exe, s)  # freed: it can run again
    _driver.call("cuStreamSynchronize", s)
    _driver.call("cuMemFree", a)  # a synchronous free of a graph allocation
    _driver.call("cuGraphLaunch", exe, s)
    _driver.call("cuStreamSynchronize", s)
    _driver.call("cuGraphExecDestroy", exe)  # the allocation outlives the graph
    _driver.call("cuMemGetAddressRange", a)
    _driver.call("cuMemFreeAsync", a, other)
    _driver.call("cuStreamSynchronize", other)
    _driver.call("cuGraphDestroy", graph)
    _driver.call("cuStreamDestroy", other)
    _driver.call("cuDeviceGraphMemTrim", cu.CUdevice(0))
    assert graph_mem(GM.CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT) == before


def test_auto_free_on_launch_frees_what_the_last_launch_left(s: int) -> None:
    begin(s)
    a = _driver.call("cuMemAllocAsync", MiB, s)
    _driver.call("cuMemsetD8Async", a, 7, MiB, s)
    graph = _driver.call("cuStreamEndCapture", s)
    flag = cu.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH
    exe = _driver.call("cuGraphInstantiate", graph, int(flag))
    for _ in range(3):
        _driver.call("cuGraphLaunch", exe, s)
        _driver.call("cuStreamSynchronize", s)
    _driver.call("cuMemFreeAsync", a, s)
    _driver.call("cuStreamSynchronize", s)
    _driver.call("cuGraphExecDestroy", exe)
    _driver.call("cuGraphDestroy", graph)


def _refused_call(which: str, other: int, pool: Any, p: Any) -> tuple[Any, ...]:
    return {"cuMemAlloc": ("cuMemAlloc", MiB), "cuMemFree": ("cuMemFree", p),
            "cuCtxSynchronize": ("cuCtxSynchronize",),
            "cuStreamSynchronize(other)": ("cuStreamSynchronize", other),
            "cuStreamQuery(other)": ("cuStreamQuery", other),
            "cuMemAllocFromPoolAsync(other)": ("cuMemAllocFromPoolAsync", MiB, pool, other),
            }[which]


@pytest.mark.parametrize("mode", ["GLOBAL", "THREAD_LOCAL"])
@pytest.mark.parametrize("which", ["cuMemAlloc", "cuMemFree", "cuCtxSynchronize",
                                   "cuStreamSynchronize(other)", "cuStreamQuery(other)",
                                   "cuMemAllocFromPoolAsync(other)"])
def test_a_capture_refuses_calls_that_could_synchronize(s: int, mode: str, which: str) -> None:
    # G_calls_during_capture: refused, and the capture is invalidated
    other = int(_driver.call("cuStreamCreate", 1))
    pool = _driver.call("cuDeviceGetMemPool", cu.CUdevice(0))
    p = _driver.call("cuMemAlloc", MiB)
    try:
        begin(s, getattr(MODE, f"CU_STREAM_CAPTURE_MODE_{mode}"))
        expect(UNSUPPORTED, *_refused_call(which, other, pool, p))
        assert status(s) == 2
        expect(INVALIDATED, "cuStreamEndCapture", s)
    finally:
        _driver.call("cuMemFree", p)
        _driver.call("cuStreamDestroy", other)


@pytest.mark.parametrize("which", ["cuMemAlloc", "cuMemFree", "cuStreamSynchronize(other)",
                                   "cuStreamQuery(other)", "cuMemAllocFromPoolAsync(other)"])
def test_a_relaxed_capture_allows_them_but_a_context_synchronize(s: int, which: str) -> None:
    # G_calls_during_capture, mode RELAXED
    other = int(_driver.call("cuStreamCreate", 1))
    pool = _driver.call("cuDeviceGetMemPool", cu.CUdevice(0))
    p = _driver.call("cuMemAlloc", MiB)
    try:
        begin(s, MODE.CU_STREAM_CAPTURE_MODE_RELAXED)
        api, *args = _refused_call(which, other, pool, p)
        out = _driver.call(api, *args)
        if which == "cuMemFree":
            p = None
        expect(UNSUPPORTED, "cuCtxSynchronize")  # refused in every mode, and invalidates
        expect(INVALIDATED, "cuStreamEndCapture", s)
        if which == "cuMemAlloc":
            _driver.call("cuMemFree", out)
        elif which.startswith("cuMemAllocFromPoolAsync"):
            _driver.call("cuMemFreeAsync", out, other)
    finally:
        if p is not None:
            _driver.call("cuMemFree", p)
        _driver.call("cuStreamSynchronize", other)
        _driver.call("cuStreamDestroy", other)


def test_asking_the_legacy_stream_during_a_capture_is_refused_but_harmless() -> None:
    # G_capture_legacy_query: a blocking stream captures
    h = int(_driver.call("cuStreamCreate", 0))
    try:
        begin(h)
        expect((cm.CudaError, R.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT), "cuStreamIsCapturing", 0)
        assert status(h) == 1
        _driver.call("cuGraphDestroy", _driver.call("cuStreamEndCapture", h))
        expect(UNSUPPORTED, "cuStreamBeginCapture", 0, MODE.CU_STREAM_CAPTURE_MODE_GLOBAL)
    finally:
        _driver.call("cuStreamDestroy", h)


def test_a_relaxed_thread_may_allocate_during_a_global_capture(s: int) -> None:
    # G_calls_during_capture: PyTorch's way around its own allocations
    begin(s)
    old = _driver.call("cuThreadExchangeStreamCaptureMode", MODE.CU_STREAM_CAPTURE_MODE_RELAXED)
    try:
        p = _driver.call("cuMemAlloc", MiB)
    finally:
        _driver.call("cuThreadExchangeStreamCaptureMode", old)
    graph = _driver.call("cuStreamEndCapture", s)
    _driver.call("cuGraphDestroy", graph)
    _driver.call("cuMemFree", p)


def test_graph_memory_trim_of_a_missing_device_is_refused() -> None:  # G_graph_mem_trim
    expect((cm.CudaInvalidDeviceError, R.CUDA_ERROR_INVALID_DEVICE), "cuDeviceGraphMemTrim",
           cu.CUdevice(7))
