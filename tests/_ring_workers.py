"""Worker-process bodies for the shared-ring and loader tests (importable by spawned children).

They use only the worker side of the ring (no CUDA) and report through their exit code
and a pipe, so a test sees exactly what happened in the child.
"""

from __future__ import annotations

import os
import random
import resource
import signal
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import cuda_memkit as cm


def eventually(cond: Callable[[], bool], seconds: float = 10.0) -> bool:
    """Whether ``cond()`` becomes true within ``seconds`` (the ring's thread acts meanwhile)."""
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


#: Exit codes a worker reports with.
CLEAN, SAW_CLOSED, OVERWRITTEN = 0, 3, 4


def fill(handle: cm.RingHandle, worker: int, count: int) -> None:
    """Fill ``count`` slots with ``worker * 1000 + k`` and publish each with that tag."""
    with handle.writer(worker) as w:
        for k in range(count):
            slot = w.acquire(timeout=60)
            slot.array[...] = worker * 1000 + k
            slot.publish(worker * 1000 + k)


def fill_until_closed(handle: cm.RingHandle, worker: int, report: Any) -> None:
    """Fill slots until the consumer closes the ring; exit SAW_CLOSED when it does."""
    try:
        w = handle.writer(worker)
        k = 0
        while True:
            slot = w.acquire(timeout=60)
            report.send(("acquired", slot.index))
            arr = slot.array
            for _ in range(50):  # keeps writing while the consumer closes
                arr[...] = k
                time.sleep(0.001)
            slot.publish(k)
            k += 1
    except cm.ClosedError as exc:
        try:
            report.send(("closed", str(exc)))
        except BrokenPipeError:
            pass  # the consumer's process is gone, and its end of the pipe with it
        os._exit(SAW_CLOSED)


def acquire_and_hang(handle: cm.RingHandle, worker: int, report: Any) -> None:
    """Acquire a slot, say so, and wait to be killed (a worker dying mid-batch)."""
    w = handle.writer(worker)
    slot = w.acquire(timeout=60)
    slot.array[...] = 1
    report.send(("acquired", slot.index, os.getpid()))
    time.sleep(600)


def kill_self_mid_batch(handle: cm.RingHandle, worker: int) -> None:
    """Acquire a slot, write half of it, and die by SIGKILL."""
    w = handle.writer(worker)
    slot = w.acquire(timeout=60)
    flat = slot.array.reshape(-1)
    flat[: flat.size // 2] = 9
    os.kill(os.getpid(), signal.SIGKILL)


def stamp(handle: cm.RingHandle, worker: int, rounds: int, seed: int) -> None:
    """The property test's worker: stamp each slot it holds, hold it a while, check the stamp.

    A slot handed to two workers at once would show the other's stamp; exits
    OVERWRITTEN then, CLEAN otherwise.
    """
    rng = random.Random(seed)
    with handle.writer(worker) as w:
        for k in range(rounds):
            slot = w.acquire(timeout=60)
            mark = np.int64(worker * 1_000_000 + k)
            flat = slot.array.reshape(-1)
            flat[:] = mark
            time.sleep(rng.random() * 0.003)
            if not (flat == mark).all():
                os._exit(OVERWRITTEN)
            slot.publish(int(mark))


def batch_value(batch: int, out: np.ndarray[Any, Any]) -> None:
    """A Loader's make_batch: every element is the batch number."""
    out[...] = batch


def faults_of_fill(batch: int, out: np.ndarray[Any, Any]) -> None:
    """A Loader's make_batch that writes into ``out[0]`` the page faults filling ``out`` took."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    out.fill(batch)  # in place: no temporary array, so every fault is the slot's
    out[0] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def batch_or_fail(batch: int, out: np.ndarray[Any, Any]) -> None:
    """A Loader's make_batch that cannot make batch 3."""
    if batch == 3:
        raise ValueError(f"batch {batch} is broken")
    out[...] = batch


def batch_or_die(batch: int, out: np.ndarray[Any, Any]) -> None:
    """A Loader's make_batch whose worker dies (SIGKILL) at batch 5."""
    if batch == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    out[...] = batch


def batch_or_hang(batch: int, out: np.ndarray[Any, Any]) -> None:
    """A Loader's make_batch that never finishes batch 2."""
    if batch == 2:
        time.sleep(600)
    out[...] = batch


def failing_init(worker: int) -> None:
    """A Loader's init that fails in every worker."""
    raise RuntimeError(f"worker {worker} cannot start")
