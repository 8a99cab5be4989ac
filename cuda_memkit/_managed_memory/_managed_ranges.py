"""Ranges of managed memory: checks, advice, prefetch and discard calls, range attributes.

What :class:`~cuda_memkit.ManagedBuffer` (``_managed``), the policies and
hints builder (``_policy``) and prefetch plans (``_prefetch_plan``) share:

* :class:`MemAdvice` and the argument checks for advice and locations;
* :func:`managed_extent` / :func:`raw_range`: a raw pointer range checked to
  lie inside one managed allocation;
* issuing: ``cuMemAdvise``, ``cuMemPrefetchAsync`` and the CUDA 13 batch
  calls (:func:`issue_step`, with a fallback where the driver lacks them, and
  :func:`on_stream` for the legacy default stream the batch calls refuse);
* :class:`RangeInfo` / :func:`query_range` (``cuMemRangeGetAttributes``);
* the residency record: where cuda_memkit last prefetched each part of its
  own managed allocations (:func:`recorded_bytes`, the ``"managed_resident"``
  ledger account).
"""

from __future__ import annotations

import bisect
import enum
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from cuda.bindings import driver as _cu

from .._core import _context, _device, _driver, _stream
from .._core._checks import check_index, check_span
from .._core._constants import LEGACY_STREAMS
from .._core._errors import CudaDriverNotFoundError, CudaInvalidValueError
from .._core._host_os import host_numa_nodes
from .._core._location import Location, LocationType, to_location
from .._core._resource import account, settlers

if TYPE_CHECKING:
    from .._core._location import LocationLike

__all__ = ["MemAdvice", "RangeInfo"]


class MemAdvice(enum.IntEnum):
    """Usage hints for managed memory (values of ``CUmem_advise``).

    ``SET_PREFERRED_LOCATION``, ``SET_ACCESSED_BY`` and ``UNSET_ACCESSED_BY``
    need a location; the others ignore it. Accessed-by takes a device or the
    host; a preferred location may be any location kind.
    """

    SET_READ_MOSTLY = 1
    UNSET_READ_MOSTLY = 2
    SET_PREFERRED_LOCATION = 3
    UNSET_PREFERRED_LOCATION = 4
    SET_ACCESSED_BY = 5
    UNSET_ACCESSED_BY = 6

    @property
    def needs_location(self) -> bool:
        """Whether the advice applies to a particular location."""
        return self in (MemAdvice.SET_PREFERRED_LOCATION, MemAdvice.SET_ACCESSED_BY,
                        MemAdvice.UNSET_ACCESSED_BY)


ALL_KINDS = frozenset(LocationType)
ACCESS_KINDS = frozenset({LocationType.DEVICE, LocationType.HOST})

#: The legacy ``CUdevice`` value of the host in range attributes.
DEVICE_CPU = -1


# -- argument checks ------------------------------------------------------------


def check_location(where: LocationLike, *, what: str = "location",
                   kinds: frozenset[LocationType] = ALL_KINDS,
                   ndevices: int | None = None) -> Location:
    """Convert ``where`` to a :class:`Location` and check it exists on this machine.

    Parameters
    ----------
    where : Location, Device or int
        The location (an int is a device ordinal).
    what : str
        What the location is for, used in messages.
    kinds : frozenset of LocationType
        The location kinds allowed here.
    ndevices : int, optional
        The device count, when the caller already has it.

    Raises
    ------
    TypeError
        If ``where`` is not a location.
    ValueError
        For a kind not allowed here, a device that does not exist or an
        unknown host NUMA node.
    """
    loc = to_location(where)
    if loc.type not in kinds:
        names = ", ".join(sorted(k.name.lower() for k in kinds))
        raise ValueError(f"{what} cannot be {loc}; allowed kinds: {names}")
    if loc.type is LocationType.DEVICE:
        n = _device.device_count() if ndevices is None else ndevices
        if loc.id >= n:
            raise ValueError(f"{what}: device {loc.id} does not exist "
                             f"(this machine has {n} device{'s' if n != 1 else ''})")
    elif loc.type is LocationType.HOST_NUMA and loc.id not in host_numa_nodes():
        nodes = sorted(host_numa_nodes())
        raise ValueError(f"{what}: host NUMA node {loc.id} does not exist (nodes: {nodes})")
    return loc


