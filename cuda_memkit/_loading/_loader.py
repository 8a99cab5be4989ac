"""Batches made by worker processes, copied to the GPU from a shared pinned ring: :class:`Loader`.

``Loader(make_batch, batches, shape, dtype, workers=N)`` starts ``N`` worker
processes around a :class:`~cuda_memkit.SharedHostRing`. The ring grants
each worker slots with the batch to make in them; the worker runs
``make_batch(batch, out)`` with ``out`` the slot itself (a numpy array of
``shape`` and ``dtype``) and publishes it. Iterating the loader takes the
batches in order (or as they come), copies each slot into a new device
buffer on the loader's stream (the slot is pinned memory: one asynchronous
copy at full speed, no copy in between) and gives the slot back to the
workers once that copy has finished.

Ordering: ``ordered=True`` yields batch ``batches[i]`` as the ``i``-th item;
batches are handed out in that order, so a slow batch holds the ones behind
it only as long as the ring has room for them. Prefetch: each worker works
up to ``prefetch`` batches ahead; the ring has ``workers * prefetch + 2``
slots (two for the batches being copied). Shutdown: :meth:`Loader.close`
(or ``with``, or collection) closes the ring, which every worker sees at its
next call and stops; stragglers are terminated after a few seconds.
"""

from __future__ import annotations

import functools
import gc
import importlib
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .._core._checks import check_bool, check_index, check_positive
from .._core._context import ensure_context
from .._core._device import existing_ordinal
from .._core._errors import ClosedError
from .._core._resource import Resource, Transaction, make_finalizer
from .._core._stream import StreamLike, stream_handle
from .._host._ring_core import JOIN, WorkerError
from .._host._ring_worker import MAX_LABEL, RingHandle, check_label, check_timeout
from .._host._shared_ring import (
    MAX_SLOTS,
    RingSlot,
    SharedHostRing,
    copy_to_new,
    device_pool,
    lend,
    ring_core,
    unstarted_ring,
)
from .._pools._pool import MemoryPool
from ._copies import CopyWatcher
from ._schedule import Epochs

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["OUTPUTS", "Loader", "worker_main"]

#: What iterating a Loader yields: device buffers, the slots themselves, framework tensors.
OUTPUTS = ("buffer", "slot", "torch", "cupy")
#: Most worker processes a Loader starts.
MAX_WORKERS = 1024

MakeBatch = Callable[[int, "np.ndarray[Any, Any]"], object]


def worker_main(handle: RingHandle, worker: int, make_batch: MakeBatch,
                init: Callable[[int], object] | None) -> None:
    """A Loader's worker process: fill the slots granted to it until the ring closes."""
    # Objects inherited through fork are never collected here: a buffer's finalizer
    # would make a driver call in a process that must not touch CUDA.
    gc.freeze()
    try:
        writer = handle.writer(worker)
    except ClosedError:
        return  # the loader closed before this worker came up
    try:
        with writer:
            if init is not None:
                try:
                    init(worker)
                except Exception as exc:
                    writer.abort(exc)  # the consumer's next batch raises it
                    return
            while True:
                slot = writer.acquire()
                try:
                    make_batch(slot.batch, slot.array)  # type: ignore[arg-type]  # set: a Loader's
                except Exception as exc:
                    slot.fail(exc)
                    continue
                slot.publish(slot.batch)
    except (ClosedError, KeyboardInterrupt):
        return  # the loader closed (or Ctrl-C, which the consumer handles): stop quietly


def _exit_of(proc: Any) -> str:
    """How a worker process ended, for an error message."""
    proc.join(0.5)  # its sentinel fires before the kernel has its exit status: wait for that
    code = proc.exitcode
    if code is None:
        return "its connection closed; the process still runs"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "an unknown signal"
        return f"killed by signal {-code} ({name})"
    return f"exit code {code}"


def _stop(ring: SharedHostRing, procs: list[Any], copies: list[CopyWatcher], pid: int) -> None:
    """Release function of a Loader: close the ring, then let the workers go.

    In a forked child it does nothing: the workers and the ring are the parent's.
    """
    if pid != os.getpid():
        return
    ring.close()  # each worker's connection closes: it stops at its next call
    for watcher in copies:
        watcher.close()  # the copies in flight finish; their slots go back to the closed ring
    copies.clear()
    deadline = time.monotonic() + JOIN
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()  # stuck inside make_batch
    for p in procs:
        p.join(1.0)
        if p.is_alive():
            p.kill()
            p.join()
        p.close()
    procs.clear()


