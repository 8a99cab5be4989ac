"""Simulated stream capture, CUDA graphs and graph memory.

While a stream captures (``cuStreamBeginCapture``), the work issued on it is
recorded into the capture's graph instead of running: memsets, copies, batch
copies, kernels, prefetches (event records and waits
run as usual: they order streams, they are not work). ``cuStreamEndCapture`` returns the
graph, ``cuGraphInstantiate`` makes an executable graph of it and
``cuGraphLaunch`` replays the recorded work (at once, as every simulated
stream completes its work at once).

Graph memory (the driver's rules, as the conformance cases record them):

* ``cuMemAllocAsync`` / ``cuMemAllocFromPoolAsync`` on a capturing stream add
  an allocation node: the address is the graph's for the graph's life, and
  the memory exists from a launch until it is freed.
* ``cuMemFreeAsync`` on a capturing stream adds a free node; it must name a
  graph allocation, else ``CUDA_ERROR_INVALID_VALUE``.
* Outside a graph, a graph allocation is freed with ``cuMemFreeAsync`` once a
  launch allocated it; before that the free is ``CUDA_ERROR_INVALID_VALUE``.
* A launch while an allocation of the graph's previous launch is still
  allocated is ``CUDA_ERROR_INVALID_VALUE``, unless the graph was instantiated
  with ``CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`` (then it is freed
  first).
* Graph memory is counted per device (``cuDeviceGetGraphMemAttribute``):
  used while allocated; reserved from a launch until ``cuDeviceGraphMemTrim``
  finds it unused.

While a capture other than a relaxed one is under way, calls that could
synchronize with it (``UNSAFE``) are refused with
``CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`` and invalidate the capture, as do a
synchronize or query of the capturing stream itself and ``cuCtxSynchronize``
(in every mode); a thread whose capture mode is relaxed
(``cuThreadExchangeStreamCaptureMode``) may make the others.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cuda.bindings import driver as cu

from . import _state as S
from ._state import Allocation, Fail, R, api

__all__ = [
    "cuDeviceGetGraphMemAttribute",
    "cuDeviceGraphMemTrim",
    "cuDeviceSetGraphMemAttribute",
    "cuGraphDestroy",
    "cuGraphExecDestroy",
    "cuGraphGetNodes",
    "cuGraphInstantiate",
    "cuGraphLaunch",
    "cuStreamBeginCapture",
    "cuStreamEndCapture",
    "cuStreamGetCaptureInfo",
    "cuStreamIsCapturing",
    "cuThreadExchangeStreamCaptureMode",
]

CAPTURES = "capture.captures"  # stream handle -> Capture
GRAPHS = "capture.graphs"  # graph handle -> SimGraph
EXECS = "capture.execs"  # exec handle -> SimExec
GRAPH_MEM = "capture.graph_memory"  # address -> GraphAlloc (graph allocations)

GLOBAL, THREAD_LOCAL, RELAXED = 0, 1, 2
NONE, ACTIVE, INVALIDATED = 0, 1, 2
AUTO_FREE_ON_LAUNCH = int(
    cu.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)

#: Where each recorded call has its stream argument.
STREAM_ARG = {
    "cuMemsetD8Async": 3, "cuMemsetD16Async": 3, "cuMemsetD32Async": 3,
    "cuMemcpyAsync": 3, "cuMemcpyHtoDAsync": 3, "cuMemcpyDtoHAsync": 3,
    "cuMemcpyDtoDAsync": 3, "cuMemcpyPeerAsync": 5, "_batch": 7, "cuMemPrefetchAsync": 4,
    "cuStreamAttachMemAsync": 0,
}
#: Calls that could synchronize with a capture: refused during one (unless relaxed).
#: Calls the H200 refuses during a capture other than a relaxed one (G_calls_during_capture:
#: cuMemAlloc, cuMemFree, cuMemHostAlloc, cuStreamSynchronize and cuStreamQuery of another
#: stream, stream-ordered allocations and frees on another stream; the event waits and
#: queries are assumed alike; cuMemPoolCreate was refused in a global capture when the
#: suite ran on the H200). Each refusal invalidates the capture.
UNSAFE = frozenset({"cuMemAlloc", "cuMemAllocManaged", "cuMemHostAlloc", "cuMemAllocHost",
                    "cuMemPoolCreate",
                    "cuMemFree", "cuMemFreeHost", "cuEventQuery", "cuEventSynchronize",
                    "cuStreamSynchronize", "cuStreamQuery", "cuMemAllocAsync",
                    "cuMemAllocFromPoolAsync", "cuMemFreeAsync"})


@dataclass
class GraphAlloc:
    """One allocation node's memory: its address is the graph's for the graph's life."""

    addr: int
    size: int
    device: int
    graph: int = 0  # the graph handle (0 while its capture runs)
    owner: SimGraph | None = None  # the graph, once the capture ended
    allocated: bool = False  # a launch allocated it and nothing freed it since
    reserved: bool = False  # counted as reserved graph memory (until a trim)
    freed_in_graph: bool = False


