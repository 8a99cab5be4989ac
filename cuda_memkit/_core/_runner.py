"""Which device runs a copy or a fill, and what that device needs to reach its memory.

Work issued on a stream runs in that stream's context, whatever context is
current: :func:`place` names the device whose primary context the caller
pushes around the driver calls (the copy, its event, a kernel), or ``None``
when the current one is the stream's. Synchronous work runs on the one
device whose memory it touches; between the memory of two devices on the
current device when it may reach both, else on one of the two that may.

For each operand on another device than the one that runs the work:

* context memory (:class:`~cuda_memkit.DeviceBuffer`, ``cuMemAlloc``, arrays
  of other libraries): the runner's peer access to that device is enabled on
  first use (:func:`~cuda_memkit._core._peer.ensure_peer_access`, where
  :func:`~cuda_memkit.configure_peer_access` allows and the hardware can);
  without it the driver stages the copy through host memory, slower but
  correct;
* pool or mapped memory (:class:`~cuda_memkit.PoolBuffer`,
  :class:`~cuda_memkit.GrowableBuffer`, :class:`~cuda_memkit.Mapping`): the
  runner must have been granted access by the pool or the mapping, which the
  driver checks (``CUDA_ERROR_INVALID_VALUE`` otherwise). Stream-ordered work
  without it raises :class:`~cuda_memkit.PeerAccessError` naming the call
  that grants it, before anything is issued; it is not moved to another
  device or staged: either would hide a cross-device synchronisation and a
  tenfold slower copy behind a one-line grant at creation (``peers=``).

A pool's grant is read from the driver through the pool handle the buffer
holds, so a buffer stays usable after its pool object was closed (the pool
itself lives while buffers hold it).

Operands are placed by DLPack's device (``__dlpack_device__``): cuda_memkit's
buffers and views, PyTorch, CuPy and JAX arrays. Int addresses and objects
without it are used as given (the caller vouches for them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cuda.bindings.driver import CUstream

from . import _capture, _driver
from ._constants import INVALID_VALUE, STREAM_PER_THREAD
from ._context import ensure_any_context, primary_context
from ._errors import PeerAccessError
from ._location import Location
from ._peer import ensure_peer_access
from ._stream import Stream, StreamLike

__all__ = ["device_of", "place", "stream_device"]

#: DLPack's device type of CUDA device memory (kDLCUDA).
_DL_CUDA = 2
#: The ``MemoryKind`` values (a str enum, which ``_buffer`` defines and imports this module)
#: of memory a device reaches only through the grant of its pool or mapping.
_POOL, _GROWABLE, _MAPPED = "pool", "growable", "vmm_mapped"
#: What each kind's grant is called, for the error message.
_GRANT_CALL = {
    _POOL: "MemoryPool({own}, peers=[{e}]) or pool.set_access({e}, Access.READWRITE)",
    _GROWABLE: "GrowableBuffer(..., device={own}, peers=[{e}]) or buf.grant_access({e})",
    _MAPPED: "mapping.set_access([{own}, {e}])",
}
_KIND_WORD = {_POOL: "pool", _GROWABLE: "growable", _MAPPED: "mapped"}

#: ``(obj, device, written)``: an operand on a device.
Side = tuple[Any, int, bool]


def device_of(obj: Any) -> int | None:
    """The device whose memory ``obj`` is (DLPack's ``kDLCUDA`` device), else ``None``."""
    probe = getattr(obj, "__dlpack_device__", None)
    if probe is None:
        return None
    where = probe()
    return int(where[1]) if where[0] == _DL_CUDA else None


def stream_device(stream: StreamLike, handle: int) -> int | None:
    """The device of stream ``handle`` (``stream`` as given); ``None``: a default stream.

    The default streams (``0``, ``CU_STREAM_LEGACY``, ``CU_STREAM_PER_THREAD``)
    are the current context's. A :class:`~cuda_memkit.Stream` made by
    cuda_memkit knows its device; other handles are asked
    (``cuStreamGetDevice``), except while they capture: the driver refuses
    ``cuStreamGetDevice`` on a capturing stream (and the capture may not
    survive it), so a capturing stream is taken to be the current context's
    device's, as the capture's work is issued there.
    """
    if handle <= STREAM_PER_THREAD:
        return None
    if type(stream) is Stream:
        known: int = stream._device
        if known >= 0:
            return known
    if _capture.active and _capture.capture_id(CUstream(handle)):
        return int(_driver.call("cuCtxGetDevice"))
    return int(_driver.call("cuStreamGetDevice", handle))


def _current_is(device: int) -> bool:
    """Whether the current context, which is not ``device``'s primary one, is of ``device``."""
    return int(_driver.call("cuCtxGetDevice")) == device


def _grant_holder(obj: Any) -> tuple[str, Any] | None:
    """``(kind, holder)`` of pool or mapped memory (its pool, or the object), else ``None``."""
    owner = getattr(obj, "owner", None)  # a typed view (as_array) of a buffer
    for o in (obj, owner):
        kind = getattr(o, "kind", None)
        if o is None or kind is None:
            continue
        for k in (_POOL, _GROWABLE, _MAPPED):  # (== on the values: an Enum hashes its name)
            if kind == k:
                return k, (o.pool if k == _POOL else o)
    return None


def _granted(holder: tuple[str, Any], device: int, write: bool) -> bool:
    kind, o = holder
    if kind == _POOL:
        # The driver's answer for the pool handle: the pool object may be closed while
        # this buffer keeps the pool alive.
        flags = int(_driver.call("cuMemPoolGetAccess", o._cu, Location.device(device).to_cu()))
    else:
        flags = int(o.access(device))
    return flags == 3 if write else bool(flags & 1)


def _missing(sides: Sequence[Side], runner: int) -> list[str]:
    """What ``runner`` lacks to reach the operands: one phrase per ungranted one."""
    out = []
    for obj, dev, write in sides:
        if dev == runner:
            continue
        holder = _grant_holder(obj)
        if holder is not None and not _granted(holder, runner, write):
            role = "destination" if write else "source"
            grant = _GRANT_CALL[holder[0]].format(e=runner, own=dev)
            out.append(f"device {runner} was given no {'write' if write else 'read'} access to "
                       f"the {role}, {_KIND_WORD[holder[0]]} memory of device {dev}: grant it "
                       f"with {grant}")
    return out


def _enable(sides: Sequence[Side], runner: int) -> None:
    """Peer access from ``runner`` to the devices of its operands' context memory."""
    for obj, dev, _write in sides:
        if dev != runner and _grant_holder(obj) is None:
            ensure_peer_access(runner, dev)


def _refuse(api: str, problems: list[str]) -> PeerAccessError:
    return PeerAccessError(INVALID_VALUE, api, "CUDA_ERROR_INVALID_VALUE", "; ".join(problems))


def place(operands: Sequence[tuple[Any, bool]], handle: int | None, api: str,
          stream: StreamLike = None, ctx: int | None = None) -> int | None:
    """The device that runs work on ``operands``, when it is not the current one.

    Parameters
    ----------
    operands
        ``(object, written)`` pairs; those that are not one device's memory
        (host memory, int addresses) need nothing.
    handle
        The work's stream handle (``stream`` as the caller was given it, to
        read a :class:`~cuda_memkit.Stream`'s device without a driver call);
        ``None`` for synchronous work.
    api
        The driver call named in a :class:`~cuda_memkit.PeerAccessError`.
    ctx
        The current context's handle when the caller has it
        (:func:`~cuda_memkit._core._device.ensure_any_context`).

    Returns
    -------
    int or None
        The device whose primary context the work must be issued in; ``None``
        when the current context's device runs it. Peer access the runner
        needs to other devices' context memory is enabled.

    Raises
    ------
    PeerAccessError
        When the device that runs stream-ordered work, or every device that
        could run synchronous work, lacks a grant of pool or mapped memory it
        needs (before anything is issued).
    """
    if ctx is None:
        ctx = ensure_any_context()
    devs = [device_of(obj) for obj, _ in operands]
    if handle is not None:
        if type(stream) is Stream and stream._device >= 0:  # (the hot path: no call)
            runner: int | None = stream._device
        else:
            runner = stream_device(stream, handle)
        if runner is None:  # a default stream: the current context's
            if devs.count(None) == len(devs):
                return None
            runner, here = int(_driver.call("cuCtxGetDevice")), True
        else:
            here = primary_context(runner) == ctx or _current_is(runner)
        for dev in devs:
            if dev is not None and dev != runner:
                sides = _sides(operands, devs)
                problems = _missing(sides, runner)
                if problems:
                    raise _refuse(api, problems)
                _enable(sides, runner)
                break
        return None if here else runner
    devices = list(dict.fromkeys(dev for dev in devs if dev is not None))
    if not devices or (len(devices) == 1 and primary_context(devices[0]) == ctx):
        return None
    current = int(_driver.call("cuCtxGetDevice"))
    if devices == [current]:
        return None
    # One device's memory: that device; two devices': the current one first.
    candidates = devices if len(devices) == 1 else list(dict.fromkeys((current, *devices)))
    sides = _sides(operands, devs)
    problems = []
    for runner in candidates:
        found = _missing(sides, runner)
        if not found:
            _enable(sides, runner)
            return None if runner == current else runner
        problems += found
    raise _refuse(api, problems)


def _sides(operands: Sequence[tuple[Any, bool]], devs: list[int | None]) -> list[Side]:
    """The operands that are one device's memory, with their device."""
    return [(obj, dev, write) for (obj, write), dev in zip(operands, devs, strict=True)
            if dev is not None]
