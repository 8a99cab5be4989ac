"""Dask workers on cuda_memkit pools, and each worker's ledger seen from the client.

An optional extra (``pip install -e ".[dask]"`` in a checkout): this module imports
``distributed``; ``import cuda_memkit`` never imports it.

:class:`MemkitPlugin`
    A ``distributed`` worker plugin: every worker (present and future) gets
    its own device pool (with a block cache, a release threshold and memory
    reserved up front, as dask-cuda's ``rmm_pool_size`` does for RMM), CuPy
    allocates from it when CuPy is installed, and the worker's ledger is
    published as worker metrics (the dashboard's worker table, and
    Prometheus where ``prometheus_client`` is installed).
:func:`memory_stats`
    Each worker's :class:`~cuda_memkit.MemoryStats`, keyed by worker address.
:func:`unregister`
    Removes the plugin from every worker and returns what each worker still
    held (its leak report).

Each worker process has its own ledger and its own CUDA context; the
backend comes from ``CUDA_MEMKIT_BACKEND`` in the worker's environment, so
a ``LocalCluster`` of processes on the simulator gives every worker a
simulated machine of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from distributed import WorkerPlugin

from ._core._checks import check_int, check_nonneg

if TYPE_CHECKING:
    from distributed import Client, Worker

    from ._observability._stats import MemoryStats
    from ._pools._pool import MemoryPool

__all__ = ["MemkitPlugin", "WorkerLeaks", "memory_stats", "unregister"]

# Under "distributed": the worker log (client.get_worker_logs) and its configuration.
logger = logging.getLogger("distributed.worker.cuda_memkit")

#: The name the plugin registers under (``client.unregister_worker_plugin(PLUGIN_NAME)``).
PLUGIN_NAME = "cuda_memkit"

#: The default release threshold: the pool keeps every byte it grew to.
KEEP_ALL = (1 << 64) - 1

#: Worker metrics the plugin publishes (scalars: the dashboard's worker table shows them).
METRICS = ("cuda_memkit_bytes", "cuda_memkit_cached_bytes", "cuda_memkit_live")

#: The leak report of each worker's last teardown in this process (what :func:`unregister`
#: reads), by worker address: a process of threads runs several workers.
_last_report: dict[str, WorkerLeaks] = {}


@dataclass(frozen=True)
class WorkerLeaks:
    """What a worker still held when the plugin was torn down.

    Attributes
    ----------
    allocations : tuple of dict
        One ``{"kind", "device", "pool", "nbytes"}`` per live allocation of
        the worker's ledger (data the worker still keeps counts: persisted
        arrays are live memory).
    text : str
        The report as written to the worker's log (with allocation stacks
        where ``CUDA_MEMKIT_LEAK_REPORT=1`` recorded them).
    """

    allocations: tuple[dict[str, Any], ...]
    text: str

    @property
    def nbytes(self) -> int:
        """Bytes of every allocation still alive."""
        return sum(int(a["nbytes"]) for a in self.allocations)

    def __bool__(self) -> bool:
        return bool(self.allocations)


def _size_option(value: object, name: str) -> int:
    """A byte count given as an int or a string such as ``"4GiB"`` (dask's parse_bytes)."""
    if isinstance(value, str):
        from dask.utils import parse_bytes

        try:
            value = parse_bytes(value)
        except ValueError as exc:
            raise ValueError(f"{name} must be a byte count, not {value!r}") from exc
    return check_nonneg(check_int(value, name, "an int or a size string such as '4GiB'"), name)


def _flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
    return value


class MemkitPlugin(WorkerPlugin):
    """A ``distributed`` worker plugin that gives each worker its memkit pools.

    Register it once on a client (``client.register_plugin(MemkitPlugin(...))``):
    every worker, including those started later, runs :meth:`setup`.

    Parameters
    ----------
    device : int, default 0
        The device of the worker's pool. ``dask_cuda.LocalCUDACluster`` gives
        each worker one GPU as device 0 (``CUDA_VISIBLE_DEVICES``).
    reserve : int or str, default 0
        Bytes to reserve in the pool up front (dask-cuda's ``rmm_pool_size``):
        allocated and freed once at setup, and kept by the release threshold.
        A string such as ``"4GiB"`` is read by ``dask.utils.parse_bytes``.
    release_threshold : int or str, optional
        Unused bytes the pool keeps at synchronization points. Default: all
        of them (``2**64 - 1``), as RMM's and CuPy's pools keep what they
        grew to. At least ``reserve``, rounded up by the driver's chunks
        (32 MiB): a pool holding more than its threshold gives whole unused
        chunks back.
    max_size : int or str, default 0
        Most bytes the pool may reserve (0: no limit).
    cache : bool, default True
        A block cache in front of the pool (see "Caching" on the pools page).
    cache_limit : int or str, optional
        Most bytes the cache holds (the pool's default if not given).
    pinned : bool, default True
        Also route CuPy's pinned host memory through the process's pinned pool.
    cupy : bool, optional
        Install the pool as CuPy's allocator: ``None`` (default) where CuPy
        imports, ``True`` to require CuPy (setup fails without it), ``False``
        never.
    metrics : bool, default True
        Publish the worker's ledger as worker metrics (``cuda_memkit_bytes``,
        ``cuda_memkit_cached_bytes``, ``cuda_memkit_live``: the dashboard's
        worker table shows them) and, where ``prometheus_client`` imports,
        as the Prometheus gauges ``cuda_memkit_bytes{kind, device}``,
        ``cuda_memkit_cached_bytes{kind, device}`` and
        ``cuda_memkit_live_allocations{kind, device}`` on the worker's
        ``/metrics`` page.

    Raises
    ------
    TypeError, ValueError
        For bad options, when the plugin is made (before any worker sees it).

    Notes
    -----
    Registering a plugin again replaces the workers' plugin: the old one is
    torn down first. Teardown (``client.unregister_worker_plugin("cuda_memkit")``,
    :func:`unregister`, or the worker closing) restores CuPy's previous allocators, writes what
    the worker still holds to its log (a warning, with allocation stacks
    where ``CUDA_MEMKIT_LEAK_REPORT=1`` recorded them) and closes the pool as
    ``close(force=True)`` does: memory still in use stays valid until it is
    freed.

    Examples
    --------
    >>> from distributed import Client, LocalCluster
    >>> from cuda_memkit.dask import MemkitPlugin, memory_stats, unregister
    >>> cluster = LocalCluster(n_workers=1, processes=False, dashboard_address=None)
    >>> client = Client(cluster)
    >>> _ = client.register_plugin(MemkitPlugin(reserve="64MiB"))
    >>> stats = memory_stats(client)       # {address: MemoryStats}
    >>> leaks = unregister(client)         # {address: WorkerLeaks}
    >>> client.close(); cluster.close()
    >>> [type(s).__name__ for s in stats.values()]
    ['MemoryStats']
    >>> [type(report).__name__ for report in leaks.values()]
    ['WorkerLeaks']

    (With ``processes=False`` the worker runs in this process: its ledger,
    and so its statistics and leak report, are this process's, with all it
    holds. In a process cluster each worker's are its own.)
    """

    name = PLUGIN_NAME

    def __init__(self, *, device: int = 0, reserve: int | str = 0,
                 release_threshold: int | str | None = None, max_size: int | str = 0,
                 cache: bool = True, cache_limit: int | str | None = None,
                 pinned: bool = True, cupy: bool | None = None, metrics: bool = True) -> None:
        self.device = check_nonneg(check_int(device, "device"), "device")
        self.reserve = _size_option(reserve, "reserve")
        self.release_threshold = (KEEP_ALL if release_threshold is None
                                  else _size_option(release_threshold, "release_threshold"))
        if self.release_threshold < self.reserve:
            raise ValueError(f"release_threshold ({self.release_threshold}) must be at least "
                             f"reserve ({self.reserve}), or the reserve goes back at once")
        self.max_size = _size_option(max_size, "max_size")
        if self.max_size and self.max_size < self.reserve:
            raise ValueError(f"max_size ({self.max_size}) is smaller than reserve "
                             f"({self.reserve})")
        self.cache = _flag(cache, "cache")
        self.cache_limit = None if cache_limit is None else _size_option(cache_limit,
                                                                          "cache_limit")
        if self.cache_limit is not None and not self.cache:
            raise ValueError("cache_limit needs cache=True")
        self.pinned = _flag(pinned, "pinned")
        if cupy is not None and not isinstance(cupy, bool):
            raise TypeError(f"cupy must be a bool or None, not {type(cupy).__name__}")
        self.cupy = cupy
        self.metrics = _flag(metrics, "metrics")
        # Set in the worker by setup(); a pickled plugin carries only the options above.
        self._pool: MemoryPool | None = None
        self._restore: Callable[[], None] | None = None
        self._collector: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_pool=None, _restore=None, _collector=None)
        return state

    def __repr__(self) -> str:
        return (f"MemkitPlugin(device={self.device}, reserve={self.reserve}, "
                f"release_threshold={self.release_threshold}, cache={self.cache})")

    @property
    def pool(self) -> MemoryPool | None:
        """The worker's device pool (in the worker, after :meth:`setup`), else ``None``."""
        return self._pool

    # -- in the worker -------------------------------------------------------------------
    def setup(self, worker: Worker) -> None:
        """Make the worker's pool, reserve memory, install the CuPy allocators, publish metrics."""
        import cuda_memkit as cm

        from ._core._resource import account

        options: dict[str, Any] = {"release_threshold": self.release_threshold,
                                   "max_size": self.max_size, "cache": self.cache}
        if self.cache_limit is not None:
            options["cache_limit"] = self.cache_limit
        pool = cm.MemoryPool(self.device, **options)
        try:
            if self.reserve:
                # One allocation of the whole reserve, given back to the driver pool, which
                # keeps it (release threshold >= reserve): later allocations find it there.
                pool.allocate(self.reserve, stream=None).free()
                pool.empty_cache()
                cm.Device(self.device).synchronize()
                # The reserve is free memory of the pool: its allocation is no peak of the worker.
                account("pool", self.device, pool.handle).reset_peak()
            self._restore = self._install_cupy(pool)
        except BaseException:
            pool.close(force=True)
            raise
        self._pool = pool
        if self.metrics:
            for name, fn in _metric_functions().items():
                worker.metrics[name] = fn
            self._collector = _register_prometheus()
        logger.info("cuda_memkit: worker %s allocates from %r", worker.address, pool)

    def _install_cupy(self, pool: MemoryPool) -> Callable[[], None] | None:
        if self.cupy is False:
            return None
        try:
            import cupy
        except ImportError:
            if self.cupy:
                raise
            return None
        from .allocators import cupy_allocator, cupy_pinned_allocator

        previous = cupy.cuda.get_allocator()
        cupy.cuda.set_allocator(cupy_allocator(pool, cache=self.cache))
        if self.pinned:
            cupy.cuda.set_pinned_memory_allocator(cupy_pinned_allocator(cache=self.cache))

        def restore() -> None:
            cupy.cuda.set_allocator(previous)
            if self.pinned:  # CuPy has no getter for its pinned allocator: back to its pool
                cupy.cuda.set_pinned_memory_allocator(
                    cupy.get_default_pinned_memory_pool().malloc)

        return restore

    def teardown(self, worker: Worker) -> None:
        """Restore CuPy's allocators, report what the worker still holds, close the pool."""
        if self._restore is not None:
            self._restore()
            self._restore = None
        for name in METRICS:
            worker.metrics.pop(name, None)
        if self._collector is not None:
            _unregister_prometheus(self._collector)
            self._collector = None
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.empty_cache()  # cached blocks are free memory, not the worker's
        report = worker_leaks(f"cuda_memkit leak report of worker {worker.address}")
        _last_report[worker.address] = report
        if report:
            logger.warning("%s", report.text)
        else:
            logger.info("%s", report.text)
        if pool is not None:
            pool.close(force=True)  # live memory stays valid; the pool goes once it is freed


