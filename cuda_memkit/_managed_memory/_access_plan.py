"""Walking managed memory larger than the GPU: :class:`AccessPlan`.

The user says what they will touch (chunks of a managed buffer, or ranges),
in what order, how (``"read"`` or ``"readwrite"``) and how often (``reads``
per chunk); :meth:`AccessPlan.run` then keeps the next chunks on their way to
the device while the current one is processed, and hands out, per chunk,
memory the user's kernel reads (the managed range itself or a device window)
and the stream to work on.

The mechanism is chosen per entry (see :data:`MECHANISMS`):

* ``"zero_copy"`` (data read, or read and written, once): the range is
  advised to stay on the host with the device mapping it (preferred location
  host, accessed by the device); the kernel reads and writes the managed
  pointer over the link, with no page migration and no eviction. Where the
  host has several NUMA nodes, the host memory is the device's own node's
  (:func:`near_host`), and each chunk's pages are prefetched there ahead of use.
* ``"window"`` (data read several times): the same advice, and a device
  window per look-ahead slot, filled by the block-copy kernel from the
  mapping on a stream of its own (and, for ``"readwrite"``, copied back the
  same way after the chunk is done); repeated reads then hit device memory.
* ``"migrate"``: no advice; the kernel reads the managed range and the driver
  migrates the pages it touches (and evicts to make room).
* ``"read_mostly"``: read-mostly advice and a :class:`PrefetchPlan` of the
  next chunks on a stream of its own; the driver drops the device's copies
  without a write-back when it needs the room.

``"auto"`` picks zero-copy for data used once and a window for data read
again, unless the device reads host memory through the mapping slowly
(:func:`mapped_reads_fast`, measured once per device): then read-mostly for
data read again and migration otherwise.

Events order the fills with the work: the work on a chunk waits for its fill,
and the refill of a window waits for the work on the chunk it held. At the
end (or on any exception, in the loop or in the library) both streams are
synchronized, the advice given is undone (each range's read-mostly,
preferred-location and accessed-by state as the driver reported it before)
and the windows, the stream and the events are freed.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from cuda.bindings.driver import CUdevice_attribute

from .._core import _context, _driver
from .._core._checks import check_positive, check_span, one_of
from .._core._constants import EVENT_DISABLE_TIMING
from .._core._device import Device
from .._core._errors import CudaError
from .._core._host_os import host_numa_nodes
from .._core._interop import DL_CUDA, DeviceArrayView
from .._core._location import Location, LocationType
from .._core._stream import Stream, StreamLike, stream_handle
from ._managed import ManagedBuffer
from ._managed_ranges import MemAdvice, issue_advise, query_range
from ._prefetch_plan import PrefetchPlan

if TYPE_CHECKING:
    from typing_extensions import Self

    from .._device_memory._device_buffer import DeviceBuffer

__all__ = ["MECHANISMS", "AccessChunk", "AccessPlan", "AccessRun"]

#: The mechanisms an :class:`AccessPlan` entry can use (``"auto"`` picks one per entry).
MECHANISMS = ("auto", "zero_copy", "window", "read_mostly", "migrate")
#: The fill stream's priority: the driver clamps it to the device's highest, so that
#: the fills' blocks are scheduled before the work's.
HIGHEST_PRIORITY = -1024
#: How the windows are filled and emptied: the block-copy kernel reading the mapping
#: (``copy_batch``'s ``method``; the copy engines read a host-preferred managed range slowly).
FILL_METHOD = "kernel"
#: Values of ``access=``.
ACCESS = ("read", "readwrite")


def choose(access: str, reads: int) -> str:
    """The mechanism ``"auto"`` picks for an entry read ``reads`` times with ``access``.

    Data used once crosses the link once whatever is done, and the zero-copy
    mapping does that without migrating pages; data used several times is
    worth a copy in device memory, made by the block-copy kernel from the
    mapping (faster than prefetching read-mostly pages; see docs/decisions.md).
    """
    return "zero_copy" if reads == 1 else "window"


#: The mechanisms that read host memory through the device's mapping.
MAPPED = ("zero_copy", "window")


def fallback(entry: _Entry) -> str:
    """What ``"auto"`` uses instead of the mapping where the device reads it slowly.

    Data read several times: read-mostly copies, prefetched; data used once, or
    written: the driver's own migration on access (no advice).
    """
    return "read_mostly" if entry.access == "read" and entry.reads > 1 else "migrate"


#: The mapping is used where the device's reads through it reach this share of a
#: DMA copy's rate (:func:`mapped_reads_fast`).
MAPPED_SHARE = 0.7
#: The bytes each side of the probe moves.
PROBE_BYTES = 64 << 20
_FAST: dict[int, bool] = {}


def mapped_reads_fast(ordinal: int, near: Location) -> bool:
    """Whether device ``ordinal`` reads managed host memory through the mapping fast.

    Measured once per device and process: the block-copy kernel's first read
    of :data:`PROBE_BYTES` of managed memory advised as ``"zero_copy"`` advises
    it (placed at ``near``), against a DMA copy of as many bytes from pinned
    memory; fast means at least :data:`MAPPED_SHARE` of the DMA's rate. How
    fast the device's own reads of host memory are depends on the machine
    (the host's NUMA layout, how the pages are mapped). The simulator, which
    has no timings, answers ``True``.
    """
    known = _FAST.get(ordinal)
    if known is not None:
        return known
    if _driver.backend_name() == "sim":
        return True
    from .._device_memory._device_buffer import DeviceBuffer
    from .._host._pinned import HostBuffer
    from .._transfer._copy_batch import copy_batch

    made: list[Any] = []
    events: list[int] = []
    n = PROBE_BYTES
    try:
        with _context.primary_pushed(ordinal):
            managed = ManagedBuffer.empty(n)
            made.append(managed)
            managed.array[:] = 0  # host pages, as data filled on the host
            dev_buf = DeviceBuffer.empty(n, device=ordinal)
            made.append(dev_buf)
            pinned = HostBuffer.empty(n)
            made.append(pinned)
            stream = Stream(ordinal)
            made.append(stream)
            issue_advise(managed.ptr, n, MemAdvice.SET_PREFERRED_LOCATION, near)
            issue_advise(managed.ptr, n, MemAdvice.SET_ACCESSED_BY, Location.device(ordinal))
            if near.type is LocationType.HOST_NUMA:
                managed.prefetch(near, stream=stream)
            start, end = (int(_driver.call("cuEventCreate", 0)) for _ in range(2))
            events += [start, end]

            def timed(src: Any, method: str) -> float:
                _driver.call("cuEventRecord", start, stream.handle)
                copy_batch(dev_buf, src, dst_offsets=[0], src_offsets=[0], sizes=n,
                           stream=stream, method=method)
                _driver.call("cuEventRecord", end, stream.handle)
                _driver.call("cuEventSynchronize", end)
                return float(_driver.call("cuEventElapsedTime", start, end))

            # The kernel is loaded and the DMA path warmed on pinned memory, so that the
            # managed read timed is the first of its pages, as a walk reads them: mapping
            # host pages for the device is part of their cost (a second read of the same
            # pages was fast on a host where a walk's reads were not).
            timed(pinned, "kernel")
            timed(pinned, "driver")
            fast = timed(managed, "kernel") * MAPPED_SHARE <= timed(pinned, "driver")
    except CudaError:  # a probe that cannot run: keep the mapping (the plan's choice)
        fast = True
    finally:
        for obj in reversed(made):
            if isinstance(obj, Stream):
                obj.synchronize()
        for ev in events:
            _driver.call("cuEventDestroy", ev)
        for obj in reversed(made):
            obj.close()
    _FAST[ordinal] = fast
    return fast


@dataclass(frozen=True)
class _Entry:
    buffer: ManagedBuffer
    offset: int
    nbytes: int
    access: str
    reads: int
    mechanism: str
    auto: bool = False  # chosen by "auto": the walk may fall back (see mapped_reads_fast)


@dataclass(frozen=True)
class AccessChunk:
    """One chunk of an :class:`AccessRun`: what the kernel reads and where to work.

    Attributes
    ----------
    index : int
        Position in the plan's order.
    buffer : ManagedBuffer
        The managed buffer the chunk belongs to.
    offset, nbytes : int
        The chunk's byte range in ``buffer``.
    data : DeviceArrayView
        The memory to compute on, typed and shaped like a one-dimensional
        slice of ``buffer`` (``__cuda_array_interface__`` and DLPack): the
        managed range itself, or the device window holding it. Valid until the
        loop moves to the next chunk; writes to a window of a ``"readwrite"``
        entry are copied back to the buffer.
    stream : Stream
        The stream to order the work on (the run's stream).
    mechanism : str
        How the chunk got there: ``"zero_copy"``, ``"window"``, ``"read_mostly"``
        or ``"migrate"``.
    """

    index: int
    buffer: ManagedBuffer
    offset: int
    nbytes: int
    data: DeviceArrayView
    stream: Stream
    mechanism: str

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return self.data.__cuda_array_interface__


def _check_buffer(buffer: object) -> ManagedBuffer:
    if not isinstance(buffer, ManagedBuffer):
        raise TypeError(f"an AccessPlan walks a ManagedBuffer, not {type(buffer).__name__}")
    buffer._check_open()
    if buffer.nbytes == 0:
        raise ValueError("an empty ManagedBuffer has nothing to walk")
    return buffer


class AccessPlan:
    """Data larger than the GPU, walked in order with a window kept ahead on the device.

    Record what will be touched, in order, with :meth:`chunks` (a buffer cut
    in equal chunks) and :meth:`add` (one range); each call returns the plan.
    :meth:`run` then yields an :class:`AccessChunk` per entry: the memory the
    kernel reads (``chunk.data``: the managed range or a device window) and
    the stream to work on. The mechanism follows the pattern: zero-copy for
    data used once, a device window filled by the block-copy kernel for data
    read again, with fallbacks (read-mostly prefetches, the driver's own
    migration) where the device reads host memory through the mapping slowly;
    :meth:`mechanisms` shows the choice without running, and the guide page
    "Data larger than the GPU" says why.

    Parameters
    ----------
    lookahead : int, default 3
        Chunks on their way while one is processed (and device windows, for
        the ``"window"`` mechanism, each the size of the largest chunk).

    Examples
    --------
    >>> buf = cm.ManagedBuffer.zeros(1 << 20, "float32")
    >>> plan = cm.AccessPlan().chunks(buf, 1 << 20, access="read", reads=4)
    >>> plan.mechanisms()
    ['window', 'window', 'window', 'window']
    >>> with cm.Stream() as stream, plan.run(stream) as run:
    ...     for chunk in run:
    ...         pass  # launch kernels reading chunk.data on chunk.stream
    >>> buf.close()
    """

    __slots__ = ("_entries", "_lookahead")

    def __init__(self, *, lookahead: int = 3) -> None:
        self._lookahead = check_positive(lookahead, "lookahead")
        self._entries: list[_Entry] = []

    @property
    def lookahead(self) -> int:
        """Chunks on their way while one is processed."""
        return self._lookahead

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, buffer: ManagedBuffer, *, offset: int = 0, nbytes: int | None = None,
            access: str = "read", reads: int = 1, mechanism: str = "auto") -> Self:
        """Add one range of ``buffer``, touched after the entries already added.

        Parameters
        ----------
        buffer : ManagedBuffer
            The managed memory.
        offset, nbytes : int
            The byte range (default: all of it); it must hold whole elements
            of the buffer's dtype.
        access : {"read", "readwrite"}, default "read"
            Whether the work writes the range.
        reads : int, default 1
            How many times the work reads each byte of the range.
        mechanism : {"auto", "zero_copy", "window", "read_mostly", "migrate"}, default "auto"
            ``"auto"`` chooses from ``access`` and ``reads`` (and, where the
            device reads host memory through the mapping slowly, falls back
            at run time: see :func:`mapped_reads_fast`);
            ``"read_mostly"`` needs ``access="read"``.

        Returns
        -------
        AccessPlan
            The plan, for chaining; nothing is added when a check fails.

        Raises
        ------
        TypeError, ValueError, ClosedError
            A buffer that is not an open non-empty ManagedBuffer, a range
            outside it or not of whole elements, a bad access, reads or mechanism.
        """
        buf = _check_buffer(buffer)
        acc = one_of(access, "access", ACCESS)
        n_reads = check_positive(reads, "reads")
        mech = one_of(mechanism, "mechanism", MECHANISMS)
        off, n = check_span(offset, nbytes, buf.nbytes, what="ManagedBuffer")
        item = buf.dtype.itemsize
        if off % item or n % item:
            raise ValueError(f"offset and nbytes must be multiples of the buffer's item size "
                             f"({item} bytes), got {off} and {n}")
        if mech == "read_mostly" and acc != "read":
            raise ValueError("mechanism='read_mostly' is for data that is only read "
                             "(access='read')")
        auto = mech == "auto"
        if auto:
            mech = choose(acc, n_reads)
        self._entries.append(_Entry(buf, off, n, acc, n_reads, mech, auto))
        return self

    def chunks(self, buffer: ManagedBuffer, chunk_bytes: int, *, offset: int = 0,
               nbytes: int | None = None, access: str = "read", reads: int = 1,
               mechanism: str = "auto") -> Self:
        """Add ``buffer`` (or its byte range) cut in chunks of ``chunk_bytes``, in order.

        The last chunk holds what is left. ``offset``, ``nbytes``,
        ``access``, ``reads`` and ``mechanism`` are those of :meth:`add`;
        ``chunk_bytes`` must be a check_positive multiple of the item size.
        """
        buf = _check_buffer(buffer)
        step = check_positive(chunk_bytes, "chunk_bytes")
        if step % buf.dtype.itemsize:
            raise ValueError(f"chunk_bytes must be a multiple of the item size "
                             f"({buf.dtype.itemsize} bytes), got {step}")
        off, n = check_span(offset, nbytes, buf.nbytes, what="ManagedBuffer")
        one_of(access, "access", ACCESS)
        check_positive(reads, "reads")
        one_of(mechanism, "mechanism", MECHANISMS)
        before = len(self._entries)
        try:
            for start in range(off, off + n, step):
                self.add(buf, offset=start, nbytes=min(step, off + n - start), access=access,
                         reads=reads, mechanism=mechanism)
        except BaseException:
            del self._entries[before:]
            raise
        return self

    def mechanisms(self) -> list[str]:
        """The mechanism of each entry, in order (``"auto"`` resolved).

        An entry left to ``"auto"`` may still fall back when the walk starts, on a
        device that reads host memory through the mapping slowly
        (:func:`mapped_reads_fast`); each chunk's ``mechanism`` says what was used.
        """
        return [e.mechanism for e in self._entries]

    def run(self, stream: StreamLike) -> AccessRun:
        """Walk the plan on ``stream``'s device: iterate the result (best in a ``with``).

        Nothing is allocated or advised until the iteration starts; the walk
        ends (streams synchronized, advice undone, windows freed) when the
        iteration ends, when the loop is left by ``break`` or an exception,
        or when the run is closed.

        Parameters
        ----------
        stream : StreamLike
            The stream the work is ordered on; its device is the one the data
            is brought to (the legacy default stream: the current context's).

        Raises
        ------
        ValueError
            For an empty plan.
        """
        if not self._entries:
            raise ValueError("the AccessPlan is empty: add() or chunks() first")
        stream_handle(stream)  # the type checks, before anything else
        return AccessRun._make(list(self._entries), self._lookahead, stream)

    def __repr__(self) -> str:
        total = sum(e.nbytes for e in self._entries)
        mechs = sorted(set(self.mechanisms()))
        return (f"<AccessPlan {len(self._entries)} entries, {total} bytes, "
                f"{'/'.join(mechs) or 'empty'}, lookahead {self._lookahead}>")


class AccessRun:
    """One walk of an :class:`AccessPlan` (from :meth:`AccessPlan.run`).

    Iterate it once for the :class:`AccessChunk` of each entry; use it in a
    ``with`` block so that a loop left early frees everything at once.
    """

    _entries: list[_Entry]
    _lookahead: int
    _stream: Stream
    _started: bool
    _gen: Generator[AccessChunk, None, None] | None

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("get an AccessRun from AccessPlan.run(stream)")

    @classmethod
    def _make(cls, entries: list[_Entry], lookahead: int, stream: StreamLike) -> AccessRun:
        self = cls.__new__(cls)
        self._entries = entries
        self._lookahead = lookahead
        self._stream = stream if isinstance(stream, Stream) else Stream.from_handle(
            stream_handle(stream))
        self._started = False
        self._gen = None
        return self

    def __enter__(self) -> AccessRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[AccessChunk]:
        if self._started:
            raise RuntimeError("an AccessRun is walked once; call plan.run() again")
        self._started = True
        # A function of its own, not a method: the generator must not hold the run, so
        # that a loop left by ``break`` closes it at once (no reference cycle).
        self._gen = _walk(self._entries, self._lookahead, self._stream)
        return self._gen

    def close(self) -> None:
        """End the walk: synchronize, undo the advice, free the windows (idempotent)."""
        gen, self._gen = self._gen, None
        if gen is not None:
            gen.close()



def _walk(entries: list[_Entry], depth: int, user: Stream
          ) -> Generator[AccessChunk, None, None]:
    h = user.handle
    _context.ensure_any_context()
    ordinal = int(_driver.call("cuStreamGetDevice", h))
    dev = Location.device(ordinal)
    undo: list[tuple[int, int, MemAdvice, Location | None]] = []
    events: list[int] = []
    windows: list[DeviceBuffer] = []
    side: Stream | None = None
    near = near_host(ordinal)
    place = near.type is LocationType.HOST_NUMA  # pages moved to the device's node first
    try:
        if any(e.auto and e.mechanism in MAPPED for e in entries) and not mapped_reads_fast(
                ordinal, near):
            entries = [replace(e, mechanism=fallback(e)) if e.auto and e.mechanism in MAPPED
                       else e for e in entries]
        _advise(entries, dev, near, undo)
        with _context.primary_pushed(ordinal):  # the caller's current context is kept
            side = fill = Stream(ordinal, priority=HIGHEST_PRIORITY)
            ready = [_event(events) for _ in range(depth)]
            done = [_event(events) for _ in range(depth)]
            if any(e.mechanism == "window" for e in entries):
                from .._device_memory._device_buffer import DeviceBuffer

                size = max(e.nbytes for e in entries if e.mechanism == "window")
                for _ in range(depth):
                    windows.append(DeviceBuffer.empty(size, device=ordinal))
        used = [False] * depth  # slot has held a chunk whose work must finish first
        count = len(entries)
        nxt = 0

        def prepare(i: int) -> None:
            e, slot = entries[i], i % depth
            if e.mechanism == "migrate" or (e.mechanism == "zero_copy" and not place):
                return
            if used[slot]:
                _driver.call("cuStreamWaitEvent", fill.handle, done[slot], 0)
            if place and e.mechanism in MAPPED:
                PrefetchPlan().add(e.buffer, near, offset=e.offset,
                                   nbytes=e.nbytes).execute(fill)
            if e.mechanism == "window":
                _window_copy(ordinal, windows[slot], 0, e.buffer, e.offset, e.nbytes, fill)
            elif e.mechanism == "read_mostly":
                PrefetchPlan().add(e.buffer, dev, offset=e.offset,
                                   nbytes=e.nbytes).execute(fill)
            _driver.call("cuEventRecord", ready[slot], fill.handle)

        while nxt < min(depth, count):
            prepare(nxt)
            nxt += 1
        for i, e in enumerate(entries):
            slot = i % depth
            if e.mechanism in ("zero_copy", "migrate"):
                if place and e.mechanism == "zero_copy":
                    _driver.call("cuStreamWaitEvent", h, ready[slot], 0)
                ptr = e.buffer.ptr + e.offset
                owner: object = e.buffer
                dl = e.buffer._dl_device()
            else:
                _driver.call("cuStreamWaitEvent", h, ready[slot], 0)
                if e.mechanism == "window":
                    owner = windows[slot]
                    ptr = windows[slot].ptr
                    dl = (DL_CUDA, ordinal)
                else:
                    ptr, owner, dl = e.buffer.ptr + e.offset, e.buffer, e.buffer._dl_device()
            view = DeviceArrayView(owner, ptr, e.buffer.dtype,
                                   (e.nbytes // e.buffer.dtype.itemsize,), dl)
            yield AccessChunk(i, e.buffer, e.offset, e.nbytes, view, user, e.mechanism)
            _driver.call("cuEventRecord", done[slot], h)
            used[slot] = True
            if e.mechanism == "window" and e.access == "readwrite":
                _driver.call("cuStreamWaitEvent", fill.handle, done[slot], 0)
                _window_copy(ordinal, e.buffer, e.offset, windows[slot], 0, e.nbytes, fill)
                used[slot] = False  # the side stream is already after the work
            if nxt < count:
                prepare(nxt)
                nxt += 1
        # the write-backs before whatever follows on the stream
        _driver.call("cuEventRecord", ready[0], fill.handle)
        _driver.call("cuStreamWaitEvent", h, ready[0], 0)
    finally:
        _finish(user, side, events, windows, undo)


def _event(events: list[int]) -> int:
    ev = int(_driver.call("cuEventCreate", EVENT_DISABLE_TIMING))
    events.append(ev)
    return ev


def _window_copy(ordinal: int, dst: Any, dst_offset: int, src: Any, src_offset: int,
                 nbytes: int, stream: Stream) -> None:
    """Copy ``nbytes`` between a window and the managed range on ``stream``.

    With the block-copy kernel of device ``ordinal`` (:data:`FILL_METHOD`); the managed
    side's location hint (the host) is given for the driver's path.
    """
    from .._transfer._copy_batch import copy_batch

    host = Location.host()
    managed_src = isinstance(src, ManagedBuffer)
    with _context.primary_pushed(ordinal):
        copy_batch(dst, src, dst_offsets=[dst_offset], src_offsets=[src_offset], sizes=nbytes,
                   stream=stream, method=FILL_METHOD,
                   src_location=host if managed_src else None,
                   dst_location=None if managed_src else host)


def near_host(ordinal: int) -> Location:
    """The host memory nearest device ``ordinal``: its NUMA node, where the host has several.

    The device's reads through the mapping are latency-bound: from the other socket's
    memory they are several times slower than from its own node's.
    """
    nodes = host_numa_nodes()
    if len(nodes) > 1:
        try:
            node = Device(ordinal).attribute(CUdevice_attribute.CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID)
        except CudaError:  # a driver that does not know the attribute
            return Location.host()
        if node in nodes:
            return Location.host_numa(node)
    return Location.host()


def _advise(entries: list[_Entry], dev: Location, host: Location,
            undo: list[tuple[int, int, MemAdvice, Location | None]]) -> None:
    """Give each entry's advice, recording in ``undo`` how to restore what was there."""
    seen: set[tuple[int, int]] = set()
    for e in entries:
        ptr, n = e.buffer.ptr + e.offset, e.nbytes
        if (ptr, n) in seen:
            continue
        seen.add((ptr, n))
        before = query_range(ptr, n)
        if e.mechanism == "migrate":
            continue
        if e.mechanism == "read_mostly":
            if not before.read_mostly:
                issue_advise(ptr, n, MemAdvice.SET_READ_MOSTLY, None)
                undo.append((ptr, n, MemAdvice.UNSET_READ_MOSTLY, None))
            continue
        if before.preferred_location != host:
            issue_advise(ptr, n, MemAdvice.SET_PREFERRED_LOCATION, host)
            if before.preferred_location is None:
                undo.append((ptr, n, MemAdvice.UNSET_PREFERRED_LOCATION, None))
            else:
                undo.append((ptr, n, MemAdvice.SET_PREFERRED_LOCATION,
                             before.preferred_location))
        if dev not in before.accessed_by:
            issue_advise(ptr, n, MemAdvice.SET_ACCESSED_BY, dev)
            undo.append((ptr, n, MemAdvice.UNSET_ACCESSED_BY, dev))


def _finish(user: Stream, side: Stream | None, events: list[int], windows: list[Any],
            undo: list[tuple[int, int, MemAdvice, Location | None]]) -> None:
    """Synchronize, undo the advice, free what the walk made; every step is attempted."""
    errors: list[BaseException] = []

    def attempt(fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except BaseException as exc:  # the rest is still released; the first is raised
            errors.append(exc)

    if side is not None:
        attempt(_driver.call, "cuStreamSynchronize", side.handle)
    if not user.closed:  # a stream closed before the walk ended has finished its work
        attempt(_driver.call, "cuStreamSynchronize", user.handle)
    for ptr, n, adv, loc in reversed(undo):
        attempt(issue_advise, ptr, n, adv, loc)
    for w in windows:
        attempt(w.close)
    for ev in events:
        attempt(_driver.call, "cuEventDestroy", ev)
    if side is not None:
        attempt(side.close)
    if errors:
        raise errors[0]
