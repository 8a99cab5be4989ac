"""Simulated peer access between contexts of two devices.

``cuCtxEnablePeerAccess`` / ``cuCtxDisablePeerAccess`` keep, per ordered pair
of contexts (the current one, the peer), whether the current context's device
may access the peer's context memory directly; ``cuDeviceGetP2PAttribute``
answers as two NVLink H200s did. (``cuMemcpyPeer`` / ``cuMemcpyPeerAsync`` are
with the other copies, in ``_core``.)

What it changes elsewhere (the answers two H200s gave the probe's section F,
``tests/conformance/h200x2_probe.json``; the conformance tests check them):

* a copy between two devices' context memory works with or without it; without
  it the driver stages it through host memory, which :func:`note_copy` counts
  (``state().staged``; ``state().direct`` with it), so that tests can tell the
  two paths apart on a machine where both take no time;
* a kernel of one device reads and writes another device's context memory
  only with it (``sim/_kernels.py``), and faults otherwise;
* pool and mapped memory ignore it: their own grants decide
  (``cuMemPoolSetAccess``, ``cuMemSetAccess``).

``state().unsupported`` holds the ordered device pairs without a peer path
(empty by default: every two devices reach each other, as on NVLink), for
tests of machines without one.
"""

from __future__ import annotations

from typing import Any

from cuda.bindings import driver as cu

from . import _state as S
from ._state import Fail, R, api

__all__ = [
    "cuCtxDisablePeerAccess",
    "cuCtxEnablePeerAccess",
    "cuDeviceGetP2PAttribute",
]

PEER = "peer.state"

_P2P = cu.CUdevice_P2PAttribute
#: cuDeviceGetP2PAttribute of two different devices (two NVLink H200s).
P2P_ATTRIBUTES = {
    int(_P2P.CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK): 0,
    int(_P2P.CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED): 1,
    int(_P2P.CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED): 1,
    int(_P2P.CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED): 1,
    int(_P2P.CU_DEVICE_P2P_ATTRIBUTE_ONLY_PARTIAL_NATIVE_ATOMIC_SUPPORTED): 0,
}


class PeerState:
    """Peer access of the simulated machine.

    Not a table of the leak check: like the contexts it joins, it lives as
    long as the machine (enabling peer access allocates nothing a test must
    give back).
    """

    __slots__ = ("direct", "enabled", "staged", "unsupported")

    def __init__(self) -> None:
        #: (context, peer context) pairs: the first's device reaches the second's memory.
        self.enabled: set[tuple[int, int]] = set()
        #: (device, peer) ordinal pairs without a peer path.
        self.unsupported: set[tuple[int, int]] = set()
        #: Copies between two devices' context memory, staged and direct.
        self.staged = 0
        self.direct = 0


def state() -> PeerState:
    """The machine's :class:`PeerState` (made on first use)."""
    st = S.MACHINE.ext.get(PEER)
    if st is None:
        st = S.MACHINE.ext[PEER] = PeerState()
    return st


def linked(device: int, peer: int) -> bool:
    """Whether ``device`` can access ``peer``'s memory at all (cuDeviceCanAccessPeer)."""
    return device != peer and (device, peer) not in state().unsupported


def reaches(device: int, peer: int) -> bool:
    """Whether ``device``'s primary context has peer access to ``peer``'s primary context."""
    m = S.MACHINE
    return (m.ctx_handle(device), m.ctx_handle(peer)) in state().enabled


def forget_context(ordinal: int) -> None:
    """A primary context went away (released to zero or reset): its peer access with it."""
    st = S.MACHINE.ext.get(PEER)
    if st is None:
        return
    h = S.MACHINE.ctx_handle(ordinal)
    st.enabled = {pair for pair in st.enabled if h not in pair}


def note_copy(dst: Any, src: Any) -> None:
    """Count a copy between two devices' context memory as staged or direct.

    The copy runs on the current context's device; it is direct when that
    device reaches the other device's memory, or each other side's.
    """
    m = S.MACHINE
    a, b = m.find(int(dst)), m.find(int(src))
    if a is None or b is None or a.kind != "device" or b.kind != "device":
        return
    if a.device == b.device:
        return
    runner = m.ctx_device(m.current_ctx)
    others = {x for x in (a.device, b.device) if x != runner}
    st = state()
    if runner is not None and all(reaches(runner, o) for o in others):
        st.direct += 1
    else:
        st.staged += 1


def _peer_device(peer_context: Any) -> tuple[int, int]:
    """The handle and device of a peer context; NULL or unknown: INVALID_CONTEXT (H200s)."""
    m = S.MACHINE
    h = int(peer_context) if peer_context is not None else 0
    dev = m.ctx_device(h) if h else None
    if dev is None:
        raise Fail(R.CUDA_ERROR_INVALID_CONTEXT)
    return h, dev


@api(0)
def cuCtxEnablePeerAccess(peerContext: Any, Flags: int) -> None:
    m = S.MACHINE
    current = m.need_ctx()
    h, dev = _peer_device(peerContext)
    if int(Flags) != 0:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)  # before ALREADY_ENABLED, as on the H200s
    if not linked(current, dev):
        raise Fail(R.CUDA_ERROR_PEER_ACCESS_UNSUPPORTED)  # its own context too
    st = state()
    key = (m.current_ctx, h)
    if key in st.enabled:
        raise Fail(R.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
    st.enabled.add(key)


@api(0)
def cuCtxDisablePeerAccess(peerContext: Any) -> None:
    m = S.MACHINE
    m.need_ctx()
    h, _dev = _peer_device(peerContext)
    st = state()
    key = (m.current_ctx, h)
    if key not in st.enabled:
        raise Fail(R.CUDA_ERROR_PEER_ACCESS_NOT_ENABLED)  # its own context too
    st.enabled.discard(key)


@api(1)
def cuDeviceGetP2PAttribute(attrib: Any, srcDevice: Any, dstDevice: Any) -> int:
    m = S.MACHINE
    a, b = m.device(srcDevice), m.device(dstDevice)
    if a.ordinal == b.ordinal:
        raise Fail(R.CUDA_ERROR_INVALID_DEVICE)
    value = P2P_ATTRIBUTES.get(int(attrib))
    if value is None:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    if not linked(a.ordinal, b.ordinal):
        return 0
    return value
