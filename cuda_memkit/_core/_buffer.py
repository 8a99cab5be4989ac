"""The one buffer contract: :class:`MemoryKind`, the :class:`Buffer` protocol, :class:`BufferMixin`.

Every owning kind (device, pinned, registered, managed, pool, VMM mapping,
growable) satisfies :class:`Buffer` and gets ``fill``, ``copy_from``,
``copy_to`` and ``to_numpy`` from :class:`BufferMixin`, so they behave alike.

Copies go through :func:`cuda_memkit.copy`, which lives above this layer (in
``_transfer``, which itself builds on pinned buffers): ``_transfer._transfers``
plugs it in through :data:`copier` when it loads, as ``_host._pinned_pool``
does for ``_host._pinned.pool_source``; the package loads it together with
every buffer module (``_COMPANIONS`` in ``__init__.py``).
"""

from __future__ import annotations

import ctypes
import enum
import inspect
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, _ProtocolMeta, runtime_checkable

from . import _driver
from ._context import ensure_any_context, ensure_context, primary_pushed
from ._inflight import keep_alive
from ._interop import normalize_view
from ._operands import copy_sync, operand
from ._resource import Resource
from ._stream import StreamLike, stream_handle

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    from typing_extensions import Self

__all__ = ["Buffer", "BufferMixin", "MemoryKind", "copier"]


class MemoryKind(str, enum.Enum):
    """The kinds of memory cuda_memkit owns; each value is its ledger kind.

    ``buf.kind`` of any buffer is one of these, and the keys of
    :func:`~cuda_memkit.memory_stats` are their values, so the two agree
    (``memory_stats().by_kind()[buf.kind]``).

    Attributes
    ----------
    DEVICE
        :class:`~cuda_memkit.DeviceBuffer` (``cuMemAlloc``).
    POOL
        :class:`~cuda_memkit.PoolBuffer` of any pool (device, host or managed).
    MANAGED
        :class:`~cuda_memkit.ManagedBuffer` (``cuMemAllocManaged``).
    PINNED
        :class:`~cuda_memkit.HostBuffer` (``cuMemHostAlloc``).
    PINNED_POOLED
        :class:`~cuda_memkit.HostBuffer` from a pinned pool (``HostBuffer.pooled``).
    REGISTERED
        :class:`~cuda_memkit.RegisteredHost` (``cuMemHostRegister``).
    VMM_PHYSICAL
        :class:`~cuda_memkit.PhysicalMemory` (``cuMemCreate``): no address of its own.
    VMM_MAPPED
        :class:`~cuda_memkit.Mapping` (``cuMemMap``).
    GROWABLE
        :class:`~cuda_memkit.GrowableBuffer` (mapped chunks).
    SHARED_RING
        :class:`~cuda_memkit.RingSlot` of a :class:`~cuda_memkit.SharedHostRing`
        (shared memory registered with ``cuMemHostRegister``: its bytes are
        also under ``REGISTERED``).
    MANAGED_RESIDENT
        No buffer's kind: the bytes of ``MANAGED`` buffers cuda_memkit last
        prefetched to a device (its own record; see
        :meth:`ManagedBuffer.residency <cuda_memkit.ManagedBuffer.residency>`).
    GRAPH
        No buffer's kind: memory allocated while a stream captured, owned by
        the CUDA graph and freed with it (see :class:`~cuda_memkit.Graph`).
    GRAPH_EXEC
        No buffer's kind: an open :class:`~cuda_memkit.Graph` (no bytes), so
        that a leak report names graphs that were never closed.
    """

    DEVICE = "device"
    POOL = "pool"
    MANAGED = "managed"
    PINNED = "pinned"
    PINNED_POOLED = "pinned_pooled"
    REGISTERED = "registered"
    VMM_PHYSICAL = "vmm_physical"
    VMM_MAPPED = "vmm_mapped"
    GROWABLE = "growable"
    SHARED_RING = "shared_ring"
    MANAGED_RESIDENT = "managed_resident"
    GRAPH = "graph"
    GRAPH_EXEC = "graph_exec"

    def __str__(self) -> str:
        return str(self.value)


