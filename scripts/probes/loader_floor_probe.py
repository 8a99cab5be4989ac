"""Where a Loader's time goes against its floor: its delivery on other rings, its waits, the slots.

    python scripts/probes/loader_floor_probe.py [--mib 64] [--rounds 9] [--instances 2] [--gil]
                                                [--extra-slots K] [--numa] [--bind-node N]
                                            [--thp] [--kinds floor,loader,...]

Measured interleaved (``harness.measure``, one pass of ``n`` batches per sample) on
rings made in turns, ``--instances`` of each kind:

* ``floor``: a slot ring (``Loader(output="slot")``) whose slots the consumer copies with
  the raw driver, waiting for each copy before giving its slot back (bench_loader's floor);
* ``loader``: ``Loader(...)`` as shipped (a device buffer per batch);
* ``slot-made``: a slot ring given the pool afterwards, so that ``Loader._deliver`` runs
  the buffer path: the same code as ``loader`` on a ring made the other way;
* ``copy_to_new+wait``: a slot ring; the consumer runs ``copy_to_new`` and waits for it;
* ``raw, lagged``: a slot ring; a raw copy and an event per slot, each slot given back
  once its event is done, checked at the next slot (no thread, no wait);
* with ``--extra-slots K``: ``loader +K`` and ``floor +K``, the same on rings with ``K``
  more slots than the Loader makes (room for copies in flight, no more grants per worker);
* with ``--bind-node N``: ``floor @N`` and ``loader @N``, the same on rings whose pages
  were bound to NUMA node ``N`` (``mbind``) before the driver pinned them;
* with ``--thp``: ``floor thp`` and ``loader thp``, on rings whose mapping asked for
  transparent huge pages (``madvise(MADV_HUGEPAGE)``) before the driver pinned them.

``--numa`` prints the machine's NUMA nodes, the GPU's host node, and on which nodes each
ring's pages lie (``/proc/self/numa_maps``). ``--kinds`` keeps only the kinds named.

For each case it prints batches/s, the ratio to the floors' median, the consumer's wait
for a ready slot per batch (time in ``RingCore.wait``), and the mean number of slots in
each state (free, granted, filling, ready, lent) over the pass, sampled every 0.2 ms by a
thread reading ``ring.stats()``. ``--gil`` first checks that the driver's waits release
the interpreter's lock (another thread's Python loop rate during them). Needs a GPU for
the numbers; on the simulator it runs small and says so. Behind the decision record's
entry "The Loader's row against its floor".
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_loader as bl  # noqa: E402
import numpy as np  # noqa: E402
from harness import backend, check, measure  # noqa: E402

import cuda_memkit as cm  # noqa: E402
from cuda_memkit._core._inflight import reap_pending  # noqa: E402
from cuda_memkit._host._shared_ring import copy_to_new, ring_core  # noqa: E402
from cuda_memkit._loading import _loader  # noqa: E402

STATES = ("free", "granted", "filling", "ready", "lent")
EVENT_DISABLE_TIMING = 0x2
SYS_MBIND = 237  # x86_64
MPOL_BIND = 2
MADV_HUGEPAGE = 14


def numa_nodes() -> str:
    """The machine's NUMA nodes and their CPUs, and the CPUs this process may run on."""
    base = "/sys/devices/system/node"
    nodes = sorted(d for d in os.listdir(base) if d.startswith("node")) if os.path.isdir(
        base) else []
    parts = []
    for d in nodes:
        with open(os.path.join(base, d, "cpulist")) as f:
            parts.append(f"{d}: cpus {f.read().strip()}")
    return "; ".join(parts) + f"; allowed cpus {sorted(os.sched_getaffinity(0))}"


