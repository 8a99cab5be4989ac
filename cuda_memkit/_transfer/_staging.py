"""Staged copies between pageable numpy memory and device memory.

The driver copies pageable memory through its own small bounce buffer, one
piece at a time, at a fraction of pinned memory's speed (figures in
``docs/benchmarks.md``). This module pipelines the same copy through pinned
staging buffers it keeps for reuse:

* host to device: worker threads copy chunks of the array into free staging
  buffers (numpy releases the GIL), while the calling thread issues the DMA
  of filled buffers on two streams and records an event per buffer; a
  buffer is refilled once its event has completed;
* device to host: the calling thread issues the DMA of each chunk into a free
  buffer and records its event; a worker waits for the event and copies the
  buffer into the array; a buffer is reused once drained.

A staged copy is complete when it returns and is ordered after the work
already queued on its stream (the legacy default stream by default), like
:func:`copy`. Copies below :attr:`StagingSettings.threshold`, pinned arrays,
managed memory and ``enabled=False`` go through the driver's path instead.

The staging memory (one pinned ``HostBuffer`` of ``buffers * chunk`` bytes),
the streams, events and worker threads are made on first use, per device,
and kept for the next copy; :func:`release_staging` gives them back. An error in the
middle of a copy drains the pipeline (every queued chunk finished or
cancelled, the streams synchronised), releases everything, and re-raises.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from cuda.bindings import driver as _cu

from .._core import _capture, _driver
from .._core._checks import MAX_NBYTES, check_int
from .._core._constants import EVENT_DISABLE_TIMING
from .._core._context import ensure_context
from .._core._errors import CudaError
from .._core._pointers import MEMORYTYPE_DEVICE, device_with_access, memory_type, owning_device
from .._core._stream import Stream, StreamLike, stream_handle
from .._host._pinned import HostBuffer

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "StagingSettings",
    "configure_staging",
    "release_staging",
    "staged_copy",
    "staging_settings",
    "staging_wanted",
]

MiB = 1 << 20
_IS_MANAGED = _cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_IS_MANAGED
THREAD_PREFIX = "cuda_memkit-staging"


def _default_threads() -> int:
    """One staging thread per CPU this process may run on, at most 16."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(16, cpus))


#: Upper bounds of the settings: past them a ring could never be made (a chunk
#: must fit a ``cuMemHostAlloc``), and a bad value would break every later copy.
_LIMITS = {"threshold": MAX_NBYTES, "chunk": 1 << 30, "buffers": 64, "threads": 64,
           "streams": 32}


@dataclass(frozen=True)
class StagingSettings:
    """How pageable copies are staged (see :func:`configure_staging`).

    The defaults were chosen on the H100 (``docs/decisions.md``, "Staging
    defaults"): one worker thread per CPU up to 16, two buffers more than
    threads, so that every thread has a buffer to fill while two DMAs run.

    Attributes
    ----------
    enabled : bool
        Stage at all (``CUDA_MEMKIT_STAGING=0`` in the environment turns it off).
    threshold : int
        Smallest copy, in bytes, that is staged; smaller ones take the driver's path.
    chunk : int
        Bytes per staging buffer.
    buffers : int
        Number of staging buffers (pinned memory held: ``buffers * chunk``).
    threads : int
        Worker threads copying between the array and the staging buffers.
    streams : int
        Streams the DMA of the chunks alternates over.

    Each size has an upper bound (``chunk`` 1 GiB, ``buffers`` and ``threads``
    64, ``streams`` 32): larger values raise ``ValueError`` and leave the
    settings as they were.
    """

    enabled: bool = True
    threshold: int = 32 * MiB
    chunk: int = 8 * MiB
    buffers: int = field(default_factory=lambda: _default_threads() + 2)
    threads: int = field(default_factory=_default_threads)
    streams: int = 2

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise TypeError("enabled must be a bool")
        for name in ("threshold", "chunk", "buffers", "threads", "streams"):
            v = getattr(self, name)
            check_int(v, name)
            if v < (0 if name == "threshold" else 1):
                raise ValueError(f"{name} must be >= {0 if name == 'threshold' else 1}, got {v}")
            if v > _LIMITS[name]:
                raise ValueError(f"{name} must be <= {_LIMITS[name]}, got {v}")
        if self.buffers < 2:
            raise ValueError("buffers must be >= 2 (one filling while one is copied)")
        if self.chunk % 4096:
            raise ValueError(f"chunk must be a multiple of 4096 bytes, got {self.chunk}")