def _batches(batches: object) -> Sequence[int]:
    """The batches of one pass, checked without walking a range (one may be huge)."""
    if isinstance(batches, bool):
        raise TypeError("batches must be an int (a count) or a sequence of ints, not bool")
    if isinstance(batches, int) or (hasattr(batches, "__index__") and not hasattr(
            batches, "__len__")):
        n = check_index(batches, "batches")
        if not 0 <= n <= MAX_LABEL:
            raise ValueError(f"batches (a count) must be >= 0 and < 2**63, got {n}")
        return range(n)
    if isinstance(batches, range):
        _check_range(batches)
        return batches
    if _is_int_array(batches):
        return _array_batches(batches)
    try:
        seq = [check_label(b, "each batch") for b in batches]  # type: ignore[attr-defined]
    except TypeError as exc:
        if "each batch" in str(exc):
            raise
        raise TypeError(f"batches must be an int (a count) or a sequence of ints, not "
                        f"{type(batches).__name__}") from None
    except ValueError as exc:
        raise ValueError(f"batches: {exc}") from None
    return seq


def _is_int_array(value: object) -> bool:
    return type(value).__module__ == "numpy" and getattr(
        getattr(value, "dtype", None), "kind", "") in ("i", "u")


def _array_batches(arr: Any) -> list[int]:
    """A numpy array of batch numbers, checked at once (a shuffled ``permutation(n)``)."""
    if arr.ndim != 1:
        raise ValueError(f"batches must be one-dimensional, got an array of shape {arr.shape}")
    if arr.size and (arr.min() < 0 or int(arr.max()) > MAX_LABEL):
        raise ValueError(f"batches: each batch must be >= 0 and < 2**63, got "
                         f"{int(arr.min()) if arr.min() < 0 else int(arr.max())}")
    out: list[int] = arr.tolist()
    return out


def _check_range(r: range) -> None:
    """A range of batches: its length and its ends, in constant time."""
    try:
        count = len(r)
    except OverflowError:
        raise ValueError("batches: a range of 2**63 batches or more is more than one pass "
                         "can hold") from None
    if count:
        for end in (r[0], r[-1]):  # a range's smallest and largest are its ends
            if not 0 <= end <= MAX_LABEL:
                raise ValueError(f"batches: each batch must be >= 0 and < 2**63, got {end}")


