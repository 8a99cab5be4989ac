"""The block cache: freed pool blocks kept per stream and size, lent again without the driver.

A driver pool allocation + free (``cuMemAllocFromPoolAsync`` +
``cuMemFreeAsync``) costs two calls through the bindings, ~1 µs each on the
H100's host. CuPy's and PyTorch's allocators are fast because a freed block
goes to a per-stream cache, not to the driver; a :class:`BlockCache` does the
same in front of any memory pool (device, pinned host, managed). It serves
``MemoryPool(cache=True)``, ``HostBuffer.pooled`` (the pinned cache of
:mod:`cuda_memkit._host._pinned_pool`) and the CuPy and numba adaptors.

Semantics
---------
* **Per stream.** A block freed on stream S waits in S's free lists and is
  lent again only to an allocation on S: stream order makes that safe
  without an event (work queued on S before the free runs before work queued
  on S after the new allocation). Other streams get that memory only after it
  has gone back to the driver pool (``cuMemFreeAsync`` on S).
* **Sizes** are rounded (:func:`round_size`): up to 1 MiB to a multiple of
  512 B; above, to a multiple of 1/8 of the largest power of two not above
  the size (at most 12.5 % more). Requests above the cache's ``max_block``
  are not cached; 0-byte requests never reach it.
* **Back to the driver** (``cuMemFreeAsync`` on the block's stream): on
  :meth:`BlockCache.clear` (``pool.trim()`` / ``pool.empty_cache()``); for a
  free that would take the cache past its ``limit`` (that block goes back);
  when an allocation runs out of memory (every block goes back, the streams
  they were freed on are synchronized, the allocation is retried once); when
  S is closed or collected, before the stream is destroyed
  (:data:`~cuda_memkit._core._device.stream_close_hooks`); when the cache is
  closed (its pool is closed or collected).
* **Statistics**: a cached block is not in use: the ledger account of the
  memory removes it when its user frees it, and counts the cache's bytes in
  :attr:`~cuda_memkit._core._resource.Account.cached`. The driver counts it
  as used (``pool.stats()``).

Threads
-------
No lock on the lending and returning paths. They rely on what CPython
guarantees with and without the GIL (free-threaded builds lock each list and
dict internally): ``list.append``, ``list.pop``, ``dict.get``,
``dict.setdefault`` and ``dict.pop`` are atomic, so two threads popping the
same list never get the same block, and a block is in at most one list or
one user's hands at a time. The byte counters (``cached``, ``peak``) are
plain ``+=`` updates: exact under the GIL (no call between load and store),
approximate under free-threading, as the ledger's are. The rare paths
(making a stream's free lists, draining) take the cache's lock.

A stream's free lists are made once and dropped only when the stream is
closed or collected (or the cache closed): users of the cache (a pool
buffer, a CuPy memory object) hold the size dict of their stream and give
their block back to it without a lookup. A closed cache has a negative limit,
so anything given back then goes to the driver.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from .._core import _driver
from .._core._constants import INVALID_CONTEXT, LEGACY_STREAMS, STREAM_LEGACY
from .._core._device import (
    CONTEXT_ERRORS,
    Stream,
    StreamRef,
    custream,
    ensure_context,
    primary_pushed,
    stream_close_hooks,
)
from .._core._errors import CudaOutOfMemoryError, MemkitWarning
from .._core._resource import Account

__all__ = ["DEFAULT_CACHE_LIMIT", "DEFAULT_MAX_BLOCK", "BlockCache", "alloc_block",
           "check_cache_limit", "driver_pair", "empty_all", "free_failed", "round_size"]

#: Default most bytes a device or managed pool's cache holds (``cache_limit``).
DEFAULT_CACHE_LIMIT = 1 << 30
#: Default largest block cached: larger requests go to the driver pool every time.
DEFAULT_MAX_BLOCK = 64 << 20
#: Sizes up to this are rounded to multiples of :data:`GRANULE`.
SMALL = 1 << 20
#: Rounding granularity of small blocks.
GRANULE = 512

_OUT_OF_MEMORY = 2  # CUDA_ERROR_OUT_OF_MEMORY

# cuMemAllocFromPoolAsync and cuMemFreeAsync, resolved by driver_pair().
ALLOC: Any = None
FREE: Any = None


def driver_pair() -> tuple[Any, Any]:
    """Resolve (once) and return ``(cuMemAllocFromPoolAsync, cuMemFreeAsync)``."""
    global ALLOC, FREE
    if FREE is None:
        ALLOC = _driver.function("cuMemAllocFromPoolAsync")
        FREE = _driver.function("cuMemFreeAsync")
    return ALLOC, FREE


def round_size(nbytes: int) -> int:
    """The size a cached block of ``nbytes`` (> 0) has.

    Up to 1 MiB: the next multiple of 512 B. Above: the next multiple of 1/8
    of the largest power of two not above ``nbytes`` (so at most 12.5 % more).
    The hot paths write the first case out: ``(n + 511) & -512``.
    """
    if nbytes <= SMALL:
        return (nbytes + GRANULE - 1) & -GRANULE
    step = 1 << (nbytes.bit_length() - 4)
    return (nbytes + step - 1) & -step


def check_cache_limit(limit: object) -> int:
    """``cache_limit`` checked: an int >= 0 (bool refused), else TypeError / ValueError."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"cache_limit must be an int (bytes), not {type(limit).__name__}")
    if limit < 0:
        raise ValueError(f"cache_limit must be >= 0, got {limit}")
    return limit


