"""Pinned host memory shared with worker processes: :class:`SharedHostRing`, :class:`RingSlot`.

A ring is ``slots`` arrays of one shape and dtype in a memfd segment that
worker processes map (:mod:`cuda_memkit._host._ring_worker` is their side)
and this process registers with the driver (``register_host``): a slot a
worker filled is pinned memory here, copied to the device at full speed with
no copy in between. :mod:`cuda_memkit._host._ring_core` serves the workers.

A :class:`RingSlot` is a slot lent to the consumer, a buffer like every other:
its ``close()`` (or collection) gives the slot back only when the
asynchronous copies queued from it have finished (their events, through
``_core._inflight``) and its numpy views and DLPack consumers are gone, so no
worker overwrites a batch the GPU or the consumer still reads.
"""

from __future__ import annotations

import mmap
import os
import secrets
import socket
import sys
from typing import TYPE_CHECKING, Any

from .._core._buffer import MemoryKind, TypedBufferMixin
from .._core._checks import MAX_NBYTES, check_dtype, check_positive, check_shape, shape_nbytes
from .._core._context import ensure_context
from .._core._host_registry import mark_pinned_class
from .._core._interop import DL_CUDA_HOST, DeviceArrayView, DeviceMemoryMixin, normalize_view
from .._core._resource import (
    Resource,
    Transaction,
    array_protocol,
    host_array,
    make_finalizer,
)
from .._core._runner import stream_device
from .._core._stream import StreamLike, stream_handle
from .._pools._pool import MemoryPool, PoolBuffer
from ._ring_core import RingCore, close_ring, make_segment
from ._ring_worker import RingHandle, check_timeout

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["MAX_SLOTS", "RingSlot", "SharedHostRing", "copy_to_new", "device_pool", "lend",
           "ring_core", "unstarted_ring"]

#: Most slots a ring may have (the wire protocol carries 32-bit slot numbers; more than
#: this is a mistake, not a ring).
MAX_SLOTS = 1 << 16


# -- the public objects ------------------------------------------------------------------------