class Loader(Resource):
    """Batches made by worker processes, yielded on the GPU through a shared pinned ring.

    Each of ``workers`` processes runs ``make_batch(batch, out)`` for the
    batches the loader hands it: ``out`` is a slot of a
    :class:`SharedHostRing`, a numpy array of ``shape`` and ``dtype`` in
    memory this process has registered as pinned, to fill in place (no
    return value, no copy). Iterating the loader yields, for each batch,
    a new device buffer holding it: the slot copied on ``stream`` at pinned
    speed, then given back to the workers once the copy has finished.

    Parameters
    ----------
    make_batch : callable
        ``make_batch(batch, out)``: fill ``out`` with batch ``batch``. Runs
        in the worker processes: with ``start_method`` ``"spawn"`` or
        ``"forkserver"`` it must pickle (a module-level function, or a
        ``functools.partial`` of one). An exception it raises is raised in
        this process as :class:`WorkerError` (with its traceback) where the
        batch would have been yielded.
    batches : int or sequence of int
        The batches of one pass: ``n`` (``0 .. n-1``) or the numbers to give
        ``make_batch`` in order (a shuffled permutation, say; a ``range`` is
        kept as it is, however long). Each is ``>= 0`` and ``< 2**63``.
    shape : int or tuple of int
        Shape of one batch.
    dtype : dtype-like, default uint8
        Element type of one batch.
    workers : int, default 4
        Worker processes.
    prefetch : int, default 2
        Batches each worker works ahead.
    ordered : bool, default True
        Yield the batches in the order of ``batches``; ``False``: as they
        become ready.
    output : {"buffer", "slot", "torch", "cupy"}, default "buffer"
        What each item is: a :class:`PoolBuffer` of device memory (bytes:
        ``buf.as_array(loader.dtype, loader.shape)`` for a typed view); the
        :class:`RingSlot` itself, on the host (close it to give it back);
        or a torch tensor / CuPy array of ``shape`` and ``dtype`` made from
        the device buffer through DLPack.
    device : int or Device, optional
        The device the batches go to; default: the current device.
    stream : stream-like, optional
        The stream the copies (and the buffers' allocations) are ordered
        on; use the batches on it, or wait for it. Default: the legacy
        default stream, or for ``"torch"`` / ``"cupy"`` the framework's
        current stream at each batch.
    pool : MemoryPool, optional
        The device pool the buffers come from; default: the device's default
        pool with the process's block cache in front
        (``MemoryPool.default(device, cache=True)``).
    init : callable, optional
        ``init(worker)`` runs first in each worker process (seed random
        generators, open files); ``worker`` is ``0 .. workers-1``.
    timeout : float or None, default 120
        Seconds to wait for a batch before ``TimeoutError`` naming the slots
        being filled and their workers (``None`` or ``inf``: no limit). A
        worker that dies is reported at once.
    start_method : {"fork", "spawn", "forkserver"}, optional
        How the workers start; default: :mod:`multiprocessing`'s. ``"fork"``
        starts fastest and shares what this process holds (a preloaded
        array) without pickling; ``"forkserver"`` and ``"spawn"`` are safe
        in a process with threads (one that uses CUDA has them).

    Raises
    ------
    TypeError, ValueError
        For a bad argument, before any process starts or memory is taken.
    ImportError
        For ``output="torch"`` or ``"cupy"`` where that framework is missing.
    NotImplementedError
        Off Linux (see :class:`SharedHostRing`).

    Notes
    -----
    The loader is a :class:`Resource`: :meth:`close` (or ``with``) stops the
    workers (each sees the ring close at its next call; stragglers are
    terminated after a few seconds) and gives the ring back once no slot is
    lent. A pass stopped early (``break``) drops the batches under way. A
    worker that dies closes the loader, after :class:`WorkerError` names it,
    its slot and its batch.

    Examples
    --------
    ``np.positive(batch, out)`` writes the batch number into every element:
    a ``make_batch`` that pickles, as ``"forkserver"`` needs.

    >>> with cm.Loader(np.positive, 4, (64, 64), np.float32, workers=2,
    ...                start_method="forkserver") as loader:
    ...     sums = [float(buf.to_numpy(np.float32).sum()) for buf in loader]
    >>> sums
    [0.0, 4096.0, 8192.0, 12288.0]
    """

    _share_hint = "iterate the Loader in the process that made it"

    def __init__(self, make_batch: MakeBatch, batches: int | Sequence[int],
                 shape: int | tuple[int, ...], dtype: npt.DTypeLike = "uint8", *,
                 workers: int = 4, prefetch: int = 2, ordered: bool = True,
                 output: str = "buffer", device: Any = None, stream: StreamLike = None,
                 pool: MemoryPool | None = None, init: Callable[[int], object] | None = None,
                 timeout: float | None = 120.0, start_method: str | None = None) -> None:
        if not callable(make_batch):
            raise TypeError(f"make_batch must be callable (batch, out), not "
                            f"{type(make_batch).__name__}")
        seq = _batches(batches)
        n = check_positive(workers, "workers")
        if n > MAX_WORKERS:
            raise ValueError(f"workers must be <= {MAX_WORKERS}, got {n}")
        depth = check_positive(prefetch, "prefetch")
        if n * depth + 2 > MAX_SLOTS:  # the ring has a slot per batch worked ahead, plus two
            raise ValueError(f"workers * prefetch must be <= {MAX_SLOTS - 2} (the ring's slots, "
                             f"two more, are at most {MAX_SLOTS}), got {n} * {depth}")
        check_bool(ordered, "ordered")
        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {', '.join(map(repr, OUTPUTS))}, "
                             f"not {output!r}")
        if init is not None and not callable(init):
            raise TypeError(f"init must be callable (worker) or None, not "
                            f"{type(init).__name__}")
        wait = check_timeout(timeout)
        methods = multiprocessing.get_all_start_methods()
        if start_method is not None and start_method not in methods:
            raise ValueError(f"start_method must be one of {', '.join(map(repr, methods))} or "
                             f"None, not {start_method!r}")
        ordinal = None if device is None else existing_ordinal(device)
        if stream is not None:
            stream_handle(stream)  # TypeError now, not at the first batch
        device_pool(pool)
        framework = _framework(output)
        self._batch_list = seq
        self._workers = n
        self._ordered = ordered
        self._output = output
        self._stream = stream
        self._framework = framework
        self._timeout = wait
        ctx: Any = multiprocessing.get_context(start_method)
        procs: list[Any] = []
        copies: list[CopyWatcher] = []
        with Transaction() as tx:
            ring = unstarted_ring(n * depth + 2, shape, dtype, grants=depth, timeout=wait)
            tx.push(ring.close)
            tx.push(_stop, ring, procs, copies, os.getpid())
            handle = ring.handle
            for k in range(n):
                p = ctx.Process(target=worker_main, args=(handle, k, make_batch, init),
                                name=f"cuda_memkit-loader-{k}", daemon=True)
                p.start()
                procs.append(p)
            core = ring_core(ring)
            copies.append(CopyWatcher(core.wake))
            core.copies_watched = copies[0].busy
            epochs = Epochs(core)
            core.schedule = epochs  # every grant carries a batch: none before the first pass
            for k, p in enumerate(procs):
                core.watch(p.sentinel, p.pid, k, functools.partial(_exit_of, p))
            core.start()  # the ring's thread only now: no thread runs while the workers fork
            self._device = ensure_context(ordinal) if output != "slot" else (ordinal or 0)
            self._pool = (pool if pool is not None or output == "slot"
                          else MemoryPool.default(self._device, cache=True))
        self._ring = ring
        self._epochs = epochs
        self._procs = procs
        self._copies = copies[0]
        self._open(make_finalizer(self, "Loader", _stop, ring, procs, copies, os.getpid()))

    # -- what it is -----------------------------------------------------------------------
    @property
    def ring(self) -> SharedHostRing:
        """The :class:`SharedHostRing` the workers fill (its ``stats()`` show what they do)."""
        self._check_open()
        return self._ring

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of one batch."""
        return self._ring.shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """Element type of one batch."""
        return self._ring.dtype

    @property
    def nbytes(self) -> int:
        """Bytes of one batch."""
        return self._ring.slot_nbytes

    @property
    def workers(self) -> int:
        """Number of worker processes."""
        return self._workers

    @property
    def timeout(self) -> float | None:
        """Seconds to wait for a batch (``None``: no limit); settable."""
        return self._timeout

    @timeout.setter
    def timeout(self, value: float | None) -> None:
        self._timeout = check_timeout(value)

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids."""
        return [p.pid for p in self._procs]

    @property
    def batches(self) -> Sequence[int]:
        """The batches of one pass, in order."""
        return self._batch_list

    def __len__(self) -> int:
        return len(self._batch_list)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"workers={self._workers}"
        return (f"<Loader {len(self._batch_list)} batches shape={self.shape} "
                f"dtype={self.dtype} output={self._output!r} {state}>")

    # -- a pass ---------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        """One pass over :attr:`batches`: the workers start on it at once.

        A new pass supersedes one still running (whose next item then raises
        ``RuntimeError``); batches under way for it are dropped.
        """
        self._check_open()
        try:
            epoch = self._epochs.start(enumerate(self._batch_list))
        except WorkerError as exc:
            self._lost(exc)
            raise
        return self._pass(epoch)

    def _lost(self, exc: WorkerError) -> None:
        """A worker is gone (its batches with it): the loader is done, as its docs say."""
        if exc.gone:
            self.close()

    def _pass(self, epoch: int) -> Iterator[Any]:
        ring = self._ring
        core = ring_core(ring)
        try:
            for pos in range(len(self._batch_list)):
                if self._ordered:
                    pick = functools.partial(self._epochs.by_key, (epoch, pos))
                else:
                    pick = functools.partial(self._epochs.first_of, epoch)
                try:
                    s = core.wait(pick, self._timeout, f"batch {self._batch_list[pos]}")
                except WorkerError as exc:
                    self._lost(exc)
                    raise
                yield self._deliver(lend(ring, s))
        finally:
            if not ring.closed:
                self._epochs.end(epoch)

    def _deliver(self, slot: RingSlot) -> Any:
        pool = self._pool
        if pool is None:
            return slot  # output "slot": the slot itself, on the host
        try:
            ensure_context(self._device)
            stream = stream_handle(self._stream_now())
            buf = copy_to_new(slot, pool, stream)
            # Watched before the slot is handed back, so that the ring's thread never
            # starts polling for a copy the watcher is about to take.
            self._copies.after(stream, self._device)
        finally:
            slot.close()  # back once the copy is done; at once if it failed (batch lost)
        if self._framework is None:
            return buf
        view = buf.as_array(self.dtype, self.shape)
        return self._framework.from_dlpack(view)

    def _stream_now(self) -> StreamLike:
        if self._stream is not None or self._framework is None:
            return self._stream
        if self._output == "torch":
            return int(self._framework.cuda.current_stream(self._device).cuda_stream)
        return int(self._framework.cuda.get_current_stream().ptr)


def _framework(output: str) -> Any:
    """The framework module an output needs (imported now: a missing one fails at once)."""
    if output in ("torch", "cupy"):
        return importlib.import_module(output)
    return None

