"""Sharing pools between processes: export/import of pools (POSIX fds) and pointers."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest

import cuda_memkit as cm

MiB = 1 << 20
REPO = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture
def ipc_pool() -> Iterator[cm.MemoryPool]:
    p = cm.MemoryPool(0, ipc=True)
    yield p
    p.close(force=True)


def closed_fd() -> int:
    fd = os.open(os.devnull, os.O_RDONLY)
    os.close(fd)
    return fd


def test_export_and_import_a_pool(ipc_pool: cm.MemoryPool) -> None:
    assert ipc_pool.ipc and not ipc_pool.imported
    fd = ipc_pool.export()
    try:
        assert isinstance(fd, int) and fd >= 0
        imported = cm.MemoryPool.import_(fd)
    finally:
        os.close(fd)
    with imported:
        assert imported.imported and imported.ipc and imported.location is None
        assert "imported" in repr(imported)
        with pytest.raises(ValueError, match="cannot allocate"):
            imported.allocate(4096, stream=None)
        with pytest.raises(cm.CudaInvalidValueError):
            imported.stats()  # the driver answers no queries on imported pools
        with pytest.raises(ValueError, match="ipc=True"):
            imported.export()
    assert imported.closed


def test_export_needs_an_ipc_pool(stream: cm.Stream) -> None:
    with cm.MemoryPool(0) as p:
        with pytest.raises(ValueError, match="ipc=True"):
            p.export()
        buf = p.allocate(4096, stream=stream)
        with pytest.raises(ValueError, match="ipc=True"):
            buf.export()
        buf.free()
    with pytest.raises(ValueError, match="ipc=True"):
        cm.MemoryPool.default(0).export()


def test_import_bad_descriptors() -> None:
    with pytest.raises(TypeError):
        cm.MemoryPool.import_("3")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        cm.MemoryPool.import_(True)
    with pytest.raises(ValueError):
        cm.MemoryPool.import_(-1)
    with pytest.raises(cm.CudaError) as info:
        cm.MemoryPool.import_(closed_fd())
    assert info.value.name == "CUDA_ERROR_UNKNOWN"


def test_pointer_export_is_64_bytes(ipc_pool: cm.MemoryPool, stream: cm.Stream) -> None:
    buf = ipc_pool.allocate(MiB, stream=stream)
    data = buf.export()
    assert isinstance(data, bytes) and len(data) == 64
    buf.free()
    with pytest.raises(cm.ClosedError):
        buf.export()


def test_import_pointer_bad_input(ipc_pool: cm.MemoryPool) -> None:
    with pytest.raises(TypeError):
        ipc_pool.import_pointer("00" * 64)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="64 bytes"):
        ipc_pool.import_pointer(b"\x00" * 63)
    with pytest.raises(ValueError):
        ipc_pool.import_pointer(b"\x00" * 64, nbytes=0)
    for garbage in (b"\xab" * 64, bytes(64)):
        with pytest.raises(cm.CudaInvalidValueError):
            ipc_pool.import_pointer(garbage)
    with cm.MemoryPool(0) as plain, pytest.raises(cm.CudaInvalidValueError):
        plain.import_pointer(b"\xab" * 64)


def test_import_pointer_in_one_process(backend: str, ipc_pool: cm.MemoryPool,
                                       stream: cm.Stream) -> None:
    if backend != "sim":
        pytest.skip("in-process pointer import is the simulator's stand-in for the "
                    "two-process test (the H100 case is test_two_processes_share_memory)")
    src = ipc_pool.allocate(MiB, stream=stream)
    stream.synchronize()
    cm.copy(src, np.full(MiB, 42, np.uint8))
    fd = ipc_pool.export()
    imported = cm.MemoryPool.import_(fd)
    os.close(fd)
    mapped = imported.import_pointer(bytearray(src.export()), stream=stream)
    assert mapped.nbytes == MiB and mapped.ptr != src.ptr
    out = np.zeros(MiB, np.uint8)
    cm.copy(out, mapped)
    assert (out == 42).all()
    cm.copy(mapped, np.full(MiB, 7, np.uint8))  # the same memory
    cm.copy(out, src)
    assert (out == 7).all()
    with pytest.raises(BufferError, match="imported buffer"):
        imported.close()
    mapped.free()
    imported.close()
    src.free()
    stream.synchronize()


CHILD = r"""
import os, sys
import numpy as np
import cuda_memkit as cm