@dataclass
class Capture:
    id: int
    stream: int
    device: int
    mode: int
    thread: int
    graph: int
    status: int = ACTIVE
    nodes: list[Any] = field(default_factory=list)


@dataclass
class SimGraph:
    handle: int
    device: int
    nodes: list[Any]
    allocs: list[GraphAlloc]
    instantiated: bool = False
    destroyed: bool = False

    def gone(self) -> bool:
        """Whether neither the graph nor an executable graph of it exists."""
        return self.destroyed and not self.instantiated


@dataclass
class SimExec:
    handle: int
    graph: SimGraph
    flags: int


def M() -> S.Machine:
    return S.MACHINE


def _table(name: str) -> dict[Any, Any]:
    return M().ext.setdefault(name, {})  # type: ignore[no-any-return]


def _captures() -> dict[int, Capture]:
    return _table(CAPTURES)


def _graphs() -> dict[int, SimGraph]:
    return _table(GRAPHS)


def _execs() -> dict[int, SimExec]:
    return _table(EXECS)


def _graph_mem() -> dict[int, GraphAlloc]:
    return _table(GRAPH_MEM)


def _thread_mode() -> int:
    return int(getattr(M().tls, "capture_mode", GLOBAL))


_ids = iter(range(1, 1 << 62))
_ids_lock = threading.Lock()


def _invalidate(cap: Capture) -> None:
    cap.status = INVALIDATED


def _prohibited() -> Capture | None:
    """The capture a potentially unsafe call on this thread would break, if any."""
    if _thread_mode() == RELAXED:
        return None
    me = threading.get_ident()
    for cap in list(_captures().values()):
        if cap.status != ACTIVE:
            continue
        if cap.thread == me and cap.mode != RELAXED:
            return cap
        if cap.mode == GLOBAL:
            return cap
    return None


def record(handle: int, job: Any) -> bool:
    """Record ``job()`` into the capture of stream ``handle``; False if it does not capture."""
    cap = _captures().get(handle)
    if cap is None:
        return False
    if cap.status == ACTIVE:
        cap.nodes.append(("run", job))
    return True


