"""Memory locations: a device, the host, or a host NUMA node."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from cuda.bindings import driver as _cu

from ._checks import check_int
from ._device import MAX_ORDINAL, Device, check_ordinal, existing_ordinal

__all__ = ["Location", "LocationLike", "LocationType", "check_exists", "to_location"]


class LocationType(enum.IntEnum):
    """Kinds of memory location (values of ``CUmemLocationType``)."""

    DEVICE = 1
    HOST = 2
    HOST_NUMA = 3
    HOST_NUMA_CURRENT = 4


@dataclass(frozen=True)
class Location:
    """Where memory lives or should go: a device, the host, or a host NUMA node.

    Build with :meth:`device`, :meth:`host`, :meth:`host_numa` or
    :meth:`host_numa_current`; a :class:`Device` or an int device ordinal is
    accepted wherever a location is.
    """

    type: LocationType
    id: int = 0

    def __post_init__(self) -> None:
        t = self.type
        if type(t) is not LocationType:
            check_int(t, "Location type", "a LocationType")
            try:
                t = LocationType(t)
            except ValueError:
                raise ValueError(f"unknown location type {t!r}; use a LocationType") from None
            object.__setattr__(self, "type", t)  # frozen
        i = self.id
        check_int(i, "Location id")
        if i < 0:
            raise ValueError(f"Location id must be >= 0, got {i}")
        if i > MAX_ORDINAL:  # CUmemLocation.id is a C int: never an OverflowError later
            raise ValueError(f"Location id {i} is past the largest the driver takes "
                             "(2**31 - 1)")
        if type(i) is not int:
            object.__setattr__(self, "id", int(i))  # numpy ints, IntEnums: a plain int

    @classmethod
    def device(cls, ordinal: Device | int) -> Location:
        """Device ``ordinal``."""
        return cls(LocationType.DEVICE, check_ordinal(ordinal))

    @classmethod
    def host(cls) -> Location:
        """The host (any NUMA node)."""
        return cls(LocationType.HOST, 0)

    @classmethod
    def host_numa(cls, node: int) -> Location:
        """Host NUMA node ``node``."""
        return cls(LocationType.HOST_NUMA, check_ordinal(node, "NUMA node"))

    @classmethod
    def host_numa_current(cls) -> Location:
        """The NUMA node of the calling thread's CPU."""
        return cls(LocationType.HOST_NUMA_CURRENT, 0)

    @property
    def is_host(self) -> bool:
        """Whether this is a host location (any kind)."""
        return self.type is not LocationType.DEVICE

    def to_cu(self) -> _cu.CUmemLocation:
        """Return the ``CUmemLocation`` struct for driver calls."""
        loc = _cu.CUmemLocation()
        loc.type = _cu.CUmemLocationType(int(self.type))
        loc.id = self.id
        return loc

    @classmethod
    def from_cu(cls, loc_type: int, loc_id: int) -> Location | None:
        """Build from a ``(CUmemLocationType, id)`` pair; ``None`` for INVALID/NONE."""
        try:
            kind = LocationType(int(loc_type))
        except ValueError:
            return None
        if int(loc_id) < 0 and kind not in (LocationType.HOST, LocationType.HOST_NUMA_CURRENT):
            return None  # not a location (e.g. an invalid device)
        return cls(kind, 0 if kind in (LocationType.HOST, LocationType.HOST_NUMA_CURRENT)
                   else int(loc_id))

    def __str__(self) -> str:
        if self.type is LocationType.DEVICE:
            return f"device {self.id}"
        if self.type is LocationType.HOST:
            return "host"
        if self.type is LocationType.HOST_NUMA:
            return f"host NUMA {self.id}"
        return "host NUMA (current)"


LocationLike = Location | Device | int


def to_location(where: LocationLike) -> Location:
    """Convert a :class:`Location`, :class:`Device` or device ordinal to a Location."""
    if isinstance(where, Location):
        return where
    if isinstance(where, Device):
        return Location(LocationType.DEVICE, where.ordinal)
    if isinstance(where, int) and not isinstance(where, bool):
        return Location.device(where)
    raise TypeError(
        f"expected a Location, Device or device ordinal, not {type(where).__name__}"
    )


def check_exists(loc: Location) -> Location:
    """``ValueError`` if ``loc`` names a device that does not exist; returns ``loc``."""
    if loc.type is LocationType.DEVICE:
        existing_ordinal(loc.id)
    return loc