class SharedHostRing(Resource):
    """Pinned host memory that worker processes fill and the GPU reads: a ring of slots.

    ``slots`` arrays of ``shape`` and ``dtype`` in one shared memory segment
    (a memfd: it has no name, in ``/dev/shm`` or anywhere else, so no crash
    leaves it behind), registered with the driver in this process
    (:func:`register_host`): a batch a worker wrote into a slot is copied to
    the device at pinned speed, with no copy in between.

    Workers need no CUDA: give them :attr:`handle` (it pickles; ``fork``,
    ``spawn`` and ``forkserver`` all work); each takes a
    :class:`RingWriter` (``handle.writer()``), fills the slots the ring grants
    it and publishes them. This process takes ready slots with :meth:`get`
    (in the order they became ready) or :meth:`take` (the one a ticket
    names), copies each where it goes, and closes it: the slot goes back to
    the workers only once the copies queued from it have finished (their
    events) and its views are gone.

    Parameters
    ----------
    slots : int
        Number of slots, >= 1. Enough to keep every worker busy plus the
        batches being copied: about ``grants * workers + 2``.
    shape : int or tuple of int
        Shape of the array in each slot (an int: that many elements).
    dtype : dtype-like, default uint8
        Element type of the array in each slot.
    grants : int, default 2
        Slots a worker may hold at once (granted or being filled): how far
        ahead each worker runs.
    timeout : float or None, default 120
        Seconds :meth:`get` and :meth:`take` wait for a slot before raising
        ``TimeoutError`` naming what they wait for (``None`` or ``inf``: no
        limit). A
        worker that dies is reported at once, whatever the timeout.

    Raises
    ------
    TypeError, ValueError
        For a bad ``slots``, ``shape``, ``dtype``, ``grants`` or ``timeout``
        (a slot of no bytes, zero slots), before anything is made.
    NotImplementedError
        Off Linux (the ring needs memfds and abstract Unix sockets).
    OSError
        If the system cannot give the segment (out of memory).
    CudaError
        If the driver cannot register it.

    Examples
    --------
    >>> ring = cm.SharedHostRing(4, (256, 256), np.float32)
    >>> w = ring.handle.writer()          # in a worker process, normally
    >>> slot = w.acquire()
    >>> slot.array[:] = 1.0
    >>> ticket = slot.publish()
    >>> with cm.Stream() as s, cm.DeviceBuffer.empty(ring.slot_nbytes) as dev:
    ...     with ring.take(ticket) as batch:      # pinned: an asynchronous copy
    ...         batch.copy_to(dev, stream=s)
    ...     s.synchronize()
    >>> w.close(); ring.close()
    """

    _share_hint = ("give worker processes ring.handle (it pickles, and is inherited by fork); "
                   "they fill the slots through ring.handle.writer()")
    _core: RingCore
    _handle: RingHandle

    def __init__(self, slots: int, shape: int | tuple[int, ...], dtype: npt.DTypeLike = "uint8",
                 *, grants: int = 2, timeout: float | None = 120.0) -> None:
        self._build(slots, shape, dtype, grants, timeout)
        self._core.start()

    def _build(self, slots: object, shape: object, dtype: npt.DTypeLike, grants: object,
               timeout: object) -> None:
        n = check_positive(slots, "slots")
        if n > MAX_SLOTS:
            raise ValueError(f"slots must be <= {MAX_SLOTS}, got {n}")
        shp = check_shape(shape)
        dt = check_dtype(dtype, "a SharedHostRing slot")
        nbytes = shape_nbytes(shp, dt)
        if nbytes == 0:
            raise ValueError(f"a slot of shape {shp} holds no bytes; give each slot at least "
                             "one element")
        g = check_positive(grants, "grants")
        wait = check_timeout(timeout)
        stride = -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE  # slots on pages of their own
        total = stride * n
        if total > MAX_NBYTES:
            raise ValueError(f"{n} slots of {nbytes} bytes are larger than any possible "
                             "allocation")
        if not hasattr(os, "memfd_create") or not sys.platform.startswith("linux"):
            raise NotImplementedError("SharedHostRing needs Linux (memfds and abstract Unix "
                                      "sockets)")
        token = secrets.token_bytes(16)
        address = b"\0cuda_memkit-ring-" + secrets.token_hex(12).encode()
        with Transaction() as tx:
            segment = make_segment(total)
            tx.push(segment.release)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            tx.push(listener.close)
            listener.bind(address)
            listener.listen(64)
            listener.setblocking(False)
            core = RingCore(n, stride, shp, dt, g, wait, segment, listener, address, token)
            tx.push(core.shutdown)
        self._core = core
        self._handle = RingHandle.make(address, token, n, stride, shp, dt.str, nbytes)
        self._open(make_finalizer(self, "SharedHostRing", close_ring, core))

    # -- what it is -----------------------------------------------------------------------
    @property
    def handle(self) -> RingHandle:
        """What worker processes need to fill the slots (picklable); see :class:`RingHandle`."""
        self._check_open()
        return self._handle

    @property
    def slots(self) -> int:
        """Number of slots."""
        return self._core.slots

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the array in each slot."""
        return self._core.shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """Element type of the array in each slot."""
        return self._core.dtype

    @property
    def slot_nbytes(self) -> int:
        """Bytes of the array in each slot."""
        return self._handle.slot_nbytes

    @property
    def nbytes(self) -> int:
        """Bytes of the whole segment (each slot rounded up to whole pages)."""
        return self._core.segment.nbytes

    @property
    def grants(self) -> int:
        """Slots each worker may hold at once."""
        return self._core.grants

    @property
    def timeout(self) -> float | None:
        """Seconds :meth:`get` and :meth:`take` wait (``None``: no limit); settable."""
        return self._core.timeout

    @timeout.setter
    def timeout(self, value: float | None) -> None:
        self._core.timeout = check_timeout(value)

    @property
    def workers(self) -> int:
        """Number of workers connected now."""
        core = self._core
        with core.lock:
            return sum(1 for c in core.conns.values() if c.welcomed)

    def stats(self) -> dict[str, int]:
        """How many slots are in each state now, and how many workers are connected.

        Returns
        -------
        dict
            ``{"free": n, "granted": n, "filling": n, "ready": n, "lent": n,
            "workers": n}``; the states add up to :attr:`slots`.
        """
        core = self._core
        with core.lock:
            out = core.counts()
            out["workers"] = sum(1 for c in core.conns.values() if c.welcomed)
        return out

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"workers={self.workers}"
        return (f"<SharedHostRing slots={self.slots} shape={self.shape} dtype={self.dtype} "
                f"{state}>")

    # -- taking slots -------------------------------------------------------------------------
    def get(self) -> RingSlot:
        """The next ready slot, in the order slots became ready ("as they come").

        Waits up to :attr:`timeout`. Close the slot (or use ``with``) to give
        it back; it returns to the workers after the copies queued from it.

        Raises
        ------
        WorkerError
            If a worker died or left while filling a slot, or could not
            make a batch (its traceback in the message).
        TimeoutError
            If no slot became ready in time (the message names the slots
            being filled and their workers).
        ClosedError
            If the ring is closed.
        """
        self._check_open()
        core = self._core
        return self._lend(core.wait(core.first_ready, core.timeout, "a slot"))

    def take(self, ticket: tuple[int, int]) -> RingSlot:
        """The slot a worker published under ``ticket`` (from :meth:`WriterSlot.publish`).

        For workers that hand their tickets over another channel (a
        ``DataLoader``'s worker returns it as its item): waits up to
        :attr:`timeout` for that slot's ``READY``, which may arrive after
        the ticket.

        Raises
        ------
        TypeError, ValueError
            For a ticket that is not ``(slot, generation)`` ints, or names
            no batch to come (taken already, or lost with its worker).
        WorkerError, TimeoutError, ClosedError
            As :meth:`get`.
        """
        self._check_open()
        s, g = _ticket(ticket, self.slots)
        core = self._core
        return self._lend(core.wait(lambda: core.by_ticket(s, g), core.timeout,
                                    f"the slot of ticket ({s}, {g})"))

    def _lend(self, s: int) -> RingSlot:
        return RingSlot.make(self, self._core, s)


def _ticket(ticket: object, slots: int) -> tuple[int, int]:
    # A list too: a DataLoader hands the tuples its workers return over as lists.
    if (not isinstance(ticket, (tuple, list)) or len(ticket) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in ticket)):
        raise TypeError(f"ticket must be a (slot, generation) pair of ints from "
                        f"WriterSlot.publish(), not {ticket!r}")
    s, g = ticket
    if not 0 <= s < slots or g < 1:
        raise ValueError(f"ticket {ticket!r} names no slot of this ring ({slots} slots, "
                         "generations from 1)")
    return s, g


def unstarted_ring(slots: int, shape: int | tuple[int, ...], dtype: npt.DTypeLike, *,
                   grants: int, timeout: float | None) -> SharedHostRing:
    """A :class:`SharedHostRing` whose service thread is not started yet.

    A Loader forks its workers before any thread of the ring runs, then
    starts it (``ring_core(ring).start()``).
    """
    ring = object.__new__(SharedHostRing)
    ring._build(slots, shape, dtype, grants, timeout)
    return ring


def ring_core(ring: SharedHostRing) -> RingCore:
    """The state a Loader drives: its schedule of batches, watched processes (:class:`RingCore`)."""
    return ring._core


def lend(ring: SharedHostRing, s: int) -> RingSlot:
    """Slot ``s`` (from :meth:`RingCore.wait`) as a :class:`RingSlot` lent to the consumer."""
    return ring._lend(s)


def device_pool(pool: object) -> MemoryPool | None:
    """``pool`` checked as a device pool (``None`` stays ``None``): a copy's destination."""
    if pool is None:
        return None
    if not isinstance(pool, MemoryPool):
        raise TypeError(f"pool must be a MemoryPool, not {type(pool).__name__}")
    pool._check_open()  # a closed pool is refused now, not at the first copy
    if pool.device is None or pool.is_host:
        raise ValueError("pool must be a device pool: the copies go to device memory")
    return pool


def _give_back(core: RingCore, s: int, g: int) -> None:
    """Release function of a RingSlot: the slot goes back to the ring."""
    core.give_back(s, g)


class RingSlot(TypedBufferMixin, DeviceMemoryMixin, Resource):
    """A filled slot of a :class:`SharedHostRing`, lent to the consumer.

    A buffer like every other (:class:`Buffer`): a numpy view (:attr:`array`,
    ``np.asarray(slot)``), ``__cuda_array_interface__`` and DLPack (the slot
    is registered pinned memory: DLPack device ``kDLCUDAHost``), ``copy_to``,
    ``to_numpy``, ``fill``. Its memory shows in :func:`memory_stats` under
    ``"shared_ring"`` (and, registered, under ``"registered"``).

    :meth:`close` (or the end of a ``with`` block, or collection) gives the
    slot back to the workers, once the asynchronous copies queued from it
    have finished and its numpy views and DLPack consumers are gone.

    Attributes
    ----------
    ring : SharedHostRing
        The ring it belongs to.
    index : int
        The slot's number.
    generation : int
        How many times the slot was granted.
    tag : int or None
        What the worker published it with (a :class:`Loader`'s batch index).
    worker : int or None
        The label of the worker that filled it.
    pid : int
        That worker's process id.
    """

    ring: SharedHostRing
    index: int
    generation: int
    tag: int | None
    worker: int | None
    pid: int
    _shape: tuple[int, ...]
    _dtype: np.dtype[Any]
    _nbytes: int
    _ptr: int
    _dptr: int
    _core: RingCore

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("RingSlots come from SharedHostRing.get() and take()")

    @classmethod
    def make(cls, ring: SharedHostRing, core: RingCore, s: int) -> RingSlot:
        """The lent slot ``s`` of ``ring`` (used by the ring)."""
        self = object.__new__(cls)
        slot = core.table[s]
        g = slot.gen
        self.ring = ring
        self._core = core
        self.index = s
        self.generation = g
        tag = slot.tag
        self.tag = None if tag < 0 else tag
        owner_worker, owner_pid = core.filled_by(s)
        self.worker = owner_worker
        self.pid = owner_pid
        self._shape = core.shape
        self._dtype = core.dtype
        self._nbytes = ring.slot_nbytes
        self._ptr = core.segment.ptr + s * core.stride
        self._dptr = core.segment.device_ptr + s * core.stride
        self._open(make_finalizer(self, ("ring slot", self._ptr), _give_back, core, s, g))
        return self

    def close(self) -> None:
        """Give the slot back: now, or once the copies from it and its views are done.

        Calling it again does nothing.
        """
        fin = self._finalizer
        super().close()
        if fin is not None and fin.alive:
            self._core.wake()  # the ring's thread watches the copies' events from now on

    @property
    def ptr(self) -> int:
        """Host address of the slot."""
        self._check_open()
        return self._ptr

    @property
    def device_ptr(self) -> int:
        """The slot's device address (the host address on GPUs with unified addressing)."""
        self._check_open()
        return self._dptr

    @property
    def device(self) -> None:
        """``None``: the memory is host memory."""
        return None

    @property
    def kind(self) -> MemoryKind:
        """``MemoryKind.SHARED_RING``."""
        return MemoryKind.SHARED_RING

    @property
    def dtype(self) -> np.dtype[Any]:
        """Element type."""
        return self._dtype

    @property
    def ticket(self) -> tuple[int, int]:
        """``(index, generation)``."""
        return self.index, self.generation

    @property
    def batch(self) -> int | None:
        """The batch a :class:`Loader` asked the worker for (its ``tag``), else ``None``."""
        return self.tag

    def _host_only(self) -> bool:
        return True

    def _dl_device(self) -> tuple[int, int]:
        return (DL_CUDA_HOST, 0)

    @property
    def array(self) -> np.ndarray[Any, Any]:
        """A zero-copy numpy view of the slot; the slot stays lent while it lives."""
        self._check_open()
        return host_array(self, self._ptr, self._shape, self._dtype)

    def __array__(self, dtype: npt.DTypeLike | None = None, copy: bool | None = None
                  ) -> np.ndarray[Any, Any]:
        return array_protocol(self.array, dtype, copy)

    def as_array(self, dtype: npt.DTypeLike = "u1",
                 shape: int | tuple[int, ...] | None = None) -> DeviceArrayView:
        """A typed, zero-copy view at the slot's device address (CuPy, torch, numba).

        Parameters and errors as :meth:`DeviceBuffer.as_array`.
        """
        dt, shp = normalize_view(dtype, shape, self._nbytes)
        self._check_open()
        return DeviceArrayView(self, self._dptr, dt, shp, self._dl_device())

    def _export(self) -> DeviceArrayView:
        return self.as_array(self._dtype, self._shape)

    def to_device(self, *, stream: StreamLike = None, pool: MemoryPool | None = None
                  ) -> PoolBuffer:
        """Copy the slot into a new device buffer, and give the slot back after the copy.

        One asynchronous copy at pinned speed, ordered on ``stream``; the new
        buffer comes from ``pool`` on that stream, and the slot returns to
        the workers once the copy has finished (this closes the slot). Use
        the buffer on ``stream`` (or after waiting for it);
        ``buf.as_array(slot.dtype, slot.shape)`` is a typed view for CuPy or
        torch (``torch.from_dlpack``).

        Parameters
        ----------
        stream : stream-like, optional
            Default: the legacy default stream.
        pool : MemoryPool, optional
            A device pool; default: the default pool of the stream's device
            (of the current device for a default stream), with the process's
            block cache in front (``MemoryPool.default(device, cache=True)``).

        Returns
        -------
        PoolBuffer
            The batch on the device (bytes; ``nbytes`` of the slot).

        Raises
        ------
        TypeError, ValueError
            For a bad ``stream`` or ``pool`` (a pool of host memory), before
            anything is allocated; the slot stays lent then, as it does when
            the allocation or the copy fails.
        ClosedError
            If the slot, the pool or the stream is closed.
        """
        self._check_open()
        pool = device_pool(pool)
        if pool is None:  # the default pool of the stream's device, which runs the copy
            device = stream_device(stream, stream_handle(stream))
            pool = MemoryPool.default(ensure_context() if device is None else device,
                                      cache=True)
        buf = copy_to_new(self, pool, stream)
        self.close()  # back to the workers once the copy has finished
        return buf

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"ptr=0x{self._ptr:x}"
        tag = "" if self.tag is None else f" tag={self.tag}"
        return (f"<RingSlot {self.index} shape={self._shape} dtype={self._dtype}{tag} "
                f"{state}>")


mark_pinned_class(RingSlot)


def copy_to_new(slot: RingSlot, pool: MemoryPool, stream: StreamLike) -> PoolBuffer:
    """A new buffer of ``pool`` with the slot's copy queued into it on ``stream``.

    The slot stays lent: its caller hands it back (the copy holds it until done).
    """
    buf = pool.allocate(slot.nbytes, stream=stream)
    try:
        slot.copy_to(buf, stream=stream)
    except BaseException:
        buf.close()
        raise
    return buf
