"""Bad input across the whole public API: the right exception, a clear message, no side effects.

A table of cases (callable, expected exception class, a regex the message
must match, naming the argument) covering every public callable of
``cuda_memkit.__all__``: functions, constructors and classmethods, and the
methods of every object kind, including closed objects of every kind in every
method. Each case runs inside :func:`tests._nothing.nothing_allocated`: no
allocating, mapping or hint-issuing driver call, and the ledger (simulator
tables, or free device memory on a GPU) unchanged.

Argument errors must be caught before the driver (plain ``TypeError`` /
``ValueError``, not a :class:`CudaError`), except the cases marked
``driver=True`` whose answer is the driver's (a device ordinal past the
count, a range registered twice). The exception classes, enums and result
records (``PlanEntry``, ``PlannedCall``, ``PoolStats``, ``RangeInfo``) are
made by the library, not from user input, and are not in the table.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np
import pytest

import cuda_memkit as cm

from . import (  # noqa: F401  (each registers its cases)
    _bad_cases_buffers,
    _bad_cases_capture,
    _bad_cases_devices,
    _bad_cases_host,
    _bad_cases_managed,
    _bad_cases_observing,
    _bad_cases_oversub,
    _bad_cases_pools,
    _bad_cases_rapids,
    _bad_cases_residency,
    _bad_cases_ring,
    _bad_cases_transfers,
    _bad_cases_vmm,
    _bad_cases_xdev,
)
from ._bad_cases_closed import CLOSED
from ._bad_cases_ring import closed_ring_objects, ring_objects
from ._bad_input_table import CASES, Case, N, closed_fd
from ._helpers import page_aligned_zeros
from ._nothing import nothing_allocated


@pytest.fixture(scope="module")
def o() -> Iterator[SimpleNamespace]:
    """Live objects of every kind (made once), and closed ones."""
    cm.MemoryPool.default_pinned()
    cm.HostBuffer.pooled(1).close()
    g = cm.granularity(0)
    ns = SimpleNamespace(g=g)
    ns.stream = cm.Stream()
    ns.host = cm.HostBuffer.zeros(N)
    ns.host_f32 = cm.HostBuffer.zeros(N // 4, np.float32)
    ns.host0d = cm.HostBuffer.zeros(())
    ns.reg_array = page_aligned_zeros(N)
    ns.reg = cm.register_host(ns.reg_array)
    ns.ro_array = page_aligned_zeros(N)
    ns.ro_array.flags.writeable = False
    ns.reg_ro = cm.register_host(ns.ro_array, flags=cm.HostRegisterFlags.READ_ONLY)
    ns.dev = cm.DeviceBuffer.empty(N)
    ns.managed = cm.ManagedBuffer.zeros(N)
    ns.managed0 = cm.ManagedBuffer.empty(0)
    ns.pool = cm.MemoryPool(0)
    ns.pool_buf = ns.pool.allocate(N, stream=ns.stream)
    ns.host_pool = cm.MemoryPool(location=cm.Location.host())
    ns.range = cm.AddressRange.reserve(4 * g)
    ns.pm = cm.PhysicalMemory.create(g)
    ns.pm2 = cm.PhysicalMemory.create(g)
    ns.mapping = ns.range.map(ns.pm)
    ns.mapping.set_access(0, cm.Access.READWRITE)
    ns.grow = cm.GrowableBuffer(4 * g, chunk=g)
    ns.grow.resize(g)
    ns.hints = cm.ManagedMemoryHints.for_buffer(ns.managed)
    closed_later = cm.ManagedBuffer.zeros(N)
    ns.plan_of_closed = cm.PrefetchPlan().add(closed_later, 0)
    closed_later.close()
    ns.page = np.zeros(N, np.uint8)
    ring_objects(ns)  # before the closed descriptor: the ring's would take its number
    ns.closed_fd = closed_fd()
    # -- closed objects of every kind
    c = SimpleNamespace()
    for name, make in {
        "HostBuffer": lambda: cm.HostBuffer.empty(N),
        "HostBuffer.pooled": lambda: cm.HostBuffer.pooled(N),
        "RegisteredHost": lambda: cm.register_host(page_aligned_zeros(N)),
        "DeviceBuffer": lambda: cm.DeviceBuffer.empty(N),
        "ManagedBuffer": lambda: cm.ManagedBuffer.zeros(N),
        "Stream": cm.Stream,
        "MemoryPool": lambda: cm.MemoryPool(0),
        "HostMemoryPool": lambda: cm.MemoryPool(location=cm.Location.host()),
        "AddressRange": lambda: cm.AddressRange.reserve(g),
        "PhysicalMemory": lambda: cm.PhysicalMemory.create(g),
        "GrowableBuffer": lambda: cm.GrowableBuffer(2 * g, chunk=g),
    }.items():
        obj = make()
        obj.close()
        setattr(c, name.replace(".", "_"), obj)
    c.PoolBuffer = ns.pool.allocate(N, stream=ns.stream)
    c.PoolBuffer.free()
    hp = ns.host_pool.allocate(N, stream=ns.stream)
    ns.stream.synchronize()
    hp.close()
    c.HostPoolBuffer = hp
    vr = cm.AddressRange.reserve(g)
    c.Mapping = vr.map(cm.PhysicalMemory.create(g))
    c.Mapping.close()
    vr.close()
    closed_ring_objects(c)
    ns.closed = c
    ns.stream.synchronize()
    yield ns
    ns.stream.synchronize()
    for obj in (ns.ring_slot, ns.ring, ns.dev_half, ns.mapping, ns.range, ns.pm, ns.pm2,
                ns.grow, ns.pool_buf, ns.pool, ns.host_pool, ns.reg, ns.reg_ro, ns.managed,
                ns.managed0, ns.dev, ns.host, ns.host_f32, ns.host0d, ns.stream):
        obj.close()


# == the test ==========================================================================


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_bad_input(c: Case, o: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    with nothing_allocated(monkeypatch, driver_may_refuse=c.driver), \
            pytest.raises(c.exc) as info:
        c.call(o)
    err = info.value
    import re

    assert re.search(c.match, str(err)), (
        f"{type(err).__name__}: {err!s} does not match {c.match!r} (must name the argument)")
    if not c.driver:
        assert not isinstance(err, cm.CudaError), (
            f"{type(err).__name__} from the driver: the argument should be refused before it")
        assert type(err) is c.exc, f"raised {type(err).__name__}, expected exactly {c.exc.__name__}"


def test_the_matrix_is_large_and_covers_every_public_callable() -> None:
    assert len(CASES) >= 150
    ids = " ".join(c.id for c in CASES)
    not_callables = {"__version__", "LocationType"}
    records = {"PlanEntry", "PlannedCall", "PoolStats", "RangeInfo", "HostAllocFlags",
               "HostRegisterFlags", "AttachFlags", "MemAdvice", "Access", "HandleType",
               "backend_name", "device_count", "MEMORY_KINDS", "MemoryKind", "Buffer",
               # results made by the library, not from user input
               "Allocation", "Frame", "MemoryEvent", "KindStats", "MemoryStats", "Usage",
               "KindSummary", "SiteSummary", "Timeline", "TrackSummary", "ResidencyRun"}
    for name in cm.__all__:
        obj = getattr(cm, name)
        if (name in not_callables or name in records or not callable(obj)
                or (isinstance(obj, type) and issubclass(obj, BaseException))
                or (not isinstance(obj, type) and not inspect.signature(obj).parameters)):
            continue  # records, enums, errors, and functions that take no input
        assert name in ids, f"no bad-input case for cuda_memkit.{name}"


@pytest.mark.parametrize("kind", sorted(CLOSED))
def test_double_close_is_a_no_op(kind: str, o: SimpleNamespace) -> None:
    obj = getattr(o.closed, kind.replace(".", "_"))
    obj.close()
    obj.close()
    assert obj.closed
