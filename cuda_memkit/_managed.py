"""Managed (unified) memory: :class:`ManagedBuffer`, advice, prefetch, discard.

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

The module also holds the range and location checks and the batch-call
machinery that :mod:`cuda_memkit._hints` (policies, prefetch plans) builds on.
"""

from __future__ import annotations

import enum
import functools
import operator
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from cuda.bindings import driver as _cu

from . import _device, _driver
from ._device import Location, LocationType, StreamLike, as_location, stream_handle
from ._errors import CudaDriverNotFoundError, CudaInvalidValueError
from ._interop import DL_CUDA_MANAGED, DeviceArrayView, DeviceMemoryMixin
from ._pinned import _nbytes
from ._resource import Resource, host_array, make_finalizer

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from ._device import LocationLike

__all__ = ["AttachFlags", "ManagedBuffer", "MemAdvice", "RangeInfo"]


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


_ALL_KINDS = frozenset(LocationType)
_ACCESS_KINDS = frozenset({LocationType.DEVICE, LocationType.HOST})

#: Legacy ``CUdevice`` values in range attributes.
DEVICE_CPU = -1
DEVICE_INVALID = -2

#: The legacy default stream handles: the batch calls refuse them.
_LEGACY_STREAMS = (0, 1)
_EVENT_DISABLE_TIMING = 0x2
_STREAM_NON_BLOCKING = 0x1


# -- argument checks -------------------------------------------------------------


def _index(value: object, what: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not bool")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{what} must be an int, not {type(value).__name__}") from None


def span(offset: object, nbytes: object, total: int, what: str = "buffer") -> tuple[int, int]:
    """Check a byte sub-range ``[offset, offset + nbytes)`` of ``total`` bytes.

    ``nbytes=None`` means "to the end". Returns ``(offset, nbytes)``.

    Raises
    ------
    TypeError
        For non-integer values.
    ValueError
        For negative values, a zero-size range or one that ends past ``total``.
    """
    off = _index(offset, "offset")
    if off < 0:
        raise ValueError(f"offset must be >= 0, got {off}")
    n = total - off if nbytes is None else _index(nbytes, "nbytes")
    if n < 0 and nbytes is not None:
        raise ValueError(f"nbytes must be >= 0, got {n}")
    if off > total:
        raise ValueError(f"offset {off} lies outside the {total}-byte {what}")
    if n == 0:
        raise ValueError(f"zero-size range at offset {off} of the {total}-byte {what}: "
                         "hints need at least one byte")
    if off + n > total:
        raise ValueError(f"range [{off}, {off + n}) lies outside the {total}-byte {what}")
    return off, n


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
                   kinds: frozenset[LocationType] = _ALL_KINDS,
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
        kinds = _ACCESS_KINDS if advice in (MemAdvice.SET_ACCESSED_BY,
                                            MemAdvice.UNSET_ACCESSED_BY) else _ALL_KINDS
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
    p = _index(ptr, "pointer")
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
    p = _index(ptr, "pointer")
    start, size = managed_extent(p)
    off, n = span(p - start, nbytes, size, what=f"managed allocation at 0x{start:x}")
    return start + off, n


# -- issuing ---------------------------------------------------------------------


