"""The one buffer contract (``cuda_memkit.Buffer``), checked the same way for every kind.

Each factory makes a buffer of ``N`` bytes and returns it with the objects to
close after it (its pool, range, ...). Nothing here assumes simulator
addresses: it runs on the simulator and on the H100.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import cuda_memkit as cm

N = 1 << 16
pytestmark = pytest.mark.usefixtures("default_pinned", "flush_pinned")


@dataclass
class Made:
    buf: Any
    others: list[Any]  # closed after the buffer, in order
    dtype: np.dtype[Any]  # what to_numpy() gives by default
    shape: tuple[int, ...]
    device_visible: bool
    host_visible: bool
    host: bool  # device is None (host memory, and a managed pool's)


def _pool_buf(env: cm.Stream, **kw: Any) -> Made:
    pool = cm.MemoryPool(0, **kw)
    buf = pool.allocate(N, stream=env)
    env.synchronize()
    host = kw.get("location") is not None
    managed = kw.get("managed", False)
    # a managed pool's memory belongs to no one device: its device is None, as the pool's
    return Made(buf, [pool], np.dtype(np.uint8), (N,), not host, host or managed,
                host or managed)


def _mapping(env: cm.Stream) -> Made:
    g = cm.granularity(0)
    vr = cm.AddressRange.reserve(2 * g)
    pm = cm.PhysicalMemory.create(g)
    m = vr.map(pm, offset=g)
    m.set_access(0, cm.Access.READWRITE)
    return Made(m, [pm, vr], np.dtype(np.uint8), (g,), True, False, False)


def _growable(env: cm.Stream) -> Made:
    g = cm.granularity(0)
    buf = cm.GrowableBuffer(4 * g, chunk=g)
    buf.resize(g)
    return Made(buf, [], np.dtype(np.uint8), (g,), True, False, False)


F32 = np.dtype(np.float32)
SHAPE = (N // 4 // 8, 8)


def _ring_slot(env: cm.Stream) -> Made:
    ring = cm.SharedHostRing(1, SHAPE, F32)
    filled = ring.handle.writer().acquire(timeout=30)  # a worker, in this process
    filled.array[...] = 0
    return Made(ring.take(filled.publish()), [ring], F32, SHAPE, True, True, True)

KINDS: dict[str, Callable[[cm.Stream], Made]] = {
    "DeviceBuffer": lambda s: Made(cm.DeviceBuffer.empty(N), [], np.dtype(np.uint8), (N,),
                                   True, False, False),
    "DeviceBuffer(typed)": lambda s: Made(cm.DeviceBuffer.zeros(SHAPE, F32), [], F32, SHAPE,
                                          True, False, False),
    "HostBuffer": lambda s: Made(cm.HostBuffer.empty(SHAPE, F32), [], F32, SHAPE,
                                 False, True, True),
    "HostBuffer.pooled": lambda s: Made(cm.HostBuffer.pooled(N), [], np.dtype(np.uint8), (N,),
                                        False, True, True),
    "RegisteredHost": lambda s: Made(cm.register_host(np.zeros(SHAPE, F32)), [], F32, SHAPE,
                                     False, True, True),
    "ManagedBuffer": lambda s: Made(cm.ManagedBuffer.zeros(SHAPE, F32), [], F32, SHAPE,
                                    True, True, False),
    "PoolBuffer(device)": lambda s: _pool_buf(s),
    "PoolBuffer(host)": lambda s: _pool_buf(s, location=cm.Location.host()),
    "PoolBuffer(managed)": lambda s: _pool_buf(s, managed=True),
    "Mapping": _mapping,
    "GrowableBuffer": _growable,
    "RingSlot": _ring_slot,
}
KIND_OF = {"DeviceBuffer": "device", "DeviceBuffer(typed)": "device", "HostBuffer": "pinned",
           "HostBuffer.pooled": "pinned_pooled", "RegisteredHost": "registered",
           "ManagedBuffer": "managed", "PoolBuffer(device)": "pool", "PoolBuffer(host)": "pool",
           "PoolBuffer(managed)": "pool", "Mapping": "vmm_mapped", "GrowableBuffer": "growable",
           "RingSlot": "shared_ring"}
PARAMS = [pytest.param(k, marks=pytest.mark.uses_managed_memory) if "anaged" in k else k
          for k in KINDS]


@pytest.fixture
def made(request: pytest.FixtureRequest) -> Iterator[Made]:
    stream = cm.Stream()
    m = KINDS[request.param](stream)
    yield m
    stream.synchronize()
    m.buf.close()
    for o in m.others:
        o.close()
    stream.close()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "made" in metafunc.fixturenames:
        metafunc.parametrize("made", PARAMS, indirect=True)


def _pattern(m: Made) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 255, m.buf.nbytes, dtype=np.uint8)
    if m.dtype == F32:
        raw = np.arange(m.buf.nbytes // 4, dtype=np.float32).view(np.uint8)
    return raw.view(m.dtype).reshape(m.shape)


# -- what every buffer is --------------------------------------------------------------


def test_is_a_buffer(made: Made) -> None:
    b = made.buf
    assert isinstance(b, cm.Buffer)
    assert isinstance(b.kind, cm.MemoryKind) and b.kind.value in cm.MEMORY_KINDS
    assert isinstance(b.nbytes, int) and b.nbytes == int(np.prod(made.shape)) * made.dtype.itemsize
    assert isinstance(b.ptr, int) and b.ptr != 0
    assert (b.device is None) == made.host
    assert b.device is None or b.device == 0
    assert not b.closed
    if made.device_visible:
        cai = b.__cuda_array_interface__
        assert cai["data"][0] == b.ptr
        assert tuple(cai["shape"]) == made.shape and np.dtype(cai["typestr"]) == made.dtype
        assert b.__dlpack_device__()[1] == 0
    if made.host_visible:
        assert np.asarray(b).ctypes.data == b.ptr


def test_what_is_not_a_buffer() -> None:
    g = cm.granularity(0)
    with cm.PhysicalMemory.create(g) as pm, cm.AddressRange.reserve(g) as vr:
        assert not isinstance(pm, cm.Buffer) and not isinstance(vr, cm.Buffer)
        assert pm.nbytes == vr.nbytes == g and pm.kind == cm.MemoryKind.VMM_PHYSICAL
    assert not isinstance(np.zeros(3), cm.Buffer) and not isinstance(cm.Stream, cm.Buffer)


def test_memory_kinds_are_the_ledger_kinds() -> None:
    assert [k.value for k in cm.MemoryKind] == list(cm.MEMORY_KINDS)
    assert cm.MemoryKind("pinned") is cm.MemoryKind.PINNED and str(cm.MemoryKind.POOL) == "pool"
    not_buffers = {"vmm_physical", "managed_resident", "graph", "graph_exec"}
    assert set(KIND_OF.values()) == set(cm.MEMORY_KINDS) - not_buffers


@pytest.mark.parametrize("name", KINDS)
def test_kind_is_the_ledger_kind(name: str) -> None:
    stream = cm.Stream()
    m = KINDS[name](stream)
    try:
        assert m.buf.kind == KIND_OF[name] == m.buf.kind.value
        assert cm.memory_stats().by_kind[m.buf.kind].current >= m.buf.nbytes
    finally:
        stream.synchronize()
        m.buf.close()
        for o in m.others:
            o.close()
        stream.close()


# -- fill, copies, to_numpy --------------------------------------------------------------


def test_fill_bytes_and_wider_patterns(made: Made) -> None:
    b = made.buf
    b.fill(np.uint8(0x5A))
    assert (b.to_numpy("u1") == 0x5A).all()
    b.fill(np.uint16(0xBEEF))
    assert (b.to_numpy("u2") == 0xBEEF).all()
    b.fill(np.uint32(0xDEADBEEF))
    out = b.to_numpy("u4")
    assert out.shape == (b.nbytes // 4,) and (out == 0xDEADBEEF).all()
    b.fill(np.float64(0.0))  # 8 bytes, a repeated 4-byte pattern
    assert not b.to_numpy("u1").any()


def test_fill_in_the_buffer_dtype(made: Made) -> None:
    b = made.buf
    value = 1.5 if made.dtype == F32 else 7
    b.fill(value)
    out = b.to_numpy()
    assert out.dtype == made.dtype and out.shape == made.shape and (out == value).all()


def test_fill_on_a_stream(made: Made) -> None:
    b = made.buf
    with cm.Stream() as s:
        b.fill(np.uint8(3), stream=s)
        s.synchronize()
    assert (b.to_numpy("u1") == 3).all()


def test_copy_round_trips(made: Made) -> None:
    b = made.buf
    src = _pattern(made)
    b.copy_from(src)
    np.testing.assert_array_equal(b.to_numpy(), src)
    dst = np.zeros_like(src)
    b.copy_to(dst)
    np.testing.assert_array_equal(dst, src)
    with cm.DeviceBuffer.empty(b.nbytes) as d, cm.HostBuffer.empty(made.shape, made.dtype) as h:
        b.copy_to(d)
        b.fill(np.uint8(0))
        b.copy_from(d)
        np.testing.assert_array_equal(b.to_numpy(), src)
        with cm.Stream() as s:  # stream-ordered, with pinned host memory
            b.copy_to(h, stream=s)
            s.synchronize()
            np.testing.assert_array_equal(h.array, src)
            b.fill(np.uint8(0))
            b.copy_from(h, stream=s)
            s.synchronize()
        np.testing.assert_array_equal(b.to_numpy(), src)


def test_to_numpy_dtype_and_shape(made: Made) -> None:
    b = made.buf
    src = _pattern(made)
    b.copy_from(src)
    raw = src.view(np.uint8).ravel()
    np.testing.assert_array_equal(b.to_numpy("u1"), raw)
    np.testing.assert_array_equal(b.to_numpy("u1", 16), raw[:16])
    np.testing.assert_array_equal(b.to_numpy(np.uint16, (2, 4)), raw[:16].view(np.uint16)
                                  .reshape(2, 4))


def test_size_mismatch_is_refused_before_copying(made: Made) -> None:
    b = made.buf
    b.fill(np.uint8(1))
    with pytest.raises(ValueError, match="mismatch"):
        b.copy_from(np.zeros(b.nbytes + 1, np.uint8))
    with pytest.raises(ValueError, match="mismatch"):
        b.copy_to(np.zeros(b.nbytes - 1, np.uint8))
    with cm.DeviceBuffer.empty(b.nbytes // 2) as d, pytest.raises(ValueError, match="mismatch"):
        b.copy_from(d)
    assert (b.to_numpy("u1") == 1).all()


# -- closed, twice, with -----------------------------------------------------------------


def test_after_close(made: Made) -> None:
    b = made.buf
    nbytes, kind, device = b.nbytes, b.kind, b.device
    b.close()
    assert b.closed and b.nbytes == nbytes and b.kind is kind and b.device == device
    assert "closed" in repr(b) or "freed" in repr(b)
    assert isinstance(b, cm.Buffer)
    touching: list[Callable[[], Any]] = [
        lambda: b.ptr, lambda: b.fill(0), lambda: b.to_numpy(),
        lambda: b.copy_from(np.zeros(nbytes, np.uint8)),
        lambda: b.copy_to(np.zeros(nbytes, np.uint8)), lambda: cm.copy(b, b),
    ]
    if made.device_visible:
        touching += [lambda: b.__cuda_array_interface__, lambda: b.__dlpack__()]
    if made.host_visible:
        touching += [lambda: np.asarray(b)]
    for touch in touching:
        with pytest.raises(cm.ClosedError):
            touch()
    b.close()
    assert b.closed


def test_close_twice_and_free_twice(made: Made) -> None:
    b = made.buf
    b.close()
    b.close()
    if isinstance(b, cm.PoolBuffer):
        b.free()  # after close: a no-op, as a second close() is
    assert b.closed


def test_with_block(made: Made) -> None:
    b = made.buf
    with b as inner:
        assert inner is b and not b.closed
    assert b.closed
