"""Devices, primary contexts, streams and memory locations."""

from __future__ import annotations

import contextlib
import enum
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Union

from cuda.bindings import driver as _cu

from . import _capture, _driver, _peer
from ._checks import MAX_U64, u64
from ._constants import (
    CONTEXT_IS_DESTROYED,
    EVENT_DISABLE_TIMING,
    INVALID_CONTEXT,
    PEER_ACCESS_ALREADY_ENABLED,
    PEER_ACCESS_NOT_ENABLED,
    PEER_ACCESS_UNSUPPORTED,
    STREAM_LEGACY,
    STREAM_NON_BLOCKING,
    TOO_MANY_PEERS,
)
from ._errors import CudaError, CudaPeerAccessUnsupportedError
from ._resource import Resource, driver_release, make_finalizer, warn_exit_failed

__all__ = [
    "Device",
    "Location",
    "LocationType",
    "Stream",
    "StreamLike",
    "StreamRef",
    "device_count",
]

_A = _cu.CUdevice_attribute


def device_count() -> int:
    """Return the number of CUDA devices (``cuDeviceGetCount``).

    Returns
    -------
    int
        Devices visible to this process (0 is possible).
    """
    return int(_driver.call("cuDeviceGetCount"))


#: The largest device ordinal or location id the driver takes (a C ``int``).
MAX_ORDINAL = (1 << 31) - 1


def check_ordinal(ordinal: object, what: str = "device") -> int:
    if isinstance(ordinal, bool) or not isinstance(ordinal, int):
        if isinstance(ordinal, Device):
            return ordinal.ordinal
        raise TypeError(f"{what} must be an int ordinal or a Device, not {type(ordinal).__name__}")
    if ordinal < 0:
        raise ValueError(f"{what} ordinal must be >= 0, got {ordinal}")
    if ordinal > MAX_ORDINAL:  # never an OverflowError from the bindings
        raise ValueError(f"{what} ordinal {ordinal} is past the largest the driver takes "
                         "(2**31 - 1)")
    return ordinal


def existing_ordinal(ordinal: object, what: str = "device") -> int:
    """:func:`check_ordinal`, then ``ValueError`` for a device that does not exist."""
    o = check_ordinal(ordinal, what)
    n = device_count()
    if o >= n:
        raise ValueError(f"{what} {o} does not exist ({n} device(s) visible)")
    return o


def check_exists(loc: Location) -> Location:
    """``ValueError`` if ``loc`` names a device that does not exist; returns ``loc``."""
    if loc.type is LocationType.DEVICE:
        existing_ordinal(loc.id)
    return loc


# Primary contexts, retained once per device for the life of the process.
_ctx_lock = threading.Lock()
_primary: dict[int, int] = {}


def forget_contexts() -> None:
    """Forget the retained primary contexts (the simulated machine was replaced)."""
    with _ctx_lock:
        _primary.clear()
    _peer.forget()  # peer access was enabled between those contexts


def primary_context(ordinal: int) -> int:
    """Return the (retained) primary context handle of device ``ordinal``."""
    ctx = _primary.get(ordinal)
    if ctx is None:
        with _ctx_lock:
            ctx = _primary.get(ordinal)
            if ctx is None:
                dev = _driver.call("cuDeviceGet", ordinal)
                ctx = int(_driver.call("cuDevicePrimaryCtxRetain", dev))
                _primary[ordinal] = ctx
    return ctx


#: What a release answers when the calling thread has no usable current
#: context: CUDA_ERROR_INVALID_CONTEXT (none) or CUDA_ERROR_CONTEXT_IS_DESTROYED
#: (another thread destroyed it); releases that answer either succeed with the
#: owning device's primary context pushed (see docs/decisions.md).
CONTEXT_ERRORS = frozenset({INVALID_CONTEXT, CONTEXT_IS_DESTROYED})


@contextlib.contextmanager
def primary_pushed(ordinal: int) -> Iterator[None]:
    """Device ``ordinal``'s primary context current inside; the thread's own after.

    ``cuCtxPushCurrent`` / ``cuCtxPopCurrent``: whatever was current before
    (nothing, another device's context, a destroyed one) is current again
    afterwards, so a finalizer never changes the collecting thread's state.
    """
    _driver.call("cuCtxPushCurrent", primary_context(ordinal))
    try:
        yield
    finally:
        _driver.call("cuCtxPopCurrent")