fd, data = int(sys.argv[1]), bytes.fromhex(sys.argv[2])
pool = cm.MemoryPool.import_(fd)
os.close(fd)
buf = pool.import_pointer(data)
assert pool.device == 0, pool.device  # the exporter's pool is on device 0
assert buf.__dlpack_device__() == (2, 0), buf.__dlpack_device__()
out = np.zeros(buf.nbytes, np.uint8)
cm.copy(out, buf)
assert (out == 42).all(), out[:8]
cm.copy(buf, np.full(buf.nbytes, 7, np.uint8))
n = buf.nbytes
buf.free()
cm.Device(0).synchronize()
pool.close()
print("child ok", n)
"""


def test_two_processes_share_memory(backend: str, ipc_pool: cm.MemoryPool,
                                    stream: cm.Stream) -> None:
    if backend == "sim":
        pytest.skip("needs the real CUDA backend: the simulator's memory lives in this "
                    "process, so a second process cannot map it")
    if not cm.Device(0).posix_fd_handles:
        pytest.skip("the device cannot share memory through POSIX file descriptors")
    buf = ipc_pool.allocate(MiB, stream=stream)
    stream.synchronize()
    cm.copy(buf, np.full(MiB, 42, np.uint8))
    fd = ipc_pool.export()
    try:
        env = dict(os.environ, CUDA_MEMKIT_BACKEND="cuda",
                   PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, str(fd), buf.export().hex()],
            pass_fds=(fd,), env=env, capture_output=True, text=True, timeout=120)
    finally:
        os.close(fd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"child ok {MiB}" in proc.stdout
    out = np.zeros(MiB, np.uint8)
    cm.copy(out, buf)
    assert (out == 7).all()  # the child wrote into our memory
    buf.free()
    stream.synchronize()


@pytest.mark.parametrize("device", [0, 1])
def test_imported_memory_reports_the_exporters_device(backend: str, ndevices: int,
                                                      device: int) -> None:
    if backend != "sim":
        pytest.skip("in-process pointer import is the simulator's stand-in for two processes")
    if device >= ndevices:
        pytest.skip("needs two devices")
    # (cm.Device: the caller's context is current again after, for the tests that follow)
    with cm.Device(device), cm.MemoryPool(device, ipc=True) as pool, cm.Stream(device) as s:
        src = pool.allocate(MiB, stream=s)
        s.synchronize()
        fd = pool.export()
        try:
            imported = cm.MemoryPool.import_(fd)
        finally:
            os.close(fd)
        with imported:
            assert imported.device == device
            mapped = imported.import_pointer(src.export(), stream=s)
            assert mapped.device == device
            assert mapped.__dlpack_device__() == (2, device)
            assert mapped.as_array(np.float32).__dlpack_device__() == (2, device)
            mapped.free()
        src.free()
        s.synchronize()


@pytest.mark.sim_only
def test_an_imported_pool_whose_access_the_driver_will_not_tell(ipc_pool: cm.MemoryPool) -> None:
    from cuda.bindings import driver as cu

    from cuda_memkit.sim import machine

    fd = ipc_pool.export()
    try:
        machine().fail_next("cuMemPoolGetAccess", cu.CUresult.CUDA_ERROR_INVALID_VALUE)
        imported = cm.MemoryPool.import_(fd)
    finally:
        os.close(fd)
    with imported:
        assert imported.imported and imported.device is None
