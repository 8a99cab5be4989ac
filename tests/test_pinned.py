"""HostAllocFlags and HostBuffer (pinned host memory)."""

from __future__ import annotations

import gc
import itertools
import weakref
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu

import cuda_memkit as cm
from cuda_memkit._core import _driver, _host_registry, _pointers, _resource

from ._helpers import no_driver_calls, record_calls

F = cm.HostAllocFlags


# -- flags ---------------------------------------------------------------------------


def test_flag_values_match_the_driver() -> None:
    assert F.DEFAULT == 0
    assert F.PORTABLE == cu.CU_MEMHOSTALLOC_PORTABLE
    assert F.DEVICEMAP == cu.CU_MEMHOSTALLOC_DEVICEMAP
    assert F.WRITECOMBINED == cu.CU_MEMHOSTALLOC_WRITECOMBINED


def test_flag_aliases_are_the_same_members() -> None:
    assert F.MAPPED is F.DEVICEMAP
    assert F.WRITE_COMBINED is F.WRITECOMBINED


def test_or_is_union() -> None:
    f = F.PORTABLE | F.WRITECOMBINED
    assert int(f) == 0x5
    assert isinstance(f, F)
    assert F.PORTABLE in f and F.WRITECOMBINED in f and F.DEVICEMAP not in f
    assert F.DEFAULT | F.MAPPED == F.DEVICEMAP


def test_and_is_intersection() -> None:
    f = F.PORTABLE | F.DEVICEMAP
    assert f & F.DEVICEMAP == F.DEVICEMAP
    assert f & F.WRITECOMBINED == F.DEFAULT
    assert not (f & F.WRITECOMBINED)
    assert (F.PORTABLE | F.WRITECOMBINED) & (F.WRITECOMBINED | F.DEVICEMAP) == F.WRITECOMBINED


def test_in_means_all_bits_set() -> None:
    f = F.PORTABLE | F.DEVICEMAP
    assert F.PORTABLE in f
    assert F.DEVICEMAP in f
    assert (F.PORTABLE | F.DEVICEMAP) in f
    assert F.WRITECOMBINED not in f
    assert (F.PORTABLE | F.WRITECOMBINED) not in f
    assert f not in F.PORTABLE
    assert F.DEFAULT in f  # the empty set is in every set


def test_in_place_operators() -> None:
    f = F.PORTABLE
    f |= F.MAPPED
    assert f == F.PORTABLE | F.DEVICEMAP
    f &= F.MAPPED
    assert f == F.DEVICEMAP
    f ^= F.WRITECOMBINED
    assert f == F.DEVICEMAP | F.WRITECOMBINED
    f ^= F.DEVICEMAP
    assert f == F.WRITECOMBINED


def test_xor_and_invert() -> None:
    assert (F.PORTABLE | F.DEVICEMAP) ^ F.PORTABLE == F.DEVICEMAP
    inv = ~F.PORTABLE
    assert F.PORTABLE not in inv
    assert F.DEVICEMAP in inv and F.WRITECOMBINED in inv
    assert int(inv) == 0x6


@pytest.mark.parametrize(("a", "b"), list(itertools.product(range(8), repeat=2)))
def test_operators_are_set_operations(a: int, b: int) -> None:
    def members(x: int) -> set[int]:
        return {bit for bit in (1, 2, 4) if x & bit}

    fa, fb = F(a), F(b)
    assert members(int(fa | fb)) == members(a) | members(b)
    assert members(int(fa & fb)) == members(a) & members(b)
    assert members(int(fa ^ fb)) == members(a) ^ members(b)
    assert (fb in fa) == (members(b) <= members(a))
    assert bool(fa) == bool(members(a))


