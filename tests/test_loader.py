"""Loader: batches made in worker processes, yielded on the device through a shared pinned ring.

Workers start with ``forkserver`` unless a test is about another start method (``fork`` in a
process with threads draws Python 3.12's DeprecationWarning, an error in this suite).
Runs on the simulator and on a GPU; the framework outputs are in test_loader_frameworks.py.
"""

from __future__ import annotations

import functools
import gc
import os
import signal
import time
from collections.abc import Iterator

import numpy as np
import pytest

import cuda_memkit as cm

from . import _ring_workers as rw

SHAPE = (16, 8)
F32 = np.dtype(np.float32)
FORK_WARNING = "ignore:This process .* is multi-threaded:DeprecationWarning"


def _loader(make_batch: object = rw.batch_value, batches: object = 12, **kw: object
            ) -> cm.Loader:
    args: dict[str, object] = {"workers": 2, "start_method": "forkserver", "timeout": 60}
    args.update(kw)
    return cm.Loader(make_batch, batches, SHAPE, np.float32, **args)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def loader() -> Iterator[cm.Loader]:
    """One loader for the tests that only read: its workers start once."""
    with _loader() as ld:
        yield ld


def _values(items: object) -> list[float]:
    return [float(b.to_numpy(np.float32)[0]) for b in items]  # type: ignore[attr-defined]


def test_batches_come_in_order_on_the_device(loader: cm.Loader) -> None:
    got = []
    for buf in loader:
        assert isinstance(buf, cm.PoolBuffer) and buf.device == 0 and buf.nbytes == loader.nbytes
        arr = buf.to_numpy(np.float32, SHAPE)
        assert (arr == arr[0, 0]).all()
        got.append(float(arr[0, 0]))
    assert got == [float(i) for i in range(12)]
    assert len(loader) == 12 and loader.batches == range(12)
    assert (loader.shape, loader.dtype, loader.nbytes) == (SHAPE, F32, 16 * 8 * 4)


def test_every_pass_is_whole_and_an_early_break_drops_the_rest(loader: cm.Loader) -> None:
    for k, _buf in enumerate(loader):
        if k == 2:
            break
    assert _values(loader) == [float(i) for i in range(12)]
    assert _values(loader) == [float(i) for i in range(12)]


def test_a_new_pass_supersedes_the_running_one(loader: cm.Loader) -> None:
    first = iter(loader)
    next(first)
    second = iter(loader)
    with pytest.raises(RuntimeError, match="superseded"):
        next(first)
    assert _values(second) == [float(i) for i in range(12)]


def test_the_ring_shows_the_loaders_memory(loader: cm.Loader) -> None:
    ring = loader.ring
    assert ring.slots == 2 * 2 + 2 and ring.grants == 2 and ring.slot_nbytes == loader.nbytes
    assert cm.memory_stats().by_kind["shared_ring"].current >= ring.nbytes
    assert len(loader.pids) == 2 and "Loader 12 batches" in repr(loader)


@pytest.mark.parametrize("method", [
    pytest.param("fork", marks=pytest.mark.filterwarnings(FORK_WARNING)), "spawn"])
def test_every_start_method(method: str) -> None:
    with _loader(batches=[5, 3, 9], start_method=method) as ld:
        assert _values(ld) == [5.0, 3.0, 9.0]


def test_unordered_gives_every_batch_once() -> None:
    order = list(np.random.default_rng(1).permutation(20))
    with _loader(batches=order, ordered=False, prefetch=3) as ld:
        got = _values(ld)
        assert sorted(got) == sorted(float(b) for b in order)
        assert ld.ring.slots == 2 * 3 + 2


def test_slots_as_the_output() -> None:
    with _loader(batches=4, output="slot") as ld:
        for k, slot in enumerate(ld):
            assert isinstance(slot, cm.RingSlot) and slot.batch == k
            assert slot.shape == SHAPE and (slot.array == k).all()
            slot.close()


def test_a_slot_filled_for_the_first_time_takes_no_page_faults() -> None:
    # Each worker maps the whole ring at once: otherwise its first fill of each slot takes
    # a fault per 4 KiB page (16 384 for a 64 MiB slot, more than the fill's own time).
    pages = 256  # 1 MiB slots; 12 batches through 6 slots: most fills are a first one
    with cm.Loader(rw.faults_of_fill, 12, pages * 512, np.int64, workers=2,
                   start_method="forkserver", output="slot", timeout=60) as ld:
        faults = []
        for k, slot in enumerate(ld):
            assert (slot.array[1:] == k).all()
            faults.append(int(slot.array[0]))
            slot.close()
    assert max(faults) < pages // 8, faults


