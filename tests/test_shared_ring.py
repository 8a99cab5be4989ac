"""SharedHostRing: slots filled by workers, lent to the consumer, given back after their copies.

Most tests fill the ring from this process (a writer is a writer, whichever
process holds it); ``test_shared_ring_processes.py`` does it from other
processes. Runs on the simulator (the shared memory and the sockets are real
there too) and on a GPU.
"""

from __future__ import annotations

import copy
import gc
import os
import pickle
import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest

import cuda_memkit as cm

from . import _ring_workers as rw
from ._leaks import live_exports

SHAPE = (64, 32)
F32 = np.dtype(np.float32)


@pytest.fixture
def ring() -> Iterator[cm.SharedHostRing]:
    r = cm.SharedHostRing(4, SHAPE, np.float32, grants=2, timeout=10)
    yield r
    r.close()


def _publish(w: cm.RingWriter, value: float, tag: int | None = None) -> tuple[int, int]:
    slot = w.acquire(timeout=10)
    slot.array[...] = value
    return slot.publish(tag)


def _no_grant(w: cm.RingWriter, seconds: float = 0.3) -> bool:
    """Whether the writer gets no slot within ``seconds``."""
    try:
        w.acquire(timeout=seconds).fail("unused")
    except TimeoutError:
        return True
    return False



# -- filling, taking, copying -----------------------------------------------------------


def test_a_filled_slot_reaches_the_device(ring: cm.SharedHostRing) -> None:
    w = ring.handle.writer(worker=3)
    ticket = _publish(w, 2.5, tag=17)
    with cm.Stream() as s, cm.DeviceBuffer.empty(SHAPE, F32) as dev:
        with ring.take(ticket) as slot:
            assert (slot.index, slot.generation) == ticket == slot.ticket
            assert slot.tag == slot.batch == 17 and slot.worker == 3 and slot.pid == os.getpid()
            slot.copy_to(dev, stream=s)
        s.synchronize()
        assert (dev.to_numpy() == 2.5).all()
    w.close()


def test_get_gives_slots_in_the_order_they_became_ready(ring: cm.SharedHostRing) -> None:
    w = ring.handle.writer()
    a, b = w.acquire(timeout=10), w.acquire(timeout=10)
    b.array[...] = 2
    b.publish(2)
    a.array[...] = 1
    a.publish(1)
    first, second = ring.get(), ring.get()
    assert (first.tag, second.tag) == (2, 1)
    assert first.array[0, 0] == 2 and second.array[0, 0] == 1
    assert first.worker is None  # no label given
    first.close()
    second.close()
    w.close()


def test_take_waits_for_a_ticket_published_later(ring: cm.SharedHostRing) -> None:
    w = ring.handle.writer()
    slot = w.acquire(timeout=10)
    threading.Timer(0.2, lambda: (slot.array.fill(4), slot.publish(4))).start()
    with ring.take(slot.ticket) as got:  # not ready yet: take() waits for its READY
        assert got.array[0, 0] == 4
    with pytest.raises(ValueError, match="taken once"):
        ring.take(slot.ticket)
    w.close()


def test_a_writer_holds_at_most_its_grants(ring: cm.SharedHostRing) -> None:
    w = ring.handle.writer()
    held = [w.acquire(timeout=10), w.acquire(timeout=10)]
    assert _no_grant(w)  # grants=2: the other two slots wait for another worker
    assert ring.stats()["filling"] == 2
    other = ring.handle.writer(worker=1)
    held += [other.acquire(timeout=10), other.acquire(timeout=10)]
    assert sorted(s.index for s in held) == [0, 1, 2, 3]
    for s in held:
        s.fail("not needed")
    for _ in held:
        with pytest.raises(cm.WorkerError, match="not needed"):
            ring.get()
    w.close()
    other.close()


def test_a_worker_leaving_as_it_is_granted_loses_nothing() -> None:
    """Workers that publish their last batch and leave, again and again: a grant sent to one
    that has just left fails, and its last batches (still unread) must arrive all the same."""
    def fill(handle: cm.RingHandle, label: int) -> None:
        with handle.writer(label) as w:
            for k in range(4):
                with w.acquire(timeout=10) as slot:
                    slot.array[...] = label * 10 + k

    for _ in range(100):
        with cm.SharedHostRing(3, 64, np.int32, timeout=10) as ring:
            threads = [threading.Thread(target=fill, args=(ring.handle, label))
                       for label in (1, 2)]
            for t in threads:
                t.start()
            got = []
            for _ in range(8):
                with ring.get() as slot:
                    got.append(int(slot.array[0]))
            for t in threads:
                t.join()
            assert sorted(got) == [10, 11, 12, 13, 20, 21, 22, 23]


