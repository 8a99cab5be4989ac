"""The allocation core: where every pool block is taken from and given back to.

One way back
------------
Every kind that lends pool memory takes and gives back its blocks through one
object, a :class:`Bin`: pool buffers (cached or not), pinned buffers from a
pool (``HostBuffer.pooled``, ``HostBuffer.empty(pool=...)``) and the memory of
the CuPy and numba adaptors. A bin carries all that both operations need: the
:class:`BlockCache` it belongs to, its free list, the rounded size of its
blocks, the ledger account of the memory lent from it, its stream (the
``CUstream``; ``None`` once the stream is gone) and the driver pool:

* :meth:`Bin.take` -> a block: a free one of the bin (a hit, no driver call)
  or one from the driver pool (a miss, with the retries of
  :func:`alloc_failed`), registered in the ledger (``Account.add``);
* :meth:`Bin.give`: the ledger claim first (``Account.remove``: of two
  threads giving one block back, exactly one goes on), then back into the free
  list while the cache is open, within its limit and the stream exists; else
  to the driver (``cuMemFreeAsync``) on the bin's stream, or after it once it
  is gone (the device synchronized, then the legacy stream), or on the stream
  the user named. A refused free raises with the ledger entry restored
  (``Account.restore``); callers that must not raise (finalizers) warn.

The holder of a block keeps its bin (one slot) and gives the block back to it
without a lookup, a rounding or a stream test: as CuPy's ``PooledMemory``
frees through its pool and cuda.core's ``Buffer`` through its memory
resource. A cache's bins are per stream and rounded size; size 0 is the
stream's bin of sizes the cache does not keep (above ``max_block``): its
blocks always go back to the driver, on its stream. A pool without a cache
has one bin for every stream (``cache`` ``None``): its blocks are freed on
the stream object the giver holds (a cuda_memkit :class:`Stream` read and
freed on under its ``release_lock``, which its ``close()`` takes: it is never
destroyed in between).

Semantics of the cache
----------------------
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
  give that would take the cache past its ``limit`` (that block goes back);
  when an allocation runs out of memory (every block goes back, the streams
  they were freed on are synchronized, the allocation is retried once); when
  S is closed or collected, before the stream is destroyed
  (:data:`~cuda_memkit._core._stream.stream_close_hooks`: its bins learn that
  S is gone, so a block given back later, on a stream named by its handle
  too, is freed after it); when the cache is closed (its pool is closed, or
  collected): everything it holds goes back, and so does every later give.
* **Statistics**: a cached block is not in use: the ledger account of the
  memory removes it when its user gives it back, and counts the cache's bytes
  in :attr:`~cuda_memkit._core._resource.Account.cached`. The driver counts
  it as used (``pool.stats()``).

Threads
-------
No lock on the taking and giving paths. They rely on what CPython
guarantees with and without the GIL (free-threaded builds lock each list and
dict internally): ``list.append``, ``list.pop``, ``dict.get`` and ``dict.pop``
are atomic, so two threads popping the same list never get the same block,
and a block is in at most one list or one user's hands at a time. The byte
counters (``cached``, ``peak``) are plain ``+=`` updates: exact under the GIL
(no call between load and store), approximate under free-threading, as the
ledger's are. The rare paths take the cache's lock: making a stream's bins,
draining, a give that goes to the driver (a stream's close hook takes the
same lock before the stream is destroyed, so nothing is freed on a destroyed
stream).

A stream's bins are made once and dropped only when the stream is closed or
collected (then their stream is ``None``); a closed cache keeps them (so
that a stream closed later still tells them) but keeps no stream object alive.
"""

from __future__ import annotations

import operator
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from .._core import _capture, _driver
from .._core._constants import INVALID_CONTEXT, LEGACY_STREAMS, STREAM_LEGACY
from .._core._context import context_retry, ensure_context, primary_pushed
from .._core._device import sync_hooks
from .._core._errors import CudaError, CudaOutOfMemoryError, MemkitWarning
from .._core._resource import Account, Unshareable, account
from .._core._stream import Stream, StreamRef, custream, stream_close_hooks, stream_destroyed