# -- one pool allocation, and a refused free ------------------------------------------------


def free_failed(res: Any, dptr: Any, cus: Any, device: int | None,
                recover_stream: bool = True) -> Any:
    """Recover a ``cuMemFreeAsync`` the driver refused; return the stream it was freed on.

    * No usable current context (:data:`CONTEXT_ERRORS`: none on this thread, or
      one destroyed behind its back): retried with the device's primary context
      pushed (device 0 for host and managed pools), the thread's own restored.
    * Still ``CUDA_ERRORINVALID_CONTEXT`` with a context current: the stream
      itself is gone (a handle destroyed while the buffer lived, as the H100
      answers, invalid_context_probe "destroyed_stream"). Work queued on it may
      have used the memory, so the device is synchronized and the memory freed
      on the legacy stream, with a :class:`MemkitWarning` about the stream;
      unless ``recover_stream`` is false (a stream the caller of ``free()``
      named): then the error is raised and the memory stays allocated.
    * Anything else raises the driver's error.
    """
    import warnings

    code = int(res[0])
    if code in CONTEXT_ERRORS:
        with primary_pushed(device or 0):
            res = FREE(dptr, cus)
            if not res[0]:
                return cus
            if (recover_stream and int(res[0]) == INVALID_CONTEXT
                    and int(cus) not in LEGACY_STREAMS):
                _driver.call("cuCtxSynchronize")
                legacy = custream(STREAM_LEGACY)
                res = FREE(dptr, legacy)
                if not res[0]:
                    warnings.warn(
                        f"cuda_memkit: pool buffer 0x{int(dptr):x} outlived its stream "
                        f"0x{int(cus):x} (destroyed while the buffer was alive): freed on the "
                        "legacy stream after synchronizing the device. Keep a stream alive "
                        "while buffers allocated on it are (pass the Stream object, not its "
                        "handle)", MemkitWarning, stacklevel=4)
                    return legacy
    _driver.check("cuMemFreeAsync", res)
    return cus  # pragma: no cover - check() raised


def alloc_block(nbytes: int, cupool: Any, cus: Any, device: int | None,
                cache: BlockCache | None = None) -> Any:
    """One pool allocation (``cuMemAllocFromPoolAsync``), with the retries; the ``CUdeviceptr``.

    The one place that handles a refused pool allocation (``MemoryPool``, the
    CuPy adaptor and the pinned cache call it, on a miss):

    * no current context on this thread (a default stream, a finalizer
      thread): device ``device``'s primary context is made current (device 0
      for host and managed pools) and the call retried;
    * out of memory with blocks in ``cache``: the cache gives them all back
      (:meth:`BlockCache.release_for_retry`) and the call is retried once; if
      it fails again, the :class:`CudaOutOfMemoryError` says how many cached
      bytes were released.
    """
    res = ALLOC(nbytes, cupool, cus)
    if not res[0]:
        return res[1]
    if int(res[0]) == INVALID_CONTEXT and not int(_driver.call("cuCtxGetCurrent")):
        ensure_context(device)
        res = ALLOC(nbytes, cupool, cus)
        if not res[0]:
            return res[1]
    if int(res[0]) == _OUT_OF_MEMORY and cache is not None and cache.cached:
        released = cache.release_for_retry()
        res = ALLOC(nbytes, cupool, cus)
        if not res[0]:
            return res[1]
        try:
            _driver.check("cuMemAllocFromPoolAsync", res)
        except CudaOutOfMemoryError as exc:
            raise CudaOutOfMemoryError(
                exc.code, exc.api, exc.name,
                (exc.description + "; " if exc.description else "")
                + f"after the block cache released {released} cached bytes and the "
                f"allocation of {nbytes} bytes was retried") from None
    _driver.check("cuMemAllocFromPoolAsync", res)
    raise AssertionError("unreachable")  # pragma: no cover


