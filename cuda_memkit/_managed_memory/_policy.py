"""Migration policies and a hints builder for managed memory.

* :class:`MigrationPolicy`: a declarative set of advice (read-mostly, a
  preferred location, accessed-by processors) listing the exact
  ``(MemAdvice, Location)`` pairs it issues.
* :class:`ManagedMemoryHints`: a builder over a managed range (a
  :class:`~cuda_memkit.ManagedBuffer` or a raw pointer checked to lie inside
  a managed allocation).

Batched, coalescing prefetch plans are in :mod:`cuda_memkit._managed_memory._prefetch_plan`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from .._core import _context, _device
from .._core._checks import check_bool, check_span
from .._core._inflight import keep_alive
from .._core._location import Location, LocationType, to_location
from .._core._stream import StreamLike, stream_handle
from ._managed import ManagedBuffer
from ._managed_ranges import (
    ACCESS_KINDS,
    MemAdvice,
    RangeInfo,
    advice_location,
    check_advice,
    check_location,
    issue_advise,
    issue_prefetch,
    issue_step,
    query_range,
    raw_range,
)

if TYPE_CHECKING:
    from typing_extensions import Self

    from .._core._location import LocationLike

__all__ = ["ManagedMemoryHints", "MigrationPolicy"]


def loc_key(loc: Location) -> tuple[int, int]:
    return (int(loc.type), loc.id)


#: The expression that builds a location of each kind (``{}``: its id).
_LOC_EXPR = {
    LocationType.DEVICE: "Location.device({})",
    LocationType.HOST: "Location.host()",
    LocationType.HOST_NUMA: "Location.host_numa({})",
    LocationType.HOST_NUMA_CURRENT: "Location.host_numa_current()",
}


def _loc_expr(loc: Location) -> str:
    return _LOC_EXPR[loc.type].format(loc.id)


# -- MigrationPolicy -----------------------------------------------------------------


class MigrationPolicy:
    """A declarative migration policy: the advice a managed range should get.

    Build with :meth:`default`, :meth:`read_mostly`, :meth:`prefer_device`,
    :meth:`prefer_host` or :meth:`prefer`, add processors with
    :meth:`with_accessed_by`, and merge policies with ``|``. :attr:`advice`
    lists the ``(MemAdvice, Location or None)`` pairs that
    :meth:`ManagedMemoryHints.apply_policy` issues, in order. Policies are
    immutable, hashable and compare by value.

    Parameters
    ----------
    read_mostly : bool, default False
        Issue ``SET_READ_MOSTLY``.
    preferred_location : Location, Device or int, optional
        Issue ``SET_PREFERRED_LOCATION`` for it.
    accessed_by : iterable of Location, Device or int
        Issue ``SET_ACCESSED_BY`` for each (devices or the host).

    Examples
    --------
    >>> MigrationPolicy.prefer_device(0).with_accessed_by(Location.host()).advice
    ((<MemAdvice.SET_PREFERRED_LOCATION: 3>, Location(type=<LocationType.DEVICE: 1>, id=0)),
     (<MemAdvice.SET_ACCESSED_BY: 5>, Location(type=<LocationType.HOST: 2>, id=0)))
    """

    __slots__ = ("_accessed_by", "_preferred", "_read_mostly")

    _read_mostly: bool
    _preferred: Location | None
    _accessed_by: tuple[Location, ...]

    def __init__(self, *, read_mostly: bool = False,
                 preferred_location: LocationLike | None = None,
                 accessed_by: Iterable[LocationLike] = ()) -> None:
        check_bool(read_mostly, "read_mostly")
        preferred = None if preferred_location is None else to_location(preferred_location)
        if isinstance(accessed_by, (Location, int)) or hasattr(accessed_by, "ordinal"):
            raise TypeError("accessed_by must be an iterable of locations")
        access: set[Location] = set()
        for where in accessed_by:
            loc = to_location(where)
            if loc.type not in ACCESS_KINDS:
                raise ValueError(f"accessed-by must be a device or the host, not {loc}")
            access.add(loc)
        self._read_mostly = read_mostly
        self._preferred = preferred
        self._accessed_by = tuple(sorted(access, key=loc_key))

    # -- constructors ----------------------------------------------------------
    @classmethod
    def default(cls) -> MigrationPolicy:
        """No advice: the driver's default migration on page faults (issues nothing)."""
        return cls()

    @classmethod
    def read_mostly(cls) -> MigrationPolicy:
        """``SET_READ_MOSTLY``: readers get read-only copies; writes collapse them."""
        return cls(read_mostly=True)

    @classmethod
    def prefer_device(cls, device: _device.Device | int) -> MigrationPolicy:
        """``SET_PREFERRED_LOCATION`` device ``device``."""
        return cls(preferred_location=Location.device(device))

    @classmethod
    def prefer_host(cls) -> MigrationPolicy:
        """``SET_PREFERRED_LOCATION`` the host location (``CU_MEM_LOCATION_TYPE_HOST``)."""
        return cls(preferred_location=Location.host())

    @classmethod
    def prefer(cls, location: LocationLike) -> MigrationPolicy:
        """``SET_PREFERRED_LOCATION`` any location (e.g. a host NUMA node)."""
        return cls(preferred_location=location)

    def with_accessed_by(self, *locations: LocationLike) -> MigrationPolicy:
        """Return a copy that also sets ``SET_ACCESSED_BY`` for ``locations``."""
        return MigrationPolicy(read_mostly=self._read_mostly,
                               preferred_location=self._preferred,
                               accessed_by=(*self._accessed_by, *locations))

    def __or__(self, other: object) -> MigrationPolicy:
        """Merge two policies (their preferred locations must agree)."""
        if not isinstance(other, MigrationPolicy):
            return NotImplemented
        a, b = self._preferred, other._preferred
        if a is not None and b is not None and a != b:
            raise ValueError(f"cannot merge policies preferring {a} and {b}")
        return MigrationPolicy(read_mostly=self._read_mostly or other._read_mostly,
                               preferred_location=a if a is not None else b,
                               accessed_by=(*self._accessed_by, *other._accessed_by))

    # -- what it issues --------------------------------------------------------
    @property
    def is_read_mostly(self) -> bool:
        """Whether the policy sets read-mostly."""
        return self._read_mostly

    @property
    def preferred_location(self) -> Location | None:
        """The preferred location the policy sets, if any."""
        return self._preferred

    @property
    def accessed_by(self) -> tuple[Location, ...]:
        """The processors the policy marks as accessing the range."""
        return self._accessed_by

    @property
    def is_default(self) -> bool:
        """Whether the policy issues nothing."""
        return not self.advice

    @property
    def advice(self) -> tuple[tuple[MemAdvice, Location | None], ...]:
        """The ``(advice, location)`` pairs issued, in order (location ``None`` when ignored)."""
        pairs: list[tuple[MemAdvice, Location | None]] = []
        if self._read_mostly:
            pairs.append((MemAdvice.SET_READ_MOSTLY, None))
        if self._preferred is not None:
            pairs.append((MemAdvice.SET_PREFERRED_LOCATION, self._preferred))
        pairs.extend((MemAdvice.SET_ACCESSED_BY, loc) for loc in self._accessed_by)
        return tuple(pairs)

    def _key(self) -> tuple[object, ...]:
        return (self._read_mostly, self._preferred, self._accessed_by)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MigrationPolicy):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(("MigrationPolicy", *self._key()))

    def __repr__(self) -> str:
        parts: list[str] = []
        if self._read_mostly:
            parts.append("MigrationPolicy.read_mostly()")
        p = self._preferred
        if p is not None:
            if p.type is LocationType.DEVICE:
                parts.append(f"MigrationPolicy.prefer_device({p.id})")
            elif p.type is LocationType.HOST:
                parts.append("MigrationPolicy.prefer_host()")
            else:
                parts.append(f"MigrationPolicy.prefer({_loc_expr(p)})")
        text = " | ".join(parts) if parts else "MigrationPolicy.default()"
        if self._accessed_by:
            if len(parts) > 1:
                text = f"({text})"
            text += f".with_accessed_by({', '.join(map(_loc_expr, self._accessed_by))})"
        return text

    def __str__(self) -> str:
        words = []
        if self._read_mostly:
            words.append("read-mostly")
        if self._preferred is not None:
            words.append(f"prefer {self._preferred}")
        if self._accessed_by:
            words.append("accessed by " + ", ".join(map(str, self._accessed_by)))
        return "; ".join(words) or "default (no advice)"