def check_advice(advice: object) -> MemAdvice:
    """Convert a :class:`MemAdvice`, ``CUmem_advise`` or int to :class:`MemAdvice`."""
    if isinstance(advice, MemAdvice):
        return advice
    if isinstance(advice, bool):
        raise TypeError("advice cannot be a bool")
    if isinstance(advice, (int, _cu.CUmem_advise)):
        try:
            return MemAdvice(int(advice))
        except ValueError:
            raise ValueError(f"{advice!r} is not a memory advice") from None
    raise TypeError(f"advice must be a MemAdvice, not {type(advice).__name__}")


def advice_location(advice: MemAdvice, location: LocationLike | None) -> Location | None:
    """The checked location for ``advice`` (``None`` where the advice ignores it)."""
    if advice.needs_location:
        if location is None:
            raise TypeError(f"{advice.name} needs a location")
        kinds = ACCESS_KINDS if advice in (MemAdvice.SET_ACCESSED_BY,
                                            MemAdvice.UNSET_ACCESSED_BY) else ALL_KINDS
        return check_location(location, what=f"{advice.name} location", kinds=kinds)
    if location is not None:
        to_location(location)  # type-check; the driver ignores it for this advice
    return None


def managed_extent(ptr: int) -> tuple[int, int]:
    """Return ``(start, size)`` of the managed allocation that contains ``ptr``.

    Uses ``cuPointerGetAttribute`` (``IS_MANAGED``, ``RANGE_START_ADDR``,
    ``RANGE_SIZE``).

    Raises
    ------
    ValueError
        If ``ptr`` is not inside managed memory.
    """
    p = check_index(ptr, "pointer")
    if p <= 0:
        raise ValueError(f"0x{p:x} is not a managed-memory pointer")
    attr = _cu.CUpointer_attribute
    try:
        managed = _driver.call("cuPointerGetAttribute", attr.CU_POINTER_ATTRIBUTE_IS_MANAGED, p)
        if not managed:
            raise ValueError(f"0x{p:x} is not managed memory (allocate it with "
                             "ManagedBuffer / cuMemAllocManaged)")
        start = int(_driver.call("cuPointerGetAttribute",
                                 attr.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p))
        size = int(_driver.call("cuPointerGetAttribute", attr.CU_POINTER_ATTRIBUTE_RANGE_SIZE, p))
    except CudaInvalidValueError as exc:
        raise ValueError(f"0x{p:x} is not memory the driver knows (not managed memory)") from exc
    return start, size


def raw_range(ptr: object, nbytes: object) -> tuple[int, int]:
    """Check that ``[ptr, ptr + nbytes)`` lies in one managed allocation.

    ``nbytes=None`` means "to the end of the allocation". Returns
    ``(ptr, nbytes)``.
    """
    p = check_index(ptr, "pointer")
    start, size = managed_extent(p)
    off, n = check_span(p - start, nbytes, size, what=f"managed allocation at 0x{start:x}")
    return start + off, n


# -- issuing ---------------------------------------------------------------------


def _loc_for_ignored() -> _cu.CUmemLocation:
    """A valid location for advice that ignores it: the current device."""
    return Location.device(_context.ensure_context()).to_cu()


def issue_advise(ptr: int, nbytes: int, advice: MemAdvice, loc: Location | None) -> None:
    """``cuMemAdvise`` on a checked range."""
    cu_loc = loc.to_cu() if loc is not None else _loc_for_ignored()
    _driver.call("cuMemAdvise", ptr, nbytes, _cu.CUmem_advise(int(advice)), cu_loc)


def issue_prefetch(ptr: int, nbytes: int, loc: Location, stream: int) -> None:
    """``cuMemPrefetchAsync`` on a checked range."""
    _driver.call("cuMemPrefetchAsync", ptr, nbytes, loc.to_cu(), 0, stream)
    _LOG.append(((ptr, nbytes, loc),))
    if len(_LOG) > _LOG_FOLD_AT:
        fold()


