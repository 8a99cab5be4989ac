"""Access to memory by devices and the host: the vocabulary pools and mappings share.

:class:`Access` (read, read-write, none); the checks of a grant, one for every
``set_access`` (:func:`check_targets`) and one for every ``peers=`` argument
(:func:`check_peers`), with one can-access rule (:func:`check_reach`); and the
``CUmemAccessDesc`` list that ``cuMemPoolSetAccess`` and ``cuMemSetAccess`` take.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any, Union

from cuda.bindings import driver as _cu

from ._checks import check_int
from ._constants import PEER_ACCESS_UNSUPPORTED
from ._device import Device, check_ordinal, existing_ordinal
from ._errors import CudaPeerAccessUnsupportedError
from ._location import Location, LocationType, check_exists, to_location
from ._peer import can_reach

__all__ = ["Access", "TargetLike", "access_descs", "check_access", "check_peers", "check_reach",
           "check_targets"]


class Access(enum.IntEnum):
    """Access a location has to a mapping (values of ``CUmemAccess_flags``)."""

    NONE = 0
    READ = 1
    READWRITE = 3


TargetLike = Union[Location, Device, int]  # noqa: UP007 (a runtime alias)
"""A device ordinal, :class:`Device` or :class:`Location`."""


def check_access(value: object) -> Access:
    """An :class:`Access` (or ``CUmemAccess_flags``, or its int value), checked."""
    if isinstance(value, Access):
        return value
    raw = value if isinstance(value, _cu.CUmemAccess_flags) else check_int(
        value, "access", "an Access")
    try:
        return Access(int(raw))
    except ValueError:
        raise ValueError(f"invalid access {value!r}; use Access.NONE/READ/READWRITE") from None


def check_reach(device: int, owner: int) -> None:
    """The one can-access rule of a grant: ``device`` must be able to access ``owner``'s memory.

    ``cuDeviceCanAccessPeer``, asked once per pair (:func:`~cuda_memkit._core._peer.can_reach`).

    Raises
    ------
    CudaPeerAccessUnsupportedError
        If it cannot: before any driver call that grants access.
    """
    if device != owner and not can_reach(device, owner):
        raise CudaPeerAccessUnsupportedError(
            PEER_ACCESS_UNSUPPORTED, "cuDeviceCanAccessPeer",
            "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
            f"device {device} cannot access device {owner}'s memory, so it cannot be "
            "granted access to it")


def check_targets(targets: object, access: Access, owner: int | None,
                  what: str = "targets") -> list[Location]:
    """The locations a ``set_access`` grants ``access`` to, checked once, before any driver call.

    Parameters
    ----------
    targets : int, Device, Location or an iterable of them
        Repeats count once.
    access : Access
        What is granted (already checked).
    owner : int or None
        The device whose memory it is; ``None`` for memory of no one device
        (host and managed pools, host-located physical memory).
    what : str
        The argument's name, for the errors.

    Raises
    ------
    TypeError, ValueError
        For a bad target, none, or a device that does not exist.
    CudaPeerAccessUnsupportedError
        Granting ``READ`` or ``READWRITE`` to a device that cannot access
        ``owner``'s memory (:func:`check_reach`); revoking is the driver's.
    """
    if isinstance(targets, (Location, Device, int)):
        items: list[Any] = [targets]
    elif isinstance(targets, (str, bytes)) or not isinstance(targets, Iterable):
        raise TypeError(
            f"{what} must be a device ordinal, Device, Location or an iterable of them, "
            f"not {type(targets).__name__}"
        )
    else:
        items = list(targets)
    if not items:
        raise ValueError(f"no device given: {what} is empty (no target to set access for)")
    out: dict[tuple[int, int], Location] = {}
    for item in items:
        loc = check_exists(to_location(item))  # ValueError for a device that does not exist
        out[(int(loc.type), loc.id)] = loc
    locs = list(out.values())
    if owner is not None and access is not Access.NONE:
        for loc in locs:
            if loc.type is LocationType.DEVICE:
                check_reach(loc.id, owner)
    return locs


def check_peers(peers: object, device: int | None) -> list[int]:
    """A ``peers=`` argument checked: the existing devices other than ``device``, in order.

    The devices are granted ``READWRITE`` access to ``device``'s memory, so
    each must be able to access it (:func:`check_reach`). ``device`` ``None``
    (memory of no one device, which no ``peers=`` applies to): the ordinals
    given, checked for their type only, so that the caller refuses the
    argument itself whatever devices it names.

    Raises
    ------
    TypeError
        If ``peers`` is not an iterable of ints or Devices (one int is refused too).
    ValueError
        For a device that does not exist.
    CudaPeerAccessUnsupportedError
        For a device that cannot access ``device``'s memory.
    """
    if isinstance(peers, (str, bytes)) or not isinstance(peers, Iterable):
        raise TypeError(f"peers must be an iterable of devices (ints or Devices), not "
                        f"{type(peers).__name__}; for one peer pass peers=[n]")
    out: list[int] = []
    for p in peers:
        o = existing_ordinal(p, "peer") if device is not None else check_ordinal(p, "peer")
        if o != device and o not in out:
            out.append(o)
    if device is not None:
        for o in out:
            check_reach(o, device)
    return out


def access_descs(locs: Iterable[Location], access: Access) -> list[_cu.CUmemAccessDesc]:
    out = []
    for loc in locs:
        d = _cu.CUmemAccessDesc()
        d.location = loc.to_cu()
        d.flags = _cu.CUmemAccess_flags(int(access))
        out.append(d)
    return out
