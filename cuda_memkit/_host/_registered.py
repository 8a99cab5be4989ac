"""Registration of existing host memory: :func:`register_host`.

``register_host(array)`` page-locks memory you already have (a numpy array)
with ``cuMemHostRegister`` for as long as the returned :class:`RegisteredHost`
is open, so copies from and to it run at full PCIe bandwidth and truly
asynchronously, as from a :class:`~cuda_memkit.HostBuffer`. Registrations are
recorded in :mod:`cuda_memkit._core._host_registry` (copies tell pinned from pageable
memory by them) and in the allocation ledger (kind ``"registered"``).
"""

from __future__ import annotations

import enum
import mmap
from typing import TYPE_CHECKING, Any

from .._core import _driver
from .._core._buffer import BufferMixin, MemoryKind
from .._core._checks import check_flags
from .._core._context import ensure_context, release_call
from .._core._errors import CudaHostMemoryNotRegisteredError
from .._core._host_registry import (
    forget_registration,
    mapped_device_ptr,
    mark_pinned_class,
    note_registration,
    page_sharing_registration,
    view_owner,
)
from .._core._resource import Resource, account, array_protocol, make_finalizer

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["HostRegisterFlags", "RegisteredHost", "register_host"]


class HostRegisterFlags(enum.IntFlag):
    """Flags of :func:`register_host` (``CU_MEMHOSTREGISTER_*``).

    They combine as sets, like :class:`HostAllocFlags`.

    Attributes
    ----------
    DEFAULT
        Page-lock the range for the current context.
    PORTABLE
        Pinned for every CUDA context.
    DEVICEMAP
        Mapped into the device address space (:attr:`RegisteredHost.device_ptr`).
        ``MAPPED`` is an alias.
    IOMEMORY
        The range is I/O memory (e.g. another PCIe device's BAR), not RAM.
    READ_ONLY
        The device only reads the range; required to register memory the CPU
        maps read-only (e.g. a read-only numpy array).
    """

    DEFAULT = 0
    PORTABLE = 0x1
    DEVICEMAP = 0x2
    MAPPED = 0x2
    IOMEMORY = 0x4
    READ_ONLY = 0x8


_REGISTER_BITS = 0xF
#: Ledger account of registered ranges (host memory: no device).
_ACCOUNT = account("registered")


def _address(arr: np.ndarray[Any, Any]) -> int:
    return int(arr.__array_interface__["data"][0])


def _unregister(ptr: int) -> None:
    """``cuMemHostUnregister`` (the release function of a RegisteredHost's finalizer)."""
    # Out of the ledger first (the address may be registered again by another
    # thread as soon as this one is gone); given up even if the driver refuses.
    _ACCOUNT.remove(ptr)
    try:
        release_call(0, "cuMemHostUnregister", ptr)
    except CudaHostMemoryNotRegisteredError:
        # The driver holds no registration there (unregistered behind our back): neither may
        # the record, or a later array at that address would be taken for registered memory.
        forget_registration(ptr)
        raise
    forget_registration(ptr)  # only once the driver has unregistered it


