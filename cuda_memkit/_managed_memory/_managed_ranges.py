"""Ranges of managed memory: checks, advice, prefetch and discard calls, range attributes.

What :class:`~cuda_memkit.ManagedBuffer` (``_managed``), the policies and
hints builder (``_policy``) and prefetch plans (``_prefetch_plan``) share:

* :class:`MemAdvice` and the argument checks for advice and locations;
* :func:`managed_extent` / :func:`raw_range`: a raw pointer range checked to
  lie inside one managed allocation;
* issuing: ``cuMemAdvise``, ``cuMemPrefetchAsync`` and the CUDA 13 batch
  calls (:func:`issue_step`, with a fallback where the driver lacks them, and
  :func:`on_stream` for the legacy default stream the batch calls refuse);
* :class:`RangeInfo` / :func:`query_range` (``cuMemRangeGetAttributes``).
"""

from __future__ import annotations

import enum
import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from cuda.bindings import driver as _cu

from .._core import _context, _device, _driver, _stream
from .._core._checks import as_index, span
from .._core._constants import LEGACY_STREAMS
from .._core._errors import CudaDriverNotFoundError, CudaInvalidValueError
from .._core._location import Location, LocationType, as_location

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

#: Legacy ``CUdevice`` values in range attributes.
DEVICE_CPU = -1
DEVICE_INVALID = -2



# -- argument checks ------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def host_numa_nodes() -> frozenset[int]:
    """The host NUMA node ids of this machine (``{0}`` where the OS does not say)."""
    try:
        names = os.listdir("/sys/devices/system/node")
    except OSError:
        return frozenset({0})
    nodes = {int(n[4:]) for n in names if n.startswith("node") and n[4:].isdigit()}
    return frozenset(nodes or {0})


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
    loc = as_location(where)
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


def as_advice(advice: object) -> MemAdvice:
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
        as_location(location)  # type-check; the driver ignores it for this advice
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
    p = as_index(ptr, "pointer")
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
    p = as_index(ptr, "pointer")
    start, size = managed_extent(p)
    off, n = span(p - start, nbytes, size, what=f"managed allocation at 0x{start:x}")
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
    try:
        typed = _driver.call("cuMemRangeGetAttributes", [4] * len(_TYPED_QUERY),
                             [a for _n, a in _TYPED_QUERY], len(_TYPED_QUERY), ptr, nbytes)
    except TypeError:
        pass
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
