"""Virtual memory management (VMM): reserve, create, map, grant access; grow in place.

The driver's VMM API splits an allocation into independent pieces:

1. :meth:`AddressRange.reserve` reserves device virtual addresses
   (``cuMemAddressReserve``) — no memory yet;
2. :meth:`PhysicalMemory.create` creates physical memory on a device or on the
   host (``cuMemCreate``) — no address yet;
3. :meth:`AddressRange.map` maps the physical memory at an offset of the range
   (``cuMemMap``), giving a :class:`Mapping`;
4. :meth:`Mapping.set_access` grants devices :class:`Access` to it
   (``cuMemSetAccess``); a fresh mapping is accessible to no one.

:class:`~cuda_memkit.GrowableBuffer` (module ``_growable``) does all four for
you: it reserves once and maps or unmaps chunks as it is resized, so its
pointer never moves.

Teardown order
--------------
The driver never sees a release or a free before the unmap of what was mapped:

* a :class:`Mapping` holds references to its range and its physical memory, so
  reference counting unmaps it first; when the three go together (a scope
  ends, a reference cycle is collected — whichever finalizer runs first does
  all of it) the driver sees *unmap → release → address free*;
* once unmapped, a range and a physical allocation are independent: each is
  returned when it is closed or dropped;
* closing a :class:`PhysicalMemory` that is still mapped closes the object at
  once and **defers** ``cuMemRelease`` until its last mapping is unmapped;
* closing an :class:`AddressRange` that still has mappings **unmaps them
  first** (those :class:`Mapping` objects become closed), then frees it.

Each finalizer holds small state records of plain ints, never the objects.
Finalizers need no current context (the VMM calls are device-level).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterable

from cuda.bindings import driver as _cu

from .._core import _driver
from .._core._access import Access, TargetLike, access_descs, check_access, check_targets
from .._core._buffer import BufferMixin, MemoryKind
from .._core._checks import check_nonneg, check_positive
from .._core._context import ensure_context
from .._core._errors import ClosedError
from .._core._inflight import pending_operands, release_after_copies
from .._core._interop import OneDeviceMixin
from .._core._location import Location, LocationType, check_exists, to_location
from .._core._resource import (
    CLOSED,
    Account,
    Resource,
    State,
    Transaction,
    account,
    exports_alive,
    make_finalizer,
)
from ._vmm_base import (
    LOCK,
    HandleType,
    alloc_prop,
    check_handle_type,
    check_multiple,
    free_range,
    granularity,
    need_ctx,
    release_handle,
    unmap_raw,
)

__all__ = ["AddressRange", "Mapping", "PhysicalMemory"]


# -- plain state records shared by the finalizers ---------------------------



def _dead() -> None:
    return None


class _RangeState:
    __slots__ = ("free_wanted", "freed", "maps", "owner", "ptr", "size")

    def __init__(self, ptr: int, size: int) -> None:
        self.ptr = ptr
        self.size = size
        self.maps: set[_MapState] = set()
        self.free_wanted = False
        self.freed = False
        self.owner: Callable[[], object] = _dead


class _PhysState:
    __slots__ = ("acct", "handle", "maps", "owner", "release_wanted", "released", "size")

    def __init__(self, handle: int, size: int, acct: Account) -> None:
        self.handle = handle
        self.size = size
        self.acct = acct  # ledger account ("vmm_physical"), holding the handle until released
        self.maps: set[_MapState] = set()
        self.release_wanted = False
        self.released = False
        self.owner: Callable[[], object] = _dead


class _MapState:
    __slots__ = ("acct", "owner", "ps", "ptr", "rs", "size", "unmapped")

    def __init__(self, ptr: int, size: int, rs: _RangeState, ps: _PhysState,
                 acct: Account) -> None:
        self.ptr = ptr
        self.size = size
        self.acct = acct  # ledger account ("vmm_mapped"), holding the address until unmapped
        self.rs = rs
        self.ps = ps
        self.unmapped = False
        self.owner: Callable[[], object] = _dead


#: Live reservations by start address (for fixed-address collision checks).
_live_ranges: dict[int, _RangeState] = {}


def _unmap(ms: _MapState) -> None:
    if ms.unmapped:
        return
    _driver.call("cuMemUnmap", ms.ptr, ms.size)
    ms.unmapped = True
    ms.acct.remove(ms.ptr)
    ms.rs.maps.discard(ms)
    ms.ps.maps.discard(ms)


def _settle_phys(ps: _PhysState) -> None:
    """Release ``ps`` if it was closed (or its owner is gone) and is unmapped."""
    if ps.released or ps.maps:
        return
    if ps.release_wanted or ps.owner() is None:
        ps.released = True  # never retried: a failure is the finalizer's warning
        ps.acct.remove(ps.handle)  # first: the handle may be reused once released
        _driver.call("cuMemRelease", ps.handle)


def _settle_range(rs: _RangeState) -> None:
    """Free ``rs`` if it was closed (or its owner is gone) and is unmapped."""
    if rs.freed or rs.maps:
        return
    if rs.free_wanted or rs.owner() is None:
        rs.freed = True
        _live_ranges.pop(rs.ptr, None)
        _driver.call("cuMemAddressFree", rs.ptr, rs.size)


def _fin_mapping(ms: _MapState) -> None:
    with LOCK:
        _unmap(ms)
        _settle_phys(ms.ps)
        _settle_range(ms.rs)


def _fin_phys(ps: _PhysState) -> None:
    with LOCK:
        ps.release_wanted = True
        ranges = []
        for ms in sorted(ps.maps, key=lambda s: s.ptr):
            if ms.owner() is None:  # dying with us (a reference cycle)
                _unmap(ms)
                ranges.append(ms.rs)
        if not ps.maps:
            _settle_phys(ps)
        for rs in ranges:
            _settle_range(rs)


def _fin_range(rs: _RangeState) -> None:
    with LOCK:
        rs.free_wanted = True
        phys = []
        for ms in sorted(rs.maps, key=lambda s: s.ptr):
            m = ms.owner()
            if isinstance(m, Resource) and exports_alive(m):
                # DLPack consumers still use it: closed now, unmapped (and the
                # range freed) by its Exports record when the last one goes.
                m._state = CLOSED
                continue
            if isinstance(m, Resource) and pending_operands and release_after_copies(m):
                m._state = CLOSED  # a copy in flight uses it: unmapped (range freed) after it
                continue
            _unmap(ms)
            phys.append(ms.ps)
        for ps in phys:
            _settle_phys(ps)
        _settle_range(rs)


# -- address ranges -------------------------------------------------------------------


class AddressRange(Resource):
    """A reservation of device virtual addresses (``cuMemAddressReserve``).

    Create with :meth:`reserve`; put memory in it with :meth:`map`. Closing it
    unmaps the mappings still in it (they become closed), then frees the
    reservation.

    Examples
    --------
    >>> g = granularity(0)
    >>> with AddressRange.reserve(4 * g) as vr, PhysicalMemory.create(g) as pm:
    ...     m = vr.map(pm, offset=g)
    ...     m.set_access(0, Access.READWRITE)
    ...     m.close()
    """

    _rs: _RangeState
    _alignment: int

    def __init__(self) -> None:
        raise TypeError("use AddressRange.reserve(nbytes) to create an AddressRange")

    @classmethod
    def reserve(cls, nbytes: int, *, alignment: int = 0, fixed_address: int = 0) -> AddressRange:
        """Reserve ``nbytes`` bytes of device virtual address space.

        Parameters
        ----------
        nbytes : int
            Bytes; a check_positive multiple of :func:`granularity` of the current
            device.
        alignment : int, default 0
            Alignment of the start address: 0 (the granularity) or a power of two.
        fixed_address : int, default 0
            Ask for this start address (a multiple of the granularity). The
            driver treats it as a hint: if it places the range elsewhere
            (the address is taken, or the driver declines, as the H100 does
            for addresses far from those it has handed out),
            :class:`ValueError` is raised and nothing stays reserved.

        Raises
        ------
        TypeError, ValueError
            For bad arguments, before the reservation is attempted; a
            ``fixed_address`` that collides with another reservation.
        CudaError
            If the driver refuses (e.g. ``CudaOutOfMemoryError`` when the
            address space is exhausted).
        """
        size = check_positive(nbytes, "nbytes")
        alignment = check_nonneg(alignment, "alignment")
        if alignment & (alignment - 1):
            raise ValueError(f"alignment must be 0 or a power of two, got {alignment}")
        fixed = check_nonneg(fixed_address, "fixed_address")
        ordinal = ensure_context(None)
        gran = granularity(ordinal)
        check_multiple("nbytes", size, gran)
        if fixed:
            check_multiple("fixed_address", fixed, gran)
            if alignment and fixed % alignment:
                raise ValueError(f"fixed_address 0x{fixed:x} is not aligned to {alignment}")
            with LOCK:
                for rs in _live_ranges.values():
                    if rs.ptr < fixed + size and fixed < rs.ptr + rs.size:
                        raise ValueError(
                            f"fixed_address range 0x{fixed:x}+{size} collides with the "
                            f"reserved range 0x{rs.ptr:x}+{rs.size}"
                        )
        with Transaction() as undo:
            ptr = int(_driver.call("cuMemAddressReserve", size, alignment, fixed, 0))
            undo.push(free_range, ptr, size)
            if fixed and ptr != fixed:
                raise ValueError(
                    f"address 0x{fixed:x} is not available (the driver offered 0x{ptr:x}); "
                    "the range collides with memory reserved or allocated elsewhere"
                )
            self = cls.__new__(cls)
            rs = _RangeState(ptr, size)
            self._rs = rs
            self._alignment = alignment
            self._open(make_finalizer(self, f"address range 0x{ptr:x}", _fin_range, rs))
            rs.owner = weakref.ref(self)
            with LOCK:
                _live_ranges[ptr] = rs
        return self

    @property
    def ptr(self) -> int:
        """Start address of the reservation."""
        self._check_open()
        return self._rs.ptr

    @property
    def nbytes(self) -> int:
        """Bytes reserved."""
        return self._rs.size

    @property
    def alignment(self) -> int:
        """The alignment requested at :meth:`reserve` (0: the granularity)."""
        return self._alignment

    @property
    def mappings(self) -> list[Mapping]:
        """The live :class:`Mapping` objects in this range, by address."""
        with LOCK:
            states = sorted(self._rs.maps, key=lambda s: s.ptr)
        out = []
        for ms in states:
            m = ms.owner()
            if isinstance(m, Mapping):
                out.append(m)
        return out

    def map(self, physical: PhysicalMemory, *, offset: int = 0) -> Mapping:
        """Map all of ``physical`` at ``offset`` bytes into this range (``cuMemMap``).

        The mapping is accessible to no one until :meth:`Mapping.set_access`.

        Parameters
        ----------
        physical : PhysicalMemory
            The memory to map (it stays alive while mapped).
        offset : int, default 0
            Where in the range, a multiple of the granularity.

        Returns
        -------
        Mapping

        Raises
        ------
        TypeError, ValueError
            For a bad offset or one where the memory does not fit in the range.
        ClosedError
            If the range or ``physical`` is closed.
        CudaError
            From the driver, e.g. when part of that address span is already mapped.
        """
        self._check_open()
        if not isinstance(physical, PhysicalMemory):
            raise TypeError(f"expected a PhysicalMemory, not {type(physical).__name__}")
        physical._check_open()
        offset = check_nonneg(offset, "offset")
        check_multiple("offset", offset, physical.granularity)
        size = physical.nbytes
        if offset + size > self._rs.size:
            raise ValueError(
                f"a physical allocation of {size} bytes at offset {offset} does not fit in "
                f"the range of {self._rs.size} bytes"
            )
        need_ctx()
        ptr = self._rs.ptr + offset
        with Transaction() as undo:
            _driver.call("cuMemMap", ptr, size, 0, physical._ps.handle, 0)
            undo.push(unmap_raw, ptr, size)
            return Mapping._new(self, physical, offset)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"0x{self._rs.ptr:x}"
        return f"<AddressRange {state} nbytes={self._rs.size}>"


# -- physical memory -----------------------------------------------------------------


class PhysicalMemory(Resource):
    """Physical memory from ``cuMemCreate``, on a device or on the host.

    Create with :meth:`create` or :meth:`import_`; map with
    :meth:`AddressRange.map`. Closing it while it is mapped closes the object
    and defers ``cuMemRelease`` until its last mapping is unmapped.
    """

    _ps: _PhysState
    _location: Location
    _handle_type: HandleType
    _granularity: int

    def __init__(self) -> None:
        raise TypeError("use PhysicalMemory.create(nbytes) or PhysicalMemory.import_(fd, nbytes)")

    @classmethod
    def create(
        cls,
        nbytes: int,
        *,
        device: TargetLike = 0,
        handle_type: object = None,
        location: TargetLike | None = None,
    ) -> PhysicalMemory:
        """Create ``nbytes`` bytes of physical memory.

        Parameters
        ----------
        nbytes : int
            A check_positive multiple of :func:`granularity` for that location.
        device : int or Device, default 0
            The device whose memory it is.
        handle_type : HandleType, optional
            ``HandleType.POSIX_FD`` to allow :meth:`export`.
        location : Location, optional
            Instead of ``device``: e.g. ``Location.host()`` or
            ``Location.host_numa(0)`` for host memory, where the driver
            supports it.

        Raises
        ------
        TypeError, ValueError
            For bad arguments, before any allocation.
        CudaError
            From ``cuMemCreate`` (e.g. ``CudaOutOfMemoryError``,
            ``CudaNotSupportedError`` for an unsupported location).
        """
        size = check_positive(nbytes, "nbytes")
        ht = check_handle_type(handle_type)
        loc = to_location(location if location is not None else device)
        gran = granularity(loc, handle_type=ht)
        check_multiple("nbytes", size, gran)
        need_ctx()
        handle = int(_driver.call("cuMemCreate", size, alloc_prop(loc, ht), 0))
        with Transaction() as undo:
            undo.push(release_handle, handle)
            return cls._wrap(handle, size, loc, ht, gran)

    @classmethod
    def import_(cls, fd: int, nbytes: int, *, handle_type: object = HandleType.POSIX_FD
                ) -> PhysicalMemory:
        """Import physical memory another process exported (``cuMemImportFromShareableHandle``).

        Parameters
        ----------
        fd : int
            An open POSIX file descriptor from :meth:`export` (received, e.g.,
            over a Unix socket with ``socket.recv_fds``). It stays yours: close
            it when you no longer need it.
        nbytes : int
            The exported allocation's size in bytes (the descriptor does not carry it).
        handle_type : HandleType, default POSIX_FD
            Only ``POSIX_FD`` is supported.

        Raises
        ------
        TypeError, ValueError
            For a bad or closed descriptor or a bad ``nbytes`` (before the import).
        CudaError
            From the driver (e.g. a descriptor that names no CUDA memory).
        """
        fd = check_nonneg(fd, "fd")
        size = check_positive(nbytes, "nbytes")
        ht = check_handle_type(handle_type)
        if ht is not HandleType.POSIX_FD:
            raise ValueError("only HandleType.POSIX_FD can be imported")
        try:
            os.fstat(fd)
        except OSError as exc:
            raise ValueError(f"file descriptor {fd} is not open ({exc.strerror})") from None
        need_ctx()
        handle = int(_driver.call(
            "cuMemImportFromShareableHandle", fd,
            _cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        with Transaction() as undo:
            undo.push(release_handle, handle)
            prop = _driver.call("cuMemGetAllocationPropertiesFromHandle", handle)
            loc = Location.from_cu(int(prop.location.type), int(prop.location.id))
            if loc is None:
                loc = Location.device(0)
            # The H100 reports no handle types for an imported handle.
            own = check_handle_type(int(prop.requestedHandleTypes))
            gran = granularity(loc, handle_type=own)
            check_multiple("nbytes", size, gran)
            return cls._wrap(handle, size, loc, own, gran)

    @classmethod
    def _wrap(cls, handle: int, size: int, loc: Location, ht: HandleType,
              gran: int) -> PhysicalMemory:
        self = cls.__new__(cls)
        dev = loc.id if loc.type is LocationType.DEVICE else None
        ps = _PhysState(handle, size, account("vmm_physical", dev))
        self._ps = ps
        self._location = loc
        self._handle_type = ht
        self._granularity = gran
        self._open(make_finalizer(self, f"physical memory 0x{handle:x}", _fin_phys, ps))
        ps.owner = weakref.ref(self)
        ps.acct.add(handle, size)
        return self

    @property
    def handle(self) -> int:
        """The ``CUmemGenericAllocationHandle`` as an int."""
        self._check_open()
        return self._ps.handle

    @property
    def nbytes(self) -> int:
        """Bytes of physical memory."""
        return self._ps.size

    @property
    def kind(self) -> MemoryKind:
        """``MemoryKind.VMM_PHYSICAL`` (memory without an address: not a buffer)."""
        return MemoryKind.VMM_PHYSICAL

    @property
    def location(self) -> Location:
        """Where the memory lives."""
        return self._location

    @property
    def device(self) -> int | None:
        """The device ordinal for device memory, ``None`` for host memory."""
        loc = self._location
        return loc.id if loc.type is LocationType.DEVICE else None

    @property
    def handle_type(self) -> HandleType:
        """The shareable handle type it was created with."""
        return self._handle_type

    @property
    def granularity(self) -> int:
        """The minimum granularity for this memory's location and handle type."""
        return self._granularity

    @property
    def mappings(self) -> list[Mapping]:
        """The live :class:`Mapping` objects of this memory."""
        with LOCK:
            states = sorted(self._ps.maps, key=lambda s: s.ptr)
        return [m for m in (s.owner() for s in states) if isinstance(m, Mapping)]

    def export(self, handle_type: object = None) -> int:
        """Export as a POSIX file descriptor for another process (``cuMemExportToShareableHandle``).

        The descriptor is yours: send it (``socket.send_fds``) and close it
        with ``os.close``. The receiver calls :meth:`import_` with it and the
        size.

        Parameters
        ----------
        handle_type : HandleType, optional
            Default: the type the memory was created with. Only ``POSIX_FD``.

        Raises
        ------
        ValueError
            If the memory was created without ``handle_type=HandleType.POSIX_FD``.
        ClosedError
            If closed.
        """
        self._check_open()
        ht = self._handle_type if handle_type is None else check_handle_type(handle_type)
        if ht is HandleType.NONE or not int(self._handle_type) & int(ht):
            raise ValueError(
                "this memory was created without an export handle type; create it with "
                "PhysicalMemory.create(..., handle_type=HandleType.POSIX_FD)"
            )
        if ht is not HandleType.POSIX_FD:
            raise ValueError("export() supports HandleType.POSIX_FD only")
        fd = _driver.call("cuMemExportToShareableHandle", self._ps.handle,
                          _cu.CUmemAllocationHandleType(int(ht)), 0)
        return int(fd)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"handle=0x{self._ps.handle:x}"
        return f"<PhysicalMemory {state} nbytes={self._ps.size} on {self._location}>"