def on_stream(stream: int, fn: Callable[[int], None]) -> None:
    """Run ``fn(handle)`` so its work is ordered on ``stream``.

    The batch calls refuse the legacy default stream. For it, ``fn`` runs on a
    private stream forked from and joined back to it
    (:func:`~cuda_memkit._core._stream.forked_stream`), so the work is ordered
    exactly as if it had been issued on the legacy stream.
    """
    if stream not in LEGACY_STREAMS:
        fn(stream)
        return
    with _stream.forked_stream(stream) as private:
        fn(private)


Range: TypeAlias = "tuple[int, int, Location | None]"
"""``(ptr, nbytes, destination)``; destination ``None`` for discards."""

BATCH_API = {
    "prefetch": "cuMemPrefetchBatchAsync",
    "discard": "cuMemDiscardBatchAsync",
    "discard_and_prefetch": "cuMemDiscardAndPrefetchBatchAsync",
}


def location_groups(ranges: Sequence[Range]) -> tuple[list[Location], list[int]]:
    """The batch calls' ``prefetchLocs`` / ``prefetchLocIdxs`` for ``ranges``.

    Ranges with the same destination must be contiguous in ``ranges``.
    """
    locs: list[Location] = []
    idxs: list[int] = []
    prev: Location | None = None
    for i, (_p, _n, loc) in enumerate(ranges):
        if loc is None:
            raise ValueError("a prefetch range needs a destination")
        if i == 0 or loc != prev:
            locs.append(loc)
            idxs.append(i)
            prev = loc
    return locs, idxs


def issue_batch(kind: str, ranges: Sequence[Range], stream: int) -> None:
    """Issue one batch call of ``kind`` (a :data:`BATCH_API` key) for ``ranges``.

    Raises
    ------
    CudaDriverNotFoundError
        If the driver lacks the batch call (nothing was issued).
    """
    dptrs = [_cu.CUdeviceptr(p) for p, _n, _l in ranges]
    sizes = [n for _p, n, _l in ranges]
    count = len(dptrs)
    api = BATCH_API[kind]
    if kind == "discard":
        def fn(h: int) -> None:
            _driver.call(api, dptrs, sizes, count, 0, h)
    else:
        locs, idxs = location_groups(ranges)
        cu_locs = [loc.to_cu() for loc in locs]

        def fn(h: int) -> None:
            _driver.call(api, dptrs, sizes, count, cu_locs, idxs, len(cu_locs), 0, h)

    on_stream(stream, fn)
    _LOG.append(tuple(ranges))
    if len(_LOG) > _LOG_FOLD_AT:
        fold()


def issue_step(kind: str, ranges: Sequence[Range], stream: int,
               batch: bool | None = None) -> bool:
    """Issue ``ranges`` of ``kind`` on ``stream``, falling back without batch calls.

    A single prefetch range always uses ``cuMemPrefetchAsync``. Other steps use
    the batch call of their kind unless ``batch`` is ``False``. When the driver
    lacks it (and ``batch`` is ``None``), prefetches become a loop of
    ``cuMemPrefetchAsync`` calls, discard-and-prefetch becomes the prefetch
    alone and a discard is skipped (it is advisory: after a discard the
    contents are merely indeterminate, and keeping them is one such value).
    ``batch=True`` raises instead of falling back.

    Returns
    -------
    bool
        ``False`` if the driver turned out to lack the batch calls.
    """
    found = True
    if not ranges:
        return found
    if batch is not False and (kind != "prefetch" or len(ranges) > 1):
        try:
            issue_batch(kind, ranges, stream)
            return found
        except CudaDriverNotFoundError:
            if batch:
                raise
            found = False
    if kind != "discard":
        for ptr, n, loc in ranges:
            assert loc is not None
            issue_prefetch(ptr, n, loc, stream)
    return found


# -- range attributes ------------------------------------------------------------

_RA = _cu.CUmem_range_attribute
_LEGACY_QUERY = (
    ("read_mostly", _RA.CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY),
    ("preferred_location", _RA.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION),
    ("accessed_by", _RA.CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY),
    ("last_prefetch_location", _RA.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION),
)
_TYPED_QUERY = (
    ("preferred_location_type", _RA.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE),
    ("preferred_location_id", _RA.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID),
    ("last_prefetch_location_type", _RA.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE),
    ("last_prefetch_location_id", _RA.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID),
)