#: The members :class:`Buffer` asks for (checked without reading them: see ``_BufferMeta``).
_MEMBERS = ("ptr", "nbytes", "device", "kind", "closed", "close", "__enter__", "__exit__",
            "fill", "copy_from", "copy_to", "to_numpy")
_MISSING = object()


class _BufferMeta(_ProtocolMeta):
    # typing's runtime check reads every member with hasattr(); reading ``ptr``
    # of a closed buffer raises ClosedError, so look the members up statically.
    def __instancecheck__(cls, instance: object) -> bool:
        if cls is not Buffer:
            return super().__instancecheck__(instance)
        return all(inspect.getattr_static(instance, m, _MISSING) is not _MISSING
                   for m in _MEMBERS)


@runtime_checkable
class Buffer(Protocol, metaclass=_BufferMeta):
    """What every cuda_memkit buffer is: memory with one owner and one set of methods.

    :class:`~cuda_memkit.DeviceBuffer`, :class:`~cuda_memkit.HostBuffer`
    (also pooled), :class:`~cuda_memkit.RegisteredHost`,
    :class:`~cuda_memkit.ManagedBuffer`, :class:`~cuda_memkit.PoolBuffer`,
    :class:`~cuda_memkit.Mapping`, :class:`~cuda_memkit.GrowableBuffer` and
    :class:`~cuda_memkit.RingSlot` satisfy it (``isinstance(buf, cm.Buffer)``).

    After :meth:`close`, ``nbytes``, ``kind``, ``closed``, ``device`` and
    ``repr()`` still answer; everything that touches the memory (``ptr``,
    views, copies, ``fill``, ``to_numpy``, exports) raises
    :class:`~cuda_memkit.ClosedError`. ``close()`` is idempotent.
    """

    @property
    def ptr(self) -> int:
        """Address of the first byte (0 for a zero-length buffer)."""

    @property
    def nbytes(self) -> int:
        """Size in bytes."""

    @property
    def device(self) -> int | None:
        """Ordinal of the device holding the memory; ``None`` for host memory."""

    @property
    def kind(self) -> MemoryKind:
        """The kind of memory (its ledger kind)."""

    @property
    def closed(self) -> bool:
        """Whether the buffer was closed."""

    def close(self) -> None:
        """Give the memory back; calling it again does nothing."""

    def __enter__(self) -> Self: ...

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None: ...

    def fill(self, value: Any, *, stream: StreamLike = None) -> None:
        """Set every element to ``value`` (a 1-, 2- or 4-byte pattern)."""

    def copy_from(self, src: Any, *, stream: StreamLike = None) -> None:
        """Copy ``src`` (of the same size in bytes) into the buffer."""

    def copy_to(self, dst: Any, *, stream: StreamLike = None) -> None:
        """Copy the buffer into ``dst`` (of the same size in bytes)."""

    def to_numpy(self, dtype: npt.DTypeLike | None = None,
                 shape: int | tuple[int, ...] | None = None) -> np.ndarray[Any, Any]:
        """A new host array holding a copy of the contents."""


#: :func:`cuda_memkit.copy`, set by ``cuda_memkit._transfer._transfers`` when it loads.
copier: Callable[..., Any] | None = None


def _copier() -> Callable[..., Any]:
    if copier is None:
        raise RuntimeError("the transfers (cuda_memkit._transfer._transfers) are not loaded; "
                           "use the classes through `import cuda_memkit`")
    return copier


_MEMSET = {1: "cuMemsetD8", 2: "cuMemsetD16", 4: "cuMemsetD32"}