__all__ = ["DEFAULT_CACHE_LIMIT", "DEFAULT_MAX_BLOCK", "Bin", "BlockCache", "GraphBin",
           "HeldBin", "alloc_failed", "bin_for", "check_cache_limit", "destroy_unused",
           "destroy_when_unused", "driver_pair", "empty_all", "free_after_stream",
           "free_failed", "pending_pools", "round_size"]

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
    The one rounding of the block cache: :func:`bin_for` and the pinned
    pool's bins use it.
    """
    if nbytes <= SMALL:
        return (nbytes + GRANULE - 1) & -GRANULE
    step = 1 << (nbytes.bit_length() - 4)
    return (nbytes + step - 1) & -step


def check_cache_limit(limit: object) -> int:
    """``cache_limit`` checked: an integer >= 0 (numpy integers too; bool refused)."""
    if isinstance(limit, bool):
        raise TypeError("cache_limit must be an int (bytes), not bool")
    try:
        n = operator.index(limit)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"cache_limit must be an int (bytes), not {type(limit).__name__}"
                        ) from None
    if n < 0:
        raise ValueError(f"cache_limit must be >= 0, got {n}")
    return int(n)


# -- pools collected before their buffers -----------------------------------------------------

_pending_lock = threading.Lock()

#: Owned pools whose destroy waits for their allocations: ``(busy, destroy)``.
#: Filled by :func:`destroy_when_unused`, emptied by :func:`destroy_unused`.
pending_pools: list[tuple[Callable[[], bool], Callable[[], None]]] = []


def destroy_when_unused(busy: Callable[[], bool], destroy: Callable[[], None]) -> None:
    """Run ``destroy()`` (``cuMemPoolDestroy``) now, or once ``busy()`` is false.

    A pool and its buffers can be collected in one garbage cycle: the pool's
    finalizer (a weakref callback) then runs before the buffers' ``__del__``.
    Freeing into a destroyed pool crashed later pool calls on the H100, so
    the destroy waits; every give that reaches the driver, every new pool
    and every synchronization (``Device.synchronize``, ``Stream.synchronize``)
    call :func:`destroy_unused`.
    """
    if busy():
        with _pending_lock:
            pending_pools.append((busy, destroy))
    else:
        destroy()


def destroy_unused() -> None:
    """Destroy the pending pools that nothing is allocated from any more."""
    with _pending_lock:
        ready = [p for p in pending_pools if not p[0]()]
        for p in ready:
            pending_pools.remove(p)
    for _, destroy in ready:
        destroy()


# A pool closed with buffers alive waits for their frees, which the driver counts once they
# ran: a synchronization is where they are known done, so a waiting pool goes there too.
sync_hooks.append(destroy_unused)


# -- the driver side: one allocation, one free and their recoveries -----------------------------


def free_failed(res: Any, dptr: Any, cus: Any, device: int | None,
                recover_stream: bool = True) -> Any:
    """Recover a ``cuMemFreeAsync`` the driver refused; return the stream it was freed on.

    * No usable current context (:data:`CONTEXT_ERRORS`: none on this thread, or
      one destroyed behind its back): retried with the device's primary context
      pushed (device 0 for host and managed pools), the thread's own restored.
    * Still ``CUDA_ERROR_INVALID_CONTEXT`` with a context current: the stream
      itself is gone (a handle destroyed while the buffer lived, as the H100
      answers, invalid_context_probe "destroyed_stream"). Work queued on it may
      have used the memory, so the device is synchronized and the memory freed
      on the legacy stream, with a :class:`MemkitWarning` about the stream;
      unless ``recover_stream`` is false (a stream the caller of ``free()``
      named): then the error is raised and the memory stays allocated.
    * Anything else raises the driver's error.
    """
    try:
        _driver.check("cuMemFreeAsync", res)
    except CudaError as first:
        try:
            context_retry(device, _free, dptr, cus, failed=first)
            return cus
        except CudaError as exc:
            if (exc is first or not recover_stream or exc.code != INVALID_CONTEXT
                    or int(cus) in LEGACY_STREAMS):
                raise
        res, legacy = free_after_stream(dptr, device)
        if not res[0]:
            warnings.warn(
                f"cuda_memkit: pool memory 0x{int(dptr):x} outlived its stream "
                f"0x{int(cus):x} (destroyed while the memory was in use): freed on "
                "the legacy stream after synchronizing the device. Keep a stream "
                "alive while memory allocated on it is (pass the Stream object, not "
                "its handle)", MemkitWarning, stacklevel=5)
            return legacy
        _driver.check("cuMemFreeAsync", res)
    return cus  # pragma: no cover - the result was a failure


def _free(dptr: Any, cus: Any) -> None:
    """``cuMemFreeAsync`` through the pre-resolved function, raising for a failure."""
    _driver.check("cuMemFreeAsync", FREE(dptr, cus))


def free_after_stream(dptr: Any, device: int | None) -> tuple[Any, Any]:
    """Free on the legacy stream once the device is idle: the block's stream is gone.

    It was closed (or collected, in one garbage cycle with the block's holder)
    and work queued on it may still use the memory. Returns the driver's
    result and the stream freed on.
    """
    with primary_pushed(device or 0):
        _driver.call("cuCtxSynchronize")
        cus = custream(STREAM_LEGACY)
        return FREE(dptr, cus), cus


def alloc_failed(res: Any, nbytes: int, cupool: Any, cus: Any, device: int | None,
                 cache: BlockCache | None = None) -> Any:
    """Recover a ``cuMemAllocFromPoolAsync`` the driver refused (``res``); the ``CUdeviceptr``.

    The one place that handles a refused pool allocation (a bin's take):

    * no current context on this thread (a default stream, a finalizer
      thread): device ``device``'s primary context is made current (device 0
      for host and managed pools) and the call retried;
    * out of memory with blocks in ``cache``: the cache gives them all back
      (:meth:`BlockCache.release_for_retry`) and the call is retried once; if
      it fails again, the :class:`CudaOutOfMemoryError` says how many cached
      bytes were released.

    Anything else raises the driver's error.
    """
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


# -- the one way a block is taken and given back -----------------------------------------------


class Bin(Unshareable):
    """Where blocks of one rounded size on one stream are taken and given back.

    Parameters
    ----------
    account : Account
        The ledger account of the memory lent from the bin.
    cupool : CUmemoryPool
        The driver pool blocks come from (``None``: the bin only gives back,
        as for an imported pool's mappings).
    device : int or None
        Device whose primary context the driver calls may need (``None``: host
        or managed memory; device 0's context is used).
    cache : BlockCache, optional
        The cache the bin belongs to; ``None``: the bin of a pool without a
        cache, for every stream (its blocks are freed on the giver's stream).
    cus : CUstream, optional
        The bin's stream (cache bins only); ``None`` once the stream is gone.
    size : int, default 0
        The rounded size of its blocks; 0: sizes the cache does not keep.

    Attributes
    ----------
    blocks : list or None
        The free blocks (``None``: nothing is kept, every give frees). A block
        is what :meth:`take` returned: a ``CUdeviceptr``, or the address of a
        pinned block (:class:`cuda_memkit._host._pinned_pool.HostBin`).
    """

    __slots__ = ("account", "blocks", "cache", "cupool", "cus", "device", "size")
    # A copy would hold the same free blocks: two owners lending each block twice.
    _share_hint = "share the buffer its block is lent to, or the pool"
    #: Whether its blocks are addresses (ints) rather than the driver's ``CUdeviceptr``.
    addresses = False

    def __init__(self, account: Account, cupool: Any, device: int | None,
                 cache: BlockCache | None = None, cus: Any = None, size: int = 0) -> None:
        self.account, self.cupool, self.device = account, cupool, device
        self.cache, self.cus, self.size = cache, cus, size
        self.blocks: list[Any] | None = [] if size else None

    def take(self, nbytes: int, cus: Any, made: int = 0) -> Any:
        """A block of ``nbytes`` for stream ``cus``, registered in the ledger.

        A free block of the bin if it has one, else a new one from the driver
        pool (the bin's size, or for a bin that keeps nothing ``made`` if
        given, else ``nbytes``). The ledger counts ``nbytes``, the bytes asked
        for, whatever the block's size.
        """
        blocks = self.blocks
        if blocks:
            try:
                block = blocks.pop()
            except IndexError:  # another thread took the last one
                pass
            else:
                self.cache.cached -= self.size  # type: ignore[union-attr]
                self.account.add(block, nbytes, cus)
                return block
        cache = self.cache
        if blocks is not None:  # a miss
            cache.misses += 1  # type: ignore[union-attr]
            nbytes_made = self.size
        else:
            nbytes_made = made or nbytes
        res = ALLOC(nbytes_made, self.cupool, cus)
        block = res[1] if not res[0] else alloc_failed(res, nbytes_made, self.cupool, cus,
                                                        self.device, cache)
        if self.addresses:
            block = int(block)
        self.account.add(block, nbytes, cus)
        return block

    def give(self, block: Any, sref: Stream | StreamRef | None = None, on: Any = None
             ) -> None:
        """Give ``block`` back: out of the ledger, then into the free list or to the driver.

        Parameters
        ----------
        block
            What :meth:`take` returned.
        sref : Stream or StreamRef, optional
            The stream object the holder keeps: where a bin without a cache
            frees (the bins of a cache know their stream).
        on : CUstream, optional
            A stream the user named for the free (not the allocation's): the
            block goes to the driver on it, and a refusal is raised, never
            recovered on another stream.

        Raises
        ------
        CudaError
            If the driver refuses the free: the block is allocated and in the
            ledger again.
        """
        blocks = self.blocks
        cache: Any = self.cache
        if blocks is not None and on is None:
            cus = self.cus
            n = self.account.remove(block, cus)  # the claim
            if n is None:  # given back already (another thread's give won)
                return
            c = cache.cached + self.size
            if c <= cache.limit and cus is not None:
                blocks.append(block)
                cache.cached = c
                if c > cache.peak:
                    cache.peak = c
                # The stream closed on another thread meanwhile: its drain may have missed
                # this block; take it back (unless the drain took it) and free it after.
                if self.cus is not None or not cache.take_back(block, self.size, blocks):
                    return
        else:
            if on is None:
                on_ledger = self.cus if cache is not None or sref is None else sref._custream
            else:
                on_ledger = on
            n = self.account.remove(block, on_ledger)
            if n is None:
                return
            if (CAPTURING and cache is None and on is None and on_ledger is not None
                    and _capture.capture_id_on_release(on_ledger, self.device)):
                # Memory from before the capture, freed on the capturing stream: the driver
                # refuses (only graph memory has free nodes); freed once the capture ended.
                self.account.restore(block, n, on_ledger)
                _capture.give_later(self, block, sref)
                return
        # To the driver (cuMemFreeAsync): on the stream named, on the giver's stream (a bin
        # without a cache), or on the bin's (after it once it is gone).
        device = self.device
        try:
            if on is not None:  # a stream the user named: its refusal is the user's to see
                res = FREE(block, on)
                if res[0]:
                    free_failed(res, block, on, device, recover_stream=False)
            elif cache is None:
                assert sref is not None
                res = None
                if type(sref) is Stream:  # read and freed on under its release_lock, which
                    with sref.release_lock:  # its close() takes: never destroyed meanwhile
                        cus = sref._custream
                        if cus is not None and not stream_destroyed(sref):
                            res = FREE(block, cus)
                else:
                    cus = sref._custream
                    if cus is not None:
                        res = FREE(block, cus)
                if res is None:  # the stream is gone (closed, or collected with the holder)
                    res, cus = free_after_stream(block, device)
                if res[0]:
                    free_failed(res, block, cus, device)
            else:
                with cache.lock:  # a close of the stream waits: its hook takes this lock
                    cus = self.cus
                    if cus is None:
                        res, cus = free_after_stream(block, device)
                    else:
                        res = FREE(block, cus)
                    if res[0]:
                        free_failed(res, block, cus, device)
        except BaseException:
            self.account.restore(block, n, on)
            raise
        if pending_pools:  # the pool may have been waiting for this block to be destroyed
            destroy_unused()

    def __repr__(self) -> str:
        kept = "nothing kept" if self.blocks is None else f"{len(self.blocks)} free"
        stream = "any stream" if self.cache is None else (
            "stream gone" if self.cus is None else f"stream 0x{int(self.cus):x}")
        return f"<Bin {self.size} B, {kept}, {stream}>"


# -- capture: memory a CUDA graph may use is lent to nobody else --------------------------------

#: A copy of ``_capture.active`` (``_capture.mirror``): while zero, no allocation asks
#: the driver whether its stream captures.
CAPTURING = 0
_capture.mirror(globals(), "CAPTURING")


class GraphBin(Bin):
    """Where memory allocated on a capturing stream comes from: the capture's graph.

    :meth:`take` is ``cuMemAllocFromPoolAsync`` on the capturing stream (an
    allocation node of the graph: nobody else can be lent that address while
    the graph exists); :meth:`give` never caches the block, it frees it as
    :func:`cuda_memkit._core._capture.release_graph_block` decides (a free
    node, after the graph, or kept until then). Made per capture and pool.
    """

    __slots__ = ("record",)

    def __init__(self, account: Account, cupool: Any, device: int | None, cus: Any,
                 record: _capture.CaptureRecord) -> None:
        super().__init__(account, cupool, device, None, cus, 0)
        self.record = record

    def give(self, block: Any, sref: Stream | StreamRef | None = None, on: Any = None
             ) -> None:
        """Give ``block`` back: a free node, a free after the graph, or kept until then."""
        n = self.account.remove(block, self.cus)
        if n is None:
            return
        try:
            if on is not None:  # a stream the user named: freed there, refusal raised
                res = FREE(block, on)
                if res[0]:
                    _driver.check("cuMemFreeAsync", res)
                return
            _capture.release_graph_block(self.record, block,
                                         self.cus if sref is None else sref,
                                         self.device or 0, self.account, n)
        except BaseException:
            if block not in self.account.live:
                self.account.restore(block, n, on)
            raise

    def __repr__(self) -> str:
        return f"<GraphBin of capture {self.record.id}>"


class HeldBin(Bin):
    """A pinned bin seen through a capture: blocks given back wait until its graphs are closed.

    A block taken while cuda_memkit's own captures are under way may be
    baked into them (a captured copy from a pooled pinned buffer): it goes
    back to its real bin only once every one of those graphs was closed. Its
    driver calls (a miss, a free) are made in relaxed capture mode: in
    global mode the driver refuses them during any capture.
    """

    __slots__ = ("real", "records")

    def __init__(self, real: Bin, records: list[_capture.CaptureRecord]) -> None:
        super().__init__(real.account, real.cupool, real.device, real.cache, real.cus, 0)
        self.real = real
        self.records = records

    def take(self, nbytes: int, cus: Any, made: int = 0) -> Any:
        """A block of the real bin (a miss allocates in relaxed capture mode)."""
        with _capture.relaxed():
            return self.real.take(nbytes, cus, made)

    def give(self, block: Any, sref: Stream | StreamRef | None = None, on: Any = None
             ) -> None:
        """Back to the real bin once no graph it may be baked into exists."""
        live = [r for r in self.records if not r.gone]
        if live and on is None:
            _capture.hold_until_gone(live, self.real, block)
            return
        with _capture.relaxed():
            self.real.give(block, sref, on)


#: Most keys of one stream's bins (rounded sizes, and the sizes asked for that
#: :func:`bin_for` remembers: the hot paths look a repeated size up without rounding).
MEMO_LIMIT = 512


def bin_for(cache: BlockCache | None, fallback: Bin, h: int, cus: Any, owner: object,
            nbytes: int) -> Bin:
    """The bin a block of ``nbytes`` (> 0) on stream ``cus`` comes from.

    The one place a bin is chosen for a device pool, cached or not
    (``MemoryPool.allocate``, the CuPy adaptor): while the stream captures, a
    :class:`GraphBin` of the capture; else ``fallback`` (the pool's bin) when
    there is no cache, or the cache's bin of the stream and the size rounded
    by :func:`round_size` (0: above ``max_block``, not kept). ``h`` is the
    stream's handle (-1: ``int(cus)``); ``owner`` the stream object the cache
    keeps for a foreign stream (see :meth:`BlockCache.bin`).

    The stream's bins also remember the size asked for (when rounding
    changed it), so that a caller may look up ``streams[h].get(nbytes)``
    first, while :data:`CAPTURING` is zero, and call this function only when
    that finds nothing.
    """
    if CAPTURING:
        rec = _capture.record_for(cus)
        if rec is not None:
            if _capture.has_deferred():
                _capture.retry_deferred()
            dev = fallback.device if cache is None else cache.device
            return GraphBin(_graph_account(dev), fallback.cupool if cache is None
                            else cache.cupool, dev, cus, rec)
    if cache is None:
        return fallback
    if nbytes <= SMALL:
        r = (nbytes + GRANULE - 1) & -GRANULE  # round_size() of the common case, inlined
    elif nbytes <= cache.max_block:
        r = round_size(nbytes)
    else:
        r = 0
    if h < 0:
        h = int(cus)
    lane = cache.streams.get(h)
    found = lane.get(r) if lane is not None else None
    if found is None:
        found = cache.bin(r, h, cus, owner)
        lane = cache.streams.get(h)
    if r != nbytes and lane is not None and len(lane) < MEMO_LIMIT:
        lane[nbytes] = found  # the size asked for finds the bin with one lookup next time
    return found


def host_bin_for(real: Bin) -> Bin:
    """The bin a pinned block is taken from: ``real``, or a :class:`HeldBin` in front of it.

    The latter while a capture begun by cuda_memkit is under way.
    """
    if CAPTURING and _capture.capture_may_run():  # (no records of ours: relaxed mode only)
        return HeldBin(real, _capture.own_open())
    return real


def _graph_account(device: int | None) -> Account:
    return account("graph", device)


# -- the cache --------------------------------------------------------------------------------

#: Every cache, for the stream close hook and empty_all() (closed ones too: their bins
#: must still learn that a stream is gone).
_caches: weakref.WeakSet[BlockCache] = weakref.WeakSet()
# Re-entrant: a garbage collection inside a locked block may collect a Stream, whose
# close hook takes the same locks on the same thread.
_caches_lock = threading.RLock()


class BlockCache:
    """Freed blocks of one driver pool, in bins per stream and rounded size.

    Parameters
    ----------
    cupool : CUmemoryPool
        The pool blocks come from and go back to.
    device : int or None
        Device whose primary context releases need (``None``: host or managed
        memory; device 0's context is used).
    account : Account
        The ledger account of the pool's memory: the cache reports its bytes
        there (:attr:`Account.cached`); its bins use it unless told otherwise.
    limit : int
        Most bytes held (a give beyond it goes to the driver).
    max_block : int
        Largest rounded size cached (at least :data:`SMALL`: the hot paths
        round and lend blocks of up to 1 MiB without asking).

    Attributes
    ----------
    streams : dict
        Stream handle -> {rounded size -> :class:`Bin`}; size 0 is the bin of
        sizes above ``max_block``. Sizes asked for that rounding changed are
        keys too (of their rounded size's bin; see :func:`bin_for`).
    cached, peak : int
        Bytes held now, and the most held at once (:meth:`Account.reset_peak`).
    misses : int
        Blocks the cache could not lend (they came from the driver).
    released : int
        Bytes given back to the driver by drains so far.
    """

    __slots__ = ("__weakref__", "account", "cached", "cupool", "custreams", "device", "limit",
                 "lock", "max_block", "misses", "owners", "peak", "released", "streams")

    def __init__(self, cupool: Any, device: int | None, account: Account, limit: int,
                 max_block: int = DEFAULT_MAX_BLOCK) -> None:
        assert max_block >= SMALL
        driver_pair()
        self.cupool = cupool
        self.device = device
        self.account = account
        self.limit = limit
        self.max_block = max_block
        self.streams: dict[int, dict[int, Bin]] = {}
        self.custreams: dict[int, Any] = {}  # handle -> CUstream, for the drains
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

    def bin(self, size: int, handle: int, cus: Any, owner: object = None,
            account: Account | None = None, kind: type[Bin] = Bin) -> Bin:
        """The bin of rounded ``size`` (0: sizes not kept) of stream ``handle``, made on first use.

        ``owner`` is the stream object given, which must outlive the blocks
        cached for it (a CuPy or torch stream, or the ``StreamRef`` holding
        one): the cache keeps it while it holds the stream's bins and is open.
        A cuda_memkit :class:`Stream` needs none: its close and its
        collection tell its bins first. ``account`` (default: the cache's) and
        ``kind`` make the bin.
        """
        lane = self.streams.get(handle)
        found = None if lane is None else lane.get(size)
        if found is not None:
            return found
        if type(owner) is StreamRef:
            owner = owner.obj
        elif isinstance(owner, Stream):
            owner = None
        with self.lock:  # made whole, or seen whole, by a drop of the stream
            lane = self.streams.get(handle)
            if lane is None:
                lane = self.streams[handle] = {}
                self.custreams[handle] = cus
                if owner is not None and self.open:
                    self.owners[handle] = owner
            made = lane.get(size)
            if made is None:
                made = lane[size] = kind(account or self.account, self.cupool, self.device,
                                         self, cus, size)
            return made

    def take_back(self, block: Any, size: int, blocks: list[Any]) -> bool:
        """Take ``block`` out of free list ``blocks`` again: its stream was closed meanwhile.

        A block given back while another thread closes its stream may land in
        a list the close has already drained: the giver checks the stream
        after the append and takes the block back to free it itself. False
        when the close's drain took it first (and freed it).
        """
        try:
            blocks.remove(block)
        except ValueError:
            return False
        self.cached -= size
        return True

    # -- back to the driver --------------------------------------------------------------
    def _drain(self, handle: int, lane: dict[int, Bin]) -> int:
        """Give every block of one stream's bins back on that stream; the bytes released.

        Under the cache's lock, and only while the stream's bins are still
        registered: a drain from another thread (``clear()``) never frees on a
        stream whose close has already drained and dropped them (and may have
        destroyed it).
        """
        with self.lock:
            if self.streams.get(handle) is not lane:
                return 0
            cus = self.custreams.get(handle)
            n = 0
            for b in list(lane.values()):
                blocks = b.blocks
                if blocks is None:  # the bin of sizes not kept
                    continue
                while True:
                    try:
                        block = blocks.pop()
                    except IndexError:  # empty (another thread may have taken the last one)
                        break
                    self.cached -= b.size
                    n += b.size
                    res = FREE(block, cus)
                    if res[0]:
                        free_failed(res, block, cus, self.device)
            self.released += n
            return n

    def clear(self) -> int:
        """Give every cached block back to the driver pool; return the bytes released."""
        n = 0
        for handle, lane in list(self.streams.items()):
            n += self._drain(handle, lane)
        return n

    def release_for_retry(self) -> int:
        """Out of memory: give everything back and wait for those streams; the bytes released.

        Memory freed on stream S is reusable by another stream once S's work
        before the free is done: the streams are synchronized so that the
        retried allocation can use it whatever stream it is on.
        """
        n = 0
        for handle, lane in list(self.streams.items()):
            with self.lock:  # the stream's close waits for it: no sync on a destroyed stream
                m = self._drain(handle, lane)
                if m:
                    n += m
                    cus = self.custreams.get(handle)
                    if cus is not None:
                        _driver.call("cuStreamSynchronize", cus)
        return n

    def drop_stream(self, handle: int) -> int:
        """Stream ``handle`` is about to be destroyed: release its blocks, tell its bins."""
        with self.lock:  # marked, drained and dropped in one step: see _drain and Bin.give
            lane = self.streams.get(handle)
            if lane is None:
                return 0
            for b in list(lane.values()):
                b.cus = None  # later gives free after the stream
            n = self._drain(handle, lane)
            self.streams.pop(handle, None)
            self.owners.pop(handle, None)
            self.custreams.pop(handle, None)
        return n

    def close(self) -> None:
        """Release everything for good (the pool is closed, or about to be destroyed).

        Every later give goes to the driver. The bins stay registered (a stream
        closed later still tells them), but no foreign stream is kept alive.
        """
        self.limit = -1
        with self.lock:
            self.clear()
            self.owners.clear()
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
    """Give every block of every cache back to the driver (tests' leak checks)."""
    with _caches_lock:
        caches = list(_caches)
    return sum(cache.clear() for cache in caches)