def test_register_flag_values_match_the_driver() -> None:
    R = cm.HostRegisterFlags
    assert R.PORTABLE == cu.CU_MEMHOSTREGISTER_PORTABLE
    assert R.DEVICEMAP == cu.CU_MEMHOSTREGISTER_DEVICEMAP
    assert R.IOMEMORY == cu.CU_MEMHOSTREGISTER_IOMEMORY
    assert R.READ_ONLY == cu.CU_MEMHOSTREGISTER_READ_ONLY
    assert R.MAPPED is R.DEVICEMAP
    assert R.PORTABLE in (R.PORTABLE | R.READ_ONLY)
    assert R.READ_ONLY not in R.PORTABLE


# -- allocation ------------------------------------------------------------------------


def test_empty_shape_dtype_and_pointer() -> None:
    with cm.HostBuffer.empty((4, 8), np.float32) as h:
        assert h.shape == (4, 8)
        assert h.dtype == np.float32
        assert h.nbytes == 128
        assert h.size == 32
        assert len(h) == 4
        assert h.flags == F.DEFAULT
        # Not page-aligned: the H100's driver carves small pinned allocations out of
        # larger chunks (0x...400 for these 128 bytes, device run of 2026-11-24).
        assert h.ptr != 0 and h.ptr % 256 == 0
        assert "HostBuffer" in repr(h)


def test_int_shape_and_default_dtype() -> None:
    with cm.HostBuffer.empty(10) as h:
        assert h.shape == (10,)
        assert h.dtype == np.uint8
        assert h.nbytes == 10


def test_numpy_integer_shape() -> None:
    with cm.HostBuffer.empty((np.int64(3), np.uint8(2)), np.int16) as h:
        assert h.shape == (3, 2)
        assert h.nbytes == 12


def test_memory_is_pinned() -> None:
    with cm.HostBuffer.empty(4096) as h:
        assert _pointers.memory_type(h.ptr) == _pointers.MEMORYTYPE_HOST
        assert _host_registry.is_pinned_host(h.array)


def test_zeros() -> None:
    with cm.HostBuffer.zeros((3, 5), np.float64) as h:
        assert (h.array == 0).all()
        assert h.array.shape == (3, 5)


def test_from_array_round_trip() -> None:
    src = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    with cm.HostBuffer.from_array(src) as h:
        assert h.shape == src.shape
        assert h.dtype == src.dtype
        np.testing.assert_array_equal(h.array, src)
        assert not np.shares_memory(h.array, src)


def test_from_array_non_contiguous_and_list() -> None:
    src = np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2]
    with cm.HostBuffer.from_array(src) as h:
        np.testing.assert_array_equal(h.array, src)
    with cm.HostBuffer.from_array([1.5, 2.5]) as h:
        assert h.dtype == np.float64
        np.testing.assert_array_equal(h.array, [1.5, 2.5])


def test_zero_d_buffer() -> None:
    with cm.HostBuffer.from_array(np.float64(2.5)) as h:
        assert h.shape == ()
        assert h.nbytes == 8
        assert h.array[()] == 2.5
        with pytest.raises(TypeError):
            len(h)


@pytest.mark.parametrize("flags", [F.PORTABLE, F.DEVICEMAP, F.WRITECOMBINED,
                                   F.PORTABLE | F.DEVICEMAP | F.WRITECOMBINED, 3])
def test_every_flag_combination_allocates(flags: Any) -> None:
    with cm.HostBuffer.empty(1000, np.uint8, flags=flags) as h:
        assert h.flags == F(int(flags))
        assert isinstance(h.flags, F)
        h.array[:] = 7  # write-combined memory is written fine (reads are slow)
        assert int(h.array[999]) == 7


def test_structured_dtype() -> None:
    dt = np.dtype([("a", np.int32), ("b", np.float64)])
    with cm.HostBuffer.zeros(3, dt) as h:
        h.array["a"] = [1, 2, 3]
        assert h.nbytes == 3 * dt.itemsize
        assert list(h.to_numpy()["a"]) == [1, 2, 3]


# -- zero-length buffers ---------------------------------------------------------------


