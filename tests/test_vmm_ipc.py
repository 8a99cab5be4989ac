"""Sharing physical memory: PhysicalMemory.export() / PhysicalMemory.import_().

The in-process cases run on both backends. The two-process case needs the
real driver: the simulator's memory lives inside one process, so another
process cannot map it (a missing capability of the simulator, not a failure).
"""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit._core import _driver
from cuda_memkit._core._context import ensure_context

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def g() -> int:
    ensure_context(0)
    return cm.granularity(0, handle_type=cm.HandleType.POSIX_FD)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    seen: list[str] = []
    real = _driver.call

    def call(api: str, *args: Any) -> Any:
        seen.append(api)
        return real(api, *args)

    monkeypatch.setattr(_driver, "call", call)
    yield seen


def closed_fd() -> int:
    rd, wr = os.pipe()
    os.close(rd)
    os.close(wr)
    return rd


def test_export_import_in_process(g: int) -> None:
    with cm.PhysicalMemory.create(g, handle_type=cm.HandleType.POSIX_FD) as p, \
            cm.AddressRange.reserve(2 * g) as r:
        assert p.handle_type is cm.HandleType.POSIX_FD
        fd = p.export()
        assert isinstance(fd, int) and fd >= 0
        try:
            q = cm.PhysicalMemory.import_(fd, g)
        finally:
            os.close(fd)
        with q:
            assert q.nbytes == g and q.device == 0
            # the H100 reports no handle types for an imported handle: no re-export
            assert q.handle_type is cm.HandleType.NONE
            with pytest.raises(ValueError):
                q.export()
            m1 = r.map(p)
            m2 = r.map(q, offset=g)
            for m in (m1, m2):
                m.set_access(0)
            data = (np.arange(g) % 239).astype(np.uint8)
            cm.copy(m1, data)
            out = np.zeros(g, np.uint8)
            cm.copy(out, m2)
            assert (out == data).all()
            m2.close()
            m1.close()


def test_export_twice_gives_two_descriptors(g: int) -> None:
    with cm.PhysicalMemory.create(g, handle_type="posix_fd") as p:
        a, b = p.export(), p.export(cm.HandleType.POSIX_FD)
        try:
            assert a != b
        finally:
            os.close(a)
            os.close(b)


def test_export_without_handle_type(g: int, calls: list[str]) -> None:
    with cm.PhysicalMemory.create(g) as p:
        calls.clear()
        with pytest.raises(ValueError, match="without an export handle type"):
            p.export()
        with pytest.raises(ValueError):
            p.export(cm.HandleType.POSIX_FD)
        assert "cuMemExportToShareableHandle" not in calls
    with pytest.raises(cm.ClosedError):
        p.export()


def test_export_bad_handle_type(g: int) -> None:
    with cm.PhysicalMemory.create(g, handle_type=cm.HandleType.POSIX_FD) as p:
        with pytest.raises(ValueError):
            p.export(cm.HandleType.FABRIC)
        with pytest.raises(ValueError):
            p.export(cm.HandleType.NONE)
        with pytest.raises(TypeError):
            p.export(1.5)


@pytest.mark.parametrize(
    ("fd", "size", "kwargs", "exc"),
    [
        ("closed", "G", {}, ValueError),
        (-1, "G", {}, ValueError),
        ("3", "G", {}, TypeError),
        (None, "G", {}, TypeError),
        ("open", 0, {}, ValueError),
        ("open", "x", {}, TypeError),
        ("open", "G", {"handle_type": cm.HandleType.FABRIC}, ValueError),
        ("open", "G", {"handle_type": cm.HandleType.NONE}, ValueError),
    ],
)
def test_import_bad_input(g: int, calls: list[str], fd: Any, size: Any, kwargs: dict[str, Any],
                          exc: type[Exception]) -> None:
    size = g if size == "G" else size
    opened = None
    if fd == "closed":
        fd = closed_fd()
    elif fd == "open":
        opened = fd = os.open(os.devnull, os.O_RDONLY)
    try:
        with pytest.raises(exc):
            cm.PhysicalMemory.import_(fd, size, **kwargs)
    finally:
        if opened is not None:
            os.close(opened)
    assert "cuMemImportFromShareableHandle" not in calls


def test_import_with_unaligned_size_releases(g: int, calls: list[str]) -> None:
    with cm.PhysicalMemory.create(g, handle_type=cm.HandleType.POSIX_FD) as p:
        fd = p.export()
        try:
            calls.clear()
            with pytest.raises(ValueError, match="multiple"):
                cm.PhysicalMemory.import_(fd, g + 4096)
        finally:
            os.close(fd)
    assert calls.count("cuMemImportFromShareableHandle") == 1
    assert calls.count("cuMemRelease") == 2  # the undo, then p itself


def test_import_foreign_descriptor(g: int) -> None:
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        with pytest.raises(cm.CudaError):
            cm.PhysicalMemory.import_(fd, g)
    finally:
        os.close(fd)


CHILD = textwrap.dedent(
    """
    import os, socket, sys
    import numpy as np
    import cuda_memkit as cm

    sock = socket.socket(fileno=int(sys.argv[1]))
    size = int(sys.argv[2])
    _, fds, _, _ = socket.recv_fds(sock, 16, 1)
    fd = fds[0]
    with cm.PhysicalMemory.import_(fd, size) as p, cm.AddressRange.reserve(size) as r:
        os.close(fd)
        with r.map(p) as m:
            m.set_access(0)
            cm.copy(m, (np.arange(size) % 241).astype(np.uint8))
            cm.Device(0).synchronize()
    sock.sendall(b"written")
    sock.close()
    """
)


def test_two_processes(g: int, backend: str) -> None:
    """The child maps the parent's memory, writes; the parent reads it back on the GPU."""
    if backend != "cuda":
        pytest.skip("needs the real CUDA backend: the simulator's memory lives in this "
                    "process, so a second process cannot map it")
    if not cm.Device(0).posix_fd_handles:
        pytest.skip("this device cannot share memory through POSIX file descriptors")
    size = 2 * g
    with cm.PhysicalMemory.create(size, handle_type=cm.HandleType.POSIX_FD) as p, \
            cm.AddressRange.reserve(size) as r, r.map(p) as m:
        m.set_access(0)
        _driver.call("cuMemsetD8", m.ptr, 0, size)
        cm.Device(0).synchronize()
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(os.environ, CUDA_MEMKIT_BACKEND="cuda",
                   PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(child.fileno()), str(size)],
            pass_fds=(child.fileno(),), env=env, cwd=str(REPO),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        child.close()
        fd = p.export()
        try:
            socket.send_fds(parent, [b"fd"], [fd])
        finally:
            os.close(fd)
        try:
            _, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
        reply = parent.recv(16)
        parent.close()
        assert proc.returncode == 0, err.decode(errors="replace")
        assert reply == b"written"
        # Read back on the GPU: device-to-device into fresh memory, then to the host.
        with cm.DeviceBuffer.empty(size) as copy:
            _driver.call("cuMemcpyDtoD", copy.ptr, m.ptr, size)
            host = np.zeros(size, np.uint8)
            cm.copy(host, copy)
        assert (host == (np.arange(size) % 241).astype(np.uint8)).all()
