"""The worker side of a shared pinned ring: :class:`RingHandle`, :class:`RingWriter`, slots.

A :class:`~cuda_memkit.SharedHostRing` lives in the consuming process; worker
processes fill its slots through the picklable :class:`RingHandle` it gives
out (``ring.handle``). Nothing here calls the CUDA driver: a worker needs no
GPU, no context and no CUDA library at all.

The wire protocol
-----------------
The consumer listens on a Unix socket in Linux's abstract namespace (no file
anywhere, gone with the process). A worker connects, proves it holds the
handle (a random token) and is the same user (``SO_PEERCRED``), and receives
the ring's memory as a memfd over the socket (``SCM_RIGHTS``): the segment
has no name, in ``/dev/shm`` or anywhere else, so nothing can be left behind
by any crash. Then, one ``SOCK_SEQPACKET`` message each:

* consumer -> worker ``GRANT(slot, generation, batch)``: the slot is this
  worker's to fill (with batch ``batch`` for a :class:`~cuda_memkit.Loader`);
* worker -> consumer ``ACQUIRED``, when it starts filling a granted slot
  (so that a death mid-batch is told from one with unused grants), then
  ``READY(tag)`` or ``FAILED(text)``; ``BYE`` when it leaves on purpose,
  ``ABORT(text)`` when it cannot go on (its error is the consumer's).

The consumer alone decides which slot goes where, so a slot cannot be handed
out twice; the kernel closes a dead worker's socket, so the consumer learns
of the death at once; and a consumer that closes or dies closes every
worker's socket, which their next call reports as :class:`ClosedError`.
"""

from __future__ import annotations

import mmap
import os
import socket
import struct
import threading
import traceback
from typing import TYPE_CHECKING, Any

from .._core._checks import check_index
from .._core._errors import ClosedError

if TYPE_CHECKING:
    import numpy as np
    from typing_extensions import Self

__all__ = [
    "ABORT",
    "ACQUIRED",
    "BYE",
    "FAILED",
    "GRANT",
    "HELLO",
    "MAX_LABEL",
    "PROTOCOL",
    "READY",
    "REFUSED",
    "WELCOME",
    "RingHandle",
    "RingWriter",
    "WriterSlot",
    "check_label",
    "check_timeout",
    "close_inherited",
    "close_writers",
    "peer_credentials",
    "slot_view",
]

#: Version of the wire protocol: a worker and a consumer must speak the same one.
PROTOCOL = 1
#: Message layouts: a one-byte type, then fixed fields (little-endian).
HELLO = struct.Struct("<c16sqI")  # b"H", token, worker label (-1: none), protocol
WELCOME = struct.Struct("<cI")  # b"W", protocol; the memfd rides along (SCM_RIGHTS)
REFUSED = b"X"  # b"X" + a UTF-8 reason, then the consumer closes the connection
GRANT = struct.Struct("<cIQq")  # b"G", slot, generation, batch (-1: none)
ACQUIRED = struct.Struct("<cIQ")  # b"A", slot, generation
READY = struct.Struct("<cIQq")  # b"R", slot, generation, tag (-1: none)
FAILED = struct.Struct("<cIQ")  # b"F", slot, generation + UTF-8 traceback text
BYE = b"B"
ABORT = b"E"  # b"E" + a UTF-8 traceback: the worker cannot go on
#: The most text a FAILED message carries (a packet must fit the socket's buffer).
FAILED_TEXT = 32 << 10
_NONE = -1
#: ``mmap``'s ``MAP_POPULATE`` (Linux, the only platform of the ring): the pages mapped at once.
MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
_CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_credentials(sock: socket.socket) -> tuple[int, int]:
    """``(pid, uid)`` of the process at the other end of a Unix socket (``SO_PEERCRED``)."""
    pid, uid, _gid = _CREDS.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDS.size))
    return pid, uid


