"""The consumer's side of a shared pinned ring: its memory, its workers, its service thread.

:class:`RingCore` is the state of one :class:`~cuda_memkit.SharedHostRing`:
the segment (a memfd mapped here and registered with the driver,
:class:`Segment`), the slots' states, the workers' connections, and a service
thread that accepts workers, sends grants, reads their messages (the wire
protocol of :mod:`cuda_memkit._host._ring_worker`), notices a worker's end
the moment its socket closes and, while copies from lent slots are in flight
and nobody else watches them (:attr:`RingCore.copies_watched`), polls their
events (``_core._inflight``) so that their slots come back. The consumer's
waits sleep on a condition the thread signals. It makes no driver call but
those event queries (and the registration's release).

A Loader plugs in through two attributes: :attr:`RingCore.schedule` (a
:class:`Schedule`: the batch each grant carries, and what becomes of the
batches of a pass) and :attr:`RingCore.copies_watched` (whether its own
thread watches the copies now); and it watches its worker processes
(:meth:`RingCore.watch`).

Each slot goes round: *free* -> *granted* to a worker -> *filling* -> *ready*
-> *lent* to the consumer -> *free* again once given back. The consumer alone
decides every grant, so a slot is never held by two workers.
"""

from __future__ import annotations

import atexit
import collections
import importlib
import mmap
import os
import secrets
import selectors
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from .._core._context import ensure_any_context
from .._core._errors import ClosedError
from .._core._inflight import pending_operands, reap_pending
from .._core._resource import Transaction, account
from ._registered import HostRegisterFlags, RegisteredHost, register_host
from ._ring_worker import (
    ABORT,
    ACQUIRED,
    BYE,
    FAILED,
    GRANT,
    HELLO,
    PROTOCOL,
    READY,
    REFUSED,
    WELCOME,
    close_writers,
    peer_credentials,
)

if TYPE_CHECKING:
    import numpy as np

__all__ = ["JOIN", "Key", "RingCore", "Schedule", "Segment", "WorkerError", "close_ring",
           "make_segment"]

#: Seconds between event polls while copies from lent slots are in flight.
POLL = 0.0005
#: Seconds a closing ring waits for its service thread.
JOIN = 5.0
#: Ledger account of the rings' segments: the same bytes are registered host memory
#: (account "registered"), so the statistics' totals count them once.
_ACCOUNT = account("shared_ring")

# Slot states (consumer side).
FREE, GRANTED, FILLING, READY_, LENT = range(5)
_STATE_NAMES = ("free", "granted", "filling", "ready", "lent")


class WorkerError(RuntimeError):
    """A worker process filling a :class:`SharedHostRing` (or a :class:`Loader`'s) failed.

    Raised by the consumer's next :meth:`SharedHostRing.get` /
    :meth:`~SharedHostRing.take` (or the :class:`Loader`'s iteration) when a
    worker died or left while filling a slot, or reported that it could not
    make a batch (the message then ends with the worker's traceback).

    Attributes
    ----------
    worker : int or None
        The worker's label (:meth:`RingHandle.writer`'s ``worker``).
    pid : int or None
        The worker's process id.
    slot : int or None
        The slot it was filling.
    batch : int or None
        The batch it was making (a :class:`Loader`'s), else ``None``.
    gone : bool
        Whether the worker is gone (it died, left mid-batch or gave up)
        rather than one batch failing.
    """

    def __init__(self, message: str, *, worker: int | None = None, pid: int | None = None,
                 slot: int | None = None, batch: int | None = None, gone: bool = False
                 ) -> None:
        super().__init__(message)
        self.worker = worker
        self.pid = pid
        self.slot = slot
        self.batch = batch
        self.gone = gone

    def __reduce__(self) -> tuple[Any, ...]:
        return (_worker_error, (str(self), self.worker, self.pid, self.slot, self.batch,
                                self.gone))


