"""Tracking allocations: :func:`track` and :class:`Tracker`.

While at least one tracker records, one watcher sits in the ledger's
``watchers`` list (:mod:`cuda_memkit._core._resource`) and hands every allocation,
free and resize to the active trackers; with none active the list is empty
and the ledger's hot paths pay one truthiness test, as before.

What a tracker keeps per event: a tuple (time, account, allocation id, bytes,
action, stream, thread, call site, stack). The call site is the first frame
outside cuda_memkit; with ``stacks=True`` the whole stack (at most
:data:`~cuda_memkit._observability._observe.MAX_FRAMES` frames) is kept too. Frees carry no
site (they happen wherever the owner was closed or collected). Everything
users read (:class:`~cuda_memkit.MemoryEvent`, :class:`~cuda_memkit.Allocation`,
summaries, plots) is built from these tuples when asked for.

Threads
-------
The watcher runs on the thread that allocated or freed, without a lock (a
list append and a dict store or pop, atomic under the GIL), and may run
re-entrantly when a garbage collection inside it frees memory. A tracker made
with ``threads="all"`` records every thread's events; with
``threads="current"`` it records the allocations of the thread that started
it, and the frees of those allocations on any thread (a buffer may be
collected elsewhere), plus frees made on its thread.

Errors
------
A failure inside the watcher never reaches the allocating call: it is kept
(:attr:`Tracker.errors`) and reported as a :class:`MemkitWarning` when the
tracker stops. Tracking never changes what an allocation does.
"""

from __future__ import annotations

import sys
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any

from .._core._checks import check_bool
from .._core._errors import MemkitWarning
from .._core._resource import KINDS, LEDGER, Account, watchers
from ._observe import (
    ACTIONS,
    ALLOC,
    FREE,
    GROW,
    PACKAGE_DIR,
    SHRINK,
    Allocation,
    Frame,
    MemoryEvent,
    RawFrame,
    capture_stack,
    frames,
)

if TYPE_CHECKING:
    from types import FrameType, TracebackType

    from typing_extensions import Self

    from ._track_report import Timeline, TrackSummary

__all__ = ["Tracker", "active_trackers", "track"]

_NEW, _ACTIVE, _DONE = 0, 1, 2

_now = time.perf_counter_ns
_ident = threading.get_ident
_getframe = sys._getframe
_PKG = PACKAGE_DIR

# The trackers recording now (replaced, never mutated, under _lock) and
# whether any of them wants stacks.
_active: tuple[Tracker, ...] = ()
_want_stacks = False
_lock = threading.Lock()


def _watch(acct: Account, key: object, nbytes: int, allocated: bool,
           stream: int | None) -> None:
    """The ledger watcher: build an event once, give it to every active tracker."""
    trackers = _active
    t = _now()
    tid = _ident()
    site: RawFrame | None = None
    stack: tuple[RawFrame, ...] | None = None
    if allocated:
        try:
            f: FrameType | None = _getframe(1)
            while f is not None and f.f_code.co_filename.startswith(_PKG):  # cuda_memkit's frames
                f = f.f_back
            if f is not None:
                code = f.f_code
                site = (code.co_filename, f.f_lineno, code.co_name)
                if _want_stacks:
                    stack = capture_stack(f)
        except Exception as exc:  # never let a failure reach the allocation
            for tr in trackers:
                tr._failed(exc)
    for tr in trackers:
        try:
            tr._on(t, acct, key, nbytes, allocated, stream, tid, site, stack)
        except Exception as exc:
            tr._failed(exc)


def active_trackers() -> tuple[Tracker, ...]:
    """The trackers recording now (every thread's), oldest first."""
    return _active


