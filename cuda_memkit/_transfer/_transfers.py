"""Transfers: copies between any two kinds of memory.

* :func:`copy` / :func:`copy_async`: one copy function for host, pinned,
  registered, device and managed memory, through unified addressing
  (``cuMemcpy`` / ``cuMemcpyAsync``). Operands are resolved to pointers
  without driver calls (:mod:`cuda_memkit._core._operands`), so the hot path adds a
  few microseconds to a transfer.
* Asynchronous copies keep their Python operands alive until the stream has
  finished them (an event per copy, polled at the next copy or allocation).
* Large copies between pageable numpy memory and device memory run through
  pinned staging buffers (:mod:`cuda_memkit._transfer._staging`) at several times the
  driver's pageable bandwidth; ``staged=False`` (or
  :func:`~cuda_memkit.configure_staging`) takes the driver's path.
* Many blocks at once: :func:`~cuda_memkit.copy_batch` (:mod:`cuda_memkit._transfer._copy_batch`).
"""

from __future__ import annotations

from typing import Any

from .._core import _buffer, _driver
from .._core._checks import check_bool
from .._core._context import ensure_any_context, primary_pushed
from .._core._host_registry import is_pinned_host
from .._core._inflight import keep_alive, pending_operands, reap_pending
from .._core._operands import (
    DRIVER,
    HOST,
    RAW,
    Operand,
    copy_size,
    copy_sync,
    operand,
    refuse_pageable,
)
from .._core._runner import place
from .._core._stream import StreamLike, stream_handle
from ._staging import staged_copy, staging_wanted

__all__ = ["copy", "copy_async"]


def copy(
    dst: Any,
    src: Any,
    *,
    nbytes: int | None = None,
    stream: StreamLike = None,
    allow_pageable: bool = False,
    staged: bool | None = None,
) -> Any:
    """Copy bytes from ``src`` to ``dst``, between any kinds of memory.

    Without ``stream`` the copy is synchronous: it is complete when ``copy``
    returns (``cuMemcpy``, plus a wait on the legacy default stream when the
    destination may be device memory, since ``cuMemcpy`` returns early there).
    With ``stream`` it is ordered on that stream and returns at once (see
    :func:`copy_async`).

    Parameters
    ----------
    dst, src : buffer, array or pointer
        A :class:`HostBuffer`, :class:`DeviceBuffer`, any cuda_memkit buffer
        (an object with int ``ptr`` and ``nbytes``: managed, pool, growable
        buffers), a :class:`RegisteredHost`, a C-contiguous numpy array or
        buffer-protocol object, an object with ``__cuda_array_interface__``
        (CuPy, torch, numba), or an int address (unified addressing).
    nbytes : int, optional
        Bytes to copy. Default: the size of the operands, which must then
        agree (and, when both are typed, have the same dtype).
    stream : Stream, int or stream-like, optional
        Order the copy on this stream instead of copying synchronously.
    allow_pageable : bool, default False
        Allow a stream-ordered copy from or to pageable numpy memory.
    staged : bool, optional
        Copies between pageable numpy memory and device memory of at least
        ``StagingSettings.threshold`` bytes run through pinned staging
        buffers (see :func:`configure_staging`), several times faster than
        the driver's pageable path; the result and the synchronisation are the
        same (complete on return, ordered after ``stream``'s queued work).
        ``False`` takes the driver's path for this call; the default (``None``)
        follows the settings.

    Returns
    -------
    dst
        The destination object, for chaining.

    Raises
    ------
    TypeError
        For operands that are not memory, object dtypes, or an
        ``allow_pageable`` or ``staged`` that is not a bool.
    ValueError
        For mismatched sizes or dtypes, non-contiguous or read-only
        destinations, or pageable memory in a stream-ordered copy without
        ``allow_pageable``; all before any driver call.
    ClosedError
        If an operand is closed.
    PeerAccessError
        With ``stream``: when the stream's device may not reach another
        device's pool or mapped memory among the operands; without: when no
        device that could run the copy may (see Notes); before anything is
        copied.

    Notes
    -----
    A copy on a stream is issued in that stream's context, whatever context
    is current, and runs on the stream's device. Without a stream, a copy
    touching one device's memory runs on that device; between the memory of
    two devices on the current device, or the other one when only it was
    granted the pool or mapped memory involved. Context
    memory of the other device (``DeviceBuffer``, other libraries' arrays) is
    reached through peer access, enabled on first use where the two devices
    can reach each other (:func:`configure_peer_access` turns that off);
    where they cannot, the driver stages the copy through host memory:
    correct, about ten times slower. Pool and mapped memory of the other
    device needs its own grant (``MemoryPool(..., peers=[...])``,
    ``GrowableBuffer(..., peers=[...])``, ``Mapping.set_access``); a
    stream-ordered copy without it raises :class:`PeerAccessError` naming the
    call. See "Several GPUs" in the docs.
    """
    if staged is not None and not isinstance(staged, bool):
        raise TypeError(f"staged must be a bool or None, not {type(staged).__name__}")
    check_bool(allow_pageable, "allow_pageable")
    if stream is not None:
        _copy_async(dst, src, nbytes, stream, stream_handle(stream), allow_pageable, staged)
        return dst
    d = operand(dst, True)
    s = operand(src, False)
    n = copy_size(d, s, nbytes)
    if staged is not False and _staged(d, s, n, None):
        return dst
    if n and (d.kind == DRIVER or s.kind == DRIVER):
        runner = place(((dst, True), (src, False)), None, "cuMemcpy")  # see _core._runner
        if runner is not None:
            with primary_pushed(runner):
                copy_sync(d, s, n)
            return dst
    copy_sync(d, s, n)
    return dst


