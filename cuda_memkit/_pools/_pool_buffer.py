"""The buffer side of a memory pool: :class:`~cuda_memkit.PoolBuffer` without its pool.

:class:`PoolBufferBase` holds everything of a ``PoolBuffer`` except its
``pool`` property (added by :mod:`cuda_memkit._pools._pool`, which defines the pool
and builds buffers with :func:`new_buffer`): ``free()``, ``close()`` and the
finalizer, the numpy view of host and managed pool memory, the interop
protocols and ``export()``.

A buffer holds its block and the :class:`~cuda_memkit._pools._cache.Bin` it
was taken from; ``free()``, ``close()`` and ``__del__`` give the block back
to that bin, the one release path of every pool kind
(:mod:`cuda_memkit._pools._cache`). It needs little of its pool
(:class:`PoolOwner`): where its memory lives and whether the pool is shared.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Any, Protocol, cast

from .._core import _driver
from .._core._buffer import BufferMixin, MemoryKind
from .._core._context import primary_pushed
from .._core._errors import ClosedError, CudaError, MemkitWarning
from .._core._inflight import pending_operands, release_after_copies
from .._core._interop import DL_CUDA, DL_CUDA_HOST, DL_CUDA_MANAGED, DeviceMemoryMixin
from .._core._resource import EXITING, Resource, array_protocol, host_array
from .._core._stream import Stream, StreamLike, StreamRef, custream
from . import _pool_ipc
from ._cache import Bin

if TYPE_CHECKING:
    import numpy as np
    from typing_extensions import Self

__all__ = ["PoolBufferBase", "PoolOwner", "new_buffer"]


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


def _release_failed(b: Bin, d: Any, exc: CudaError) -> None:
    """A release in a finalizer the driver refused: out of the ledger, and a warning."""
    b.account.remove(d)  # no object owns it any more; the warning reports the failure
    warnings.warn(f"cuda_memkit: freeing pool buffer 0x{int(d):x} failed: {exc}",
                  MemkitWarning, stacklevel=3)


# -- buffers ---------------------------------------------------------------------------


class PoolBufferBase(BufferMixin, Resource, DeviceMemoryMixin):
    """Everything of :class:`~cuda_memkit.PoolBuffer` but its ``pool`` property."""

    __slots__ = ("_bin", "_deferred", "_dptr", "_nbytes", "_pool", "_sref", "_views")

    _bin: Bin  # where its block came from and goes back to
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
        second ``close()`` does. Freed on its allocation stream (named or
        not), the block of a cached pool goes back to the cache.

        Parameters
        ----------
        stream : stream-like, optional
            Default: the stream the buffer was allocated on. Work queued on
            that stream before the free may still use the memory. Another
            stream: the memory goes back to the driver pool on it, never to a
            cache.

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
        d = self._dptr
        if d is None:
            return
        views = self._views
        if views is not None and views() is not None:
            raise BufferError("numpy views of this buffer are alive (arrays from .array or "
                              "from its DLPack capsules); drop them first, or close() it, "
                              "which frees once they are gone")
        sref = self._sref
        on = None
        if stream is not None and stream is not sref:
            on = custream(stream)
            own = sref._custream
            if own is not None and int(on) == int(own):
                on = None  # its allocation stream, named: as free() without it
        if on is None and sref._custream is None:
            raise ClosedError("the stream this buffer was allocated on is closed; "
                              "free it with stream=another stream, or close() it")
        self._dptr = None
        try:  # raises (a named stream the driver refuses is never replaced), or given back
            self._bin.give(d, sref, on)
        except BaseException:
            self._dptr = d  # still allocated: the bin put it back in the ledger
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
            self._bin.give(d, self._sref)
        except BaseException:
            self._dptr = d
            raise

    def _release_deferred(self) -> None:
        d = self._deferred
        if d is not None:
            self._deferred = None
            try:
                self._bin.give(d, self._sref)
            except CudaError as exc:  # a finalizer's path: warn, never raise
                _release_failed(self._bin, d, exc)

    # Everything it uses is bound or an attribute: module globals may be gone at exit.
    def __del__(self, _exiting: list[bool] = EXITING) -> None:
        try:
            d = self._dptr
        except AttributeError:  # never fully made
            return
        if d is None:
            d = self._deferred  # closed while exports or a copy held it: the free was deferred
            if d is None:
                return
            self._deferred = None
        if _exiting[0]:  # nothing runs at interpreter exit
            return
        self._dptr = None
        try:
            self._bin.give(d, self._sref)
        except CudaError as exc:  # a finalizer warns instead of raising
            _release_failed(self._bin, d, exc)

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
               pool: PoolOwner, b: Bin) -> Any:
    """A buffer of class ``cls`` owning the pool allocation ``dptr``, given back to bin ``b``."""
    buf = _new_object(cls)
    buf._dptr, buf._nbytes, buf._sref = dptr, nbytes, sref
    buf._pool, buf._bin = pool, b
    buf._views = buf._deferred = None
    return buf