def release_call(ordinal: int | None, api: str, *args: Any) -> None:
    """Make release call ``api(*args)``, whatever context is current on this thread.

    Tried as it is first (most releases need no context on the H100); after
    :data:`CONTEXT_ERRORS` it is retried once with the primary context of device
    ``ordinal`` (device 0 for host memory) pushed, and the thread's own context
    restored. Other errors propagate.
    """
    try:
        _driver.call(api, *args)
        return
    except CudaError as exc:
        if exc.code not in CONTEXT_ERRORS:
            raise
    with primary_pushed(ordinal or 0):
        _driver.call(api, *args)


def ensure_any_context() -> int:
    """Make sure the calling thread has a current context (device 0's primary if none).

    One driver call when a context is current: the cheap form of
    :func:`ensure_context` for callers that do not need the device ordinal.

    Returns
    -------
    int
        The current context's handle (callers that key on it need not ask again).
    """
    ctx = int(_driver.call("cuCtxGetCurrent"))
    if not ctx:
        ensure_context(0)
        ctx = int(_driver.call("cuCtxGetCurrent"))
    return ctx


def ensure_context(ordinal: int | None = None) -> int:
    """Make sure the calling thread has a current context and return its device.

    With ``ordinal`` given, device ``ordinal``'s primary context becomes
    current (like ``cudaSetDevice``) unless it already is. With ``None``, the
    current context is kept if there is one, else device 0's primary context
    is made current.

    Returns
    -------
    int
        The ordinal of the current context's device.
    """
    cur = int(_driver.call("cuCtxGetCurrent"))
    if ordinal is None:
        if cur:
            return int(_driver.call("cuCtxGetDevice"))
        ordinal = 0
    want = primary_context(ordinal)
    if cur != want:
        _driver.call("cuCtxSetCurrent", want)
    return ordinal


# -- peer access (the state is in _peer) --------------------------------------------------


def peer_ordinal(device: int, peer: object) -> int:
    """``peer`` checked for :class:`Device`'s peer-access methods: an existing other device."""
    other = existing_ordinal(peer, "peer")
    if other == device:
        raise ValueError(f"device {device} is not a peer of itself: a device always accesses "
                         "its own memory")
    return other