_settings = StagingSettings(enabled=os.environ.get("CUDA_MEMKIT_STAGING", "1") != "0")
_lock = threading.Lock()  # guards _settings and _rings
_rings: dict[int, _Ring] = {}


def staging_settings() -> StagingSettings:
    """The current staging settings."""
    return _settings


def configure_staging(**changes: Any) -> StagingSettings:
    """Change the staging settings; return the new ones.

    Parameters
    ----------
    **changes
        Fields of :class:`StagingSettings`: ``enabled``, ``threshold``,
        ``chunk``, ``buffers``, ``threads``, ``streams``.

    Raises
    ------
    TypeError, ValueError
        For unknown fields or bad values (the settings stay as they were).

    Notes
    -----
    Changing the sizes releases the staging memory made for the old ones (at
    the next copy, or now if no copy is running).
    """
    global _settings
    try:
        new = replace(_settings, **changes)
    except TypeError as exc:  # an unknown field
        raise TypeError(f"configure_staging(): {exc}") from None
    with _lock:
        old, _settings = _settings, new
        if _sizes(old) != _sizes(new):
            for ring in list(_rings.values()):
                if ring.lock.acquire(blocking=False):
                    try:
                        _rings.pop(ring.device, None)
                        ring.close()
                    finally:
                        ring.lock.release()
    return new


def release_staging() -> None:
    """Free the staging memory, streams, events and worker threads of every device.

    Waits for a staged copy in progress to finish first. The next staged copy
    makes them again.
    """
    with _lock:
        rings = list(_rings.values())
        _rings.clear()
    for ring in rings:
        with ring.lock:
            ring.close()


def cached_bytes() -> int:
    """Bytes of pinned staging memory held now."""
    with _lock:
        return sum(r.nbytes for r in _rings.values())


# -- the per-device ring ------------------------------------------------------------------


