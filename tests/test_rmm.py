"""Memory exchanged with RMM and with any ``__cuda_array_interface__`` library, without copies.

``copy``, ``copy_batch`` and ``PrefetchPlan`` take another library's device memory as it is:
an object with ``.ptr``/``.nbytes`` (``rmm.DeviceBuffer``) or with
``__cuda_array_interface__`` (CuPy, numba, torch, RMM). The first tests use a plain
``__cuda_array_interface__`` object over cuda_memkit memory and run everywhere; the RMM tests
need a GPU with RMM (``rmm-cu13``) installed and are skipped without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit._core import _driver

MIB = 1 << 20


class ForeignArray:
    """Another library's 1-D uint8 array: nothing but ``__cuda_array_interface__``."""

    def __init__(self, owner: Any, nbytes: int | None = None) -> None:
        self.owner = owner
        n = owner.nbytes if nbytes is None else nbytes
        self.__cuda_array_interface__ = {"data": (owner.ptr, False), "shape": (n,),
                                          "typestr": "|u1", "version": 3, "strides": None,
                                          "stream": None}


# -- any __cuda_array_interface__ object -----------------------------------------------------

@pytest.mark.uses_managed_memory
def test_a_prefetch_plan_takes_an_array_interface_object() -> None:
    with cm.ManagedBuffer.zeros(4 * MIB) as buf, cm.Stream() as s:
        foreign = ForeignArray(buf)
        plan = cm.PrefetchPlan().add(foreign, cm.Location.device(0), nbytes=MIB)
        plan.add_ranges(foreign, cm.Location.device(0), [2 * MIB], [MIB])
        assert [(e.ptr, e.nbytes) for e in plan.entries] == [
            (buf.ptr, MIB), (buf.ptr + 2 * MIB, MIB)]
        plan.execute(s)
        s.synchronize()
        info = buf.range_info(0, MIB)
        assert info.last_prefetch_location == cm.Location.device(0)


@pytest.mark.uses_managed_memory
def test_a_prefetch_plan_checks_an_array_interface_range() -> None:
    with cm.ManagedBuffer.zeros(MIB) as buf:
        with pytest.raises(ValueError):
            cm.PrefetchPlan().add(ForeignArray(buf), 0, offset=MIB // 2, nbytes=MIB)


def test_copy_and_copy_batch_take_array_interface_objects() -> None:
    data = np.arange(MIB, dtype=np.uint8)
    with cm.DeviceBuffer.empty(MIB) as a, cm.DeviceBuffer.empty(MIB) as b:
        cm.copy(ForeignArray(a), data)
        cm.copy_batch(ForeignArray(b), ForeignArray(a), dst_offsets=[0, 4096],
                      src_offsets=[4096, 0], sizes=[4096, 4096])
        out = b.to_numpy()
        assert np.array_equal(out[:4096], data[4096:8192])
        assert np.array_equal(out[4096:8192], data[:4096])


# -- RMM, on a GPU -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def rmm() -> Any:
    if _driver.backend_name() == "sim":
        pytest.skip("RMM needs a GPU")
    return pytest.importorskip("rmm")


@pytest.fixture
def rmm_stream(rmm: Any) -> Iterator[Any]:
    from rmm.pylibrmm.stream import DEFAULT_STREAM

    yield DEFAULT_STREAM
    DEFAULT_STREAM.synchronize()


@pytest.fixture
def rmm_pair(rmm: Any, rmm_stream: Any) -> tuple[Any, Any, Any]:
    """Host data, an ``rmm.DeviceBuffer`` holding it and an empty one of its size."""
    data = np.arange(MIB, dtype=np.uint8)
    src = rmm.DeviceBuffer.to_device(data.tobytes(), stream=rmm_stream)
    dst = rmm.DeviceBuffer(size=MIB, stream=rmm_stream)
    rmm_stream.synchronize()
    return data, src, dst


@pytest.mark.gpu
def test_copy_takes_rmm_device_buffers_in_place(rmm_pair: tuple[Any, Any, Any]) -> None:
    data, src, dst = rmm_pair
    with cm.DeviceBuffer.empty(MIB) as mine:
        cm.copy(mine, src)  # RMM's memory read where it is
        cm.copy(dst, mine)  # and written where it is
        assert np.array_equal(mine.to_numpy(), data)
    assert np.array_equal(dst.copy_to_host(), data)


@pytest.mark.gpu
def test_copy_batch_takes_rmm_device_buffers(rmm_pair: tuple[Any, Any, Any]) -> None:
    data, src, dst = rmm_pair
    offsets = np.arange(0, MIB, 4096)
    cm.copy_batch(dst, src, dst_offsets=offsets[::-1].copy(), src_offsets=offsets,
                  sizes=np.full(len(offsets), 4096))
    out = dst.copy_to_host().reshape(-1, 4096)
    assert np.array_equal(out, data.reshape(-1, 4096)[::-1])


@pytest.mark.gpu
@pytest.mark.uses_managed_memory
def test_a_prefetch_plan_takes_rmm_managed_memory(rmm: Any, rmm_stream: Any) -> None:
    buf = rmm.DeviceBuffer(size=4 * MIB, stream=rmm_stream, mr=rmm.mr.ManagedMemoryResource())
    rmm_stream.synchronize()
    with cm.Stream() as s:
        cm.PrefetchPlan().add(buf, cm.Location.device(0)).execute(s)
        cm.PrefetchPlan().add(buf, cm.Location.host(), nbytes=MIB).execute(s)
        s.synchronize()
    del buf


@pytest.mark.gpu
@pytest.mark.framework_kernels
def test_memkit_memory_to_rmm_users_and_back_without_a_copy(rmm: Any) -> None:
    cupy = pytest.importorskip("cupy")
    from rmm.allocators.cupy import rmm_cupy_allocator

    previous = cupy.cuda.get_allocator()
    cupy.cuda.set_allocator(rmm_cupy_allocator)  # an RMM user's CuPy
    try:
        with cm.DeviceBuffer.empty(MIB) as mine:
            view = cupy.asarray(mine)  # memkit's memory, seen by the RMM user: the same bytes
            assert view.data.ptr == mine.ptr
            view[...] = 7
            doubled = view * 2  # a result RMM allocated
            assert doubled.data.ptr != mine.ptr
            cm.copy(mine, doubled)  # back into memkit's memory straight from RMM's
            assert int(mine.to_numpy()[0]) == 14
            assert int(view[0]) == 14  # the view saw it: no copy in between
            del view, doubled
            cupy.cuda.Device().synchronize()
    finally:
        cupy.cuda.set_allocator(previous)