# -- ManagedMemoryHints ----------------------------------------------------------------


class ManagedMemoryHints:
    """A builder of advice and prefetches for one managed range.

    ``ManagedMemoryHints(ptr, nbytes)`` takes a raw pointer, checked with
    ``cuPointerGetAttribute`` to lie (with all ``nbytes`` bytes) inside one
    managed allocation before anything is issued, and again before every
    call. :meth:`for_buffer` takes a :class:`ManagedBuffer` (and keeps it
    alive). Every method issues its driver call at once and returns the
    builder, so calls chain.

    Parameters
    ----------
    ptr : int
        Start of the range: a pointer into a managed allocation.
    nbytes : int
        Size of the range in bytes (> 0); the whole range must lie inside
        the allocation that contains ``ptr``.

    Raises
    ------
    TypeError, ValueError
        For a pointer outside managed memory, a zero size or a range that
        leaves the allocation.

    Examples
    --------
    >>> with cm.Stream() as stream, cm.ManagedBuffer.empty(1 << 20) as buf:
    ...     hints = (cm.ManagedMemoryHints.for_buffer(buf)
    ...              .set_read_mostly()
    ...              .set_accessed_by(cm.Location.device(0))
    ...              .prefetch_to(cm.Location.device(0), stream))
    ...     stream.synchronize()
    """

    __slots__ = ("_buffer", "_nbytes", "_ptr")

    _buffer: ManagedBuffer | None
    _ptr: int
    _nbytes: int

    def __init__(self, ptr: int, nbytes: int) -> None:
        if isinstance(ptr, ManagedBuffer):
            raise TypeError("use ManagedMemoryHints.for_buffer(buf) for a ManagedBuffer")
        if nbytes is None:
            raise TypeError("nbytes is required with a raw pointer")
        p, n = raw_range(ptr, nbytes)
        self._buffer = None
        self._ptr = p
        self._nbytes = n

    @classmethod
    def for_buffer(cls, buffer: ManagedBuffer, *, offset: int = 0,
                   nbytes: int | None = None) -> ManagedMemoryHints:
        """Hints for ``buffer`` or its byte sub-range ``[offset, offset + nbytes)``.

        Parameters
        ----------
        buffer : ManagedBuffer
            The buffer (kept alive by the builder).
        offset : int, default 0
            Byte offset of the range in the buffer.
        nbytes : int, optional
            Size of the range (default: to the end of the buffer).

        Returns
        -------
        ManagedMemoryHints
        """
        if not isinstance(buffer, ManagedBuffer):
            raise TypeError(f"for_buffer() needs a ManagedBuffer, not {type(buffer).__name__}; "
                            "use ManagedMemoryHints(ptr, nbytes) for a raw pointer")
        off, n = check_span(offset, nbytes, buffer.nbytes, what="ManagedBuffer")
        self = cls.__new__(cls)
        self._buffer = buffer
        self._ptr = buffer.ptr + off
        self._nbytes = n
        return self

    @property
    def ptr(self) -> int:
        """Start of the range."""
        return self._ptr

    @property
    def nbytes(self) -> int:
        """Size of the range in bytes."""
        return self._nbytes

    def __repr__(self) -> str:
        return f"<ManagedMemoryHints 0x{self._ptr:x} +{self._nbytes}>"

    def _target(self) -> tuple[int, int]:
        if self._buffer is not None:
            self._buffer._check_open()
        else:
            raw_range(self._ptr, self._nbytes)
        _context.ensure_context()
        return self._ptr, self._nbytes

    def _sub(self, offset: object, nbytes: object) -> tuple[int, int]:
        ptr, total = self._target()
        off, n = check_span(offset, nbytes, total, what="hinted range")
        return ptr + off, n

    # -- advice ----------------------------------------------------------------
    def advise(self, advice: MemAdvice, location: LocationLike | None = None) -> Self:
        """Issue ``cuMemAdvise(advice, location)`` on the range.

        Parameters
        ----------
        advice : MemAdvice or int
            The advice.
        location : Location, Device or int, optional
            The location the advice needs (preferred location, accessed-by);
            ``None`` for advice that takes none.
        """
        adv = check_advice(advice)
        loc = advice_location(adv, location)
        ptr, n = self._target()
        issue_advise(ptr, n, adv, loc)
        return self

    def set_read_mostly(self) -> Self:
        """``SET_READ_MOSTLY``."""
        return self.advise(MemAdvice.SET_READ_MOSTLY)

    def unset_read_mostly(self) -> Self:
        """``UNSET_READ_MOSTLY``."""
        return self.advise(MemAdvice.UNSET_READ_MOSTLY)

    def set_preferred_location(self, location: LocationLike) -> Self:
        """``SET_PREFERRED_LOCATION`` (a device, the host or a host NUMA node).

        Parameters
        ----------
        location : Location, Device or int
            The preferred location.
        """
        return self.advise(MemAdvice.SET_PREFERRED_LOCATION, location)

    def unset_preferred_location(self) -> Self:
        """``UNSET_PREFERRED_LOCATION``."""
        return self.advise(MemAdvice.UNSET_PREFERRED_LOCATION)

    def set_accessed_by(self, location: LocationLike) -> Self:
        """``SET_ACCESSED_BY`` a device or the host.

        Parameters
        ----------
        location : Location, Device or int
            The processor that accesses the range.
        """
        return self.advise(MemAdvice.SET_ACCESSED_BY, location)

    def unset_accessed_by(self, location: LocationLike) -> Self:
        """``UNSET_ACCESSED_BY`` a device or the host.

        Parameters
        ----------
        location : Location, Device or int
            The processor to forget.
        """
        return self.advise(MemAdvice.UNSET_ACCESSED_BY, location)

    def apply_policy(self, policy: MigrationPolicy) -> Self:
        """Issue every pair of ``policy.advice`` (nothing for the default policy).

        All locations are checked before the first call is made.

        Parameters
        ----------
        policy : MigrationPolicy
            The advice to issue.
        """
        if not isinstance(policy, MigrationPolicy):
            raise TypeError(f"expected a MigrationPolicy, not {type(policy).__name__}")
        pairs = [(adv, advice_location(adv, loc)) for adv, loc in policy.advice]
        if not pairs:
            return self
        ptr, n = self._target()
        for adv, loc in pairs:
            issue_advise(ptr, n, adv, loc)
        return self

    def reset(self) -> Self:
        """Undo all advice on the range.

        Unsets read-mostly, the preferred location and every accessed-by the
        driver reports for the whole range.
        """
        ptr, n = self._target()
        info = query_range(ptr, n)
        issue_advise(ptr, n, MemAdvice.UNSET_READ_MOSTLY, None)
        issue_advise(ptr, n, MemAdvice.UNSET_PREFERRED_LOCATION, None)
        for loc in info.accessed_by:
            issue_advise(ptr, n, MemAdvice.UNSET_ACCESSED_BY, loc)
        return self

    # -- prefetch ----------------------------------------------------------------
    def prefetch_to(self, location: LocationLike, stream: StreamLike = None) -> Self:
        """Prefetch the whole range to ``location`` on ``stream``.

        Parameters
        ----------
        location : Location, Device or int
            The destination.
        stream : StreamLike, default None
            The stream (``None``: the legacy default stream).
        """
        loc = check_location(location, what="prefetch destination")
        h = stream_handle(stream)
        ptr, n = self._target()
        issue_prefetch(ptr, n, loc, h)
        self._hold(h)
        return self

    def prefetch_range(self, offset: int, nbytes: int, location: LocationLike,
                       stream: StreamLike = None) -> Self:
        """Prefetch ``[offset, offset + nbytes)`` of the range (bounds-checked).

        Parameters
        ----------
        offset : int
            Byte offset in the hinted range.
        nbytes : int
            Size in bytes (> 0, inside the hinted range).
        location : Location, Device or int
            The destination.
        stream : StreamLike, default None
            The stream (``None``: the legacy default stream).
        """
        if nbytes is None:
            raise TypeError("nbytes is required")
        loc = check_location(location, what="prefetch destination")
        h = stream_handle(stream)
        ptr, n = self._sub(offset, nbytes)
        issue_prefetch(ptr, n, loc, h)
        self._hold(h)
        return self

    def discard(self, stream: StreamLike = None) -> Self:
        """Discard the range's contents (see :meth:`ManagedBuffer.discard`).

        Parameters
        ----------
        stream : StreamLike, default None
            The stream (``None``: the legacy default stream).
        """
        h = stream_handle(stream)
        ptr, n = self._target()
        issue_step("discard", [(ptr, n, None)], h)
        self._hold(h)
        return self

    def _hold(self, stream: int) -> None:
        """The buffer (if any) is held until ``stream`` ran the call: close() frees after it."""
        if self._buffer is not None:
            keep_alive(stream, (self._buffer,))

    def range_info(self) -> RangeInfo:
        """The driver's view of the range (:class:`RangeInfo`)."""
        ptr, n = self._target()
        return query_range(ptr, n)
