"""Eight threads allocating, freeing and copying at once: no error, no leak, no deadlock.

Each thread, for ``CUDA_MEMKIT_THREAD_SECONDS`` (2 s on the simulator, 10 s on
a GPU by default), picks at random: a buffer from one shared
:class:`MemoryPool` (on its own stream, or on the legacy stream from a thread
that starts with no context), a pinned buffer from the default pinned pool
(``HostBuffer.pooled``), or a host -> device -> host ``copy()`` round trip
that must return its data. Buffers go back by ``free()``, ``close()``, a
``with`` block or garbage collection (some on another thread). Afterwards the
pools' statistics are back to their baseline, nothing warned, nothing
leaked; a thread still running 60 s after the deadline fails the test.
"""

from __future__ import annotations

import gc
import os
import random
import threading
import time
import warnings
from typing import Any

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit._core import _driver

THREADS = 8
SECONDS = float(os.environ.get("CUDA_MEMKIT_THREAD_SECONDS",
                               "2" if _driver.backend_name() == "sim" else "10"))
GRACE = 60.0


pytestmark = pytest.mark.usefixtures("default_pinned")


def _pool_round(rng: random.Random, pool: cm.MemoryPool, stream: cm.Stream | None,
                graveyard: list[Any]) -> int:
    bufs = [pool.allocate(rng.choice((512, 4096, 65536, 1 << 20)), stream=stream)
            for _ in range(rng.randint(1, 6))]
    for b in bufs:
        how = rng.random()
        if how < 0.4:
            b.free()
        elif how < 0.7:
            b.close()
        elif how < 0.85:
            with b:
                pass
        else:
            graveyard.append(b)  # dropped later, on whichever thread collects
    return len(bufs)


def _pinned_round(rng: random.Random, graveyard: list[Any]) -> int:
    n = rng.choice((64, 4096, 100_000, 1 << 20))
    h = cm.HostBuffer.pooled(n)
    h.array[:16] = 7
    if rng.random() < 0.2:
        graveyard.append(h)
    elif rng.random() < 0.5:
        with h:
            pass
    else:
        h.close()
    return 1


def _copy_round(rng: random.Random, tag: int) -> int:
    n = rng.choice((1, 4096, 65536, 1 << 20))
    src = np.full(n, tag, np.uint8)
    with cm.DeviceBuffer.empty(n) as d:
        cm.copy(d, src)
        back = np.zeros(n, np.uint8)
        cm.copy(back, d)
    if not (back == tag).all():
        raise AssertionError(f"copy round trip of {n} bytes returned other data")
    return 1


def _worker(i: int, pool: cm.MemoryPool, deadline: float, errors: list[BaseException],
            counts: list[int], graveyard: list[Any]) -> None:
    rng = random.Random(1234 + i)
    stream = cm.Stream(0) if i % 2 else None  # odd threads: own stream; even: legacy, no context
    done = 0
    try:
        while time.monotonic() < deadline:
            r = rng.random()
            if r < 0.45:
                done += _pool_round(rng, pool, stream, graveyard)
            elif r < 0.8:
                done += _pinned_round(rng, graveyard)
            else:
                done += _copy_round(rng, i + 1)
            if len(graveyard) > 64:
                graveyard.clear()  # collected here, on this thread
        if stream is not None:
            stream.synchronize()
    except BaseException as exc:  # handed to the test thread
        errors.append(exc)
    finally:
        counts[i] = done
        if stream is not None:
            stream.close()


def test_eight_threads_share_pools_and_copy(default_pinned: cm.MemoryPool) -> None:
    pool = cm.MemoryPool(0)
    pinned_before = default_pinned.stats()
    errors: list[BaseException] = []
    counts = [0] * THREADS
    graveyard: list[Any] = []
    deadline = time.monotonic() + SECONDS
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=_worker, daemon=True,
                                    args=(i, pool, deadline, errors, counts, graveyard))
                   for i in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(deadline - time.monotonic(), 0) + GRACE)
        stuck = [t.name for t in threads if t.is_alive()]
        assert not stuck, f"threads still running {GRACE:.0f} s after the deadline: {stuck}"
        graveyard.clear()
        gc.collect()
    assert not errors, f"{len(errors)} thread(s) failed; first: {errors[0]!r}"
    ours = [str(w.message) for w in caught]
    assert not ours, ours[:5]
    assert all(counts), f"a thread did no work: {counts}"
    _driver.call("cuCtxSynchronize")
    assert pool.stats().used_current == 0
    pool.trim()
    assert pool.stats().reserved_current == 0
    pool.close()
    default_pinned.trim()
    after = default_pinned.stats()
    assert after.used_current == pinned_before.used_current
    assert after.reserved_current <= max(pinned_before.reserved_current,
                                         default_pinned.release_threshold)
