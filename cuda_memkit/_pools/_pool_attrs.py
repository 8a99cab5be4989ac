"""Attributes, statistics and access of a memory pool (``cuMemPoolGet/SetAttribute``, ...).

:class:`PoolAttributes` is the part of :class:`~cuda_memkit.MemoryPool` that
reads and sets the driver pool's attributes: the release threshold, the
reuse policies, the size limit, the statistics (:class:`PoolStats`), trimming
and which devices may access the memory. It works on the pool's
``CUmemoryPool`` (``_cu``) and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from cuda.bindings import driver as _cu

from .._core import _driver
from .._core._access import Access, access_descs, check_access, check_targets
from .._core._checks import check_index
from .._core._location import Location, LocationLike, check_exists, to_location

__all__ = ["PoolAttributes", "PoolStats"]

_A = _cu.CUmemPool_attribute
_U64_MAX = (1 << 64) - 1


class PoolStats(NamedTuple):
    """Memory statistics of a pool in bytes (:meth:`MemoryPool.stats`).

    ``reserved_*``: backing memory the pool holds (the H100 maps it in 32 MiB
    chunks); ``used_*``: bytes of live allocations. ``*_high`` are the high
    watermarks since creation or :meth:`MemoryPool.reset_peaks`.
    """

    reserved_current: int
    reserved_high: int
    used_current: int
    used_high: int




def check_threshold(value: object) -> int:
    """A release threshold: an int in ``[0, 2**64)``."""
    v = check_index(value, "release_threshold")
    if not 0 <= v <= _U64_MAX:
        raise ValueError(f"release_threshold must be in [0, 2**64), got {v}")
    return v


class PoolAttributes:
    """Attribute, statistics and access methods of :class:`~cuda_memkit.MemoryPool`."""

    _cu: Any  # the CUmemoryPool
    _caches: list[Any]  # caches in front of the pool: cleared by trim()
    _max_size: int  # as requested, rounded up to whole chunks
    _device: int | None  # the device holding the memory (None: host, managed, imported)

    if TYPE_CHECKING:
        def _check_open(self) -> None: ...  # Resource's

    # -- attributes ------------------------------------------------------------------
    def _get(self, attr: _cu.CUmemPool_attribute) -> int:
        self._check_open()
        return int(_driver.call("cuMemPoolGetAttribute", self._cu, attr))

    def _set(self, attr: _cu.CUmemPool_attribute, value: Any) -> None:
        self._check_open()
        _driver.call("cuMemPoolSetAttribute", self._cu, attr, value)

    @property
    def release_threshold(self) -> int:
        """Unused bytes kept when a stream, event or context is synchronized (get/set).

        Above it, the driver returns whole unused chunks to the system at the
        next synchronization. New and default pools start at 0.
        """
        return self._get(_A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)

    @release_threshold.setter
    def release_threshold(self, value: int) -> None:
        self._set(_A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, _cu.cuuint64_t(check_threshold(value)))

    def _set_flag(self, attr: _cu.CUmemPool_attribute, value: object) -> None:
        if not isinstance(value, (bool, int)) or value not in (0, 1):
            raise TypeError(f"expected a bool, not {value!r}")
        self._set(attr, int(value))

    @property
    def reuse_follow_event_dependencies(self) -> bool:
        """Reuse memory freed on another stream when an event orders the two (get/set)."""
        return bool(self._get(_A.CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES))

    @reuse_follow_event_dependencies.setter
    def reuse_follow_event_dependencies(self, value: bool) -> None:
        self._set_flag(_A.CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, value)

    @property
    def reuse_allow_opportunistic(self) -> bool:
        """Reuse memory whose free has already completed, without ordering (get/set)."""
        return bool(self._get(_A.CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC))

    @reuse_allow_opportunistic.setter
    def reuse_allow_opportunistic(self, value: bool) -> None:
        self._set_flag(_A.CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, value)

    @property
    def reuse_allow_internal_dependencies(self) -> bool:
        """Let the driver add stream dependencies to reuse freed memory (get/set)."""
        return bool(self._get(_A.CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES))

    @reuse_allow_internal_dependencies.setter
    def reuse_allow_internal_dependencies(self, value: bool) -> None:
        self._set_flag(_A.CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, value)

    @property
    def max_size(self) -> int:
        """Most bytes the pool may reserve, in whole 32 MiB chunks; 0: no limit (read-only)."""
        try:
            return self._get(_A.CU_MEMPOOL_ATTR_MAX_POOL_SIZE)
        except TypeError:  # cuda-bindings < 13.4 cannot read this attribute
            return self._max_size

    def stats(self) -> PoolStats:
        """Return reserved and used memory and their high watermarks, as the driver counts them.

        The driver counts a block a cache in front of the pool holds
        (``cache=True``, ``HostBuffer.pooled``, the adaptors) as used: it was
        never freed to the pool. What users hold and what the caches hold are
        in :func:`cuda_memkit.memory_stats` (``current`` and ``cached``) and
        :attr:`MemoryPool.cached_bytes`.
        """
        return PoolStats(
            self._get(_A.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
            self._get(_A.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH),
            self._get(_A.CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
            self._get(_A.CU_MEMPOOL_ATTR_USED_MEM_HIGH),
        )

    def reset_peaks(self) -> None:
        """Reset both high watermarks to the current values."""
        zero = _cu.cuuint64_t(0)
        self._set(_A.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, zero)
        self._set(_A.CU_MEMPOOL_ATTR_USED_MEM_HIGH, zero)

    def trim(self, keep_bytes: int = 0) -> None:
        """Return unused memory to the system, keeping at least ``keep_bytes`` reserved.

        The caches in front of the pool are emptied first (``empty_cache()``).

        Only whole unused 32 MiB chunks go; memory of frees the host has not
        seen complete may still count as used, so synchronize first.

        Parameters
        ----------
        keep_bytes : int, default 0
            Bytes to keep reserved, in ``[0, 2**64)``.

        Raises
        ------
        TypeError, ValueError
            For a non-int or out-of-range ``keep_bytes`` (before the driver call).
        ClosedError
            If the pool is closed.
        """
        keep = check_index(keep_bytes, "keep_bytes")
        if not 0 <= keep < 1 << 64:
            raise ValueError(f"keep_bytes must be in [0, 2**64), got {keep}")
        self._check_open()
        for cache in self._caches:
            cache.clear()
        _driver.call("cuMemPoolTrimTo", self._cu, keep)

    # -- access ------------------------------------------------------------------------
    def set_access(self, device: LocationLike | Iterable[LocationLike], access: Access) -> None:
        """Grant or revoke devices' access to the pool's memory (``cuMemPoolSetAccess``).

        Parameters
        ----------
        device : Device, int, Location, or an iterable of them
            The device(s): peers of a device pool's own device, or any device
            for a pinned host pool.
        access : Access
            ``Access.READWRITE`` or ``Access.NONE`` (the H100 refuses
            ``READ`` with ``CudaNotSupportedError``, and revoking the owning
            device's access with ``CudaInvalidDeviceError``).

        Raises
        ------
        TypeError, ValueError
            For a bad location or access, or a device that does not exist
            (before the driver call).
        CudaPeerAccessUnsupportedError
            Granting a device that cannot access a device pool's memory
            (``cuDeviceCanAccessPeer``), before the driver call.
        """
        flags = check_access(access)
        locs = check_targets(device, flags, self._device, "device")
        self._check_open()
        self._grant(locs, flags)

    def _grant(self, locs: list[Location], flags: Access) -> None:
        """``cuMemPoolSetAccess`` for ``locs``, checked by the caller."""
        descs = access_descs(locs, flags)
        _driver.call("cuMemPoolSetAccess", self._cu, descs, len(descs))

    def access(self, device: LocationLike) -> Access:
        """Return the access ``device`` (or a host location) has to the pool's memory.

        Parameters
        ----------
        device : Device, int or Location
            Whose access to read (``cuMemPoolGetAccess``).

        Returns
        -------
        Access

        Raises
        ------
        TypeError, ValueError
            For a bad location or a device that does not exist (before the
            driver call).
        """
        loc = check_exists(to_location(device))
        self._check_open()
        flags = int(_driver.call("cuMemPoolGetAccess", self._cu, loc.to_cu()))
        return Access(flags)

