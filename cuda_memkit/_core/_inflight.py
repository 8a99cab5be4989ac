"""Copies in flight: their operands kept alive until their stream has finished them.

:func:`keep_alive` holds the operands of an asynchronous copy (and the owners
of views and exports among them) until the copy's event has completed;
:func:`reap_pending` lets go of finished ones (after every synchronize, and on
allocation paths, so memory of finished copies goes back sooner); a closed
owner still used by a copy is released after it (:func:`release_after_copies`).
"""

from __future__ import annotations

import collections
import sys
import threading
from typing import Any

from . import _driver
from ._constants import EVENT_DISABLE_TIMING
from ._context import ensure_any_context
from ._device import sync_hooks
from ._errors import CudaError
from ._host_registry import export_owner
from ._resource import Resource, release_hooks

__all__ = [
    "keep_alive",
    "pending_count",
    "pending_operands",
    "reap_pending",
    "release_after_copies",
    "releases_waiting",
    "wait_for_copies",
    "wait_pending",
]


#: Operands of asynchronous copies still in flight, per stream handle: entries
#: ``[event, references]`` (lists: a close() under the copy adds its stand-in).
pending_operands: dict[int, collections.deque[list[Any]]] = {}
_pending_lock = threading.RLock()
#: id() of each object the entries hold -> those entries, so that close() finds its own
#: copies without scanning every copy in flight (the ids stay valid: the entries hold them).
_holders: dict[int, list[list[Any]]] = {}


def _event_done(ev: Any) -> bool:
    res = _driver.function("cuEventQuery")(ev)
    code = int(res[0])
    return code != 600  # CUDA_ERROR_NOT_READY; any other answer: nothing is pending


def _destroy_event(ev: Any) -> None:
    try:
        _driver.call("cuEventDestroy", ev)
    except CudaError:
        pass  # the context (or the simulated machine) is gone with it


#: Set while this thread changes the queues: a reap from a finalizer run meanwhile (a garbage
#: collection collecting a closed buffer's last export) is left to the change under way.
_changing = threading.local()


def reap_pending() -> None:
    """Drop the operands of asynchronous copies that have finished."""
    if not pending_operands or getattr(_changing, "on", False):
        return
    done: list[list[Any]] = []
    with _pending_lock:
        _changing.on = True
        try:
            for stream in list(pending_operands):
                q = pending_operands[stream]
                while q and _event_done(q[0][0]):
                    entry = q.popleft()
                    _unindex(entry)
                    done.append(entry)
                if not q:
                    del pending_operands[stream]
        finally:
            _changing.on = False
    for ev, _refs in done:
        _destroy_event(ev)
    # the references in `done` go here, outside the lock


def _unindex(entry: list[Any]) -> None:
    """Take a reaped entry out of :data:`_holders` (under the lock)."""
    for r in entry[1]:
        entries = _holders.get(id(r))
        if entries is not None:  # not there: a stand-in (never indexed)
            for k, e in enumerate(entries):
                if e is entry:
                    del entries[k]
                    break
            if not entries:
                del _holders[id(r)]


sync_hooks.append(reap_pending)


def wait_pending() -> None:
    """Wait until every asynchronous copy whose operands are held has finished, then reap.

    It waits on the copies' own events (never on their streams, which may be gone).
    """
    with _pending_lock:
        last = [q[-1][0] for q in pending_operands.values() if q]
    _wait_events(last)


def _wait_events(events: list[Any]) -> None:
    """Wait on ``events`` (never on their streams, which may be gone), then reap."""
    for ev in events:
        _driver.function("cuEventSynchronize")(ev)  # a failed wait: the reap decides
    reap_pending()


class _ReleaseWhenCopied:
    """Releases a closed owner when the last asynchronous copy holding it is let go of.

    One object for all the copies in flight that hold the owner: it is dropped
    (and the owner released) when the last of their entries is reaped.
    """

    __slots__ = ("owner",)

    #: Stand-ins alive: releases waiting for copies (MemoryPool.close() waits only then).
    alive = 0

    def __init__(self, owner: Resource) -> None:
        self.owner = owner
        _ReleaseWhenCopied.alive += 1

    # (sys.is_finalizing bound as a default: module globals may be gone at interpreter exit)
    def __del__(self, _finalizing: Any = sys.is_finalizing,
                _lock: Any = _pending_lock) -> None:
        with _lock:  # made under it (release_after_copies): counted under it
            type(self).alive -= 1
        if not _finalizing():
            self.owner._release_deferred()


