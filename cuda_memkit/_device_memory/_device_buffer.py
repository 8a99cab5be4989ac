"""Device memory: :class:`DeviceBuffer`, a plain ``cuMemAlloc`` allocation.

It carries the interop protocols (``__cuda_array_interface__``, DLPack,
:meth:`~DeviceBuffer.as_array`) so CuPy, torch and numba use it without a
copy, and registers with the allocation ledger (kind ``"device"``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._core import _driver
from .._core._checks import byte_count
from .._core._device import (
    StreamLike,
    check_ordinal,
    ensure_any_context,
    ensure_context,
    release_call,
    stream_handle,
)
from .._core._interop import DL_CUDA, DeviceMemoryMixin, normalize_view
from .._core._operands import (
    copy_size,
    copy_sync,
    operand,
    pending_operands,
    reap_pending,
)
from .._core._resource import Resource, State, account, make_finalizer

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["DeviceBuffer"]


def _copy(dst: Any, src: Any, nbytes: int | None) -> None:
    d = operand(dst, True)
    s = operand(src, False)
    copy_sync(d, s, copy_size(d, s, nbytes))


def _free_device(ptr: int, ordinal: int) -> None:
    """``cuMemFree`` (the release function of a DeviceBuffer's finalizer)."""
    # Out of the ledger first: once freed, the address may be another thread's
    # new allocation before this call returns. Given up even if the driver refuses.
    account("device", ordinal).remove(ptr)
    release_call(ordinal, "cuMemFree", ptr)  # any current context (or none) will do


class DeviceBuffer(DeviceMemoryMixin, Resource):
    """Device memory from ``cuMemAlloc``: ``nbytes`` bytes on one device.

    Build with :meth:`alloc` (or :meth:`from_array`). It exports
    ``__cuda_array_interface__`` and DLPack (a 1-D ``uint8`` view; typed views
    with :meth:`as_array`) so CuPy, torch and numba can use it without a copy.
    A zero-length buffer allocates nothing and has ``ptr == 0``.

    Examples
    --------
    >>> d = cm.DeviceBuffer.alloc(1 << 20)
    >>> cm.copy(d, np.arange(1 << 18, dtype=np.float32))
    >>> d.to_numpy(np.float32)[:3]
    array([0., 1., 2.], dtype=float32)
    >>> d.close()
    """

    _ptr: int
    _nbytes: int
    _device: int

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("create a DeviceBuffer with DeviceBuffer.alloc(nbytes)")

    @classmethod
    def alloc(cls, nbytes: int, *, device: Any = None) -> DeviceBuffer:
        """Allocate ``nbytes`` of device memory (``cuMemAlloc``), uninitialised.

        Parameters
        ----------
        nbytes : int
            Size in bytes; 0 allocates nothing.
        device : Device or int, optional
            The device; default: the current context's (device 0 if none).
            Its primary context becomes current.

        Raises
        ------
        TypeError
            If ``nbytes`` is not an int.
        ValueError
            If it is negative or impossibly large (before any driver call).
        CudaOutOfMemoryError
            If the device has not enough free memory.
        """
        n = byte_count(nbytes)
        ordinal = check_ordinal(device) if device is not None else None
        self = cls.__new__(cls)
        self._nbytes = n
        if n == 0:
            self._ptr = 0
            self._device = ensure_context(ordinal)
            self._open(None)
            return self
        if pending_operands:
            reap_pending()
        self._device = ensure_context(ordinal)
        ptr = int(_driver.call("cuMemAlloc", n))
        self._ptr = ptr
        account("device", self._device).add(ptr, n)
        self._open(make_finalizer(self, f"DeviceBuffer 0x{ptr:x}", _free_device, ptr,
                                  self._device))
        return self

    @classmethod
    def from_array(cls, array: Any, *, device: Any = None) -> DeviceBuffer:
        """Allocate a device buffer of ``array``'s size and copy it in (synchronously).

        Parameters
        ----------
        array : array-like or HostBuffer
            Host data (C-contiguous after ``numpy.ascontiguousarray``).
        device : Device or int, optional
            As for :meth:`alloc`.
        """
        if not isinstance(array, Resource):  # memkit buffers are copied from as they are
            import numpy as np

            array = np.ascontiguousarray(array)
            if array.dtype.hasobject:
                raise TypeError("object arrays cannot be copied to the device")
        self = cls.alloc(array.nbytes, device=device)
        try:
            _copy(self, array, None)
        except BaseException:
            self.close()
            raise
        return self

    @property
    def ptr(self) -> int:
        """Device address of the first byte (0 for a zero-length buffer)."""
        if self._state is not State.OPEN:
            self._check_open()
        return self._ptr

    @property
    def nbytes(self) -> int:
        """Size in bytes."""
        return self._nbytes

    @property
    def device(self) -> int:
        """Ordinal of the device holding the memory."""
        return self._device

    def _dl_device(self) -> tuple[int, int]:
        return (DL_CUDA, self._device)

    def to_numpy(self, dtype: npt.DTypeLike = "uint8",
                 shape: int | tuple[int, ...] | None = None) -> np.ndarray[Any, Any]:
        """Copy the contents to a new numpy array (synchronously).

        Parameters
        ----------
        dtype : dtype-like, default uint8
            Element type.
        shape : int or tuple of int, optional
            Shape; default: as many elements as fit.
        """
        import numpy as np

        dt, shp = normalize_view(dtype, shape, self._nbytes)
        out = np.empty(shp, dt)
        if out.nbytes:
            _copy(out, self, out.nbytes)
        return out

    def memset(self, value: int = 0, *, stream: StreamLike = None) -> None:
        """Set every byte to ``value``.

        Without ``stream`` it is synchronous (``cuMemsetD8`` and a wait); with
        ``stream``, ordered on it (``cuMemsetD8Async``).

        Parameters
        ----------
        value : int, default 0
            The byte value, 0..255.
        stream : stream-like, optional
            Order the memset on this stream instead of waiting for it.

        Raises
        ------
        TypeError
            If ``value`` is not an int.
        ValueError
            If ``value`` is not in 0..255.
        """
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError("value must be an int byte value")
        if not 0 <= value <= 255:
            raise ValueError(f"byte value must be in 0..255, got {value}")
        ptr = self.ptr
        if not self._nbytes:
            return
        if stream is None:
            ensure_any_context()
            _driver.call("cuMemsetD8", ptr, value, self._nbytes)
            _driver.call("cuStreamSynchronize", 0)  # memsets of device memory are async
        else:
            h = stream_handle(stream)
            ensure_any_context()
            _driver.call("cuMemsetD8Async", ptr, value, self._nbytes, h)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"ptr=0x{self._ptr:x}"
        return f"<DeviceBuffer {self._nbytes} bytes on device {self._device} {state}>"