def _loc_for_ignored() -> _cu.CUmemLocation:
    """A valid location for advice that ignores it: the current device."""
    return Location.device(_device.ensure_context()).to_cu()


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
    private non-blocking stream that waits for the legacy stream's earlier
    work (an event) and that the legacy stream then waits for, so the work is
    ordered exactly as if it had been issued on the legacy stream. The private
    stream and event are destroyed at once (the driver releases them when the
    work is done).
    """
    if stream not in _LEGACY_STREAMS:
        fn(stream)
        return
    event = _driver.call("cuEventCreate", _EVENT_DISABLE_TIMING)
    try:
        _driver.call("cuEventRecord", event, stream)
        private = _driver.call("cuStreamCreate", _STREAM_NON_BLOCKING)
        try:
            _driver.call("cuStreamWaitEvent", private, event, 0)
            fn(int(private))
            _driver.call("cuEventRecord", event, private)
            _driver.call("cuStreamWaitEvent", stream, event, 0)
        finally:
            _driver.call("cuStreamDestroy", private)
    finally:
        _driver.call("cuEventDestroy", event)


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


# -- the buffer --------------------------------------------------------------------


def _free_managed(ptr: int, ordinal: int) -> None:
    """Finalizer: free managed memory (a context must be current for cuMemFree)."""
    if not int(_driver.call("cuCtxGetCurrent")):
        _device.ensure_context(ordinal)
    _driver.call("cuMemFree", ptr)


def _normalize_shape(shape: object) -> tuple[int, ...]:
    if isinstance(shape, bool):
        raise TypeError("shape cannot be a bool")
    if isinstance(shape, int) or hasattr(shape, "__index__"):
        dims: tuple[object, ...] = (shape,)
    elif isinstance(shape, (tuple, list)):
        dims = tuple(shape)
    else:
        raise TypeError(f"shape must be an int or a tuple of ints, not {type(shape).__name__}")
    out = tuple(_index(d, "shape entry") for d in dims)
    if any(d < 0 for d in out):
        raise ValueError(f"shape entries must be >= 0, got {out}")
    return out


def _attach_at_alloc(attach: object) -> AttachFlags:
    if isinstance(attach, bool) or not isinstance(attach, int):
        raise TypeError(f"attach must be an AttachFlags value, not {type(attach).__name__}")
    if int(attach) not in (AttachFlags.GLOBAL, AttachFlags.HOST):
        raise ValueError("attach must be AttachFlags.GLOBAL or AttachFlags.HOST at allocation "
                         "(attach to a single stream later with .attach(stream))")
    return AttachFlags(int(attach))


class ManagedBuffer(Resource, DeviceMemoryMixin):
    """Managed (unified) memory from ``cuMemAllocManaged``.

    One address valid on the host and on every device; the driver migrates
    pages on demand, and :meth:`advise` / :meth:`prefetch` guide it. Build with
    :meth:`empty`, :meth:`zeros` or :meth:`from_array`. A zero-length buffer
    allocates nothing (its ``ptr`` is 0).

    Host access (:attr:`array`) is only safe while no GPU work on the buffer is
    in flight: synchronize the stream first.

    Examples
    --------
    >>> import numpy as np
    >>> with ManagedBuffer.from_array(np.arange(1 << 20, dtype=np.float32)) as buf:
    ...     buf.advise(MemAdvice.SET_PREFERRED_LOCATION, Location.device(0))
    ...     buf.prefetch(Location.device(0), stream=stream)
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
        import numpy as np

        dt = np.dtype(dtype)
        if dt.hasobject:
            raise TypeError("object dtypes cannot live in managed memory")
        if dt.itemsize == 0:
            raise TypeError(f"dtype {dt} has no size")
        shp = _normalize_shape(shape)
        flags = _attach_at_alloc(attach)
        nbytes = _nbytes(shp, dt)  # ValueError past MAX_NBYTES, like HostBuffer
        ordinal = _device.ensure_context()
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
        """Allocate managed memory filled with zero bytes.

        The fill is ``cuMemsetD8`` on the legacy default stream, which is then
        synchronized, so the pages start out on the current device.

        Parameters
        ----------
        shape : int or tuple of int
            Shape of the :attr:`array` view.
        dtype : dtype-like, default uint8
            Element type.
        attach : AttachFlags, default GLOBAL
            ``GLOBAL`` or ``HOST`` (see :class:`AttachFlags`).
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
    def nbytes(self) -> int:
        """Size in bytes."""
        self._check_open()
        return self._nbytes

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the :attr:`array` view."""
        return self._shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """Element type of the :attr:`array` view."""
        return self._dtype

    @property
    def device(self) -> int:
        """Ordinal of the device whose context was current at allocation."""
        return self._device_ordinal

    @property
    def attach_flags(self) -> AttachFlags:
        """The stream association last requested (at allocation or by :meth:`attach`)."""
        return self._attach_flags

    @property
    def array(self) -> np.ndarray[Any, Any]:
        """A zero-copy numpy view (host access: synchronize GPU work first)."""
        self._check_open()
        return host_array(self, self._ptr, self._shape, self._dtype)

    def __array__(self, dtype: npt.DTypeLike | None = None,
                  copy: bool | None = None) -> np.ndarray[Any, Any]:
        arr = self.array
        if dtype is not None and arr.dtype != dtype:
            return arr.astype(dtype)
        return arr.copy() if copy else arr

    def to_numpy(self) -> np.ndarray[Any, Any]:
        """Return a copy of the contents as a new numpy array (``cuMemcpy``)."""
        import numpy as np

        self._check_open()
        out = np.empty(self._shape, self._dtype)
        if self._nbytes:
            _driver.call("cuMemcpy", int(out.ctypes.data), self._ptr, self._nbytes)
        return out

    def _dl_device(self) -> tuple[int, int]:
        return (DL_CUDA_MANAGED, self._device_ordinal)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        self._check_open()
        return DeviceArrayView(self, self._ptr, self._dtype, self._shape,
                               self._dl_device()).__cuda_array_interface__

    def __repr__(self) -> str:
        if self.closed:
            return "<ManagedBuffer closed>"
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
        if isinstance(flags, bool) or not isinstance(flags, int):
            raise TypeError(f"flags must be an AttachFlags value, not {type(flags).__name__}")
        if int(flags) not in (AttachFlags.GLOBAL, AttachFlags.HOST, AttachFlags.SINGLE):
            raise ValueError(f"flags must be exactly one of GLOBAL, HOST, SINGLE, not {flags!r}")
        h = stream_handle(stream)
        flag = AttachFlags(int(flags))
        if flag is AttachFlags.SINGLE and h in _LEGACY_STREAMS:
            raise ValueError("cannot attach to the legacy default stream with SINGLE: it is "
                             "not a specific stream; pass a Stream")
        if self._nbytes == 0:
            raise ValueError("an empty ManagedBuffer has no memory to attach")
        _device.ensure_context()
        _driver.call("cuStreamAttachMemAsync", h, self._ptr, 0, int(flag))
        self._attach_flags = flag

    # -- hints ---------------------------------------------------------------------
    def _range(self, offset: object, nbytes: object) -> tuple[int, int]:
        self._check_open()
        off, n = span(offset, nbytes, self._nbytes, what="ManagedBuffer")
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
        adv = as_advice(advice)
        ptr, n = self._range(offset, nbytes)
        loc = advice_location(adv, location)
        _device.ensure_context()
        issue_advise(ptr, n, adv, loc)

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
        loc = check_location(to, what="prefetch destination")
        h = stream_handle(stream)
        _device.ensure_context()
        issue_prefetch(ptr, n, loc, h)

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
        _device.ensure_context()
        issue_step("discard", [(ptr, n, None)], h)

    def discard_and_prefetch(self, to: LocationLike, *, stream: StreamLike = None,
                             offset: int = 0, nbytes: int | None = None) -> None:
        """Discard the range's contents, then populate it at ``to``.

        Uses ``cuMemDiscardAndPrefetchBatchAsync`` (CUDA >= 13.0): the pages
        appear at ``to`` without their old contents being migrated. Where the
        driver lacks it, this is a plain :meth:`prefetch`.

        Parameters
        ----------
        to : int, Device or Location
            Where the pages should appear.
        stream : stream-like, optional
            The stream to order the call on (default: the legacy default stream).
        offset : int, default 0
            Start of the range, in bytes from the buffer's start.
        nbytes : int, optional
            Length of the range (default: to the end of the buffer).
        """
        ptr, n = self._range(offset, nbytes)
        loc = check_location(to, what="prefetch destination")
        h = stream_handle(stream)
        _device.ensure_context()
        issue_step("discard_and_prefetch", [(ptr, n, loc)], h)

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
        _device.ensure_context()
        return query_range(ptr, n)
