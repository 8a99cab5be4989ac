"""cuda_memkit.dask: worker pools, per-worker ledgers and leak reports on a process cluster.

The cluster's workers are processes; each imports cuda_memkit with the backend of this
process's environment (``CUDA_MEMKIT_BACKEND``), so on the simulator each has a simulated
machine of its own. One cluster serves the module (starting one costs seconds).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

distributed = pytest.importorskip("distributed")

from cuda_memkit.dask import MemkitPlugin, memory_stats, unregister  # noqa: E402

MIB = 1 << 20


@contextlib.contextmanager
def _cluster() -> Iterator[Any]:
    """A client of a process cluster of two workers, each with its CUDA context made.

    On leaving, the cluster is closed and its worker processes have exited (their memory,
    on a GPU, is the device's again).
    """
    # The workers log to this process's handlers: keep distributed's chatter out of the report.
    logging.getLogger("distributed").setLevel(logging.ERROR)
    pids: list[int] = []
    try:
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                      dashboard_address=":0", worker_dashboard_address=None
                                      ) as cluster, distributed.Client(cluster) as c:
            # Each worker's CUDA context is made now, before any test's leak check looks: on
            # a GPU that check reads the device's free memory, which the contexts take a
            # part of.
            c.run(_context)
            pids.extend(c.run(os.getpid).values())
            yield c
    finally:
        _wait_gone(pids)


def _wait_gone(pids: list[int], timeout: float = 30.0) -> None:
    """Wait until the processes ``pids`` have exited (a zombie has: its memory is gone)."""
    import psutil

    deadline = time.monotonic() + timeout
    for pid in pids:
        while True:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker process {pid} still runs {timeout:.0f} s after "
                                   "its cluster closed")
            time.sleep(0.05)


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    with _cluster() as c:
        yield c


@pytest.fixture
def own_client() -> Iterator[Any]:
    """A cluster of the test's own, whose worker processes are gone when the test ends.

    For a test that leaves memory in a worker: the plugin's pool closed with a buffer alive
    (``close(force=True)``) is destroyed, and its reserve given back, only once that buffer
    is freed and the pool object goes. On a GPU the leak check reads the device's free memory,
    where the worker processes' memory counts too: ending the workers gives it all back.
    """
    with _cluster() as c:
        yield c


@pytest.fixture
def own_plugin(own_client: Any) -> Iterator[MemkitPlugin]:
    p = MemkitPlugin(reserve=64 * MIB, cupy=False)
    own_client.register_plugin(p)
    yield p
    own_client.run(_drop)


def _context() -> None:
    import cuda_memkit as cm

    cm.Device(0).set_current()


@pytest.fixture
def plugin(client: Any) -> Iterator[MemkitPlugin]:
    p = MemkitPlugin(reserve=64 * MIB, cupy=False)
    client.register_plugin(p)
    yield p
    client.run(_drop)
    if any(client.run(_registered).values()):
        unregister(client)


# -- run in the workers (module functions: pickled by reference) -----------------------------

def _registered(dask_worker: Any) -> bool:
    return "cuda_memkit" in dask_worker.plugins


def _pool_settings(dask_worker: Any) -> tuple[int, int, int]:
    pool = dask_worker.plugins["cuda_memkit"].pool
    return pool.stats().reserved_current, pool.release_threshold, pool.stats().used_current


def _hold(nbytes: int, dask_worker: Any) -> int:
    """Allocate from the worker's plugin pool and keep the buffer on the worker."""
    buf = dask_worker.plugins["cuda_memkit"].pool.allocate(nbytes, stream=None)
    dask_worker._memkit_test_held = buf
    return int(buf.nbytes)


def _drop(dask_worker: Any) -> None:
    import cuda_memkit as cm

    buf = getattr(dask_worker, "_memkit_test_held", None)
    if buf is not None:
        buf.close()
        del dask_worker._memkit_test_held
        # A pool torn down with this buffer alive goes once its free is known done.
        cm.Device(0).synchronize()


def _metrics(dask_worker: Any) -> dict[str, int]:
    return {k: f(dask_worker) for k, f in dask_worker.metrics.items()
            if k.startswith("cuda_memkit")}


def _live_now() -> int:
    import cuda_memkit as cm

    return cm.memory_stats().live


# -- the promises ------------------------------------------------------------------------

def test_every_worker_gets_its_pool_with_the_reserve_kept(client: Any,
                                                          plugin: MemkitPlugin) -> None:
    settings = client.run(_pool_settings)
    assert len(settings) == 2
    for reserved, threshold, used in settings.values():
        assert reserved >= 64 * MIB  # reserved up front and kept by the release threshold
        assert threshold == (1 << 64) - 1  # by default the pool keeps what it grew to
        assert used == 0  # the reserve is free memory of the pool, not an allocation


def test_memory_stats_is_per_worker_and_matches_the_worker_metrics(
        client: Any, plugin: MemkitPlugin) -> None:
    first, second = sorted(client.scheduler_info()["workers"])
    client.run(_hold, 3 * MIB, workers=[first])
    stats = memory_stats(client)
    assert set(stats) == {first, second}
    assert stats[first].by_kind["pool"].current == 3 * MIB
    assert stats[first].by_kind["pool"].live == 1
    assert stats[second].by_kind["pool"].current == 0
    metrics = client.run(_metrics)
    assert metrics[first]["cuda_memkit_bytes"] == 3 * MIB
    assert metrics[first]["cuda_memkit_live"] == 1
    assert metrics[second]["cuda_memkit_bytes"] == 0


def test_unregister_reports_what_each_worker_left_allocated(own_client: Any,
                                                            own_plugin: MemkitPlugin) -> None:
    client = own_client
    first, second = sorted(client.scheduler_info()["workers"])
    client.run(_hold, 5 * MIB, workers=[first])
    reports = unregister(client)
    assert reports[first] and reports[first].nbytes == 5 * MIB
    assert [a["kind"] for a in reports[first].allocations] == ["pool"]
    assert "5.0 MiB" in reports[first].text or str(5 * MIB) in reports[first].text
    assert reports[second] is not None and not reports[second]
    assert not any(client.run(_registered).values())
    assert not any(client.run(_metrics).values())  # the metrics went with the plugin
    # The leaked buffer stays valid after the teardown and is freed normally.
    client.run(_drop)
    assert client.run(_live_now) == {first: 0, second: 0}


def test_the_worker_log_carries_the_leak_report(own_client: Any,
                                                own_plugin: MemkitPlugin) -> None:
    client = own_client
    first, _ = sorted(client.scheduler_info()["workers"])
    client.run(_hold, 2 * MIB, workers=[first])
    unregister(client)
    logs = client.get_worker_logs(workers=[first])[first]
    assert any("cuda_memkit leak report" in msg and "1 allocation(s)" in msg
               for _level, msg in logs)
    client.run(_drop)


def test_a_worker_started_later_gets_the_plugin(client: Any, plugin: MemkitPlugin) -> None:
    cluster = client.cluster
    cluster.scale(3)
    client.wait_for_workers(3, timeout=60)
    try:
        assert all(client.run(_registered).values())
        assert all(r >= 64 * MIB for r, _t, _u in client.run(_pool_settings).values())
    finally:
        cluster.scale(2)
        while len(client.scheduler_info()["workers"]) > 2:
            client.sync(_sleep)


async def _sleep() -> None:
    import asyncio

    await asyncio.sleep(0.05)


def test_options_are_checked_before_any_worker_sees_them() -> None:
    with pytest.raises(ValueError, match="reserve"):
        MemkitPlugin(reserve="lots")
    with pytest.raises(ValueError, match="release_threshold"):
        MemkitPlugin(reserve=2 * MIB, release_threshold=MIB)
    with pytest.raises(ValueError, match="cache_limit"):
        MemkitPlugin(cache=False, cache_limit=MIB)
    assert MemkitPlugin(reserve="1 MiB").reserve == MIB


def test_importing_cuda_memkit_loads_neither_dask_nor_the_plugin() -> None:
    import subprocess
    import sys

    code = ("import sys, cuda_memkit; "
            "print(sorted(m for m in ('dask', 'distributed', 'cuda_memkit.dask') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def _prometheus_text() -> str:
    import prometheus_client

    return prometheus_client.generate_latest().decode()


def test_the_ledger_is_a_prometheus_gauge_by_kind_and_device(client: Any,
                                                             plugin: MemkitPlugin) -> None:
    pytest.importorskip("prometheus_client")
    first, second = sorted(client.scheduler_info()["workers"])
    client.run(_hold, 3 * MIB, workers=[first])
    text = client.run(_prometheus_text)

    def gauge(worker: str, name: str) -> float:
        found = re.findall(rf'^{name}{{device="0",kind="pool"}} (\S+)$', text[worker], re.M)
        assert len(found) == 1, text[worker][-2000:]
        return float(found[0])

    assert gauge(first, "cuda_memkit_bytes") == 3 * MIB
    assert gauge(first, "cuda_memkit_live_allocations") == 1
    assert gauge(second, "cuda_memkit_bytes") == 0


def test_registering_again_replaces_the_plugin(client: Any, plugin: MemkitPlugin) -> None:
    client.register_plugin(MemkitPlugin(reserve=32 * MIB, release_threshold=32 * MIB,
                                        cupy=False))
    for reserved, threshold, _used in client.run(_pool_settings).values():
        assert threshold == 32 * MIB  # the new plugin's pool; the old one was torn down
        assert reserved >= 32 * MIB