def _legacy_location(value: int) -> Location | None:
    if value >= 0:
        return Location.device(value)
    if value == DEVICE_CPU:
        return Location.host()
    return None


def _typed_location(raw: dict[str, Any], prefix: str) -> Location | None:
    legacy = _legacy_location(raw[prefix])
    loc_type = raw.get(f"{prefix}_type")
    if loc_type is None:  # bindings that cannot read the typed attributes
        return legacy
    if loc_type == 0:
        return None
    loc = Location.from_cu(loc_type, raw[f"{prefix}_id"])
    return loc if loc is not None else legacy


@dataclass(frozen=True)
class RangeInfo:
    """What the driver reports about a managed range (``cuMemRangeGetAttributes``).

    A value describes the *whole* range: where pages disagree (some advised,
    some not) the driver reports "none".

    Attributes
    ----------
    read_mostly : bool
        Every page has ``SET_READ_MOSTLY``.
    preferred_location : Location or None
        The preferred location every page shares (device, host or host NUMA
        node, from ``PREFERRED_LOCATION_TYPE`` / ``_ID``), else ``None``.
    accessed_by : tuple of Location
        Processors with ``SET_ACCESSED_BY`` on every page (devices, then the
        host).
    last_prefetch_location : Location or None
        Where every page was last explicitly prefetched to
        (``LAST_PREFETCH_LOCATION_TYPE`` / ``_ID``), else ``None``.
    raw : dict
        Every attribute as the driver returned it, by name: ``"read_mostly"``,
        ``"preferred_location"`` and ``"last_prefetch_location"`` (a device id,
        -1 for any host location, -2 for none), ``"accessed_by"`` (a list of
        those), and, where the installed cuda.bindings can read them,
        ``"preferred_location_type"`` / ``"_id"`` and
        ``"last_prefetch_location_type"`` / ``"_id"``.

    Notes
    -----
    With cuda.bindings 13.3 (which cannot read the typed attributes) a host
    NUMA node reads as :meth:`Location.host`.
    """

    read_mostly: bool
    preferred_location: Location | None
    accessed_by: tuple[Location, ...]
    last_prefetch_location: Location | None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


#: Whether the installed cuda.bindings can read the typed attributes (13.3 cannot).
_typed_readable = [True]


def query_range(ptr: int, nbytes: int) -> RangeInfo:
    """Read every range attribute of a checked managed range.

    One ``cuMemRangeGetAttributes`` call reads the four classic attributes; a
    second reads the typed ones (``*_LOCATION_TYPE`` / ``*_LOCATION_ID``, which
    tell a host NUMA node from the host). cuda.bindings 13.3 cannot read the
    typed ones (``TypeError: Unsupported attribute``); then locations come from
    the classic attributes alone, where every host kind reads as the host.
    """
    slots = _device.device_count() + 1
    sizes = [4 * slots if name == "accessed_by" else 4 for name, _a in _LEGACY_QUERY]
    attrs = [a for _n, a in _LEGACY_QUERY]
    values = _driver.call("cuMemRangeGetAttributes", sizes, attrs, len(attrs), ptr, nbytes)
    raw: dict[str, Any] = {}
    for (name, _a), value in zip(_LEGACY_QUERY, values, strict=True):
        raw[name] = [int(v) for v in value] if name == "accessed_by" else int(value)
    if _typed_readable[0]:
        try:
            typed = _driver.call("cuMemRangeGetAttributes", [4] * len(_TYPED_QUERY),
                                 [a for _n, a in _TYPED_QUERY], len(_TYPED_QUERY), ptr, nbytes)
        except TypeError:
            _typed_readable[0] = False  # the bindings refuse before the driver: ask once
        else:
            for (name, _a), value in zip(_TYPED_QUERY, typed, strict=True):
                raw[name] = int(value)
    accessed = {loc for loc in map(_legacy_location, raw["accessed_by"]) if loc is not None}
    return RangeInfo(
        read_mostly=bool(raw["read_mostly"]),
        preferred_location=_typed_location(raw, "preferred_location"),
        accessed_by=tuple(sorted(accessed, key=lambda loc: (int(loc.type), loc.id))),
        last_prefetch_location=_typed_location(raw, "last_prefetch_location"),
        raw=raw,
    )


