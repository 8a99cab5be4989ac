"""AccessPlan: managed data walked in chunks, each on the device when the work runs.

The promises: every chunk's ``data`` holds that chunk's bytes when work ordered on
``chunk.stream`` runs; writes to a ``"readwrite"`` chunk reach the buffer; the
mechanism follows the pattern; the buffer's advice is what it was after the walk; a
walk left early (``break``, an exception) frees everything; a stream of another
device walks on that device.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import cuda_memkit as cm

#: Every test walks managed memory (the GPU leak check allows for the driver's page cache).
pytestmark = pytest.mark.uses_managed_memory

N = 64 * 1024  # float32 elements: 256 KiB
CHUNK = 16 * 1024  # bytes: 16 chunks


@pytest.fixture
def data() -> Iterator[cm.ManagedBuffer]:
    buf = cm.ManagedBuffer.from_array(np.arange(N, dtype=np.float32))
    yield buf
    buf.close()


def read_chunk(chunk: cm.AccessChunk) -> np.ndarray:
    """The chunk's values as the work on its stream sees them."""
    chunk.stream.synchronize()
    out = np.empty(chunk.nbytes // 4, np.float32)
    cm.copy(out, chunk.data)
    return out


def device_of(view: object) -> int:
    from cuda_memkit._core._pointers import owning_device

    ptr = view.__cuda_array_interface__["data"][0]  # type: ignore[attr-defined]
    d = owning_device(ptr)
    return -1 if d is None else d


@pytest.mark.parametrize(("access", "reads", "mechanism"), [
    ("read", 1, "zero_copy"), ("read", 4, "window"), ("readwrite", 1, "zero_copy"),
    ("readwrite", 2, "window")])
def test_auto_picks_the_mechanism_of_the_pattern(data: cm.ManagedBuffer, access: str,
                                                 reads: int, mechanism: str) -> None:
    plan = cm.AccessPlan().chunks(data, CHUNK, access=access, reads=reads)
    assert plan.mechanisms() == [mechanism] * (N * 4 // CHUNK)


@pytest.mark.parametrize("mechanism", ["zero_copy", "window", "read_mostly"])
def test_every_chunk_holds_its_bytes_in_order(data: cm.ManagedBuffer, stream: cm.Stream,
                                              mechanism: str) -> None:
    plan = cm.AccessPlan().chunks(data, CHUNK, reads=4, mechanism=mechanism)
    seen = []
    with plan.run(stream) as run:
        for chunk in run:
            assert chunk.mechanism == mechanism and chunk.stream is stream
            values = read_chunk(chunk)
            first = chunk.offset // 4
            np.testing.assert_array_equal(values, np.arange(first, first + CHUNK // 4))
            seen.append(chunk.offset)
    assert seen == list(range(0, N * 4, CHUNK))


def test_a_window_is_device_memory_and_zero_copy_the_managed_range(
        data: cm.ManagedBuffer, stream: cm.Stream) -> None:
    plan = (cm.AccessPlan().add(data, offset=0, nbytes=CHUNK, reads=3, mechanism="window")
            .add(data, offset=CHUNK, nbytes=CHUNK, mechanism="zero_copy"))
    with plan.run(stream) as run:
        it = iter(run)
        window = next(it)
        assert window.data.__cuda_array_interface__["data"][0] != data.ptr
        assert device_of(window.data) == 0
        direct = next(it)
        assert direct.data.__cuda_array_interface__["data"][0] == data.ptr + CHUNK
        assert direct.data.__cuda_array_interface__["typestr"] == "<f4"


@pytest.mark.parametrize("reads", [1, 3])
def test_writes_to_readwrite_chunks_reach_the_buffer(data: cm.ManagedBuffer,
                                                     stream: cm.Stream, reads: int) -> None:
    plan = cm.AccessPlan(lookahead=2).chunks(data, CHUNK, access="readwrite", reads=reads)
    with plan.run(stream) as run:
        for chunk in run:
            values = read_chunk(chunk)
            cm.copy(chunk.data, values * 2 + 1)
    stream.synchronize()
    np.testing.assert_array_equal(data.array, np.arange(N, dtype=np.float32) * 2 + 1)


@pytest.mark.parametrize("mechanism", ["zero_copy", "window", "read_mostly"])
def test_the_advice_is_undone(data: cm.ManagedBuffer, stream: cm.Stream,
                              mechanism: str) -> None:
    from cuda_memkit._managed_memory import _access_plan

    half = N * 2
    data.advise(cm.MemAdvice.SET_PREFERRED_LOCATION, cm.Location.device(0), nbytes=half)
    data.advise(cm.MemAdvice.SET_ACCESSED_BY, cm.Location.device(0), nbytes=half)
    before = [data.range_info(0, half), data.range_info(half, half)]
    plan = cm.AccessPlan().chunks(data, half, mechanism=mechanism)
    with plan.run(stream) as run:
        for chunk in run:
            during = data.range_info(chunk.offset, chunk.nbytes)
            if mechanism == "read_mostly":
                assert during.read_mostly
            else:
                # the host, or the device's own NUMA node (read as the host by bindings
                # that cannot read the typed attributes)
                assert during.preferred_location in (cm.Location.host(),
                                                     _access_plan.near_host(0))
                assert cm.Location.device(0) in during.accessed_by
    after = [data.range_info(0, half), data.range_info(half, half)]
    for b, a in zip(before, after, strict=True):
        assert (a.read_mostly, a.preferred_location, a.accessed_by) == (
            b.read_mostly, b.preferred_location, b.accessed_by)
    assert before[0].preferred_location == cm.Location.device(0)  # the test's own premise


def test_an_exception_in_the_loop_frees_everything(data: cm.ManagedBuffer,
                                                   stream: cm.Stream) -> None:
    plan = cm.AccessPlan().chunks(data, CHUNK, reads=2, mechanism="window")
    with pytest.raises(KeyError), plan.run(stream) as run:
        for chunk in run:
            if chunk.index == 3:
                raise KeyError("the user's loop failed")
    assert chunk.data.closed  # the window it lent is freed
    info = data.range_info()
    assert info.preferred_location is None and info.accessed_by == ()


def test_break_without_with_frees_the_windows(data: cm.ManagedBuffer,
                                              stream: cm.Stream) -> None:
    plan = cm.AccessPlan().chunks(data, CHUNK, reads=2, mechanism="window")
    for chunk in plan.run(stream):
        if chunk.index == 1:
            break
    assert chunk.data.closed
    assert data.range_info().accessed_by == ()


def test_a_run_is_walked_once(data: cm.ManagedBuffer, stream: cm.Stream) -> None:
    run = cm.AccessPlan().add(data).run(stream)
    with run:
        list(run)
        with pytest.raises(RuntimeError, match="once"):
            iter(run)


def test_chunks_of_a_range_and_a_short_last_chunk(data: cm.ManagedBuffer) -> None:
    plan = cm.AccessPlan().chunks(data, 12, offset=8, nbytes=40)
    assert len(plan) == 4
    with pytest.raises(ValueError, match="item size"):
        cm.AccessPlan().chunks(data, 6)
    with pytest.raises(ValueError, match="item size"):
        cm.AccessPlan().add(data, offset=2, nbytes=8)
    with pytest.raises(ValueError, match="item size"):
        cm.AccessPlan().chunks(data, 16, offset=2)
    assert len(cm.AccessPlan().chunks(data, 16, nbytes=0 + 16)) == 1


@pytest.mark.usefixtures("two_devices")
def test_two_devices_each_walk_their_half(data: cm.ManagedBuffer) -> None:
    half = N * 2
    plans = [cm.AccessPlan().chunks(data, CHUNK, offset=d * half, nbytes=half, reads=2,
                                    mechanism="window") for d in (0, 1)]
    streams = [cm.Stream(d) for d in (0, 1)]
    cm.Device(0).set_current()
    try:
        runs = [p.run(s) for p, s in zip(plans, streams, strict=True)]
        with runs[0], runs[1]:
            for c0, c1 in zip(runs[0], runs[1], strict=True):
                assert device_of(c0.data) == 0 and device_of(c1.data) == 1
                assert cm.Location.device(1) in data.range_info(c1.offset,
                                                                c1.nbytes).accessed_by
                for c in (c0, c1):
                    first = c.offset // 4
                    np.testing.assert_array_equal(read_chunk(c),
                                                  np.arange(first, first + CHUNK // 4))
        assert data.range_info().accessed_by == ()
    finally:
        for s in streams:
            s.close()


def test_fills_and_work_are_ordered_by_events(data: cm.ManagedBuffer, stream: cm.Stream,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Work on chunk i waits for its fill; the refill of chunk i's window waits for that work."""
    from cuda_memkit._core import _driver
    from cuda_memkit._managed_memory import _access_plan

    log: list[tuple[Any, ...]] = []
    real_call, real_copy = _driver.call, _access_plan._window_copy

    def call(api: str, *args: Any) -> Any:
        if api in ("cuEventRecord", "cuStreamWaitEvent"):
            log.append((api, int(args[0]), int(args[1])))
        return real_call(api, *args)

    def copy(ordinal: int, dst: Any, dst_off: int, src: Any, src_off: int, n: int,
             on: cm.Stream) -> None:
        log.append(("fill", dst.ptr, src_off, on.handle))
        real_copy(ordinal, dst, dst_off, src, src_off, n, on)

    monkeypatch.setattr(_driver, "call", call)
    monkeypatch.setattr(_access_plan, "_window_copy", copy)
    user, lookahead = stream.handle, 2
    plan = cm.AccessPlan(lookahead=lookahead).chunks(data, CHUNK, reads=2, mechanism="window")
    windows = {}
    with plan.run(stream) as run:
        for chunk in run:
            windows[chunk.index] = chunk.data.__cuda_array_interface__["data"][0]
            log.append(("work", chunk.index))
    fills = {entry[2] // CHUNK: i for i, entry in enumerate(log) if entry[0] == "fill"}
    works = {entry[1]: i for i, entry in enumerate(log) if entry[0] == "work"}
    side = log[fills[0]][3]
    assert side != user

    def ordered(after: int, before: int, src: int, dst: int) -> bool:
        """An event recorded on src in (after, before) that dst waits for, still in it."""
        for k in range(after + 1, before):
            if log[k][0] == "cuEventRecord" and log[k][2] == src:
                ev = log[k][1]
                for j in range(k + 1, before):
                    if log[j][:3] == ("cuStreamWaitEvent", dst, ev):
                        return not any(log[m][:2] == ("cuEventRecord", ev)
                                       for m in range(k + 1, j))
        return False

    for i, w in works.items():
        assert ordered(fills[i], w, side, user), f"work on chunk {i} does not wait its fill"
        if i + lookahead in fills:
            assert windows[i + lookahead] == windows[i]  # the same window, refilled
            assert ordered(w, fills[i + lookahead], user, side), (
                f"the refill after chunk {i} does not wait for its work")


def test_a_failure_while_setting_up_undoes_what_was_done(data: cm.ManagedBuffer,
                                                          stream: cm.Stream,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    from cuda_memkit._device_memory import _device_buffer

    real = _device_buffer.DeviceBuffer.empty.__func__  # type: ignore[attr-defined]
    made: list[cm.DeviceBuffer] = []

    def second_fails(cls: Any, *args: Any, **kw: Any) -> cm.DeviceBuffer:
        if made:
            raise cm.CudaOutOfMemoryError(2, "cuMemAlloc", "CUDA_ERROR_OUT_OF_MEMORY",
                                          "out of memory")
        made.append(real(cls, *args, **kw))
        return made[-1]

    monkeypatch.setattr(_device_buffer.DeviceBuffer, "empty", classmethod(second_fails))
    plan = cm.AccessPlan().chunks(data, CHUNK, reads=2, mechanism="window")
    with pytest.raises(cm.CudaOutOfMemoryError), plan.run(stream) as run:
        for _chunk in run:
            pass
    assert made and made[0].closed
    info = data.range_info()
    assert info.preferred_location is None and info.accessed_by == ()


def test_the_legacy_default_stream_works_too(data: cm.ManagedBuffer) -> None:
    plan = cm.AccessPlan().chunks(data, CHUNK, reads=2)
    with plan.run(None) as run:
        for chunk in run:
            first = chunk.offset // 4
            np.testing.assert_array_equal(read_chunk(chunk), np.arange(first, first + CHUNK // 4))


def test_a_buffer_closed_before_the_walk_is_named(stream: cm.Stream) -> None:
    buf = cm.ManagedBuffer.zeros(4 * CHUNK, "float32")
    keep = cm.ManagedBuffer.zeros(4 * CHUNK, "float32")
    plan = cm.AccessPlan().chunks(keep, CHUNK, reads=2).chunks(buf, CHUNK, reads=2)
    buf.close()
    with pytest.raises(cm.ClosedError), plan.run(stream) as run:
        list(run)
    info = keep.range_info()  # the advice given to the first buffer was taken back
    assert info.preferred_location is None and info.accessed_by == ()
    keep.close()


@pytest.mark.parametrize("mechanism", ["zero_copy", "window"])
def test_on_a_numa_host_the_pages_go_to_the_devices_node_first(
        data: cm.ManagedBuffer, stream: cm.Stream, monkeypatch: pytest.MonkeyPatch,
        mechanism: str) -> None:
    from cuda_memkit._managed_memory import _access_plan

    node = cm.Location.host_numa(0)
    monkeypatch.setattr(_access_plan, "near_host", lambda ordinal: node)
    placed: list[tuple[int, int]] = []
    real = _access_plan.PrefetchPlan.add

    def add(self: Any, target: Any, to: Any, **kw: Any) -> Any:
        if to == node:
            placed.append((kw["offset"], kw["nbytes"]))
        return real(self, target, to, **kw)

    monkeypatch.setattr(_access_plan.PrefetchPlan, "add", add)
    plan = cm.AccessPlan().chunks(data, CHUNK, reads=2, mechanism=mechanism)
    with plan.run(stream) as run:
        for chunk in run:
            assert placed[chunk.index] == (chunk.offset, chunk.nbytes)  # placed before use
            first = chunk.offset // 4
            np.testing.assert_array_equal(read_chunk(chunk), np.arange(first, first + CHUNK // 4))
    assert len(placed) == N * 4 // CHUNK
    info = data.range_info()
    assert info.preferred_location is None and info.accessed_by == ()


def test_near_host_is_the_host_on_one_node(monkeypatch: pytest.MonkeyPatch) -> None:
    from cuda_memkit._managed_memory import _access_plan

    monkeypatch.setattr(_access_plan, "host_numa_nodes", lambda: frozenset({0}))
    assert _access_plan.near_host(0) == cm.Location.host()
    monkeypatch.setattr(_access_plan, "host_numa_nodes", lambda: frozenset({0, 1}))
    from cuda.bindings.driver import CUdevice_attribute

    node = cm.Device(0).attribute(CUdevice_attribute.CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID)
    want = cm.Location.host_numa(node) if node in (0, 1) else cm.Location.host()
    assert _access_plan.near_host(0) == want


@pytest.mark.parametrize(("access", "reads", "used"), [
    ("read", 1, "migrate"), ("read", 4, "read_mostly"), ("readwrite", 1, "migrate"),
    ("readwrite", 3, "migrate")])
def test_auto_falls_back_where_the_mapping_is_slow(data: cm.ManagedBuffer, stream: cm.Stream,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   access: str, reads: int, used: str) -> None:
    from cuda_memkit._managed_memory import _access_plan

    monkeypatch.setattr(_access_plan, "mapped_reads_fast", lambda ordinal, near: False)
    plan = cm.AccessPlan().chunks(data, CHUNK, access=access, reads=reads)
    chosen = cm.AccessPlan().chunks(data, CHUNK, access=access, reads=reads,
                                    mechanism="window")
    with plan.run(stream) as run:
        for chunk in run:
            assert chunk.mechanism == used
            values = read_chunk(chunk)
            first = chunk.offset // 4
            np.testing.assert_array_equal(values, np.arange(first, first + CHUNK // 4))
    with chosen.run(stream) as run:  # a mechanism the user chose is kept
        assert {chunk.mechanism for chunk in run} == {"window"}
    info = data.range_info()
    assert (info.read_mostly, info.preferred_location, info.accessed_by) == (False, None, ())


def test_the_probe_frees_what_it_made(monkeypatch: pytest.MonkeyPatch) -> None:
    from cuda_memkit._core import _driver
    from cuda_memkit._managed_memory import _access_plan

    monkeypatch.setattr(_access_plan, "_FAST", {})
    if _driver.backend_name() == "sim":
        assert _access_plan.mapped_reads_fast(0, cm.Location.host()) is True  # no timings
        monkeypatch.setattr(_driver, "backend_name", lambda: "cuda")  # run it anyway
    answer = _access_plan.mapped_reads_fast(0, cm.Location.host())
    assert _access_plan._FAST == {0: answer}  # measured once per device
    assert _access_plan.mapped_reads_fast(0, cm.Location.host()) is answer