class Tracker:
    """Records every allocation and free of every memory kind while active.

    Made by :func:`track`; use it as a context manager (or call
    :meth:`start` and :meth:`stop`). One tracker records one stretch of a
    program: starting it a second time, while it records or after it
    stopped, raises :class:`RuntimeError`. Several trackers may record at
    once (nested, or on several threads); each gets every event its
    ``threads`` setting selects.

    The results can be read while it records and after it stopped:
    :meth:`events`, :meth:`live`, :meth:`summary`, :meth:`timeline`,
    :meth:`save`, :meth:`plot`.

    Parameters
    ----------
    stacks : bool, default False
        Keep the Python stack of every allocating call (a few µs each).
    threads : {"all", "current"}, default "all"
        ``"all"``: every thread's events. ``"current"``: allocations made on
        the thread that starts the tracker, the frees of those allocations
        (on any thread), and frees made on that thread.
    keep_events : bool, default True
        Keep every event. ``False`` keeps only the live allocations (what a
        leak check needs: memory stays proportional to what is alive);
        :meth:`events`, :meth:`timeline` and the summary's counts are then
        empty.
    """

    def __init__(self, stacks: bool = False, *, threads: str = "all",
                 keep_events: bool = True) -> None:
        check_bool(stacks, "stacks")
        if not isinstance(threads, str):
            raise TypeError(f"threads must be 'all' or 'current', not {type(threads).__name__}")
        if threads not in ("all", "current"):
            raise ValueError(f"threads must be 'all' or 'current', not {threads!r}")
        self.stacks = stacks
        self.threads = threads
        self._keep = keep_events
        self._state = _NEW
        self._thread: int | None = None
        self._events: list[tuple[Any, ...]] = []
        # (account, allocation id) -> [t, bytes, stream, thread, site, stack]
        self._live: dict[tuple[Account, object], list[Any]] = {}
        self._pre: set[tuple[Account, object]] = set()  # growables alive at the start
        self._base: dict[str, int] = {}
        self._cached_base: dict[str, int] = {}
        self._t0 = 0
        self._t1: int | None = None
        self._wall0 = 0.0
        self.errors: list[Exception] = []
        """Failures inside the watcher while recording (each also lost its event)."""

    # -- recording ----------------------------------------------------------------------
    def _on(self, t: int, acct: Account, key: object, nbytes: int, allocated: bool,
            stream: int | None, tid: int, site: RawFrame | None,
            stack: tuple[RawFrame, ...] | None) -> None:
        live = self._live
        lk = (acct, key)
        if not self.stacks:  # (only allocations carry a stack)
            stack = None
        if allocated:
            mine = self._thread is None or tid == self._thread
            if acct.kind == "growable" and (lk in live or lk in self._pre):
                rec = live.get(lk)
                if rec is not None:
                    rec[1] += nbytes
                elif not mine:
                    return
                op = GROW
            else:
                if not mine:
                    return
                op = ALLOC
                live[lk] = [t, nbytes, stream, tid, site, stack]
        else:
            rec = live.get(lk)
            if rec is None and self._thread is not None and tid != self._thread:
                return
            if acct.kind == "growable" and key in acct.live:
                op = SHRINK
                if rec is not None:
                    rec[1] -= nbytes
            else:
                op = FREE
                if rec is not None:
                    del live[lk]
                elif acct.kind == "growable":
                    self._pre.discard(lk)
        if self._keep:
            self._events.append((t, acct, key, nbytes, op, stream, tid, site, stack))

    def _failed(self, exc: Exception) -> None:
        if len(self.errors) < 100:
            self.errors.append(exc)

    # -- lifetime -----------------------------------------------------------------------
    @property
    def active(self) -> bool:
        """Whether it is recording now."""
        return self._state == _ACTIVE

    def start(self) -> Self:
        """Start recording; returns the tracker.

        Raises
        ------
        RuntimeError
            If this tracker is recording or has recorded already.
        """
        global _active, _want_stacks
        with _lock:
            if self._state == _ACTIVE:
                raise RuntimeError("this tracker is already recording; a tracker cannot be "
                                   "entered twice (call cuda_memkit.track() for another)")
            if self._state == _DONE:
                raise RuntimeError("this tracker has finished recording; call "
                                   "cuda_memkit.track() for a new one")
            self._thread = _ident() if self.threads == "current" else None
            base = dict.fromkeys(KINDS, 0)
            cached = dict.fromkeys(KINDS, 0)
            accounts = list(LEDGER.values())
            for acct in accounts:
                base[acct.kind] += acct.current
                cached[acct.kind] += acct.cached
            self._base = base
            self._cached_base = cached
            self._pre = {(a, k) for a in accounts if a.kind == "growable" for k in list(a.live)}
            self._wall0 = time.time()
            self._t0 = _now()
            self._state = _ACTIVE
            _active = (*_active, self)
            _want_stacks = any(t.stacks for t in _active)
            if _watch not in watchers:
                watchers.append(_watch)
        return self

    def stop(self) -> None:
        """Stop recording (the results stay readable).

        Failures inside the watcher while it recorded (:attr:`errors`) are
        reported now as one :class:`MemkitWarning`.

        Raises
        ------
        RuntimeError
            If it is not recording.
        """
        self.halt()
        if self.errors:
            first = self.errors[0]
            warnings.warn(f"cuda_memkit.track: {len(self.errors)} event(s) could not be "
                          f"recorded (first: {type(first).__name__}: {first}); the "
                          "allocations themselves were not affected", MemkitWarning,
                          stacklevel=2)

    def halt(self) -> None:
        """:meth:`stop` without the warning about :attr:`errors`."""
        global _active, _want_stacks
        with _lock:
            if self._state != _ACTIVE:
                raise RuntimeError("this tracker is not recording")
            _active = tuple(t for t in _active if t is not self)
            _want_stacks = any(t.stacks for t in _active)
            if not _active:
                try:
                    watchers.remove(_watch)
                except ValueError:  # pragma: no cover - removed by someone else
                    pass
            self._t1 = _now()
            self._state = _DONE

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None or self._state == _ACTIVE:  # (stopped inside a failing block: done)
            self.stop()

    @property
    def duration(self) -> float:
        """Seconds recorded so far (until :meth:`stop`, once stopped)."""
        if self._state == _NEW:
            return 0.0
        end = self._t1 if self._t1 is not None else _now()
        return (end - self._t0) / 1e9

    @property
    def started_at(self) -> float:
        """When it started, as ``time.time()`` (0 if it never started)."""
        return self._wall0

    @property
    def baseline(self) -> dict[str, int]:
        """Bytes of each kind held (by the whole process) when it started."""
        return dict(self._base)

    @property
    def cached_baseline(self) -> dict[str, int]:
        """Bytes of each kind block caches held when it started (not in :attr:`baseline`)."""
        return dict(self._cached_base)

    @staticmethod
    def cached() -> dict[str, int]:
        """Bytes of each kind block caches hold now (``MemoryPool(cache=True)``, pooled pinned).

        A cache hit is recorded as an allocation and a free into a cache as a
        free; what the caches hold meanwhile is here (and in
        :func:`cuda_memkit.memory_stats`).
        """
        out = dict.fromkeys(KINDS, 0)
        for acct in list(LEDGER.values()):
            out[acct.kind] += acct.cached
        return out

    # -- results ------------------------------------------------------------------------
    def events(self) -> list[MemoryEvent]:
        """Every event recorded so far, in the order they happened."""
        t0 = self._t0
        out = []
        for t, acct, key, n, op, stream, tid, site, stack in list(self._events):
            out.append(MemoryEvent((t - t0) / 1e9, ACTIONS[op], acct.kind, acct.device,
                                   acct.pool, int(key), n, stream, tid,
                                   None if site is None else Frame(*site), frames(stack)))
        return out

    def live(self) -> list[Allocation]:
        """Allocations made while it recorded that are still alive, oldest first.

        Once stopped, a tracker sees no more frees: this is then what was
        alive when it stopped.
        """
        items = sorted(list(self._live.items()), key=lambda kv: kv[1][0])
        return [self._allocation(acct, key, rec) for (acct, key), rec in items]

    def allocation(self, acct: Account, key: object) -> Allocation | None:
        """The record of live allocation ``key`` of ledger account ``acct``, if it has one."""
        rec = self._live.get((acct, key))
        return None if rec is None else self._allocation(acct, key, rec)

    def _allocation(self, acct: Account, key: object, rec: list[Any]) -> Allocation:
        return Allocation(acct.kind, acct.device, acct.pool, int(key),  # type: ignore[call-overload]
                          rec[1], (rec[0] - self._t0) / 1e9, rec[2], rec[3],
                          None if rec[4] is None else Frame(*rec[4]), frames(rec[5]))

    def summary(self) -> TrackSummary:
        """Tables by kind and by call site (``print(t.summary())``).

        By kind: allocations, frees, bytes allocated, what is still alive and
        the peak of the kind's timeline. By call site (the first line outside
        cuda_memkit that allocated): allocations, bytes, and what they still
        hold; sites holding the most memory first, so a leak tops the list.
        """
        from ._track_report import summarize

        return summarize(self)

    def timeline(self) -> dict[str, Timeline]:
        """Memory over time per kind: bytes held after each recorded event.

        Each kind starts at :attr:`baseline` (what the process held when the
        tracker started) and changes by each event. With ``threads="all"``
        it is what the process held; with ``threads="current"`` it counts
        other threads' memory only as of the start.
        """
        from ._track_report import timeline

        return timeline(self)

    def to_dict(self) -> dict[str, Any]:
        """Everything recorded, as JSON-ready values (the schema of :meth:`save`)."""
        from ._track_report import to_dict

        return to_dict(self)

    def save(self, path: Any) -> None:
        """Write :meth:`to_dict` as JSON to ``path`` (schema ``cuda_memkit.track/1``).

        Raises
        ------
        TypeError
            If ``path`` is not a str or path-like.
        OSError
            If the file cannot be written (the message names it); nothing is
            left behind.
        """
        from ._track_report import save

        save(self, path)

    def plot(self, path: Any = None, *, kinds: Any = None) -> Any:
        """Plot memory over time, one panel per kind, peaks marked (needs matplotlib).

        Each panel is a kind's :meth:`timeline` on its own scale, so a small
        leak shows next to a large workload.

        Parameters
        ----------
        path : str or path-like, optional
            Save the figure there (any format matplotlib knows by the
            suffix) instead of leaving it open for display.
        kinds : str or iterable of str, optional
            Only these kinds (default: every kind with events).

        Returns
        -------
        matplotlib.figure.Figure
            The figure.

        Raises
        ------
        ImportError
            If matplotlib is not installed (``pip install matplotlib``).
        ValueError
            For an unknown kind.
        """
        from ._track_report import plot

        return plot(self, path, kinds)

    def __repr__(self) -> str:
        state = ("not started", "recording", "stopped")[self._state]
        return (f"<Tracker {state}: {len(self._events)} events, {len(self._live)} live, "
                f"stacks={self.stacks}, threads={self.threads!r}>")


def track(stacks: bool = False, *, threads: str = "all") -> Tracker:
    """Record every allocation and free of every memory kind inside a ``with`` block.

    Parameters
    ----------
    stacks : bool, default False
        Also keep the Python stack of every allocating call (the call site,
        the first line outside cuda_memkit, is always kept).
    threads : {"all", "current"}, default "all"
        Record every thread's events, or those of the calling thread (its
        allocations, their frees on any thread, and its own frees).

    Returns
    -------
    Tracker
        Use it as a context manager; read :meth:`~Tracker.events`,
        :meth:`~Tracker.live`, :meth:`~Tracker.summary`,
        :meth:`~Tracker.save` and :meth:`~Tracker.plot` during or after.

    Examples
    --------
    >>> with cm.track(stacks=True) as t:
    ...     kept = [cm.DeviceBuffer.empty(1 << 20) for _ in range(3)]
    ...     cm.DeviceBuffer.empty(4096).close()   # freed: not live
    >>> len(t.live())
    3
    >>> print(t.summary())          # by kind and by call site
    cuda_memkit tracking summary (... s)
    kind ...
    >>> for b in kept:
    ...     b.close()
    """
    return Tracker(stacks, threads=threads)
