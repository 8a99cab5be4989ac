"""Context situations a finalizer may be collected in, on either backend.

* :func:`created_context`: a non-primary context (``cuCtxCreate``) of a device,
  current on the calling thread inside the block (the previous context is
  current again afterwards).
* :func:`stale_context_current`: a created context that another thread
  destroyed while it was current here, left current on the calling thread
  (``cuCtxDestroy`` leaves it current on other threads; the documented answer
  to their calls is ``CUDA_ERROR_CONTEXT_IS_DESTROYED``).
* :func:`other_device_current`: device 1's primary context current (two devices).

All of them restore the calling thread's current context at exit.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from cuda.bindings import driver as cu

import cuda_memkit as cm
from cuda_memkit._core import _context, _driver


def current() -> int:
    """The calling thread's current context handle (0: none)."""
    return int(_driver.call("cuCtxGetCurrent"))


def on_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on a new thread (no current context); return or raise its result."""
    box: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            box.append((True, fn()))
        except BaseException as exc:  # handed back to the caller
            box.append((False, exc))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    ok, value = box[0]
    if not ok:
        raise value
    return value


@contextlib.contextmanager
def created_context(device: int = 0) -> Iterator[int]:
    """A ``cuCtxCreate`` context of ``device`` current inside the block."""
    prev = current()
    ctx = _driver.call("cuCtxCreate", None, 0, cu.CUdevice(device))
    try:
        yield int(ctx)
    finally:
        _driver.call("cuCtxDestroy", ctx)  # pops it (it is current here)
        if current() != prev:
            _driver.call("cuCtxSetCurrent", prev)


@contextlib.contextmanager
def stale_context_current(device: int = 0) -> Iterator[int]:
    """A destroyed context left current on the calling thread inside the block."""
    _context.primary_context(device)  # the primary context outlives the block
    prev = current()
    ctx = on_thread(lambda: _driver.call("cuCtxCreate", None, 0, cu.CUdevice(device)))
    _driver.call("cuCtxSetCurrent", ctx)
    try:
        on_thread(lambda: _driver.call("cuCtxDestroy", ctx))
        assert current() == int(ctx), "the destroyed context should stay current here"
        yield int(ctx)
    finally:
        _driver.call("cuCtxSetCurrent", prev)


@contextlib.contextmanager
def other_device_current() -> Iterator[int]:
    """Device 1's primary context current inside the block (needs two devices)."""
    if cm.device_count() < 2:
        pytest.skip("needs two devices")
    prev = current()
    _context.ensure_context(1)
    try:
        yield current()
    finally:
        _driver.call("cuCtxSetCurrent", prev)


# -- simulator: free what a failed release left behind -----------------------------------


def sim_mark() -> dict[str, set[int]]:
    """What exists now on the simulator (allocations, streams, events, VMM, pools)."""
    from cuda_memkit.sim import machine

    m = machine()
    return {
        "allocs": set(m.allocs), "streams": set(m.streams), "events": set(m.events),
        "ranges": set(m.ext.get("vmm.ranges", {})), "handles": set(m.ext.get("vmm.handles", {})),
        "pools": set(m.ext.get("pool.pools", {})),
    }


def sim_release_since(mark: dict[str, set[int]]) -> list[str]:
    """Free (with raw driver calls) what appeared since ``mark``; return what it freed.

    For tests whose subject failed to release memory: the test has already
    failed, and this keeps the leftovers from changing what later tests see
    (device bytes in use, default pool statistics).
    """
    from cuda_memkit.sim import machine

    m = machine()
    _context.ensure_context(0)
    freed: list[str] = []
    release = {"device": "cuMemFree", "managed": "cuMemFree", "pinned": "cuMemFreeHost",
               "registered": "cuMemHostUnregister"}
    new = [a for start, a in sorted(m.allocs.items()) if start not in mark["allocs"]]
    for a in new:
        if a.kind == "vmm":
            _driver.call("cuMemUnmap", a.start, a.size)
        elif "pool" in a.extra:
            _driver.call("cuMemFreeAsync", a.start, 0)
        elif a.kind in release:
            _driver.call(release[a.kind], a.start)
        else:
            continue
        freed.append(f"{a.kind} 0x{a.start:x}")
    for h in sorted(set(m.ext.get("vmm.handles", {})) - mark["handles"]):
        _driver.call("cuMemRelease", h)
        freed.append(f"handle 0x{h:x}")
    for r in sorted(set(m.ext.get("vmm.ranges", {})) - mark["ranges"]):
        _driver.call("cuMemAddressFree", r, m.ext["vmm.ranges"][r].size)
        freed.append(f"range 0x{r:x}")
    for p in sorted(set(m.ext.get("pool.pools", {})) - mark["pools"]):
        _driver.call("cuMemPoolDestroy", p)
        freed.append(f"pool 0x{p:x}")
    for s in sorted(set(m.streams) - mark["streams"]):
        _driver.call("cuStreamDestroy", s)
        freed.append(f"stream 0x{s:x}")
    for e in sorted(set(m.events) - mark["events"]):
        _driver.call("cuEventDestroy", e)
        freed.append(f"event 0x{e:x}")
    return freed
