"""What a ``CopyBatch`` holds, and what every batch path checks before anything is issued.

* A closed batch holds none of its operands, whichever path (kernel or driver) ran.
* Raw addresses: address + offset + size stays below 2**64 on every side and path.
* ``allow_pageable`` is a bool; location hints name devices that exist, on every path.
"""

from __future__ import annotations

import textwrap
import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import cuda_memkit as cm

from ._helpers import run_script

pytestmark = pytest.mark.usefixtures("default_pinned", "flush_pinned")

BLOCK = 4096


# -- a closed batch lets go of its operands -------------------------------------------------


@pytest.mark.parametrize("method", ["kernel", "driver", "auto"])
@pytest.mark.parametrize("on_stream", [False, True])
def test_a_closed_batch_holds_none_of_its_operands(method: str, on_stream: bool,
                                                   stream: cm.Stream) -> None:
    """After close() (and the stream's work), dropping the operands frees them: the batch
    keeps no reference, neither in its pairs nor in what it remembers of the kernel's pick."""
    h = cm.HostBuffer.zeros(8 * BLOCK)
    d = cm.DeviceBuffer.zeros(8 * BLOCK)
    b = cm.CopyBatch().add(d, h, dst_offsets=np.arange(8)[::-1] * BLOCK,
                           src_offsets=np.arange(8) * BLOCK, sizes=BLOCK)
    b.execute(stream=stream if on_stream else None, method=method)
    stream.synchronize()
    b.close()
    refs = [weakref.ref(h), weakref.ref(d)]
    del h, d
    assert [r() for r in refs] == [None, None]  # freed by reference counting, no cycle
    assert b.closed and b.device_nbytes == 0


@pytest.mark.slow_subprocess
def test_the_exit_report_does_not_name_a_closed_batchs_operands(tmp_path: Path) -> None:
    """Operands dropped after the batch that copied them (kernel path) was closed are freed:
    the leak report at exit finds nothing."""
    script = tmp_path / "closed_batch.py"
    script.write_text(textwrap.dedent("""
        import numpy as np
        import cuda_memkit as cm

        h, d = cm.HostBuffer.zeros(8 * 4096), cm.DeviceBuffer.zeros(8 * 4096)
        b = cm.CopyBatch().add(d, h, dst_offsets=np.arange(8)[::-1] * 4096,
                               src_offsets=np.arange(8) * 4096, sizes=4096)
        b.execute(method="kernel")
        b.close()
        del h, d
    """))
    proc = run_script(script, CUDA_MEMKIT_LEAK_REPORT="1")
    assert proc.returncode == 0, proc.stderr
    assert "no memory left at exit" in proc.stderr, proc.stderr



# -- addresses never wrap past 2**64 -------------------------------------------------------

TOP = 1 << 64


