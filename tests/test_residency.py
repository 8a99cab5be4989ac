"""Residency of managed memory: what the range attributes say, cuda_memkit's own record,
and (on the simulator) a GPU that fills up: migration, eviction, read-mostly duplicates."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit._core._resource import LEDGER
from cuda_memkit._managed_memory import _managed_ranges as _ranges
from cuda_memkit._managed_memory._residency import managed_capacity

pytestmark = pytest.mark.uses_managed_memory

MiB = 1 << 20
BLOCK = 2 * MiB
D0 = cm.Location.device(0)
HOST = cm.Location.host()
A = cm.MemAdvice


def sync() -> None:
    cm.Stream.legacy_default().synchronize()


@pytest.fixture
def buf() -> Iterator[cm.ManagedBuffer]:
    b = cm.ManagedBuffer.zeros(8 * MiB)
    yield b
    sync()
    b.close()


def resident_now() -> int:
    return sum(s.current for s in cm.memory_stats().kind("managed_resident"))


# -- what the driver's range attributes say ---------------------------------------------


def test_a_fresh_buffer_is_one_run_with_nothing_set(buf: cm.ManagedBuffer) -> None:
    res = buf.residency()
    assert res.nbytes == buf.nbytes and res.ptr == buf.ptr
    assert len(res.runs) == 1
    run = res.runs[0]
    assert (run.offset, run.nbytes) == (0, buf.nbytes)
    assert run.last_prefetch_location is None and run.preferred_location is None
    assert run.accessed_by == () and run.read_mostly is False
    assert res.prefetched_bytes(D0) == 0
    assert res.by_last_prefetch == {None: buf.nbytes}


def test_parts_follow_partial_prefetches_and_advice(buf: cm.ManagedBuffer) -> None:
    buf.prefetch(D0, offset=0, nbytes=4 * MiB)
    buf.prefetch(HOST, offset=2 * MiB, nbytes=2 * MiB)
    buf.advise(A.SET_READ_MOSTLY, offset=6 * MiB, nbytes=2 * MiB)
    buf.advise(A.SET_ACCESSED_BY, D0, offset=4 * MiB, nbytes=4 * MiB)
    buf.advise(A.SET_PREFERRED_LOCATION, HOST, offset=4 * MiB, nbytes=2 * MiB)
    sync()
    runs = [(r.offset, r.nbytes, r.last_prefetch_location, r.preferred_location,
             r.accessed_by, r.read_mostly) for r in buf.residency().runs]
    assert runs == [
        (0, 2 * MiB, D0, None, (), False),
        (2 * MiB, 2 * MiB, HOST, None, (), False),
        (4 * MiB, 2 * MiB, None, HOST, (D0,), False),
        (6 * MiB, 2 * MiB, None, None, (D0,), True),
    ]
    res = buf.residency()
    assert res.prefetched_bytes(D0) == 2 * MiB
    assert res.prefetched_bytes(cm.Device(0)) == 2 * MiB
    assert res.prefetched_bytes(HOST) == 2 * MiB
    assert res.by_last_prefetch == {D0: 2 * MiB, HOST: 2 * MiB, None: 4 * MiB}


def test_offsets_are_from_the_start_of_the_range_asked(buf: cm.ManagedBuffer) -> None:
    buf.prefetch(D0, offset=4 * MiB, nbytes=2 * MiB)
    sync()
    res = buf.residency(3 * MiB, 4 * MiB)
    assert res.ptr == buf.ptr + 3 * MiB and res.nbytes == 4 * MiB
    assert [(r.offset, r.nbytes, r.last_prefetch_location) for r in res.runs] == [
        (0, MiB, None), (MiB, 2 * MiB, D0), (3 * MiB, MiB, None)]


def test_page_granularity_sees_what_blocks_blur(buf: cm.ManagedBuffer) -> None:
    buf.prefetch(D0, offset=0, nbytes=MiB)  # half of the first 2 MiB block
    sync()
    coarse = buf.residency()
    assert coarse.runs[0].nbytes == buf.nbytes  # the block's pages disagree: no location
    assert coarse.prefetched_bytes(D0) == 0
    fine = buf.residency(granularity=4096)
    assert [(r.offset, r.nbytes, r.last_prefetch_location) for r in fine.runs] == [
        (0, MiB, D0), (MiB, 7 * MiB, None)]
    assert fine.granularity == 4096


def test_managed_residency_reads_any_managed_range(buf: cm.ManagedBuffer) -> None:
    buf.prefetch(D0, offset=2 * MiB, nbytes=2 * MiB)
    sync()
    assert cm.managed_residency(buf.ptr, buf.nbytes).runs == buf.residency().runs
    part = cm.managed_residency(buf.ptr + 2 * MiB, 2 * MiB)
    assert [(r.offset, r.nbytes, r.last_prefetch_location) for r in part.runs] == [
        (0, 2 * MiB, D0)]


def test_an_empty_buffer_reads_nothing() -> None:
    with cm.ManagedBuffer.empty(0) as empty:
        res = empty.residency()
        assert res.runs == () and res.nbytes == 0
        assert "0 B in 0 runs" in repr(res)


def test_repr_is_a_table_of_the_parts(buf: cm.ManagedBuffer) -> None:
    buf.prefetch(D0, offset=0, nbytes=2 * MiB)
    buf.advise(A.SET_READ_MOSTLY, offset=2 * MiB, nbytes=2 * MiB)
    sync()
    text = repr(buf.residency())
    lines = text.splitlines()
    assert lines[0].startswith(f"<Residency 0x{buf.ptr:x}: 8.00 MiB in 3 runs")
    assert "device 0 2.00 MiB" in lines[0] and "not prefetched 6.00 MiB" in lines[0]
    assert lines[1].split()[:3] == ["offset", "bytes", "last"]
    assert lines[2].split()[-1] == "no" and "device 0" in lines[2]
    assert lines[3].split()[-1] == "yes"
    assert len(lines) == 5


# -- cuda_memkit's own record: memory_stats kind "managed_resident" ------------------------


def test_the_ledger_follows_prefetches_and_discards(buf: cm.ManagedBuffer) -> None:
    base = resident_now()
    buf.prefetch(D0, nbytes=6 * MiB)
    assert resident_now() - base == 6 * MiB
    [acct] = cm.memory_stats(0).kind("managed_resident")
    assert acct.live >= 1 and acct.peak >= 6 * MiB
    buf.prefetch(HOST, offset=MiB, nbytes=MiB)
    assert resident_now() - base == 5 * MiB
    assert _ranges.recorded_bytes(buf.ptr, buf.nbytes, 0) == 5 * MiB
    assert _ranges.recorded_bytes(buf.ptr, 2 * MiB, 0) == MiB
    buf.discard(offset=0, nbytes=MiB)
    assert resident_now() - base == 4 * MiB
    buf.discard_and_prefetch(D0, offset=6 * MiB, nbytes=2 * MiB)
    assert resident_now() - base == 6 * MiB
    # managed memory is counted once: the record is an alias, out of the totals
    stats = cm.memory_stats()
    assert stats.current == sum(s.current for s in stats.accounts
                                if s.kind not in ("vmm_mapped", "shared_ring",
                                                  "managed_resident"))
    sync()
    buf.close()
    assert resident_now() == base


def test_the_ledger_rounds_out_to_pages_and_clips_to_the_buffer() -> None:
    with cm.ManagedBuffer.empty(10_000) as b:
        b.prefetch(D0, offset=100, nbytes=10)
        assert _ranges.recorded_bytes(b.ptr, b.nbytes, 0) == 4096
        b.prefetch(D0)
        assert _ranges.recorded_bytes(b.ptr, b.nbytes, 0) == 10_000
        sync()


def test_prefetch_plans_are_recorded(buf: cm.ManagedBuffer, stream: cm.Stream) -> None:
    with cm.ManagedBuffer.empty(4 * MiB) as other:
        plan = cm.PrefetchPlan().add(buf, D0, offset=MiB, nbytes=MiB)
        plan.add(other, D0, offset=0, nbytes=2 * MiB).add(other, D0, offset=2 * MiB, nbytes=MiB)
        plan.execute(stream)
        stream.synchronize()
        assert _ranges.recorded_bytes(buf.ptr, buf.nbytes, 0) == MiB
        assert _ranges.recorded_bytes(buf.ptr, MiB, 0) == 0
        assert _ranges.recorded_bytes(other.ptr, other.nbytes, 0) == 3 * MiB


def test_the_policy_builder_prefetches_are_recorded(buf: cm.ManagedBuffer) -> None:
    cm.ManagedMemoryHints.for_buffer(buf).prefetch_range(MiB, 3 * MiB, D0, None)
    sync()
    assert _ranges.recorded_bytes(buf.ptr, buf.nbytes, 0) == 3 * MiB


def test_foreign_managed_memory_is_not_recorded() -> None:
    # A range of managed memory cuda_memkit does not own (a raw allocation).
    from cuda_memkit._core import _driver

    cm.Device(0).set_current()
    ptr = int(_driver.call("cuMemAllocManaged", 4 * MiB, 1))
    try:
        _ranges.issue_prefetch(ptr, 4 * MiB, D0, 0)
        assert _ranges.recorded_bytes(ptr, 4 * MiB, 0) == 0
        assert cm.managed_residency(ptr, 4 * MiB).prefetched_bytes(D0) == 4 * MiB
    finally:
        sync()
        _driver.call("cuMemFree", ptr)


def test_a_reused_address_starts_a_fresh_record() -> None:
    with cm.ManagedBuffer.empty(4 * MiB) as a:
        a.prefetch(D0)
        sync()
        ptr = a.ptr
    with cm.ManagedBuffer.empty(4 * MiB) as b:
        if b.ptr == ptr:
            assert _ranges.recorded_bytes(b.ptr, b.nbytes, 0) == 0
        assert b.residency().prefetched_bytes(D0) in (0, 4 * MiB)  # the driver's own answer


# -- the simulator: a GPU that fills up -----------------------------------------------------


@pytest.fixture
def small_gpu() -> Iterator[int]:
    """Device 0 of the simulator shrunk to 32 MiB free."""
    from cuda_memkit.sim import machine

    dev = machine().devices[0]
    total = dev.total_mem
    dev.managed_cached = 0  # as if the driver had given back what it kept
    dev.total_mem = dev.used + dev.managed_used + 32 * MiB
    try:
        yield 32 * MiB
    finally:
        dev.total_mem = total
        dev.managed_cached = 0


def where(b: cm.ManagedBuffer) -> dict[int, int]:
    from cuda_memkit import sim

    return sim.resident_bytes(b.ptr, b.nbytes)


def evictions() -> dict[str, int]:
    from cuda_memkit.sim import machine

    return dict(machine().managed_evictions)


def free0() -> int:
    return cm.Device(0).mem_info()[0]


def host_written(b: cm.ManagedBuffer, value: int) -> cm.ManagedBuffer:
    """Fill ``b`` from the host, as a program would through its numpy view."""
    from cuda_memkit import sim

    b.array[:] = value
    sim.host_access(b.ptr, b.nbytes, write=True)  # the simulator cannot see numpy stores
    return b


@pytest.mark.sim_only
def test_prefetching_to_the_device_takes_its_free_memory(small_gpu: int) -> None:
    with cm.ManagedBuffer.empty(8 * MiB) as b, cm.ManagedBuffer.empty(8 * MiB) as c:
        assert where(b) == {-1: 8 * MiB} and free0() == small_gpu
        b.prefetch(D0)
        assert where(b) == {0: 8 * MiB}
        assert free0() == small_gpu - 8 * MiB
        b.prefetch(HOST)  # the pages leave; the driver keeps their memory
        assert where(b) == {-1: 8 * MiB} and free0() == small_gpu - 8 * MiB
        c.prefetch(D0, nbytes=4096)  # one page takes a whole 2 MiB block, from what was kept
        assert where(c) == {0: BLOCK, -1: 6 * MiB} and free0() == small_gpu - 8 * MiB
        c.prefetch(D0)
        assert where(c) == {0: 8 * MiB} and free0() == small_gpu - 8 * MiB
    assert free0() == small_gpu - 8 * MiB  # kept after the free too
    with cm.DeviceBuffer.empty(small_gpu):  # and given to a device allocation that needs it
        assert free0() == 0
    assert free0() == small_gpu


@pytest.mark.sim_only
def test_a_full_device_evicts_the_least_recently_used_blocks(small_gpu: int) -> None:
    with host_written(cm.ManagedBuffer.empty(16 * MiB), 7) as a, \
            cm.ManagedBuffer.empty(16 * MiB) as b, cm.ManagedBuffer.empty(8 * MiB) as c:
        a.prefetch(D0)
        b.prefetch(D0)
        assert free0() == 0
        before = evictions()
        c.prefetch(D0)
        assert where(c) == {0: 8 * MiB}
        assert where(a) == {-1: 8 * MiB, 0: 8 * MiB}  # a's first blocks went first
        assert cm.managed_residency(a.ptr, 8 * MiB).runs[0].last_prefetch_location == D0
        assert where(b) == {0: 16 * MiB}
        after = evictions()
        assert after["written_back"] - before["written_back"] == 8 * MiB
        assert after["dropped"] == before["dropped"]
        assert (a.array == 7).all()  # written back: the data is intact


@pytest.mark.sim_only
def test_touching_a_block_makes_it_recently_used(small_gpu: int) -> None:
    from cuda_memkit import sim

    with cm.DeviceBuffer.empty(2 * MiB) as d, cm.ManagedBuffer.empty(14 * MiB) as a, \
            cm.ManagedBuffer.empty(16 * MiB) as b, cm.ManagedBuffer.empty(2 * MiB) as c:
        a.prefetch(D0)
        b.prefetch(D0)
        assert free0() == 0
        cm.copy(d, a, nbytes=2 * MiB)  # a device access of a's first block
        c.prefetch(D0)
        assert sim.resident_bytes(a.ptr, 2 * MiB) == {0: 2 * MiB}  # kept: used last
        assert sim.resident_bytes(a.ptr + 2 * MiB, 2 * MiB) == {-1: 2 * MiB}  # evicted
        assert where(a) == {0: 12 * MiB, -1: 2 * MiB} and where(b) == {0: 16 * MiB}


@pytest.mark.sim_only
def test_device_allocations_evict_managed_pages_rather_than_fail(small_gpu: int) -> None:
    with cm.ManagedBuffer.empty(24 * MiB) as a:
        a.prefetch(D0)
        assert free0() == 8 * MiB
        with cm.DeviceBuffer.empty(16 * MiB):
            assert where(a) == {0: 16 * MiB, -1: 8 * MiB}
            assert free0() == 0
        assert free0() == 16 * MiB
        a.prefetch(D0)
        assert free0() == 8 * MiB
        pool = cm.MemoryPool(0)
        try:
            with pool.allocate(MiB, stream=None):  # the pool reserves 32 MiB: all of it
                assert where(a) == {-1: 24 * MiB}
                assert free0() == 0
        finally:
            sync()
            pool.close()


@pytest.mark.sim_only
def test_more_than_the_device_holds_fails_and_evicts_nothing(small_gpu: int) -> None:
    with cm.ManagedBuffer.empty(8 * MiB) as a:
        a.prefetch(D0)
        with pytest.raises(cm.CudaOutOfMemoryError):
            cm.DeviceBuffer.empty(small_gpu + MiB)
        assert where(a) == {0: 8 * MiB}


@pytest.mark.sim_only
def test_read_mostly_duplicates_are_dropped_without_a_write_back(small_gpu: int) -> None:
    with host_written(cm.ManagedBuffer.empty(16 * MiB), 3) as a:
        a.advise(A.SET_READ_MOSTLY)
        a.prefetch(D0)
        assert where(a) == {-1: 16 * MiB, 0: 16 * MiB}  # a copy on each side
        assert free0() == small_gpu - 16 * MiB
        before = evictions()
        with cm.DeviceBuffer.empty(24 * MiB):
            after = evictions()
            assert after["dropped"] - before["dropped"] == 8 * MiB
            assert after["written_back"] == before["written_back"]
            assert where(a) == {-1: 16 * MiB, 0: 8 * MiB}
        assert (a.array == 3).all()


@pytest.mark.sim_only
def test_a_device_write_collapses_read_mostly_duplicates(small_gpu: int) -> None:
    with host_written(cm.ManagedBuffer.empty(4 * MiB), 1) as a, \
            cm.DeviceBuffer.zeros(2 * MiB) as d:
        a.advise(A.SET_READ_MOSTLY)
        a.prefetch(D0)
        cm.copy(d, a, nbytes=2 * MiB)  # a device read keeps both copies
        assert where(a) == {-1: 4 * MiB, 0: 4 * MiB}
        cm.copy(a, d, nbytes=2 * MiB)  # a device write leaves the writer's copy alone
        from cuda_memkit import sim

        assert sim.resident_bytes(a.ptr, 2 * MiB) == {0: 2 * MiB}
        assert sim.resident_bytes(a.ptr + 2 * MiB, 2 * MiB) == {-1: 2 * MiB, 0: 2 * MiB}


@pytest.mark.sim_only
def test_device_accesses_fault_pages_in_unless_served_from_the_host(small_gpu: int) -> None:
    with host_written(cm.ManagedBuffer.empty(4 * MiB), 1) as a, \
            host_written(cm.ManagedBuffer.empty(4 * MiB), 2) as z, \
            cm.DeviceBuffer.zeros(4 * MiB) as d:
        assert where(a) == {-1: 4 * MiB}
        cm.copy(d, a)
        assert where(a) == {0: 4 * MiB}  # faulted in by the device's access
        z.advise(A.SET_PREFERRED_LOCATION, HOST)
        z.advise(A.SET_ACCESSED_BY, D0)
        cm.copy(d, z)
        cm.copy(z, d)
        assert where(z) == {-1: 4 * MiB}  # zero-copy: read and written through the mapping
        z.prefetch(D0)  # a prefetch still moves it
        assert where(z) == {0: 4 * MiB}


@pytest.mark.sim_only
def test_host_accesses_fault_pages_back(small_gpu: int) -> None:
    from cuda_memkit import sim

    with cm.ManagedBuffer.zeros(4 * MiB) as a, cm.ManagedBuffer.zeros(4 * MiB) as r:
        a.prefetch(D0)
        sim.host_access(a.ptr, MiB, write=False)  # one block back to the host
        assert where(a) == {-1: 2 * MiB, 0: 2 * MiB}
        r.advise(A.SET_READ_MOSTLY)
        r.prefetch(D0)
        r.prefetch(HOST)  # read-mostly: a host copy, the device copy stays
        assert where(r) == {-1: 4 * MiB, 0: 4 * MiB}
        sim.host_access(r.ptr, r.nbytes, write=True)  # a write collapses to the host
        assert where(r) == {-1: 4 * MiB}
        assert free0() == small_gpu - 8 * MiB  # the most they held at once: kept


@pytest.mark.sim_only
def test_discard_drops_every_copy(small_gpu: int) -> None:
    with cm.ManagedBuffer.zeros(8 * MiB) as a:
        a.prefetch(D0)
        a.discard(offset=0, nbytes=4 * MiB)
        assert where(a) == {0: 4 * MiB}
        assert free0() == small_gpu - 8 * MiB  # the driver keeps the memory
        a.discard_and_prefetch(HOST, offset=4 * MiB, nbytes=4 * MiB)
        assert where(a) == {-1: 4 * MiB} and free0() == small_gpu - 8 * MiB


@pytest.mark.sim_only
def test_prefetching_to_another_device_moves_the_pages(two_devices: None) -> None:
    with cm.ManagedBuffer.zeros(4 * MiB) as a:
        a.prefetch(1)
        assert where(a) == {1: 4 * MiB}
        a.prefetch(D0)
        assert where(a) == {0: 4 * MiB}


@pytest.mark.sim_only
def test_managed_capacity_counts_what_cuda_memkit_prefetched(small_gpu: int) -> None:
    assert managed_capacity(0) == small_gpu
    with cm.ManagedBuffer.empty(8 * MiB) as a:
        a.prefetch(D0)
        assert free0() == small_gpu - 8 * MiB
        assert managed_capacity(cm.Device(0)) == small_gpu
        with cm.DeviceBuffer.empty(4 * MiB):
            assert managed_capacity(0) == small_gpu - 4 * MiB
        sync()


@pytest.mark.sim_only
def test_the_simulators_data_survives_migration(small_gpu: int) -> None:
    data = np.arange(4 * MiB // 4, dtype=np.uint32)
    with cm.ManagedBuffer.from_array(data) as a, cm.DeviceBuffer.empty(4 * MiB) as d:
        a.prefetch(D0)
        cm.copy(d, a)
        out = np.empty_like(data)
        cm.copy(out, d)
        assert (out == data).all()


def test_a_buffer_freed_in_the_middle_of_a_fold_leaves_no_record(
        monkeypatch: pytest.MonkeyPatch) -> None:
    a = cm.ManagedBuffer.empty(4 * MiB)
    c = cm.ManagedBuffer.empty(4 * MiB)
    c.prefetch(D0)
    _ranges.fold()
    c_ptr = c.ptr
    real_apply = _ranges._apply
    calls = []

    def apply_and_free(steps: list[tuple[int, int, cm.Location | None]]) -> None:
        if not calls:
            sync()
            c.close()  # as a finalizer would, while the fold runs
        calls.extend(ptr for ptr, _n, _loc in steps)
        real_apply(steps)

    monkeypatch.setattr(_ranges, "_apply", apply_and_free)
    a.prefetch(D0)
    _ranges.fold()
    assert calls == [a.ptr]
    accts = [acct for (kind, _d, _p), acct in LEDGER.items() if kind == "managed_resident"]
    assert all(c_ptr not in acct.live for acct in accts)
    assert any(acct.live.get(a.ptr) == 4 * MiB for acct in accts)
    sync()
    a.close()
    assert all(not acct.live for acct in accts)


@pytest.mark.sim_only
def test_the_simulators_residency_tools_refuse_other_memory() -> None:
    from cuda_memkit import sim

    with cm.DeviceBuffer.empty(MiB) as d, cm.ManagedBuffer.empty(MiB) as m:
        with pytest.raises(ValueError, match="managed"):
            sim.host_access(d.ptr, MiB)
        with pytest.raises(ValueError, match="managed"):
            sim.resident_bytes(m.ptr, 2 * MiB + 4096)


@pytest.mark.sim_only
def test_a_managed_pool_buffer_gives_its_device_blocks_back(small_gpu: int,
                                                             stream: cm.Stream) -> None:
    with cm.MemoryPool(managed=True) as p:
        buf = p.allocate(4 * MiB, stream=stream)
        cm.managed_residency(buf.ptr, buf.nbytes)  # any managed memory
        _ranges.issue_prefetch(buf.ptr, buf.nbytes, D0, stream.handle)
        assert free0() == small_gpu - 4 * MiB
        buf.free()
        stream.synchronize()
    assert free0() == small_gpu - 4 * MiB  # kept by the driver
    with cm.DeviceBuffer.empty(small_gpu):  # and given back: nothing stale is left
        assert free0() == 0