# -- the residency record ----------------------------------------------------------
#
# The driver reports where each page was last *prefetched* (a range attribute),
# not where it is, and nothing per device. cuda_memkit keeps its own record of
# where it last prefetched each part of the managed allocations it owns
# (ManagedBuffer), from the prefetch and discard calls above: a prefetch to a
# device puts the range there, a prefetch to a host location or a discard takes
# it off. The bytes per device are the ledger account "managed_resident", so
# memory_stats() shows them. It is a record, not an observation: pages faulted
# in by kernels are not in it, and pages the driver evicted (device full) or
# migrated on access stay in it until the next prefetch or discard of them.
#
# Issuing a prefetch only appends to a log (plans issue thousands of ranges in
# one call); the log is folded into the record when read (the ledger's settle(),
# recorded_bytes()), when an allocation is freed and when it grows long.

#: Ranges are kept in whole pages, as the driver rounds them.
RECORD_PAGE = 4096
_LOG_FOLD_AT = 4096


@dataclass(frozen=True)
class _Mark:
    """A logged allocation (``"track"``) or free (``"forget"``) of a recorded allocation."""

    kind: str
    ptr: int
    size: int = 0


#: What happened, in order, not yet folded into the record: issued steps (tuples of
#: ``(ptr, nbytes, destination or None)``) and allocations and frees.
_LOG: list[tuple[Range, ...] | _Mark] = []
_record_lock = threading.RLock()