class FakeCAI:
    """A ``__cuda_array_interface__`` object claiming memory that runs past 2**64."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": (nbytes,),
                                         "typestr": "|u1", "version": 3, "strides": None}


def _wrapping_calls(victim: cm.DeviceBuffer, other: cm.HostBuffer,
                    stream: cm.Stream) -> dict[str, Any]:
    """Calls whose destination or source address wraps onto ``victim``."""
    low = TOP - BLOCK  # + an offset of victim.ptr + BLOCK wraps to victim.ptr
    wrap = [(victim.ptr + BLOCK, 0, 64)]
    back = [(0, victim.ptr + BLOCK, 64)]
    cai = FakeCAI(TOP - 64, 4 * BLOCK)  # 4 KiB claimed from 64 bytes below the top

    def batch(dst: Any, src: Any, blocks: list[tuple[int, int, int]]) -> Any:
        return lambda: cm.CopyBatch().add(dst, src, blocks=blocks)

    out: dict[str, Any] = {}
    for method in ("driver", "kernel", "auto"):
        out[f"dst int, {method}"] = lambda m=method: cm.copy_batch(low, other, blocks=wrap,
                                                                   method=m)
        out[f"src int, {method}"] = lambda m=method: cm.copy_batch(other, low, blocks=back,
                                                                   method=m)
        out[f"dst int, stream, {method}"] = lambda m=method: cm.copy_batch(
            low, other, blocks=wrap, method=m, stream=stream)
        out[f"dst int arrays, {method}"] = lambda m=method: cm.copy_batch(
            low, other, dst_offsets=np.array([victim.ptr + BLOCK], np.uint64),
            src_offsets=[0], sizes=np.array([64]), method=m)
        out[f"dst int one size, {method}"] = lambda m=method: cm.copy_batch(
            low, other, dst_offsets=[0, victim.ptr + BLOCK], src_offsets=[0, 64], sizes=64,
            method=m)
        out[f"dst CAI, {method}"] = lambda m=method: cm.copy_batch(
            cai, other, blocks=[(0, 0, 2 * BLOCK)], method=m)
    out["CopyBatch dst int"] = batch(low, other, wrap)
    out["CopyBatch src int"] = batch(other, low, back)
    out["copy dst int"] = lambda: cm.copy(TOP - 16, other, nbytes=64)
    out["copy src int"] = lambda: cm.copy(other, TOP - 16, nbytes=64)
    out["copy dst int, sized source"] = lambda: cm.copy(TOP - 16, other)
    out["copy_async dst int"] = lambda: cm.copy_async(TOP - 16, other, nbytes=64,
                                                      stream=stream)
    out["copy dst CAI"] = lambda: cm.copy(cai, other)
    return out


WRAPPING = list(_wrapping_calls(SimpleNamespace(ptr=0), None, None))  # type: ignore[arg-type]


@pytest.mark.parametrize("name", WRAPPING)
def test_every_path_refuses_an_address_that_wraps_past_2_64(
        name: str, stream: cm.Stream, monkeypatch: pytest.MonkeyPatch) -> None:
    """Address + offset + size past 2**64 would land on another allocation (the review's
    case: ``copy_batch(2**64 - 4096, src, blocks=[(victim.ptr + 4096, 0, 64)])`` wrote into
    ``victim``): refused with ValueError on every path, before anything is issued."""
    from ._nothing import nothing_allocated

    victim = cm.DeviceBuffer.zeros(2 * BLOCK)
    other = cm.HostBuffer.from_array(np.full(4 * BLOCK, 7, np.uint8))
    try:
        call = _wrapping_calls(victim, other, stream)[name]
        with nothing_allocated(monkeypatch), pytest.raises(ValueError, match=r"2\*\*64"):
            call()
        stream.synchronize()
        assert (victim.to_numpy() == 0).all()
    finally:
        other.close()
        victim.close()


def test_a_range_ending_at_2_64_itself_does_not_wrap() -> None:
    """The check is exact: the last block may end at 2**64 (nothing wraps; the driver
    decides about such an address when the batch runs)."""
    other = cm.HostBuffer.zeros(BLOCK)
    try:
        with cm.CopyBatch() as b:
            b.add(TOP - BLOCK, other, blocks=[(BLOCK - 64, 0, 64)])
            b.add(other, TOP - BLOCK, dst_offsets=[0], src_offsets=[BLOCK - 64], sizes=64)
            with pytest.raises(ValueError, match=r"2\*\*64"):
                b.add(TOP - BLOCK, other, blocks=[(BLOCK - 64, 0, 65)])
    finally:
        other.close()


# -- object arrays are a TypeError, integers past 64 bits a ValueError -----------------------

SMALL_OBJECTS = np.array([0, BLOCK], dtype=object)


def _object_array_calls(dev: Any, host: Any, managed: Any) -> dict[str, Any]:
    return {
        "dst_offsets": lambda: cm.copy_batch(dev, host, dst_offsets=SMALL_OBJECTS,
                                             src_offsets=[0, BLOCK], sizes=64),
        "src_offsets": lambda: cm.copy_batch(dev, host, dst_offsets=[0, BLOCK],
                                             src_offsets=SMALL_OBJECTS, sizes=[64, 64]),
        "sizes": lambda: cm.copy_batch(dev, host, dst_offsets=[0, BLOCK],
                                       src_offsets=[0, BLOCK], sizes=SMALL_OBJECTS),
        "blocks": lambda: cm.copy_batch(dev, host, blocks=np.array([[0, 0, 64]], object)),
        "CopyBatch.add": lambda: cm.CopyBatch().add(dev, host, dst_offsets=SMALL_OBJECTS,
                                                    src_offsets=[0, BLOCK], sizes=64),
        "add_ranges offsets": lambda: cm.PrefetchPlan().add_ranges(
            managed, cm.Location.device(0), SMALL_OBJECTS, 64),
        "add_ranges sizes": lambda: cm.PrefetchPlan().add_ranges(
            managed, cm.Location.device(0), [0, BLOCK], SMALL_OBJECTS),
    }


@pytest.mark.uses_managed_memory
@pytest.mark.parametrize("name", list(_object_array_calls(None, None, None)))
def test_an_object_array_of_small_ints_is_a_type_error(name: str) -> None:
    """The transfers page's rule: offset and size arrays are integer arrays; an object
    array is a TypeError naming its dtype (not "integers past 64 bits", which it does not
    hold)."""
    dev, host = cm.DeviceBuffer.zeros(2 * BLOCK), cm.HostBuffer.zeros(2 * BLOCK)
    managed = cm.ManagedBuffer.zeros(2 * BLOCK)
    try:
        with pytest.raises(TypeError, match="integers, not object"):
            _object_array_calls(dev, host, managed)[name]()
    finally:
        for b in (dev, host, managed):
            b.close()


@pytest.mark.parametrize("values", [[0, 2**70], [0, -2**70], [-1, 2**63],
                                    np.array([0, 2**64], dtype=object)])
def test_integers_past_64_bits_stay_a_value_error(values: Any) -> None:
    """Also ``[-1, 2**63]``, which numpy makes float64 (no integer dtype holds both): the
    ints are out of range, not floats."""
    dev, host = cm.DeviceBuffer.zeros(2 * BLOCK), cm.HostBuffer.zeros(2 * BLOCK)
    try:
        with pytest.raises(ValueError, match="past 64 bits"):
            cm.copy_batch(dev, host, dst_offsets=values, src_offsets=[0, 64], sizes=64)
        with pytest.raises(ValueError, match="past 64 bits"):
            cm.copy_batch(dev, host, blocks=[(v, 0, 64) for v in values])
        with pytest.raises(TypeError, match="not float64"):  # floats stay a TypeError
            cm.copy_batch(dev, host, dst_offsets=[0.0, 64.0], src_offsets=[0, 64], sizes=64)
    finally:
        dev.close()
        host.close()


# -- ids the driver cannot take, devices that do not exist: ValueError before anything -------

BIG_IDS = [2**31, 2**40, 2**64]


def _big_id_calls(dev: Any, host: Any, big: int) -> dict[str, Any]:
    L, T = cm.Location, cm.LocationType
    return {
        "copy_batch(dst_location=int)": lambda: cm.copy_batch(dev, host, blocks=[(0, 0, 64)],
                                                              dst_location=big),
        "Location.device": lambda: L.device(big),
        "Location.host_numa": lambda: L.host_numa(big),
        "Location(HOST_NUMA, id)": lambda: L(T.HOST_NUMA, big),
        "MemoryPool(location=Location.host_numa(id), cache=True)":
            lambda: cm.MemoryPool(location=L(T.HOST_NUMA, big), cache=True),
        "MemoryPool(managed=True, location=Location.device(id))":
            lambda: cm.MemoryPool(managed=True, location=L(T.DEVICE, big)),
        "MemoryPool(device=id)": lambda: cm.MemoryPool(big),
        "Device(id)": lambda: cm.Device(big),
        "Stream(device=id)": lambda: cm.Stream(big),
        "DeviceBuffer.empty(device=id)": lambda: cm.DeviceBuffer.empty(64, device=big),
    }


@pytest.mark.parametrize("big", BIG_IDS)
@pytest.mark.parametrize("name", list(_big_id_calls(None, None, 0)))
def test_ids_past_the_drivers_int_are_a_value_error(name: str, big: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Device ordinals and location ids go to the driver as C ints: one past 2**31 - 1 is a
    ValueError naming the limit (never the bindings' OverflowError), before anything."""
    from ._nothing import nothing_allocated

    dev, host = cm.DeviceBuffer.zeros(BLOCK), cm.HostBuffer.zeros(BLOCK)
    try:
        with nothing_allocated(monkeypatch), pytest.raises(ValueError, match=r"2\*\*31"):
            _big_id_calls(dev, host, big)[name]()
    finally:
        dev.close()
        host.close()


