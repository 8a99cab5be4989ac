"""A Loader's passes over its batches: the schedule (``_ring_core.Schedule``) of its ring.

Each pass is an *epoch*: the ring's grants carry its batches in order (a
grant that never reached its worker hands its batch out again first), and a
batch that arrives for an older epoch is recycled at once. The consumer waits
for the batch at a position of the current epoch (``ordered``) or for any of
them; a batch that failed is raised where it is waited for. The ring calls the
first six methods under its lock; the consumer's calls take it.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator

from .._host._ring_core import Key, RingCore, WorkerError

__all__ = ["Epochs"]


class Epochs:
    """The batches of a Loader's current pass, handed to its ring (``core.schedule``)."""

    def __init__(self, core: RingCore) -> None:
        self._core = core
        self.epoch = 0
        #: (position, batch) pairs of the current epoch not handed out yet.
        self._tasks: Iterator[tuple[int, int]] | None = None
        #: (position, batch) pairs whose grants never reached a worker: handed out first.
        self._requeued: collections.deque[tuple[int, int]] = collections.deque()
        self._keyed: dict[Key, int] = {}  # ready slots of the current epoch, by key
        self._failures: dict[Key, WorkerError] = {}  # batches that failed, by key

    # -- the ring's side (under the ring's lock) ---------------------------------------
    def next_task(self) -> tuple[Key, int] | None:
        """The next batch of the current epoch to grant, if any."""
        if self._requeued:
            task: tuple[int, int] | None = self._requeued.popleft()
        else:
            task = None if self._tasks is None else next(self._tasks, None)
        if task is None:
            self._tasks = None  # every batch of the epoch is handed out
            return None
        return (self.epoch, task[0]), task[1]

    def wanted(self, key: Key) -> bool:
        """Whether ``key`` belongs to the current epoch."""
        return key[0] == self.epoch

    def unused(self, key: Key, batch: int) -> None:
        """A grant that never reached its worker: its batch goes out again first."""
        if self.wanted(key):
            self._requeued.appendleft((key[1], batch))

    def arrived(self, key: Key, s: int) -> None:
        """A batch of the current epoch is ready in slot ``s``."""
        self._keyed[key] = s

    def failed(self, key: Key, error: WorkerError) -> None:
        """A batch of the current epoch failed: raised where the consumer waits for it."""
        self._failures[key] = error

    def taken(self, key: Key) -> None:
        """The consumer took the batch of ``key`` as it came."""
        self._keyed.pop(key, None)

    # -- the consumer's side --------------------------------------------------------------
    def start(self, tasks: Iterator[tuple[int, int]]) -> int:
        """Start an epoch handing out ``tasks`` ((position, batch) pairs); return its number.

        Slots still holding an older epoch's batches are recycled as they arrive.
        """
        with self._core.lock:
            self._core.check()
            self._new_epoch(tasks)
            return self.epoch

    def end(self, epoch: int) -> None:
        """Stop handing out ``epoch``'s batches; the ones under way are dropped as they come."""
        with self._core.lock:
            if self.epoch == epoch:
                self._new_epoch(None)  # one with no batches: nothing is current

    def _new_epoch(self, tasks: Iterator[tuple[int, int]] | None) -> None:
        """Make a new epoch current: the older batches ready now go back, the rest on arrival."""
        self.epoch += 1
        self._tasks = tasks
        self._requeued.clear()
        self._failures.clear()
        keyed, self._keyed = self._keyed, {}
        for s in keyed.values():
            self._core.recycle_ready(s)
        self._core.wake()

    def by_key(self, key: Key) -> int | None:
        """The ready batch at ``key`` (``(epoch, position)``), if it is there (under the lock)."""
        self._superseded(key[0])
        failed = self._failures.pop(key, None)
        if failed is not None:
            raise failed
        s = self._keyed.pop(key, None)
        if s is not None:
            self._core.ready.remove(s)
        return s

    def first_of(self, epoch: int) -> int | None:
        """A batch of ``epoch`` that became ready first, if any (under the lock)."""
        self._superseded(epoch)
        if self._failures:
            raise self._failures.pop(next(iter(self._failures)))
        return self._core.first_ready()

    def _superseded(self, epoch: int) -> None:
        if epoch != self.epoch:
            raise RuntimeError("this pass over the Loader was superseded by a newer one (or "
                               "ended); its batches are dropped")
