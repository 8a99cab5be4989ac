"""SharedHostRing across processes: workers started every way, workers that die, consumers that
close or crash, interpreter exit, and a property test of the slot protocol.

Workers are real processes (``tests/_ring_workers.py``); they need no CUDA. ``fork`` in a
process with threads (any process that initialised CUDA has the driver's) draws Python 3.12's
DeprecationWarning, which the suite turns into an error: the fork tests let it pass.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cuda_memkit as cm
from cuda_memkit._core import _driver

from . import _ring_workers as rw

ROOT = Path(__file__).resolve().parents[1]
FORK_WARNING = "ignore:This process .* is multi-threaded:DeprecationWarning"
METHODS = [pytest.param("fork", marks=pytest.mark.filterwarnings(FORK_WARNING)),
           "forkserver", "spawn"]


def _ctx(method: str) -> Any:
    return multiprocessing.get_context(method)


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def _gone(pid: int, seconds: float = 15.0) -> bool:
    """Whether process ``pid`` ended (a zombie counts) within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ", 1)[1].startswith("Z"):
                    return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.05)
    return False


def _stop(procs: list[Any]) -> None:
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
            p.join()


@pytest.mark.parametrize("method", METHODS)
def test_workers_fill_slots_from_other_processes(method: str) -> None:
    with cm.SharedHostRing(3, (128, 4), np.int32, timeout=60) as ring:
        procs = [_ctx(method).Process(target=rw.fill, args=(ring.handle, k, 4)) for k in (1, 2)]
        for p in procs:
            p.start()
        seen = []
        try:
            for _ in range(8):
                with ring.get() as slot:
                    assert (slot.array == slot.tag).all()  # what the worker wrote
                    assert slot.worker == slot.tag // 1000 and slot.pid in {p.pid for p in procs}
                    seen.append(slot.tag)
        finally:
            _stop(procs)
        assert sorted(seen) == [1000, 1001, 1002, 1003, 2000, 2001, 2002, 2003]
        assert [p.exitcode for p in procs] == [0, 0]


def test_a_worker_killed_mid_batch_is_named_at_once() -> None:
    ring = cm.SharedHostRing(2, 1024, timeout=60)
    parent, child = multiprocessing.Pipe()
    p = _ctx("forkserver").Process(target=rw.acquire_and_hang, args=(ring.handle, 6, child))
    p.start()
    try:
        assert parent.poll(60)
        _what, slot, pid = parent.recv()
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(cm.WorkerError, match=rf"worker 6 \(pid {pid}\).*slot {slot}") as e:
            ring.get()
        assert time.monotonic() - t0 < 10  # the socket closes with the process: no timeout
        assert (e.value.worker, e.value.pid, e.value.slot, e.value.gone) == (6, pid, slot, True)
        assert ring.stats()["filling"] == 0  # the slot went back to the ring
    finally:
        _stop([p])
        ring.close()


def test_closing_the_ring_while_workers_write() -> None:
    ring = cm.SharedHostRing(2, (1 << 16,), np.uint8, timeout=60)
    parent, child = multiprocessing.Pipe()
    p = _ctx("forkserver").Process(target=rw.fill_until_closed,
                                   args=(ring.handle, 0, child))
    p.start()
    try:
        for _ in range(3):
            ring.get().close()
        assert parent.poll(60) and parent.recv()[0] == "acquired"
        ring.close()  # the worker is writing its slot now
        p.join(30)
        assert p.exitcode == rw.SAW_CLOSED  # a clear error in the worker, no crash
        last = None
        while parent.poll(1):
            last = parent.recv()
        assert last is not None and last[0] == "closed" and "closed the ring" in last[1]
    finally:
        _stop([p])
        ring.close()


def test_close_after_a_worker_died_holding_half_a_batch() -> None:
    before = _shm()
    ring = cm.SharedHostRing(1, (1 << 12,), np.int32, timeout=60)
    p = _ctx("forkserver").Process(target=rw.kill_self_mid_batch, args=(ring.handle, 2))
    p.start()
    with pytest.raises(cm.WorkerError, match="worker 2"):
        ring.get()
    p.join(30)
    assert p.exitcode == -signal.SIGKILL
    ring.close()
    assert _shm() == before


