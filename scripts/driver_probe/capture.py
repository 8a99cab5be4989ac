"""G. Stream capture into CUDA graphs: capture status, graph memory nodes, frees of
graph allocations inside and outside the graph, relaunch, graph memory statistics
and trimming, and what other calls answer while a stream captures.
"""

from __future__ import annotations

from ._framework import Case, MiB, call, d, jv, ok, probe
from ._helpers import P, ctx_after, dalloc, new_stream

MODE = d.CUstreamCaptureMode
GM = d.CUgraphMem_attribute
MODES = {"GLOBAL": MODE.CU_STREAM_CAPTURE_MODE_GLOBAL,
         "THREAD_LOCAL": MODE.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
         "RELAXED": MODE.CU_STREAM_CAPTURE_MODE_RELAXED}


def graph_mem(dev=None) -> dict:
    """The four graph memory attributes of device 0."""
    dev = d.CUdevice(0) if dev is None else dev
    out = {}
    for a in GM:
        r = call(d.cuDeviceGetGraphMemAttribute, dev, a)
        out[a.name.replace("CU_GRAPH_MEM_ATTR_", "")] = int(r.v) if r.ok else r.name
    return out


def status(s):
    r = call(d.cuStreamIsCapturing, s)
    return jv(r.v) if r.ok else r.name


def end(c: Case, label: str, s):
    """End capture on ``s`` (recorded); the graph is destroyed when the case ends."""
    r = c(label, d.cuStreamEndCapture, s)
    if r.ok and r.v is not None and P(r.v):
        c.defer(d.cuGraphDestroy, r.v)
        return r.v
    return None


def instantiate(c: Case, graph):
    r = c("cuGraphInstantiate", d.cuGraphInstantiate, graph, 0)
    if r.ok:
        c.defer(d.cuGraphExecDestroy, r.v)
        return r.v
    return None


def node_count(graph) -> object:
    r = call(d.cuGraphGetNodes, graph, 0)
    return jv(r.outs[1]) if r.ok else r.name


@probe("G_capture_status")
def g_status(c: Case):
    s = new_stream(c)
    c.val("before", status(s))
    r = c("cuStreamGetCaptureInfo(before)", d.cuStreamGetCaptureInfo, s)
    c.val("info_before", [jv(x) for x in r.outs[:3]])
    c("cuStreamBeginCapture(GLOBAL)", d.cuStreamBeginCapture, s, MODES["GLOBAL"])
    c("cuStreamIsCapturing(during)", d.cuStreamIsCapturing, s)
    c.val("during", status(s))
    r = c("cuStreamGetCaptureInfo(during)", d.cuStreamGetCaptureInfo, s)
    c.val("info_during_status", jv(r.outs[0]))
    c.val("info_during_id_nonzero", bool(r.ok and int(r.outs[1] or 0)))
    c.val("info_during_graph_nonzero", bool(r.ok and r.outs[2] is not None and P(r.outs[2])))
    c("cuStreamBeginCapture(again)", d.cuStreamBeginCapture, s, MODES["GLOBAL"])
    c.val("after_begin_twice", status(s))
    graph = end(c, "cuStreamEndCapture", s)
    c.val("after", status(s))
    c.val("empty_graph_nodes", node_count(graph) if graph is not None else None)
    r = c("cuStreamEndCapture(not capturing)", d.cuStreamEndCapture, s)
    if r.ok and r.v is not None and P(r.v):
        call(d.cuGraphDestroy, r.v)
    other = new_stream(c)
    c("cuStreamBeginCapture(RELAXED)", d.cuStreamBeginCapture, s, MODES["RELAXED"])
    c("cuStreamIsCapturing(other stream)", d.cuStreamIsCapturing, other)
    c.val("other_during", status(other))
    end(c, "cuStreamEndCapture(RELAXED)", s)
    c("cuStreamIsCapturing(legacy stream)", d.cuStreamIsCapturing, d.CUstream(0))


@probe("G_capture_legacy_query", isolated=True)
def g_legacy_query(c: Case):
    s = new_stream(c, flags=0)  # a blocking stream: the legacy stream synchronizes with it
    c("cuStreamBeginCapture(GLOBAL)", d.cuStreamBeginCapture, s, MODES["GLOBAL"])
    c("cuStreamIsCapturing(legacy stream, during)", d.cuStreamIsCapturing, d.CUstream(0))
    c.val("status_after_legacy_query", status(s))
    end(c, "cuStreamEndCapture", s)
    r = c("cuStreamBeginCapture(legacy stream)", d.cuStreamBeginCapture, d.CUstream(0),
          MODES["GLOBAL"])
    if r.ok:
        end(c, "cuStreamEndCapture(legacy stream)", d.CUstream(0))
    ctx_after(c)


