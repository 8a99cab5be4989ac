"""The buffer side of a memory pool: how a :class:`~cuda_memkit.PoolBuffer` is freed.

:class:`PoolBufferBase` holds everything of a ``PoolBuffer`` except its
``pool`` property (added by :mod:`cuda_memkit._pools._pool`, which defines the pool
and builds buffers with :func:`new_buffer`): ``free()`` (stream-ordered
``cuMemFreeAsync``), ``close()`` and the finalizer, the numpy view of host
and managed pool memory, the interop protocols and ``export()``.

The buffer needs little of its pool (:class:`PoolOwner`): where its memory
lives and whether the pool is shared. The free path is part of the pool hot
path; see :mod:`cuda_memkit._pools._pool` for what it costs and why it is written
as it is.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

from .._core import _driver
from .._core._buffer import BufferMixin, MemoryKind
from .._core._constants import STREAM_LEGACY
from .._core._device import (
    Stream,
    StreamLike,
    StreamRef,
    custream,
    primary_pushed,
    stream_destroyed,
)
from .._core._errors import ClosedError, CudaError, MemkitWarning
from .._core._interop import DL_CUDA, DL_CUDA_HOST, DL_CUDA_MANAGED, DeviceMemoryMixin
from .._core._operands import pending_operands, release_after_copies
from .._core._resource import Account, Resource, array_protocol, host_array, notify, watchers
from . import _cache, _pool_ipc
from ._cache import BlockCache, free_failed

if TYPE_CHECKING:
    import numpy as np
    from typing_extensions import Self

__all__ = ["FREE", "PoolBufferBase", "PoolOwner", "destroy_unused", "destroy_when_unused",
           "free_failed", "free_on_stream", "new_buffer", "pending_pools", "resolve_free"]

#: ``cuMemFreeAsync``, resolved by :func:`resolve_free` when the first pool is made.
FREE: Any = None


def resolve_free() -> Any:
    """Resolve (once) and return ``cuMemFreeAsync``."""
    global FREE
    if FREE is None:
        FREE = _cache.driver_pair()[1]
    return FREE


class PoolOwner(Protocol):
    """What a buffer reads of its pool (all of it public on ``MemoryPool``)."""

    @property
    def handle(self) -> int: ...
    @property
    def device(self) -> int | None: ...
    @property
    def is_host(self) -> bool: ...
    @property
    def managed(self) -> bool: ...
    @property
    def ipc(self) -> bool: ...
    @property
    def imported(self) -> bool: ...
    def export(self) -> int: ...


# -- pools collected before their buffers ----------------------------------------------

_pending_lock = threading.Lock()

#: Owned pools whose destroy waits for their allocations: ``(busy, destroy)``.
#: Filled by :func:`destroy_when_unused`, emptied by :func:`destroy_unused`.
pending_pools: list[tuple[Callable[[], bool], Callable[[], None]]] = []


def destroy_when_unused(busy: Callable[[], bool], destroy: Callable[[], None]) -> None:
    """Run ``destroy()`` (``cuMemPoolDestroy``) now, or once ``busy()`` is false.

    A pool and its buffers can be collected in one garbage cycle: the pool's
    finalizer (a weakref callback) then runs before the buffers' ``__del__``.
    Freeing into a destroyed pool crashed later pool calls on the H100, so
    the destroy waits; every pool buffer
    release, a closed pinned cache's free and a new pool call
    :func:`destroy_unused`.
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


# -- release ---------------------------------------------------------------------------


def _release(dptr: Any, sref: Stream | StreamRef, pool: PoolOwner, acct: Account,
             cache: BlockCache | None, blocks: Any, size: int) -> None:
    """Free one pool allocation, stream-ordered: the path of close() and the finalizer.

    The ledger entry is claimed first, as ``free()`` claims it, so a ``close()``
    racing a ``free()`` frees once. A cached buffer's block goes back to its cache
    while its stream is open (once cached, the block may be lent again).
    """
    n = acct.live.pop(dptr, None)  # the claim, as in free(): one atomic pop, one free
    if n is None:  # another thread's free() claimed it first: nothing left to do
        return
    acct.current -= n
    cus = sref._custream
    if cache is not None and cus is not None and not stream_destroyed(sref):
        if cache.keep(dptr, size, blocks):
            if watchers:
                notify(acct, dptr, n, False, int(cus))
            if sref._custream is not None or not cache.take_back(dptr, size, blocks):
                return
            # Closed on another thread since cus was read: its lists may be drained already.
            _free_taken_back(dptr, pool.device)
            return
    try:
        res, cus = free_on_stream(dptr, sref, pool.device)
        if res[0]:
            cus = free_failed(res, dptr, cus, pool.device)
    except BaseException:
        acct.live[dptr] = n  # still allocated: back in the ledger
        acct.current += n
        raise
    if watchers:
        notify(acct, dptr, n, False, int(cus))
    if pending_pools:
        destroy_unused()