def _staged(d: Operand, s: Operand, n: int, stream: int | None) -> bool:
    """Run a pageable <-> device copy through the staging buffers, if it is one (and big)."""
    if (d.kind == HOST) == (s.kind == HOST):
        return False  # staging is for exactly one pageable side
    host, dev = (d, s) if d.kind == HOST else (s, d)
    if dev.kind != DRIVER or not staging_wanted(n) or is_pinned_host(host.host_array):
        return False  # (the settings first: the pinned test costs two driver calls)
    if host is d:
        return staged_copy(host.host_array, dev.ptr, n, stream=stream)
    return staged_copy(dev.ptr, host.host_array, n, stream=stream)


def copy_async(
    dst: Any,
    src: Any,
    *,
    stream: StreamLike,
    nbytes: int | None = None,
    allow_pageable: bool = False,
) -> Any:
    """Copy bytes from ``src`` to ``dst`` ordered on ``stream`` (``cuMemcpyAsync``).

    It returns before the copy is done; synchronize the stream (or record an
    event) before reading the destination or reusing the source. The Python
    operands are kept alive until the stream has finished the copy, so
    dropping them early is safe; so is ``close()`` of a buffer the copy uses,
    given itself or through a view of it (``as_array()``, a numpy view, a
    registered array): its memory is released once the copy has finished.

    Copies from or to pageable numpy memory are refused unless
    ``allow_pageable=True``: the driver stages them through a bounce buffer,
    and the call blocks the host, so the "asynchronous" copy serialises.
    Page-lock the array with :func:`register_host` or use a :class:`HostBuffer`.
    Int pointers are trusted as given.

    Parameters
    ----------
    dst, src
        As for :func:`copy`.
    stream : Stream, int, None or stream-like
        The stream (``None``: the legacy default stream).
    nbytes : int, optional
        As for :func:`copy`.
    allow_pageable : bool, default False
        Accept pageable host memory.

    Returns
    -------
    dst

    Raises
    ------
    PeerAccessError
        When the stream's device was given no access to another device's
        pool or mapped memory among the operands (see :func:`copy`), before
        anything is issued. The copy is issued in the stream's context,
        whatever context is current.
    """
    _copy_async(dst, src, nbytes, stream, stream_handle(stream),
                check_bool(allow_pageable, "allow_pageable"))
    return dst


def _copy_async(dst: Any, src: Any, nbytes: int | None, stream_obj: StreamLike, stream: int,
                allow_pageable: bool, staged: bool | None = None) -> None:
    d = operand(dst, True)
    s = operand(src, False)
    n = copy_size(d, s, nbytes)
    if not n:
        return
    if not allow_pageable:
        if d.kind == HOST:
            refuse_pageable(d, "destination")
        if s.kind == HOST:
            refuse_pageable(s, "source")
    if pending_operands:
        reap_pending()
    # The stream's context issues the copy (and keep_alive's event), whatever is current.
    runner = place(((dst, True), (src, False)), stream, "cuMemcpyAsync", stream_obj,
                   ensure_any_context())
    if runner is None:
        _issue_or_stage(dst, src, d, s, n, stream, allow_pageable and staged is not False)
        return
    with primary_pushed(runner):
        _issue_or_stage(dst, src, d, s, n, stream, allow_pageable and staged is not False)


def _issue_or_stage(dst: Any, src: Any, d: Operand, s: Operand, n: int, stream: int,
                    stage: bool) -> None:
    if stage and _staged(d, s, n, stream):
        return  # complete already (pageable memory: the driver's path blocks the host too)
    _issue(dst, src, d, s, n, stream)


def _issue(dst: Any, src: Any, d: Operand, s: Operand, n: int, stream: int) -> None:
    """``cuMemcpyAsync`` on ``stream``; the operands held until the stream is past it."""
    _driver.call("cuMemcpyAsync", d.ptr, s.ptr, n, stream)
    if s.kind != RAW or d.kind != RAW:
        keep_alive(stream, (dst, src))


# Buffers' copy_from/copy_to are copy() itself: plugged in here (see _core._buffer).
_buffer.copier = copy