@pytest.mark.uses_managed_memory
@pytest.mark.parametrize("side", ["dst_location", "src_location"])
@pytest.mark.parametrize(("api", "method"), [(api, m) for api in ("copy_batch",
                                                                  "copy_batch(stream=)")
                                             for m in ("driver", "kernel", "auto")]
                         + [("CopyBatch.add", "")])
def test_a_hint_naming_no_device_is_refused_on_every_path(
        method: str, side: str, api: str, ndevices: int, stream: cm.Stream,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One behaviour whichever path would copy: ValueError before anything is issued (the
    driver refused such a hint in its call, after a kernel launch of the same batch; the
    kernel and auto paths ignored it)."""
    from ._nothing import nothing_allocated

    managed, host = cm.ManagedBuffer.zeros(2 * BLOCK), cm.HostBuffer.zeros(2 * BLOCK)
    hint = {side: ndevices}  # one past the last device
    try:
        with nothing_allocated(monkeypatch), pytest.raises(ValueError, match="does not exist"):
            if api == "CopyBatch.add":
                cm.CopyBatch().add(managed, host, blocks=[(0, 0, 64)], **hint)
            else:
                cm.copy_batch(managed, host, blocks=[(0, 0, 64), (BLOCK, BLOCK, 64)],
                              method=method, stream=stream if "stream" in api else None,
                              **hint)
    finally:
        managed.close()
        host.close()


@pytest.mark.uses_managed_memory
@pytest.mark.parametrize("hint", [0, cm.Location.host(), cm.Location.host_numa(0),
                                  cm.Location.host_numa(99), cm.Location.host_numa_current()])
def test_hints_of_existing_devices_and_any_host_node_are_taken(hint: Any) -> None:
    """Hints are hints: a device that exists, or any host location (the driver takes a
    NUMA node it does not have as a hint too), copy as without one."""
    managed, host = cm.ManagedBuffer.zeros(2 * BLOCK), cm.HostBuffer.zeros(2 * BLOCK)
    try:
        host.array[:] = 5
        for method in ("driver", "kernel"):
            managed.fill(0)
            cm.copy_batch(managed, host, blocks=[(0, 0, 64)], method=method,
                          dst_location=hint, src_location=hint)
            assert (managed.to_numpy()[:64] == 5).all() and (managed.to_numpy()[64:] == 0).all()
    finally:
        managed.close()
        host.close()