def free_on_stream(dptr: Any, sref: Stream | StreamRef, device: int | None
                   ) -> tuple[Any, Any]:
    """``cuMemFreeAsync`` on the buffer's allocation stream, or after it once it is gone.

    A cuda_memkit :class:`Stream` is read and freed on under its
    ``release_lock``, which its ``close()`` takes to mark it closed, so it is
    never destroyed between the two (another thread may close it). Returns the
    driver's result and the stream freed on.
    """
    if type(sref) is Stream:
        with sref.release_lock:
            cus = sref._custream
            if cus is not None and not stream_destroyed(sref):
                return FREE(dptr, cus), cus
    else:
        cus = sref._custream
        if cus is not None:
            return FREE(dptr, cus), cus
    return _free_after_stream(dptr, device)


def _free_after_stream(dptr: Any, device: int | None) -> tuple[Any, Any]:
    """Free on the legacy stream once the device is idle: the allocation stream is gone.

    It was closed (or collected together with the buffer, in one garbage cycle)
    and work queued on it may still use the memory. Returns the driver's
    result and the stream freed on.
    """
    with primary_pushed(device or 0):
        _driver.call("cuCtxSynchronize")
        cus = custream(STREAM_LEGACY)
        return FREE(dptr, cus), cus


def _free_taken_back(dptr: Any, device: int | None) -> None:
    """A block taken back from the free list of a stream closed meanwhile: freed after it."""
    res, cus = _free_after_stream(dptr, device)
    if res[0]:
        free_failed(res, dptr, cus, device)


def _finalize(d: Any, sref: Stream | StreamRef, pool: PoolOwner, acct: Account,
              cache: BlockCache | None, blocks: Any, size: int) -> None:
    """The release a buffer's ``__del__`` runs: warnings instead of exceptions."""
    if sys.is_finalizing():
        return
    try:
        _release(d, sref, pool, acct, cache, blocks, size)
    except CudaError as exc:
        acct.remove(d)  # no object owns it any more; the warning reports the failure
        warnings.warn(f"cuda_memkit: freeing pool buffer 0x{int(d):x} failed: {exc}",
                      MemkitWarning, stacklevel=2)


# -- buffers ---------------------------------------------------------------------------


