"""DLPack export (unversioned ``DLManagedTensor`` capsules) built with ctypes.

Each exported tensor owns a small record (the struct, its shape array and
the buffer's ``Exports`` record) in a registry keyed by the struct's address;
the consumer's call of the ``deleter`` (or the capsule's destructor, if the
capsule is never consumed) drops the record, and with it the reference that
kept the memory allocated (a ``close()`` made meanwhile frees it then).
"""

from __future__ import annotations

import ctypes
import sys
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

_CAPSULE_NAME = b"dltensor"


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", _Deleter),
    ]


_lock = threading.Lock()
_registry: dict[int, tuple[Any, ...]] = {}


# The two callbacks below may run after this module's globals were cleared at interpreter
# exit (a capsule or a consumer's array held by a module that outlives cuda_memkit): what
# they use is bound as defaults, and at exit they drop nothing (the process is ending).
def _release(address: int | None, _lock: Any = _lock, _registry: Any = _registry,
             _finalizing: Any = sys.is_finalizing) -> None:
    if address is None or _finalizing():
        return
    with _lock:
        _registry.pop(address, None)


@_Deleter  # type: ignore[untyped-decorator]
def _deleter(address: int | None, _release: Any = _release) -> None:
    _release(address)


# Private prototypes (ctypes.pythonapi's shared function objects can have
# their argtypes changed by other code).
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p,
                                 ctypes.c_void_p)(("PyCapsule_New", ctypes.pythonapi))
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_capsule_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))

_Destructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@_Destructor  # type: ignore[untyped-decorator]
def _capsule_destructor(capsule: int | None, _valid: Any = _capsule_is_valid,
                        _pointer: Any = _capsule_get_pointer, _name: bytes = _CAPSULE_NAME,
                        _release: Any = _release) -> None:
    # An unconsumed capsule still carries the name "dltensor"; a consumer
    # renames it "used_dltensor" and calls the deleter itself.
    if capsule and _valid(capsule, _name):
        _release(_pointer(capsule, _name))


# Capsules and consumers hold the C addresses of these two callbacks, not the Python
# objects: one reference each is kept for the life of the process, so that the code
# stays valid when a capsule is destroyed after this module's teardown.
_incref = ctypes.PYFUNCTYPE(None, ctypes.py_object)(("Py_IncRef", ctypes.pythonapi))
_incref(_deleter)
_incref(_capsule_destructor)


# kDLInt, kDLUInt, kDLFloat, kDLComplex, kDLBool
_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}


def dl_dtype(dtype: np.dtype[Any]) -> tuple[int, int]:
    """Return DLPack's ``(code, bits)`` for a numpy dtype, or raise BufferError."""
    code = _CODES.get(dtype.kind)
    if code is None or dtype.byteorder == ">":
        raise BufferError(f"dtype {dtype} has no DLPack equivalent")
    return code, dtype.itemsize * 8


def make_capsule(owner: object, ptr: int, shape: tuple[int, ...], dtype: np.dtype[Any],
                 device: tuple[int, int]) -> Any:
    """Return a ``dltensor`` PyCapsule over ``ptr`` that keeps ``owner`` alive."""
    code, bits = dl_dtype(dtype)
    ndim = len(shape)
    shape_arr = (ctypes.c_int64 * max(ndim, 1))(*shape)
    managed = DLManagedTensor()
    t = managed.dl_tensor
    t.data = ptr
    t.device = DLDevice(device[0], device[1])
    t.ndim = ndim
    t.dtype = DLDataType(code, bits, 1)
    t.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.POINTER(ctypes.c_int64)()  # NULL: compact row-major
    t.byte_offset = 0
    managed.manager_ctx = None
    managed.deleter = _deleter
    address = ctypes.addressof(managed)
    with _lock:
        _registry[address] = (managed, shape_arr, owner)
    return _capsule_new(address, _CAPSULE_NAME,
                        ctypes.cast(_capsule_destructor, ctypes.c_void_p))


