"""A Loader's copies watched by a thread: each slot goes back the moment its copy has finished.

A slot copied to the device is given back to the workers only once the copy
has read it (the copy's operands are held until its event completes, see
``_core._inflight``). Instead of the ring's thread polling those events,
:class:`CopyWatcher` records an event of its own behind each copy and a
thread of its own sleeps in ``cuEventSynchronize`` on it (a blocking-sync
event: the thread sleeps in the driver, without the interpreter's lock), then
lets go of the finished copies' operands at once: the slot's release runs
and wakes the ring's thread, which grants the slot again.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

from .._core import _driver
from .._core._constants import EVENT_DISABLE_TIMING
from .._core._context import ensure_context
from .._core._errors import CudaError
from .._core._inflight import pending_operands, reap_pending

__all__ = ["EVENT_BLOCKING_SYNC", "CopyWatcher"]

#: ``CU_EVENT_BLOCKING_SYNC``: a wait on the event sleeps instead of spinning a core.
EVENT_BLOCKING_SYNC = 0x1


class CopyWatcher:
    """A thread that waits on the events recorded behind a Loader's copies, in order.

    :meth:`after` runs on the consumer's thread right after a slot's copy was
    queued; :meth:`close` waits for the copies still in flight and stops the
    thread. While it watches nothing, the ring's own thread polls the events
    of the copies left (:meth:`busy` tells it).
    """

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake  # wakes the ring's thread: it polls what is left when this stops
        self._device = 0
        self._broken = False  # the thread failed: the ring's thread polls every copy
        self._cond = threading.Condition()
        self._queue: collections.deque[Any] = collections.deque()  # events waited on, in order
        self._closing = False
        self._thread: threading.Thread | None = None

    def busy(self) -> bool:
        """Whether copies are watched now (the ring's thread need not poll their events)."""
        return bool(self._queue)

    def after(self, stream: int, device: int) -> None:
        """Watch the work queued on ``stream`` so far (a slot's copy); its end frees the slot.

        ``device`` is the device whose context the stream belongs to.
        """
        if not pending_operands or self._broken:
            return  # finished already (its slot went back with it), or left to the ring's poll
        ev = _driver.call("cuEventCreate", EVENT_BLOCKING_SYNC | EVENT_DISABLE_TIMING)
        try:
            _driver.call("cuEventRecord", ev, stream)
        except CudaError:
            # No event on that stream (another device's context is current, say): wait here.
            _destroy(ev)
            _driver.call("cuStreamSynchronize", stream)
            reap_pending()
            return
        with self._cond:
            self._queue.append(ev)
            if self._thread is None:
                self._device = device
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="cuda_memkit-loader-copies")
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        try:
            self._watch()
        except BaseException:
            # Never silent, never stuck: the ring's thread polls the copies from now on.
            with self._cond:
                self._broken = True
                events = list(self._queue)
                self._queue.clear()
            for ev in events:
                _destroy(ev)
            self._wake()
            raise

    def _watch(self) -> None:
        ensure_context(self._device)  # the reap's event queries need the device's context here
        cond, queue = self._cond, self._queue
        while True:
            with cond:
                while not queue and not self._closing:
                    cond.wait()
                if not queue:
                    return
                ev = queue[0]
            # A failed wait (the context is broken) is left to the reap, which then lets go.
            _driver.function("cuEventSynchronize")(ev)
            reap_pending()  # the slots whose copies are done go back to the ring now
            with cond:
                queue.popleft()
                idle = not queue
            _destroy(ev)
            if idle and pending_operands:
                self._wake()  # copies this event did not cover: the ring's thread polls them

    def close(self) -> None:
        """Wait for the copies in flight (their slots go back) and stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join()
        with self._cond:
            events = list(self._queue)  # left by a thread that could not start
            self._queue.clear()
        for ev in events:
            _destroy(ev)


def _destroy(ev: Any) -> None:
    try:
        _driver.call("cuEventDestroy", ev)
    except CudaError:
        pass  # the context is gone, and the event with it
