"""Loader at its edges: huge and extreme batch numbers, timeouts, closed objects, dying workers.

Workers start with ``forkserver`` (``fork`` in a process with threads draws Python 3.12's
DeprecationWarning, an error in this suite). Runs on the simulator and on a GPU.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cuda_memkit as cm

from . import _ring_workers as rw

SHAPE = (4, 4)
LAST = (1 << 63) - 1  # the largest batch number the ring's protocol carries


def _loader(batches: object = 4, **kw: object) -> cm.Loader:
    args: dict[str, object] = {"workers": 1, "start_method": "forkserver", "timeout": 60}
    args.update(kw)
    return cm.Loader(rw.batch_value, batches, SHAPE, np.float32, **args)  # type: ignore[arg-type]



def test_a_huge_range_of_batches_is_taken_at_once() -> None:
    """The constructor checks a range by its ends: it does not walk 10**12 numbers."""
    made: list[cm.Loader] = []
    t = threading.Thread(target=lambda: made.append(_loader(range(10**12), output="slot")),
                         daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "Loader(batches=range(10**12)) did not return"
    with made[0] as loader:
        assert len(loader) == 10**12 and loader.batches == range(10**12)
        for k, slot in enumerate(loader):
            assert slot.batch == k
            slot.close()
            if k == 2:
                break


def test_the_largest_batch_numbers_go_through_the_ring() -> None:
    """Batch numbers up to 2**63 - 1 reach the workers and come back; a count of that many
    is a loader whose length is that count."""
    with _loader([LAST, 0, LAST - 1], output="slot") as loader:
        got = []
        for slot in loader:
            got.append(slot.batch)
            slot.close()
        assert got == [LAST, 0, LAST - 1]
        assert [s.batch for s in _closing(loader)] == [LAST, 0, LAST - 1]  # a second pass
    with _loader(range(LAST - 2, LAST + 1), output="slot") as loader:
        assert [s.batch for s in _closing(loader)] == [LAST - 2, LAST - 1, LAST]
    with _loader(LAST, output="slot") as loader:
        assert len(loader) == LAST
        first = next(iter(loader))
        assert first.batch == 0
        first.close()


def _closing(loader: cm.Loader) -> list[cm.RingSlot]:
    out = []
    for slot in loader:
        out.append(slot)
        slot.close()
    return out


@pytest.mark.parametrize("t", [1e10, threading.TIMEOUT_MAX, math.inf])
def test_a_timeout_past_any_wait_means_no_limit(t: float) -> None:
    with _loader(timeout=t) as loader:
        assert loader.timeout is None
        assert [float(b.to_numpy(np.float32)[0]) for b in loader] == [0.0, 1.0, 2.0, 3.0]
        loader.timeout = t
        assert loader.timeout is None
        loader.timeout = 5
        assert loader.timeout == 5.0


def test_too_many_slots_names_the_loaders_arguments() -> None:
    with pytest.raises(ValueError, match=r"workers \* prefetch") as info:
        _loader(workers=2, prefetch=40000)
    assert "slots must" not in str(info.value)


def test_a_closed_pool_is_refused_before_any_worker_starts() -> None:
    pool = cm.MemoryPool(0)
    pool.close()
    with pytest.raises(cm.ClosedError, match="closed"):
        _loader(pool=pool)


def test_a_worker_that_dies_between_passes_closes_the_loader() -> None:
    loader = _loader(workers=2)
    try:
        assert [float(b.to_numpy(np.float32)[0]) for b in loader] == [0.0, 1.0, 2.0, 3.0]
        assert rw.eventually(lambda: loader.ring.workers == 2)
        pid = loader.pids[0]
        os.kill(pid, signal.SIGKILL)
        assert rw.eventually(lambda: loader.ring.workers == 1)
        with pytest.raises(cm.WorkerError, match=rf"pid {pid}") as info:
            iter(loader)
        assert info.value.gone and info.value.pid == pid
        assert loader.closed  # not a next pass with fewer workers
        with pytest.raises(cm.ClosedError):
            iter(loader)
    finally:
        loader.close()


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_closing_an_inherited_loader_leaves_it_to_the_parent() -> None:
    with _loader(workers=1) as loader:
        assert [float(b.to_numpy(np.float32)[0]) for b in loader] == [0.0, 1.0, 2.0, 3.0]
        pid = os.fork()
        if pid == 0:  # the child: its copy of the loader closes without touching the parent's
            code = 1
            try:
                loader.close()
                code = 0
            finally:
                os._exit(code)
        _pid, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert all(_alive(p) for p in loader.pids)  # the workers are still the parent's
        assert [float(b.to_numpy(np.float32)[0]) for b in loader] == [0.0, 1.0, 2.0, 3.0]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_slot_goes_back_only_once_its_copy_has_finished(
        copies_in_flight: Callable[[], None]) -> None:
    """The copies stay "running" here after the Loader's own wait on them returned (the
    simulator answers every wait at once): the slots stay lent until the copies finish,
    then come back without another call."""
    with _loader(batches=6, workers=1, prefetch=1, timeout=20) as loader:
        it = iter(loader)
        first = [next(it) for _ in range(3)]  # the ring's three slots, each under a copy
        time.sleep(0.2)
        stats = loader.ring.stats()
        assert stats["lent"] == 3 and stats["free"] == 0 and stats["ready"] == 0
        threading.Timer(0.2, copies_in_flight).start()  # the copies finish a moment later
        rest = list(it)
        assert [float(b.to_numpy(np.float32)[0]) for b in first + rest] == [
            0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


@pytest.mark.parametrize("dtype", [np.int64, np.uint32])
def test_numpy_batches_are_checked_at_once(dtype: type) -> None:
    order = np.array([3, 1, 2], dtype)
    with _loader(order) as loader:
        assert loader.batches == [3, 1, 2]
        assert [float(b.to_numpy(np.float32)[0]) for b in loader] == [3.0, 1.0, 2.0]


BAD_NUMBERS = {
    "workers": st.one_of(st.integers(max_value=0), st.integers(min_value=1025)),
    "prefetch": st.one_of(st.integers(max_value=0), st.integers(min_value=1 << 15)),
    "batches": st.one_of(st.integers(max_value=-1), st.integers(min_value=1 << 63)),
    "timeout": st.one_of(st.floats(max_value=0.0), st.just(math.nan), st.integers(max_value=0)),
}


@settings(max_examples=40, deadline=None)
@given(data=st.data(), arg=st.sampled_from(sorted(BAD_NUMBERS)))
def test_every_number_out_of_range_is_refused_before_a_worker_starts(
        data: st.DataObject, arg: str) -> None:
    value = data.draw(BAD_NUMBERS[arg])
    kw: dict[str, object] = {arg: value} if arg != "batches" else {}
    if arg == "prefetch":
        kw["workers"] = 2  # 2 * prefetch + 2 slots: past the ring's most
    before = multiprocessing.active_children()
    with pytest.raises(ValueError, match=arg):
        _loader(value, **kw) if arg == "batches" else _loader(**kw)
    assert multiprocessing.active_children() == before


@settings(max_examples=40, deadline=None)
@given(batch=st.integers())
def test_each_batch_number_is_refused_or_kept_exactly(batch: int) -> None:
    """Checked without a process: the numbers the constructor keeps are the ones given."""
    from cuda_memkit._loading._loader import _batches

    if 0 <= batch <= LAST:
        assert list(_batches([batch, 0])) == [batch, 0]
        assert list(_batches(np.array([batch], np.uint64))) == [batch]
        r = range(batch, max(batch - 3, -1), -1)
        assert _batches(r) == r
    else:
        for given_ in ([0, batch], range(batch, batch + 1), range(0, batch + 1)):
            if isinstance(given_, range) and batch < 0 and given_.start >= 0 and not given_:
                continue  # an empty range holds no batch to refuse
            with pytest.raises(ValueError, match="batch"):
                _batches(given_)