class _Record:
    """Where cuda_memkit last prefetched the parts of one managed allocation."""

    __slots__ = ("begins", "bytes_on", "devs", "ends", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.begins: list[int] = []  # sorted, disjoint [begin, end) offsets on a device
        self.ends: list[int] = []
        self.devs: list[int] = []
        self.bytes_on: dict[int, int] = {}

    def put(self, begin: int, end: int, dev: int | None) -> None:
        """``[begin, end)`` is now on device ``dev`` (``None``: not on any device)."""
        begins, ends, devs = self.begins, self.ends, self.devs
        i = bisect.bisect_right(ends, begin)  # the first run ending after begin
        j = bisect.bisect_left(begins, end)  # the first run starting at or after end
        if dev is not None:  # merge with touching runs on the same device
            if i > 0 and ends[i - 1] == begin and devs[i - 1] == dev:
                i -= 1
                begin = begins[i]
            if j < len(begins) and begins[j] == end and devs[j] == dev:
                end = ends[j]
                j += 1
        new_b: list[int] = []
        new_e: list[int] = []
        new_d: list[int] = []
        on = self.bytes_on
        for k in range(i, j):
            on[devs[k]] -= ends[k] - begins[k]
        if i < j and begins[i] < begin:  # the part of the first run before the range stays
            new_b.append(begins[i])
            new_e.append(begin)
            new_d.append(devs[i])
        if dev is not None:
            new_b.append(begin)
            new_e.append(end)
            new_d.append(dev)
        if i < j and ends[j - 1] > end:  # the part of the last run after the range stays
            new_b.append(end)
            new_e.append(ends[j - 1])
            new_d.append(devs[j - 1])
        for b, e, d in zip(new_b, new_e, new_d, strict=True):
            on[d] = on.get(d, 0) + e - b
        begins[i:j] = new_b
        ends[i:j] = new_e
        devs[i:j] = new_d

    def on(self, begin: int, end: int, dev: int) -> int:
        """Bytes of ``[begin, end)`` recorded on device ``dev``."""
        i = bisect.bisect_right(self.ends, begin)
        j = bisect.bisect_left(self.begins, end)
        return sum(min(self.ends[k], end) - max(self.begins[k], begin)
                   for k in range(i, j) if self.devs[k] == dev)


#: Tracked allocations: start address -> record; ``_STARTS`` sorted.
_RECORDS: dict[int, _Record] = {}
_STARTS: list[int] = []


def track(ptr: int, nbytes: int) -> None:
    """Start recording where cuda_memkit prefetches the managed allocation at ``ptr``."""
    _LOG.append(_Mark("track", int(ptr), int(nbytes)))  # plain ints: numpy ones compare slowly


def forget(ptr: int) -> None:
    """The managed allocation at ``ptr`` is being freed: drop its record and its bytes.

    Called from finalizers: plain dict and list operations, never a driver call.
    """
    _LOG.append(_Mark("forget", ptr))
    fold()


def _mark(m: _Mark) -> None:
    if m.kind == "track":
        if m.ptr not in _RECORDS:
            bisect.insort(_STARTS, m.ptr)
        _RECORDS[m.ptr] = _Record(m.size)
        return
    rec = _RECORDS.pop(m.ptr, None)
    if rec is None:
        return
    del _STARTS[bisect.bisect_left(_STARTS, m.ptr)]
    for dev, n in rec.bytes_on.items():
        if n:
            account("managed_resident", dev).remove(m.ptr)


def _find(ptr: int) -> tuple[int, _Record] | None:
    i = bisect.bisect_right(_STARTS, ptr) - 1
    if i < 0:
        return None
    start = _STARTS[i]
    rec = _RECORDS[start]
    return (start, rec) if ptr < start + rec.size else None


def _apply(steps: Sequence[Range]) -> None:
    """Put the ranges of one issued step in the record, then bring the ledger up to date."""
    touched: dict[int, _Record] = {}
    start, end, rec = 0, 0, None
    for ptr, nbytes, loc in steps:
        if not start <= ptr < end:  # the ranges of a step are mostly in one allocation
            found = _find(ptr)
            if found is None:
                start, end, rec = 0, 0, None
                continue  # memory cuda_memkit does not own: no record
            start, rec = found
            end = start + rec.size
        if rec is None:
            continue
        begin = (ptr - start) // RECORD_PAGE * RECORD_PAGE
        stop = min(rec.size, -(-(ptr - start + nbytes) // RECORD_PAGE) * RECORD_PAGE)
        dev = loc.id if loc is not None and loc.type is LocationType.DEVICE else None
        rec.put(begin, stop, dev)
        touched[start] = rec
    for key, r in touched.items():
        for d, n in r.bytes_on.items():
            acct = account("managed_resident", d)
            old = acct.live.get(key, 0)
            if n == old:
                continue
            if not old:
                acct.add(key, n)
            elif not n:
                acct.remove(key)
            else:
                acct.resize(key, n)


_folding = [False]


def fold() -> None:
    """Apply the log to the record (and the ledger), in order.

    A call made while a fold runs on this thread (a finalizer freeing a
    buffer in the middle of one) returns at once: the running fold takes
    what it logged.
    """
    if not _LOG:
        return
    with _record_lock:
        if _folding[0]:
            return
        _folding[0] = True
        try:
            while _LOG:
                steps = _LOG[:]
                del _LOG[:len(steps)]
                for step in steps:
                    if isinstance(step, _Mark):
                        _mark(step)
                    else:
                        _apply(step)
        finally:
            _folding[0] = False


settlers.append(fold)


def recorded_bytes(ptr: int, nbytes: int, device: int) -> int:
    """Bytes of ``[ptr, ptr+nbytes)`` cuda_memkit last prefetched to ``device``.

    From cuda_memkit's own record (see the comment above): 0 for memory it
    does not own, and not an observation of where the pages are now.
    """
    with _record_lock:
        fold()
        total = 0
        i = max(bisect.bisect_right(_STARTS, ptr) - 1, 0)
        end = ptr + nbytes
        while i < len(_STARTS) and _STARTS[i] < end:
            start = _STARTS[i]
            rec = _RECORDS[start]
            lo, hi = max(ptr, start) - start, min(end, start + rec.size) - start
            if lo < hi:
                total += rec.on(lo, hi, device)
            i += 1
        return total


def recorded_resident(device: int) -> int:
    """Bytes of managed memory cuda_memkit last prefetched to ``device`` (all allocations)."""
    fold()
    return sum(rec.bytes_on.get(device, 0) for rec in list(_RECORDS.values()))