def test_one_writer_per_process_and_label(ring: cm.SharedHostRing) -> None:
    h = ring.handle
    assert h.writer() is h.writer() and h.writer(1) is h.writer(1)
    assert h.writer(1) is not h.writer(2) and h.writer(1).worker == 1
    for label in (None, 1, 2):
        h.writer(label).close()
    assert h.writer(1).closed is False  # a closed writer is replaced
    h.writer(1).close()


def test_a_failed_slot_raises_worker_error_with_the_traceback(ring: cm.SharedHostRing) -> None:
    w = ring.handle.writer(worker=5)
    with pytest.raises(ZeroDivisionError), w.acquire(timeout=10):
        1 / 0  # noqa: B018
    with pytest.raises(cm.WorkerError, match=r"(?s)worker 5 .*ZeroDivisionError") as info:
        ring.get()
    assert info.value.worker == 5 and info.value.pid == os.getpid()
    assert info.value.slot is not None and info.value.batch is None and not info.value.gone
    assert pickle.loads(pickle.dumps(info.value)).slot == info.value.slot
    assert ring.stats()["ready"] == 0  # the slot went back to the workers
    w.close()


def test_a_failure_reaches_a_consumer_of_tickets_and_frees_its_slot() -> None:
    with cm.SharedHostRing(2, SHAPE, np.float32, grants=1, timeout=10) as ring:
        w = ring.handle.writer()
        good = _publish(w, 1.0)
        failing = w.acquire(timeout=10)
        failing.fail("no such item")
        again = w.acquire(timeout=10)  # granted after the failure arrived: the slot came back
        assert (again.index, again.generation) == (failing.index, failing.generation + 1)
        with pytest.raises(cm.WorkerError, match="no such item") as e:
            ring.take(list(good))  # a DataLoader hands tickets over as lists
        assert e.value.slot == failing.index and not e.value.gone
        with ring.take(list(good)) as slot:  # the good one is still there
            assert slot.array[0, 0] == 1.0
        again.fail("done")
        w.close()


def test_to_device_copies_and_gives_the_slot_back(ring: cm.SharedHostRing) -> None:
    w = ring.handle.writer()
    slot = ring.take(_publish(w, 8.0))
    with cm.Stream() as s:
        buf = slot.to_device(stream=s)
        assert slot.closed and isinstance(buf, cm.PoolBuffer) and buf.nbytes == slot.nbytes
        s.synchronize()
        assert (buf.to_numpy(np.float32, SHAPE) == 8.0).all()
        view = buf.as_array(slot.dtype, slot.shape)
        assert view.shape == SHAPE and view.dtype == F32
        buf.free(stream=s)
    assert rw.eventually(lambda: ring.stats()["lent"] == 0)
    with cm.MemoryPool(0) as pool:
        buf = ring.take(_publish(w, 9.0)).to_device(pool=pool)
        assert buf.pool is pool and (buf.to_numpy(np.float32) == 9.0).all()
        buf.close()
    w.close()


def test_to_device_after_copies_in_flight(copies_in_flight: Callable[[], None]) -> None:
    with cm.SharedHostRing(1, SHAPE, np.float32, grants=1, timeout=10) as ring, \
            cm.Stream() as s:
        w = ring.handle.writer()
        buf = ring.take(_publish(w, 3.0)).to_device(stream=s)
        assert ring.stats()["lent"] == 1 and _no_grant(w)
        copies_in_flight()
        assert rw.eventually(lambda: ring.stats()["lent"] == 0)
        s.synchronize()
        assert (buf.to_numpy(np.float32) == 3.0).all()
        buf.free(stream=s)
        s.synchronize()
        w.close()


# -- giving slots back only when nothing reads them any more -----------------------------


def test_a_slot_goes_back_only_after_its_copy(
        copies_in_flight: Callable[[], None]) -> None:
    with cm.SharedHostRing(1, SHAPE, np.float32, grants=1, timeout=10) as ring, \
            cm.Stream() as s, cm.DeviceBuffer.empty(SHAPE, F32) as dev:
        w = ring.handle.writer()
        slot = ring.take(_publish(w, 7.0))
        slot.copy_to(dev, stream=s)
        slot.close()  # the copy still runs: the slot stays lent
        assert ring.stats()["lent"] == 1
        assert _no_grant(w)  # no worker may overwrite what the copy reads
        copies_in_flight()  # the copy's event completes
        assert rw.eventually(lambda: ring.stats()["lent"] == 0)
        again = w.acquire(timeout=10)
        assert again.index == slot.index and again.generation == slot.generation + 1
        again.fail("done")
        s.synchronize()
        assert (dev.to_numpy() == 7.0).all()
        w.close()


