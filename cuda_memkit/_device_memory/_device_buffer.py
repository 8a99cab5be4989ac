"""Device memory: :class:`DeviceBuffer`, a plain ``cuMemAlloc`` allocation.

It carries the interop protocols (``__cuda_array_interface__``, DLPack,
:meth:`~DeviceBuffer.as_array`) so CuPy, torch and numba use it without a
copy, and registers with the allocation ledger (kind ``"device"``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._core import _driver
from .._core._buffer import MemoryKind, ShapedBufferMixin
from .._core._checks import check_dtype, check_nbytes, check_shape, shape_nbytes
from .._core._context import ensure_context, release_call
from .._core._device import check_ordinal
from .._core._inflight import pending_operands, reap_pending
from .._core._interop import OneDeviceMixin
from .._core._operands import copy_size, copy_sync, operand
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


class DeviceBuffer(ShapedBufferMixin, OneDeviceMixin, Resource):
    """Device memory from ``cuMemAlloc`` on one device.

    Build with :meth:`empty`, :meth:`zeros` or :meth:`from_array`. A buffer
    made from a byte count (``empty(nbytes)``) is plain bytes (``dtype`` is
    ``None``): it exports a 1-D ``uint8`` view and copies to and from any
    dtype of its size. One made with a ``dtype`` (or from an array) keeps its
    shape and dtype: ``to_numpy()``, ``__cuda_array_interface__`` and DLPack
    give them, and copies check them. A zero-length buffer allocates nothing
    and has ``ptr == 0``.

    Examples
    --------
    >>> d = cm.DeviceBuffer.from_array(np.arange(5, dtype=np.float32))
    >>> d.to_numpy()
    array([0., 1., 2., 3., 4.], dtype=float32)
    >>> d.fill(np.float32(1.5))
    >>> d.close()
    """

    _ptr: int
    _nbytes: int
    _device: int
    _dtype: np.dtype[Any] | None
    _shape: tuple[int, ...]

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("create a DeviceBuffer with DeviceBuffer.empty(), .zeros() "
                        "or .from_array()")

    @classmethod
    def empty(cls, shape: int | tuple[int, ...], dtype: npt.DTypeLike | None = None, *,
              device: Any = None) -> DeviceBuffer:
        """Allocate uninitialised device memory (``cuMemAlloc``).

        Parameters
        ----------
        shape : int or tuple of int
            Without ``dtype``: the size in bytes (an int). With it: the
            array shape.
            0 (or any zero dimension) allocates nothing.
        dtype : dtype-like, optional
            Element type; default: plain bytes (see the class docstring).
        device : Device or int, optional
            The device; default: the current context's (device 0 if none).
            Its primary context becomes current.

        Raises
        ------
        TypeError
            For a shape that is not an int (without ``dtype``) or a tuple of
            ints, or an object or zero-size dtype.
        ValueError
            For a negative or impossibly large size (before any driver call).
        CudaOutOfMemoryError
            If the device has not enough free memory.
        """
        dt: np.dtype[Any] | None = None
        if dtype is not None:
            shp = check_shape(shape)
            dt = check_dtype(dtype, "device memory")
            n = shape_nbytes(shp, dt)
        else:
            n = check_nbytes(shape, "shape (without a dtype, a byte count)")
            shp = (n,)
        ordinal = check_ordinal(device) if device is not None else None
        self = cls.__new__(cls)
        self._nbytes = n
        self._dtype = dt
        self._shape = shp
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
    def zeros(cls, shape: int | tuple[int, ...], dtype: npt.DTypeLike | None = None, *,
              device: Any = None) -> DeviceBuffer:
        """Allocate device memory filled with zero bytes; arguments as :meth:`empty`."""
        self = cls.empty(shape, dtype, device=device)
        try:
            self._memset(self._ptr, 0, 1, self._nbytes, None)
        except BaseException:
            self.close()
            raise
        return self

    @classmethod
    def from_array(cls, array: Any, *, device: Any = None) -> DeviceBuffer:
        """Allocate a device buffer with ``array``'s shape and dtype and copy it in.

        The copy is synchronous.

        Parameters
        ----------
        array : array-like or cuda_memkit buffer
            Host data (made C-contiguous first if it is not), or another
            buffer, whose bytes (and dtype and shape, where it has them) are copied.
        device : Device or int, optional
            As for :meth:`empty`.
        """
        if isinstance(array, Resource):  # memkit buffers are copied from as they are
            dt = getattr(array, "dtype", None)
            shape = getattr(array, "shape", None)
            if dt is None or shape is None:
                self = cls.empty(array.nbytes, device=device)  # type: ignore[attr-defined]
            else:
                self = cls.empty(shape, dt, device=device)
        else:
            import numpy as np

            array = np.ascontiguousarray(array)
            if array.dtype.hasobject:
                raise TypeError("object arrays cannot be copied to the device")
            self = cls.empty(array.shape, array.dtype, device=device)
        try:
            _copy(self, array, self._nbytes)
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
    def dtype(self) -> np.dtype[Any] | None:
        """Element type; ``None`` for a buffer of plain bytes (made from a byte count)."""
        return self._dtype

    @property
    def kind(self) -> MemoryKind:
        """``MemoryKind.DEVICE``."""
        return MemoryKind.DEVICE

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"ptr=0x{self._ptr:x}"
        typed = "" if self._dtype is None else f" shape={self._shape} dtype={self._dtype}"
        return f"<DeviceBuffer {self._nbytes} bytes{typed} on device {self._device} {state}>"
