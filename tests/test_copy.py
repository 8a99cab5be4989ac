"""copy / copy_async between every kind of memory."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu

import cuda_memkit as cm
from cuda_memkit._core import _driver, _host_registry, _inflight

from ._helpers import no_driver_calls, record_calls

N = 4096


class Generic:
    """A later buffer type (ManagedBuffer, PoolBuffer...): just ptr and nbytes."""

    def __init__(self, inner: cm.DeviceBuffer) -> None:
        self.inner = inner

    @property
    def ptr(self) -> int:
        return self.inner.ptr

    @property
    def nbytes(self) -> int:
        return self.inner.nbytes


class CAI:
    """A foreign device array (CuPy, torch, numba): __cuda_array_interface__ only."""

    def __init__(self, ptr: int, shape: tuple[int, ...], typestr: str,
                 readonly: bool = False, strides: Any = None) -> None:
        self.__cuda_array_interface__ = {"data": (ptr, readonly), "shape": shape,
                                         "typestr": typestr, "version": 3,
                                         "strides": strides}


@pytest.fixture
def dev() -> Iterator[cm.DeviceBuffer]:
    d = cm.DeviceBuffer.empty(N * 4)
    yield d
    d.close()


@pytest.fixture
def data() -> np.ndarray:
    return np.arange(N, dtype=np.float32)


def no_copy_calls(calls: list[tuple[str, tuple[Any, ...]]]) -> bool:
    return not [c for c in calls if c[0].startswith(("cuMemcpy", "cuMemAlloc",
                                                     "cuMemHostAlloc"))]


# -- every pair of operand kinds ----------------------------------------------------------


def _host_kinds(data: np.ndarray) -> dict[str, Any]:
    return {
        "numpy": lambda: data.copy(),
        "hostbuffer": lambda: cm.HostBuffer.from_array(data),
        "bytearray": lambda: bytearray(data.tobytes()),
    }


@pytest.mark.parametrize("kind", ["numpy", "hostbuffer", "bytearray", "registered", "int"])
@pytest.mark.parametrize("mode", ["sync", "stream"])
def test_host_to_device_and_back(kind: str, mode: str, dev: cm.DeviceBuffer, data: np.ndarray,
                                 stream: cm.Stream) -> None:
    keep: list[Any] = []
    if kind == "registered":
        arr = data.copy()
        src: Any = cm.register_host(arr)
        keep.append(src)
        out_arr = np.zeros_like(data)
        out: Any = cm.register_host(out_arr)
        keep.append(out)
    elif kind == "int":
        a, b = data.copy(), np.zeros_like(data)
        keep += [a, b]
        src, out = a.ctypes.data, b.ctypes.data
    else:
        src = _host_kinds(data)[kind]()
        out = {"numpy": lambda: np.zeros_like(data),
               "hostbuffer": lambda: cm.HostBuffer.zeros(N, np.float32),
               "bytearray": lambda: bytearray(data.nbytes)}[kind]()
    kw: dict[str, Any] = {}
    if kind == "int":
        kw["nbytes"] = data.nbytes
    if mode == "stream":
        kw["stream"] = stream
        kw["allow_pageable"] = True
    assert cm.copy(dev, src, **kw) is dev
    assert cm.copy(out, dev, **kw) is out
    if mode == "stream":
        stream.synchronize()
    if kind == "registered":
        result = out_arr
    elif kind == "int":
        result = keep[1]
    elif kind == "hostbuffer":
        result = out.array
    else:
        result = np.frombuffer(out, np.float32) if kind == "bytearray" else out
    np.testing.assert_array_equal(result, data)
    for obj in (src, out, *keep):
        if isinstance(obj, (cm.HostBuffer, cm.RegisteredHost)):
            obj.close()


def test_device_to_device(dev: cm.DeviceBuffer, data: np.ndarray, stream: cm.Stream) -> None:
    cm.copy(dev, data, nbytes=data.nbytes)
    with cm.DeviceBuffer.empty(dev.nbytes) as d2, cm.DeviceBuffer.empty(dev.nbytes) as d3:
        cm.copy(d2, dev)
        cm.copy_async(d3, d2, stream=stream)
        stream.synchronize()
        np.testing.assert_array_equal(d3.to_numpy(np.float32, N), data)


def test_host_to_host(data: np.ndarray) -> None:
    out = np.zeros_like(data)
    with cm.HostBuffer.from_array(data) as h:
        cm.copy(out, h)
    np.testing.assert_array_equal(out, data)


def test_generic_buffers_views_and_cai(dev: cm.DeviceBuffer, data: np.ndarray) -> None:
    g = Generic(dev)
    cm.copy(g, data)
    view = dev.as_array(np.float32, N)  # DeviceArrayView: ptr, nbytes, dtype
    out = np.zeros_like(data)
    cm.copy(out, view)
    np.testing.assert_array_equal(out, data)
    foreign = CAI(dev.ptr, (N,), "<f4")
    out2 = np.zeros_like(data)
    cm.copy(out2, foreign)
    np.testing.assert_array_equal(out2, data)
    with cm.DeviceBuffer.empty(dev.nbytes) as d2:
        cm.copy(CAI(d2.ptr, (N,), "<f4", strides=(4,)), g)
        np.testing.assert_array_equal(d2.to_numpy(np.float32), data)


def test_cuda_device_pointer_objects(dev: cm.DeviceBuffer, data: np.ndarray) -> None:
    cm.copy(cu.CUdeviceptr(dev.ptr), data, nbytes=data.nbytes)
    out = np.zeros_like(data)
    cm.copy(out, np.uint64(dev.ptr))
    np.testing.assert_array_equal(out, data)


def test_nbytes_copies_a_prefix(dev: cm.DeviceBuffer, data: np.ndarray) -> None:
    dev.fill(0)
    cm.copy(dev, data, nbytes=16)
    got = dev.to_numpy(np.float32, 8)
    assert got.tolist() == [0, 1, 2, 3, 0, 0, 0, 0]


def test_nbytes_allows_different_dtypes(dev: cm.DeviceBuffer) -> None:
    a = np.arange(4, dtype=np.float32)
    b = np.zeros(4, dtype=np.int32)
    cm.copy(b, a, nbytes=16)  # raw bytes
    assert b.tolist() == a.view(np.int32).tolist()


def test_zero_bytes_is_a_no_op(dev: cm.DeviceBuffer, monkeypatch: pytest.MonkeyPatch) -> None:
    with no_driver_calls(monkeypatch):
        cm.copy(dev, np.zeros(0, np.uint8), nbytes=0)
        cm.copy(np.zeros(0), np.zeros(0))
        cm.copy_async(dev, np.zeros(0, np.uint8), stream=None, nbytes=0)


# -- stream-ordered copies ----------------------------------------------------------------


def test_copy_async_needs_the_stream_keyword(dev: cm.DeviceBuffer) -> None:
    with pytest.raises(TypeError):
        cm.copy_async(dev, np.zeros(4))  # type: ignore[call-arg]


def test_pageable_memory_is_refused_for_async_copies(dev: cm.DeviceBuffer, stream: cm.Stream,
                                                      data: np.ndarray,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    out = np.zeros_like(data)
    with record_calls(monkeypatch) as calls:
        with pytest.raises(ValueError, match="pageable"):
            cm.copy(dev, data, stream=stream)
        with pytest.raises(ValueError, match="pageable"):
            cm.copy_async(out, dev, stream=stream)
        with pytest.raises(ValueError, match="allow_pageable"):
            cm.copy_async(dev, bytearray(16), stream=None, nbytes=16)
    assert no_copy_calls(calls)
    cm.copy(dev, data, stream=stream, allow_pageable=True)
    cm.copy_async(out, dev, stream=stream, allow_pageable=True)
    stream.synchronize()
    np.testing.assert_array_equal(out, data)


def test_sync_copies_accept_pageable_memory(dev: cm.DeviceBuffer, data: np.ndarray) -> None:
    cm.copy(dev, data)
    out = np.zeros_like(data)
    cm.copy(out, dev)
    np.testing.assert_array_equal(out, data)


def test_views_of_pinned_memory_are_not_pageable(dev: cm.DeviceBuffer, stream: cm.Stream,
                                                 data: np.ndarray) -> None:
    with cm.HostBuffer.from_array(data) as h:
        view = h.array[N // 2:]
        assert _host_registry.is_pinned_host(view)
        cm.copy_async(dev, view, stream=stream, nbytes=view.nbytes)
        out = h.array.reshape(2, -1)[0]
        cm.copy_async(out, dev, stream=stream, nbytes=out.nbytes)
        stream.synchronize()
        np.testing.assert_array_equal(h.array[: N // 2], data[N // 2:])
        del view, out


def test_pageable_check_of_plain_numpy(data: np.ndarray) -> None:
    assert not _host_registry.is_pinned_host(data)
    assert _host_registry.is_pinned_host(np.zeros(0))


def test_raw_pointers_are_trusted(dev: cm.DeviceBuffer, stream: cm.Stream,
                                  data: np.ndarray) -> None:
    cm.copy(dev, data.ctypes.data, nbytes=data.nbytes, stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(dev.to_numpy(np.float32, N), data)


def test_legacy_and_int_streams(dev: cm.DeviceBuffer, stream: cm.Stream) -> None:
    with cm.HostBuffer.from_array(np.full(N, 2.0, np.float32)) as h:
        cm.copy_async(dev, h, stream=None)
        cm.Device(0).synchronize()  # `stream` is non-blocking: it does not wait for legacy
        cm.copy_async(h, dev, stream=stream.handle)
        stream.synchronize()
        cm.Device(0).synchronize()
        assert (h.array == 2.0).all()


def test_closed_stream(dev: cm.DeviceBuffer) -> None:
    s = cm.Stream()
    s.close()
    with cm.HostBuffer.zeros(dev.nbytes) as h, pytest.raises(cm.ClosedError):
        cm.copy(dev, h, stream=s)


def test_async_copy_keeps_operands_alive(dev: cm.DeviceBuffer, stream: cm.Stream,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    h = cm.HostBuffer.from_array(np.ones(N, np.float32))
    ref = weakref.ref(h)
    with monkeypatch.context() as m:
        m.setattr(_inflight, "_event_done", lambda ev: False)  # the stream is "still busy"
        cm.copy_async(dev, h, stream=stream)
        assert _inflight.pending_count() == 1
        del h
        gc.collect()
        assert ref() is not None  # held until the copy is done
    stream.synchronize()
    _inflight.reap_pending()
    assert _inflight.pending_count() == 0
    gc.collect()
    assert ref() is None


def test_synchronize_lets_go_of_the_operands(dev: cm.DeviceBuffer, stream: cm.Stream) -> None:
    """A buffer dropped after its copy's stream was synchronized is freed at once."""
    h = cm.HostBuffer.from_array(np.ones(N, np.float32))
    ref = weakref.ref(h)
    cm.copy_async(dev, h, stream=stream)
    del h
    stream.synchronize()
    assert _inflight.pending_count() == 0
    assert ref() is None  # no reap, no collection needed


