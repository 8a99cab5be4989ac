"""Interop protocols for device-accessible memory.

:class:`DeviceMemoryMixin` gives any buffer with ``ptr``, ``nbytes`` and a
device ordinal ``__cuda_array_interface__`` (v3), ``__dlpack__`` /
``__dlpack_device__`` and :meth:`~DeviceMemoryMixin.as_array`, a typed view
that other libraries (CuPy, torch, numba, cuda.core) can consume zero-copy.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ._checks import check_dtype, check_shape

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["DeviceArrayView", "DeviceMemoryMixin"]

# DLPack device types
DL_CUDA = 2
DL_CUDA_HOST = 3
DL_CUDA_MANAGED = 13


def _typestr(dtype: np.dtype[Any]) -> str:
    if dtype.hasobject:
        raise TypeError("object dtypes cannot live in device memory")
    return str(dtype.str)


def normalize_view(dtype: npt.DTypeLike, shape: int | tuple[int, ...] | None,
               nbytes: int) -> tuple[np.dtype[Any], tuple[int, ...]]:
    dt = check_dtype(dtype, "device memory")
    if shape is None:
        if nbytes % dt.itemsize:
            raise ValueError(f"{nbytes} bytes is not a whole number of {dt} items")
        shp: tuple[int, ...] = (nbytes // dt.itemsize,)
    else:
        shp = check_shape(shape)
        need = math.prod(shp) * dt.itemsize
        if need > nbytes:
            raise ValueError(f"shape {shp} of {dt} needs {need} bytes; the buffer has {nbytes}")
    return dt, shp


class DeviceMemoryMixin:
    """Protocols for memory the GPU can address.

    Subclasses provide ``ptr`` and ``nbytes`` properties (raising
    ``ClosedError`` once closed) and ``_dl_device() -> (device_type, id)``.
    The default view is a 1-D ``uint8`` array of ``nbytes`` bytes, or the
    dtype and shape of ``_layout()`` for a buffer made with them.
    """

    __slots__ = ()

    @property
    def ptr(self) -> int:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    @property
    def nbytes(self) -> int:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    def _dl_device(self) -> tuple[int, int]:
        return (DL_CUDA, 0)

    def _layout(self) -> tuple[np.dtype[Any] | None, tuple[int, ...] | None]:
        """The dtype and shape the buffer was made with (``None``: bytes), for the exports."""
        return None, None

    def _export(self) -> DeviceArrayView:
        dt, shp = self._layout()
        return self.as_array() if dt is None or shp is None else self.as_array(dt, shp)

    def as_array(self, dtype: npt.DTypeLike = "u1",
                 shape: int | tuple[int, ...] | None = None) -> DeviceArrayView:
        """Return a typed, zero-copy device view (for CuPy, torch, numba, ...).

        Parameters
        ----------
        dtype : dtype-like, default uint8
            Element type.
        shape : int or tuple of int, optional
            Shape; default: as many elements as fit in ``nbytes``.

        Raises
        ------
        TypeError
            For object or zero-size dtypes.
        ValueError
            If the shape needs more bytes than the buffer has.
        """
        dt, shp = normalize_view(dtype, shape, self.nbytes)
        return DeviceArrayView(self, self.ptr, dt, shp, self._dl_device())

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        if self._layout()[0] is not None:  # typed: its own dtype and shape
            return self._export().__cuda_array_interface__
        return {
            "shape": (self.nbytes,),
            "typestr": "|u1",
            "data": (self.ptr, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._dl_device()

    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        return self._export().__dlpack__(stream=stream, max_version=max_version,
                                          dl_device=dl_device, copy=copy)


class OneDeviceMixin(DeviceMemoryMixin):
    """:class:`DeviceMemoryMixin` for memory of one device, whose ordinal is ``_device``."""

    __slots__ = ()

    _device: int

    @property
    def device(self) -> int:
        """Ordinal of the device the memory belongs to."""
        return self._device

    def _dl_device(self) -> tuple[int, int]:
        return (DL_CUDA, self._device)


class DeviceArrayView:
    """A typed, shaped view of device-accessible memory; keeps its owner alive."""

    __slots__ = ("_device", "_dtype", "_owner", "_ptr", "_shape")

    def __init__(self, owner: object, ptr: int, dtype: np.dtype[Any], shape: tuple[int, ...],
                 device: tuple[int, int]) -> None:
        self._owner = owner
        self._ptr = ptr
        self._dtype = dtype
        self._shape = shape
        self._device = device

    @property
    def owner(self) -> object:
        """The buffer this view belongs to."""
        return self._owner

    @property
    def closed(self) -> bool:
        """Whether the buffer behind the view was freed or closed (the view is then unusable)."""
        return bool(getattr(self._owner, "closed", False))

    def _check_owner(self) -> None:
        owner = self._owner
        if getattr(owner, "closed", False):
            from ._errors import ClosedError

            raise ClosedError(f"the {type(owner).__name__} behind this view was freed or "
                              "closed; the view cannot be used any more")

    @property
    def ptr(self) -> int:
        """Address of the first element.

        Resolved through the owner at each use, so copies and batches never
        see the address of freed memory (which may be another buffer's by now).

        Raises
        ------
        ClosedError
            If the buffer behind the view was freed or closed.
        """
        self._check_owner()
        return self._ptr

    @property
    def shape(self) -> tuple[int, ...]:
        """The view's shape."""
        return self._shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """The element type."""
        return self._dtype

    @property
    def nbytes(self) -> int:
        """Bytes covered by the view."""
        return math.prod(self._shape) * self._dtype.itemsize

    def __repr__(self) -> str:
        return f"<DeviceArrayView shape={self._shape} dtype={self._dtype} ptr=0x{self._ptr:x}>"

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        self._check_owner()
        return {
            "shape": self._shape,
            "typestr": _typestr(self._dtype),
            "data": (self._ptr, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device

    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        self._check_owner()
        if copy:
            raise BufferError("cuda_memkit views are exported without copying (copy=True)")
        if dl_device is not None and tuple(dl_device) != self._device:
            raise BufferError(
                f"cannot export to device {dl_device}; the memory is on {self._device}"
            )
        from . import _dlpack
        from ._resource import Resource, exports_of

        owner = self._owner
        # The capsule (and the consumer's array after it) holds the owner's
        # Exports record, which keeps the memory allocated past close().
        keep = exports_of(owner) if isinstance(owner, Resource) else owner
        return _dlpack.make_capsule(keep, self._ptr, self._shape, self._dtype, self._device)

