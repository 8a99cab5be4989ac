"""Prefetch plans: prefetches and discards collected, validated, coalesced, issued in batches.

:class:`PrefetchPlan` records entries first (:meth:`~PrefetchPlan.add`,
:meth:`~PrefetchPlan.add_ranges`, :meth:`~PrefetchPlan.discard`), validates
all of them before anything is issued, coalesces adjacent or overlapping
ranges with the same destination and issues a few batch calls
(``cuMemPrefetchBatchAsync`` and the discard batch calls of CUDA 13), with a
per-range fallback on older drivers.

Entries are stored without a Python object each: one plain tuple per
:meth:`~PrefetchPlan.add`, and one :class:`_Ranges` (two int64 arrays) per
:meth:`~PrefetchPlan.add_ranges`, whose entries are checked, coalesced and
issued with numpy. :class:`PlanEntry` objects are made only when asked for.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from .._core import _context, _device
from .._core._checks import check_bool, check_index, check_span, check_u64
from .._core._errors import ClosedError, CudaError
from .._core._inflight import keep_alive
from .._core._location import Location, to_location
from .._core._operands import operand
from .._core._stream import StreamLike, stream_handle
from ._managed import ManagedBuffer
from ._managed_ranges import (
    BATCH_API,
    Range,
    check_location,
    issue_step,
    managed_extent,
)
from ._plan_ranges import (
    EntryTuple,
    Ranges,
    close_gaps,
    intersect,
    merge_all,
    range_arrays,
    subtract,
)

if TYPE_CHECKING:
    from typing_extensions import Self

    from .._core._location import LocationLike

__all__ = ["MERGE_GAP", "PlanEntry", "PlannedCall", "PrefetchPlan"]


# -- PrefetchPlan --------------------------------------------------------------------

#: What a prefetch costs per range whatever its size (up to about 1 MiB), in seconds,
#: and the rate it moves pages at, in bytes per second: a gap between two ranges is
#: cheaper to move with them than to skip below their product (see docs/decisions.md).
RANGE_COST_S = 47e-6
PREFETCH_BYTES_PER_S = 47e9
#: The largest gap a plan (not ``exact``) closes between two prefetches: 2 MiB.
MERGE_GAP = (int(RANGE_COST_S * PREFETCH_BYTES_PER_S) >> 20) << 20

PREFETCH = "prefetch"
DISCARD = "discard"
DISCARD_AND_PREFETCH = "discard_and_prefetch"


@dataclass(frozen=True)
class PlanEntry:
    """One entry of a :class:`PrefetchPlan`, as added.

    Attributes
    ----------
    op : str
        ``"prefetch"``, ``"discard"`` or ``"discard_and_prefetch"``.
    base : int
        The buffer's address, or the raw pointer given.
    offset : int
        Byte offset from ``base``.
    nbytes : int or None
        Size; ``None`` (raw pointers only) means "to the end of the
        allocation", resolved by :meth:`PrefetchPlan.validate`.
    location : Location or None
        Destination (``None`` for discards).
    target : object
        The buffer (kept alive by the plan) or the raw pointer.
    """

    op: str
    base: int
    offset: int
    nbytes: int | None
    location: Location | None
    target: object = field(repr=False, compare=False)

    @property
    def ptr(self) -> int:
        """Start address of the entry's range."""
        return self.base + self.offset

    def __str__(self) -> str:
        size = "…end" if self.nbytes is None else f"+{self.nbytes}"
        dest = f" → {self.location}" if self.location is not None else ""
        return f"{self.op} 0x{self.ptr:x} {size}{dest}"