def pages_by_node(ptr: int) -> str:
    """Where the pages of the mapping at ``ptr`` lie (``/proc/self/numa_maps``: ``N0=...``)
    and how much of it is mapped by huge pages (``/proc/self/smaps``)."""
    out = "(mapping not found)"
    with open("/proc/self/numa_maps") as f:
        for line in f:
            fields = line.split()
            if int(fields[0], 16) == ptr:
                out = " ".join(x for x in fields[1:] if not x.startswith("file="))
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                inside = int(head.split("-")[0], 16) == ptr
            elif inside and head in ("Rss:", "ShmemPmdMapped:", "FilePmdMapped:"):
                out += f" {head}{line.split()[1]}kB"
    return out


def advised_registration(node: int | None, huge: bool) -> Callable[..., Any]:
    """``register_host`` that first binds the array's pages to NUMA ``node`` and/or asks
    for transparent huge pages (before the pinning faults the pages in)."""
    import ctypes

    from cuda_memkit._host import _ring_core
    plain = _ring_core.register_host
    libc = ctypes.CDLL(None, use_errno=True)

    def register(arr: Any, **kw: Any) -> Any:
        addr, size = ctypes.c_void_p(arr.ctypes.data), ctypes.c_size_t(arr.nbytes)
        if node is not None:
            mask = ctypes.c_ulong(1 << node)
            if libc.syscall(SYS_MBIND, addr, size, MPOL_BIND, ctypes.byref(mask),
                            ctypes.c_ulong(64), 0) != 0:
                raise OSError(ctypes.get_errno(), "mbind failed")
        if huge and libc.madvise(addr, size, MADV_HUGEPAGE) != 0:
            raise OSError(ctypes.get_errno(), "madvise(MADV_HUGEPAGE) failed")
        return plain(arr, **kw)

    return register


def thp_settings() -> str:
    """The kernel's transparent huge page settings (anonymous and shared memory)."""
    out = []
    for name in ("enabled", "shmem_enabled", "defrag"):
        try:
            with open(f"/sys/kernel/mm/transparent_hugepage/{name}") as f:
                out.append(f"{name}: {f.read().strip()}")
        except OSError:
            out.append(f"{name}: (not readable)")
    return "; ".join(out)


def gil_check(raw: Any, nbytes: int) -> None:
    """Another thread's loop rate while this one sleeps or waits in the driver."""
    host = int(check(raw.cuMemHostAlloc(nbytes, 0)))
    dev = int(check(raw.cuMemAlloc(nbytes)))
    stream = int(check(raw.cuStreamCreate(1)))

    def queue() -> None:
        for _ in range(20):
            check(raw.cuMemcpyHtoDAsync(dev, host, nbytes, stream))

    def stream_sync() -> None:
        queue()
        check(raw.cuStreamSynchronize(stream))

    def event_sync() -> None:
        queue()
        ev = check(raw.cuEventCreate(0x1 | EVENT_DISABLE_TIMING))  # blocking sync
        check(raw.cuEventRecord(ev, stream))
        check(raw.cuEventSynchronize(ev))
        check(raw.cuEventDestroy(ev))

    for label, fn in (("sleep 25 ms", lambda: time.sleep(0.025)),
                      ("cuStreamSynchronize", stream_sync),
                      ("cuEventSynchronize (blocking sync)", event_sync)):
        stop = threading.Event()
        count = [0]

        def spin(stop: threading.Event = stop, count: list[int] = count) -> None:
            while not stop.is_set():
                count[0] += 1

        t = threading.Thread(target=spin)
        t.start()
        time.sleep(0.01)
        c0, t0 = count[0], time.perf_counter()
        fn()
        rate = (count[0] - c0) / (time.perf_counter() - t0)
        stop.set()
        t.join()
        print(f"GIL: another thread's loop during {label:36} {rate / 1e6:7.2f} M/s")
    check(raw.cuStreamDestroy(stream))
    check(raw.cuMemFree(dev))
    check(raw.cuMemFreeHost(host))