# -- mappings ------------------------------------------------------------------------


class Mapping(BufferMixin, OneDeviceMixin, Resource):
    """Physical memory mapped into an :class:`AddressRange` (from :meth:`AddressRange.map`).

    Closing it unmaps it (``cuMemUnmap``). It is a device buffer (``ptr``,
    ``nbytes``, ``__cuda_array_interface__``, DLPack) once access is granted.
    """

    _ms: _MapState
    _physical: PhysicalMemory
    _range: AddressRange
    _offset: int
    _device: int

    def __init__(self) -> None:
        raise TypeError("use AddressRange.map(physical) to create a Mapping")

    @classmethod
    def _new(cls, vrange: AddressRange, physical: PhysicalMemory, offset: int) -> Mapping:
        self = cls.__new__(cls)
        pdev = physical.device
        ms = _MapState(vrange._rs.ptr + offset, physical._ps.size, vrange._rs, physical._ps,
                       account("vmm_mapped", pdev))
        self._ms = ms
        # Order matters: on refcount collection the physical memory is dropped
        # (released) before the range (freed).
        self._physical = physical
        self._range = vrange
        self._offset = offset
        dev = physical.device
        self._device = dev if dev is not None else ensure_context(None)
        self._open(make_finalizer(self, f"mapping 0x{ms.ptr:x}", _fin_mapping, ms))
        ms.owner = weakref.ref(self)
        with LOCK:
            ms.rs.maps.add(ms)
            ms.ps.maps.add(ms)
        ms.acct.add(ms.ptr, ms.size)
        return self

    @property
    def closed(self) -> bool:
        """Whether it was closed or unmapped (e.g. by closing its range)."""
        return self._state is State.CLOSED or self._ms.unmapped

    def _check_open(self) -> None:
        if self.closed:
            raise ClosedError("Mapping is closed (unmapped); it cannot be used any more")

    @property
    def ptr(self) -> int:
        """Device address of the mapped memory."""
        self._check_open()
        return self._ms.ptr

    @property
    def nbytes(self) -> int:
        """Bytes mapped."""
        return self._ms.size

    @property
    def kind(self) -> MemoryKind:
        """``MemoryKind.VMM_MAPPED``."""
        return MemoryKind.VMM_MAPPED

    @property
    def offset(self) -> int:
        """Offset of the mapping in its range."""
        return self._offset

    @property
    def range(self) -> AddressRange:
        """The :class:`AddressRange` it is mapped in."""
        return self._range

    @property
    def physical(self) -> PhysicalMemory:
        """The :class:`PhysicalMemory` it maps."""
        return self._physical

    @property
    def device(self) -> int:
        """The device the memory belongs to (for host memory: the current one at map time)."""
        return self._device

    def set_access(self, targets: TargetLike | Iterable[TargetLike],
                   access: Access = Access.READWRITE) -> None:
        """Grant ``access`` to one or several devices/locations in one ``cuMemSetAccess``.

        Parameters
        ----------
        targets : int, Device, Location or iterable of them
            Who gets access.
        access : Access, default READWRITE
            ``Access.NONE`` revokes.

        Raises
        ------
        ClosedError
            If the mapping is closed.
        TypeError, ValueError
            For bad targets (including a device that does not exist) or
            access (before the driver call).
        CudaPeerAccessUnsupportedError
            Granting a device that cannot access the device memory mapped
            (``cuDeviceCanAccessPeer``), before the driver call.
        CudaError
            From the driver.
        """
        self._check_open()
        acc = check_access(access)
        descs = access_descs(check_targets(targets, acc, self._physical.device), acc)
        _driver.call("cuMemSetAccess", self._ms.ptr, self._ms.size, descs, len(descs))

    def access(self, device: TargetLike | None = None) -> Access:
        """Read back ``device``'s access (default: the memory's device; ``cuMemGetAccess``).

        Parameters
        ----------
        device : int, Device or Location, optional
            Whose access to read. Default: the device the memory belongs to.

        Returns
        -------
        Access

        Raises
        ------
        ClosedError
            If the mapping is closed.
        TypeError, ValueError
            For a bad location or a device that does not exist (before the
            driver call).
        """
        self._check_open()
        loc = to_location(self._device) if device is None else check_exists(to_location(device))
        flags = _driver.call("cuMemGetAccess", loc.to_cu(), self._ms.ptr)
        return Access(int(flags))

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"0x{self._ms.ptr:x}"
        return f"<Mapping {state} nbytes={self._ms.size} offset={self._offset}>"
