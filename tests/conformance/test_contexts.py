"""Created contexts, the context stack and a destroyed context left current.

The stack answers follow the CUDA documentation (``cuCtxCreate`` pushes,
``cuCtxPopCurrent`` restores, ``cuCtxSetCurrent`` replaces the top, ``NULL``
pops). What calls return on a thread whose current context another thread
destroyed, or with no current context at all, is the H100's answer
(``scripts/probes/invalid_context_probe.py``, device run 3): the calls that
need a context and four release calls fail with
``CUDA_ERROR_CONTEXT_IS_DESTROYED``; the VMM, pool, stream and event releases
succeed; with the device's primary context pushed every release succeeds.
"""

from __future__ import annotations

import pytest
from cuda.bindings import driver as cu

import cuda_memkit as cm
from cuda_memkit._core import _driver

from .._contexts import created_context, current, on_thread, stale_context_current
from ._helpers import expect_error

pytestmark = pytest.mark.usefixtures("ctx")

R = cu.CUresult


def test_created_context_is_current_and_of_its_device() -> None:
    primary = current()
    with created_context(0) as ctx:
        assert current() == ctx != primary
        assert int(_driver.call("cuCtxGetDevice")) == 0
        p = _driver.call("cuMemAlloc", 4096)  # memory of the created context
        _driver.call("cuMemFree", p)
    assert current() == primary


def test_pop_restores_the_previous_context() -> None:
    primary = current()
    ctx = _driver.call("cuCtxCreate", None, 0, cu.CUdevice(0))
    assert current() == int(ctx)
    assert int(_driver.call("cuCtxPopCurrent")) == int(ctx)
    assert current() == primary
    _driver.call("cuCtxDestroy", ctx)
    assert current() == primary


def test_push_and_pop_on_a_thread_without_context() -> None:
    primary = current()

    def body() -> tuple[int, int, int]:
        before = current()
        _driver.call("cuCtxPushCurrent", primary)
        during = current()
        _driver.call("cuCtxPopCurrent")
        return before, during, current()

    assert on_thread(body) == (0, primary, 0)


def test_set_current_null_pops_a_pushed_context() -> None:
    primary = current()

    def body() -> int:
        _driver.call("cuCtxPushCurrent", primary)
        with created_context(0):
            pass
        _driver.call("cuCtxSetCurrent", 0)
        return current()

    assert on_thread(body) == 0


def test_destroy_pops_the_context_current_here() -> None:
    def body() -> int:
        ctx = _driver.call("cuCtxCreate", None, 0, cu.CUdevice(0))
        _driver.call("cuCtxDestroy", ctx)
        return current()

    assert on_thread(body) == 0


def test_pop_without_context() -> None:
    err = on_thread(lambda: expect_error(cm.CudaInvalidContextError,
                                         R.CUDA_ERROR_INVALID_CONTEXT, "cuCtxPopCurrent"))
    assert err.api == "cuCtxPopCurrent"


# -- a destroyed context left current (H100: invalid_context_probe, device run 3) ---------


def test_destroyed_context_stays_current_on_other_threads() -> None:
    with stale_context_current(0) as ctx:
        assert current() == ctx
        assert int(_driver.call("cuCtxGetDevice")) == 0  # it still answers
        expect_error(cm.CudaError, R.CUDA_ERROR_CONTEXT_IS_DESTROYED, "cuMemAlloc", 4096)
        expect_error(cm.CudaError, R.CUDA_ERROR_CONTEXT_IS_DESTROYED, "cuCtxSynchronize")
        va = _driver.call("cuMemAddressReserve", 2 << 20, 0, 0, 0)  # needs no context
    assert int(va)
    _driver.call("cuMemAddressFree", va, 2 << 20)


def test_vmm_and_handle_releases_work_with_a_destroyed_context_current() -> None:
    """cuMemAddressFree, cuStreamDestroy, cuEventDestroy: no context needed (H100)."""
    va = _driver.call("cuMemAddressReserve", 2 << 20, 0, 0, 0)
    s = _driver.call("cuStreamCreate", 1)
    e = _driver.call("cuEventCreate", 2)
    with stale_context_current(0):
        _driver.call("cuMemAddressFree", va, 2 << 20)
        _driver.call("cuStreamDestroy", s)
        _driver.call("cuEventDestroy", e)


def test_releases_on_a_thread_without_a_context() -> None:
    """cuMemFree and cuMemHostUnregister need no current context; the legacy stream does."""
    import numpy as np

    p = _driver.call("cuMemAlloc", 4096)
    q = _driver.call("cuMemAlloc", 4096)
    arr = np.zeros(4096, np.uint8)
    _driver.call("cuMemHostRegister", arr.ctypes.data, arr.nbytes, 0)
    results: list[object] = []

    def release() -> None:
        results.append(_driver.call("cuMemFree", p))
        results.append(_driver.call("cuMemHostUnregister", arr.ctypes.data))
        try:
            _driver.call("cuMemFreeAsync", q, 1)  # CU_STREAM_LEGACY
        except cm.CudaError as exc:
            results.append(exc.code)

    on_thread(release)
    assert results == [None, None, int(R.CUDA_ERROR_INVALID_CONTEXT)]
    _driver.call("cuMemFreeAsync", q, 1)
    _driver.call("cuStreamSynchronize", 1)


def test_release_calls_fail_with_a_destroyed_context_current() -> None:
    """cuMemFree of primary-context memory while a destroyed context is current."""
    p = _driver.call("cuMemAlloc", 4096)
    try:
        with stale_context_current(0):
            expect_error(cm.CudaError, R.CUDA_ERROR_CONTEXT_IS_DESTROYED, "cuMemFree", p)
            # the way out a finalizer has: push the primary context, retry, pop
            primary = int(_driver.call("cuDevicePrimaryCtxRetain", cu.CUdevice(0)))
            _driver.call("cuCtxPushCurrent", primary)
            _driver.call("cuMemFree", p)
            p = 0
            _driver.call("cuCtxPopCurrent")
            _driver.call("cuDevicePrimaryCtxRelease", cu.CUdevice(0))
    finally:
        if p:
            _driver.call("cuMemFree", p)