def test_a_pool_and_a_stream_of_ones_own() -> None:
    with cm.Stream() as s, cm.MemoryPool(0) as pool, _loader(batches=3, pool=pool,
                                                              stream=s) as ld:
        bufs = list(ld)
        s.synchronize()
        assert [b.pool is pool for b in bufs] == [True] * 3
        assert _values(bufs) == [0.0, 1.0, 2.0]
        for b in bufs:
            b.free(stream=s)
        s.synchronize()


# -- failures --------------------------------------------------------------------------------


def test_a_batch_that_cannot_be_made_is_raised_where_it_belongs() -> None:
    with _loader(rw.batch_or_fail, 6) as ld:
        got = []
        with pytest.raises(cm.WorkerError, match=r"(?s)batch 3.*ValueError: batch 3 is broken"
                           ) as e:
            for buf in ld:
                got.append(float(buf.to_numpy(np.float32)[0]))
        assert got == [0.0, 1.0, 2.0] and e.value.batch == 3 and e.value.worker in (0, 1)
        assert not ld.closed  # the pass ended; the loader goes on
        with pytest.raises(cm.WorkerError, match="batch 3"):
            _values(ld)


def test_a_worker_that_dies_is_named_and_closes_the_loader() -> None:
    ld = _loader(rw.batch_or_die, 10)
    pids = ld.pids
    t0 = time.monotonic()
    with pytest.raises(cm.WorkerError,
                       match=r"worker \d \(pid \d+\) exited \(killed by signal 9 \(SIGKILL\)\)"
                             r".*batch 5") as e:
        _values(ld)
    assert time.monotonic() - t0 < 30
    assert e.value.batch == 5 and e.value.pid in pids
    assert ld.closed
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_failing_init_is_reported() -> None:
    with _loader(init=rw.failing_init, batches=4) as ld:
        with pytest.raises(cm.WorkerError, match=r"(?s)worker (\d) \(pid \d+\) cannot go on.*"
                                                 r"RuntimeError: worker \1 cannot start"):
            _values(ld)
        assert ld.closed  # its workers are gone: the loader is done


def test_a_stuck_worker_times_out_and_is_stopped_at_close() -> None:
    ld = _loader(rw.batch_or_hang, 6)
    it = iter(ld)
    assert _values([next(it), next(it)]) == [0.0, 1.0]
    ld.timeout = 1.0
    assert ld.timeout == 1.0
    with pytest.raises(TimeoutError, match=r"batch 2 did not become ready within 1.0 s.*"
                                           r"slot \d \(batch 2\) filling worker \d \(pid"):
        next(it)
    pids = ld.pids
    t0 = time.monotonic()
    ld.close()
    assert time.monotonic() - t0 < 15  # terminated after the grace period
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


# -- lifetime --------------------------------------------------------------------------------


def test_close_stops_the_workers_and_gives_the_ring_back() -> None:
    before = cm.memory_stats().by_kind["shared_ring"].current
    ld = _loader()
    pids = ld.pids
    next(iter(ld))
    ld.close()
    ld.close()
    assert ld.closed and cm.memory_stats().by_kind["shared_ring"].current == before
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with pytest.raises(cm.ClosedError):
        iter(ld)
    with pytest.raises(cm.ClosedError):
        ld.ring  # noqa: B018
    assert "closed" in repr(ld)


def test_a_dropped_loader_stops_its_workers() -> None:
    ld = _loader(batches=2)
    pids = ld.pids
    del ld
    gc.collect()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_slots_lent_out_keep_the_ring_after_close() -> None:
    before = cm.memory_stats().by_kind["shared_ring"].current
    ld = _loader(batches=2, output="slot")
    slot = next(iter(ld))
    ld.close()
    assert (slot.array == 0).all()  # still readable: its memory waits for it
    slot.close()
    assert cm.memory_stats().by_kind["shared_ring"].current == before


def test_a_loader_refuses_to_be_copied() -> None:
    import copy
    import pickle

    with _loader(batches=1) as ld:
        for attempt in (pickle.dumps, copy.copy):
            with pytest.raises(TypeError, match="Loader"):
                attempt(ld)


def test_make_batch_gets_the_batch_numbers() -> None:
    with _loader(functools.partial(rw.batch_value), batches=range(10, 13)) as ld:
        assert _values(ld) == [10.0, 11.0, 12.0]


def test_nothing_is_left_when_the_workers_are_killed_from_outside() -> None:
    ld = _loader(batches=200, prefetch=1)
    it = iter(ld)
    next(it)
    for pid in ld.pids:
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(cm.WorkerError, match="exited"):
        for _ in it:
            pass
    assert ld.closed
