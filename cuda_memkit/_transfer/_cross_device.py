"""Copies between the memory of two devices: which device runs them, and what it needs.

A copy between memory of device A and memory of device B runs on one device
E: the stream's device for a stream-ordered copy or a batch, the current
context's device for a synchronous copy. For each operand on another device
than E:

* context memory (:class:`~cuda_memkit.DeviceBuffer`, ``cuMemAlloc``, arrays
  of other libraries): E's peer access to that device is enabled on first
  use (:func:`~cuda_memkit._core._peer.ensure_peer_access`, where
  :func:`~cuda_memkit.configure_peer_access` allows and the hardware can);
  without it the driver stages the copy through host memory, slower but
  correct;
* pool or mapped memory (:class:`~cuda_memkit.PoolBuffer`,
  :class:`~cuda_memkit.GrowableBuffer`, :class:`~cuda_memkit.Mapping`): E must
  have been granted access by the pool or the mapping, which the driver
  checks (``CUDA_ERROR_INVALID_VALUE`` otherwise). A synchronous copy runs
  on a device that was, when one of the two was; a stream-ordered copy, a
  batch and the kernel path raise :class:`~cuda_memkit.PeerAccessError`
  naming the call that grants it. They do not move the copy to another
  device or stage it: either would hide a cross-device synchronisation and
  a tenfold slower copy behind a one-line grant at creation (``peers=``).

Operands are placed by DLPack's device (``__dlpack_device__``): cuda_memkit's
buffers and views, PyTorch, CuPy and JAX arrays. Int addresses and objects
without it are copied as given (the caller vouches for them).
"""

from __future__ import annotations

from typing import Any

from .._core import _driver
from .._core._buffer import MemoryKind
from .._core._constants import INVALID_VALUE
from .._core._context import ensure_context
from .._core._errors import PeerAccessError
from .._core._peer import ensure_peer_access

__all__ = ["device_of", "prepare_batch", "prepare_copy"]

#: DLPack's device type of CUDA device memory (kDLCUDA).
_DL_CUDA = 2
#: Memory a device reaches only through the grant of its pool or mapping.
_GRANTED_KINDS = (MemoryKind.POOL, MemoryKind.GROWABLE, MemoryKind.VMM_MAPPED)
#: What each kind's grant is called, for the error message.
_GRANT_CALL = {
    MemoryKind.POOL: "MemoryPool({own}, peers=[{e}]) or pool.set_access({e}, Access.READWRITE)",
    MemoryKind.GROWABLE: ("GrowableBuffer(..., device={own}, peers=[{e}]) or "
                          "buf.grant_access({e})"),
    MemoryKind.VMM_MAPPED: "mapping.set_access([{own}, {e}])",
}


def device_of(obj: Any) -> int | None:
    """The device whose memory ``obj`` is (DLPack's ``kDLCUDA`` device), else ``None``."""
    probe = getattr(obj, "__dlpack_device__", None)
    if probe is None:
        return None
    where = probe()
    return int(where[1]) if int(where[0]) == _DL_CUDA else None


def _grant_holder(obj: Any) -> tuple[MemoryKind, Any] | None:
    """``(kind, object with .access(device))`` of pool or mapped memory, else ``None``."""
    owner = getattr(obj, "owner", None)  # a typed view (as_array) of a buffer
    for o in (obj, owner):
        kind = getattr(o, "kind", None)
        if o is not None and kind in _GRANTED_KINDS:
            return kind, (o.pool if kind is MemoryKind.POOL else o)
    return None


def _granted(holder: tuple[MemoryKind, Any], device: int, write: bool) -> bool:
    flags = int(holder[1].access(device))
    return flags == 3 if write else bool(flags & 1)


def _missing(sides: list[tuple[Any, int, bool]], runner: int) -> list[str]:
    """What ``runner`` lacks to run the copy: one phrase per ungranted operand."""
    out = []
    for obj, dev, write in sides:
        if dev == runner:
            continue
        holder = _grant_holder(obj)
        if holder is not None and not _granted(holder, runner, write):
            role = "destination" if write else "source"
            what = {MemoryKind.POOL: "pool", MemoryKind.GROWABLE: "growable",
                    MemoryKind.VMM_MAPPED: "mapped"}[holder[0]]
            grant = _GRANT_CALL[holder[0]].format(e=runner, own=dev)
            out.append(f"device {runner} was given no {'write' if write else 'read'} access to "
                       f"the {role}, {what} memory of device {dev}: grant it with {grant}")
    return out


def _enable(sides: list[tuple[Any, int, bool]], runner: int) -> None:
    """Peer access from ``runner`` to the devices of its operands' context memory."""
    for obj, dev, _write in sides:
        if dev != runner and _grant_holder(obj) is None:
            ensure_peer_access(runner, dev)


def _refuse(api: str, problems: list[str]) -> PeerAccessError:
    return PeerAccessError(INVALID_VALUE, api, "CUDA_ERROR_INVALID_VALUE", "; ".join(problems))


def prepare_copy(dst: Any, src: Any, stream: int | None) -> int | None:
    """Get a copy from ``src`` to ``dst`` ready when they are two devices' memory.

    ``stream``: the copy's stream handle, ``None`` for a synchronous copy.
    Cheap when they are not (two ``__dlpack_device__`` calls).

    Returns
    -------
    int or None
        The device whose primary context the copy must be issued in (a
        synchronous copy's runner; a stream-ordered copy's stream's device),
        when that is not the current one; ``None`` otherwise.

    Raises
    ------
    PeerAccessError
        When no device that may run the copy was granted the pool or mapped
        memory it needs (before any copy is issued).
    """
    a, b = device_of(dst), device_of(src)
    if a is None or b is None or a == b:
        return None
    sides = [(dst, a, True), (src, b, False)]
    current = ensure_context(None)
    if stream is not None:
        runner = int(_driver.call("cuStreamGetDevice", stream))
        problems = _missing(sides, runner)
        if problems:
            raise _refuse("cuMemcpyAsync", problems)
        _enable(sides, runner)
        return None if runner == current else runner
    problems = []
    for runner in dict.fromkeys((current, a, b)):
        found = _missing(sides, runner)
        if not found:
            _enable(sides, runner)
            return None if runner == current else runner
        problems += found
    raise _refuse("cuMemcpy", problems)


def prepare_batch(pairs: list[tuple[Any, Any]], stream: int) -> None:
    """:func:`prepare_copy` for the (destination, source) pairs of a batch on ``stream``.

    The whole batch runs on the stream's device: every pair must be
    reachable from it, else :class:`~cuda_memkit.PeerAccessError` names each
    missing grant, before anything is issued.
    """
    runner: int | None = None
    problems: list[str] = []
    todo = []
    for dst, src in pairs:
        a, b = device_of(dst), device_of(src)
        if a is None or b is None or a == b:
            continue
        if runner is None:
            runner = int(_driver.call("cuStreamGetDevice", stream))
        sides = [(dst, a, True), (src, b, False)]
        problems += _missing(sides, runner)
        todo.append(sides)
    if problems:
        raise _refuse("cuMemcpyBatchAsync", problems)
    for sides in todo:
        assert runner is not None
        _enable(sides, runner)