# -- the cache --------------------------------------------------------------------------------

#: Every open cache, for the stream close hook and empty_all().
_caches: weakref.WeakSet[BlockCache] = weakref.WeakSet()
# Re-entrant: a garbage collection inside a locked block may collect a Stream, whose
# close hook takes the same locks on the same thread.
_caches_lock = threading.RLock()


class BlockCache:
    """Freed blocks of one driver pool, per stream and rounded size.

    Parameters
    ----------
    cupool : CUmemoryPool
        The pool blocks come from and go back to.
    device : int or None
        Device whose primary context releases need (``None``: host or managed
        memory; device 0's context is used).
    account : Account
        The ledger account of the memory lent from this cache: the cache
        reports its bytes there (:attr:`Account.cached`).
    limit : int
        Most bytes held (a free beyond it goes to the driver).
    max_block : int
        Largest rounded size cached.

    Attributes
    ----------
    streams : dict
        Stream handle -> {rounded size -> list of free blocks}. A block is
        whatever its user gives back (a ``CUdeviceptr``, or an object with a
        ``dptr``); only :meth:`clear` and the close paths look inside.
    cached, peak : int
        Bytes held now, and the most held at once (:meth:`Account.reset_peak`).
    misses : int
        Allocations the cache could not serve (they went to the driver).
    released : int
        Bytes given back to the driver by flushes so far.
    """

    __slots__ = ("__weakref__", "account", "cached", "cupool", "custreams", "device", "limit",
                 "lock", "max_block", "misses", "owners", "peak", "released", "streams")

    def __init__(self, cupool: Any, device: int | None, account: Account, limit: int,
                 max_block: int = DEFAULT_MAX_BLOCK) -> None:
        driver_pair()
        self.cupool = cupool
        self.device = device
        self.account = account
        self.limit = limit
        self.max_block = max_block
        self.streams: dict[int, dict[int, list[Any]]] = {}
        self.custreams: dict[int, Any] = {}  # handle -> CUstream, for the releases
        self.owners: dict[int, object] = {}  # handle -> stream object kept alive (foreign)
        self.cached = 0
        self.peak = 0
        self.misses = 0
        self.released = 0
        self.lock = threading.RLock()  # re-entrant: see _caches_lock
        account.caches.append(self)
        with _caches_lock:
            _caches.add(self)

    @property
    def open(self) -> bool:
        """Whether the cache takes blocks back (false once closed)."""
        return self.limit >= 0

    @property
    def block_cache(self) -> BlockCache:
        """Itself (what a pool asks every cache in front of it for; see MemoryPool.cached_bytes)."""
        return self

    def bins(self, handle: int, cus: Any, owner: object = None) -> dict[int, list[Any]]:
        """The free lists of stream ``handle`` (made on first use).

        ``owner`` is the stream object given, which must outlive the blocks
        cached for it (a CuPy or torch stream, or the ``StreamRef`` holding
        one): the cache keeps it until the stream's lists are dropped. A
        cuda_memkit :class:`Stream` needs none: its close and its collection
        empty its lists first.
        """
        sb = self.streams.get(handle)
        if sb is None:
            if type(owner) is StreamRef:
                owner = owner.obj
            elif isinstance(owner, Stream):
                owner = None
            with self.lock:
                sb = self.streams.get(handle)
                if sb is None:
                    self.custreams[handle] = cus
                    if owner is not None:
                        self.owners[handle] = owner
                    sb = self.streams[handle] = {}
        return sb

    def lend(self, size: int, handle: int, cus: Any, owner: object = None
             ) -> tuple[Any, list[Any]]:
        """A free block of rounded ``size`` for stream ``handle``, and the list it goes back to.

        The block is ``None`` on a miss: the caller allocates one (:meth:`miss`)
        and gives it back to that list later. ``cus`` and ``owner`` make the
        stream's lists on first use (see :meth:`bins`). The one lending path of
        the pools, the CuPy adaptor and the pinned cache.
        """
        sb = self.streams.get(handle)
        if sb is None:
            sb = self.bins(handle, cus, owner)
        blocks = sb.get(size)
        if blocks is None:  # the first block of this size on this stream
            blocks = sb.setdefault(size, [])
        if blocks:
            try:
                block = blocks.pop()
            except IndexError:  # another thread took the last one
                return None, blocks
            self.cached -= size
            return block, blocks
        return None, blocks

    def miss(self, size: int, cus: Any) -> Any:
        """Allocate a block of rounded ``size`` from the driver pool on ``cus`` (a miss)."""
        self.misses += 1
        return alloc_block(size, self.cupool, cus, self.device, self)

    def put(self, block: Any, size: int, blocks: list[Any], cus: Any) -> None:
        """Take ``block`` of rounded ``size`` back into free list ``blocks`` (of stream ``cus``).

        Past the limit (or once closed) it goes to the driver instead. The
        hot paths write this out.
        """
        if not self.keep(block, size, blocks):
            self.free_block(block, cus)

    def keep(self, block: Any, size: int, blocks: list[Any]) -> bool:
        """Take ``block`` back into ``blocks`` if within the limit; False: the caller frees it."""
        c = self.cached + size
        if c <= self.limit:
            blocks.append(block)
            self.cached = c
            if c > self.peak:
                self.peak = c
            return True
        return False

    def take_back(self, block: Any, size: int, blocks: list[Any]) -> bool:
        """Take ``block`` out of free list ``blocks`` again: its stream was closed meanwhile.

        A block given back while another thread closes its stream may land in
        a list the close has already drained (and dropped): the giver checks
        the stream after the append and takes the block back to free it
        itself. False when the close's drain took it first (and freed it).
        """
        try:
            blocks.remove(block)
        except ValueError:
            return False
        self.cached -= size
        return True

    def free_block(self, block: Any, cus: Any) -> None:
        """Give one block back to the driver pool, on stream ``cus``."""
        d = getattr(block, "dptr", block)
        res = FREE(d, cus)
        if res[0]:
            free_failed(res, d, cus, self.device)

    # -- back to the driver --------------------------------------------------------------
    def _drain(self, handle: int, sb: dict[int, list[Any]]) -> int:
        """Give every block of one stream's lists back on that stream; the bytes released.

        Under the cache's lock, and only while the stream's lists are still
        registered: a drain from another thread (``clear()``) never frees on a
        stream whose close has already drained and dropped them (and may have
        destroyed it).
        """
        with self.lock:
            if self.streams.get(handle) is not sb:
                return 0
            cus = self.custreams.get(handle)
            n = 0
            for size, blocks in list(sb.items()):
                while blocks:
                    try:
                        block = blocks.pop()
                    except IndexError:  # another thread took the last one
                        break
                    self.cached -= size
                    n += size
                    self.free_block(block, cus)
            self.released += n
            return n

    def clear(self) -> int:
        """Give every cached block back to the driver pool; return the bytes released."""
        n = 0
        for handle, sb in list(self.streams.items()):
            n += self._drain(handle, sb)
        return n

    def release_for_retry(self) -> int:
        """Out of memory: give everything back and wait for those streams; the bytes released.

        Memory freed on stream S is reusable by another stream once S's work
        before the free is done: the streams are synchronized so that the
        retried allocation can use it whatever stream it is on.
        """
        n = 0
        for handle, sb in list(self.streams.items()):
            with self.lock:  # the stream's close waits for it: no sync on a destroyed stream
                m = self._drain(handle, sb)
                if m:
                    n += m
                    cus = self.custreams.get(handle)
                    if cus is not None:
                        _driver.call("cuStreamSynchronize", cus)
        return n

    def drop_stream(self, handle: int) -> int:
        """Stream ``handle`` is about to be destroyed: release its blocks, forget its lists."""
        with self.lock:  # drained and dropped in one step: see _drain
            sb = self.streams.get(handle)
            if sb is None:
                return 0
            n = self._drain(handle, sb)
            self.streams.pop(handle, None)
            self.owners.pop(handle, None)
            self.custreams.pop(handle, None)
        return n

    def close(self) -> None:
        """Release everything for good (the pool is about to be destroyed)."""
        self.limit = -1
        self.clear()
        with _caches_lock:
            _caches.discard(self)
        try:
            self.account.caches.remove(self)
        except ValueError:  # closed before
            pass

    def __repr__(self) -> str:
        state = "" if self.open else " closed"
        return (f"<BlockCache{state} {self.cached} bytes in {len(self.streams)} stream(s), "
                f"limit {self.limit}, {self.misses} misses>")


def _on_stream_close(handle: int) -> None:
    """Stream close hook: every cache gives the stream's blocks back while it exists."""
    with _caches_lock:
        caches = list(_caches)
    for cache in caches:
        if handle in cache.streams:
            cache.drop_stream(handle)


stream_close_hooks.append(_on_stream_close)


def empty_all() -> int:
    """Give every block of every open cache back to the driver (tests' leak checks)."""
    with _caches_lock:
        caches = list(_caches)
    return sum(cache.clear() for cache in caches)
