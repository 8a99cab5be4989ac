"""Lifetimes: views keep owners alive, cycles are collected, exit is quiet, finalizers warn once.

* A view (numpy array, typed device view, sub-range, mapping, plan, builder,
  pool buffer) keeps what it needs alive: delete the owner, use the view.
* Reference cycles through any owning object are freed by ``gc.collect()``.
* Interpreter exit with live objects of every kind prints nothing and exits 0
  (subprocesses, on either backend).
* A release that fails inside a finalizer becomes exactly one
  :class:`MemkitWarning`, never an exception out of ``__del__``
  (failures injected with the simulator's ``Machine.fail_next``).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu

import cuda_memkit as cm
from cuda_memkit._core import _driver, _host_registry

from . import _leaks
from ._kinds import KINDS, MANAGED, Env, kind_params, leaks_since

N = 1 << 20
R = cu.CUresult


pytestmark = pytest.mark.usefixtures("default_pinned", "flush_pinned")


@pytest.fixture
def env() -> Iterator[Env]:
    s = cm.Stream()
    yield Env(s)
    s.synchronize()
    s.close()


def settled(env: Env | None = None) -> _leaks.Snapshot:
    """A leak snapshot after collection, with the stream idle and pinned blocks returned."""
    gc.collect()
    if env is not None:
        env.stream.synchronize()
    cm.MemoryPool.default_pinned().trim()
    return _leaks.snapshot()


def read_back(ptr: int, n: int) -> np.ndarray:
    out = np.zeros(n, np.uint8)
    cm.copy(out, ptr, nbytes=n)
    return out


# -- views keep their owners alive -------------------------------------------------------


HOST_VIEWS: dict[str, Callable[[Env], Any]] = {
    "HostBuffer": lambda env: cm.HostBuffer.empty(N).array,
    "HostBuffer.pooled": lambda env: cm.HostBuffer.pooled(N).array,
    "HostBuffer slice": lambda env: cm.HostBuffer.zeros(N).array[N // 2:],
    "HostBuffer typed": lambda env: cm.HostBuffer.empty((N // 4,), np.float32).array,
    "ManagedBuffer": lambda env: cm.ManagedBuffer.empty(N).array,
    "ManagedBuffer 2-D slice": lambda env: cm.ManagedBuffer.zeros((1024, 1024)).array[::2, 3:],
    "RegisteredHost": lambda env: cm.register_host(np.zeros(N, np.uint8)).array,
    "np.asarray(HostBuffer)": lambda env: np.asarray(cm.HostBuffer.empty(N)),
}


@pytest.mark.parametrize("kind", [
    pytest.param(k, marks=pytest.mark.uses_managed_memory) if "Managed" in k else k
    for k in HOST_VIEWS])
def test_host_view_outlives_its_owner(kind: str, env: Env) -> None:
    before = settled(env)
    view = HOST_VIEWS[kind](env)  # the owner is already unreachable but for the view
    gc.collect()
    view[...] = 7
    gc.collect()
    assert (view == 7).all()
    del view
    leaked = leaks_since(before, lambda: settled(env), "Managed" in kind)
    assert not leaked, f"{kind}: memory not freed after the view went: {leaked}"


@pytest.mark.uses_managed_memory
def test_close_with_views_alive_defers_the_free(env: Env) -> None:
    for make in (lambda: cm.HostBuffer.empty(N), lambda: cm.HostBuffer.pooled(N),
                 lambda: cm.ManagedBuffer.empty(N)):
        before = settled(env)
        buf = make()
        view = buf.array
        buf.close()
        assert buf.closed
        with pytest.raises(cm.ClosedError):
            _ = buf.array
        view[:] = 3  # still valid memory
        assert view.sum() == 3 * N
        del buf
        gc.collect()
        view[:] = 4
        del view
        assert not leaks_since(before, lambda: settled(env), managed=True)


def test_host_pool_buffer_view_outlives_the_buffer(env: Env) -> None:
    before = settled(env)
    pool = cm.MemoryPool(location=cm.Location.host())
    view = pool.allocate(N, stream=env.stream).array
    env.stream.synchronize()
    gc.collect()
    view[:] = 5
    assert view.sum() == 5 * N
    with pytest.raises(BufferError):
        pool.close()  # the buffer (kept by the view) is still allocated
    del view
    gc.collect()
    env.stream.synchronize()
    pool.close()
    assert not before.leaks(settled(env))


@pytest.mark.uses_managed_memory
def test_typed_device_view_outlives_its_owner(env: Env) -> None:
    before = settled(env)
    for make in (lambda: cm.DeviceBuffer.empty(N), lambda: cm.ManagedBuffer.empty(N),
                 lambda: cm.MemoryPool.default(0).allocate(N, stream=env.stream)):
        view = make().as_array(np.float32, (N // 4,))
        gc.collect()
        cm.copy(view, np.full(N // 4, 1.5, np.float32))
        assert view.__cuda_array_interface__["data"][0] != 0
        assert (read_back(view.ptr, N).view(np.float32) == 1.5).all()
        del view
    assert not leaks_since(before, lambda: settled(env), managed=True)


def test_mapping_keeps_its_range_and_physical_memory(env: Env) -> None:
    before = settled(env)
    g = cm.granularity(0)
    m = cm.AddressRange.reserve(2 * g).map(cm.PhysicalMemory.create(g), offset=g)
    m.set_access(0, cm.Access.READWRITE)
    gc.collect()
    assert not m.range.closed and not m.physical.closed
    cm.copy(m, np.full(g, 9, np.uint8))
    assert (read_back(m.ptr, g) == 9).all()
    del m
    assert not before.leaks(settled(env))


def test_pool_buffer_keeps_its_pool_and_stream(env: Env) -> None:
    before = settled(env)
    buf = cm.MemoryPool(0).allocate(N, stream=cm.Stream())
    gc.collect()
    assert not buf.pool.closed
    cm.copy(buf, np.full(N, 2, np.uint8))
    assert (read_back(buf.ptr, N) == 2).all()
    buf.free()
    del buf
    assert not before.leaks(settled(env))


@pytest.mark.uses_managed_memory
def test_plan_and_hints_keep_their_buffers(env: Env) -> None:
    before = settled(env)
    plan = cm.PrefetchPlan().add(cm.ManagedBuffer.zeros(N), cm.Location.device(0))
    hints = cm.ManagedMemoryHints.for_buffer(cm.ManagedBuffer.zeros(N))
    gc.collect()
    plan.execute(env.stream)
    hints.set_read_mostly().prefetch_to(cm.Location.device(0), env.stream)
    env.stream.synchronize()
    del plan, hints
    assert not leaks_since(before, lambda: settled(env), managed=True)


def test_async_copy_keeps_its_operands(env: Env) -> None:
    before = settled(env)
    dst = cm.DeviceBuffer.empty(N)
    cm.copy_async(dst, cm.HostBuffer.from_array(np.full(N, 6, np.uint8)), stream=env.stream)
    gc.collect()  # the source is held until the stream is done
    env.stream.synchronize()
    assert (read_back(dst.ptr, N) == 6).all()
    del dst
    assert not before.leaks(settled(env))


# -- reference cycles ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", kind_params(list(KINDS)))
def test_reference_cycle_is_collected(kind: str, env: Env) -> None:
    before = settled(env)
    node = types.SimpleNamespace(obj=KINDS[kind](env))
    node.me = node
    if kind.startswith("HostBuffer") or kind in ("ManagedBuffer", "RegisteredHost"):
        node.view = node.obj.array  # the cycle goes through a numpy view too
    del node
    leaked = leaks_since(before, lambda: settled(env), kind in MANAGED)
    assert not leaked, f"{kind} in a reference cycle was not freed: {leaked}"


def test_cycle_between_buffers_and_their_pool(env: Env) -> None:
    before = settled(env)
    pool = cm.MemoryPool(0)
    bufs = [pool.allocate(N, stream=env.stream) for _ in range(4)]
    holder = types.SimpleNamespace(pool=pool, bufs=bufs)
    holder.me = holder
    del pool, bufs, holder
    assert not before.leaks(settled(env))


@pytest.mark.parametrize("freed_by", ["collection", "close in a __del__"])
def test_cycle_between_a_buffer_and_its_stream(freed_by: str, env: Env) -> None:
    # The Stream's finalizer (a weakref callback) runs before the buffer's
    # __del__ when both are garbage in one cycle: the buffer must not hand the
    # destroyed stream's handle to the driver, nor warn that the caller let the
    # stream die first (found by test_threads in CI, 2026-11-24).
    before = settled(env)
    pool = cm.MemoryPool(0)

    class Closer:
        def __del__(self) -> None:
            self.buf.close()

    holder: Any = Closer() if freed_by != "collection" else types.SimpleNamespace()
    holder.stream = cm.Stream()
    holder.buf = pool.allocate(N, stream=holder.stream)
    holder.me = holder
    del holder
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    assert [str(w.message) for w in caught] == []
    assert pool.stats().used_current == 0
    pool.close()
    assert not before.leaks(settled(env))


@pytest.mark.parametrize("kind", ["device pool", "pinned host pool"])
def test_a_pool_collected_with_its_buffers_is_destroyed_after_them(
        kind: str, env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    # In one garbage cycle the pool's finalizer runs before its buffers'
    # __del__; freeing into a destroyed pool crashed later pool calls on the
    # H100, so the destroy must wait until nothing allocated from it lives.
    before = settled(env)
    used_at_destroy: list[int] = []
    real = _driver.call
    used = cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_USED_MEM_CURRENT

    def spy(api: str, *args: Any) -> Any:
        if api == "cuMemPoolDestroy":
            used_at_destroy.append(int(real("cuMemPoolGetAttribute", args[0], used)))
        return real(api, *args)

    monkeypatch.setattr(_driver, "call", spy)
    holder = types.SimpleNamespace()
    if kind == "device pool":
        holder.pool = cm.MemoryPool(0)
        holder.bufs = [holder.pool.allocate(N, stream=env.stream) for _ in range(3)]
    else:
        holder.pool = cm.MemoryPool(location=cm.Location.host())
        holder.bufs = [cm.HostBuffer.pooled(4096, pool=holder.pool) for _ in range(3)]
        holder.bufs.append(cm.HostBuffer.pooled(4096, pool=holder.pool))
        holder.bufs.pop().close()  # one block waits in the pool's cache
    holder.me = holder
    del holder
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    assert [str(w.message) for w in caught] == []
    assert used_at_destroy == [0]
    monkeypatch.undo()
    assert not before.leaks(settled(env))


# -- interpreter exit ---------------------------------------------------------------------------

_EXIT_PRELUDE = """
import gc, sys, threading, types
import numpy as np
import cuda_memkit as cm
g = cm.granularity(0)
s = cm.Stream()
keep = types.SimpleNamespace()
keep.host = cm.HostBuffer.empty(1 << 20)
keep.host_view = cm.HostBuffer.zeros(4096).array
keep.pooled = cm.HostBuffer.pooled(4096)
keep.reg = cm.register_host(np.ones(1 << 20, np.uint8))
keep.dev = cm.DeviceBuffer.empty(1 << 20)
keep.managed = cm.ManagedBuffer.zeros(1 << 20)
keep.managed_view = cm.ManagedBuffer.zeros(4096).array
keep.pool = cm.MemoryPool(0, release_threshold=1 << 30)
keep.pool_bufs = [keep.pool.allocate(4096, stream=s) for _ in range(3)]
keep.default_pool_buf = cm.MemoryPool.default(0).allocate(4096, stream=None)
keep.host_pool = cm.MemoryPool(location=cm.Location.host())
keep.host_pool_view = keep.host_pool.allocate(4096, stream=s).array
keep.vr = cm.AddressRange.reserve(2 * g)
keep.pm = cm.PhysicalMemory.create(g)
keep.mapping = keep.vr.map(keep.pm)
keep.mapping.set_access(0, cm.Access.READWRITE)
keep.grow = cm.GrowableBuffer(4 * g, chunk=g)
keep.grow.resize(3 * g)
keep.plan = cm.PrefetchPlan().add(keep.managed, cm.Location.device(0))
keep.stream = cm.Stream()
keep.copy = cm.copy_async(keep.dev, keep.host, stream=s)  # may still be in flight
keep.me = keep  # and a reference cycle through all of it
"""

EXIT_SCRIPTS = {
    "globals": _EXIT_PRELUDE + "print('ready')\n",
    "sys.exit": _EXIT_PRELUDE + "print('ready')\nsys.exit(0)\n",
    "only a cycle": _EXIT_PRELUDE + "del keep\nprint('ready')\n",
    "daemon thread": _EXIT_PRELUDE + textwrap.dedent("""
        started = threading.Event()
        def hold():
            mine = [cm.DeviceBuffer.empty(4096), cm.HostBuffer.empty(4096),
                    cm.MemoryPool.default(0).allocate(4096, stream=None)]
            started.set()
            threading.Event().wait()
        threading.Thread(target=hold, daemon=True).start()
        started.wait()
        print('ready')
        """),
    "gc disabled": "import gc\ngc.disable()\n" + _EXIT_PRELUDE + "print('ready')\n",
}


@pytest.mark.slow_subprocess
@pytest.mark.uses_managed_memory
@pytest.mark.parametrize("variant", list(EXIT_SCRIPTS))
def test_interpreter_exit_with_live_objects_is_quiet(variant: str) -> None:
    """Exit with live objects of every kind: rc 0, only what the script prints, no stderr.

    A MemkitWarning (a RuntimeWarning, shown by default) or an exception from a
    finalizer at shutdown would appear on stderr.
    """
    proc = subprocess.run([sys.executable, "-c", EXIT_SCRIPTS[variant]], env=dict(os.environ),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == "ready\n"
    assert proc.stderr == "", proc.stderr[-3000:]


# -- a failing release in a finalizer: one warning, no exception ----------------------------

#: kind -> (the release call to fail, raw cleanup of what the failure left behind)
_INJECT: dict[str, tuple[str, Callable[[Any], Callable[[], None]]]] = {}


def _inject(kind: str, api: str) -> Callable[[Callable[[Any], Callable[[], None]]],
                                            Callable[[Any], Callable[[], None]]]:
    def deco(fn: Callable[[Any], Callable[[], None]]) -> Callable[[Any], Callable[[], None]]:
        _INJECT[kind] = (api, fn)
        return fn
    return deco


def _quiet(api: str, *args: Any) -> None:
    try:
        _driver.call(api, *args)
    except cm.CudaError:
        pass


@_inject("HostBuffer", "cuMemFreeHost")
def _c_host(o: Any) -> Callable[[], None]:
    p = o.ptr
    return lambda: _quiet("cuMemFreeHost", p)


@_inject("RegisteredHost", "cuMemHostUnregister")
def _c_reg(o: Any) -> Callable[[], None]:
    p = o.ptr

    def cleanup() -> None:
        # The refused release leaves the range registered, and recorded as such; the raw
        # unregister here bypasses the record, so drop it too (else it outlives the array).
        _quiet("cuMemHostUnregister", p)
        _host_registry.forget_registration(p)
    return cleanup


@_inject("DeviceBuffer", "cuMemFree")
def _c_dev(o: Any) -> Callable[[], None]:
    p = o.ptr
    return lambda: _quiet("cuMemFree", p)


@_inject("ManagedBuffer", "cuMemFree")
def _c_managed(o: Any) -> Callable[[], None]:
    p = o.ptr
    return lambda: _quiet("cuMemFree", p)


@_inject("PoolBuffer", "cuMemFreeAsync")
def _c_pool_buf(o: Any) -> Callable[[], None]:
    p = o.ptr
    return lambda: _quiet("cuMemFreeAsync", p, 0)


@_inject("MemoryPool", "cuMemPoolDestroy")
def _c_pool(o: Any) -> Callable[[], None]:
    h = o.handle
    return lambda: _quiet("cuMemPoolDestroy", h)


@_inject("Stream", "cuStreamDestroy")
def _c_stream(o: Any) -> Callable[[], None]:
    h = o.handle
    return lambda: _quiet("cuStreamDestroy", h)


@_inject("AddressRange", "cuMemAddressFree")
def _c_range(o: Any) -> Callable[[], None]:
    p, n = o.ptr, o.nbytes
    return lambda: _quiet("cuMemAddressFree", p, n)


@_inject("PhysicalMemory", "cuMemRelease")
def _c_phys(o: Any) -> Callable[[], None]:
    h = o.handle
    return lambda: _quiet("cuMemRelease", h)


@_inject("Mapping+PhysicalMemory+AddressRange", "cuMemUnmap")
def _c_trio(o: Any) -> Callable[[], None]:
    m, pm, vr = o
    p, n, h, rp, rn = m.ptr, m.nbytes, pm.handle, vr.ptr, vr.nbytes

    def undo() -> None:
        _quiet("cuMemUnmap", p, n)
        _quiet("cuMemRelease", h)
        _quiet("cuMemAddressFree", rp, rn)
    return undo


@_inject("GrowableBuffer", "cuMemUnmap")
def _c_grow(o: Any) -> Callable[[], None]:
    p, chunk, n, reserved = o.ptr, o.chunk_size, o.capacity // o.chunk_size, o.reserved

    def undo() -> None:
        for i in range(n):
            _quiet("cuMemUnmap", p + i * chunk, chunk)
        _quiet("cuMemAddressFree", p, reserved)
    return undo


@pytest.mark.sim_only
@pytest.mark.parametrize("kind", kind_params(list(_INJECT)))
def test_failing_release_in_a_finalizer_warns_once(kind: str, env: Env,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from cuda_memkit.sim import machine

    api, cleanup_of = _INJECT[kind]
    before = settled(env)
    obj = [KINDS[kind](env)]
    cleanup = cleanup_of(obj[0])
    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    machine().fail_next(api, R.CUDA_ERROR_UNKNOWN)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            obj.clear()
            gc.collect()
    finally:
        machine().faults.clear()
    monkeypatch.undo()
    cleanup()
    ours = [str(w.message) for w in caught if issubclass(w.category, cm.MemkitWarning)]
    others = [f"{w.category.__name__}: {w.message}" for w in caught
              if not issubclass(w.category, cm.MemkitWarning)]
    assert not unraisable, [u.exc_value for u in unraisable]
    assert len(ours) == 1, ours
    assert api in ours[0] and "CUDA_ERROR_UNKNOWN" in ours[0], ours[0]
    assert not others, others
    assert not before.leaks(settled(env))
