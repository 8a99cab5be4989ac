"""Peer access between devices: what cuda_memkit enabled, and whether copies enable it.

A device reads and writes another device's context memory (``cuMemAlloc``,
:class:`~cuda_memkit.DeviceBuffer`) directly only once peer access is enabled
from its context to the other's (``cuCtxEnablePeerAccess``, one direction at
a time); until then the driver copies between the two through host memory,
an order of magnitude slower (two NVLink H200s: 38 against 380 GB/s, see
docs/decisions.md). The driver has no query for it, so this module keeps
what was enabled, per ordered pair of devices, with the two primary contexts
it was enabled between: a primary context reset by another library makes the
entry stale, and the next use enables it again. :class:`~cuda_memkit.Device`
(``_device``) makes the driver calls; this module holds only the state.

Pool and mapped (VMM) memory follow their own grants (``cuMemPoolSetAccess``,
``cuMemSetAccess``), never this state.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

__all__ = [
    "LOCK",
    "PeerAccessSettings",
    "configure_peer_access",
    "enabled",
    "forget",
    "generation",
    "peer_access_settings",
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