def test_numpy_views_keep_the_slot_lent() -> None:
    with cm.SharedHostRing(1, SHAPE, np.float32, grants=1, timeout=10) as ring:
        w = ring.handle.writer()
        slot = ring.take(_publish(w, 1.0))
        view = slot.array[3:]
        slot.close()
        assert slot.closed and ring.stats()["lent"] == 1
        assert _no_grant(w)
        assert view[0, 0] == 1.0  # still the batch
        del view
        gc.collect()
        w.acquire(timeout=10).fail("done")
        w.close()


def test_a_dlpack_capsule_keeps_the_slot_lent() -> None:
    with cm.SharedHostRing(1, SHAPE, np.float32, grants=1, timeout=10) as ring:
        w = ring.handle.writer()
        slot = ring.take(_publish(w, 1.0))
        capsule = slot.__dlpack__()
        slot.close()
        assert _no_grant(w)
        del capsule
        gc.collect()
        assert live_exports() == 0
        w.acquire(timeout=10).fail("done")
        w.close()


def test_a_dropped_slot_goes_back(ring: cm.SharedHostRing) -> None:
    w = ring.handle.writer()
    slot = ring.take(_publish(w, 1.0))
    assert ring.stats()["lent"] == 1
    del slot
    gc.collect()
    assert rw.eventually(lambda: ring.stats()["lent"] == 0)
    assert rw.eventually(lambda: ring.stats()["granted"] == 2 and ring.stats()["free"] == 2)
    w.close()


# -- the buffer contract -------------------------------------------------------------------


def test_a_slot_is_a_buffer(ring: cm.SharedHostRing) -> None:
    w = ring.handle.writer()
    slot = ring.take(_publish(w, 1.5))
    try:
        assert isinstance(slot, cm.Buffer) and slot.kind is cm.MemoryKind.SHARED_RING
        assert slot.device is None and slot.shape == SHAPE and slot.dtype == F32
        assert slot.nbytes == ring.slot_nbytes == 64 * 32 * 4
        assert np.asarray(slot).ctypes.data == slot.ptr
        assert (slot.to_numpy() == 1.5).all() and slot.to_numpy().shape == SHAPE
        cai = slot.__cuda_array_interface__
        assert cai["data"] == (slot.device_ptr, False) and tuple(cai["shape"]) == SHAPE
        assert np.dtype(cai["typestr"]) == F32
        assert slot.__dlpack_device__() == (3, 0)  # kDLCUDAHost: registered pinned memory
        view = slot.as_array(np.uint8)
        assert view.nbytes == slot.nbytes and view.ptr == slot.device_ptr
        slot.fill(np.float32(3.0))
        assert (slot.array == 3.0).all()
        slot.copy_from(np.full(SHAPE, 4.0, np.float32))
        assert (slot.to_numpy() == 4.0).all()
        with pytest.raises(ValueError, match="shape mismatch"):
            slot.copy_from(np.zeros(8, np.float32))
        assert "RingSlot" in repr(slot)
    finally:
        slot.close()
    with pytest.raises(cm.ClosedError):
        slot.ptr  # noqa: B018
    with pytest.raises(cm.ClosedError):
        slot.array  # noqa: B018
    with pytest.raises(cm.ClosedError):
        slot.__cuda_array_interface__  # noqa: B018
    assert slot.nbytes and slot.kind and "closed" in repr(slot)
    slot.close()
    w.close()


def test_a_slot_larger_than_the_device_buffer_is_refused(ring: cm.SharedHostRing) -> None:
    w = ring.handle.writer()
    with ring.take(_publish(w, 1.0)) as slot, cm.DeviceBuffer.empty(slot.nbytes // 2) as small:
        with pytest.raises(ValueError, match="size mismatch"):
            slot.copy_to(small)
        with pytest.raises(ValueError, match="size mismatch"):
            slot.copy_to(small, stream=0)
    w.close()


def test_memory_stats_show_the_ring_once() -> None:
    before = cm.memory_stats()
    with cm.SharedHostRing(3, 5000) as ring:
        now = cm.memory_stats()
        grew = {k: now.by_kind[k].current - before.by_kind[k].current for k in cm.MEMORY_KINDS}
        assert grew["shared_ring"] == grew["registered"] == ring.nbytes == 3 * 8192
        assert now.current - before.current == ring.nbytes  # counted once
        assert ring.nbytes >= ring.slots * ring.slot_nbytes
    after = cm.memory_stats()
    assert after.by_kind["shared_ring"].current == before.by_kind["shared_ring"].current


# -- ownership and closing ---------------------------------------------------------------


def test_the_ring_shares_through_its_handle_only(ring: cm.SharedHostRing) -> None:
    for attempt in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match=r"ring\.handle"):
            attempt(ring)
    h = pickle.loads(pickle.dumps(ring.handle))
    assert h == ring.handle and hash(h) == hash(ring.handle)
    assert (h.slots, h.shape, h.dtype, h.slot_nbytes) == (4, SHAPE, F32, ring.slot_nbytes)
    assert "token" not in repr(h)


