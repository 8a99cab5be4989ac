"""The exception tree of cuda_memkit and the ``CUresult`` → class table.

Every failed driver call raises a :class:`CudaError` subclass chosen by its
``CUresult``; codes without a class of their own raise :class:`CudaError`
itself. Argument errors found before any driver call raise plain
:class:`ValueError` / :class:`TypeError`.
"""

from __future__ import annotations

__all__ = [
    "ClosedError",
    "CudaAlreadyMappedError",
    "CudaDriverNotFoundError",
    "CudaError",
    "CudaHostMemoryAlreadyRegisteredError",
    "CudaHostMemoryNotRegisteredError",
    "CudaInvalidContextError",
    "CudaInvalidDeviceError",
    "CudaInvalidHandleError",
    "CudaInvalidValueError",
    "CudaNoDeviceError",
    "CudaNotInitializedError",
    "CudaNotMappedError",
    "CudaNotPermittedError",
    "CudaNotSupportedError",
    "CudaOutOfMemoryError",
    "CudaPeerAccessUnsupportedError",
    "MemkitWarning",
    "PeerAccessError",
]


class CudaError(RuntimeError):
    """A CUDA driver call failed.

    Parameters
    ----------
    code : int
        The ``CUresult`` value the driver returned.
    api : str
        The driver function that returned it, e.g. ``"cuMemAlloc"``.
    name : str, optional
        The error's name, e.g. ``"CUDA_ERROR_OUT_OF_MEMORY"``.
    description : str, optional
        The driver's description of the error (``cuGetErrorString``).

    Attributes
    ----------
    code : int
        The ``CUresult`` value (an ``int``; compare with ``CUresult`` members).
    name : str
        The ``CUresult`` name.
    api : str
        The driver function name.
    description : str
        The driver's description, or ``""`` when unavailable.
    """

    code: int
    name: str
    api: str
    description: str

    def __init__(self, code: int, api: str, name: str = "", description: str = "") -> None:
        self.code = int(code)
        self.api = api
        self.name = name or f"CUresult({self.code})"
        self.description = description
        text = f"{api}: {self.name}"
        if description:
            text += f" ({description})"
        super().__init__(text)

    def __reduce__(self) -> tuple[type[CudaError], tuple[int, str, str, str]]:
        return (type(self), (self.code, self.api, self.name, self.description))


class CudaOutOfMemoryError(CudaError, MemoryError):
    """The driver ran out of memory (``CUDA_ERROR_OUT_OF_MEMORY``)."""


class CudaInvalidValueError(CudaError, ValueError):
    """The driver rejected an argument value (``CUDA_ERROR_INVALID_VALUE``)."""


class CudaNotSupportedError(CudaError):
    """The operation is not supported on this device or driver."""


class CudaNotInitializedError(CudaError):
    """The driver was not initialised or was deinitialised."""


class CudaNoDeviceError(CudaError):
    """No CUDA-capable device is present."""


class CudaInvalidDeviceError(CudaError, ValueError):
    """A device ordinal does not name a device (``CUDA_ERROR_INVALID_DEVICE``)."""


class CudaInvalidContextError(CudaError):
    """No valid current context for the call (``CUDA_ERROR_INVALID_CONTEXT``)."""


class CudaInvalidHandleError(CudaError, ValueError):
    """A handle (stream, event, pool, ...) is invalid (``CUDA_ERROR_INVALID_HANDLE``)."""


class CudaNotPermittedError(CudaError):
    """The operation is not permitted (``CUDA_ERROR_NOT_PERMITTED``)."""


class CudaAlreadyMappedError(CudaError):
    """The range is already mapped (``CUDA_ERROR_ALREADY_MAPPED``)."""


class CudaNotMappedError(CudaError):
    """The range is not mapped (``CUDA_ERROR_NOT_MAPPED``)."""


class CudaHostMemoryAlreadyRegisteredError(CudaError):
    """The host range is already registered (``CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED``)."""