@probe("G_alloc_free_nodes", isolated=True)
def g_nodes(c: Case):
    s = new_stream(c)
    pool = ok(d.cuDeviceGetMemPool, d.CUdevice(0)).v
    outside = dalloc(c, MiB)
    pre = ok(d.cuMemAllocFromPoolAsync, MiB, pool, s).v  # an ordinary pool allocation
    call(d.cuStreamSynchronize, s)
    c.val("graph_mem_before", graph_mem())
    c("cuStreamBeginCapture(GLOBAL)", d.cuStreamBeginCapture, s, MODES["GLOBAL"])
    a = c("cuMemAllocAsync(capturing)", d.cuMemAllocAsync, MiB, s)
    b = c("cuMemAllocFromPoolAsync(capturing)", d.cuMemAllocFromPoolAsync, MiB, pool, s)
    if a.ok:
        c("cuMemsetD8Async(graph alloc)", d.cuMemsetD8Async, a.v, 7, MiB, s)
        c("cuMemFreeAsync(graph alloc, capturing)", d.cuMemFreeAsync, a.v, s)
    c("cuMemFreeAsync(pool alloc made before capture, capturing)", d.cuMemFreeAsync, pre, s)
    c("cuMemFreeAsync(cuMemAlloc ptr, capturing)", d.cuMemFreeAsync, outside, s)
    c.val("status_before_end", status(s))
    graph = end(c, "cuStreamEndCapture", s)
    c.val("addresses_distinct", bool(a.ok and b.ok and P(a.v) != P(b.v)))
    if a.ok:
        r = call(d.cuPointerGetAttribute,
                 d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a.v)
        c.val("graph_alloc_memtype_before_launch", jv(r.v) if r.ok else r.name)
    if graph is None:
        ctx_after(c)
        return
    c.val("nodes", node_count(graph))
    ex = instantiate(c, graph)
    c.val("graph_mem_after_instantiate", graph_mem())
    if ex is not None:
        c("cuGraphLaunch", d.cuGraphLaunch, ex, s)
        c("sync", d.cuStreamSynchronize, s)
        c.val("graph_mem_after_launch", graph_mem())
        if b.ok:
            r = call(d.cuPointerGetAttribute,
                     d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, b.v)
            c.val("from_pool_alloc_pool_is_pool", bool(r.ok and P(r.v) == P(pool)))
            c.val("from_pool_alloc_pool_attr", r.name)
            c("cuMemFreeAsync(pool-captured alloc after launch)", d.cuMemFreeAsync, b.v, s)
            c("sync#2", d.cuStreamSynchronize, s)
        c.val("graph_mem_after_free", graph_mem())
        c("cuGraphExecDestroy", d.cuGraphExecDestroy, ex)
        c.cleanup = [(fn, args) for fn, args in c.cleanup if not (
            fn is d.cuGraphExecDestroy and args[0] is ex)]
        c.val("graph_mem_after_exec_destroy", graph_mem())
        c("cuDeviceGraphMemTrim", d.cuDeviceGraphMemTrim, d.CUdevice(0))
        c.val("graph_mem_after_trim", graph_mem())
    r = call(d.cuMemGetAddressRange, pre)
    c.val("pre_alloc_alive_after_capture", r.name)
    call(d.cuMemFreeAsync, pre, s)
    call(d.cuStreamSynchronize, s)
    ctx_after(c)


@probe("G_free_outside_graph", isolated=True)
def g_free_outside(c: Case):
    s = new_stream(c)
    s2 = new_stream(c)
    c("cuStreamBeginCapture(GLOBAL)", d.cuStreamBeginCapture, s, MODES["GLOBAL"])
    a = c("cuMemAllocAsync(capturing)", d.cuMemAllocAsync, MiB, s)
    if a.ok:  # (a free on another stream now would invalidate the capture: G_calls_during_capture)
        c("cuMemsetD8Async", d.cuMemsetD8Async, a.v, 7, MiB, s)
    graph = end(c, "cuStreamEndCapture", s)
    ex = instantiate(c, graph) if graph is not None else None
    if ex is None or not a.ok:
        ctx_after(c)
        return
    c.val("nodes", node_count(graph))
    c("cuMemFreeAsync(before launch)", d.cuMemFreeAsync, a.v, s2)
    c("cuMemFree(before launch)", d.cuMemFree, a.v)
    c("cuGraphLaunch#1", d.cuGraphLaunch, ex, s)
    c("sync#1", d.cuStreamSynchronize, s)
    c.val("graph_mem_launched", graph_mem())
    c("cuGraphLaunch#2 (allocation not freed)", d.cuGraphLaunch, ex, s)
    c("sync#2", d.cuStreamSynchronize, s)
    c("cuMemFreeAsync(after launch, other stream)", d.cuMemFreeAsync, a.v, s2)
    c("sync other", d.cuStreamSynchronize, s2)
    c.val("graph_mem_freed", graph_mem())
    c("cuMemFreeAsync(again)", d.cuMemFreeAsync, a.v, s2)
    c("cuGraphLaunch#3 (after free)", d.cuGraphLaunch, ex, s)
    c("sync#3", d.cuStreamSynchronize, s)
    c("cuMemFree(after relaunch, synchronous)", d.cuMemFree, a.v)
    c.val("graph_mem_end", graph_mem())
    c("cuGraphLaunch#4 (after synchronous free)", d.cuGraphLaunch, ex, s)
    c("sync#4", d.cuStreamSynchronize, s)
    c("cuGraphExecDestroy (allocation live)", d.cuGraphExecDestroy, ex)
    c.cleanup = [(fn, args) for fn, args in c.cleanup if not (
        fn is d.cuGraphExecDestroy and args[0] is ex)]
    r = call(d.cuMemGetAddressRange, a.v)
    c.val("alive_after_exec_destroy", r.name)
    c("cuMemFreeAsync(after exec destroyed)", d.cuMemFreeAsync, a.v, s2)
    c("sync end", d.cuStreamSynchronize, s2)
    c("cuDeviceGraphMemTrim", d.cuDeviceGraphMemTrim, d.CUdevice(0))
    c.val("graph_mem_trimmed", graph_mem())
    ctx_after(c)


