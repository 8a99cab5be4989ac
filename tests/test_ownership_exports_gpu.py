"""close() under a copy of a view, on a real GPU: the races the simulator cannot run.

On the simulator every copy is finished when it is issued, so
``tests/test_ownership_exports.py`` holds copies "running" by hand. Here the
copies really run: a large copy queued first on the copy's stream keeps the
one under test waiting for milliseconds while the buffer behind its view is
closed (or shrunk), and the memory must neither be lent to the next allocation
nor unmapped until that copy has landed. Skipped on the simulator.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit._core import _driver, _resource

if _driver.backend_name() == "sim":
    pytest.skip("copies that really run need a GPU (simulator backend)", allow_module_level=True)

BIG = 256 << 20  # ~5 ms of copying ahead of the copy under test
N = 1 << 20


def live_keys() -> set[int]:
    return {int(key) for _a, key, _n in _resource.live_allocations()}  # type: ignore[call-overload]


@pytest.fixture
def slow() -> Iterator[tuple[cm.HostBuffer, cm.DeviceBuffer]]:
    with cm.HostBuffer.empty(BIG) as src, cm.DeviceBuffer.empty(BIG) as dst:
        yield src, dst


@pytest.mark.parametrize("cache", [False, True])
@pytest.mark.parametrize("how", ["as_array", "DLPack capsule consumer"])
def test_a_pool_block_closed_under_a_copy_of_its_view_is_not_lent_again(
        cache: bool, how: str, slow: tuple[cm.HostBuffer, cm.DeviceBuffer]) -> None:
    """The review's case on the device: ``v = pb.as_array(); copy_async(v, host, stream=s2);
    pb.close()``, then the next allocation of that size on pb's own stream. It must get
    other memory, and its contents must survive the copy landing."""
    pool = cm.MemoryPool(0, cache=cache)
    s1, s2 = cm.Stream(), cm.Stream()
    host = cm.HostBuffer.from_array(np.full(N, 1, np.uint8))
    try:
        pb = pool.allocate(N, stream=s1)
        s1.synchronize()
        view = pb.as_array(np.uint8) if how == "as_array" else _Consumer(pb)
        cm.copy_async(slow[1], slow[0], stream=s2)  # the copy under test waits behind it
        cm.copy_async(view, host, stream=s2)
        del view
        ptr = pb.ptr
        pb.close()
        assert ptr in live_keys(), "freed under the copy"
        again = pool.allocate(N, stream=s1)
        try:
            assert again.ptr != ptr, "lent again under the copy"
            again.fill(2, stream=s1)
            s1.synchronize()
            s2.synchronize()
            assert (again.to_numpy() == 2).all()  # the copy did not land in it
        finally:
            again.close()
    finally:
        s1.synchronize()
        s2.synchronize()
        host.close()
        s1.close()
        s2.close()
        pool.close()


class _Consumer:
    """What a framework keeps of a DLPack export: the capsule and the address."""

    def __init__(self, buf: object) -> None:
        self.capsule = buf.__dlpack__()  # type: ignore[attr-defined]
        self.__cuda_array_interface__ = dict(buf.__cuda_array_interface__)  # type: ignore[attr-defined]


def test_shrinking_a_growable_buffer_under_a_copy_of_its_view_waits(
        slow: tuple[cm.HostBuffer, cm.DeviceBuffer]) -> None:
    """resize() down unmaps the tail: a copy into the tail through an ``as_array()`` view,
    still queued behind a large copy, must land before the unmap (else the device faults:
    CUDA_ERROR_ILLEGAL_ADDRESS at the next synchronisation, and a dead context)."""
    g = cm.granularity(0)
    buf = cm.GrowableBuffer(4 * g, chunk=g)
    host = cm.HostBuffer.from_array(np.full(2 * g, 3, np.uint8))
    s = cm.Stream()
    try:
        buf.resize(2 * g)
        cm.copy_async(slow[1], slow[0], stream=s)
        cm.copy_async(buf.as_array(np.uint8), host, stream=s)
        buf.resize(g)  # waits for the copy on its event, then unmaps the second chunk
        s.synchronize()  # raises CUDA_ERROR_ILLEGAL_ADDRESS if the copy ran into the unmap
        assert (buf.to_numpy()[:g] == 3).all()
    finally:
        s.synchronize()
        s.close()
        host.close()
        buf.close()