def test_no_worker_overwrites_a_batch_the_gpu_has_not_copied() -> None:
    """A copy held back on the GPU (the stream waits on a flag in pinned memory): its slot
    stays lent, and a worker filling as fast as it can never gets it, until the copy ran."""
    if _driver.backend_name() == "sim":
        pytest.skip("the simulator has no stream memory operations (cuStreamWaitValue32)")
    gate = cm.HostBuffer.zeros(1, np.uint32, flags=cm.HostAllocFlags.DEVICEMAP)
    ring = cm.SharedHostRing(1, (1 << 18,), np.int32, grants=1, timeout=60)
    _reports, child = multiprocessing.Pipe()  # kept open: the worker reports into it
    p = _ctx("forkserver").Process(target=rw.fill_until_closed, args=(ring.handle, 0, child))
    p.start()
    s = cm.Stream()
    dev = cm.DeviceBuffer.empty(ring.slot_nbytes)
    try:
        try:
            _driver.call("cuStreamWaitValue32", s.handle, gate.device_ptr, 1, 0)  # until >= 1
        except cm.CudaNotSupportedError:
            pytest.skip("this device has no stream memory operations")
        try:
            slot = ring.get()
            batch = slot.to_numpy()
            slot.copy_to(dev, stream=s)  # queued behind the gate
            slot.close()
            time.sleep(0.5)  # the worker waits for the slot all this while
            assert ring.stats()["lent"] == 1 and ring.stats()["granted"] == 0
        finally:
            gate.array[0] = 1  # the GPU goes on: the copy runs, then its event
        s.synchronize()
        assert (dev.to_numpy(np.int32) == batch).all()  # the batch as it was published
        deadline = time.monotonic() + 10
        while ring.stats()["lent"]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        ring.get().close()  # the worker had it back, filled it again
    finally:
        ring.close()
        _stop([p])
        dev.close()
        s.close()
        gate.close()


# -- the consumer's process ending ---------------------------------------------------------

CONSUMER = textwrap.dedent("""
    import multiprocessing, os, signal, sys, time
    import numpy as np
    import cuda_memkit as cm
    from tests import _ring_workers as rw

    def main(how):
        ring = cm.SharedHostRing(2, 4096, timeout=60)
        parent, child = multiprocessing.Pipe()
        ctx = multiprocessing.get_context("spawn")
        p = ctx.Process(target=rw.fill_until_closed, args=(ring.handle, 0, child))
        p.start()
        print(p.pid, flush=True)
        assert parent.poll(60)
        ring.get().close()
        if how == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        # "exit": leave everything open, as a script that just ends
        loader = cm.Loader(rw.batch_value, 100, 1024, workers=2, start_method="spawn")
        print(" ".join(map(str, loader.pids)), flush=True)
        next(iter(loader))

    if __name__ == "__main__":
        main(sys.argv[1])
""")


def _consumer(tmp_path: Path, how: str) -> subprocess.Popen[str]:
    script = tmp_path / "consumer.py"
    script.write_text(CONSUMER)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_MEMKIT_BACKEND": _driver.backend_name()}
    return subprocess.Popen([sys.executable, "-W", "default", str(script), how], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow_subprocess
def test_a_crashed_consumer_leaves_nothing_behind(tmp_path: Path) -> None:
    before = _shm()
    proc = _consumer(tmp_path, "crash")
    out, err = proc.communicate(timeout=120)  # ends when the worker, which shares it, ends too
    assert proc.returncode == -signal.SIGKILL, err
    worker = int(out.split()[0])
    assert _gone(worker)  # its connection closed with the consumer: it stopped
    assert "Traceback" not in err
    assert _shm() == before


@pytest.mark.slow_subprocess
def test_interpreter_exit_with_a_ring_and_a_loader_open(tmp_path: Path) -> None:
    before = _shm()
    proc = _consumer(tmp_path, "exit")
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert err == ""  # no warning, no traceback, from the consumer or its workers
    pids = [int(x) for x in out.split()]
    assert len(pids) == 3 and all(_gone(pid) for pid in pids)
    assert _shm() == before


# -- the slot protocol, as a property --------------------------------------------------------


@settings(max_examples=5, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(slots=st.integers(1, 4), workers=st.integers(1, 3), rounds=st.integers(1, 10),
       grants=st.integers(1, 2), seed=st.integers(0, 1 << 30))
def test_no_slot_is_ever_held_twice(slots: int, workers: int, rounds: int, grants: int,
                                    seed: int) -> None:
    rng = np.random.default_rng(seed)
    with cm.SharedHostRing(slots, 512, np.int64, grants=grants, timeout=60) as ring:
        ctx = _ctx("forkserver")
        procs = [ctx.Process(target=rw.stamp, args=(ring.handle, k, rounds, seed + k))
                 for k in range(workers)]
        for p in procs:
            p.start()
        held: list[cm.RingSlot] = []
        tags = []
        try:
            for _ in range(workers * rounds):
                slot = ring.get()
                assert slot.index not in {h.index for h in held}
                assert (slot.array == slot.tag).all()  # nobody wrote after the publish
                tags.append(slot.tag)
                held.append(slot)
                while held and (len(held) >= slots or rng.random() < 0.5):
                    h = held.pop(int(rng.integers(len(held))))
                    time.sleep(float(rng.random()) * 0.002)
                    assert (h.array == h.tag).all()  # still ours while lent
                    h.close()
        finally:
            for h in held:
                h.close()
            _stop(procs)
        assert [p.exitcode for p in procs] == [rw.CLEAN] * workers  # no stamp overwritten
        assert sorted(tags) == sorted(k * 1_000_000 + r for k in range(workers)
                                      for r in range(rounds))
