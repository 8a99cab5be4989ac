"""AccessPlan: managed data walked in chunks, each on the device when the work runs.

The promises: every chunk's ``data`` holds that chunk's bytes when work ordered on
``chunk.stream`` runs; writes to a ``"readwrite"`` chunk reach the buffer; the
mechanism follows the pattern; the buffer's advice is what it was after the walk; a
walk left early (``break``, an exception) frees everything; a stream of another
device walks on that device.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import cuda_memkit as cm

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
    from cuda_memkit._core._operands import owning_device

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
    plan = (cm.AccessPlan().add(data, offset=0, nbytes=CHUNK, reads=3)
            .add(data, offset=CHUNK, nbytes=CHUNK))
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
                assert during.preferred_location == cm.Location.host()
                assert cm.Location.device(0) in during.accessed_by
    after = [data.range_info(0, half), data.range_info(half, half)]
    for b, a in zip(before, after, strict=True):
        assert (a.read_mostly, a.preferred_location, a.accessed_by) == (
            b.read_mostly, b.preferred_location, b.accessed_by)
    assert before[0].preferred_location == cm.Location.device(0)  # the test's own premise


def test_an_exception_in_the_loop_frees_everything(data: cm.ManagedBuffer,
                                                   stream: cm.Stream) -> None:
    plan = cm.AccessPlan().chunks(data, CHUNK, reads=2)
    with pytest.raises(KeyError), plan.run(stream) as run:
        for chunk in run:
            if chunk.index == 3:
                raise KeyError("the user's loop failed")
    assert chunk.data.closed  # the window it lent is freed
    info = data.range_info()
    assert info.preferred_location is None and info.accessed_by == ()


def test_break_without_with_frees_the_windows(data: cm.ManagedBuffer,
                                              stream: cm.Stream) -> None:
    plan = cm.AccessPlan().chunks(data, CHUNK, reads=2)
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
    plans = [cm.AccessPlan().chunks(data, CHUNK, offset=d * half, nbytes=half, reads=2)
             for d in (0, 1)]
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
