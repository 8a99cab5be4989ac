"""Created contexts, the context stack and a destroyed context left current.

The stack answers follow the CUDA documentation (``cuCtxCreate`` pushes,
``cuCtxPopCurrent`` restores, ``cuCtxSetCurrent`` replaces the top, ``NULL``
pops). What calls return on a thread whose current context another thread
destroyed is **provisional** (marker ``provisional``): the documented
``CUDA_ERROR_CONTEXT_IS_DESTROYED`` for every call that uses the current
context, including the release calls; ``scripts/probes/invalid_context_probe.py``
records the H100's answers, and these cases follow them once it has run.
"""

from __future__ import annotations

import pytest
from cuda.bindings import driver as cu

import cuda_memkit as cm
from cuda_memkit import _driver

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


# -- a destroyed context left current (provisional) -------------------------------------


@pytest.mark.provisional
def test_destroyed_context_stays_current_on_other_threads() -> None:
    with stale_context_current(0) as ctx:
        assert current() == ctx
        expect_error(cm.CudaError, R.CUDA_ERROR_CONTEXT_IS_DESTROYED, "cuCtxGetDevice")
        expect_error(cm.CudaError, R.CUDA_ERROR_CONTEXT_IS_DESTROYED, "cuMemAlloc", 4096)


@pytest.mark.provisional
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
