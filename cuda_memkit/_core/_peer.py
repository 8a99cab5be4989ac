"""Peer access between devices: what cuda_memkit enabled, and whether copies enable it.

A device reads and writes another device's context memory (``cuMemAlloc``,
:class:`~cuda_memkit.DeviceBuffer`) directly only once peer access is enabled
from its context to the other's (``cuCtxEnablePeerAccess``, one direction at a
time); until then the driver copies between the two through host memory, an
order of magnitude slower on two NVLink H200s (docs/decisions.md). The driver
has no query for it, so this module keeps what was enabled, per ordered pair
of devices, with the two primary contexts it was enabled between: a primary
context reset by another library makes the entry stale, and the next use
enables it again. This module holds that state and makes the driver calls that
change it; :class:`~cuda_memkit.Device`'s peer methods and the copies call
them.

Pool and mapped (VMM) memory follow their own grants (``cuMemPoolSetAccess``,
``cuMemSetAccess``), never this state.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

from . import _driver
from ._constants import (
    PEER_ACCESS_ALREADY_ENABLED,
    PEER_ACCESS_NOT_ENABLED,
    PEER_ACCESS_UNSUPPORTED,
    TOO_MANY_PEERS,
)
from ._context import primary_context, primary_pushed, retained_context
from ._errors import CudaError, CudaPeerAccessUnsupportedError

__all__ = [
    "LOCK",
    "PeerAccessSettings",
    "can_reach",
    "configure_peer_access",
    "disable_peer",
    "enable_peer",
    "enabled",
    "ensure_peer_access",
    "forget",
    "generation",
    "peer_access_settings",
    "peer_enabled",
    "reachable",
]


@dataclass(frozen=True)
class PeerAccessSettings:
    """Whether copies enable peer access by themselves (see :func:`configure_peer_access`).

    Attributes
    ----------
    auto : bool
        A copy between the context memory of two devices that can reach each
        other (:func:`~cuda_memkit.copy`, :func:`~cuda_memkit.copy_async`,
        :func:`~cuda_memkit.copy_batch`, :class:`~cuda_memkit.CopyBatch`, their
        kernel path included) enables peer access between them on first use,
        as PyTorch does. ``False``: copies use peer access only where
        :meth:`Device.enable_peer_access <cuda_memkit.Device.enable_peer_access>`
        enabled it; the others are staged by the driver, and the kernel path
        leaves such pairs to the driver (or refuses them with
        ``method="kernel"``).
    """

    auto: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.auto, bool):
            raise TypeError(f"auto must be a bool, not {type(self.auto).__name__}")


_settings = PeerAccessSettings()

#: Held while peer access of any pair changes (and while the table is read for it).
LOCK = threading.RLock()
#: ``(device, peer) -> (device's primary context, peer's primary context)`` of the
#: directions enabled: ``device`` may access ``peer``'s memory.
enabled: dict[tuple[int, int], tuple[int, int]] = {}
#: ``(device, peer) -> cuDeviceCanAccessPeer``'s answer (it never changes).
reachable: dict[tuple[int, int], bool] = {}
#: ``generation[0]`` grows at every disable: whoever remembered a pair as enabled
#: (a prebuilt :class:`~cuda_memkit.CopyBatch`'s kernel pick) asks again.
generation = [0]


def peer_access_settings() -> PeerAccessSettings:
    """Return the current peer-access settings.

    Returns
    -------
    PeerAccessSettings
    """
    return _settings


def configure_peer_access(*, auto: bool) -> PeerAccessSettings:
    """Set whether copies between two devices enable peer access on first use.

    Parameters
    ----------
    auto : bool
        ``True`` (the default setting): a copy between the memory of two
        devices that can reach each other enables peer access between them
        the first time (as PyTorch's ``copy_`` does), so that it runs over
        NVLink or PCIe peer-to-peer. ``False``: only peer access enabled with
        :meth:`Device.enable_peer_access <cuda_memkit.Device.enable_peer_access>`
        is used; other cross-device copies are staged by the driver through
        host memory (correct, an order of magnitude slower).

    Returns
    -------
    PeerAccessSettings
        The new settings.

    Raises
    ------
    TypeError
        If ``auto`` is not a bool (the settings stay as they were).

    Notes
    -----
    Turning ``auto`` off disables nothing already enabled: use
    :meth:`Device.disable_peer_access <cuda_memkit.Device.disable_peer_access>`.
    """
    global _settings
    _settings = replace(_settings, auto=auto)
    return _settings


def forget() -> None:
    """Forget every pair (the simulated machine, and its contexts, were replaced)."""
    with LOCK:
        enabled.clear()
        reachable.clear()
        generation[0] += 1


_driver.reset_hooks.append(forget)


def can_reach(device: int, peer: int) -> bool:
    """``cuDeviceCanAccessPeer(device, peer)``, asked once per pair."""
    hit = reachable.get((device, peer))
    if hit is None:
        hit = bool(_driver.call("cuDeviceCanAccessPeer", _driver.call("cuDeviceGet", device),
                                _driver.call("cuDeviceGet", peer)))
        reachable[(device, peer)] = hit
    return hit


def peer_enabled(device: int, peer: int) -> bool:
    """Whether cuda_memkit enabled (or found enabled) ``device``'s access to ``peer``'s memory."""
    hit = enabled.get((device, peer))
    return hit is not None and hit == (retained_context(device), retained_context(peer))


def enable_peer(device: int, peer: int) -> None:
    """Enable ``device``'s access to ``peer``'s memory between their primary contexts.

    ``CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`` is success (another library
    sharing the primary contexts may have enabled it).

    Raises
    ------
    CudaPeerAccessUnsupportedError
        Where ``cuDeviceCanAccessPeer`` says no, before any enabling call.
    """
    with LOCK:
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
        enabled[(device, peer)] = (ctx, other)


def disable_peer(device: int, peer: int) -> None:
    """Disable ``device``'s access to ``peer``'s memory; not enabled is success."""
    with LOCK:
        other = primary_context(peer)
        with primary_pushed(device):
            try:
                _driver.call("cuCtxDisablePeerAccess", other)
            except CudaError as exc:
                if exc.code != PEER_ACCESS_NOT_ENABLED:
                    raise
        enabled.pop((device, peer), None)
        generation[0] += 1


def ensure_peer_access(device: int, peer: int) -> bool:
    """For copies: whether ``device`` reaches ``peer``'s context memory directly now.

    Enables it on first use where the settings allow (``auto``) and the
    hardware can; ``False`` leaves the copy to the driver's staged path.
    """
    if peer_enabled(device, peer):
        return True
    if not peer_access_settings().auto or not can_reach(device, peer):
        return False
    try:
        enable_peer(device, peer)
    except CudaError as exc:  # the hardware's answer: the copy is staged instead
        if exc.code not in (PEER_ACCESS_UNSUPPORTED, TOO_MANY_PEERS):
            raise
        return False
    return True
