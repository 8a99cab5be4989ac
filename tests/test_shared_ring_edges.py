"""SharedHostRing at its edges: extreme numbers, closed writers, forked children.

Every number a caller gives the ring (labels, tags, timeouts) is either refused with a
``ValueError``/``TypeError`` naming it before anything changes, or works; nothing reaches
the wire protocol or a wait that cannot carry it. Runs on the simulator and on a GPU.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cuda_memkit as cm

from . import _ring_workers as rw

SHAPE = (8, 4)
FORK_WARNING = "ignore:This process .* is multi-threaded:DeprecationWarning"
#: The edges of a signed 64-bit field, and of the interpreter's waits.
EDGES = [0, 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1, 1 << 64, -1, -(1 << 63)]
TIMEOUTS = [1e-9, 1.0, 1e9, 1e10, threading.TIMEOUT_MAX, 1e300, math.inf, 0.0, -0.0, -1.0,
            -math.inf, math.nan]
HYPOTHESIS = settings(max_examples=60, deadline=None,
                      suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def ring() -> Iterator[cm.SharedHostRing]:
    r = cm.SharedHostRing(2, SHAPE, np.float32, grants=2, timeout=10)
    yield r
    r.close()



# -- tags and labels: the wire carries signed 64-bit numbers ------------------------------


@HYPOTHESIS
@given(tag=st.one_of(st.sampled_from(EDGES), st.integers()))
def test_a_tag_is_published_exactly_or_refused_before_the_slot_changes_hands(
        ring: cm.SharedHostRing, tag: int) -> None:
    w = ring.handle.writer()
    slot = w.acquire(timeout=10)
    slot.array[...] = 1
    if 0 <= tag < 1 << 63:
        with ring.take(slot.publish(tag)) as got:
            assert got.tag == tag
    else:
        with pytest.raises(ValueError, match="tag"):
            slot.publish(tag)
        # the slot is still this worker's: it can be filled and published after the refusal
        slot.array[...] = 2
        with ring.take(slot.publish(7)) as got:
            assert got.tag == 7 and got.array[0, 0] == 2
    assert ring.stats()["filling"] == 0
    w.close()
    ring.timeout = 0.05
    with pytest.raises(TimeoutError):
        ring.get()  # no spurious WorkerError follows a refused tag
    ring.timeout = 10


@HYPOTHESIS
@given(label=st.one_of(st.sampled_from(EDGES), st.integers()))
def test_a_writer_label_is_carried_exactly_or_refused(ring: cm.SharedHostRing,
                                                      label: int) -> None:
    if not 0 <= label < 1 << 63:
        with pytest.raises(ValueError, match="worker"):
            ring.handle.writer(label)
        return
    w = ring.handle.writer(label)
    slot = w.acquire(timeout=10)
    slot.array[...] = 3
    with ring.take(slot.publish()) as got:
        assert got.worker == label
    w.close()


# -- timeouts: one rule for every one of them ---------------------------------------------


def _timeout_ok(t: float) -> bool:
    return t > 0  # false for nan, zero and negatives


def _writer(ring: cm.SharedHostRing, t: float) -> None:
    """A writer with timeout ``t``; a tiny one may end before the consumer's welcome."""
    try:
        ring.handle.writer(5, timeout=t)
    except TimeoutError as exc:
        if t >= 0.5:
            raise
        assert "did not answer within" in str(exc)


@pytest.mark.parametrize("t", TIMEOUTS)
def test_every_timeout_of_the_ring_takes_the_same_values(ring: cm.SharedHostRing,
                                                         t: float) -> None:
    """A ring's, a writer's and an acquire's timeout: > 0 works (``inf`` and anything past
    what a wait can take mean no limit), anything else is a ValueError naming it."""
    setters: list[Callable[[], object]] = [
        lambda: cm.SharedHostRing(1, SHAPE, np.float32, timeout=t).close(),
        lambda: setattr(ring, "timeout", t),
        lambda: _writer(ring, t),
    ]
    for set_it in setters:
        if _timeout_ok(t):
            set_it()
        else:
            with pytest.raises(ValueError, match="timeout"):
                set_it()
    if not _timeout_ok(t):
        return
    if t >= threading.TIMEOUT_MAX:
        assert ring.timeout is None
    # the waits themselves: a slot published a moment later ends each of them
    w = ring.handle.writer(5)
    slot = w.acquire(timeout=t if t >= 0.5 else 10)  # a tiny one may end before the grant
    threading.Timer(0.05, lambda: (slot.array.fill(1), slot.publish(1))).start()
    if t >= 0.5:
        with ring.get() as got:
            assert got.tag == 1
        other = w.acquire(timeout=t)
        threading.Timer(0.05, lambda: other.publish(2)).start()
        with ring.take(other.ticket) as got:
            assert got.tag == 2
    else:
        assert rw.eventually(lambda: ring.stats()["ready"] == 1)
        ring.get().close()
    w.close()