def _during_capture(c: Case, mode: str, what: str, fn, *args):
    """Begin a capture on a fresh stream in ``mode``, make one call, end the capture."""
    s = new_stream(c)
    c(f"{mode}:begin", d.cuStreamBeginCapture, s, MODES[mode])
    r = c(f"{mode}:{what}", fn, *args)
    c.val(f"{mode}:{what}:status_after", status(s))
    g = end(c, f"{mode}:{what}:end", s)
    if g is not None:
        c.val(f"{mode}:{what}:nodes", node_count(g))
    return r


@probe("G_calls_during_capture", isolated=True)
def g_calls_during(c: Case):
    pool = ok(d.cuDeviceGetMemPool, d.CUdevice(0)).v
    other = new_stream(c)
    for mode in ("GLOBAL", "THREAD_LOCAL", "RELAXED"):
        r = _during_capture(c, mode, "cuMemAlloc", d.cuMemAlloc, MiB)
        if r.ok:
            call(d.cuMemFree, r.v)
        p = ok(d.cuMemAlloc, MiB).v
        r = _during_capture(c, mode, "cuMemFree", d.cuMemFree, p)
        if not r.ok:
            call(d.cuMemFree, p)
        _during_capture(c, mode, "cuStreamSynchronize(other)", d.cuStreamSynchronize, other)
        _during_capture(c, mode, "cuStreamQuery(other)", d.cuStreamQuery, other)
        _during_capture(c, mode, "cuCtxSynchronize", d.cuCtxSynchronize)
        r = _during_capture(c, mode, "cuMemAllocFromPoolAsync(other)",
                            d.cuMemAllocFromPoolAsync, MiB, pool, other)
        if r.ok:
            call(d.cuMemFreeAsync, r.v, other)
        q = ok(d.cuMemAllocFromPoolAsync, MiB, pool, other).v
        call(d.cuStreamSynchronize, other)
        r = _during_capture(c, mode, "cuMemFreeAsync(other)", d.cuMemFreeAsync, q, other)
        if not r.ok:
            call(d.cuMemFreeAsync, q, other)
        r = _during_capture(c, mode, "cuMemHostAlloc", d.cuMemHostAlloc, 4096, 0)
        if r.ok:
            call(d.cuMemFreeHost, r.v)
        call(d.cuStreamSynchronize, other)
        # PyTorch's way around its own allocations: relaxed for the calls, then back.
        s = new_stream(c)
        c(f"{mode}:begin(exchange)", d.cuStreamBeginCapture, s, MODES[mode])
        r = c(f"{mode}:cuThreadExchangeStreamCaptureMode(RELAXED)",
              d.cuThreadExchangeStreamCaptureMode, MODES["RELAXED"])
        c.val(f"{mode}:exchange_previous", jv(r.v) if r.ok else r.name)
        r = c(f"{mode}:cuMemAlloc(exchanged)", d.cuMemAlloc, MiB)
        if r.ok:
            call(d.cuMemFree, r.v)
        r = c(f"{mode}:cuThreadExchangeStreamCaptureMode(back)",
              d.cuThreadExchangeStreamCaptureMode, MODES["GLOBAL"])
        c.val(f"{mode}:exchange_back_previous", jv(r.v) if r.ok else r.name)
        end(c, f"{mode}:end(exchange)", s)
    ctx_after(c)


@probe("G_graph_mem_trim")
def g_trim(c: Case):
    c.val("initial", graph_mem())
    c("cuDeviceGraphMemTrim", d.cuDeviceGraphMemTrim, d.CUdevice(0))
    c("cuDeviceGraphMemTrim(device 7)", d.cuDeviceGraphMemTrim, d.CUdevice(7))
    c("cuDeviceGetGraphMemAttribute(device 7)", d.cuDeviceGetGraphMemAttribute,
      d.CUdevice(7), GM.CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)
    for a in (GM.CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, GM.CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH):
        c(f"cuDeviceSetGraphMemAttribute({a.name}, 0)", d.cuDeviceSetGraphMemAttribute,
          d.CUdevice(0), a, d.cuuint64_t(0))
    c("cuDeviceSetGraphMemAttribute(USED_MEM_CURRENT)", d.cuDeviceSetGraphMemAttribute,
      d.CUdevice(0), GM.CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, d.cuuint64_t(0))
    c.val("after_reset", graph_mem())