@dataclass(frozen=True)
class PlannedCall:
    """A driver call a plan makes (see :meth:`PrefetchPlan.dry_run`).

    Attributes
    ----------
    api : str
        The driver function, e.g. ``"cuMemPrefetchBatchAsync"``.
    ranges : tuple of (int, int, Location or None)
        ``(ptr, nbytes, destination)`` of each range in the call.
    stream : int
        The stream handle given to ``execute``.
    note : str
        How the call is made, where that is not obvious.
    """

    api: str
    ranges: tuple[Range, ...]
    stream: int
    note: str = ""

    @property
    def nbytes(self) -> int:
        """Total bytes covered by the call."""
        return sum(n for _p, n, _l in self.ranges)

    def __str__(self) -> str:
        groups: dict[str, int] = {}
        for _p, _n, loc in self.ranges:
            key = str(loc) if loc is not None else "discard"
            groups[key] = groups.get(key, 0) + 1
        dest = ", ".join(f"{k}: {v}" for k, v in groups.items())
        count = len(self.ranges)
        text = (f"{self.api}({count} range{'s' if count != 1 else ''}, {self.nbytes} bytes; "
                f"{dest}; stream 0x{self.stream:x})")
        return f"{text}  # {self.note}" if self.note else text



@dataclass
class _Compiled:
    buffers: tuple[Any, ...]  # the buffers, views and buffer-like objects of the entries
    raw_allocs: tuple[tuple[int, int], ...]
    steps: list[tuple[str, list[Range]]]


def _check_batch(batch: object) -> None:
    if batch is not None and type(batch) is not bool:
        raise TypeError(f"batch must be None, True or False, not {type(batch).__name__}")