def test_wait_pending_waits_for_running_copies(dev: cm.DeviceBuffer, stream: cm.Stream,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The leak check's last resort: wait on the held copies' events, then let go."""
    h = cm.HostBuffer.from_array(np.ones(N, np.float32))
    ref = weakref.ref(h)
    waited: list[object] = []
    real_function = _driver.function
    busy = [True]

    def function(name: str) -> Any:
        if name == "cuEventSynchronize":
            def sync(ev: Any) -> Any:
                waited.append(ev)
                busy[0] = False
                return real_function(name)(ev)
            return sync
        return real_function(name)

    with monkeypatch.context() as m:
        m.setattr(_inflight, "_event_done", lambda ev: not busy[0])
        m.setattr(_driver, "function", function)
        cm.copy_async(dev, h, stream=stream)
        del h
        gc.collect()
        assert ref() is not None and _inflight.pending_count() == 1
        _inflight.wait_pending()
    assert len(waited) == 1 and _inflight.pending_count() == 0
    assert ref() is None


def test_finished_copies_hold_nothing(dev: cm.DeviceBuffer, stream: cm.Stream) -> None:
    h = cm.HostBuffer.from_array(np.ones(N, np.float32))
    cm.copy_async(dev, h, stream=stream)
    stream.synchronize()
    _inflight.reap_pending()
    assert _inflight.pending_count() == 0
    h.close()


def test_keep_alive_falls_back_to_synchronizing(dev: cm.DeviceBuffer, stream: cm.Stream,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    real = _driver.call

    def no_events(api: str, *args: Any) -> Any:
        if api == "cuEventRecord":
            _driver.check(api, (cu.CUresult.CUDA_ERROR_INVALID_HANDLE,))
        return real(api, *args)

    calls: list[str] = []

    def spy(api: str, *args: Any) -> Any:
        calls.append(api)
        return no_events(api, *args)

    with cm.HostBuffer.zeros(dev.nbytes) as h:
        with monkeypatch.context() as m:
            m.setattr(_driver, "call", spy)
            cm.copy_async(dev, h, stream=stream)
        assert calls[-1] == "cuStreamSynchronize"
        assert _inflight.pending_count() == 0


# -- bad input: refused before the driver ------------------------------------------------


@pytest.mark.parametrize(("dst_n", "src_n"), [(16, 32), (32, 16)])
def test_size_mismatch(dst_n: int, src_n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    with cm.DeviceBuffer.empty(dst_n) as d, no_driver_calls(monkeypatch), \
            pytest.raises(ValueError, match="size mismatch"):
        cm.copy(d, np.zeros(src_n, np.uint8))


def test_dtype_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    with cm.HostBuffer.zeros(4, np.float32) as h, no_driver_calls(monkeypatch):
        with pytest.raises(ValueError, match="dtype mismatch"):
            cm.copy(h, np.zeros(4, np.int32))
        with pytest.raises(ValueError, match="dtype mismatch"):
            cm.copy(np.zeros(2, np.float64), h)


@pytest.mark.parametrize("nbytes", [17, 1 << 40])
def test_nbytes_too_large(nbytes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    with cm.DeviceBuffer.empty(16) as d, no_driver_calls(monkeypatch), \
            pytest.raises(ValueError, match="larger"):
        cm.copy(d, np.zeros(32, np.uint8), nbytes=nbytes)
    with cm.DeviceBuffer.empty(32) as d, \
            no_driver_calls(monkeypatch), pytest.raises(ValueError, match="larger than the"):
        cm.copy(d, np.zeros(16, np.uint8), nbytes=min(nbytes, 24))


@pytest.mark.parametrize("nbytes", [-1, 1.5, "8", True])
def test_bad_nbytes(nbytes: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with cm.DeviceBuffer.empty(16) as d, no_driver_calls(monkeypatch), \
            pytest.raises((TypeError, ValueError)):
        cm.copy(d, np.zeros(16, np.uint8), nbytes=nbytes)


def test_two_raw_pointers_need_nbytes(monkeypatch: pytest.MonkeyPatch) -> None:
    with no_driver_calls(monkeypatch), pytest.raises(ValueError, match="nbytes"):
        cm.copy(0x1000, 0x2000)


@pytest.mark.parametrize("bad", [None, True, 1.5, "abc", object(), -4096, [1, 2]])
def test_not_memory(bad: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with cm.DeviceBuffer.empty(16) as d, no_driver_calls(monkeypatch):
        with pytest.raises((TypeError, ValueError)):
            cm.copy(d, bad, nbytes=16)
        with pytest.raises((TypeError, ValueError)):
            cm.copy(bad, d, nbytes=16)


def test_object_dtypes(monkeypatch: pytest.MonkeyPatch) -> None:
    objs = np.array([None] * 2, dtype=object)
    with cm.DeviceBuffer.empty(16) as d, no_driver_calls(monkeypatch):
        with pytest.raises(TypeError, match="objects"):
            cm.copy(d, objs)
        with pytest.raises(TypeError, match="objects"):
            cm.copy(objs, d)


def test_non_contiguous(monkeypatch: pytest.MonkeyPatch) -> None:
    a = np.zeros((8, 8), np.float32)
    with cm.DeviceBuffer.empty(128) as d, no_driver_calls(monkeypatch):
        with pytest.raises(ValueError, match="contiguous"):
            cm.copy(d, a[:, ::2])
        with pytest.raises(ValueError, match="contiguous"):
            cm.copy(a.T[:4], d)
        with pytest.raises(ValueError, match="contiguous"):
            cm.copy(CAI(d.ptr, (4, 8), "<f4", strides=(4, 16)), a[:4])


def test_read_only_destinations(monkeypatch: pytest.MonkeyPatch) -> None:
    ro = np.zeros(16, np.uint8)
    ro.flags.writeable = False
    with cm.DeviceBuffer.empty(16) as d, no_driver_calls(monkeypatch):
        with pytest.raises(ValueError, match="read-only"):
            cm.copy(ro, d)
        with pytest.raises(ValueError, match="read-only"):
            cm.copy(bytes(16), d)
        with pytest.raises(ValueError, match="read-only"):
            cm.copy(CAI(d.ptr, (16,), "|u1", readonly=True), ro)


def test_copy_into_a_closed_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    d = cm.DeviceBuffer.empty(16)
    h = cm.HostBuffer.zeros(16)
    d.close()
    with no_driver_calls(monkeypatch):
        with pytest.raises(cm.ClosedError):
            cm.copy(d, h)
        with pytest.raises(cm.ClosedError):
            cm.copy(h, d)
        with pytest.raises(cm.ClosedError):
            cm.copy(Generic(d), h)
    h.close()
    with cm.DeviceBuffer.empty(16) as d2, no_driver_calls(monkeypatch):
        with pytest.raises(cm.ClosedError):
            cm.copy(h, d2)
        with pytest.raises(cm.ClosedError):
            cm.copy_async(d2, h, stream=None)


@pytest.mark.framework_kernels  # CuPy loads its kernel modules into device memory
def test_cupy_interop(backend: str) -> None:
    if backend != "cuda":
        pytest.skip("CuPy needs a real GPU")
    cp = pytest.importorskip("cupy")
    x = cp.arange(N, dtype=cp.float32)
    out = np.zeros(N, np.float32)
    cm.copy(out, x)
    np.testing.assert_array_equal(out, np.arange(N, dtype=np.float32))
    with cm.HostBuffer.from_array(np.ones(N, np.float32)) as h:
        cm.copy(x, h)
        assert float(x.sum()) == N
    del x


def test_sync_copies_are_complete_on_return(dev: cm.DeviceBuffer, data: np.ndarray,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    with cm.HostBuffer.from_array(data) as h, record_calls(monkeypatch) as calls:
        cm.copy(dev, h)  # into device memory: cuMemcpy may return early, so wait
        assert [c[0] for c in calls][-2:] == ["cuMemcpy", "cuStreamSynchronize"]
        del calls[:]
        cm.copy(h, dev)  # into host memory: cuMemcpy returns when done
        assert "cuStreamSynchronize" not in [c[0] for c in calls]


@pytest.mark.uses_managed_memory
def test_a_sync_copy_into_a_view_of_managed_memory_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A numpy view of a managed buffer is memory the device addresses: cuMemcpy into it
    may return before the bytes land (the H100 under compute-sanitizer), so copy() waits."""
    with cm.ManagedBuffer.zeros(64) as m:
        view = np.asarray(m)
        with record_calls(monkeypatch) as calls:
            cm.copy(view, np.full(64, 9, np.uint8))
        assert [c[0] for c in calls][-2:] == ["cuMemcpy", "cuStreamSynchronize"]
        assert (view == 9).all()
        del view