def _worker_error(message: str, worker: int | None, pid: int | None, slot: int | None,
                  batch: int | None, gone: bool) -> WorkerError:
    return WorkerError(message, worker=worker, pid=pid, slot=slot, batch=batch, gone=gone)


def _no() -> bool:
    return False


# -- the memory ----------------------------------------------------------------------------


class Segment:
    """The ring's memory: a memfd, its mapping here and its registration with the driver.

    :meth:`release` unregisters it and drops this process's mapping (numpy
    views made from it keep the mapping until they are gone); it runs once
    the ring is closed and no slot is lent any more.
    """

    def __init__(self, fd: int, mem: mmap.mmap, reg: RegisteredHost, device_ptr: int,
                 nbytes: int) -> None:
        self.fd = fd
        self.mem: mmap.mmap | None = mem
        self.reg: RegisteredHost | None = reg
        self.ptr = reg.ptr
        self.device_ptr = device_ptr
        self.nbytes = nbytes
        self.lock = threading.Lock()
        self.pid = os.getpid()
        _ACCOUNT.add(self.ptr, nbytes)

    def close_fd(self) -> None:
        """Close the memfd: workers already hold the memory; new ones cannot come any more."""
        with self.lock:
            self.drop_fd()

    def drop_fd(self) -> None:
        """:meth:`close_fd` for a caller holding :attr:`lock` (or a forked child)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def release(self) -> None:
        """Unregister and unmap (once); the ledger forgets the ring.

        Never in a forked child: the registration and the mapping are the
        parent's, which keeps serving (the child keeps its copy of them).
        """
        if self.pid != os.getpid():
            return
        with self.lock:
            reg, self.reg = self.reg, None
            self.mem = None  # the last numpy view over it unmaps it
        if reg is None:
            return
        self.close_fd()
        _ACCOUNT.remove(self.ptr)
        reg.close()  # a driver refusal becomes a MemkitWarning there


def make_segment(nbytes: int) -> Segment:
    """A memfd of ``nbytes``, mapped and registered (``PORTABLE | DEVICEMAP``): a ring's memory.

    Nothing is left if a step fails (the undo of each done step runs).
    """
    import numpy as np

    with Transaction() as tx:
        fd = os.memfd_create("cuda_memkit-ring", os.MFD_CLOEXEC)
        tx.push(os.close, fd)
        os.ftruncate(fd, nbytes)
        mem = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        reg = register_host(np.frombuffer(mem, np.uint8),
                            flags=HostRegisterFlags.PORTABLE | HostRegisterFlags.DEVICEMAP)
        tx.push(reg.close)
        device_ptr = reg.device_ptr
    return Segment(fd, mem, reg, device_ptr, nbytes)


# -- one worker's connection ---------------------------------------------------------------


class _Conn:
    """A worker's connection, as the service thread sees it."""

    __slots__ = ("bye", "ended", "filling", "granted", "leaving", "pid", "sock", "welcomed",
                 "worker")

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock = sock
        self.pid = pid
        self.worker = -1
        self.welcomed = False
        self.bye = False
        self.leaving = False  # a grant could not be sent: no more go to it
        self.ended = ""  # how its process ended, when a Loader saw it end first
        self.granted: set[int] = set()  # granted, not started
        self.filling: set[int] = set()  # acquired by the worker, not handed back

    def who(self) -> str:
        if self.worker >= 0:
            return f"worker {self.worker} (pid {self.pid})"
        return f"the worker with pid {self.pid}"

    @property
    def load(self) -> int:
        return len(self.granted) + len(self.filling)


Key = tuple[int, int]  # a Loader's (epoch, position) of a batch
Describe = Callable[[], str]  # how a watched process ended ("exit code 1", ...)