@pytest.mark.parametrize("shape", [0, (0,), (3, 0), (0, 5)])
def test_zero_length_allocates_nothing(shape: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with no_driver_calls(monkeypatch):
        h = cm.HostBuffer.empty(shape, np.float32)
        assert h.ptr == 0
        assert h.nbytes == 0
        assert h.array.shape == ((shape,) if isinstance(shape, int) else shape)
        assert h.to_numpy().size == 0
        h.copy_from(np.empty(shape, np.float32))
        z = cm.HostBuffer.zeros(shape, np.float32)
        f = cm.HostBuffer.from_array(np.empty(shape, np.float32))
        for b in (h, z, f):
            b.close()
        assert h.closed


def test_zero_length_mapped_device_ptr(monkeypatch: pytest.MonkeyPatch) -> None:
    with no_driver_calls(monkeypatch), cm.HostBuffer.empty(0, flags=F.DEVICEMAP) as h:
        assert h.device_ptr == 0


# -- bad input: rejected before the driver, nothing allocated -----------------------------


@pytest.mark.parametrize("shape", [-1, (4, -2), (-1,)])
def test_negative_sizes(shape: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with no_driver_calls(monkeypatch), pytest.raises(ValueError, match="negative"):
        cm.HostBuffer.empty(shape)


@pytest.mark.parametrize("shape", [1.5, (2.0, 3), "10", None, True, (True, 2), [1, None]])
def test_non_integer_sizes(shape: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with no_driver_calls(monkeypatch), pytest.raises(TypeError):
        cm.HostBuffer.empty(shape)


@pytest.mark.parametrize(("shape", "dtype"), [
    (1 << 63, np.uint8),
    (1 << 61, np.float64),
    ((1 << 32, 1 << 32), np.uint8),
    ((1 << 40, 1 << 40, 1 << 40), np.uint8),
])
def test_size_overflow(shape: Any, dtype: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with no_driver_calls(monkeypatch), pytest.raises(ValueError, match="bytes"):
        cm.HostBuffer.empty(shape, dtype)


def test_huge_but_representable_size_is_out_of_memory() -> None:
    with pytest.raises(cm.CudaOutOfMemoryError) as info:
        cm.HostBuffer.empty(1 << 50)
    assert info.value.api == "cuMemHostAlloc"


@pytest.mark.parametrize("dtype", [object, np.dtype([("a", object)]), "S0", "V0", str,
                                   "not-a-dtype"])
def test_bad_dtypes(dtype: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with no_driver_calls(monkeypatch), pytest.raises(TypeError):
        cm.HostBuffer.empty(4, dtype)


def test_object_array_from_array(monkeypatch: pytest.MonkeyPatch) -> None:
    with no_driver_calls(monkeypatch), pytest.raises(TypeError, match="objects"):
        cm.HostBuffer.from_array(np.array([object(), None]))


@pytest.mark.parametrize("flags", [8, 0x100, 0xFF, -1, F.PORTABLE | 0x10])
def test_unknown_flag_bits(flags: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with no_driver_calls(monkeypatch), pytest.raises(ValueError, match="unknown"):
        cm.HostBuffer.empty(16, flags=flags)


@pytest.mark.parametrize("flags", [1.0, "PORTABLE", None, True, cm.HostRegisterFlags.PORTABLE])
def test_flags_of_the_wrong_type(flags: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with no_driver_calls(monkeypatch), pytest.raises(TypeError):
        cm.HostBuffer.empty(16, flags=flags)


def test_pool_must_be_a_pinned_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    # NotImplementedError until pinned pools are wired in, TypeError after
    with no_driver_calls(monkeypatch), pytest.raises((NotImplementedError, TypeError)):
        cm.HostBuffer.empty(16, pool=object())


def test_direct_construction_is_refused() -> None:
    with pytest.raises(TypeError, match="empty"):
        cm.HostBuffer()


# -- views -----------------------------------------------------------------------------


def test_array_is_a_zero_copy_view() -> None:
    with cm.HostBuffer.zeros(16, np.int32) as h:
        a = h.array
        a[3] = 42
        assert h.array[3] == 42
        assert np.shares_memory(a, h.array)
        assert a.__array_interface__["data"][0] == h.ptr
        assert a.flags.writeable and a.flags.c_contiguous
        del a


def test_numpy_protocol() -> None:
    with cm.HostBuffer.from_array(np.arange(4, dtype=np.int64)) as h:
        v = np.asarray(h)
        assert np.shares_memory(v, h.array)
        c = np.array(h, copy=True)
        assert not np.shares_memory(c, h.array)
        f = np.asarray(h, dtype=np.float64)
        assert f.dtype == np.float64 and list(f) == [0, 1, 2, 3]
        assert float(np.sum(h)) == 6
        del v


def test_view_keeps_the_buffer_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    h = cm.HostBuffer.zeros(64, np.uint8)
    ptr = h.ptr
    ref = weakref.ref(h)
    view = h.array[8:16]
    del h
    gc.collect()
    assert ref() is not None  # the view holds it
    view[:] = 9
    assert int(view.sum()) == 72
    with record_calls(monkeypatch) as calls:
        del view
        gc.collect()
    assert ref() is None
    assert ("cuMemFreeHost", (ptr,)) in calls


def test_close_defers_the_free_while_views_live(monkeypatch: pytest.MonkeyPatch) -> None:
    h = cm.HostBuffer.zeros(32, np.uint8)
    ptr = h.ptr
    view = h.array
    with record_calls(monkeypatch) as calls:
        h.close()
        assert h.closed
        assert not [c for c in calls if c[0] == "cuMemFreeHost"]
        view[0] = 1  # still valid memory
        del view, h
        gc.collect()
    assert ("cuMemFreeHost", (ptr,)) in calls


def test_to_numpy_is_a_copy() -> None:
    with cm.HostBuffer.from_array(np.arange(5, dtype=np.uint16)) as h:
        out = h.to_numpy()
        out[0] = 99
        assert h.array[0] == 0
        assert type(out) is np.ndarray and out.base is None


# -- device pointer ----------------------------------------------------------------------


def test_device_ptr_of_a_mapped_buffer() -> None:
    with cm.HostBuffer.empty(4096, flags=F.DEVICEMAP) as h:
        dptr = h.device_ptr
        assert isinstance(dptr, int) and dptr != 0
        assert dptr == h.ptr  # unified addressing: the host pointer works on the device
        assert h.device_ptr == dptr


def test_device_ptr_data_path() -> None:
    with cm.HostBuffer.zeros(256, np.uint8, flags=F.MAPPED) as h, \
            cm.DeviceBuffer.empty(256) as d:
        d.fill(0x5A)
        cm.copy(h.device_ptr, d, nbytes=256)
        assert (h.array == 0x5A).all()


def test_device_ptr_of_a_non_mapped_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    with cm.HostBuffer.empty(64, flags=F.PORTABLE) as h, no_driver_calls(monkeypatch), \
            pytest.raises(ValueError, match="DEVICEMAP"):
        _ = h.device_ptr


# -- copies in and out -------------------------------------------------------------------


def test_copy_from_and_to_numpy() -> None:
    src = np.arange(12, dtype=np.float32).reshape(3, 4)
    with cm.HostBuffer.empty((3, 4), np.float32) as h:
        h.copy_from(src)
        np.testing.assert_array_equal(h.array, src)
        dst = np.zeros((3, 4), np.float32)
        h.copy_to(dst)
        np.testing.assert_array_equal(dst, src)
        strided = np.zeros((3, 8), np.float32)[:, ::2]
        h.copy_to(strided)
        np.testing.assert_array_equal(strided, src)


def test_copy_between_host_buffers() -> None:
    with cm.HostBuffer.from_array(np.arange(6.0)) as a, cm.HostBuffer.zeros(6, np.float64) as b:
        b.copy_from(a)
        np.testing.assert_array_equal(b.array, a.array)
        b.array[:] = 1
        b.copy_to(a)
        assert (a.array == 1).all()


def test_copy_from_and_to_device() -> None:
    src = np.arange(100, dtype=np.int64)
    with cm.HostBuffer.from_array(src) as h, cm.DeviceBuffer.empty(h.nbytes) as d, \
            cm.HostBuffer.zeros(100, np.int64) as back:
        h.copy_to(d)
        back.copy_from(d)
        np.testing.assert_array_equal(back.array, src)


@pytest.mark.parametrize("other", [
    np.zeros(5, np.float32),  # shape
    np.zeros((2, 3), np.float32),  # shape, same element count
    np.zeros(6, np.float64),  # dtype
    np.zeros(6, np.int32),  # dtype, same itemsize
    [0, 1, 2, 3, 4, 5],  # a list is int64
])
def test_copy_mismatch(other: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with cm.HostBuffer.zeros(6, np.float32) as h, no_driver_calls(monkeypatch):
        with pytest.raises(ValueError, match="mismatch"):
            h.copy_from(other)
        if isinstance(other, np.ndarray):
            with pytest.raises(ValueError, match="mismatch"):
                h.copy_to(other)


def test_copy_size_mismatch_with_device(monkeypatch: pytest.MonkeyPatch) -> None:
    with cm.HostBuffer.zeros(6, np.float32) as h, cm.DeviceBuffer.empty(20) as d, \
            no_driver_calls(monkeypatch):
        with pytest.raises(ValueError, match="size mismatch"):
            h.copy_from(d)
        with pytest.raises(ValueError, match="size mismatch"):
            h.copy_to(d)


def test_copy_to_read_only(monkeypatch: pytest.MonkeyPatch) -> None:
    dst = np.zeros(4, np.uint8)
    dst.flags.writeable = False
    with cm.HostBuffer.zeros(4) as h, no_driver_calls(monkeypatch), \
            pytest.raises(ValueError, match="read-only"):
        h.copy_to(dst)


def test_copy_object_array(monkeypatch: pytest.MonkeyPatch) -> None:
    with cm.HostBuffer.zeros(2) as h, no_driver_calls(monkeypatch), \
            pytest.raises(TypeError, match="object"):
        h.copy_from(np.array([None, None]))


# -- lifetime ----------------------------------------------------------------------------


def test_close_is_idempotent_and_use_after_close_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    h = cm.HostBuffer.zeros(16, np.uint8, flags=F.DEVICEMAP)
    ptr = h.ptr
    with record_calls(monkeypatch) as calls:
        h.close()
        h.close()
    assert calls.count(("cuMemFreeHost", (ptr,))) == 1
    assert h.closed
    assert "closed" in repr(h)
    assert h.nbytes == 16 and h.shape == (16,)  # metadata stays readable
    with no_driver_calls(monkeypatch):
        for action in (lambda: h.ptr, lambda: h.array, lambda: h.device_ptr,
                       lambda: h.to_numpy(), lambda: h.copy_from(np.zeros(16, np.uint8)),
                       lambda: h.copy_to(np.zeros(16, np.uint8)), lambda: np.asarray(h)):
            with pytest.raises(cm.ClosedError, match="HostBuffer is closed"):
                action()
        with pytest.raises(cm.ClosedError), h:
            pass


def test_with_block_frees(monkeypatch: pytest.MonkeyPatch) -> None:
    with record_calls(monkeypatch) as calls:
        with cm.HostBuffer.empty(100) as h:
            ptr = h.ptr
        assert h.closed
    assert ("cuMemFreeHost", (ptr,)) in calls


def test_garbage_collection_frees(monkeypatch: pytest.MonkeyPatch) -> None:
    h = cm.HostBuffer.empty(100)
    ptr = h.ptr
    with record_calls(monkeypatch) as calls:
        del h
        gc.collect()
    assert ("cuMemFreeHost", (ptr,)) in calls


def test_each_allocation_is_freed_exactly_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """close() frees and leaves nothing for __del__; a dropped buffer is freed by __del__."""
    with record_calls(monkeypatch) as calls:
        a = cm.HostBuffer.empty(100)
        b = cm.HostBuffer.empty((4, 4), np.float32)
        ptrs = [a.ptr, b.ptr]
        a.close()
        a.close()
        assert type(a) is cm.HostBuffer  # closed: the plain class, no __del__ left
        del a, b
        gc.collect()
    assert sorted(c[1][0] for c in calls if c[0] == "cuMemFreeHost") == sorted(ptrs)


def test_alloc_and_free_on_threads_without_a_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """One driver call per alloc/free; an allocating thread with no context gets device 0's."""
    import threading

    out: dict[str, Any] = {}

    def make() -> None:
        try:
            with record_calls(monkeypatch) as calls:
                out["buf"] = cm.HostBuffer.empty(4096)
            out["calls"] = [c[0] for c in calls]
        except BaseException as exc:  # reported by the main thread
            out["error"] = exc

    def drop() -> None:
        try:
            with record_calls(monkeypatch) as calls:
                out.pop("buf").close()
            out["calls"] = [c[0] for c in calls]
        except BaseException as exc:
            out["error"] = exc

    for target in (make, drop):
        t = threading.Thread(target=target)
        t.start()
        t.join()
        assert "error" not in out, out.get("error")
        if target is make:  # tried, refused (INVALID_CONTEXT), device 0's context made current
            assert out["calls"][0] == "cuMemHostAlloc"
            assert out["calls"].count("cuMemHostAlloc") == 2
        else:  # the driver frees pinned memory without a context (H100)
            assert out["calls"] == ["cuMemFreeHost"]
    cm.Device(0).set_current()
    with record_calls(monkeypatch) as calls:
        cm.HostBuffer.empty(4096).close()  # a context is current: one call each
    assert [c[0] for c in calls] == ["cuMemHostAlloc", "cuMemFreeHost"]


class _MyHostBuffer(cm.HostBuffer):
    __slots__ = ()


def test_subclasses_keep_their_class_and_are_freed(monkeypatch: pytest.MonkeyPatch) -> None:
    with record_calls(monkeypatch) as calls:
        h = _MyHostBuffer.empty(64)
        assert type(h) is _MyHostBuffer
        ptr = h.ptr
        del h
        gc.collect()
        assert [c[1][0] for c in calls if c[0] == "cuMemFreeHost"] == [ptr]
        g = _MyHostBuffer.zeros(8)
        gptr = g.ptr
        g.close()
        assert type(g) is _MyHostBuffer and g.closed
    assert [c[1][0] for c in calls if c[0] == "cuMemFreeHost"] == [ptr, gptr]


def test_failed_free_becomes_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    h = cm.HostBuffer.empty(64)
    ptr = h.ptr
    real = _driver.call

    def failing(api: str, *args: Any) -> Any:
        if api == "cuMemFreeHost":
            _driver.check(api, (cu.CUresult.CUDA_ERROR_INVALID_VALUE,))
        return real(api, *args)

    with monkeypatch.context() as m:
        m.setattr(_driver, "call", failing)
        with pytest.warns(cm.MemkitWarning, match="cuMemFreeHost"):
            h.close()
    assert ptr not in _resource.account("pinned").live  # the buffer gave it up (and warned)
    real("cuMemFreeHost", ptr)  # the real free, for the leak check


@pytest.mark.sim_only
def test_simulator_charges_host_memory() -> None:
    from cuda_memkit.sim import machine

    before = machine().host_used
    with cm.HostBuffer.empty(1 << 20):
        assert machine().host_used == before + (1 << 20)
    assert machine().host_used == before