def test_closing_the_ring_stops_its_writers() -> None:
    ring = cm.SharedHostRing(2, 16)
    w = ring.handle.writer()
    held = w.acquire(timeout=10)
    handle = ring.handle
    ring.close()
    ring.close()
    with pytest.raises(cm.ClosedError, match="closed"):  # this process's writers are closed
        held.publish()
    assert w.closed
    with pytest.raises(cm.ClosedError):
        w.acquire(timeout=1)
    with pytest.raises(cm.ClosedError, match="no consumer"):
        handle.writer(worker=9)
    for call in (ring.get, lambda: ring.take((0, 1)), lambda: ring.handle):
        with pytest.raises(cm.ClosedError):
            call()
    assert "closed" in repr(ring)


def test_close_wakes_a_waiting_consumer() -> None:
    ring = cm.SharedHostRing(2, 16, timeout=None)
    closer = threading.Timer(0.2, ring.close)
    closer.start()
    with pytest.raises(cm.ClosedError):
        ring.get()  # woken as the close begins: the close goes on on the other thread
    closer.join()


def test_a_lent_slot_outlives_the_closed_ring() -> None:
    before = cm.memory_stats().by_kind["shared_ring"].current
    ring = cm.SharedHostRing(2, SHAPE, np.float32)
    w = ring.handle.writer()
    slot = ring.take(_publish(w, 6.0))
    ring.close()
    assert cm.memory_stats().by_kind["shared_ring"].current > before  # the slot still reads it
    with cm.DeviceBuffer.empty(slot.nbytes) as dev:
        slot.copy_to(dev)
        assert (dev.to_numpy(np.float32) == 6.0).all()
    slot.close()
    assert cm.memory_stats().by_kind["shared_ring"].current == before


def test_a_stranger_is_refused(ring: cm.SharedHostRing) -> None:
    h = ring.handle
    forged = cm.RingHandle.make(h._address, b"x" * 16, h.slots, h._stride, h.shape,
                                h.dtype.str, h.slot_nbytes)
    with pytest.raises(RuntimeError, match=r"refused.*wrong ring handle"):
        forged.writer(worker=7)
    assert ring.workers == 0


# -- timeouts ----------------------------------------------------------------------------------


def test_a_timeout_names_what_the_ring_waits_for(ring: cm.SharedHostRing) -> None:
    ring.timeout = 0.2
    assert ring.timeout == 0.2
    with pytest.raises(TimeoutError, match=r"0 worker.*start the workers"):
        ring.get()
    w = ring.handle.writer(worker=4)
    slot = w.acquire(timeout=10)
    with pytest.raises(TimeoutError, match=r"slot \d filling worker 4 \(pid \d+\)"):
        ring.get()
    slot.fail("done")
    w.close()


def test_the_ring_reports_what_it_holds(ring: cm.SharedHostRing) -> None:
    assert ring.stats() == {"free": 4, "granted": 0, "filling": 0, "ready": 0, "lent": 0,
                            "workers": 0}
    w = ring.handle.writer()
    assert rw.eventually(lambda: ring.stats()["granted"] == 2)
    assert ring.workers == 1 and ring.grants == 2 and ring.slots == 4
    assert "workers=1" in repr(ring)
    w.close()
    assert rw.eventually(lambda: ring.stats()["free"] == 4 and ring.workers == 0)


def test_the_segment_has_no_name() -> None:
    shm = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    with cm.SharedHostRing(2, 4096) as ring:
        w = ring.handle.writer()
        ticket = _publish(w, 1)
        ring.take(ticket).close()
        if os.path.isdir("/dev/shm"):
            assert set(os.listdir("/dev/shm")) == shm
        with open(f"/proc/{os.getpid()}/maps") as f:
            maps = f.read()
        assert "memfd:cuda_memkit-ring" in maps
        w.close()