class Sampler:
    """A thread that reads a ring's slot counts every 0.2 ms while a pass runs."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = dict.fromkeys(STATES, 0.0)
        self.samples = 0

    def during(self, ring: Any, fn: Callable[[], None]) -> None:
        stop = threading.Event()

        def run() -> None:
            while not stop.is_set():
                counts = ring.stats()
                for k in STATES:
                    self.sums[k] += counts[k]
                self.samples += 1
                time.sleep(0.0002)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        try:
            fn()
        finally:
            stop.set()
            t.join()

    def means(self) -> str:
        n = max(self.samples, 1)
        return " ".join(f"{k} {self.sums[k] / n:4.1f}" for k in STATES)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=float, default=64)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--gil", action="store_true")
    ap.add_argument("--extra-slots", type=int, default=0)
    ap.add_argument("--numa", action="store_true")
    ap.add_argument("--bind-node", type=int, default=None)
    ap.add_argument("--thp", action="store_true")
    ap.add_argument("--kinds", default="")
    args = ap.parse_args()
    _name, simulated, raw = backend()
    mib, rounds, workers = args.mib, args.rounds, args.workers
    if simulated:
        mib, rounds, workers = 0.25, 2, 2
        print("SIMULATED: the simulator's numbers, not a GPU's")
    nbytes = int(mib * (1 << 20))
    if args.gil:
        gil_check(raw, nbytes)
    if args.numa:
        attr = getattr(raw, "CUdevice_attribute", None)
        host_node = ("unknown (the simulator)" if attr is None else check(
            raw.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, 0)))
        print(f"NUMA: {numa_nodes()}; the GPU's host node {host_node}")
        print(f"THP: {thp_settings()}")
    n = bl.batch_count(nbytes, simulated)
    src = np.empty((2, nbytes), np.uint8)
    src[0].fill(1)
    src[1].fill(2)
    make = functools.partial(bl.copy_batch, src)
    stream = int(check(raw.cuStreamCreate(1)))
    dev = int(check(raw.cuMemAlloc(nbytes)))
    pool = cm.MemoryPool.default(0, cache=True)

    def loader(**kw: Any) -> Any:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", bl.FORK_WARNING, DeprecationWarning)
            return cm.Loader(make, n, nbytes, workers=workers, start_method="fork", **kw)

    def roomier(**kw: Any) -> Any:
        """A Loader whose ring has ``--extra-slots`` more slots (the grants per worker stay)."""
        plain = _loader.unstarted_ring

        def more(slots: int, *a: Any, **k: Any) -> Any:
            return plain(slots + args.extra_slots, *a, **k)

        _loader.unstarted_ring = more
        try:
            return loader(**kw)
        finally:
            _loader.unstarted_ring = plain

    def slot_made() -> Any:
        ld = loader(output="slot", stream=stream)
        ld._pool = pool  # its _deliver now runs the buffer path
        return ld

    def iterate(ld: Any) -> None:
        for _buf in ld:
            pass
        check(raw.cuCtxSynchronize())

    def floor(ld: Any) -> None:
        for slot in ld:
            check(raw.cuMemcpyHtoDAsync(dev, slot.ptr, nbytes, stream))
            check(raw.cuStreamSynchronize(stream))
            slot.close()

    def copy_wait(ld: Any) -> None:
        for slot in ld:
            buf = copy_to_new(slot, pool, stream)
            check(raw.cuStreamSynchronize(stream))
            reap_pending()
            slot.close()
            buf.close()

    def lagged(ld: Any) -> None:
        held: collections.deque[tuple[Any, Any]] = collections.deque()
        for slot in ld:
            check(raw.cuMemcpyHtoDAsync(dev, slot.ptr, nbytes, stream))
            ev = check(raw.cuEventCreate(EVENT_DISABLE_TIMING))
            check(raw.cuEventRecord(ev, stream))
            held.append((ev, slot))
            while held and int(raw.cuEventQuery(held[0][0])[0]) == 0:
                done, s = held.popleft()
                s.close()
                check(raw.cuEventDestroy(done))
        check(raw.cuStreamSynchronize(stream))
        for done, s in held:
            s.close()
            check(raw.cuEventDestroy(done))

    kinds: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {
        "floor": (lambda: loader(output="slot"), floor),
        "loader": (lambda: loader(stream=stream), iterate),
        "slot-made": (slot_made, iterate),
        "copy_to_new+wait": (lambda: loader(output="slot"), copy_wait),
        "raw, lagged": (lambda: loader(output="slot"), lagged),
    }
    if args.extra_slots:
        kinds[f"floor +{args.extra_slots}"] = (lambda: roomier(output="slot"), floor)
        kinds[f"loader +{args.extra_slots}"] = (lambda: roomier(stream=stream), iterate)
    def advised(node: int | None, huge: bool, **kw: Any) -> Any:
        from cuda_memkit._host import _ring_core
        plain = _ring_core.register_host
        _ring_core.register_host = advised_registration(node, huge)
        try:
            return loader(**kw)
        finally:
            _ring_core.register_host = plain

    variants: list[tuple[str, int | None, bool]] = []
    if args.bind_node is not None:
        variants.append((f"@{args.bind_node}", args.bind_node, False))
    if args.thp:
        variants.append(("thp", None, True))
    for label, node, huge in variants:
        kinds[f"floor {label}"] = (functools.partial(advised, node, huge, output="slot"), floor)
        kinds[f"loader {label}"] = (functools.partial(advised, node, huge, stream=stream),
                                    iterate)
    if args.kinds:
        keep = args.kinds.split(",")
        kinds = {k: v for k, v in kinds.items() if k.split(" ")[0] in keep or k in keep}
    rings: dict[str, Any] = {}
    for k in range(args.instances):
        for kind, (made, _run) in kinds.items():
            rings[f"{kind} #{k}"] = made()
    placement = {key: pages_by_node(ring_core(ld.ring).segment.ptr) if args.numa else ""
                 for key, ld in rings.items()}
    waits: dict[str, list[float]] = {key: [] for key in rings}
    samplers = {key: Sampler() for key in rings}

    def case(key: str) -> Callable[[], None]:
        ld = rings[key]
        run = kinds[key.split(" #")[0]][1]
        core = ring_core(ld.ring)
        plain_wait = core.wait

        def timed_wait(*a: Any, **kw: Any) -> int:
            t0 = time.perf_counter()
            try:
                s: int = plain_wait(*a, **kw)
                return s
            finally:
                waits[key].append(time.perf_counter() - t0)

        core.wait = timed_wait
        return lambda: samplers[key].during(ld.ring, functools.partial(run, ld))

    cases = {key: case(key) for key in rings}
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", bl.FORK_WARNING, DeprecationWarning)
            loops = {k: functools.partial(bl._passes, fn) for k, fn in cases.items()}
            med = measure(loops, dict.fromkeys(cases, 1), rounds, lambda: None, 5)
    finally:
        for ld in rings.values():
            ld.close()
        check(raw.cuMemFree(dev))
        check(raw.cuStreamDestroy(stream))
    floors = statistics.median(t for k, t in med.items() if k.startswith("floor #") and t)
    print(f"{mib:g} MiB batches, {n} per pass, {workers} workers, {rounds} rounds; "
          f"floor (median of its rings) {n / floors:.1f} batches/s")
    print(f"{'case':22} {'batches/s':>9} {'x floor':>8} {'wait/batch':>11}  mean slots")
    for key, t in med.items():
        if t is None:
            continue
        wait = sum(waits[key]) / max(len(waits[key]), 1) * 1e3
        print(f"{key:22} {n / t:9.1f} {floors / t:8.3f} {wait:8.3f} ms  "
              f"{samplers[key].means()}")
        if args.numa:
            print(f"{'':22} pages: {placement[key]}")


if __name__ == "__main__":
    main()