class _Ring:
    """Staging memory, streams, events and threads for one device and one settings."""

    def __init__(self, device: int, cfg: StagingSettings) -> None:
        self.device = device
        self.cfg = cfg
        self.lock = threading.Lock()  # one staged copy at a time per ring
        self.nbytes = 0
        self.events: list[Any] = []
        self.streams: list[Stream] = []
        self.pool: ThreadPoolExecutor | None = None
        self.arena: HostBuffer | None = None
        self.views: list[np.ndarray[Any, Any]] = []
        self.ptrs: list[int] = []
        try:
            ensure_context(device)
            self.arena = HostBuffer.empty(cfg.buffers * cfg.chunk)
            arr = self.arena.array
            self.views = [arr[i * cfg.chunk:(i + 1) * cfg.chunk] for i in range(cfg.buffers)]
            self.ptrs = [self.arena.ptr + i * cfg.chunk for i in range(cfg.buffers)]
            self.nbytes = self.arena.nbytes
            # Blocking streams: ordered with the legacy default stream, like cuMemcpy.
            for _ in range(cfg.streams):
                self.streams.append(Stream(device, non_blocking=False))
            for _ in range(cfg.buffers):
                self.events.append(_driver.call("cuEventCreate", EVENT_DISABLE_TIMING))
            self.pool = ThreadPoolExecutor(cfg.threads, thread_name_prefix=THREAD_PREFIX)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Give everything back (threads joined, events destroyed, memory freed)."""
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None
        for ev in self.events:
            try:
                _driver.call("cuEventDestroy", ev)
            except CudaError:
                pass  # the context is gone with it
        self.events = []
        for s in self.streams:
            s.close()
        self.streams = []
        self.views = []
        if self.arena is not None:
            self.arena.close()
            self.arena = None
        self.nbytes = 0


def _sizes(cfg: StagingSettings) -> tuple[int, int, int, int]:
    return cfg.chunk, cfg.buffers, cfg.threads, cfg.streams


def _ring(device: int) -> _Ring:
    with _lock:
        ring = _rings.get(device)
        if ring is not None and _sizes(ring.cfg) == _sizes(_settings):
            return ring
        if ring is not None:  # made for other sizes
            del _rings[device]
        cfg = _settings
    if ring is not None:
        with ring.lock:
            ring.close()
    new = _Ring(device, cfg)
    with _lock:
        other = _rings.setdefault(device, new)
    if other is not new:  # another thread made one meanwhile
        new.close()
    return other


# -- the pipeline ----------------------------------------------------------------------------


def _join(ring: _Ring, stream: int) -> None:
    """Make the staging streams wait for the work queued on ``stream``."""
    ev = _driver.call("cuEventCreate", EVENT_DISABLE_TIMING)
    try:
        _driver.call("cuEventRecord", ev, stream)
        for s in ring.streams:
            _driver.call("cuStreamWaitEvent", s.handle, ev, 0)
    finally:
        _driver.call("cuEventDestroy", ev)


def _h2d(ring: _Ring, dst: int, src: np.ndarray[Any, Any], futs: list[Future[None]]) -> None:
    """Pageable ``src`` (flat bytes) to device address ``dst``, through the ring."""
    chunk, nbuf, n = ring.cfg.chunk, ring.cfg.buffers, src.nbytes
    device, pool, events, views, ptrs = ring.device, ring.pool, ring.events, ring.views, ring.ptrs
    assert pool is not None
    streams = [s.handle for s in ring.streams]
    nchunks = -(-n // chunk)

    def fill(i: int, b: int, wait: bool) -> None:
        if wait:
            ensure_context(device)
            _driver.call("cuEventSynchronize", events[b])
        lo = i * chunk
        k = min(chunk, n - lo)
        views[b][:k] = src[lo:lo + k]

    copy_fn = _driver.function("cuMemcpyHtoDAsync")
    record_fn = _driver.function("cuEventRecord")
    check = _driver.check
    issued = 0

    def issue(j: int) -> None:
        futs[j].result()
        b = j % nbuf
        lo = j * chunk
        s = streams[j % len(streams)]
        check("cuMemcpyHtoDAsync", copy_fn(dst + lo, ptrs[b], min(chunk, n - lo), s))
        check("cuEventRecord", record_fn(events[b], s))

    for i in range(nchunks):
        while issued <= i - nbuf:  # the buffer's previous DMA is queued (and recorded)
            issue(issued)
            issued += 1
        futs.append(pool.submit(fill, i, i % nbuf, i >= nbuf))
    while issued < nchunks:
        issue(issued)
        issued += 1
    for s in streams:
        _driver.call("cuStreamSynchronize", s)


def _d2h(ring: _Ring, dst: np.ndarray[Any, Any], src: int, futs: list[Future[None]]) -> None:
    """Device address ``src`` to pageable ``dst`` (flat bytes), through the ring."""
    chunk, nbuf, n = ring.cfg.chunk, ring.cfg.buffers, dst.nbytes
    device, pool, events, views, ptrs = ring.device, ring.pool, ring.events, ring.views, ring.ptrs
    assert pool is not None
    streams = [s.handle for s in ring.streams]
    nchunks = -(-n // chunk)

    def drain(i: int, b: int) -> None:
        ensure_context(device)
        _driver.call("cuEventSynchronize", events[b])
        lo = i * chunk
        k = min(chunk, n - lo)
        dst[lo:lo + k] = views[b][:k]

    copy_fn = _driver.function("cuMemcpyDtoHAsync")
    record_fn = _driver.function("cuEventRecord")
    check = _driver.check
    for i in range(nchunks):
        b = i % nbuf
        if i >= nbuf:
            futs[i - nbuf].result()  # the buffer is drained
        lo = i * chunk
        s = streams[i % len(streams)]
        check("cuMemcpyDtoHAsync", copy_fn(ptrs[b], src + lo, min(chunk, n - lo), s))
        check("cuEventRecord", record_fn(events[b], s))
        futs.append(pool.submit(drain, i, b))
    for f in futs:
        f.result()


def _drain_after_error(ring: _Ring, futs: list[Future[None]]) -> None:
    """Cancel what has not started, wait for the rest, then release the ring."""
    for f in futs:
        f.cancel()
    wait_futures(futs)
    for s in ring.streams:
        try:
            _driver.call("cuStreamSynchronize", s.handle)
        except CudaError:
            pass  # the error being raised says more
    with _lock:
        if _rings.get(ring.device) is ring:
            del _rings[ring.device]
    ring.close()


def _flat_bytes(arr: Any, dst: bool) -> np.ndarray[Any, Any]:
    import numpy as np

    if not isinstance(arr, np.ndarray):
        raise TypeError(f"a staged copy needs a numpy array, not {type(arr).__name__}")
    if arr.nbytes and not arr.flags.c_contiguous:
        raise ValueError("a staged copy needs a C-contiguous array")
    if dst and not arr.flags.writeable:
        raise ValueError("the destination array is read-only")
    return arr.reshape(-1).view(np.uint8)


def _device_of(ptr: int) -> int | None:
    """The device whose ring copies device memory at ``ptr``; None for anything else.

    Memory of a context: that context's device. Pool or mapped memory (no
    context): the current context's device if it may read and write it,
    else the first device that may. Managed and host memory: None.
    """
    if memory_type(ptr) != MEMORYTYPE_DEVICE:
        return None
    res = _driver.function("cuPointerGetAttribute")(_IS_MANAGED, ptr)
    if res[0] or res[1]:
        return None
    try:
        owner = owning_device(ptr)
    except CudaError:
        return None
    return owner if owner is not None else device_with_access(ptr, ensure_context(None))


def staging_wanted(nbytes: int) -> bool:
    """Whether a pageable copy of ``nbytes`` goes through the ring (on, and at the threshold)."""
    cfg = _settings
    return cfg.enabled and nbytes >= max(cfg.threshold, 1)


def staged_copy(dst: Any, src: Any, nbytes: int | None = None, *,
                stream: StreamLike = None) -> bool:
    """Copy between a pageable numpy array and device memory through the staging ring.

    One side must be a C-contiguous numpy array, the other an int device
    address (plain device memory). It returns ``False``, having done
    nothing, when the copy should take the driver's path instead: staging
    is off, the copy is below the threshold, the stream captures into a CUDA
    graph, or the address is not plain device memory (managed, pinned,
    unknown). Pinned arrays are the caller's business (they need no staging).

    Parameters
    ----------
    dst, src : numpy.ndarray or int
        The array and the device address, in either order.
    nbytes : int, optional
        Bytes to copy (default: the whole array; at most the array).
    stream : stream-like, optional
        Order the copy after the work queued on this stream (default: the
        legacy default stream). The copy is complete on return either way.

    Returns
    -------
    bool
        Whether the copy was done here.

    Raises
    ------
    TypeError, ValueError
        Bad operands (before anything is issued).
    CudaError
        From the driver; the pipeline is drained and its resources released
        first.
    """
    import numpy as np

    h2d = isinstance(src, np.ndarray)
    arr = _flat_bytes(src if h2d else dst, dst=not h2d)
    ptr = dst if h2d else src
    check_int(ptr, "the device side of a staged copy", "an int address")
    n = arr.nbytes if nbytes is None else nbytes
    if not 0 <= check_int(n, "nbytes") <= arr.nbytes:
        raise ValueError(f"nbytes must be in [0, {arr.nbytes}], got {n!r}")
    h = stream_handle(stream)
    if not staging_wanted(n):
        return False
    if _capture.active and _capture.capture_id(_cu.CUstream(h)):
        return False  # the ring's host copies would run now, not at each launch of the graph
    prev = int(_driver.call("cuCtxGetCurrent"))
    if not prev:
        ensure_context(0)
    device = _device_of(ptr)
    if device is None:
        return False
    while True:
        ring = _ring(device)
        with ring.lock:
            if ring.pool is None:  # released by configure_staging() or release_staging()
                continue
            try:
                _run(ring, h2d, ptr, arr[:n], h)
            finally:
                if prev and int(_driver.call("cuCtxGetCurrent")) != prev:
                    _driver.call("cuCtxSetCurrent", prev)
            return True


def _run(ring: _Ring, h2d: bool, ptr: int, arr: np.ndarray[Any, Any], stream: int) -> None:
    ensure_context(ring.device)
    futs: list[Future[None]] = []
    try:
        _join(ring, stream)
        if h2d:
            _h2d(ring, ptr, arr, futs)
        else:
            _d2h(ring, arr, ptr, futs)
    except BaseException:
        _drain_after_error(ring, futs)
        raise