def worker_leaks(title: str) -> WorkerLeaks:
    """Every live allocation of this process's ledger, as a :class:`WorkerLeaks`."""
    from ._core._resource import live_allocations
    from ._observability._leak_report import format_leaks

    entries = live_allocations()
    allocations = tuple({"kind": a.kind, "device": a.device, "pool": a.pool, "nbytes": n}
                        for a, _key, n in entries)
    text = (format_leaks(title, entries) if entries
            else f"{title}: no memory left allocated")
    return WorkerLeaks(allocations, text)


# -- metrics ---------------------------------------------------------------------------------

def _ledger_totals() -> tuple[int, int, int]:
    from ._observability._stats import memory_stats as local_stats

    s = local_stats()
    return s.current, s.cached, s.live


def _metric_functions() -> dict[str, Callable[[Any], int]]:
    """Worker metrics (name -> f(worker)): scalars, so that the dashboard's table shows them."""
    return {
        "cuda_memkit_bytes": lambda worker: _ledger_totals()[0],
        "cuda_memkit_cached_bytes": lambda worker: _ledger_totals()[1],
        "cuda_memkit_live": lambda worker: _ledger_totals()[2],
    }


def _register_prometheus() -> Any:
    """A collector of the ledger's accounts in ``prometheus_client``'s registry, if it imports."""
    try:
        import prometheus_client
        from prometheus_client.core import GaugeMetricFamily
    except ImportError:
        return None

    class LedgerCollector:
        """The worker's ledger accounts as gauges, labelled by kind and device."""

        def collect(self) -> Iterator[Any]:
            from ._observability._stats import memory_stats as local_stats

            labels = ["kind", "device"]
            current = GaugeMetricFamily("cuda_memkit_bytes",
                                        "Bytes held through cuda_memkit", labels=labels)
            cached = GaugeMetricFamily("cuda_memkit_cached_bytes",
                                       "Bytes held by cuda_memkit block caches", labels=labels)
            live = GaugeMetricFamily("cuda_memkit_live_allocations",
                                     "Live cuda_memkit allocations", labels=labels)
            sums: dict[tuple[str, str], list[int]] = {}
            for s in local_stats().accounts:
                key = (s.kind, "host" if s.device is None else str(s.device))
                row = sums.setdefault(key, [0, 0, 0])
                row[0] += s.current
                row[1] += s.cached
                row[2] += s.live
            for key, (cur, cach, n) in sorted(sums.items()):
                current.add_metric(list(key), cur)
                cached.add_metric(list(key), cach)
                live.add_metric(list(key), n)
            yield current
            yield cached
            yield live

    collector = LedgerCollector()
    try:
        prometheus_client.REGISTRY.register(collector)
    except ValueError:  # another worker of this process (threads) publishes the same ledger
        return None
    return collector