class PoolBufferBase(BufferMixin, Resource, DeviceMemoryMixin):
    """Everything of :class:`~cuda_memkit.PoolBuffer` but its ``pool`` property."""

    __slots__ = ("_acct", "_blocks", "_cache", "_deferred", "_dptr", "_nbytes", "_pool", "_size",
                 "_sref", "_views")

    _acct: Account  # the ledger account of its pool
    _cache: BlockCache | None  # the cache its block came from and goes back to; None: uncached
    _blocks: list[Any]  # with a cache: the free list its block goes back to (stream, size)
    _size: int  # with a cache: the block's rounded size
    _deferred: Any  # the CUdeviceptr to free once numpy views are gone (close() with views)
    _dptr: Any  # the CUdeviceptr; None once freed
    _nbytes: int
    _sref: Stream | StreamRef  # its _custream: the CUstream, None once a Stream is closed
    _pool: PoolOwner
    _views: Any

    @property
    def closed(self) -> bool:
        """Whether the buffer was freed or closed."""
        return self._dptr is None

    def _check_open(self) -> None:
        if self._dptr is None:
            raise ClosedError("PoolBuffer was freed; it cannot be used any more")

    @property
    def ptr(self) -> int:
        """Address of the allocation (a device pointer; for host pools also the host address)."""
        d = self._dptr
        if d is None:
            raise ClosedError("PoolBuffer was freed; it cannot be used any more")
        return int(d)

    @property
    def nbytes(self) -> int:
        """Size in bytes."""
        return self._nbytes

    @property
    def device(self) -> int | None:
        """The pool's device; ``None`` for host and managed pools (no one device's memory)."""
        return self._pool.device

    @property
    def kind(self) -> MemoryKind:
        """``MemoryKind.POOL`` (whatever the pool's location)."""
        return MemoryKind.POOL

    def _host_only(self) -> bool:
        return self._pool.is_host

    @property
    def stream(self) -> int:
        """Handle of the stream the buffer was allocated on (and is freed on by default)."""
        sref = self._sref
        cus = sref._custream
        return int(cus) if cus is not None else cast(Stream, sref)._handle

    def free(self, stream: StreamLike = None) -> None:
        """Return the memory to the pool, ordered on ``stream`` (``cuMemFreeAsync``).

        A second ``free()`` (or one after ``close()``) does nothing, as a
        second ``close()`` does.

        Parameters
        ----------
        stream : stream-like, optional
            Default: the stream the buffer was allocated on. Work queued on
            that stream before the free may still use the memory.

        Raises
        ------
        ClosedError
            If the stream is a closed :class:`Stream` (the buffer then stays
            allocated; free it on another stream, or ``close()`` it).
        BufferError
            If numpy views of the memory (:attr:`array`) are alive (the
            buffer then stays allocated; drop them, or ``close()`` it, which
            frees once they are gone).
        CudaError
            If the driver refuses (the buffer then stays allocated).
        """
        d = self._dptr  # _release() written out: this is the hot path
        if d is None:
            return
        views = self._views
        if views is not None and views() is not None:
            raise BufferError("numpy views of this buffer are alive (arrays from .array or "
                              "from its DLPack capsules); drop them first, or close() it, "
                              "which frees once they are gone")
        cache = self._cache
        if stream is None:
            cus = self._sref._custream
            if cus is None:
                raise ClosedError("the stream this buffer was allocated on is closed; "
                                  "free it with stream=another stream, or close() it")
        else:
            cus = custream(stream)
            cache = None  # a block freed on another stream goes to the driver, on that stream
        acct = self._acct  # Account.remove written out: the pop below is the claim
        n = acct.live.pop(d, None)  # the claim: one atomic pop, so nothing frees it twice
        if n is None:  # another thread's free() or close() claimed it: a second free
            self._dptr = None
            return
        self._dptr = None
        acct.current -= n
        if watchers:
            notify(acct, d, n, False, int(cus))
        if cache is not None:  # BlockCache.put written out
            c = cache.cached + self._size
            if c <= cache.limit:
                self._blocks.append(d)
                cache.cached = c
                if c > cache.peak:
                    cache.peak = c
                if self._sref._custream is not None:
                    return
                # Closed on another thread since cus was read: its lists may be drained.
                if not cache.take_back(d, self._size, self._blocks):
                    return  # the close's drain took it
        try:  # raises (a named stream the driver refuses is never replaced), or freed
            if stream is None:  # its own stream, which another thread may be closing
                res, cus = free_on_stream(d, self._sref, self._pool.device)
            else:
                res = FREE(d, cus)
            if res[0]:
                free_failed(res, d, cus, self._pool.device, stream is None)
        except BaseException:
            self._dptr = d  # still allocated: back in the ledger
            acct.live[d] = n
            acct.current += n
            raise

    def close(self) -> None:
        """Free the buffer on its allocation stream; calling it again does nothing.

        With numpy views of the memory alive (:attr:`array`), the free
        happens once they and the buffer are gone; under an asynchronous
        copy cuda_memkit queued (on any stream), once that copy has finished.
        """
        d = self._dptr
        if d is None:
            return
        self._dptr = None
        views = self._views
        if views is not None and views() is not None:
            self._deferred = d  # freed by the Exports record once the last export is gone
            return
        if pending_operands and release_after_copies(self):
            self._deferred = d  # a copy in flight (maybe on another stream) still uses it
            return
        try:
            cache = self._cache
            if cache is None:
                _release(d, self._sref, self._pool, self._acct, None, None, 0)
            else:
                _release(d, self._sref, self._pool, self._acct, cache, self._blocks, self._size)
        except BaseException:
            self._dptr = d
            raise

    def _release_deferred(self) -> None:
        d = self._deferred
        if d is not None:
            self._deferred = None
            cache = self._cache
            if cache is None:
                _finalize(d, self._sref, self._pool, self._acct, None, None, 0)
            else:
                _finalize(d, self._sref, self._pool, self._acct, cache, self._blocks,
                          self._size)

    def __del__(self, _finalize: Any = _finalize,  # bound: module globals may be gone at
                _finalizing: Any = sys.is_finalizing) -> None:  # interpreter exit
        try:
            d = self._dptr
        except AttributeError:  # never fully made
            return
        if d is None:
            d = self._deferred  # closed while numpy views were alive: the free was deferred
            if d is None:
                return
            self._deferred = None
        self._dptr = None
        cache = self._cache
        if cache is None:
            _finalize(d, self._sref, self._pool, self._acct, None, None, 0)
            return
        sref = self._sref
        cus = sref._custream
        size = self._size
        if (cus is not None and cache.cached + size <= cache.limit and not _finalizing()
                and not stream_destroyed(sref)):
            # _release() of a cached block written out: a dropped buffer's block goes back
            # without three more call frames (~15 % of the allocate-and-drop pair).
            acct = self._acct
            n = acct.live.pop(d, None)
            if n is not None:
                acct.current -= n
                if watchers:
                    notify(acct, d, n, False, int(cus))
            blocks = self._blocks
            blocks.append(d)
            c = cache.cached = cache.cached + size
            if c > cache.peak:
                cache.peak = c
            if sref._custream is not None or not cache.take_back(d, size, blocks):
                return
            # Closed on another thread since cus was read: its lists may be drained already.
            try:
                _free_taken_back(d, self._pool.device)
            except CudaError as exc:  # a finalizer warns instead of raising
                warnings.warn(f"cuda_memkit: freeing pool buffer 0x{int(d):x} failed: {exc}",
                              MemkitWarning, stacklevel=2)
            return
        _finalize(d, sref, self._pool, self._acct, cache, self._blocks, size)

    def __enter__(self) -> Self:
        self._check_open()
        return self

    def _dl_device(self) -> tuple[int, int]:
        pool = self._pool
        if pool.managed:
            return (DL_CUDA_MANAGED, 0)
        if pool.is_host:
            return (DL_CUDA_HOST, 0)
        return (DL_CUDA, pool.device or 0)

    @property
    def array(self) -> np.ndarray[Any, Any]:
        """A zero-copy ``uint8`` numpy view (host-located and managed pools only).

        The view keeps the memory allocated (:meth:`free` refuses while it
        lives; after ``close()`` the memory is freed once the last view is
        gone). Synchronize the allocation stream before the CPU touches it.

        Raises
        ------
        TypeError
            For device pools, whose memory the CPU cannot address.
        """
        import numpy as np

        pool = self._pool
        if not (pool.is_host or pool.managed):
            raise TypeError("device pool memory is not host-accessible; copy it to a host "
                            "buffer or allocate from a host-located pool")
        ptr = self.ptr  # ClosedError once freed
        return host_array(self, ptr, (self._nbytes,), np.dtype(np.uint8))

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray[Any, Any]:
        arr = self.array
        return array_protocol(arr, dtype, copy)

    def export(self) -> bytes:
        """Export the allocation to another process (``cuMemPoolExportPointer``).

        The pool must be IPC-capable (``ipc=True``). The other process imports
        the pool (:meth:`MemoryPool.import_`), then this pointer
        (:meth:`MemoryPool.import_pointer`), and must free its mapping before
        this process frees the buffer. Exports the pool first if it never was
        (the H100 refuses pointers of a pool not yet exported), and waits for
        the allocation's stream.

        Returns
        -------
        bytes
            64 opaque bytes, safe to send through any channel.
        """
        self._check_open()
        pool = self._pool
        if not pool.ipc or pool.imported:
            raise ValueError("only buffers of a pool created with ipc=True can be exported")
        if not _pool_ipc.was_exported(pool.handle):
            os.close(pool.export())  # the driver exports pointers of exported pools only
        cus = self._sref._custream
        if cus is None:
            with primary_pushed(pool.device or 0):  # its stream is gone: wait for the device
                _driver.call("cuCtxSynchronize")
        else:
            _driver.call("cuStreamSynchronize", cus)
        return _pool_ipc.export_pointer(self._dptr)

    def __repr__(self) -> str:
        if self._dptr is None:
            return f"<PoolBuffer freed nbytes={self._nbytes}>"
        return f"<PoolBuffer 0x{int(self._dptr):x} nbytes={self._nbytes} from {self._pool!r}>"


_new_object = object.__new__


def new_buffer(cls: type[PoolBufferBase], dptr: Any, nbytes: int, sref: Stream | StreamRef,
               pool: PoolOwner, acct: Account) -> Any:
    """A buffer of class ``cls`` owning the pool allocation ``dptr`` (not yet in the ledger)."""
    buf = _new_object(cls)
    buf._dptr = dptr
    buf._nbytes = nbytes
    buf._sref = sref
    buf._pool = pool
    buf._acct = acct
    buf._views = None
    buf._deferred = None
    buf._cache = None
    return buf