class CudaHostMemoryNotRegisteredError(CudaError):
    """The host range is not registered (``CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED``)."""


class CudaPeerAccessUnsupportedError(CudaError):
    """Two devices cannot access each other's memory (``CUDA_ERROR_PEER_ACCESS_UNSUPPORTED``).

    Raised by :meth:`~cuda_memkit.Device.enable_peer_access` where
    ``cuDeviceCanAccessPeer`` answers no (no NVLink or PCIe peer path between
    them); copies between such devices still work, staged by the driver
    through host memory.
    """


class PeerAccessError(CudaInvalidValueError):
    """A device was given no access to pool or mapped memory of another device.

    A copy or kernel between two devices runs on one of them, which must be
    allowed to read (and, for a destination, write) the other's pool or VMM
    memory: ``MemoryPool(..., peers=[...])`` or :meth:`MemoryPool.set_access
    <cuda_memkit.MemoryPool.set_access>`, ``GrowableBuffer(..., peers=[...])``
    or :meth:`GrowableBuffer.set_access <cuda_memkit.GrowableBuffer.set_access>`,
    :meth:`Mapping.set_access <cuda_memkit.Mapping.set_access>`. The driver
    answers such a copy with ``CUDA_ERROR_INVALID_VALUE``, which is this
    error's code; the message names the memory, the device and the call that
    grants the access.
    """


class CudaDriverNotFoundError(CudaError):
    """No usable CUDA driver: libcuda is missing, or lacks a function we need.

    ``code`` is ``-1`` because no driver call returned a status.
    """

    def __init__(self, code: int, api: str, name: str = "", description: str = "") -> None:
        super().__init__(code, api, name or "CUDA_DRIVER_NOT_FOUND", description)


class ClosedError(ValueError):
    """An object was used after :meth:`close` (or after its memory was freed)."""


class MemkitWarning(RuntimeWarning):
    """A failure that could not be raised, e.g. inside a finalizer."""


# CUresult values (stable ABI numbers from cuda.h) -> exception class.
_CLASS_BY_CODE: dict[int, type[CudaError]] = {
    1: CudaInvalidValueError,  # CUDA_ERROR_INVALID_VALUE
    2: CudaOutOfMemoryError,  # CUDA_ERROR_OUT_OF_MEMORY
    3: CudaNotInitializedError,  # CUDA_ERROR_NOT_INITIALIZED
    4: CudaNotInitializedError,  # CUDA_ERROR_DEINITIALIZED
    100: CudaNoDeviceError,  # CUDA_ERROR_NO_DEVICE
    101: CudaInvalidDeviceError,  # CUDA_ERROR_INVALID_DEVICE
    201: CudaInvalidContextError,  # CUDA_ERROR_INVALID_CONTEXT
    208: CudaAlreadyMappedError,  # CUDA_ERROR_ALREADY_MAPPED
    211: CudaNotMappedError,  # CUDA_ERROR_NOT_MAPPED
    217: CudaPeerAccessUnsupportedError,  # CUDA_ERROR_PEER_ACCESS_UNSUPPORTED
    400: CudaInvalidHandleError,  # CUDA_ERROR_INVALID_HANDLE
    712: CudaHostMemoryAlreadyRegisteredError,  # CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
    713: CudaHostMemoryNotRegisteredError,  # CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
    800: CudaNotPermittedError,  # CUDA_ERROR_NOT_PERMITTED
    801: CudaNotSupportedError,  # CUDA_ERROR_NOT_SUPPORTED
}


def error_class(code: int) -> type[CudaError]:
    """Return the exception class for a ``CUresult`` value.

    Parameters
    ----------
    code : int
        A ``CUresult`` value.

    Returns
    -------
    type[CudaError]
        The most specific class; :class:`CudaError` for codes without one.
    """
    return _CLASS_BY_CODE.get(int(code), CudaError)