def slot_view(mem: Any, index: int, stride: int, shape: tuple[int, ...],
              dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """A numpy view of slot ``index`` of the segment ``mem`` (an mmap)."""
    import numpy as np

    count = 1
    for d in shape:
        count *= d
    return np.frombuffer(mem, dtype, count, index * stride).reshape(shape)


def _recv(sock: socket.socket, timeout: float | None) -> bytes:
    """One message, waiting up to ``timeout`` seconds (``socket.timeout`` past it)."""
    if timeout is not None:
        import select

        ready, _, _ = select.select([sock], [], [], timeout)
        if not ready:
            raise TimeoutError("timed out")
    return sock.recv(256)


def _error_text(error: BaseException | str) -> bytes:
    """An exception's traceback (or a message), as a FAILED or ABORT message carries it."""
    if isinstance(error, BaseException):
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    elif isinstance(error, str):
        text = error
    else:
        raise TypeError(f"error must be an exception or a str, not {type(error).__name__}")
    return text.encode(errors="replace")[-FAILED_TEXT:]


def _handshake(sock: socket.socket, handle: RingHandle, worker: int,
               timeout: float | None) -> tuple[bytes, list[int]]:
    """Connect, say hello, and return the consumer's answer (message, passed descriptors)."""
    sock.settimeout(timeout)
    try:
        sock.connect(handle._address)
        sock.sendall(HELLO.pack(b"H", handle._token, worker, PROTOCOL))
        msg, fds, _flags, _addr = socket.recv_fds(sock, 4096, 1)
    except TimeoutError:
        raise TimeoutError(f"the SharedHostRing's consumer did not answer within "
                           f"{timeout} s") from None
    except OSError as exc:
        if exc.errno not in _GONE and not isinstance(exc, FileNotFoundError):
            raise
        raise ClosedError("no consumer listens for this ring: the SharedHostRing was closed "
                          "(or its process exited)") from None
    sock.settimeout(None)
    return msg, fds


def _label(worker: int) -> str:
    return "worker" if worker == _NONE else f"worker {worker}"


class RingHandle:
    """What a worker process needs to fill the slots of a :class:`SharedHostRing`.

    Get it from :attr:`SharedHostRing.handle`; it pickles (``spawn``,
    ``forkserver``, a ``DataLoader``'s dataset) and is inherited by ``fork``.
    It holds no memory and no open file: :meth:`writer` connects to the ring's
    consumer and maps the slots.

    Attributes
    ----------
    slots : int
        Number of slots in the ring.
    shape : tuple of int
        Shape of the array in each slot.
    dtype : numpy.dtype
        Element type of the array in each slot.
    slot_nbytes : int
        Bytes of the array in each slot.
    """

    __slots__ = ("_address", "_dtype", "_shape", "_stride", "_token", "slot_nbytes", "slots")
    _address: bytes
    _token: bytes
    _stride: int
    _shape: tuple[int, ...]
    _dtype: str
    slots: int
    slot_nbytes: int

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("a RingHandle is made by a SharedHostRing: use ring.handle")

    @classmethod
    def make(cls, address: bytes, token: bytes, slots: int, stride: int,
             shape: tuple[int, ...], dtype: str, slot_nbytes: int) -> RingHandle:
        """The handle of a ring listening at ``address`` (used by the ring and by unpickling)."""
        self = object.__new__(cls)
        self._address = address
        self._token = token
        self.slots = slots
        self._stride = stride
        self._shape = tuple(shape)
        self._dtype = dtype
        self.slot_nbytes = slot_nbytes
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (RingHandle.make, (self._address, self._token, self.slots, self._stride,
                                  self._shape, self._dtype, self.slot_nbytes))

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the array in each slot."""
        return self._shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """Element type of the array in each slot."""
        import numpy as np

        return np.dtype(self._dtype)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RingHandle) and other._address == self._address

    def __hash__(self) -> int:
        return hash(self._address)

    def __repr__(self) -> str:
        return (f"<RingHandle slots={self.slots} shape={self._shape} dtype={self._dtype} "
                f"consumer={self._address[1:].decode()!r}>")

    def writer(self, worker: int | None = None, *, timeout: float | None = 60.0) -> RingWriter:
        """Return this process's :class:`RingWriter` for the ring, connecting on first use.

        One writer per process, ring and ``worker`` label: later calls (from a
        ``DataLoader`` dataset's ``__getitem__``, say) return the same open
        writer. Threads of one process that fill slots side by side take
        writers of different labels. A process forked from one that had a
        writer gets a new one of its own. Connecting maps every page of the
        ring into this process at once, so that no fill takes page faults
        the first time it writes a slot.

        Parameters
        ----------
        worker : int, optional
            A label for this worker in the consumer's errors and statistics
            (e.g. ``torch.utils.data.get_worker_info().id``), ``>= 0`` and
            ``< 2**63``; default: none, the process id names it.
        timeout : float or None, default 60
            Seconds to wait for the consumer to answer the connection
            (``None`` or ``inf``: no limit).

        Raises
        ------
        ClosedError
            If the ring's consumer closed it or exited.
        TypeError, ValueError
            For a ``worker`` that is not an int >= 0, or a bad ``timeout``.
        """
        label = _NONE if worker is None else check_label(worker, "worker")
        wait = check_timeout(timeout)
        key = (self._address, os.getpid(), label)
        with _writers_lock:
            w = _writers.get(key)
            if w is not None and not w.closed:
                return w
            w = RingWriter(self, label, wait)
            _writers[key] = w
            for k in [k for k, v in _writers.items() if v.closed]:
                del _writers[k]  # writers closed since: their sockets are closed already
        return w


def check_timeout(timeout: object, what: str = "timeout") -> float | None:
    """A timeout in seconds: a number > 0, or ``None`` (no limit).

    One rule for every timeout of the ring and the Loader: ``inf``, and any
    wait longer than the interpreter's waits can take
    (``threading.TIMEOUT_MAX``, centuries), means no limit, as ``None`` does.
    """
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"{what} must be a number of seconds or None, not "
                        f"{type(timeout).__name__}")
    if not timeout > 0:
        raise ValueError(f"{what} must be > 0 seconds (or None: no limit), got {timeout}")
    if timeout >= threading.TIMEOUT_MAX:
        return None  # longer than any wait can be: no limit
    return float(timeout)


#: Largest label, tag or batch number: the wire protocol carries them as signed 64-bit ints.
MAX_LABEL = (1 << 63) - 1


def check_label(value: object, what: str) -> int:
    """A worker label, a tag or a batch number: an int in ``[0, 2**63)``."""
    v = check_index(value, what)
    if not 0 <= v <= MAX_LABEL:
        raise ValueError(f"{what} must be >= 0 and < 2**63, got {v}")
    return v


#: The writer of each (ring address, process, label): RingHandle.writer() reuses it, so a
#: DataLoader worker calling it per item keeps one connection.
_writers: dict[tuple[bytes, int, int], RingWriter] = {}
_writers_lock = threading.Lock()


def _uncache(writer: RingWriter) -> None:
    """Forget a closed writer: nothing of this process keeps it (and its mapping) alive."""
    with _writers_lock:
        key = (writer._handle._address, writer._pid, writer._worker)
        if _writers.get(key) is writer:
            del _writers[key]


def close_writers(address: bytes) -> None:
    """Close this process's writers of the ring at ``address`` (its consumer closed it here)."""
    with _writers_lock:
        mine = [k for k in _writers if k[0] == address]
        writers = [_writers.pop(k) for k in mine]
    for w in writers:
        w.close()


class RingWriter:
    """A worker's connection to a :class:`SharedHostRing`: takes slots, fills, publishes.

    Made by :meth:`RingHandle.writer`. The consumer grants slots to the
    writer ahead of time (up to the ring's ``grants`` per worker);
    :meth:`acquire` takes the next one, and the :class:`WriterSlot` it returns
    is published (``READY``) or failed. Needs no CUDA.

    Raises :class:`ClosedError` from any call once the consumer has closed the
    ring or exited: stop filling then. :meth:`close` (or leaving a ``with``
    block) tells the consumer this worker leaves; unused grants go back.
    """

    def __init__(self, handle: RingHandle, worker: int, timeout: float | None) -> None:
        import numpy as np

        self._handle = handle
        self._worker = worker
        self._pid = os.getpid()
        self._lock = threading.Lock()  # the state and the sends
        self._recv_lock = threading.Lock()  # one acquire() waiting at a time
        self._closed = False
        self._open: dict[int, WriterSlot] = {}  # acquired slots, not yet published
        self._mem: mmap.mmap | None = None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            msg, fds = _handshake(sock, handle, worker, timeout)
            if not msg:
                raise ClosedError("the SharedHostRing's consumer closed the connection before "
                                  "welcoming this worker (the ring is closing)")
            try:
                if msg[:1] == REFUSED:
                    raise RuntimeError(f"the SharedHostRing refused this worker: "
                                       f"{msg[1:].decode(errors='replace')}")
                if msg[:1] != b"W" or len(fds) != 1:
                    raise RuntimeError("the SharedHostRing answered with an unexpected message")
                size = handle._stride * handle.slots
                # MAP_POPULATE maps every page now, so that no fill pays a fault per 4 KiB
                # page the first time this worker is granted its slot (see docs/decisions.md).
                self._mem = mmap.mmap(fds[0], size, mmap.MAP_SHARED | MAP_POPULATE,
                                      mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                for fd in fds:
                    os.close(fd)  # the mapping keeps the memory; the descriptor is not needed
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._dtype = np.dtype(handle._dtype)

    # -- state ------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """Whether the writer was closed (by :meth:`close`, or by the consumer)."""
        return self._closed

    @property
    def worker(self) -> int | None:
        """The label given to :meth:`RingHandle.writer` (``None``: none)."""
        return None if self._worker == _NONE else self._worker

    def _check(self) -> None:
        if self._pid != os.getpid():
            raise RuntimeError(
                f"this RingWriter belongs to process {self._pid}; call handle.writer() in "
                f"process {os.getpid()} for one of its own")
        if self._closed:
            raise ClosedError("this RingWriter is closed")

    def _gone(self) -> ClosedError:
        self._shut()
        return ClosedError("the SharedHostRing's consumer closed the ring (or its process "
                           "exited): stop filling")

    def _gone_unlocked(self) -> ClosedError:
        """:meth:`_gone` for a caller without the state lock (a waiting :meth:`acquire`)."""
        with self._lock:
            return self._gone()

    def _send(self, data: bytes) -> None:
        try:
            self._sock.send(data)
        except OSError as exc:
            if exc.errno not in _GONE:
                raise
            raise self._gone() from None

    # -- filling ----------------------------------------------------------------------
    def acquire(self, *, timeout: float | None = None) -> WriterSlot:
        """Take the next slot the consumer granted this worker, waiting for one.

        Parameters
        ----------
        timeout : float or None, default None
            Seconds to wait for a grant; ``None`` (or ``inf``): as long as it takes.

        Returns
        -------
        WriterSlot
            Its ``array`` is the slot, to fill in place; then :meth:`WriterSlot.publish`.

        Raises
        ------
        ClosedError
            If the consumer closed the ring or exited.
        TimeoutError
            If no slot was granted within ``timeout``.
        """
        wait = check_timeout(timeout)
        with self._recv_lock:  # not the state lock: publish() may run meanwhile
            self._check()
            try:
                msg = _recv(self._sock, wait)
            except TimeoutError:
                raise TimeoutError(f"no slot was granted to this worker within {timeout} s "
                                   "(the consumer holds them all)") from None
            except OSError as exc:
                if exc.errno not in _GONE and not self._closed:
                    raise
                raise self._gone_unlocked() from None
        if not msg:
            raise self._gone_unlocked()
        if msg[:1] != b"G" or len(msg) != GRANT.size:
            raise RuntimeError(f"unexpected message from the SharedHostRing: {msg[:1]!r}")
        _t, index, gen, batch = GRANT.unpack(msg)
        h = self._handle
        with self._lock:
            self._check()
            mem = self._mem
            assert mem is not None  # open: mapped
            slot = WriterSlot.make(self, index, gen, None if batch == _NONE else batch,
                                   slot_view(mem, index, h._stride, h._shape, self._dtype))
            self._send(ACQUIRED.pack(b"A", index, gen))
            self._open[index] = slot
        return slot

    def publish(self, slot: WriterSlot, tag: int | None = None) -> tuple[int, int]:
        """Hand a filled slot to the consumer (``READY``); see :meth:`WriterSlot.publish`."""
        t = _NONE if tag is None else check_label(tag, "tag")  # before the slot is handed back
        with self._lock:
            self._check()
            self._take_back(slot)
            self._send(READY.pack(b"R", slot.index, slot.generation, t))
        return slot.index, slot.generation

    def fail(self, slot: WriterSlot, error: BaseException | str) -> None:
        """Tell the consumer the slot's batch could not be made; see :meth:`WriterSlot.fail`."""
        data = _error_text(error)
        with self._lock:
            self._check()
            self._take_back(slot)
            self._send(FAILED.pack(b"F", slot.index, slot.generation) + data)

    def abort(self, error: BaseException | str) -> None:
        """Tell the consumer this worker cannot go on, then leave (as :meth:`close`).

        The consumer's next :meth:`SharedHostRing.get` (or the
        :class:`Loader`'s next batch) raises :class:`WorkerError` with
        ``error``'s traceback: for failures outside a batch, such as a
        worker's setup. Nothing happens if the consumer is gone already.
        """
        data = _error_text(error)
        with self._lock:
            if self._closed or self._pid != os.getpid():
                return
            try:
                self._sock.send(ABORT + data)
            except OSError:
                pass  # the consumer is gone already: nothing to tell
            self._shut()

    def _take_back(self, slot: WriterSlot) -> None:
        if not isinstance(slot, WriterSlot):
            raise TypeError(f"expected a WriterSlot from acquire(), not {type(slot).__name__}")
        if self._open.get(slot.index) is not slot:
            raise ValueError(f"slot {slot.index} is not open in this writer (published "
                             "already, or acquired by another writer)")
        del self._open[slot.index]
        slot.done()

    # -- lifetime ---------------------------------------------------------------------
    def close(self) -> None:
        """Leave the ring: the consumer takes back the slots granted and not filled.

        Slots acquired and neither published nor failed count as abandoned
        mid-batch (the consumer reports them). Calling it again does nothing.
        """
        with self._lock:
            if self._closed or self._pid != os.getpid():
                return
            try:
                self._sock.send(BYE)
            except OSError:
                pass  # the consumer is gone already: nothing to tell
            self._shut()

    def _shut(self) -> None:
        self._closed = True
        for slot in list(self._open.values()):
            slot.done()
        self._open.clear()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes an acquire() waiting on a thread
        except OSError:
            pass  # not connected any more
        self._sock.close()
        self._unmap()
        _uncache(self)

    def _unmap(self) -> None:
        """Drop the mapping of the ring (now, or when the last view of a slot is gone)."""
        mem, self._mem = self._mem, None
        if mem is not None:
            try:
                mem.close()
            except BufferError:
                pass  # a slot's array is still referenced: the mapping goes with the last one

    def forget(self) -> None:
        """In a forked child: let go of the parent's connection without telling the consumer."""
        self._closed = True
        self._sock.close()
        self._unmap()

    def __enter__(self) -> Self:
        self._check()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"open slots={sorted(self._open)}"
        return f"<RingWriter {_label(self._worker)} pid={self._pid} {state}>"


#: errno values of a peer that is gone.
_GONE = {32, 104, 107, 111}  # EPIPE, ECONNRESET, ENOTCONN, ECONNREFUSED


class WriterSlot:
    """A slot granted to a worker: fill :attr:`array`, then :meth:`publish`.

    Made by :meth:`RingWriter.acquire`. As a context manager it publishes on
    normal exit and reports the exception (:meth:`fail`) when the block
    raises, which then propagates.

    Attributes
    ----------
    index : int
        The slot's number in the ring.
    generation : int
        How many times the slot was granted; ``(index, generation)`` is the
        ticket :meth:`SharedHostRing.take` takes.
    batch : int or None
        The batch the consumer asked for (a :class:`Loader`), else ``None``.
    """

    __slots__ = ("_array", "_writer", "batch", "generation", "index")
    _array: np.ndarray[Any, Any] | None
    _writer: RingWriter
    batch: int | None
    generation: int
    index: int

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("a WriterSlot is made by RingWriter.acquire()")

    @classmethod
    def make(cls, writer: RingWriter, index: int, generation: int, batch: int | None,
             array: np.ndarray[Any, Any]) -> WriterSlot:
        """A slot acquired by ``writer`` (used by :meth:`RingWriter.acquire`)."""
        self = object.__new__(cls)
        self._writer = writer
        self.index = index
        self.generation = generation
        self.batch = batch
        self._array = array
        return self

    @property
    def array(self) -> np.ndarray[Any, Any]:
        """The slot's memory as a numpy array (shape and dtype of the ring), to fill in place.

        Raises
        ------
        ClosedError
            Once the slot was published or failed: it is the consumer's then.
        """
        arr = self._array
        if arr is None:
            raise ClosedError(f"slot {self.index} was handed back to the consumer; it is not "
                              "this worker's to write any more")
        return arr

    @property
    def ticket(self) -> tuple[int, int]:
        """``(index, generation)``: what :meth:`SharedHostRing.take` takes to find this slot."""
        return self.index, self.generation

    def done(self) -> None:
        """Drop the view: the slot is not this worker's any more (used by the writer)."""
        self._array = None

    def publish(self, tag: int | None = None) -> tuple[int, int]:
        """Hand the filled slot to the consumer; the worker must not write to it any more.

        Parameters
        ----------
        tag : int, optional
            A number ``>= 0`` and ``< 2**63`` the consumer sees as
            ``RingSlot.tag`` (a batch index, say); a :class:`Loader` worker's
            slots carry their batch.

        Returns
        -------
        tuple of int
            The ticket ``(index, generation)``: pass it to the consumer (a
            ``DataLoader`` worker returns it) for :meth:`SharedHostRing.take`.

        Raises
        ------
        ClosedError
            If the consumer closed the ring or exited (the batch is dropped).
        ValueError
            If the slot was published or failed already, or for a ``tag``
            out of range (the slot stays this worker's then).
        """
        return self._writer.publish(self, tag)

    def fail(self, error: BaseException | str) -> None:
        """Report that this slot's batch could not be made.

        The consumer raises :class:`WorkerError` with ``error``'s traceback
        where it would have taken the slot, and the slot goes back to the ring.
        """
        self._writer.fail(self, error)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        if self._array is None:
            return  # published or failed inside the block
        if exc is None:
            self.publish(self.batch)
            return
        try:
            self.fail(exc)
        except ClosedError:
            pass  # the consumer is gone: the block's own exception is what matters

    def __repr__(self) -> str:
        state = "open" if self._array is not None else "handed back"
        batch = "" if self.batch is None else f" batch={self.batch}"
        return f"<WriterSlot {self.index} generation={self.generation}{batch} {state}>"


def close_inherited() -> None:
    """In a forked child: let go of the parent's writers (their sockets are the parent's)."""
    for w in list(_writers.values()):
        if w._pid != os.getpid():
            w.forget()
    _writers.clear()


os.register_at_fork(after_in_child=close_inherited)