def peer_ordinals(peers: object, device: int | None) -> list[int]:
    """A ``peers=`` argument checked: the existing devices other than ``device``, in order.

    ``device`` ``None`` (memory of no one device, which no ``peers=`` applies to): the
    ordinals given, checked for their type only, so that the caller refuses the argument
    itself whatever devices it names.

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
    for o in out:
        if device is not None and not can_reach(o, device):
            raise CudaPeerAccessUnsupportedError(
                PEER_ACCESS_UNSUPPORTED, "cuDeviceCanAccessPeer",
                "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
                f"device {o} cannot access device {device}'s memory, so it cannot be a peer")
    return out


def can_reach(device: int, peer: int) -> bool:
    """``cuDeviceCanAccessPeer(device, peer)``, asked once per pair."""
    hit = _peer.reachable.get((device, peer))
    if hit is None:
        hit = bool(_driver.call("cuDeviceCanAccessPeer", _driver.call("cuDeviceGet", device),
                                _driver.call("cuDeviceGet", peer)))
        _peer.reachable[(device, peer)] = hit
    return hit


def peer_enabled(device: int, peer: int) -> bool:
    """Whether cuda_memkit enabled (or found enabled) ``device``'s access to ``peer``'s memory."""
    hit = _peer.enabled.get((device, peer))
    return hit is not None and hit == (_primary.get(device), _primary.get(peer))


def enable_peer(device: int, peer: int) -> None:
    """Enable ``device``'s access to ``peer``'s memory between their primary contexts.

    ``CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`` is success (another library
    sharing the primary contexts may have enabled it).

    Raises
    ------
    CudaPeerAccessUnsupportedError
        Where ``cuDeviceCanAccessPeer`` says no, before any enabling call.
    """
    with _peer.LOCK:
        if peer_enabled(device, peer):
            return
        if not can_reach(device, peer):
            raise CudaPeerAccessUnsupportedError(
                PEER_ACCESS_UNSUPPORTED, "cuCtxEnablePeerAccess",
                "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
                f"device {device} cannot access device {peer}'s memory "
                "(cuDeviceCanAccessPeer): copies between them are staged through host memory")
        ctx, other = primary_context(device), primary_context(peer)
        with primary_pushed(device):
            try:
                _driver.call("cuCtxEnablePeerAccess", other, 0)
            except CudaError as exc:
                if exc.code != PEER_ACCESS_ALREADY_ENABLED:
                    raise
        _peer.enabled[(device, peer)] = (ctx, other)


def disable_peer(device: int, peer: int) -> None:
    """Disable ``device``'s access to ``peer``'s memory; not enabled is success."""
    with _peer.LOCK:
        other = primary_context(peer)
        with primary_pushed(device):
            try:
                _driver.call("cuCtxDisablePeerAccess", other)
            except CudaError as exc:
                if exc.code != PEER_ACCESS_NOT_ENABLED:
                    raise
        _peer.enabled.pop((device, peer), None)
        _peer.generation[0] += 1


def ensure_peer_access(device: int, peer: int) -> bool:
    """For copies: whether ``device`` reaches ``peer``'s context memory directly now.

    Enables it on first use where the settings allow (``auto``) and the
    hardware can; ``False`` leaves the copy to the driver's staged path.
    """
    if peer_enabled(device, peer):
        return True
    if not _peer.peer_access_settings().auto or not can_reach(device, peer):
        return False
    try:
        enable_peer(device, peer)
    except CudaError as exc:  # the hardware's answer: the copy is staged instead
        if exc.code not in (PEER_ACCESS_UNSUPPORTED, TOO_MANY_PEERS):
            raise
        return False
    return True


class Device:
    """A CUDA device, by ordinal.

    Parameters
    ----------
    ordinal : int
        ``0 <= ordinal < device_count()``.

    Raises
    ------
    TypeError
        If ``ordinal`` is not an int.
    ValueError
        If it is negative.
    CudaInvalidDeviceError
        If no such device exists.

    Examples
    --------
    >>> dev = Device(0)
    >>> free, total = dev.mem_info()
    >>> with dev:          # device 0's primary context is current inside
    ...     pass
    """

    __slots__ = ("__weakref__", "_attrs", "_handle", "_ordinal", "_saved")

    def __init__(self, ordinal: int = 0) -> None:
        self._ordinal = check_ordinal(ordinal)
        self._handle = _driver.call("cuDeviceGet", self._ordinal)
        self._attrs: dict[int, int] = {}
        self._saved = threading.local()  # .stack: this thread's contexts to restore

    @property
    def ordinal(self) -> int:
        """The device ordinal."""
        return self._ordinal

    def __int__(self) -> int:
        return self._ordinal

    def __index__(self) -> int:
        return self._ordinal

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other._ordinal == self._ordinal

    def __hash__(self) -> int:
        return hash(("Device", self._ordinal))

    def __repr__(self) -> str:
        return f"<Device {self._ordinal}>"

    # -- identity and memory -------------------------------------------------
    @property
    def name(self) -> str:
        """The device's name, e.g. ``"NVIDIA H100 80GB HBM3"``."""
        raw = _driver.call("cuDeviceGetName", 256, self._handle)
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        return text.split("\x00", 1)[0].strip()

    @property
    def total_memory(self) -> int:
        """Total device memory in bytes (``cuDeviceTotalMem``)."""
        return int(_driver.call("cuDeviceTotalMem", self._handle))

    def mem_info(self) -> tuple[int, int]:
        """Return ``(free, total)`` bytes of this device (``cuMemGetInfo``).

        Makes this device's primary context current on the calling thread.
        """
        ensure_context(self._ordinal)
        free, total = _driver.call("cuMemGetInfo")
        return int(free), int(total)

    # -- attributes ----------------------------------------------------------
    def attribute(self, attr: _cu.CUdevice_attribute | int) -> int:
        """Return a device attribute (``cuDeviceGetAttribute``), cached.

        Parameters
        ----------
        attr : CUdevice_attribute or int
            The attribute.

        Raises
        ------
        TypeError
            If ``attr`` is not a ``CUdevice_attribute`` or an int.
        """
        if isinstance(attr, bool) or not isinstance(attr, (int, _A)):
            raise TypeError(f"attr must be a CUdevice_attribute or an int, not "
                            f"{type(attr).__name__}")
        key = int(attr)
        value = self._attrs.get(key)
        if value is None:
            value = int(_driver.call("cuDeviceGetAttribute", _A(key), self._handle))
            self._attrs[key] = value
        return value

    @property
    def compute_capability(self) -> tuple[int, int]:
        """``(major, minor)`` compute capability."""
        return (
            self.attribute(_A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            self.attribute(_A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
        )

    def _flag(self, attr: _cu.CUdevice_attribute) -> bool:
        return bool(self.attribute(attr))

    @property
    def managed_memory(self) -> bool:
        """The device supports managed memory."""
        return self._flag(_A.CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY)

    @property
    def concurrent_managed_access(self) -> bool:
        """CPU and GPU may access managed memory concurrently (prefetch/advise work)."""
        return self._flag(_A.CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS)

    @property
    def pageable_memory_access(self) -> bool:
        """The device can access pageable host memory coherently."""
        return self._flag(_A.CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS)

    @property
    def memory_pools(self) -> bool:
        """Stream-ordered memory pools are supported."""
        return self._flag(_A.CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)

    @property
    def host_memory_pools(self) -> bool:
        """Pools located in (pinned) host memory are supported."""
        return self._flag(_A.CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED)

    @property
    def virtual_memory_management(self) -> bool:
        """The VMM API (``cuMemCreate``/``cuMemMap``) is supported."""
        return self._flag(_A.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)

    @property
    def host_register(self) -> bool:
        """``cuMemHostRegister`` is supported."""
        return self._flag(_A.CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED)

    @property
    def read_only_host_register(self) -> bool:
        """Read-only host registration is supported."""
        return self._flag(_A.CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED)

    @property
    def unified_addressing(self) -> bool:
        """The device shares a unified address space with the host."""
        return self._flag(_A.CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)

    @property
    def can_map_host_memory(self) -> bool:
        """Host memory can be mapped into the device's address space."""
        return self._flag(_A.CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY)

    @property
    def posix_fd_handles(self) -> bool:
        """POSIX file descriptors can be used as shareable (IPC) handles."""
        return self._flag(_A.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)

    def capabilities(self) -> dict[str, bool]:
        """Return every capability flag above by name (for reports)."""
        return {
            name: bool(getattr(self, name))
            for name in (
                "managed_memory",
                "concurrent_managed_access",
                "pageable_memory_access",
                "memory_pools",
                "host_memory_pools",
                "virtual_memory_management",
                "host_register",
                "read_only_host_register",
                "unified_addressing",
                "can_map_host_memory",
                "posix_fd_handles",
            )
        }

    def can_access_peer(self, peer: Device | int) -> bool:
        """Whether this device can access memory of device ``peer``.

        Parameters
        ----------
        peer : int or Device
            The device whose memory would be accessed (``cuDeviceCanAccessPeer``).
        """
        other = Device(peer) if not isinstance(peer, Device) else peer
        return bool(_driver.call("cuDeviceCanAccessPeer", self._handle, other._handle))

    def enable_peer_access(self, peer: Device | int) -> None:
        """Let this device access device ``peer``'s memory directly (``cuCtxEnablePeerAccess``).

        Enables it between the two devices' primary contexts, in one direction:
        this device's kernels and copies may then read and write ``peer``'s
        context memory (:class:`~cuda_memkit.DeviceBuffer`, ``cuMemAlloc``)
        over NVLink or PCIe, instead of the driver staging copies through host
        memory. Enabling what is enabled is success, so is enabling what
        another library (PyTorch, CuPy) enabled in the same primary contexts;
        the call is thread-safe. Copies enable it by themselves where
        :func:`~cuda_memkit.configure_peer_access` allows (the default).

        Pool and mapped memory are not affected: they follow their own grants
        (``MemoryPool(..., peers=[...])``, :meth:`MemoryPool.set_access
        <cuda_memkit.MemoryPool.set_access>`, ``GrowableBuffer(..., peers=[...])``,
        :meth:`Mapping.set_access <cuda_memkit.Mapping.set_access>`).

        Parameters
        ----------
        peer : int or Device
            The other device.

        Raises
        ------
        TypeError
            If ``peer`` is not an int or a :class:`Device`.
        ValueError
            If ``peer`` is this device or does not exist (before any enabling call).
        CudaPeerAccessUnsupportedError
            If the devices cannot access each other's memory
            (:meth:`can_access_peer` is false).

        Examples
        --------
        >>> if cm.device_count() > 1 and cm.Device(0).can_access_peer(1):
        ...     cm.Device(0).enable_peer_access(1)
        ...     cm.Device(0).peer_access_enabled(1)
        ... else:
        ...     True
        True
        """
        enable_peer(self._ordinal, peer_ordinal(self._ordinal, peer))

    def disable_peer_access(self, peer: Device | int) -> None:
        """End this device's direct access to device ``peer``'s memory (``cuCtxDisablePeerAccess``).

        Disabling what is not enabled is success. Copies issued afterwards
        between the two are staged by the driver (or enable it again, where
        :func:`~cuda_memkit.configure_peer_access` has ``auto`` on). Finish the
        work that uses the access first: a kernel reading ``peer``'s memory
        when the access is gone faults.

        Parameters
        ----------
        peer : int or Device
            The other device.

        Raises
        ------
        TypeError, ValueError
            As for :meth:`enable_peer_access`.
        """
        disable_peer(self._ordinal, peer_ordinal(self._ordinal, peer))

    def peer_access_enabled(self, peer: Device | int) -> bool:
        """Whether this device has direct access to device ``peer``'s memory.

        What cuda_memkit enabled (or found enabled) between the primary
        contexts; the driver has no query of its own.

        Parameters
        ----------
        peer : int or Device
            The other device.

        Raises
        ------
        TypeError, ValueError
            As for :meth:`enable_peer_access`.
        """
        return peer_enabled(self._ordinal, peer_ordinal(self._ordinal, peer))

    # -- context -------------------------------------------------------------
    def set_current(self) -> None:
        """Make this device's primary context current on the calling thread."""
        ensure_context(self._ordinal)

    def synchronize(self) -> None:
        """Wait for all work on this device (``cuCtxSynchronize``), then run :data:`sync_hooks`."""
        ensure_context(self._ordinal)
        _driver.call("cuCtxSynchronize")
        for hook in sync_hooks:
            hook()

    def __enter__(self) -> Device:
        prev = int(_driver.call("cuCtxGetCurrent"))
        ensure_context(self._ordinal)  # switch first: nothing to restore if it fails
        saved = self._saved
        try:
            stack: list[int] = saved.stack
        except AttributeError:  # first use on this thread
            stack = saved.stack = []
        stack.append(prev)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        prev = self._saved.stack.pop()
        if exc_type is None:
            _driver.call("cuCtxSetCurrent", prev)
            return
        try:
            _driver.call("cuCtxSetCurrent", prev)
        except CudaError as err:  # never replace the exception in flight
            warn_exit_failed(self, err)


# -- streams -------------------------------------------------------------------


@contextlib.contextmanager
def forked_stream(stream: int) -> Iterator[int]:
    """A private non-blocking stream whose work is ordered as if it went to ``stream``.

    The private stream waits for the work already on ``stream`` (an event);
    on leaving the block, ``stream`` waits for the private stream's work (the
    same event, recorded again), also when the block raised, since work it
    issued before the error is in flight. The stream and the event are
    destroyed at once; the driver releases them when their work is done.
    """
    call = _driver.call
    ev = call("cuEventCreate", EVENT_DISABLE_TIMING)
    try:
        call("cuEventRecord", ev, stream)
        private = int(call("cuStreamCreate", STREAM_NON_BLOCKING))
        try:
            call("cuStreamWaitEvent", private, ev, 0)
            try:
                yield private
            finally:
                call("cuEventRecord", ev, private)
                call("cuStreamWaitEvent", stream, ev, 0)
        finally:
            call("cuStreamDestroy", private)
    finally:
        call("cuEventDestroy", ev)


StreamLike = Union["Stream", int, None, Any]
"""What every ``stream=`` argument accepts: a :class:`Stream`, an int handle,
``None`` (the legacy default stream), an object with ``__cuda_stream__``
(cuda.core, CuPy >= 13), or one with an int ``.cuda_stream`` (torch) or
``.ptr`` (older CuPy)."""



class Stream(Resource):
    """A CUDA stream.

    Parameters
    ----------
    device : Device or int, optional
        Device the stream belongs to; default: the current context's device
        (device 0 when there is none).
    non_blocking : bool, default True
        ``CU_STREAM_NON_BLOCKING``: no implicit synchronisation with the
        legacy default stream.
    priority : int, default 0
        Stream priority (lower numbers are higher priority).

    Notes
    -----
    ``Stream.from_handle(h)`` wraps a stream someone else owns; closing such
    a wrapper never destroys the stream.
    """

    _share_hint = ("share the Stream object itself, or wrap its handle without owning it "
                   "(Stream.from_handle(stream.handle))")

    #: The typed handle (``CUstream``) for driver calls that want one, made
    #: once; ``None`` once closed. The pool allocation path reads it, both as
    #: the handle and as the closed test (``_state``, which has a class
    #: default, is a slower generic attribute load).
    _custream: Any
    #: Held by ``close()`` to set ``_custream`` to ``None``, and by a release that
    #: frees memory on the stream from reading ``_custream`` to the driver call:
    #: a stream is never destroyed between the two (freeing on a destroyed
    #: stream handle can crash the process).
    release_lock: threading.Lock

    def __init__(
        self, device: Device | int | None = None, *, non_blocking: bool = True, priority: int = 0
    ) -> None:
        if not isinstance(non_blocking, bool):
            raise TypeError("non_blocking must be a bool")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError("priority must be an int")
        ordinal = ensure_context(None if device is None else check_ordinal(device))
        flags = 1 if non_blocking else 0
        handle = int(_driver.call("cuStreamCreateWithPriority", flags, priority))
        self._handle = handle
        self.release_lock = threading.Lock()
        self._custream = _cu.CUstream(handle)
        self._device = ordinal
        self._owned = True
        self._open(make_finalizer(self, f"stream 0x{handle:x}", _destroy_stream, handle))

    @classmethod
    def from_handle(cls, handle: int) -> Stream:
        """Wrap an existing stream handle without taking ownership.

        Parameters
        ----------
        handle : int
            A ``CUstream`` handle as an int (``0``, ``CU_STREAM_LEGACY`` and
            ``CU_STREAM_PER_THREAD`` included); closing the wrapper never
            destroys it.
        """
        if isinstance(handle, bool) or not isinstance(handle, int):
            raise TypeError(f"a stream handle must be an int, not {type(handle).__name__}")
        handle = u64(handle, "a stream handle")
        self = cls.__new__(cls)
        self._handle = handle
        self.release_lock = threading.Lock()
        self._custream = _cu.CUstream(handle)
        self._device = -1
        self._owned = False
        self._open(None)
        return self

    @classmethod
    def legacy_default(cls) -> Stream:
        """The legacy default stream (``CU_STREAM_LEGACY``)."""
        return cls.from_handle(STREAM_LEGACY)

    @property
    def handle(self) -> int:
        """The ``CUstream`` handle as an int."""
        self._check_open()
        return self._handle

    @property
    def owned(self) -> bool:
        """Whether closing this object destroys the stream."""
        return self._owned

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)

    def close(self) -> None:
        """Destroy the stream (if owned) and close the object; calling it again does nothing.

        Memory that block caches hold for the stream goes back to its pool
        first (:data:`stream_close_hooks`). A release of memory on the stream
        running on another thread finishes its driver call first (or frees
        as after the close).
        """
        lock = self.__dict__.get("release_lock")
        if lock is None:  # never fully made
            self._custream = None
        else:
            with lock:
                self._custream = None
        super().close()

    def synchronize(self) -> None:
        """Wait until all work queued on the stream has finished.

        The operands that asynchronous copies kept alive until now are let go here
        (:data:`sync_hooks`), so a buffer dropped after the copy is freed at once.
        """
        _driver.call("cuStreamSynchronize", self.handle)
        for hook in sync_hooks:
            hook()

    def query(self) -> bool:
        """Return ``True`` if all queued work has finished, ``False`` if not."""
        try:
            _driver.call("cuStreamQuery", self.handle)
        except CudaError as exc:
            if exc.code == int(_cu.CUresult.CUDA_ERROR_NOT_READY):
                return False
            raise
        return True

    # -- capture into a CUDA graph (cuda_memkit._core._capture) --------------------------
    def begin_capture(self, mode: str = "global") -> None:
        """Begin capturing the work issued on this stream into a CUDA graph.

        The work is recorded, not run, until :meth:`end_capture`. Memory
        cuda_memkit allocates on this stream during the capture belongs to
        the graph (see :class:`Graph`).

        Parameters
        ----------
        mode : {"global", "thread_local", "relaxed"}
            ``cuStreamBeginCapture``'s mode: which calls other threads (or
            this one) may make while the capture is under way.
        """
        self._check_open()
        _capture.begin_capture(self._custream, mode)

    def end_capture(self) -> _capture.Graph:
        """End the capture and return the instantiated :class:`Graph`."""
        self._check_open()
        return _capture.end_capture(self._custream)

    @property
    def is_capturing(self) -> bool:
        """Whether the stream captures into a graph now (``cuStreamIsCapturing``)."""
        self._check_open()
        return _capture.is_capturing(self._custream)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"0x{self._handle:x}"
        return f"<Stream {state}{'' if self._owned else ' (borrowed)'}>"


#: Called with an owned stream's int handle just before it is destroyed (``close()`` or
#: collection): the block caches of ``cuda_memkit._pools._cache`` register here, so that
#: memory freed on the stream goes back to its pool while the stream still exists
#: (a plug-in point, so that this layer imports nothing above it).
stream_close_hooks: list[Callable[[int], None]] = []

#: Called after ``Stream.synchronize()`` and ``Device.synchronize()``: the copy operands
#: module registers its reaper here, so that the operands an asynchronous copy held are
#: let go as soon as the user waited for it (a plug-in point, like the close hooks).
sync_hooks: list[Callable[[], None]] = []


def _destroy_stream(handle: int) -> None:
    """Release function of an owned Stream: the close hooks, then ``cuStreamDestroy``."""
    try:
        for hook in list(stream_close_hooks):
            hook(handle)
    finally:
        driver_release("cuStreamDestroy", handle)


def stream_handle(stream: StreamLike) -> int:
    """Return the int ``CUstream`` handle of anything a ``stream=`` argument accepts.

    Raises
    ------
    TypeError
        For objects that are not streams.
    ClosedError
        For a closed :class:`Stream`.
    """
    if stream is None:
        return 0
    if type(stream) is Stream:
        return stream.handle
    if isinstance(stream, bool):
        raise TypeError("a stream cannot be a bool")
    if isinstance(stream, int):
        if stream < 0 or stream > MAX_U64:
            u64(stream, "a stream handle")  # raises the ValueError naming it
        return int(stream)
    if isinstance(stream, Stream):
        return stream.handle
    if isinstance(stream, _cu.CUstream):
        return int(stream)
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        value = proto() if callable(proto) else proto
        if isinstance(value, tuple) and len(value) == 2:
            return u64(value[1], "a stream handle")
        raise TypeError("__cuda_stream__ must return a (version, handle) tuple")
    for attr in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return u64(value, "a stream handle")
    raise TypeError(
        f"expected a stream (Stream, int handle, None, or an object with __cuda_stream__ "
        f"or .cuda_stream), not {type(stream).__name__}"
    )


# -- typed stream handles kept with the object they came from ---------------------------

_CUSTREAMS: dict[int, Any] = {}  # int handle -> CUstream


def custream(stream: StreamLike) -> Any:
    """Return the cached ``CUstream`` for anything a ``stream=`` argument accepts."""
    h = stream_handle(stream)
    cs = _CUSTREAMS.get(h)
    if cs is None:
        if len(_CUSTREAMS) >= 1024:
            _CUSTREAMS.clear()
        cs = _CUSTREAMS[h] = _cu.CUstream(h)
    return cs


class StreamRef:
    """What a buffer holds for a stream given as anything but a :class:`Stream`.

    It carries the ``CUstream`` as ``_custream``, the attribute a
    :class:`Stream` carries too, so a buffer reads its stream (and, for a
    ``Stream``, whether it was closed: ``None``) with one attribute load
    whatever it was given; ``obj`` keeps a stream object (CuPy, torch,
    cuda.core) alive as long as the buffer.
    """

    __slots__ = ("_custream", "obj")

    def __init__(self, cus: Any, obj: object) -> None:
        self._custream = cus
        self.obj = obj


def stream_destroyed(sref: Stream | StreamRef) -> bool:
    """Whether ``sref`` is a :class:`Stream` destroyed by its collection, ``_custream`` still set.

    A buffer and the Stream it was allocated on can be collected in one
    garbage cycle: the Stream's finalizer (a weakref callback) then runs
    before the buffer's ``__del__`` and destroys the stream, but leaves the
    object as it was. The buffer must not hand that handle to the driver (a
    destroyed stream handle is an error at best): it frees as if the stream
    had been closed.
    """
    fin = sref._finalizer if isinstance(sref, Stream) else None
    return fin is not None and not fin.alive


_HANDLE_REFS: dict[int, StreamRef] = {}  # int handles (and None): one shared StreamRef each


def buffer_stream(stream: StreamLike) -> Stream | StreamRef:
    """The object a buffer allocated on ``stream`` holds (its ``_custream`` set).

    Raises ClosedError for a closed :class:`Stream`.
    """
    if isinstance(stream, Stream):
        if stream._custream is None:
            stream._check_open()  # raises
        return stream
    if stream is None or type(stream) is int:
        ref = _HANDLE_REFS.get(stream)  # type: ignore[arg-type]
        if ref is None:
            if len(_HANDLE_REFS) >= 1024:
                _HANDLE_REFS.clear()
            ref = _HANDLE_REFS[stream] = StreamRef(custream(stream), None)  # type: ignore[index]
        return ref
    return StreamRef(custream(stream), stream)


# -- locations -----------------------------------------------------------------


class LocationType(enum.IntEnum):
    """Kinds of memory location (values of ``CUmemLocationType``)."""

    DEVICE = 1
    HOST = 2
    HOST_NUMA = 3
    HOST_NUMA_CURRENT = 4


@dataclass(frozen=True)
class Location:
    """Where memory lives or should go: a device, the host, or a host NUMA node.

    Build with :meth:`device`, :meth:`host`, :meth:`host_numa` or
    :meth:`host_numa_current`; a :class:`Device` or an int device ordinal is
    accepted wherever a location is.
    """

    type: LocationType
    id: int = 0

    def __post_init__(self) -> None:
        t = self.type
        if type(t) is not LocationType:
            if isinstance(t, bool) or not isinstance(t, int):
                raise TypeError(f"Location type must be a LocationType, not {type(t).__name__}")
            try:
                t = LocationType(t)
            except ValueError:
                raise ValueError(f"unknown location type {t!r}; use a LocationType") from None
            object.__setattr__(self, "type", t)  # frozen
        i = self.id
        if isinstance(i, bool) or not isinstance(i, int):
            raise TypeError(f"Location id must be an int, not {type(i).__name__}")
        if i < 0:
            raise ValueError(f"Location id must be >= 0, got {i}")
        if i > MAX_ORDINAL:  # CUmemLocation.id is a C int: never an OverflowError later
            raise ValueError(f"Location id {i} is past the largest the driver takes "
                             "(2**31 - 1)")
        if type(i) is not int:
            object.__setattr__(self, "id", int(i))  # numpy ints, IntEnums: a plain int

    @classmethod
    def device(cls, ordinal: Device | int) -> Location:
        """Device ``ordinal``."""
        return cls(LocationType.DEVICE, check_ordinal(ordinal))

    @classmethod
    def host(cls) -> Location:
        """The host (any NUMA node)."""
        return cls(LocationType.HOST, 0)

    @classmethod
    def host_numa(cls, node: int) -> Location:
        """Host NUMA node ``node``."""
        return cls(LocationType.HOST_NUMA, check_ordinal(node, "NUMA node"))

    @classmethod
    def host_numa_current(cls) -> Location:
        """The NUMA node of the calling thread's CPU."""
        return cls(LocationType.HOST_NUMA_CURRENT, 0)

    @property
    def is_host(self) -> bool:
        """Whether this is a host location (any kind)."""
        return self.type is not LocationType.DEVICE

    def to_cu(self) -> _cu.CUmemLocation:
        """Return the ``CUmemLocation`` struct for driver calls."""
        loc = _cu.CUmemLocation()
        loc.type = _cu.CUmemLocationType(int(self.type))
        loc.id = self.id
        return loc

    @classmethod
    def from_cu(cls, loc_type: int, loc_id: int) -> Location | None:
        """Build from a ``(CUmemLocationType, id)`` pair; ``None`` for INVALID/NONE."""
        try:
            kind = LocationType(int(loc_type))
        except ValueError:
            return None
        if int(loc_id) < 0 and kind not in (LocationType.HOST, LocationType.HOST_NUMA_CURRENT):
            return None  # not a location (e.g. an invalid device)
        return cls(kind, 0 if kind in (LocationType.HOST, LocationType.HOST_NUMA_CURRENT)
                   else int(loc_id))

    def __str__(self) -> str:
        if self.type is LocationType.DEVICE:
            return f"device {self.id}"
        if self.type is LocationType.HOST:
            return "host"
        if self.type is LocationType.HOST_NUMA:
            return f"host NUMA {self.id}"
        return "host NUMA (current)"


LocationLike = Location | Device | int


def as_location(where: LocationLike) -> Location:
    """Convert a :class:`Location`, :class:`Device` or device ordinal to a Location."""
    if isinstance(where, Location):
        return where
    if isinstance(where, Device):
        return Location(LocationType.DEVICE, where.ordinal)
    if isinstance(where, int) and not isinstance(where, bool):
        return Location.device(where)
    raise TypeError(
        f"expected a Location, Device or device ordinal, not {type(where).__name__}"
    )


# The capture module cannot import this one (this one imports it): it gets these here.
_capture.stream_of = lambda stream: custream(stream)
_capture.primary = primary_pushed