def _unregister_prometheus(collector: Any) -> None:
    import prometheus_client

    prometheus_client.REGISTRY.unregister(collector)


# -- from the client ----------------------------------------------------------------------

def _worker_stats() -> MemoryStats:
    from ._observability._stats import memory_stats as local_stats

    return local_stats()


def _check_client(client: object) -> None:
    from distributed import Client

    if not isinstance(client, Client):
        raise TypeError(f"client must be a distributed.Client, not {type(client).__name__}")


def memory_stats(client: Client) -> dict[str, MemoryStats]:
    """Each worker's ledger: :func:`cuda_memkit.memory_stats` run in every worker.

    Parameters
    ----------
    client : distributed.Client
        A client of the cluster.

    Returns
    -------
    dict
        Worker address -> :class:`~cuda_memkit.MemoryStats` (``.by_kind``,
        ``.by_device``, ``.accounts``; ``.to_dict()`` for JSON).

    Raises
    ------
    TypeError
        For something that is not a ``distributed.Client``.

    Notes
    -----
    The ledger counts memory allocated through cuda_memkit, whether or not
    :class:`MemkitPlugin` is registered: with the plugin, every CuPy array of
    the worker.
    """
    _check_client(client)
    result: dict[str, MemoryStats] = client.run(_worker_stats)
    return result


def _clear_report(dask_worker: Worker) -> None:
    _last_report.pop(dask_worker.address, None)


def _teardown_report(dask_worker: Worker) -> WorkerLeaks | None:
    return _last_report.get(dask_worker.address)


def unregister(client: Client, name: str = PLUGIN_NAME) -> dict[str, WorkerLeaks | None]:
    """Tear the plugin down in every worker and return each worker's leak report.

    Parameters
    ----------
    client : distributed.Client
        A client of the cluster.
    name : str, default "cuda_memkit"
        The name the plugin was registered under.

    Returns
    -------
    dict
        Worker address -> :class:`WorkerLeaks` (falsy when the worker held
        nothing), or ``None`` for a worker the plugin never reached.

    Raises
    ------
    TypeError
        For something that is not a ``distributed.Client``.
    """
    _check_client(client)
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, not {type(name).__name__}")
    client.run(_clear_report)
    cast(Any, client).unregister_worker_plugin(name)  # untyped in distributed
    reports: dict[str, WorkerLeaks | None] = client.run(_teardown_report)
    return reports