class _Slot:
    """One slot's state at the consumer (the ring's table holds one per slot)."""

    __slots__ = ("batch", "filler", "gen", "key", "owner", "state", "tag")

    def __init__(self) -> None:
        self.state = FREE
        self.gen = 0  # how many times it was granted
        self.owner: _Conn | None = None  # the worker it is granted to, or filled by
        self.batch = -1  # the batch its grant carries (a Loader's), else -1
        self.key: Key | None = None  # a Loader's (epoch, position) of that batch
        self.tag = -1  # what the worker published it with
        self.filler: tuple[int, int] = (-1, 0)  # (worker label, pid) that filled it


class Schedule(Protocol):
    """What a Loader hands its ring: the batch each grant carries, and what becomes of it.

    The ring calls these under its lock, from its service thread (the grants,
    the workers' answers) or the consumer's (:meth:`RingCore.first_ready`).
    Without one, grants carry no batch and every ready slot goes to the
    consumer in the order it became ready.
    """

    def next_task(self) -> tuple[Key, int] | None:
        """The key and batch of the next grant; ``None``: no batch to hand out now."""

    def wanted(self, key: Key) -> bool:
        """Whether a batch of ``key`` is still waited for (its epoch is the current one)."""

    def unused(self, key: Key, batch: int) -> None:
        """A grant never reached its worker: hand its batch out again, if still wanted."""

    def arrived(self, key: Key, s: int) -> None:
        """A wanted batch is ready in slot ``s``."""

    def failed(self, key: Key, error: WorkerError) -> None:
        """A wanted batch could not be made: ``error`` is raised where it is waited for."""

    def taken(self, key: Key) -> None:
        """The consumer took the ready batch of ``key`` in the order it became ready."""


