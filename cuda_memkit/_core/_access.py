"""Access to memory by devices and the host: the vocabulary pools and mappings share.

:class:`Access` (read, read-write, none), the check of an access argument, the
check of the locations access is granted to, and the ``CUmemAccessDesc`` list
that ``cuMemPoolSetAccess`` and ``cuMemSetAccess`` take.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any, Union

from cuda.bindings import driver as _cu

from ._device import Device
from ._location import Location, as_location, check_exists

__all__ = ["Access", "TargetLike", "access_descs", "as_access", "as_targets"]


class Access(enum.IntEnum):
    """Access a location has to a mapping (values of ``CUmemAccess_flags``)."""

    NONE = 0
    READ = 1
    READWRITE = 3


TargetLike = Union[Location, Device, int]  # noqa: UP007 (a runtime alias)
"""A device ordinal, :class:`Device` or :class:`Location`."""


def as_access(value: object) -> Access:
    if isinstance(value, Access):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, _cu.CUmemAccess_flags)):
        raise TypeError(f"access must be an Access, not {type(value).__name__}")
    try:
        return Access(int(value))
    except ValueError:
        raise ValueError(f"invalid access {value!r}; use Access.NONE/READ/READWRITE") from None


def as_targets(targets: TargetLike | Iterable[TargetLike]) -> list[Location]:
    if isinstance(targets, (Location, Device, int)):
        items: list[Any] = [targets]
    elif isinstance(targets, (str, bytes)) or not isinstance(targets, Iterable):
        raise TypeError(
            "targets must be a device ordinal, Device, Location or an iterable of them, "
            f"not {type(targets).__name__}"
        )
    else:
        items = list(targets)
    if not items:
        raise ValueError("no target devices given")
    out: dict[tuple[int, int], Location] = {}
    for item in items:
        loc = check_exists(as_location(item))  # ValueError for a device that does not exist
        out[(int(loc.type), loc.id)] = loc
    return list(out.values())


def access_descs(locs: Iterable[Location], access: Access) -> list[_cu.CUmemAccessDesc]:
    out = []
    for loc in locs:
        d = _cu.CUmemAccessDesc()
        d.location = loc.to_cu()
        d.flags = _cu.CUmemAccess_flags(int(access))
        out.append(d)
    return out
