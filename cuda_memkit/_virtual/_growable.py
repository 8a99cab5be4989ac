"""A device buffer that grows and shrinks in place, built on the VMM primitives.

:class:`GrowableBuffer` reserves its addresses once (``cuMemAddressReserve``)
and maps or unmaps chunks of physical memory (``cuMemCreate``, ``cuMemMap``,
``cuMemSetAccess``) as it is resized, so its pointer never moves. Argument
checks and the lock are those of :mod:`cuda_memkit._virtual._vmm_base`.
"""

from __future__ import annotations

from collections.abc import Iterable

from cuda.bindings import driver as _cu

from .._core import _driver
from .._core._access import Access, access_descs, check_access, check_peers, check_targets
from .._core._buffer import BufferMixin, MemoryKind
from .._core._checks import MAX_U64, check_nonneg, check_positive, check_u64
from .._core._context import primary_context
from .._core._device import Device, check_ordinal
from .._core._errors import CudaError
from .._core._inflight import wait_for_copies
from .._core._interop import OneDeviceMixin
from .._core._location import Location, LocationType
from .._core._resource import (
    Account,
    Resource,
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

__all__ = ["GrowableBuffer"]


def _round_up(n: int, g: int) -> int:
    return -(-n // g) * g


class _GrowState:
    __slots__ = ("acct", "chunk", "handles", "ptr", "reserved")

    def __init__(self, ptr: int, reserved: int, chunk: int, acct: Account) -> None:
        self.ptr = ptr
        self.reserved = reserved
        self.chunk = chunk
        self.handles: list[int] = []  # handle of chunk i, mapped at ptr + i*chunk
        self.acct = acct  # ledger account ("growable"): the mapped bytes, under ``ptr``

    def mapped(self) -> None:
        """Tell the ledger how many bytes are mapped now."""
        self.acct.resize(self.ptr, len(self.handles) * self.chunk)


def _shrink_to(gs: _GrowState, n: int) -> None:
    """Unmap and release chunks ``n..`` (last first)."""
    while len(gs.handles) > n:
        i = len(gs.handles) - 1
        _driver.call("cuMemUnmap", gs.ptr + i * gs.chunk, gs.chunk)
        h = gs.handles.pop()
        _driver.call("cuMemRelease", h)
        gs.mapped()


def _fin_growable(gs: _GrowState) -> None:
    with LOCK:
        first: CudaError | None = None
        unmapped = 0
        for i in reversed(range(len(gs.handles))):
            try:
                _driver.call("cuMemUnmap", gs.ptr + i * gs.chunk, gs.chunk)
                unmapped += 1
            except CudaError as exc:
                first = first or exc
        for h in reversed(gs.handles):
            try:
                _driver.call("cuMemRelease", h)
            except CudaError as exc:
                first = first or exc
        all_unmapped = unmapped == len(gs.handles)
        gs.handles.clear()
        gs.acct.remove(gs.ptr)
        if all_unmapped:
            try:
                _driver.call("cuMemAddressFree", gs.ptr, gs.reserved)
            except CudaError as exc:
                first = first or exc
        if first is not None:
            raise first


class GrowableBuffer(BufferMixin, OneDeviceMixin, Resource):
    """A device buffer that grows and shrinks in place: its pointer never moves.

    It reserves ``max_size`` bytes of addresses once; :meth:`resize` maps new
    chunks of physical memory at the end (contents are preserved) or unmaps
    chunks past the new size. Every chunk, including chunks added later, is
    accessible to ``device`` and to every device given in ``peers`` or
    :meth:`set_access`.

    Parameters
    ----------
    max_size : int
        The most bytes it can ever hold (rounded up to a whole chunk).
    device : int or Device, default 0
        The device whose memory backs it.
    chunk : int, optional
        Bytes mapped at a time: a multiple of :func:`granularity`; default the
        recommended granularity.
    peers : iterable of int or Device, optional
        Other devices that get READWRITE access to every chunk (their kernels
        and copies then reach it: see "Several GPUs" in the docs).
    handle_type : HandleType, optional
        Shareable handles of the chunks' physical memory, e.g.
        ``HandleType.POSIX_FD``; it also sets the granularities used (see
        :meth:`registrable`).

    Examples
    --------
    >>> buf = cm.GrowableBuffer(1 << 30, chunk=2 << 20)
    >>> buf.resize(5 << 20)            # maps 3 chunks
    >>> p = buf.ptr
    >>> buf.resize(20 << 20)           # maps 7 more; buf.ptr == p, data kept
    >>> buf.capacity, buf.ptr == p
    (20971520, True)
    >>> buf.close()
    """

    def __init__(self, max_size: int, *, device: Device | int = 0, chunk: int | None = None,
                 peers: Iterable[Device | int] = (), handle_type: object = None) -> None:
        max_size = check_u64(check_positive(max_size, "max_size"), "max_size")
        if chunk is not None:
            chunk = check_u64(check_positive(chunk, "chunk"), "chunk")
        ordinal = check_ordinal(device)
        ht = check_handle_type(handle_type)
        peer_list = check_peers(peers, ordinal)
        gran = granularity(ordinal, handle_type=ht)
        # the reservation is aligned to the recommended granularity (NCCL registers
        # only memory whose address is)
        align = granularity(ordinal, recommended=True, handle_type=ht)
        if chunk is None:
            chunk = align
        else:
            check_multiple("chunk", chunk, gran)
        reserved = _round_up(max_size, chunk)
        if reserved > MAX_U64:
            raise ValueError(f"max_size={max_size} rounded up to whole chunks of {chunk} bytes "
                             "does not fit a 64-bit address range")
        primary_context(ordinal)
        need_ctx()
        self._device = ordinal
        self._max_size = max_size
        self._nbytes = 0
        self._access: dict[int, Access] = {ordinal: Access.READWRITE}
        for p in peer_list:
            self._access[p] = Access.READWRITE
        self._prop = alloc_prop(Location.device(ordinal), ht)
        self._handle_type = ht
        self._descs = self._makeaccess_descs()
        ptr = int(_driver.call("cuMemAddressReserve", reserved, align, 0, 0))
        with Transaction() as undo:
            undo.push(free_range, ptr, reserved)
            gs = _GrowState(ptr, reserved, chunk, account("growable", ordinal))
            self._gs = gs
            self._open(make_finalizer(self, f"growable buffer 0x{ptr:x}", _fin_growable, gs))
            gs.acct.add(ptr, 0)

    @classmethod
    def registrable(cls, nbytes: int, *, device: Device | int = 0,
                    peers: Iterable[Device | int] = ()) -> GrowableBuffer:
        """A buffer of at least ``nbytes`` that NCCL's user-buffer registration accepts.

        One physical allocation with POSIX file-descriptor handles
        (``HandleType.POSIX_FD``), its size ``nbytes`` rounded up to the
        recommended granularity, mapped at an address aligned to it: what
        ``ncclCommRegister`` (nccl4py's ``Communicator.register_buffer``) takes
        for zero-copy collectives. It is mapped already (``nbytes`` as asked,
        ``capacity`` the rounded size) and does not grow further. Register it
        on every rank, or on none: NCCL leaves mixing registered and
        unregistered buffers in one collective undefined.

        Parameters
        ----------
        nbytes : int
            Bytes wanted (> 0).
        device : int or Device, default 0
            The device whose memory it is.
        peers : iterable of int or Device, optional
            As for the constructor.

        Returns
        -------
        GrowableBuffer

        Raises
        ------
        TypeError, ValueError
            For bad arguments, before any driver call.
        CudaNotSupportedError
            Where the driver has no POSIX file-descriptor handles.

        Examples
        --------
        >>> buf = cm.GrowableBuffer.registrable(3 << 20)
        >>> buf.nbytes, buf.capacity % (2 << 20), buf.ptr % (2 << 20)
        (3145728, 0, 0)
        >>> buf.close()
        """
        n = check_u64(check_positive(nbytes, "nbytes"), "nbytes")
        ordinal = check_ordinal(device)
        size = _round_up(n, granularity(ordinal, recommended=True,
                                        handle_type=HandleType.POSIX_FD))
        if size > MAX_U64:
            raise ValueError(f"nbytes={n} rounded up to the granularity does not fit a 64-bit "
                             "address range")
        self = cls(size, device=ordinal, chunk=size, peers=peers,
                   handle_type=HandleType.POSIX_FD)
        try:
            self.resize(n)
        except BaseException:
            self.close()
            raise
        return self

    def _makeaccess_descs(self) -> list[_cu.CUmemAccessDesc]:
        out = []
        for dev, acc in self._access.items():
            if acc is not Access.NONE:
                out.extend(access_descs([Location.device(dev)], acc))
        return out

    # -- properties ---------------------------------------------------------
    @property
    def ptr(self) -> int:
        """Start address; the same for the buffer's whole life."""
        self._check_open()
        return self._gs.ptr

    @property
    def nbytes(self) -> int:
        """The current size in bytes (as last passed to :meth:`resize`)."""
        return self._nbytes

    @property
    def capacity(self) -> int:
        """Bytes currently mapped: ``nbytes`` rounded up to whole chunks."""
        return len(self._gs.handles) * self._gs.chunk

    @property
    def max_size(self) -> int:
        """The most bytes :meth:`resize` accepts."""
        return self._max_size

    @property
    def reserved(self) -> int:
        """Bytes of address space reserved (``max_size`` rounded up to a chunk)."""
        return self._gs.reserved

    @property
    def chunk_size(self) -> int:
        """Bytes mapped at a time."""
        return self._gs.chunk

    @property
    def kind(self) -> MemoryKind:
        """``MemoryKind.GROWABLE``."""
        return MemoryKind.GROWABLE

    @property
    def handle_type(self) -> HandleType:
        """The shareable handle type of its physical memory (``HandleType.NONE`` by default)."""
        return self._handle_type

    @property
    def peers(self) -> tuple[int, ...]:
        """Other devices with access to every chunk."""
        return tuple(d for d, a in self._access.items()
                     if d != self._device and a is not Access.NONE)

    # -- operations ---------------------------------------------------------
    def resize(self, nbytes: int) -> None:
        """Grow or shrink to ``nbytes``, in place.

        Growing maps (``cuMemCreate`` + ``cuMemMap`` + ``cuMemSetAccess``) the
        chunks needed; if any step fails, the chunks this call added are
        removed again and the buffer is as before. Shrinking unmaps and
        releases the chunks past the new size (their contents are lost),
        after the asynchronous copies cuda_memkit queued on the buffer have
        finished.

        Parameters
        ----------
        nbytes : int
            The new size, in ``[0, max_size]``; the mapped capacity is rounded
            up to whole chunks.

        Raises
        ------
        ValueError
            If ``nbytes`` is negative or above ``max_size``.
        ClosedError
            If closed.
        CudaOutOfMemoryError
            If the device has no memory for the new chunks.
        BufferError
            If shrinking would unmap memory that DLPack consumers of the
            buffer still use (nothing is changed).
        """
        self._check_open()
        n = check_nonneg(nbytes, "nbytes")
        if n > self._max_size:
            raise ValueError(f"cannot resize to {n} bytes; max_size is {self._max_size}")
        gs = self._gs
        need = -(-n // gs.chunk)
        with LOCK:
            have = len(gs.handles)
            if need > have:
                self._grow(have, need)
            elif need < have:
                if exports_alive(self):
                    raise BufferError("DLPack consumers of this buffer are alive: shrinking "
                                      "would unmap memory they use; drop them first")
                need_ctx()
                wait_for_copies(self)  # an unmap under a running copy faults the device
                _shrink_to(gs, need)
            self._nbytes = n

    def _grow(self, have: int, need: int) -> None:
        gs = self._gs
        chunk = gs.chunk
        prop = self._prop
        descs = self._descs
        ndesc = len(descs)
        create = _driver.function("cuMemCreate")
        mmap = _driver.function("cuMemMap")
        setacc = _driver.function("cuMemSetAccess")
        check = _driver.check
        need_ctx()
        new: list[int] = []
        with Transaction() as undo:
            for i in range(have, need):
                addr = gs.ptr + i * chunk
                handle = check("cuMemCreate", create(chunk, prop, 0))
                h = int(handle)
                undo.push(release_handle, h)
                # the driver's own handle object: no int -> handle conversion in the call
                check("cuMemMap", mmap(addr, chunk, 0, handle, 0))
                undo.push(unmap_raw, addr, chunk)
                check("cuMemSetAccess", setacc(addr, chunk, descs, ndesc))
                new.append(h)
            gs.handles.extend(new)
            gs.mapped()

    def set_access(self, devices: Device | int | Iterable[Device | int],
                   access: Access = Access.READWRITE) -> None:
        """Give ``devices`` ``access`` to every chunk, now and for chunks added later.

        ``Access.NONE`` revokes. The owning device always keeps READWRITE.
        If setting fails on some chunk, the chunks already changed are set back.

        Parameters
        ----------
        devices : int, Device or iterable of them
            The devices (existing ones; no host locations).
        access : Access, default READWRITE
            ``Access.NONE`` revokes.

        Raises
        ------
        ValueError
            For a host location, a device that does not exist, or for
            changing the owning device's access (nothing is changed).
        CudaPeerAccessUnsupportedError
            Granting a device that cannot access this buffer's device's
            memory (``cuDeviceCanAccessPeer``), before any driver call.
        CudaError
            From the driver.
        """
        self._check_open()
        acc = check_access(access)
        locs = check_targets(devices, acc, self._device, "devices")
        ordinals = []
        for loc in locs:
            if loc.type is not LocationType.DEVICE:
                raise ValueError(f"set_access takes devices, not {loc}")
            if loc.id == self._device and acc is not Access.READWRITE:
                raise ValueError("the owning device always keeps READWRITE access")
            ordinals.append(loc.id)
        descs = access_descs(locs, acc)
        gs = self._gs
        with LOCK:
            need_ctx()
            old = {d: self._access.get(d, Access.NONE) for d in ordinals}
            with Transaction() as undo:
                for i in range(len(gs.handles)):
                    addr = gs.ptr + i * gs.chunk
                    _driver.call("cuMemSetAccess", addr, gs.chunk, descs, len(descs))
                    undo.push(self._restore_access, addr, old)
            for d in ordinals:
                self._access[d] = acc
            self._descs = self._makeaccess_descs()

    def grant_access(self, devices: Device | int | Iterable[Device | int],
                     access: Access = Access.READWRITE) -> None:
        """:meth:`set_access` under its earlier name: the same call, the same checks."""
        self.set_access(devices, access)

    def _restore_access(self, addr: int, old: dict[int, Access]) -> None:
        descs = []
        for d, a in old.items():
            descs.extend(access_descs([Location.device(d)], a))
        _driver.call("cuMemSetAccess", addr, self._gs.chunk, descs, len(descs))

    def access(self, device: Device | int) -> Access:
        """The access ``device`` has to every chunk.

        Parameters
        ----------
        device : int or Device
            The device to ask about (``Access.NONE`` for one never granted).
        """
        return self._access.get(check_ordinal(device), Access.NONE)

    def __repr__(self) -> str:
        if self.closed:
            return f"<GrowableBuffer closed nbytes={self._nbytes}>"
        return (f"<GrowableBuffer 0x{self._gs.ptr:x} nbytes={self._nbytes} "
                f"capacity={self.capacity} max_size={self._max_size} device={self._device}>")