class RingCore:
    """The state of a ring and its service thread (never holds the :class:`SharedHostRing`).

    Everything below runs under :attr:`lock`, unless it says otherwise; the
    consumer's waits sleep on :attr:`cond`. While the ring serves, finalizers
    (a :class:`RingSlot` collected on any thread, the service thread
    included) only append to :attr:`returns` and wake the thread.
    """

    def __init__(self, slots: int, stride: int, shape: tuple[int, ...], dtype: np.dtype[Any],
                 grants: int, timeout: float | None, segment: Segment,
                 listener: socket.socket, address: bytes, token: bytes) -> None:
        self.slots = slots
        self.stride = stride
        self.shape = shape
        self.dtype = dtype
        self.grants = grants
        self.timeout = timeout
        self.segment = segment
        self.listener = listener
        self.address = address
        self.token = token
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.table = [_Slot() for _ in range(slots)]
        self.free: collections.deque[int] = collections.deque(range(slots))
        self.ready: collections.deque[int] = collections.deque()  # in order of arrival
        self.returns: collections.deque[tuple[int, int]] = collections.deque()
        self.errors: collections.deque[WorkerError] = collections.deque()
        self.lent = 0
        self.conns: dict[int, _Conn] = {}  # by socket fd
        self.watched: dict[int, tuple[int, int, Describe]] = {}  # sentinel -> (pid, label, ...)
        self.reported: set[int] = set()  # pids whose end was reported already
        self.workers: set[int] = set()  # a Loader's worker processes: any end is an error
        self.schedule: Schedule | None = None  # a Loader's: every grant carries a batch
        self.closed = False
        self.hung_up = False
        self.keep_memory = False  # at interpreter exit: no driver call, the memory stays
        self.fatal: BaseException | None = None
        self.pid = os.getpid()
        self.thread: threading.Thread | None = None
        self.selector: selectors.BaseSelector | None = None
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.wake_lock = threading.Lock()  # the wake pipe's write end: written, or closed
        self.has_context = False
        #: Whether the copies from lent slots are watched elsewhere now (a Loader's thread
        #: waits on its copies' events): the service thread polls them only when not.
        self.copies_watched: Callable[[], bool] = _no

        _cores.add(self)

    # -- the service thread -----------------------------------------------------------
    def start(self) -> None:
        """Start the service thread (the ring's constructor does; a Loader after forking)."""
        sel = selectors.DefaultSelector()
        sel.register(self.listener, selectors.EVENT_READ, self._accept)
        sel.register(self.wake_r, selectors.EVENT_READ, self._woken)
        for fd in self.watched:
            sel.register(fd, selectors.EVENT_READ, self._ended)
        self.selector = sel
        t = threading.Thread(target=self._run, name="cuda_memkit-ring", daemon=True)
        self.thread = t
        t.start()

    def _run(self) -> None:
        sel = self.selector
        assert sel is not None
        try:
            while not self.closed:
                polling = self.lent and pending_operands and not self.copies_watched()
                for key, _mask in sel.select(POLL if polling else None):
                    key.data(key.fileobj)
                if polling:
                    self._reap()
                with self.lock:
                    self._take_returns()
                    self._grant()
        except BaseException as exc:  # kept for the consumer, never printed by a thread
            if sys.is_finalizing():
                return
            with self.lock:
                if not self.closed:
                    self.fatal = exc
                self.cond.notify_all()
        finally:
            self._hang_up()

    def _reap(self) -> None:
        """Let go of the copies in flight that have finished (slots lent to them come back)."""
        if not self.has_context:
            ensure_any_context()  # the event queries need a context on this thread
            self.has_context = True
        reap_pending()

    def wake(self) -> None:
        """Wake the service thread (any thread; takes no lock but the pipe's)."""
        with self.wake_lock:
            if self.wake_w >= 0:
                try:
                    os.write(self.wake_w, b"\0")
                except BlockingIOError:
                    pass  # the pipe is full: the thread is woken already

    def _woken(self, _fileobj: object) -> None:
        try:
            while os.read(self.wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    # -- workers coming and going -------------------------------------------------------
    def _accept(self, _fileobj: object) -> None:
        try:
            sock, _addr = self.listener.accept()
        except (BlockingIOError, ConnectionAbortedError):
            return  # gone before it was accepted
        sock.setblocking(False)
        pid, uid = peer_credentials(sock)
        if uid != os.geteuid():
            self._refuse(sock, "a worker must run as the same user as the consumer")
            return
        conn = _Conn(sock, pid)
        with self.lock:
            self.conns[sock.fileno()] = conn
        assert self.selector is not None
        self.selector.register(sock, selectors.EVENT_READ, self._readable)

    def _refuse(self, sock: socket.socket, why: str) -> None:
        try:
            sock.send(REFUSED + why.encode())
        except OSError:
            pass  # the refused process is gone already
        sock.close()

    def _readable(self, sock: socket.socket) -> None:
        conn = self.conns.get(sock.fileno())
        if conn is None:
            return
        reset = False
        while True:
            try:
                msg = sock.recv(HELLO.size + 64 + (32 << 10))
            except BlockingIOError:
                return
            except ConnectionResetError:
                if reset:
                    msg = b""
                else:
                    # The worker closed with grants unread: Linux reports that once, before
                    # the messages it sent last (its READYs, its BYE), which still follow.
                    reset = True
                    continue
            except OSError:
                msg = b""  # any other failure: the connection is gone
            if not msg:
                why = "left" if conn.bye else conn.ended or self._ending(conn.pid)
                with self.lock:
                    self._drop(conn, why)
                return
            with self.lock:
                if not self._message(conn, msg):
                    return
                self.cond.notify_all()

    def _ending(self, pid: int) -> str:
        """Why a worker's connection ended without a goodbye (outside the lock: it may wait)."""
        for wpid, _w, describe in list(self.watched.values()):
            if wpid == pid:
                return f"exited ({describe()})"
        return "died or closed its connection"

    def _message(self, conn: _Conn, msg: bytes) -> bool:
        """Act on one message; False once the connection was dropped."""
        kind = msg[:1]
        if not conn.welcomed:
            return self._hello(conn, msg)
        if kind == b"A" and len(msg) == ACQUIRED.size:
            _k, s, g = ACQUIRED.unpack(msg)
            if self._owned(conn, s, g, GRANTED):
                conn.granted.discard(s)
                conn.filling.add(s)
                self.table[s].state = FILLING
                return True
        elif kind == b"R" and len(msg) == READY.size:
            _k, s, g, tag = READY.unpack(msg)
            if self._owned(conn, s, g, GRANTED, FILLING):
                self._arrived(conn, s, tag)
                return True
        elif kind == b"F" and len(msg) >= FAILED.size:
            _k, s, g = FAILED.unpack(msg[:FAILED.size])
            if self._owned(conn, s, g, GRANTED, FILLING):
                self._failed(conn, s, msg[FAILED.size:].decode(errors="replace"))
                return True
        elif msg == BYE:
            conn.bye = True
            return True
        elif kind == ABORT:
            conn.bye = True
            if not self.closed:
                self.reported.add(conn.pid)
                self.errors.append(WorkerError(
                    f"{conn.who()} cannot go on: {msg[1:].decode(errors='replace')}",
                    worker=None if conn.worker < 0 else conn.worker, pid=conn.pid, gone=True))
            return True
        self._drop(conn, f"sent a message out of turn ({kind!r})")
        return False

    def _hello(self, conn: _Conn, msg: bytes) -> bool:
        if len(msg) != HELLO.size:
            self._forget(conn)
            self._refuse(conn.sock, "not a cuda_memkit ring worker")
            return False
        _k, token, worker, version = HELLO.unpack(msg)
        if not secrets.compare_digest(token, self.token) or version != PROTOCOL:
            self._forget(conn)
            self._refuse(conn.sock, "wrong ring handle or cuda_memkit version "
                                    f"(protocol {version}, this ring speaks {PROTOCOL})")
            return False
        fd = self.segment.fd
        if fd < 0:  # closing
            self._forget(conn)
            conn.sock.close()
            return False
        try:
            socket.send_fds(conn.sock, [WELCOME.pack(b"W", PROTOCOL)], [fd])
        except OSError:
            self._forget(conn)  # it left before it was welcomed
            conn.sock.close()
            return False
        conn.worker = worker
        conn.welcomed = True
        return True

    def _owned(self, conn: _Conn, s: int, g: int, *states: int) -> bool:
        if not 0 <= s < self.slots:
            return False
        t = self.table[s]
        return t.owner is conn and t.gen == g and t.state in states

    def _wanted(self, key: Key | None) -> bool:
        """Whether a batch of ``key`` is still waited for (any slot without a key is)."""
        return key is None or self.schedule is None or self.schedule.wanted(key)

    def _arrived(self, conn: _Conn, s: int, tag: int) -> None:
        conn.granted.discard(s)
        conn.filling.discard(s)
        t = self.table[s]
        t.owner = None
        key = t.key
        if not self._wanted(key):
            self._recycle(s)  # a batch of an epoch nobody waits for any more
            return
        t.state = READY_
        t.tag = tag
        t.filler = (conn.worker, conn.pid)
        self.ready.append(s)
        if key is not None and self.schedule is not None:
            self.schedule.arrived(key, s)

    def _failed(self, conn: _Conn, s: int, text: str) -> None:
        """A worker could not fill slot ``s``: the slot goes back, the error to the consumer.

        A Loader's batch fails where the consumer waits for that batch; any
        other failure at the consumer's next call (a ``DataLoader`` recipe's
        consumer takes tickets, and a failed slot has none).
        """
        conn.granted.discard(s)
        conn.filling.discard(s)
        key = self.table[s].key
        b = self.table[s].batch
        err = WorkerError(f"{self._slot_name(s)} could not be filled by {conn.who()}: {text}",
                          worker=None if conn.worker < 0 else conn.worker, pid=conn.pid,
                          slot=s, batch=None if b < 0 else b)
        self._recycle(s)
        if key is None or self.schedule is None:
            self.errors.append(err)
        elif self.schedule.wanted(key):
            self.schedule.failed(key, err)

    def _drop(self, conn: _Conn, why: str) -> None:
        """A worker's connection ended: its grants come back, a batch under way is an error."""
        self._forget(conn)
        conn.sock.close()
        lost = []
        for s in sorted(conn.granted, reverse=True):
            self._ungrant(conn, s)
        for s in sorted(conn.filling):
            lost.append(s)
            self._recycle(s)
        conn.granted.clear()
        conn.filling.clear()
        if self.closed or conn.pid in self.reported:
            pass
        elif lost:
            self._report(conn.pid, conn.worker, f"{conn.who()} {why} while filling "
                         + ", ".join(self._slot_name(s) for s in lost), lost)
        elif conn.pid in self.workers and not conn.bye:
            self._report(conn.pid, conn.worker, f"{conn.who()} {why}", [])
        self.cond.notify_all()

    def _forget(self, conn: _Conn) -> None:
        self.conns.pop(conn.sock.fileno(), None)
        if self.selector is not None:
            try:
                self.selector.unregister(conn.sock)
            except (KeyError, ValueError):
                pass  # not registered (refused at once, or closed meanwhile)

    def _slot_name(self, s: int) -> str:
        b = self.table[s].batch
        return f"slot {s}" + ("" if b < 0 else f" (batch {b})")

    def _report(self, pid: int, worker: int, message: str, slots: list[int]) -> None:
        """Queue a :class:`WorkerError` for the consumer's next wait."""
        self.reported.add(pid)
        s = slots[0] if slots else None
        b = self.table[s].batch if s is not None and self.table[s].batch >= 0 else None
        self.errors.append(WorkerError(message, worker=None if worker < 0 else worker,
                                       pid=pid, slot=s, batch=b, gone=True))

    # -- processes a Loader started ---------------------------------------------------------
    def watch(self, sentinel: int, pid: int, worker: int, describe: Describe) -> None:
        """Report the end of process ``pid`` (``sentinel`` readable) as an error, until closed.

        Call before :meth:`start` (a Loader watches the workers it forked).
        """
        self.watched[sentinel] = (pid, worker, describe)
        self.workers.add(pid)

    def _ended(self, sentinel: int) -> None:
        assert self.selector is not None
        self.selector.unregister(sentinel)
        pid, worker, describe = self.watched.pop(sentinel)
        how = f"exited ({describe()})"
        with self.lock:
            conns = [c for c in self.conns.values() if c.pid == pid]
            for conn in conns:  # its socket's end, read after the messages it sent last, says so
                conn.ended = how
            if not conns and pid not in self.reported and not self.closed:
                self.reported.add(pid)
                self.errors.append(WorkerError(f"worker {worker} (pid {pid}) {how}; its batches "
                                               "are lost", worker=worker, pid=pid, gone=True))
            self.cond.notify_all()

    # -- grants ----------------------------------------------------------------------------
    def _grant(self) -> None:
        """Hand free slots to the least busy workers, up to ``grants`` each."""
        while self.free and self.fatal is None:
            conn = None
            for c in self.conns.values():
                if c.welcomed and not (c.bye or c.leaving) and c.load < self.grants and (
                        conn is None or c.load < conn.load):
                    conn = c
            if conn is None:
                return
            key: Key | None = None
            batch = -1
            if self.schedule is not None:
                task = self.schedule.next_task()
                if task is None:
                    return  # no batch to hand out now
                key, batch = task
            s = self.free.popleft()
            t = self.table[s]
            t.gen += 1
            g = t.gen
            t.state = GRANTED
            t.owner = conn
            t.key = key
            t.batch = batch
            conn.granted.add(s)
            try:
                conn.sock.send(GRANT.pack(b"G", s, g, batch))
            except BlockingIOError:
                self._ungrant(conn, s)
                return  # its queue is full: the next wake tries again
            except OSError:
                # The worker is leaving (or gone): the grant never reaches it, but the
                # messages it sent last, and its end, are still to be read.
                conn.leaving = True
                self._ungrant(conn, s)

    def _ungrant(self, conn: _Conn, s: int) -> None:
        """A grant the worker will never use: the slot, and a Loader's batch, go to others."""
        conn.granted.discard(s)
        t = self.table[s]
        if t.key is not None and self.schedule is not None:
            self.schedule.unused(t.key, t.batch)
        self._recycle(s)

    def _recycle(self, s: int) -> None:
        t = self.table[s]
        t.state = FREE
        t.owner = None
        t.key = None
        self.free.append(s)

    def recycle_ready(self, s: int) -> None:
        """A ready slot nobody will take (a Loader's older epoch): free again."""
        self.ready.remove(s)
        self._recycle(s)

    def _take_returns(self) -> None:
        """Slots given back by the consumer (their RingSlots' releases) are free again."""
        returns = self.returns
        while returns:
            s, g = returns.popleft()
            t = self.table[s]
            if t.state == LENT and t.gen == g:
                self.lent -= 1
                self._recycle(s)
        if self.closed and not self.lent and not self.keep_memory:
            self.segment.release()

    def give_back(self, s: int, g: int) -> None:
        """A lent slot's release (any thread, finalizers included): free once the thread sees it.

        While the ring serves, only the thread takes the lock for it (a
        finalizer may run on the thread while it holds the lock); once the
        ring is closed, the slot is done with here.
        """
        if self.pid != os.getpid():
            return  # a forked child's copy of a lent slot: the slot is the parent's to take back
        self.returns.append((s, g))
        if not self.closed:
            self.wake()
            return
        with self.lock:
            self._take_returns()

    # -- the consumer's side ------------------------------------------------------------------
    def wait(self, pick: Callable[[], int | None], timeout: float | None, what: str) -> int:
        """Wait until ``pick()`` finds a ready slot; lend it (its index) or raise."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while True:
                self.check()
                s = pick()
                if s is not None:
                    self.table[s].state = LENT
                    self.lent += 1
                    return s
                if self.lent and pending_operands and not self.copies_watched():
                    self.wake()  # slots wait for copies: the thread polls their events
                if deadline is None:
                    self.cond.wait()
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{what} did not become ready within {timeout} s; "
                                       + self.outstanding())
                self.cond.wait(left)

    def filled_by(self, s: int) -> tuple[int | None, int]:
        """``(worker label or None, pid)`` of the worker that filled slot ``s``."""
        worker, pid = self.table[s].filler
        return (None if worker < 0 else worker), pid

    def check(self) -> None:
        """Raise what the consumer must see now: a foreign process, a failure, an error, a close."""
        if self.pid != os.getpid():
            raise RuntimeError(f"this SharedHostRing belongs to process {self.pid}; worker "
                               "processes fill it through ring.handle")
        if self.fatal is not None:
            raise RuntimeError(f"the SharedHostRing's service thread failed: "
                               f"{type(self.fatal).__name__}: {self.fatal}") from self.fatal
        if self.errors:
            raise self.errors.popleft()
        if self.closed:
            raise ClosedError("SharedHostRing is closed; it cannot be used any more")

    def first_ready(self) -> int | None:
        """The slot that became ready first, if any (and not a Loader's old epoch)."""
        if not self.ready:
            return None
        s = self.ready.popleft()
        key = self.table[s].key
        if key is not None and self.schedule is not None:
            self.schedule.taken(key)
        return s

    def by_ticket(self, s: int, g: int) -> int | None:
        """Slot ``s`` if it holds generation ``g`` and is ready; ``ValueError`` if it never will."""
        t = self.table[s]
        if t.gen == g and t.state == READY_:
            self.ready.remove(s)
            return s
        if t.gen == g and t.state in (GRANTED, FILLING):
            return None
        raise ValueError(f"ticket ({s}, {g}) names no batch to come: slot {s} is at generation "
                         f"{t.gen} ({_STATE_NAMES[t.state]}); a ticket is taken "
                         "once, and its batch is lost if its worker died")

    def outstanding(self) -> str:
        """What the ring waits for, for a timeout's message."""
        parts = []
        for s, t in enumerate(self.table):
            st = t.state
            conn = t.owner
            if st in (GRANTED, FILLING) and conn is not None:
                doing = "filling" if st == FILLING else "granted to, not started by"
                parts.append(f"{self._slot_name(s)} {doing} {conn.who()}")
        workers = sum(1 for c in self.conns.values() if c.welcomed)
        head = f"{workers} worker(s) connected"
        if not workers:
            head += " (start the workers: they fill the ring through ring.handle.writer())"
        counts = self.counts()
        head += f"; slots: {', '.join(f'{n} {k}' for k, n in counts.items() if n)}"
        return head + ("; " + "; ".join(parts) if parts else "")

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(_STATE_NAMES, 0)
        for t in self.table:
            out[_STATE_NAMES[t.state]] += 1
        return out

    # -- closing ----------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Close the ring: the thread stops, every worker's connection closes. No driver call."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self.cond.notify_all()
        t = self.thread
        if t is not None and t.is_alive() and t is not threading.current_thread():
            self.wake()
            t.join(JOIN)
        if t is None or not t.is_alive():
            self._hang_up()

    def _hang_up(self) -> None:
        """Close the listener, the workers' connections and the wake pipe (once)."""
        with self.lock:
            if self.hung_up:
                return
            self.hung_up = True
            conns = list(self.conns.values())
            self.conns.clear()
            self._take_returns()
        with self.wake_lock, self.segment.lock:
            self._close_all(conns)
        if self.selector is not None:
            self.selector.close()

    def _close_all(self, conns: list[_Conn]) -> None:
        """Close the listener, ``conns``' sockets, the memfd and the wake pipe.

        The caller holds the wake pipe's and the segment's locks (or is a forked child).
        """
        self.listener.close()
        for conn in conns:
            conn.sock.close()
        self.segment.drop_fd()
        if self.wake_w >= 0:
            os.close(self.wake_w)
            os.close(self.wake_r)
            self.wake_w = self.wake_r = -1

    def release_if_idle(self) -> None:
        """Give the memory back now if no slot is lent (else the last give-back does)."""
        with self.lock:
            self._take_returns()

    def forget_in_child(self) -> None:
        """In a forked child: close this process's copies of the parent's descriptors.

        Without the locks: the child has one thread, and a lock that another of the
        parent's threads held at the fork stays held here for ever.
        """
        self.closed = True
        self.keep_memory = True  # the registration and the mapping stay the parent's
        self._close_all(list(self.conns.values()))


#: Every ring of this process whose service may still run (for fork and interpreter exit).
_cores: weakref.WeakSet[RingCore] = weakref.WeakSet()


#: In a forked child: the parent's rings, never to be collected here. The driver may leave a
#: registered range out of the child's address space, and the child's own mapping of the
#: ring can land at that address: unmapping the parent's would unmap the child's.
_inherited: list[RingCore] = []


def _forget_in_child() -> None:
    for core in list(_cores):
        core.forget_in_child()
        _inherited.append(core)
    _cores.clear()


def _stop_at_exit() -> None:
    # Workers see their connections close and stop; no driver call is made at exit.
    for core in list(_cores):
        core.keep_memory = True
        core.shutdown()


os.register_at_fork(after_in_child=_forget_in_child)
# After multiprocessing's own exit hook, so that this one runs first: workers see the ring
# close and stop before multiprocessing joins those that are its children.
importlib.import_module("multiprocessing.util")
atexit.register(_stop_at_exit)


def close_ring(core: RingCore) -> None:
    """Release function of a SharedHostRing: stop serving; the memory goes once no slot is lent.

    In a forked child it does nothing: the ring is the parent's (its locks may
    be held there by threads the child does not have).
    """
    if core.pid != os.getpid():
        return
    core.shutdown()
    close_writers(core.address)  # writers of this process (a test's, a thread's) stop too
    core.release_if_idle()