def releases_waiting() -> int:
    """How many closed owners wait for copies in flight before they are released."""
    return _ReleaseWhenCopied.alive


def release_after_copies(owner: Resource) -> bool:
    """Whether asynchronous copies in flight still use ``owner`` (then it waits for them).

    If they do, ``owner`` is released once the last of them has finished, not
    now, under the copy.
    """
    if id(owner) not in _holders:
        return False
    ensure_any_context()  # close() may run on a thread with none: the event queries need one
    reap_pending()
    with _pending_lock:
        was = getattr(_changing, "on", False)
        _changing.on = True  # a finalizer run meanwhile must not reap under this loop
        try:
            entries = _holders.get(id(owner))
            if not entries:
                return False
            stand_in = _ReleaseWhenCopied(owner)
            for entry in list(entries):
                entry[1] = (*entry[1], stand_in)
        finally:
            _changing.on = was
    return True


release_hooks.append(release_after_copies)


def wait_for_copies(owner: Resource) -> None:
    """Wait until the asynchronous copies in flight that use ``owner`` have finished.

    For changes that cannot wait for the copies' own end (a growable buffer
    unmapping its tail): the copies' events are waited on, never their streams.
    """
    if id(owner) not in _holders:
        return
    with _pending_lock:
        events = [entry[0] for entry in _holders.get(id(owner), ())]
    _wait_events(events)


def pending_count() -> int:
    """Number of asynchronous copies whose operands are still held."""
    return sum(len(q) for q in pending_operands.values())


def _with_owners(refs: tuple[Any, ...]) -> tuple[Any, ...]:
    """``refs`` plus the owners of the views and exports among them (:func:`export_owner`).

    A closed owner whose release already waits for copies lends its stand-in
    too (a registered array copied again after its ``close()``), so that the
    release waits for this copy as well. Called under the lock.
    """
    extra: tuple[Any, ...] = ()
    for r in refs:
        if type(r) is int or isinstance(r, Resource):
            continue
        owner = export_owner(r)
        if owner is None or any(owner is x for x in refs + extra):
            continue
        extra += (owner,)
        if owner.closed:
            for entry in _holders.get(id(owner), ()):
                extra += tuple(x for x in entry[1] if type(x) is _ReleaseWhenCopied
                               and x.owner is owner and all(x is not y for y in extra))
    return refs + extra if extra else refs


def keep_alive(stream: int, refs: tuple[Any, ...]) -> None:
    """Hold ``refs`` until the work queued on ``stream`` so far has finished.

    The owners of views and exports among them (an ``as_array()`` view, a numpy
    view, a registered array) are held and indexed too: their ``close()`` (or a
    shrink) waits for this work as it would had the owner itself been given.
    """
    try:
        ev = _driver.call("cuEventCreate", EVENT_DISABLE_TIMING)
    except CudaError:
        ev = None
    if ev is not None:
        try:
            _driver.call("cuEventRecord", ev, stream)
        except CudaError:
            _destroy_event(ev)
            ev = None
    if ev is None:
        # The event cannot go on this stream (e.g. another device's context is
        # current): wait for the copy rather than risk freeing memory under it.
        _driver.call("cuStreamSynchronize", stream)
        return
    if _event_done(ev):
        _destroy_event(ev)
        return
    with _pending_lock:
        entry = [ev, _with_owners(refs)]
        q = pending_operands.get(stream)
        if q is None:
            q = pending_operands[stream] = collections.deque()
        q.append(entry)
        for r in entry[1]:
            if type(r) is _ReleaseWhenCopied:
                continue  # a stand-in: never indexed
            entries = _holders.get(id(r))
            if entries is None:
                _holders[id(r)] = [entry]
            else:
                entries.append(entry)
