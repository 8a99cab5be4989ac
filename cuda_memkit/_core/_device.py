"""Devices: the Device resource and the checks of arguments that name devices."""

from __future__ import annotations

import threading
from collections.abc import Callable

from cuda.bindings import driver as _cu

from . import _driver
from ._checks import check_int
from ._context import ensure_context
from ._errors import CudaError
from ._peer import can_reach, disable_peer, enable_peer, peer_enabled
from ._resource import warn_exit_failed

__all__ = [
    "Device",
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
    if isinstance(ordinal, Device):
        return ordinal.ordinal
    ordinal = check_int(ordinal, what, "an int ordinal or a Device")
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


# -- a peer argument (the state and the driver calls are in _peer) -------------------------


def peer_ordinal(device: int, peer: object) -> int:
    """``peer`` checked for :class:`Device`'s peer-access methods: an existing other device."""
    other = existing_ordinal(peer, "peer")
    if other == device:
        raise ValueError(f"device {device} is not a peer of itself: a device always accesses "
                         "its own memory")
    return other


#: Called after ``Stream.synchronize()`` and ``Device.synchronize()``: the copy operands
#: module registers its reaper here, so that the operands an asynchronous copy held are
#: let go as soon as the user waited for it (a plug-in point, like the close hooks).
sync_hooks: list[Callable[[], None]] = []


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
        key = int(attr) if isinstance(attr, _A) else check_int(
            attr, "attr", "a CUdevice_attribute or an int")
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
            The device whose memory would be accessed (``cuDeviceCanAccessPeer``,
            asked once per pair: the answer never changes).
        """
        other = Device(peer) if not isinstance(peer, Device) else peer
        return can_reach(self._ordinal, other._ordinal)

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
