"""Managed (unified) memory: :class:`ManagedBuffer`.

A :class:`ManagedBuffer` is memory from ``cuMemAllocManaged``: one address
valid on the host and on every GPU, migrated page by page by the driver.
Hints apply to the whole buffer or to any byte sub-range of it:

* :meth:`ManagedBuffer.advise` (``cuMemAdvise``) with a :class:`MemAdvice`,
* :meth:`ManagedBuffer.prefetch` (``cuMemPrefetchAsync``),
* :meth:`ManagedBuffer.discard` / :meth:`ManagedBuffer.discard_and_prefetch`
  (the CUDA 13 batch calls ``cuMemDiscardBatchAsync`` /
  ``cuMemDiscardAndPrefetchBatchAsync``),
* :meth:`ManagedBuffer.range_info` (``cuMemRangeGetAttributes``, every
  ``CUmem_range_attribute``) returning a :class:`RangeInfo`.

The range checks and the calls themselves are in :mod:`cuda_memkit._managed_memory._managed_ranges`.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

from .._core import _context, _driver
from .._core._buffer import MemoryKind, TypedBufferMixin
from .._core._checks import check_dtype, check_int, check_shape, check_span, shape_nbytes
from .._core._constants import LEGACY_STREAMS
from .._core._inflight import keep_alive
from .._core._interop import DL_CUDA_MANAGED, DeviceArrayView, DeviceMemoryMixin
from .._core._resource import Resource, account, array_protocol, host_array, make_finalizer
from .._core._stream import StreamLike, stream_handle
from . import _managed_ranges as _ranges
from ._managed_ranges import MemAdvice, RangeInfo
from ._residency import DEVICE_BLOCK, Residency, check_granularity, read_residency

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from .._core._location import LocationLike

__all__ = ["AttachFlags", "ManagedBuffer"]


class AttachFlags(enum.IntFlag):
    """Stream association of managed memory (``CUmemAttach_flags``).

    ``GLOBAL``: any stream on any device may access the memory. ``HOST``: no
    device without concurrent managed access will touch it until it is
    attached to a stream. ``SINGLE``: only the stream it is attached to
    (:meth:`ManagedBuffer.attach`) accesses it; not valid at allocation.
    """

    GLOBAL = 1
    HOST = 2
    SINGLE = 4


# -- the buffer --------------------------------------------------------------------


def _free_managed(ptr: int, ordinal: int) -> None:
    """Finalizer: free managed memory (a context must be current for cuMemFree)."""
    # Out of the ledger first (the address may be reused as soon as it is freed);
    # given up even if the driver refuses (the finalizer's warning says so).
    account("managed", ordinal).remove(ptr)
    _ranges.forget(ptr)
    _context.release_call(ordinal, "cuMemFree", ptr)  # any current context (or none) will do


def _attach_at_alloc(attach: object) -> AttachFlags:
    value = check_int(attach, "attach", "an AttachFlags value")
    if value not in (AttachFlags.GLOBAL, AttachFlags.HOST):
        raise ValueError("attach must be AttachFlags.GLOBAL or AttachFlags.HOST at allocation "
                         "(attach to a single stream later with .attach(stream))")
    return AttachFlags(value)


class ManagedBuffer(TypedBufferMixin, Resource, DeviceMemoryMixin):
    """Managed (unified) memory from ``cuMemAllocManaged``.

    One address valid on the host and on every device; the driver migrates
    pages on demand, and :meth:`advise` / :meth:`prefetch` guide it. Build with
    :meth:`empty`, :meth:`zeros` or :meth:`from_array`. A zero-length buffer
    allocates nothing (its ``ptr`` is 0).

    Host access (:attr:`array`) is only safe while no GPU work on the buffer is
    in flight: synchronize the stream first.

    Examples
    --------
    >>> a = np.arange(1 << 20, dtype=np.float32)
    >>> with cm.Stream() as stream, cm.ManagedBuffer.from_array(a) as buf:
    ...     buf.advise(cm.MemAdvice.SET_PREFERRED_LOCATION, cm.Location.device(0))
    ...     buf.prefetch(cm.Location.device(0), stream=stream)
    ...     stream.synchronize()
    """

    _ptr: int
    _nbytes: int
    _shape: tuple[int, ...]
    _dtype: np.dtype[Any]
    _device_ordinal: int
    _attach_flags: AttachFlags

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("create a ManagedBuffer with ManagedBuffer.empty(), .zeros() "
                        "or .from_array()")

    # -- construction ----------------------------------------------------------
    @classmethod
    def _allocate(cls, shape: object, dtype: npt.DTypeLike, attach: object) -> ManagedBuffer:
        dt = check_dtype(dtype, "managed memory")
        shp = check_shape(shape)
        flags = _attach_at_alloc(attach)
        nbytes = shape_nbytes(shp, dt)  # ValueError past MAX_NBYTES, like HostBuffer
        ordinal = _context.ensure_context()
        self = cls.__new__(cls)
        self._shape = shp
        self._dtype = dt
        self._nbytes = nbytes
        self._device_ordinal = ordinal
        self._attach_flags = flags
        if nbytes == 0:
            self._ptr = 0
            self._open(None)
            return self
        ptr = int(_driver.call("cuMemAllocManaged", nbytes, int(flags)))
        self._ptr = ptr
        account("managed", ordinal).add(ptr, nbytes)
        _ranges.track(ptr, nbytes)
        self._open(make_finalizer(self, f"ManagedBuffer 0x{ptr:x}", _free_managed, ptr, ordinal))
        return self

    @classmethod
    def empty(cls, shape: int | tuple[int, ...], dtype: npt.DTypeLike = "uint8", *,
              attach: AttachFlags = AttachFlags.GLOBAL) -> ManagedBuffer:
        """Allocate uninitialised managed memory.

        Parameters
        ----------
        shape : int or tuple of int
            Shape of the :attr:`array` view.
        dtype : dtype-like, default uint8
            Element type.
        attach : AttachFlags, default GLOBAL
            ``GLOBAL`` or ``HOST`` (see :class:`AttachFlags`).

        Raises
        ------
        TypeError, ValueError
            For a bad shape, dtype or flag, or a size past the largest
            possible buffer (before any driver call).
        CudaOutOfMemoryError
            If the driver cannot reserve the memory.
        """
        return cls._allocate(shape, dtype, attach)

    @classmethod
    def zeros(cls, shape: int | tuple[int, ...], dtype: npt.DTypeLike = "uint8", *,
              attach: AttachFlags = AttachFlags.GLOBAL) -> ManagedBuffer:
        """Allocate managed memory filled with zero bytes; arguments as :meth:`empty`.

        The fill is ``cuMemsetD8`` on the legacy default stream, which is then
        synchronized, so the pages start out on the current device.
        """
        buf = cls._allocate(shape, dtype, attach)
        if buf._nbytes:
            try:
                _driver.call("cuMemsetD8", buf._ptr, 0, buf._nbytes)
                _driver.call("cuStreamSynchronize", 0)
            except BaseException:
                buf.close()
                raise
        return buf

    @classmethod
    def from_array(cls, array: npt.ArrayLike, *,
                   attach: AttachFlags = AttachFlags.GLOBAL) -> ManagedBuffer:
        """Allocate managed memory holding a copy of ``array`` (same shape and dtype).

        Parameters
        ----------
        array : array-like
            The data to copy (made C-contiguous first if it is not).
        attach : AttachFlags, default GLOBAL
            ``GLOBAL`` or ``HOST`` (see :class:`AttachFlags`).
        """
        import numpy as np

        src = np.ascontiguousarray(array)
        buf = cls._allocate(src.shape, src.dtype, attach)
        if buf._nbytes:
            try:
                _driver.call("cuMemcpy", buf._ptr, int(src.ctypes.data), buf._nbytes)
            except BaseException:
                buf.close()
                raise
        return buf

    # -- properties ------------------------------------------------------------
    @property
    def ptr(self) -> int:
        """The managed address (valid on the host and every device); 0 if empty."""
        self._check_open()
        return self._ptr

    @property
    def device(self) -> int:
        """Ordinal of the device whose context was current at allocation."""
        return self._device_ordinal

    @property
    def kind(self) -> MemoryKind:
        """``MemoryKind.MANAGED``."""
        return MemoryKind.MANAGED

    @property
    def attach_flags(self) -> AttachFlags:
        """The stream association last requested (at allocation or by :meth:`attach`)."""
        return self._attach_flags

    @property
    def array(self) -> np.ndarray[Any, Any]:
        """A zero-copy numpy view (host access: synchronize GPU work first).

        It keeps the memory allocated: after :meth:`close` the memory is freed
        once the last such view (or DLPack consumer) is gone.
        """
        self._check_open()
        return host_array(self, self._ptr, self._shape, self._dtype)

    def __array__(self, dtype: npt.DTypeLike | None = None,
                  copy: bool | None = None) -> np.ndarray[Any, Any]:
        return array_protocol(self.array, dtype, copy)

    def _dl_device(self) -> tuple[int, int]:
        return (DL_CUDA_MANAGED, self._device_ordinal)

    def _typed_view(self) -> DeviceArrayView:
        self._check_open()
        return DeviceArrayView(self, self._ptr, self._dtype, self._shape, self._dl_device())

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return self._typed_view().__cuda_array_interface__

    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        # Typed, as the array interface: the consumer sees the buffer's dtype and shape.
        return self._typed_view().__dlpack__(stream=stream, max_version=max_version,
                                             dl_device=dl_device, copy=copy)

    def __repr__(self) -> str:
        if self.closed:
            return f"<ManagedBuffer closed nbytes={self._nbytes}>"
        return (f"<ManagedBuffer shape={self._shape} dtype={self._dtype} nbytes={self._nbytes} "
                f"ptr=0x{self._ptr:x} attach={self._attach_flags.name}>")

    # -- stream association ------------------------------------------------------
    def attach(self, stream: StreamLike, flags: AttachFlags = AttachFlags.SINGLE) -> None:
        """Change the buffer's stream association (``cuStreamAttachMemAsync``).

        Stream-ordered: it takes effect once earlier work on ``stream`` is done.

        Parameters
        ----------
        stream : StreamLike
            The stream to attach to.
        flags : AttachFlags, default SINGLE
            ``SINGLE`` (only ``stream`` accesses the memory), ``GLOBAL`` or
            ``HOST``. ``SINGLE`` needs a real stream, not a default stream.

        Raises
        ------
        ValueError
            For an empty buffer, a flag that is not exactly one of the three, or
            ``SINGLE`` with the legacy default stream.
        """
        self._check_open()
        value = check_int(flags, "flags", "an AttachFlags value")
        if value not in (AttachFlags.GLOBAL, AttachFlags.HOST, AttachFlags.SINGLE):
            raise ValueError(f"flags must be exactly one of GLOBAL, HOST, SINGLE, not {flags!r}")
        h = stream_handle(stream)
        flag = AttachFlags(value)
        if flag is AttachFlags.SINGLE and h in LEGACY_STREAMS:
            raise ValueError("cannot attach to the legacy default stream with SINGLE: it is "
                             "not a specific stream; pass a Stream")
        if self._nbytes == 0:
            raise ValueError("an empty ManagedBuffer has no memory to attach")
        _context.ensure_context()
        _driver.call("cuStreamAttachMemAsync", h, self._ptr, 0, int(flag))
        self._attach_flags = flag

    # -- hints ---------------------------------------------------------------------
    def _range(self, offset: object, nbytes: object) -> tuple[int, int]:
        self._check_open()
        off, n = check_span(offset, nbytes, self._nbytes, what="ManagedBuffer")
        return self._ptr + off, n

    def advise(self, advice: MemAdvice, location: LocationLike | None = None, *,
               offset: int = 0, nbytes: int | None = None) -> None:
        """Give the driver a usage hint for the buffer or a byte sub-range (``cuMemAdvise``).

        Parameters
        ----------
        advice : MemAdvice
            The hint.
        location : Location, Device or int, optional
            Needed by ``SET_PREFERRED_LOCATION`` (any location) and
            ``SET/UNSET_ACCESSED_BY`` (a device or the host); ignored otherwise.
        offset, nbytes : int
            The byte sub-range (default: the whole buffer). The driver rounds
            it out to whole pages.

        Raises
        ------
        ClosedError
            If the buffer is closed.
        TypeError, ValueError
            For a bad advice, a missing or non-existent location or a range
            outside the buffer (before any driver call).
        """
        adv = _ranges.check_advice(advice)
        ptr, n = self._range(offset, nbytes)
        loc = _ranges.advice_location(adv, location)
        _context.ensure_context()
        _ranges.issue_advise(ptr, n, adv, loc)

    def prefetch(self, to: LocationLike, *, stream: StreamLike = None, offset: int = 0,
                 nbytes: int | None = None) -> None:
        """Migrate the buffer or a sub-range to ``to`` (``cuMemPrefetchAsync``).

        Stream-ordered and asynchronous: synchronize ``stream`` before relying
        on the pages having moved.

        Parameters
        ----------
        to : Location, Device or int
            A device, the host, a host NUMA node or the current thread's node.
        stream : StreamLike, default None
            The stream (``None``: the legacy default stream).
        offset, nbytes : int
            The byte sub-range (default: the whole buffer).
        """
        ptr, n = self._range(offset, nbytes)
        loc = _ranges.check_location(to, what="prefetch destination")
        h = stream_handle(stream)
        _context.ensure_context()
        _ranges.issue_prefetch(ptr, n, loc, h)
        keep_alive(h, (self,))  # queued: close() frees after it, as after a copy

    def discard(self, *, stream: StreamLike = None, offset: int = 0,
                nbytes: int | None = None) -> None:
        """Tell the driver the contents of the range are no longer needed.

        Uses ``cuMemDiscardBatchAsync`` (CUDA >= 13.0). Reading the range
        afterwards, before writing or prefetching it, gives indeterminate
        values. Where the driver lacks the call, nothing is issued (keeping the
        old contents is a valid outcome). On the legacy default stream the
        call runs on a private stream ordered after and before it.

        Parameters
        ----------
        stream : stream-like, optional
            The stream to order the call on (default: the legacy default stream).
        offset : int, default 0
            Start of the range, in bytes from the buffer's start.
        nbytes : int, optional
            Length of the range (default: to the end of the buffer).
        """
        ptr, n = self._range(offset, nbytes)
        h = stream_handle(stream)
        _context.ensure_context()
        _ranges.issue_step("discard", [(ptr, n, None)], h)
        keep_alive(h, (self,))

    def discard_and_prefetch(self, to: LocationLike, *, stream: StreamLike = None,
                             offset: int = 0, nbytes: int | None = None) -> None:
        """Discard the range's contents, then populate it at ``to``.

        Uses ``cuMemDiscardAndPrefetchBatchAsync`` (CUDA >= 13.0): the pages
        appear at ``to`` without their old contents being migrated. Where the
        driver lacks it, this is a plain :meth:`prefetch`. ``stream``,
        ``offset`` and ``nbytes`` are as in :meth:`discard`.

        Parameters
        ----------
        to : int, Device or Location
            Where the pages should appear.
        """
        ptr, n = self._range(offset, nbytes)
        loc = _ranges.check_location(to, what="prefetch destination")
        h = stream_handle(stream)
        _context.ensure_context()
        _ranges.issue_step("discard_and_prefetch", [(ptr, n, loc)], h)
        keep_alive(h, (self,))

    def range_info(self, offset: int = 0, nbytes: int | None = None) -> RangeInfo:
        """Return the driver's view of the buffer or a sub-range (:class:`RangeInfo`).

        Parameters
        ----------
        offset : int, default 0
            Start of the range, in bytes from the buffer's start.
        nbytes : int, optional
            Length of the range (default: to the end of the buffer).
        """
        ptr, n = self._range(offset, nbytes)
        _context.ensure_context()
        return _ranges.query_range(ptr, n)

    def residency(self, offset: int = 0, nbytes: int | None = None, *,
                  granularity: int = DEVICE_BLOCK) -> Residency:
        """Where each part of the buffer (or a sub-range) is, by the driver's range attributes.

        Reads ``cuMemRangeGetAttributes`` per block of ``granularity`` bytes and
        merges equal neighbours: per part, the last prefetch location, the
        preferred location, the accessed-by processors and read-mostly advice.
        The advice is exact; the last prefetch location is the driver's record
        of the last prefetch, not of where pages are now (see
        :class:`Residency`). For cuda_memkit's own per-device record, see
        ``memory_stats().kind("managed_resident")``.

        Parameters
        ----------
        offset : int, default 0
            Start of the range, in bytes from the buffer's start.
        nbytes : int, optional
            Length of the range (default: to the end of the buffer; at least
            one byte, except for an empty buffer, which has no parts).
        granularity : int, default 2 MiB
            Bytes per attribute read (a multiple of 4096; one driver call each).

        Returns
        -------
        Residency

        Raises
        ------
        ClosedError
            If the buffer is closed.
        TypeError, ValueError
            For a range outside the buffer or a bad granularity.

        Examples
        --------
        >>> buf = cm.ManagedBuffer.empty(8 << 20)
        >>> buf.prefetch(0, nbytes=4 << 20)
        >>> cm.Stream.legacy_default().synchronize()
        >>> res = buf.residency()
        >>> res.prefetched_bytes(0), res.prefetched_bytes(cm.Location.host())
        (4194304, 0)
        >>> buf.close()
        """
        g = check_granularity(granularity)
        self._check_open()
        if self._nbytes == 0 and offset == 0 and nbytes in (None, 0):
            return Residency(self._ptr, 0, g, ())  # an empty buffer: nothing to read
        ptr, n = self._range(offset, nbytes)
        _context.ensure_context()
        return read_residency(ptr, n, g)