@pytest.mark.parametrize("t", [1e10, math.inf])
def test_a_huge_timeout_on_acquire_waits_for_the_grant(ring: cm.SharedHostRing,
                                                       t: float) -> None:
    w = ring.handle.writer()
    held = [w.acquire(timeout=t), w.acquire(timeout=t)]  # both slots
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(w.acquire(timeout=t)))
    waiter.start()
    time.sleep(0.05)
    held[0].publish()
    ring.get().close()  # the slot comes back and is granted to the waiting acquire
    waiter.join(10)
    assert not waiter.is_alive() and len(got) == 1
    held[1].fail("unused")
    got[0].fail("unused")  # type: ignore[attr-defined]
    w.close()


# -- a closed writer lets go of the ring ---------------------------------------------------


def _mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if "cuda_memkit-ring" in line)


def test_a_closed_writer_unmaps_the_ring_and_leaves_the_cache(ring: cm.SharedHostRing) -> None:
    before = _mappings()
    w = ring.handle.writer(3)
    assert _mappings() == before + 1
    w.close()
    assert _mappings() == before  # no open writer keeps the memory mapped
    fresh = ring.handle.writer(3)
    assert fresh is not w and not fresh.closed
    fresh.close()


def test_a_closed_writer_keeps_a_slot_array_still_referenced(ring: cm.SharedHostRing) -> None:
    w = ring.handle.writer()
    arr = w.acquire(timeout=10).array
    arr[...] = 5
    w.close()  # the slot is abandoned; the array held here keeps its memory readable
    assert (arr == 5).all()
    del arr


def test_a_writer_closed_by_the_consumer_unmaps_too() -> None:
    before = _mappings()
    r = cm.SharedHostRing(1, SHAPE, np.float32, timeout=10)
    w = r.handle.writer()
    assert _mappings() == before + 2  # the consumer's mapping and the writer's
    r.close()  # closes this process's writers of the ring too
    assert w.closed and _mappings() == before


# -- a forked child keeps the parent's rings ------------------------------------------------


@pytest.mark.filterwarnings(FORK_WARNING)
def test_a_forked_child_closing_an_inherited_ring_leaves_it_to_the_parent(
        ring: cm.SharedHostRing) -> None:
    from cuda_memkit._core import _host_registry

    w = ring.handle.writer()
    first = w.acquire(timeout=10)
    first.array[...] = 6
    lent = ring.take(first.publish(6))
    seg = ring.nbytes
    r, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: close everything it inherited, then check nothing was released
        code = 1
        try:
            lent.close()
            ring.close()
            kept = _host_registry.registered_flags(ring._core.segment.ptr, seg) is not None
            mapped = _mappings() >= 1
            shown = cm.memory_stats().by_kind["shared_ring"].current >= seg
            os.write(wfd, f"{kept} {mapped} {shown}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(wfd)
    _pid, status = os.waitpid(pid, 0)
    answer = os.read(r, 100).decode()
    os.close(r)
    assert os.waitstatus_to_exitcode(status) == 0
    assert answer == "True True True", answer  # registration, mapping, ledger: all kept
    # the parent still serves: the lent slot is intact, and the ring goes on
    assert (lent.array == 6).all()
    lent.close()
    second = w.acquire(timeout=10)
    second.array[...] = 7
    with ring.take(second.publish(7)) as got:
        assert (got.array == 7).all()
    w.close()