def fill_pattern(value: object, dtype: np.dtype[Any] | None) -> tuple[int, int, int]:
    """``(bit pattern, width, element size)`` of a fill of elements of ``dtype`` with ``value``.

    A numpy scalar brings its own dtype; a Python int or float takes the
    buffer's (``uint8`` for byte buffers). The element's bytes must repeat a
    1-, 2- or 4-byte pattern (any 1-, 2- or 4-byte value does; so do wider
    ones such as ``0.0`` in float64), the ``width`` the driver's memset sets.
    Raises ``TypeError`` / ``ValueError`` for values that are not numbers or
    do not fit.
    """
    if isinstance(value, bool):
        raise TypeError("fill value must be a number, not a bool")
    if type(value) is int and dtype is None:  # bytes: the common case, without numpy
        if not 0 <= value <= 255:
            raise ValueError(f"fill value {value} does not fit a byte (0..255); pass a numpy "
                             "scalar such as np.uint32(x) for a wider pattern")
        return value, 1, 1
    import numpy as np

    if isinstance(value, np.generic):
        dt = value.dtype
    elif isinstance(value, (int, float, complex)):
        dt = dtype if dtype is not None else np.dtype(np.uint8)
    else:
        raise TypeError(f"fill value must be an int, a float or a numpy scalar, "
                        f"not {type(value).__name__}")
    if dt.kind not in "biufc":
        raise ValueError(f"fill value of dtype {dt}: fill sets numbers")
    if dt.kind in "biu" and isinstance(value, (float, complex)):
        raise TypeError(f"fill value {value!r} is not an integer; the elements are {dt}")
    try:
        raw = np.array(value, dtype=dt).tobytes()
    except (OverflowError, ValueError, TypeError):
        raise ValueError(f"fill value {value!r} does not fit dtype {dt}") from None
    for width in _MEMSET:
        if len(raw) % width == 0 and raw == raw[:width] * (len(raw) // width):
            return int.from_bytes(raw[:width], sys.byteorder), width, len(raw)
    raise ValueError(f"fill value {value!r} of dtype {dt} is not a repeated 1-, 2- or 4-byte "
                     "pattern, which is what the driver's memset sets")


class BufferMixin:
    """``fill``, ``copy_from``, ``copy_to`` and ``to_numpy`` for every buffer kind.

    A class provides ``ptr``, ``nbytes`` and ``device`` (``ptr`` raising
    ``ClosedError`` once closed) and overrides :meth:`_layout` when it was made with a dtype
    and shape, and :meth:`_host_only` when the CPU must touch its memory
    (host memory, which the driver's memset does not serve for every kind).
    """

    __slots__ = ()

    if TYPE_CHECKING:
        @property
        def ptr(self) -> int: ...
        @property
        def nbytes(self) -> int: ...

    def _layout(self) -> tuple[np.dtype[Any] | None, tuple[int, ...] | None]:
        """The dtype and shape the buffer was made with (``None``: plain bytes)."""
        return None, None

    def _host_only(self) -> bool:
        """Whether the memory is host memory that the CPU fills and reads."""
        return False

    def fill(self, value: Any, *, stream: StreamLike = None) -> None:
        """Set every element to ``value``.

        Device-visible memory is filled by the driver (``cuMemsetD8/D16/D32``;
        without ``stream`` synchronously, with ``stream`` ordered on it
        (the ``Async`` form)); host memory by the CPU (with ``stream``, after
        waiting for the work queued on it).

        Parameters
        ----------
        value : int, float or numpy scalar
            Converted to the buffer's dtype (``uint8`` for byte buffers,
            which take ints only); a numpy scalar brings its own
            (``np.float32(1.0)`` fills 4-byte floats). Its bytes must repeat
            a 1-, 2- or 4-byte pattern: any value of a 1-, 2- or 4-byte
            dtype, and ``0`` of any dtype.
        stream : stream-like, optional
            Order the fill on this stream instead of completing it now.

        Raises
        ------
        TypeError
            For a value that is not a number, or a bad stream.
        ValueError
            If the value does not fit the dtype, its bytes do not repeat a
            1-, 2- or 4-byte pattern, or the buffer is not a whole number of
            such elements (all before any driver call); for a ``READ_ONLY``
            registration.
        ClosedError
            If the buffer is closed.
        PeerAccessError
            With ``stream``, when the buffer is another device's pool or
            mapped memory and the stream's device was given no access to it
            (the fill is issued in the stream's context, whatever context is
            current); nothing is issued.
        """
        pattern, width, size = fill_pattern(value, self._layout()[0])
        ptr = self.ptr
        n = self.nbytes
        h = None if stream is None else stream_handle(stream)
        if n % size or ptr % width:
            raise ValueError(f"a fill value of {size} bytes needs a buffer of whole {size}-byte "
                             f"elements at a {width}-byte aligned address; this one has {n} "
                             f"bytes at 0x{ptr:x}")
        if getattr(self, "read_only", False):
            raise ValueError("the buffer is a READ_ONLY registration: it cannot be filled")
        self._memset(ptr, pattern, width, n, h, stream)

    def _memset(self, ptr: int, pattern: int, width: int, n: int, h: int | None,
                stream: StreamLike = None) -> None:
        """Set ``n`` bytes at ``ptr`` to ``pattern`` (``width`` bytes); checked already."""
        if not n:
            return
        if self._host_only():
            if h is not None:
                ensure_any_context()
                _driver.call("cuStreamSynchronize", h)
            _cpu_fill(ptr, pattern, width, n)
            return
        if h is not None:
            # The stream's context issues the memset, whatever is current (see _runner;
            # imported here: it imports this module).
            from ._runner import place

            api = _MEMSET[width] + "Async"
            runner = place(((self, True),), h, api, stream)
            if runner is None:
                _driver.call(api, ptr, pattern, n // width, h)
                keep_alive(h, (self,))  # as a copy's operand: close() frees after the memset
                return
            with primary_pushed(runner):
                _driver.call(api, ptr, pattern, n // width, h)
                keep_alive(h, (self,))
            return
        device: int | None = getattr(self, "device", None)  # every buffer kind has one
        if device is not None and device != ensure_context(None):
            # Another device's memory: the driver refuses a synchronous memset from
            # this device's context, so its own context does it.
            with primary_pushed(device):
                _driver.call(_MEMSET[width], ptr, pattern, n // width)
                _driver.call("cuStreamSynchronize", 0)
            return
        _driver.call(_MEMSET[width], ptr, pattern, n // width)
        _driver.call("cuStreamSynchronize", 0)  # memsets of device memory are async

    def copy_from(self, src: Any, *, stream: StreamLike = None) -> None:
        """Copy ``src`` into this buffer, as :func:`cuda_memkit.copy` ``(self, src)``.

        Parameters
        ----------
        src : buffer, array or array-like memory
            Host data (a numpy array, any layout, or a list) must have the
            buffer's dtype and shape exactly when the buffer has them;
            anything else :func:`cuda_memkit.copy` accepts must have its size
            in bytes (and, where both are typed, its dtype).
        stream : stream-like, optional
            Order the copy on this stream (pageable numpy memory is then
            refused: see :func:`cuda_memkit.copy_async`); default: synchronous.

        Raises
        ------
        ValueError
            On a size or dtype mismatch (before anything is copied).
        ClosedError
            If either side is closed.
        """
        self.ptr  # noqa: B018  (ClosedError first, whatever the source)
        host = _host_data(src)
        if host is not None:
            self._check_like(host, "source")
            if not host.flags.c_contiguous:
                import numpy as np

                host = np.ascontiguousarray(host)
            src = host
        _copier()(self, src, stream=stream)

    def _check_like(self, host: np.ndarray[Any, Any], role: str) -> None:
        """Host data must have a typed buffer's dtype and shape (``ValueError``)."""
        dt, shp = self._layout()
        if dt is None or shp is None:
            return  # bytes: copy() compares the sizes
        if host.dtype != dt:
            raise ValueError(f"dtype mismatch: the {role} is {host.dtype}, the buffer {dt}")
        if tuple(host.shape) != shp:
            raise ValueError(f"shape mismatch: the {role} has shape {tuple(host.shape)}, "
                             f"the buffer {shp}")

    def copy_to(self, dst: Any, *, stream: StreamLike = None) -> None:
        """Copy this buffer into ``dst``, as :func:`cuda_memkit.copy` ``(dst, self)``.

        Parameters
        ----------
        dst : buffer, writable array or array-like memory
            As ``src`` of :meth:`copy_from`; a strided numpy array is filled
            through a C-ordered copy (without ``stream`` only).
        stream : stream-like, optional
            As for :meth:`copy_from`.

        Raises
        ------
        ValueError
            On a size or dtype mismatch or a read-only destination (before
            anything is copied).
        ClosedError
            If either side is closed.
        """
        self.ptr  # noqa: B018  (ClosedError first, whatever the destination)
        host = _host_data(dst)
        if host is not None:
            if not host.flags.writeable:
                raise ValueError("the copy destination is a read-only array")
            self._check_like(host, "destination")
            if not host.flags.c_contiguous and stream is None:
                import numpy as np

                tmp = np.empty(host.shape, host.dtype)  # strided: copied in through C order
                _copier()(tmp, self)
                np.copyto(host, tmp, casting="no")
                return
        _copier()(dst, self, stream=stream)

    def to_numpy(self, dtype: npt.DTypeLike | None = None,
                 shape: int | tuple[int, ...] | None = None) -> np.ndarray[Any, Any]:
        """Return a new numpy array holding a copy of the contents (synchronously).

        Parameters
        ----------
        dtype : dtype-like, optional
            Element type; default: the dtype the buffer was made with
            (``uint8`` bytes for a buffer made from a byte count).
        shape : int or tuple of int, optional
            Shape; default: the buffer's own shape when ``dtype`` is left out
            too, else as many elements as fit. A shape smaller than the
            buffer copies its first bytes.

        Raises
        ------
        TypeError, ValueError
            For object or zero-size dtypes, or a shape that needs more bytes
            than the buffer has.
        ClosedError
            If the buffer is closed.
        """
        import numpy as np

        ptr = self.ptr
        own_dtype, own_shape = self._layout()
        if dtype is None and shape is None and own_dtype is not None and own_shape is not None:
            dt, shp = own_dtype, own_shape
        else:
            want = dtype if dtype is not None else own_dtype if own_dtype is not None else "u1"
            dt, shp = normalize_view(want, shape, self.nbytes)
        out = np.empty(shp, dt)
        n = out.nbytes
        if n:
            if self._host_only():
                ctypes.memmove(out.ctypes.data, ptr, n)
            else:
                copy_sync(operand(out, True), operand(self, False), n)
        return out


class ShapedBufferMixin(BufferMixin):
    """:class:`BufferMixin` plus ``nbytes`` and ``shape`` for a buffer made with a shape.

    A class sets ``_nbytes``, ``_shape`` and ``_dtype`` (``None``: plain bytes)
    and provides ``dtype`` (:class:`TypedBufferMixin` does where it is never ``None``).
    """

    __slots__ = ()

    _nbytes: int
    _shape: tuple[int, ...]
    _dtype: np.dtype[Any] | None

    @property
    def nbytes(self) -> int:
        """Size in bytes."""
        return self._nbytes

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape the buffer was made with (``(nbytes,)`` for plain bytes)."""
        return self._shape

    def _layout(self) -> tuple[np.dtype[Any] | None, tuple[int, ...] | None]:
        return self._dtype, self._shape


class TypedBufferMixin(ShapedBufferMixin):
    """:class:`ShapedBufferMixin` plus ``dtype``, for a kind that always has an element type."""

    __slots__ = ()

    _dtype: np.dtype[Any]

    @property
    def dtype(self) -> np.dtype[Any]:
        """Element type."""
        return self._dtype


def _host_data(obj: Any) -> np.ndarray[Any, Any] | None:
    """``obj`` as a numpy array if it is host data (an array, a list), else ``None``."""
    if isinstance(obj, (int, Resource)) or hasattr(obj, "__cuda_array_interface__"):
        return None
    import numpy as np

    if isinstance(obj, np.ndarray):
        arr = obj
    elif isinstance(obj, (list, tuple)) or hasattr(obj, "__array_interface__"):
        arr = np.asarray(obj)
    else:
        return None  # buffer-protocol objects, pointers and the rest: copy() decides
    if arr.dtype.hasobject:
        raise TypeError("object arrays cannot be copied to or from a buffer")
    return arr


def _cpu_fill(ptr: int, pattern: int, width: int, nbytes: int) -> None:
    if width == 1:
        ctypes.memset(ptr, pattern, nbytes)
        return
    import numpy as np

    raw = memoryview((ctypes.c_char * nbytes).from_address(ptr)).cast("B")
    np.frombuffer(raw, dtype=f"u{width}")[:] = pattern
