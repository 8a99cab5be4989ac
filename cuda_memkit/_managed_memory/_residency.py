"""Where managed memory is: :class:`Residency` and :func:`managed_residency`.

The driver answers two questions about managed memory, and no more:

* per range, the range attributes (``cuMemRangeGetAttributes``): the
  preferred location, the processors with accessed-by advice and whether it
  is read-mostly -- the advice in force, exact -- and the location it was
  last *prefetched* to. That last one is the driver's record of the last
  prefetch, not of where the pages are now: pages move when a processor
  touches them and when the driver evicts them from a full device, and
  neither changes it;
* per device, the free memory (``cuMemGetInfo``), which drops as managed
  pages arrive on the device and does not rise when they leave: the driver
  keeps that memory for managed pages and gives it to device allocations
  that need more than is free (evicting resident pages if it must).

:func:`managed_residency` reads the attributes block by block and merges
equal neighbours into :class:`ResidencyRun` parts. cuda_memkit's own record
of what it prefetched (``memory_stats().kind("managed_resident")``,
:func:`~cuda_memkit._managed_memory._managed_ranges.recorded_bytes`) and
:func:`managed_capacity` build on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._core import _context
from .._core._checks import check_index
from .._core._device import Device, check_ordinal
from .._core._location import Location, LocationType
from .._observability._observe import format_bytes
from . import _managed_ranges as _ranges

if TYPE_CHECKING:
    from .._core._location import LocationLike

__all__ = ["Residency", "ResidencyRun", "managed_residency"]

#: The driver keeps managed memory on a device in blocks of this many bytes: a
#: prefetch of one 4 KiB page takes 2 MiB of the device's free memory.
DEVICE_BLOCK = 2 << 20
PAGE = 4096


def _name(loc: Location | None) -> str:
    if loc is None:
        return "-"
    if loc.type is LocationType.DEVICE:
        return f"device {loc.id}"
    if loc.type is LocationType.HOST_NUMA:
        return f"host NUMA {loc.id}"
    return "host"


@dataclass(frozen=True)
class ResidencyRun:
    """One part of a managed range whose range attributes are the same throughout.

    Attributes
    ----------
    offset : int
        Start of the part, in bytes from the start of the range asked about.
    nbytes : int
        Length of the part in bytes.
    last_prefetch_location : Location or None
        Where the part was last prefetched to (``None``: never, or its pages
        disagree below the granularity). The driver's record of the last
        prefetch, not of where the pages are now.
    preferred_location : Location or None
        The preferred location advice (``None``: none).
    accessed_by : tuple of Location
        The processors with accessed-by advice.
    read_mostly : bool
        Whether the part has read-mostly advice.
    """

    offset: int
    nbytes: int
    last_prefetch_location: Location | None
    preferred_location: Location | None
    accessed_by: tuple[Location, ...]
    read_mostly: bool

    def _key(self) -> tuple[object, ...]:
        return (self.last_prefetch_location, self.preferred_location, self.accessed_by,
                self.read_mostly)

    def __str__(self) -> str:
        access = ", ".join(_name(x) for x in self.accessed_by) or "-"
        return (f"{self.offset:>14,} {format_bytes(self.nbytes):>11}  "
                f"{_name(self.last_prefetch_location):<13} "
                f"{_name(self.preferred_location):<13} {access:<17} "
                f"{'yes' if self.read_mostly else 'no'}")


@dataclass(frozen=True, repr=False)
class Residency:
    """Where each part of a managed range is, by the driver's range attributes.

    Made by :meth:`ManagedBuffer.residency <cuda_memkit.ManagedBuffer.residency>`
    or :func:`managed_residency`.

    Attributes
    ----------
    ptr : int
        Start address of the range.
    nbytes : int
        Length of the range in bytes.
    granularity : int
        The attributes were read per block of this many bytes (blocks aligned
        to multiples of it in the address space); differences inside a block
        read as the driver's "no common value" (``None``, ``False``, fewer
        accessors).
    runs : tuple of ResidencyRun
        The parts, in address order, neighbours with equal attributes merged.

    Notes
    -----
    Exact: the advice (preferred location, accessed-by, read-mostly), as the
    driver holds it, at the granularity. Not an observation of where the
    pages are: the last prefetch location (and so :meth:`prefetched_bytes`)
    is the driver's record of the last prefetch of each part. Pages have
    moved since if a processor touched them (a kernel on a device faults them
    in, a host access back) or if the driver evicted them to make room on a
    full device. The driver does not report where pages are; a device's free
    memory (:meth:`Device.mem_info <cuda_memkit.Device.mem_info>`) drops as
    managed pages arrive and stays down after they leave (the driver keeps
    the memory for managed pages and gives it to device allocations).
    """

    ptr: int
    nbytes: int
    granularity: int
    runs: tuple[ResidencyRun, ...]

    def prefetched_bytes(self, location: LocationLike) -> int:
        """Bytes of the range last prefetched to ``location`` (a device, the host...).

        The driver's record of the last prefetch (see the class notes): an
        upper bound of what ``location`` holds of the range only as long as
        nothing else moved the pages. ``Location.host()`` counts every host
        location where the installed cuda.bindings cannot tell NUMA nodes
        apart.
        """
        loc = _ranges.check_location(location, what="location")
        return sum(r.nbytes for r in self.runs if r.last_prefetch_location == loc)

    @property
    def by_last_prefetch(self) -> dict[Location | None, int]:
        """Bytes per last prefetch location (``None``: never prefetched, or mixed)."""
        out: dict[Location | None, int] = {}
        for r in self.runs:
            out[r.last_prefetch_location] = out.get(r.last_prefetch_location, 0) + r.nbytes
        return out

    def table(self) -> str:
        """The runs as a text table (what ``repr`` shows)."""
        parts = ", ".join(f"{_name(loc) if loc else 'not prefetched'} {format_bytes(n)}"
                          for loc, n in self.by_last_prefetch.items())
        lines = [f"<Residency 0x{self.ptr:x}: {format_bytes(self.nbytes)} in "
                 f"{len(self.runs)} run{'' if len(self.runs) == 1 else 's'} "
                 f"(read per {format_bytes(self.granularity)}); last prefetched: "
                 f"{parts or 'nothing'}>"]
        if self.runs:
            lines.append(f"{'offset':>14} {'bytes':>11}  {'last prefetch':<13} "
                         f"{'preferred':<13} {'accessed by':<17} read-mostly")
            lines.extend(str(r) for r in self.runs)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.table()


def check_granularity(value: object) -> int:
    """A residency granularity: a positive multiple of 4096 bytes."""
    g = check_index(value, "granularity")
    if g <= 0 or g % PAGE:
        raise ValueError(f"granularity must be a positive multiple of {PAGE} bytes, got {g}")
    return g


def read_residency(ptr: int, nbytes: int, granularity: int) -> Residency:
    """:class:`Residency` of a checked managed range (the context is current)."""
    runs: list[ResidencyRun] = []
    pos = ptr
    end = ptr + nbytes
    while pos < end:
        stop = min(end, (pos // granularity + 1) * granularity)
        info = _ranges.query_range(pos, stop - pos)
        run = ResidencyRun(pos - ptr, stop - pos, info.last_prefetch_location,
                           info.preferred_location, info.accessed_by, info.read_mostly)
        if runs and runs[-1]._key() == run._key():
            prev = runs[-1]
            runs[-1] = ResidencyRun(prev.offset, prev.nbytes + run.nbytes,
                                    run.last_prefetch_location, run.preferred_location,
                                    run.accessed_by, run.read_mostly)
        else:
            runs.append(run)
        pos = stop
    return Residency(ptr, nbytes, granularity, tuple(runs))


def managed_residency(ptr: int, nbytes: int, *, granularity: int = DEVICE_BLOCK) -> Residency:
    """Where each part of a managed range is, by the driver's range attributes.

    For any managed memory (a :class:`ManagedBuffer`'s, CuPy's, ...);
    :meth:`ManagedBuffer.residency <cuda_memkit.ManagedBuffer.residency>`
    is the same for a buffer.

    Parameters
    ----------
    ptr : int
        Start of the range; it must lie inside one managed allocation.
    nbytes : int
        Length of the range in bytes (0: an empty :class:`Residency`, no
        driver call).
    granularity : int, default 2 MiB
        Read the attributes per block of this many bytes (a multiple of
        4096): one ``cuMemRangeGetAttributes`` per block. 2 MiB is the unit
        in which the driver keeps managed memory on a device; 4096 reads
        every page.

    Returns
    -------
    Residency

    Raises
    ------
    TypeError, ValueError
        For a range that is not inside one managed allocation or a bad
        granularity (before any attribute is read).
    """
    g = check_granularity(granularity)
    p, n = _ranges.raw_range(ptr, nbytes)
    if n == 0:
        return Residency(p, 0, g, ())
    _context.ensure_context()
    return read_residency(p, n, g)


def managed_capacity(device: int | Device) -> int:
    """Bytes of device memory managed pages can take on ``device`` without evicting each other.

    The device's free memory (``cuMemGetInfo``) plus the managed bytes
    cuda_memkit last prefetched there (its own record), at most the device's
    total. An estimate, low where the driver kept memory from managed pages
    that left (free memory does not rise when they do) or holds pages faulted
    in by kernels, high where it evicted pages since their prefetch.
    """
    ordinal = check_ordinal(device)
    free, total = Device(ordinal).mem_info()
    return min(total, free + _ranges.recorded_resident(ordinal))