def _gate(name: str, fn: Any, args: tuple[Any, ...]) -> Any:
    """Decide a call made while some stream captures (see the module docstring)."""
    caps = _captures()
    if name == "cuCtxSynchronize":  # it would wait for a capturing stream: refused in any mode
        active = [c for c in caps.values() if c.status == ACTIVE]
        if active:
            for c in active:
                _invalidate(c)
            raise Fail(R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
        return S.NOT_CAPTURED
    if name in ("cuStreamSynchronize", "cuStreamQuery", "cuStreamGetDevice"):
        cap = caps.get(_handle(args[0]))
        if cap is not None:  # of the capturing stream itself
            if name != "cuStreamGetDevice":
                _invalidate(cap)
            raise Fail(R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
    if name in ("cuMemAllocAsync", "cuMemAllocFromPoolAsync"):
        cap = caps.get(_handle(args[-1]))
        if cap is not None:
            return cu.CUdeviceptr(_alloc_node(cap, name, args))
    if name in UNSAFE and not (name == "cuMemFreeAsync" and _handle(args[1]) in caps):
        cap = _prohibited()
        if cap is not None:
            _invalidate(cap)
            raise Fail(R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
    if name == "cuPointerGetAttribute":  # a graph allocation exists from a launch on
        ga = _graph_mem().get(int(args[1]))
        if ga is not None and not ga.allocated:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        return S.NOT_CAPTURED
    if name == "cuMemFree":
        ga = _graph_mem().get(int(args[0]))
        if ga is None:
            return S.NOT_CAPTURED
        _free_outside(ga)
        return None
    if name == "cuMemFreeAsync":
        h = _handle(args[1])
        cap = caps.get(h)
        addr = int(args[0])
        ga = _graph_mem().get(addr)
        if cap is None:
            if ga is None:
                return S.NOT_CAPTURED
            _free_outside(ga)
            return None
        if ga is None or (ga.graph == 0 and ga.freed_in_graph):
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        if cap.status == ACTIVE:
            cap.nodes.append(("free", ga))
            if ga.graph == 0:
                ga.freed_in_graph = True
        return None
    i = STREAM_ARG.get(name)
    if i is None:
        return S.NOT_CAPTURED
    cap = caps.get(_handle(args[i]))
    if cap is None:
        return S.NOT_CAPTURED
    if cap.status == ACTIVE:
        cap.nodes.append(("call", fn, args))
    return None


def _handle(stream: Any) -> int:
    return int(stream) if stream is not None else 0


def _alloc_node(cap: Capture, name: str, args: tuple[Any, ...]) -> int:
    from ._pool import _lookup

    size = S.unsigned(args[0])
    if size == 0:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    device = cap.device
    if name == "cuMemAllocFromPoolAsync":
        pool = _lookup(int(args[1]))
        if pool is None:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        if not pool.on_device or pool.is_managed:
            raise Fail(R.CUDA_ERROR_NOT_SUPPORTED)
        device = pool.loc_id
    m = M()
    addr = m.reserve_va(size, 512)
    backing = np.empty(size, np.uint8)
    m.add(Allocation(addr, size, "graph", device, int(backing.ctypes.data), backing))
    ga = GraphAlloc(addr, size, device)
    _graph_mem()[addr] = ga
    m.capturing += 1  # the gate also decides the frees of graph memory
    if cap.status == ACTIVE:
        cap.nodes.append(("alloc", ga))
    return addr


def _free_outside(ga: GraphAlloc) -> None:
    """``cuMemFreeAsync`` of a graph allocation outside any capture."""
    if not ga.allocated:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    ga.allocated = False
    M().uncharge(ga.device, ga.size)
    if ga.owner is not None and ga.owner.gone():
        _forget(ga)


def _forget(ga: GraphAlloc) -> None:
    """The address goes back: its graph is destroyed and the memory not allocated."""
    m = M()
    if _graph_mem().pop(ga.addr, None) is not None:
        m.capturing -= 1
    a = m.allocs.get(ga.addr)
    if a is not None:
        m.remove(a)


# -- capture ---------------------------------------------------------------------------


@api(0)
def cuStreamBeginCapture(hStream: Any, mode: Any) -> None:
    m = M()
    h = _handle(hStream)
    md = int(mode)
    if md not in (GLOBAL, THREAD_LOCAL, RELAXED):
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    s = m.stream(h)
    if s is None:
        m.need_ctx()
        raise Fail(R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
    caps = _captures()
    if h in caps:
        raise Fail(R.CUDA_ERROR_ILLEGAL_STATE)
    with _ids_lock:
        ident = next(_ids)
    caps[h] = Capture(ident, h, s.device, md, threading.get_ident(), m.new_handle())
    m.capturing += 1


@api(1)
def cuStreamEndCapture(hStream: Any) -> cu.CUgraph:
    m = M()
    h = _handle(hStream)
    if m.stream(h) is None:
        m.need_ctx()
    cap = _captures().get(h)
    if cap is None:
        raise Fail(R.CUDA_ERROR_ILLEGAL_STATE)
    if cap.mode == THREAD_LOCAL and cap.thread != threading.get_ident():
        raise Fail(R.CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD)
    del _captures()[h]
    m.capturing -= 1
    allocs = [n[1] for n in cap.nodes if n[0] == "alloc"]
    if cap.status != ACTIVE:
        for ga in allocs:
            _forget(ga)
        raise Fail(R.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
    g = SimGraph(cap.graph, cap.device, cap.nodes, allocs)
    for ga in allocs:
        ga.graph = cap.graph
        ga.owner = g
    _graphs()[cap.graph] = g
    return cu.CUgraph(cap.graph)


def _capture_status(hStream: Any) -> Capture | None:
    m = M()
    h = _handle(hStream)
    if m.stream(h) is None:
        m.need_ctx()
        blocking = [c for c in _captures().values() if c.status == ACTIVE
                    and m.streams[c.stream].flags == 0]
        if h in (0, 1) and blocking:
            # The legacy stream would synchronize with the capturing blocking streams; the
            # capture goes on (G_capture_legacy_query).
            raise Fail(R.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
    return _captures().get(h)


@api(1)
def cuStreamIsCapturing(hStream: Any) -> cu.CUstreamCaptureStatus:
    cap = _capture_status(hStream)
    return cu.CUstreamCaptureStatus(NONE if cap is None else cap.status)


@api(6)
def cuStreamGetCaptureInfo(hStream: Any) -> tuple[Any, ...]:
    cap = _capture_status(hStream)
    if cap is None:
        return (cu.CUstreamCaptureStatus(NONE), 0, None, [], [], 0)
    if cap.status != ACTIVE:  # the rest is set only for an active capture (seen on the H200:
        # an invalidated capture's id is not what its begin saw)
        return (cu.CUstreamCaptureStatus(cap.status), 0, None, [], [], 0)
    return (cu.CUstreamCaptureStatus(cap.status), cap.id, cu.CUgraph(cap.graph), [], [], 0)


@api(1)
def cuThreadExchangeStreamCaptureMode(mode: Any) -> cu.CUstreamCaptureMode:
    md = int(mode)
    if md not in (GLOBAL, THREAD_LOCAL, RELAXED):
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    old = _thread_mode()
    M().tls.capture_mode = md
    return cu.CUstreamCaptureMode(old)


# -- graphs ----------------------------------------------------------------------------


def _found(table: dict[int, Any], handle: Any) -> Any:
    """The entry of ``handle`` in ``table``; an unknown handle is CUDA_ERROR_INVALID_VALUE."""
    found = table.get(_handle(handle))
    if found is None:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    return found


def _graph(hGraph: Any) -> SimGraph:
    g: SimGraph = _found(_graphs(), hGraph)
    return g


@api(2)
def cuGraphGetNodes(hGraph: Any, numNodes: int = 0) -> tuple[list[Any], int]:
    g = _graph(hGraph)
    return [], len(g.nodes)


@api(1)
def cuGraphInstantiate(hGraph: Any, flags: int) -> cu.CUgraphExec:
    g = _graph(hGraph)
    if g.allocs and g.instantiated:  # one instantiation at a time of a graph with memory nodes
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    g.instantiated = True
    h = M().new_handle()
    _execs()[h] = SimExec(h, g, int(flags))
    return cu.CUgraphExec(h)


def _exec(hGraphExec: Any) -> SimExec:
    e: SimExec = _found(_execs(), hGraphExec)
    return e


@api(0)
def cuGraphLaunch(hGraphExec: Any, hStream: Any) -> None:
    m = M()
    e = _exec(hGraphExec)
    h = _handle(hStream)
    if m.stream(h) is None:
        m.need_ctx()
    if h in _captures():
        raise Fail(R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
    g = e.graph
    live = [ga for ga in g.allocs if ga.allocated]
    if live:
        if not e.flags & AUTO_FREE_ON_LAUNCH:
            raise Fail(R.CUDA_ERROR_INVALID_VALUE)
        for ga in live:
            ga.allocated = False
            m.uncharge(ga.device, ga.size)
    for node in g.nodes:
        kind = node[0]
        if kind == "alloc":
            ga = node[1]
            dev = m.devices[ga.device]
            if dev.used + ga.size > dev.total_mem:
                raise Fail(R.CUDA_ERROR_OUT_OF_MEMORY)
            dev.used += ga.size
            ga.allocated = ga.reserved = True
        elif kind == "free":
            ga = node[1]
            if ga.allocated:
                ga.allocated = False
                m.uncharge(ga.device, ga.size)
        elif kind == "run":
            node[1]()
        else:
            node[1](*node[2])


@api(0)
def cuGraphExecDestroy(hGraphExec: Any) -> None:
    e = _exec(hGraphExec)
    del _execs()[e.handle]
    e.graph.instantiated = False
    _forget_unallocated(e.graph)


@api(0)
def cuGraphDestroy(hGraph: Any) -> None:
    g = _graph(hGraph)
    del _graphs()[g.handle]
    g.destroyed = True  # an executable graph of it keeps what it needs
    _forget_unallocated(g)


def _forget_unallocated(g: SimGraph) -> None:
    """Once no graph or executable graph is left, addresses not allocated go back."""
    if g.gone():
        for ga in g.allocs:
            if not ga.allocated:
                _forget(ga)


# -- graph memory ----------------------------------------------------------------------


_GM = cu.CUgraphMem_attribute
_USED, _USED_HIGH = (int(_GM.CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT),
                     int(_GM.CU_GRAPH_MEM_ATTR_USED_MEM_HIGH))
_RES, _RES_HIGH = (int(_GM.CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT),
                   int(_GM.CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH))


#: Graph memory is mapped in chunks of this size (G_alloc_free_nodes: 32 MiB for two 1 MiB
#: allocations).
GRAPH_CHUNK = 32 << 20


def _usage(ordinal: int) -> tuple[int, int]:
    """(used, reserved) graph memory of a device.

    On the H200 both count the memory mapped for graph allocations, freed or
    not, until ``cuDeviceGraphMemTrim`` (G_alloc_free_nodes).
    """
    reserved = sum(ga.size for ga in _graph_mem().values()
                   if ga.device == ordinal and ga.reserved)
    mapped = -(-reserved // GRAPH_CHUNK) * GRAPH_CHUNK
    return mapped, mapped


class _Highs:
    """The high-water marks per device (no length: not a table the leak check counts)."""

    def __init__(self) -> None:
        self.by_device: dict[int, dict[int, int]] = {}


def _highs(ordinal: int) -> dict[int, int]:
    highs = M().ext.get("capture.highs")
    if highs is None:
        highs = M().ext["capture.highs"] = _Highs()
    h = highs.by_device.setdefault(ordinal, {_USED_HIGH: 0, _RES_HIGH: 0})
    used, reserved = _usage(ordinal)
    h[_USED_HIGH] = max(h[_USED_HIGH], used)
    h[_RES_HIGH] = max(h[_RES_HIGH], reserved)
    return h


@api(1)
def cuDeviceGetGraphMemAttribute(device: Any, attr: Any) -> cu.cuuint64_t:
    d = M().device(device)
    a = int(attr)
    used, reserved = _usage(d.ordinal)
    if a == _USED:
        return cu.cuuint64_t(used)
    if a == _RES:
        return cu.cuuint64_t(reserved)
    if a in (_USED_HIGH, _RES_HIGH):
        return cu.cuuint64_t(_highs(d.ordinal)[a])
    raise Fail(R.CUDA_ERROR_INVALID_VALUE)


@api(0)
def cuDeviceSetGraphMemAttribute(device: Any, attr: Any, value: Any) -> None:
    d = M().device(device)
    a = int(attr)
    if a not in (_USED_HIGH, _RES_HIGH) or int(value) != 0:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    h = _highs(d.ordinal)
    used, reserved = _usage(d.ordinal)
    h[a] = used if a == _USED_HIGH else reserved


@api(0)
def cuDeviceGraphMemTrim(device: Any) -> None:
    d = M().device(device)
    for ga in _graph_mem().values():
        if ga.device == d.ordinal and not ga.allocated:
            ga.reserved = False


S.capture_gate = _gate
S.capture_recorder = record