class RegisteredHost(BufferMixin, Resource):
    """Host memory page-locked by :func:`register_host` until :meth:`close`.

    It keeps the registered array alive. Closing it (or leaving its ``with``
    block, or dropping it) unregisters the memory; the array stays valid,
    ordinary pageable memory.
    """

    _array: np.ndarray[Any, Any]
    _ptr: int
    _nbytes: int
    _flags: HostRegisterFlags
    _dptr: int | None

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("use cuda_memkit.register_host(array) to register host memory")

    @property
    def array(self) -> np.ndarray[Any, Any]:
        """The registered array (for ``READ_ONLY`` registrations, a read-only view)."""
        self._check_open()
        return self._array

    @property
    def ptr(self) -> int:
        """Host address of the registered range."""
        self._check_open()
        return self._ptr

    @property
    def nbytes(self) -> int:
        """Size of the registered range in bytes."""
        return self._nbytes

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the registered array."""
        return tuple(self._array.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        """Element type of the registered array."""
        dt: np.dtype[Any] = self._array.dtype
        return dt

    @property
    def device(self) -> None:
        """``None``: the memory is host memory."""
        return None

    @property
    def kind(self) -> MemoryKind:
        """``MemoryKind.REGISTERED``."""
        return MemoryKind.REGISTERED

    def _layout(self) -> tuple[np.dtype[Any] | None, tuple[int, ...] | None]:
        arr = self._array  # a Fortran-ordered array's elements come out in memory order
        return arr.dtype, tuple(arr.shape) if arr.flags.c_contiguous else (arr.size,)

    def _host_only(self) -> bool:
        return True

    def __array__(self, dtype: npt.DTypeLike | None = None, copy: bool | None = None
                  ) -> np.ndarray[Any, Any]:
        return array_protocol(self.array, dtype, copy)

    @property
    def flags(self) -> HostRegisterFlags:
        """The registration flags."""
        return self._flags

    @property
    def read_only(self) -> bool:
        """Whether the device may only read the range (``READ_ONLY``)."""
        return bool(self._flags & HostRegisterFlags.READ_ONLY)

    @property
    def device_ptr(self) -> int:
        """The device address of a ``DEVICEMAP`` registration (``cuMemHostGetDevicePointer``).

        Raises
        ------
        ValueError
            If the range was not registered with ``HostRegisterFlags.DEVICEMAP``.
        """
        self._check_open()
        dptr = self._dptr
        if dptr is None:
            dptr = self._dptr = mapped_device_ptr(
                int(self._flags), self._ptr, self._nbytes, "this registration",
                "register with flags=HostRegisterFlags.DEVICEMAP")
        return dptr

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"ptr=0x{self._ptr:x}"
        return f"<RegisteredHost {state} nbytes={self._nbytes} flags={self._flags!r}>"


def register_host(
    array: Any, *, flags: HostRegisterFlags | int = HostRegisterFlags.DEFAULT
) -> RegisteredHost:
    """Page-lock an existing host array (``cuMemHostRegister``) while the result is open.

    Registration makes copies from and to the array as fast, and as truly
    asynchronous, as from a :class:`HostBuffer`. It costs milliseconds per
    range (less than allocating pinned memory when the array is already
    populated), so register long-lived arrays, not one per transfer.

    Parameters
    ----------
    array : numpy array or buffer
        C- or Fortran-contiguous memory (anything with the buffer protocol).
        A read-only array needs ``flags=HostRegisterFlags.READ_ONLY``.
    flags : HostRegisterFlags, default DEFAULT
        Registration flags.

    Returns
    -------
    RegisteredHost
        A context manager; leaving it (or ``close()``, or garbage collection)
        unregisters the memory. A zero-size array registers nothing.

    Raises
    ------
    TypeError
        If ``array`` is not host memory, or holds Python objects.
    ValueError
        If it is not contiguous, read-only without ``READ_ONLY``, or the flags
        have unknown bits (all before any driver call).
    CudaHostMemoryAlreadyRegisteredError
        If (part of) the range is already registered.
    CudaInvalidValueError
        If the range is memory the driver allocated (e.g. pinned by another
        library); views of cuda_memkit buffers are refused with ``ValueError``
        before the driver is called.
    CudaNotSupportedError
        If ``READ_ONLY`` registration is not supported by the device.

    Examples
    --------
    >>> a = np.ones(1 << 20, np.float32)
    >>> with cm.Stream() as s, cm.DeviceBuffer.empty(a.nbytes) as dev:
    ...     with cm.register_host(a):
    ...         _ = cm.copy(dev, a, stream=s)   # async: `a` is pinned now
    ...         s.synchronize()
    """
    import numpy as np

    fl = check_flags(flags, HostRegisterFlags, _REGISTER_BITS)
    if isinstance(array, np.ndarray):
        arr = array
    else:
        if hasattr(array, "__cuda_array_interface__") or isinstance(array, Resource):
            raise TypeError(
                f"register_host() takes pageable host memory, not {type(array).__name__}"
            )
        try:
            arr = np.asarray(memoryview(array))
        except TypeError:
            raise TypeError(
                "register_host() needs a numpy array or an object with the buffer protocol, "
                f"not {type(array).__name__}"
            ) from None
    if arr.dtype.hasobject:
        raise TypeError("an array of Python objects cannot be registered")
    owner = view_owner(arr)
    if owner is not None:
        raise ValueError(
            f"this array is a view of a {type(owner).__name__}, memory the driver "
            "already pins or manages; it needs no registration"
        )
    if not (arr.flags.c_contiguous or arr.flags.f_contiguous):
        raise ValueError(
            "register_host() needs contiguous memory; this array is a strided view. "
            "Register its base array, or np.ascontiguousarray(a)"
        )
    read_only = bool(fl & HostRegisterFlags.READ_ONLY)
    if not arr.flags.writeable and not read_only:
        raise ValueError(
            "the array is read-only, but a registration lets the device write to it; "
            "pass flags=HostRegisterFlags.READ_ONLY"
        )
    if read_only and arr.flags.writeable:
        view = arr.view()
        view.flags.writeable = False
    else:
        view = arr
    self = RegisteredHost.__new__(RegisteredHost)
    self._array = view
    self._nbytes = int(arr.nbytes)
    self._flags = HostRegisterFlags(fl)
    self._dptr = None
    if self._nbytes == 0:
        self._ptr = _address(arr)
        self._open(None)
        return self
    ptr = _address(arr)
    shared = page_sharing_registration(ptr, self._nbytes, mmap.PAGESIZE)
    if shared is not None and (shared[2] ^ fl) & HostRegisterFlags.READ_ONLY:
        # The driver registers whole pages and refuses (CUDA_ERROR_INVALID_VALUE) a
        # page that would be both read-only and writable: say so before it does.
        which = "read-only" if shared[2] & HostRegisterFlags.READ_ONLY else "writable"
        raise ValueError(
            f"this array shares a memory page with a {which} registration "
            f"(0x{shared[0]:x}..0x{shared[1]:x}); the driver registers whole pages, and a "
            "page cannot be both read-only and writable. Give the array pages of its own "
            "(a larger array, or HostBuffer) or register both with the same flags"
        )
    ensure_context()
    _driver.call("cuMemHostRegister", ptr, self._nbytes, fl)
    self._ptr = ptr
    note_registration(ptr, self._nbytes, fl, self)
    _ACCOUNT.add(ptr, self._nbytes)
    self._open(make_finalizer(self, f"registration 0x{ptr:x}", _unregister, ptr))
    return self


mark_pinned_class(RegisteredHost)