class PrefetchPlan:
    """Prefetches and discards collected first, then validated and issued together.

    :meth:`add`, :meth:`add_ranges` (many ranges from arrays) and
    :meth:`discard` record entries (each returns the plan, so calls chain);
    nothing is issued until :meth:`execute`, which

    1. validates every entry (:meth:`validate`: ranges inside open buffers or
       managed allocations, sizes > 0, destinations that exist, no range sent
       to two destinations): **all or nothing**, one bad entry and no call is
       made;
    2. coalesces adjacent or overlapping ranges of one allocation with the
       same destination (4096 contiguous 128 KiB entries become one range),
       and, unless the plan is ``exact``, prefetches of one destination whose
       gap is cheaper to move than a range of its own (at most
       :data:`MERGE_GAP` bytes, with no other entry of the plan in it): the
       gap's pages are prefetched too;
    3. issues, in this order: the discards that are not also prefetched
       (``cuMemDiscardBatchAsync``), ranges both discarded and prefetched
       (``cuMemDiscardAndPrefetchBatchAsync``), then the prefetches, grouped by
       destination in one ``cuMemPrefetchBatchAsync`` (a single remaining
       range uses ``cuMemPrefetchAsync``).

    **Order of mixed entries.** A plan is a set, not a sequence: every discard
    takes effect before any prefetch, whatever order they were added in. A
    range that is both discarded and prefetched is discarded and then
    populated at the destination without migrating its old contents.

    **Exact ranges.** ``PrefetchPlan(exact=True)`` prefetches exactly the
    ranges added (only touching or overlapping ones merge): for a device that
    is nearly full, where the gaps' pages would evict data still needed.

    **Streams.** The batch calls refuse the legacy default stream; for it
    (``None``, 0 or ``Stream.legacy_default()``) they run on a private
    stream that waits for the legacy stream's earlier work and that the legacy
    stream then waits for, so the plan is still ordered on the legacy stream.

    **Older drivers.** Without the batch calls (before CUDA 13.0) prefetches
    become a loop of ``cuMemPrefetchAsync`` calls and discards are skipped
    (a discard is advisory).

    The validated, coalesced form is cached until the next :meth:`add` /
    :meth:`discard`; executing again only re-checks that the buffers are open
    (and that raw pointers are still managed memory).

    Examples
    --------
    >>> chunk = 128 << 10
    >>> buf, stream = cm.ManagedBuffer.empty(64 * chunk), cm.Stream()
    >>> plan = cm.PrefetchPlan()
    >>> for i in range(64):
    ...     plan = plan.add(buf, cm.Location.device(0), offset=i * chunk, nbytes=chunk)
    >>> [str(c) for c in plan.dry_run(stream)]   # one coalesced range
    ['cuMemPrefetchAsync(1 range, 8388608 bytes; device 0: 1; stream 0x...)']
    >>> plan.execute(stream)
    >>> stream.synchronize()
    >>> buf.close(); stream.close()
    """

    __slots__ = ("_compiled", "_count", "_entries", "_gap")

    #: The largest gap between two prefetches of one destination that a plan closes.
    MERGE_GAP: ClassVar[int] = MERGE_GAP

    def __init__(self, *, exact: bool = False) -> None:
        check_bool(exact, "exact")
        # The largest gap closed between two prefetches of one destination.
        self._gap = 0 if exact else MERGE_GAP
        # One tuple per add(), one Ranges per add_ranges(), in the order added.
        self._entries: list[EntryTuple | Ranges] = []
        self._count = 0
        self._compiled: _Compiled | None = None

    # -- building ------------------------------------------------------------------
    def _entry(self, op: str, target: object, to: LocationLike | None, offset: object,
               nbytes: object) -> Self:
        # Entries are stored as plain tuples in PlanEntry's field order; the
        # PlanEntry objects are made only when asked for (``entries``, errors).
        loc = None if to is None else to if type(to) is Location else to_location(to)
        if isinstance(target, ManagedBuffer):
            total = target.nbytes  # ClosedError for a closed buffer
            if (type(offset) is int and type(nbytes) is int and offset >= 0 and nbytes > 0
                    and offset + nbytes <= total):
                off, n = offset, nbytes  # the common case, checked inline
            else:
                off, n = check_span(offset, nbytes, total, what="ManagedBuffer")
            self._entries.append((op, target.ptr, off, n, loc, target))
            self._count += 1
            self._compiled = None
            return self
        if isinstance(target, bool):
            raise TypeError("a plan target cannot be a bool")
        size: int | None
        if isinstance(target, int):
            base = check_u64(target, "a plan target pointer")
            off = check_u64(offset, "offset")
            size = None
            if nbytes is not None:
                size = nbytes if type(nbytes) is int else check_index(nbytes, "nbytes")
                if size <= 0:
                    raise ValueError(f"nbytes must be > 0, got {size}")
                check_u64(base + off + size, "the range's end")
        elif hasattr(target, "ptr") and hasattr(target, "nbytes"):
            base = int(target.ptr)
            off, size = check_span(offset, nbytes, int(target.nbytes), what=type(target).__name__)
        elif isinstance(getattr(target, "__cuda_array_interface__", None), dict):
            # Another library's array (CuPy, RMM, numba, torch): its contiguous bytes.
            cai = operand(target, False)
            base, total = cai[0], int(cai[1] or 0)
            off, size = check_span(offset, nbytes, total, what=type(target).__name__)
        else:
            raise TypeError("a plan target must be a ManagedBuffer, a buffer with .ptr and "
                            ".nbytes, an object with __cuda_array_interface__, or an int "
                            f"pointer, not {type(target).__name__}")
        if base <= 0:
            raise ValueError(f"0x{base:x} is not a managed-memory pointer")
        self._entries.append((op, base, off, size, loc, target))
        self._count += 1
        self._compiled = None
        return self

    def add(self, target: ManagedBuffer | int | Any, to: LocationLike, *, offset: int = 0,
            nbytes: int | None = None) -> Self:
        """Add a prefetch of ``target``'s ``[offset, offset + nbytes)`` to ``to``.

        Parameters
        ----------
        target : ManagedBuffer, buffer, array or int
            The memory: a ManagedBuffer, an object with ``.ptr``/``.nbytes``,
            another library's contiguous array (``__cuda_array_interface__``:
            CuPy, RMM, numba, torch), or an int pointer. A raw int pointer is
            checked at :meth:`validate` to lie inside a managed allocation; its
            ``nbytes=None`` means "to the end of that allocation".
        to : Location, Device or int
            The destination.
        offset, nbytes : int
            The byte sub-range (default: all of it).

        Returns
        -------
        PrefetchPlan
            The plan, for chaining.

        Raises
        ------
        TypeError, ValueError, ClosedError
            For what can be checked without the driver (types, zero sizes,
            bounds of buffers, closed buffers).
        """
        if to is None:
            raise TypeError("add() needs a destination")
        if (type(to) is Location and type(target) is ManagedBuffer and type(offset) is int
                and type(nbytes) is int):
            # The common case (a buffer, a Location, int bounds), checked inline:
            # building a 4096-entry plan is then a few microseconds an entry.
            target._check_open()
            if offset >= 0 and nbytes > 0 and offset + nbytes <= target._nbytes:
                self._entries.append((PREFETCH, target._ptr, offset, nbytes, to, target))
                self._count += 1
                self._compiled = None
                return self
        return self._entry(PREFETCH, target, to, offset, nbytes)

    def add_ranges(self, buffer: ManagedBuffer | Any, to: LocationLike, offsets: Any,
                   sizes: Any) -> Self:
        """Add prefetches of many ranges of ``buffer`` to ``to``, from arrays.

        The same entries as ``add(buffer, to, offset=offsets[i], nbytes=sizes[i])``
        for each ``i`` in order (``entries``, coalescing, :meth:`dry_run`,
        :meth:`execute` are the same), checked with numpy at once and kept as
        two arrays: building a 4096-entry plan takes tens of microseconds
        instead of milliseconds.

        Parameters
        ----------
        buffer : ManagedBuffer, buffer or array
            The memory, as for :meth:`add` (raw int pointers: use :meth:`add`).
        to : Location, Device or int
            The destination of every range.
        offsets : array-like of int
            Byte offsets of the ranges (a numpy integer array or a sequence of ints).
        sizes : int or array-like of int
            Byte sizes of the ranges, or one int for all of them.

        Returns
        -------
        PrefetchPlan
            This plan, for chaining; nothing is added when a check fails.

        Raises
        ------
        TypeError
            Arrays that are not of integers (floats, bools, objects), a raw
            pointer or a non-buffer as ``buffer``, no destination.
        ValueError
            Arrays of different lengths or not one-dimensional, a negative
            offset, a size that is not > 0, a range past the end of the
            buffer (the message names the first bad index).
        ClosedError
            If ``buffer`` is closed.
        """
        if to is None:
            raise TypeError("add_ranges() needs a destination")
        if isinstance(buffer, (bool, int)):
            raise TypeError("add_ranges() needs a buffer, not an int pointer (use add() for "
                            "raw pointers)")
        if isinstance(buffer, ManagedBuffer):
            total, base = buffer.nbytes, buffer.ptr  # ClosedError for a closed buffer
        elif hasattr(buffer, "ptr") and hasattr(buffer, "nbytes"):
            total, base = int(buffer.nbytes), int(buffer.ptr)
            if base <= 0:
                raise ValueError(f"0x{base:x} is not a managed-memory pointer")
        elif isinstance(getattr(buffer, "__cuda_array_interface__", None), dict):
            cai = operand(buffer, False)
            base, total = cai[0], int(cai[1] or 0)
            if base <= 0:
                raise ValueError(f"0x{base:x} is not a managed-memory pointer")
        else:
            raise TypeError("add_ranges() needs a ManagedBuffer, a buffer with .ptr and "
                            ".nbytes or an object with __cuda_array_interface__, not "
                            f"{type(buffer).__name__}")
        loc = to if type(to) is Location else to_location(to)
        off, size = range_arrays(offsets, sizes, total, type(buffer).__name__)
        if len(off):
            self._entries.append(Ranges(PREFETCH, base, off, size, loc, buffer))
            self._count += len(off)
            self._compiled = None
        return self

    def discard(self, target: ManagedBuffer | int | Any, *, offset: int = 0,
                nbytes: int | None = None) -> Self:
        """Add a discard of ``target``'s range (contents no longer needed).

        Discards take effect before every prefetch of the plan (see the class
        notes); a range both discarded and prefetched is issued as
        discard-and-prefetch. ``target``, ``offset`` and ``nbytes`` are those
        of :meth:`add`; it returns and raises as :meth:`add` does.
        """
        return self._entry(DISCARD, target, None, offset, nbytes)

    def discard_and_prefetch(self, target: ManagedBuffer | int | Any, to: LocationLike, *,
                             offset: int = 0, nbytes: int | None = None) -> Self:
        """Add a discard of the range followed by a prefetch to ``to``.

        Takes, returns and raises as :meth:`add`: the old contents of the
        range are not migrated, only its pages move to ``to``.
        """
        if to is None:
            raise TypeError("discard_and_prefetch() needs a destination")
        return self._entry(DISCARD_AND_PREFETCH, target, to, offset, nbytes)

    def clear(self) -> None:
        """Remove every entry."""
        self._entries.clear()
        self._count = 0
        self._compiled = None

    # -- inspection ----------------------------------------------------------------
    def _rows(self) -> Iterator[EntryTuple]:
        for e in self._entries:
            if type(e) is Ranges:
                yield from e.rows()
            else:
                yield e  # type: ignore[misc]

    @property
    def entries(self) -> tuple[PlanEntry, ...]:
        """The entries in the order they were added (one per range of :meth:`add_ranges`)."""
        return tuple(PlanEntry(*e) for e in self._rows())

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[PlanEntry]:
        return iter(self.entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    # -- validation and coalescing ------------------------------------------------
    def _compile(self) -> _Compiled:
        ndev = _device.device_count()
        buffers: dict[int, Any] = {}
        # Raw pointers: one managed_extent() lookup per distinct allocation;
        # further pointers are checked against the cached [start, end).
        starts: list[int] = []
        extents: list[tuple[int, int]] = []
        # Destinations, checked once each, in first-seen order.
        prefetch: dict[Location, list[tuple[int, int, int]]] = {}
        last_loc: Location | None = None
        last_buf: object = None
        last_dest: list[tuple[int, int, int]] = []
        discard: list[tuple[int, int, int]] = []
        # The ranges of add_ranges() on a ManagedBuffer, as arrays: (alloc, starts, ends).
        arrays: dict[Location, list[tuple[int, Any, Any]]] = {}
        discard_arrays: list[tuple[int, Any, Any]] = []
        i = 0
        for item in self._entries:
            if type(item) is Ranges:
                t = item.target
                if isinstance(t, ManagedBuffer):
                    # Checked by add_ranges(): the buffer has to be open and the
                    # destination exist, as for its first entry one by one.
                    op, base, loc = item.op, item.base, item.loc
                    try:
                        if id(t) not in buffers:
                            t._check_open()
                            buffers[id(t)] = t
                        last_buf = t
                        if loc is not None and loc is not last_loc:
                            dest = prefetch.get(loc)
                            if dest is None:
                                check_location(loc, what="prefetch destination", ndevices=ndev)
                                dest = prefetch[loc] = []
                            last_loc, last_dest = loc, dest
                    except ClosedError as exc:
                        raise ClosedError(f"plan entry {i} ({PlanEntry(*item.rows()[0])}): "
                                          f"{exc}") from exc
                    except (TypeError, ValueError) as exc:
                        raise ValueError(f"plan entry {i} ({PlanEntry(*item.rows()[0])}): "
                                         f"{exc}") from exc
                    firsts = item.offsets + base
                    ranges = (base, firsts, firsts + item.sizes)
                    if loc is not None:
                        arrays.setdefault(loc, []).append(ranges)
                    if op != PREFETCH:
                        discard_arrays.append(ranges)
                    i += len(item)
                    continue
                rows: Iterable[EntryTuple] = item.rows()
            else:
                rows = (item,)  # type: ignore[assignment]
            for op, base, off, nbytes, loc, t in rows:
                try:
                    if t is last_buf or isinstance(t, ManagedBuffer):
                        # The buffer knows its range (checked by add()); it only has to be
                        # open: no driver call.
                        if t is not last_buf:
                            assert isinstance(t, ManagedBuffer)
                            if id(t) not in buffers:
                                t._check_open()
                                buffers[id(t)] = t
                            last_buf = t
                        assert nbytes is not None
                        alloc, ptr, end = base, base + off, base + off + nbytes
                    else:
                        if type(t) is not int and getattr(t, "closed", False):
                            # A freed pool buffer's address may be another owner's now.
                            raise ClosedError(f"{type(t).__name__} was freed or closed")
                        if type(t) is not int and id(t) not in buffers:
                            # re-checked by every execute(), held while the plan runs (a
                            # view's owner with it)
                            buffers[id(t)] = t
                        ptr = base + off
                        k = bisect_right(starts, ptr) - 1
                        if k >= 0 and ptr < extents[k][0] + extents[k][1]:
                            start, size = extents[k]
                        else:
                            start, size = managed_extent(ptr)
                            k = bisect_right(starts, start)
                            starts.insert(k, start)
                            extents.insert(k, (start, size))
                        if nbytes is not None and ptr + nbytes <= start + size:
                            end = ptr + nbytes  # add() checked nbytes > 0
                        else:
                            o, n = check_span(ptr - start, nbytes, size,
                                        what=f"managed allocation at 0x{start:x}")
                            ptr, end = start + o, start + o + n
                        alloc = start
                    if loc is not None:
                        if loc is not last_loc:
                            dest = prefetch.get(loc)
                            if dest is None:
                                check_location(loc, what="prefetch destination", ndevices=ndev)
                                dest = prefetch[loc] = []
                            last_loc, last_dest = loc, dest
                        last_dest.append((alloc, ptr, end))
                    if op != PREFETCH:
                        discard.append((alloc, ptr, end))
                except ClosedError as exc:
                    raise ClosedError(f"plan entry {i} "
                                      f"({PlanEntry(op, base, off, nbytes, loc, t)}): {exc}"
                                      ) from exc
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"plan entry {i} "
                                     f"({PlanEntry(op, base, off, nbytes, loc, t)}): {exc}"
                                     ) from exc
                i += 1
        order = {loc: j for j, loc in enumerate(prefetch)}
        raw = tuple(extents)
        merged = {loc: merge_all(iv, arrays.get(loc, [])) for loc, iv in prefetch.items()}
        if len(merged) > 1:  # ranges of one destination cannot conflict
            flat = sorted(((s, e, loc) for loc, ivs in merged.items() for s, e in ivs),
                          key=lambda x: (x[0], x[1]))
            reach, reach_loc = -1, None
            for lo, hi, loc in flat:
                if lo < reach and loc != reach_loc:
                    raise ValueError(f"plan sends overlapping ranges to {reach_loc} and {loc} "
                                     f"(at 0x{lo:x}); a batch is unordered, so this is "
                                     "ambiguous")
                if hi > reach:
                    reach, reach_loc = hi, loc
        dmerged = merge_all(discard, discard_arrays)
        if self._gap:
            bounds = sorted({(t.ptr, t.ptr + t.nbytes) for t in buffers.values()
                             if isinstance(t, ManagedBuffer)}
                            | {(a, a + n) for a, n in extents})
            for loc in merged:
                others = sorted([iv for other, ivs in merged.items() if other != loc
                                 for iv in ivs] + dmerged)
                merged[loc] = close_gaps(merged[loc], self._gap, bounds, others)
        steps: list[tuple[str, list[Range]]] = []
        if dmerged:
            covered = sorted(iv for ivs in merged.values() for iv in ivs)
            only_discard = subtract(dmerged, covered)
            if only_discard:
                steps.append((DISCARD, [(s, e - s, None) for s, e in only_discard]))
        dp: list[Range] = []
        pf: list[Range] = []
        for loc in sorted(merged, key=order.__getitem__):
            if dmerged:
                dp.extend((s, e - s, loc) for s, e in intersect(merged[loc], dmerged))
                pf.extend((s, e - s, loc) for s, e in subtract(merged[loc], dmerged))
            else:  # nothing discarded: the merged ranges as they are
                pf.extend((s, e - s, loc) for s, e in merged[loc])
        if dp:
            steps.append((DISCARD_AND_PREFETCH, dp))
        if pf:
            steps.append((PREFETCH, pf))
        return _Compiled(tuple(buffers.values()), raw, steps)

    def _compiled_checked(self) -> _Compiled:
        c = self._compiled
        if c is None:
            c = self._compiled = self._compile()
            return c
        for buf in c.buffers:
            if getattr(buf, "closed", False):
                self._compiled = None
                return self._compiled_checked()  # re-validate to name the entry
        for start, size in c.raw_allocs:
            try:
                same = managed_extent(start) == (start, size)
            except ValueError:
                same = False
            if not same:
                self._compiled = None
                return self._compiled_checked()
        return c

    def validate(self) -> None:
        """Check every entry without issuing anything.

        Raises
        ------
        ValueError
            Naming the first bad entry: a range outside its buffer or
            allocation, a pointer that is not managed memory, a destination
            that does not exist, or overlapping ranges sent to two
            destinations.
        ClosedError
            If an entry's buffer is closed.
        """
        self._compiled = None
        self._compiled = self._compile()

    # -- issuing -------------------------------------------------------------------
    def _calls(self, c: _Compiled, stream: int, batch: bool | None) -> list[PlannedCall]:
        calls: list[PlannedCall] = []
        legacy = stream in (0, 1)
        for kind, ranges in c.steps:
            if batch is not False and (kind != PREFETCH or len(ranges) > 1):
                note = ("on a private stream ordered after and before the legacy default "
                        "stream" if legacy else "")
                calls.append(PlannedCall(BATCH_API[kind], tuple(ranges), stream, note))
            elif kind == DISCARD:
                calls.append(PlannedCall(BATCH_API[kind], tuple(ranges), stream,
                                         "skipped: no batch calls (a discard is advisory)"))
            else:
                calls.extend(PlannedCall("cuMemPrefetchAsync", ((p, n, loc),), stream)
                             for p, n, loc in ranges)
        return calls

    def dry_run(self, stream: StreamLike = None, *, batch: bool | None = None
                ) -> list[PlannedCall]:
        """Return the driver calls :meth:`execute` would make, without making them.

        Validates the plan (and raises like :meth:`validate`). With
        ``batch=None`` the batch calls are assumed present; ``batch=False``
        shows the fallback of single calls.

        Parameters
        ----------
        stream : StreamLike, default None
            The stream the calls would be made on.
        batch : bool, optional
            ``None`` or ``True``: the batch calls; ``False``: single calls.

        Returns
        -------
        list of PlannedCall
            The calls, in order (empty for an empty plan).
        """
        h = stream_handle(stream)
        _check_batch(batch)
        if not self._entries:
            return []
        return self._calls(self._compiled_checked(), h, batch)

    def execute(self, stream: StreamLike = None, *, batch: bool | None = None) -> None:
        """Validate, coalesce and issue the plan on ``stream``.

        An empty plan is a no-op (no driver call).

        Parameters
        ----------
        stream : StreamLike, default None
            The stream (``None``: the legacy default stream, see the class notes).
        batch : bool, optional
            ``None``: use the batch calls where the driver has them, else fall
            back; ``False``: always single calls; ``True``: raise
            :class:`CudaDriverNotFoundError` if the driver lacks them.

        Raises
        ------
        ValueError, ClosedError
            If an entry is bad (see :meth:`validate`); nothing is issued.
        """
        h = stream_handle(stream)
        _check_batch(batch)
        if not self._entries:
            return
        c = self._compiled_checked()
        _context.ensure_context()
        for kind, ranges in c.steps:
            if not issue_step(kind, ranges, h, batch):
                batch = False
        if c.buffers:  # queued: closing a buffer of the plan frees it after the plan ran
            keep_alive(h, c.buffers)

    def __repr__(self) -> str:
        n = self._count
        head = f"<PrefetchPlan {n} entr{'y' if n == 1 else 'ies'}"
        if not n:
            return head + ">"
        try:
            calls = self.dry_run(0x0)
        except (ValueError, ClosedError, CudaError) as exc:  # repr must not raise
            return f"{head}, not valid: {exc}>"
        text = "; ".join(f"{c.api}({len(c.ranges)} range{'s' if len(c.ranges) != 1 else ''}, "
                         f"{c.nbytes} bytes)" for c in calls)
        return f"{head} → {text}>"
