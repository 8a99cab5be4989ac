"""Steps of ``python -m cuda_memkit tour`` and checks of ``doctor``.

Each feature contributes a ``tour_step(say)`` function; this module lists them
in reading order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from . import Device, Stream, device_count
from ._core import _driver

Say = Callable[[str], None]
Step = Callable[[Say], None]


def _simulated() -> bool:
    """Timings on the simulator measure Python, not a GPU: the tour shows none there."""
    return _driver.backend_name() == "sim"


@contextmanager
def _own_pool() -> Iterator[Any]:
    """A device pool of the step's own, closed at the step's end.

    After an error it is closed as ``close(force=True)`` would: the error, not a
    pool with memory alive, is the news.
    """
    from . import MemoryPool

    pool = MemoryPool(0)
    try:
        yield pool
    except BaseException:
        pool.close(force=True)
        raise
    pool.close()


def _settle() -> None:
    """Give back what the step's buffers held, before a step closes a pool of its own.

    Waits for the copies still holding closed buffers (their release follows the copy)
    and collects the dropped objects, so that the pool closes with nothing alive.
    """
    import gc

    from ._core._inflight import wait_pending

    gc.collect()
    wait_pending()
    gc.collect()


def _core_step(say: Say) -> None:
    from . import CudaOutOfMemoryError, DeviceBuffer

    n = device_count()
    dev = Device(0)
    free, total = dev.mem_info()
    say(f"{n} device(s); device 0 is {dev.name} with {free / 2**30:.1f} of "
        f"{total / 2**30:.1f} GiB free")
    with Stream(dev) as s:
        s.synchronize()
        say(f"created, synchronised and closed stream 0x{s.handle:x}")
    try:
        DeviceBuffer.empty(1 << 60)
    except CudaOutOfMemoryError as exc:
        say(f"driver errors are typed exceptions: {type(exc).__name__}: {exc.api} "
            f"{exc.name} (also a MemoryError: {isinstance(exc, MemoryError)})")


def _pinned_step(say: Say) -> None:
    import numpy as np

    from . import DeviceBuffer, HostAllocFlags, HostBuffer, copy, register_host

    with Stream() as s, HostBuffer.empty((1024, 256), np.float32) as host, \
            DeviceBuffer.empty(host.nbytes) as dev:
        host.array[:] = np.arange(host.array.size, dtype=np.float32).reshape(host.shape)
        copy(dev, host, stream=s)
        with HostBuffer.zeros(host.shape, np.float32, flags=HostAllocFlags.PORTABLE) as back:
            copy(back, dev, stream=s)
            s.synchronize()
            same = bool((back.array == host.array).all())
        say(f"pinned {host.nbytes >> 10} KiB -> device -> pinned round trip on a stream: "
            f"{'identical' if same else 'DIFFERENT'}")
    page = np.zeros(1 << 16, np.uint8)
    with register_host(page) as reg:
        say(f"registered a {page.nbytes >> 10} KiB numpy array in place (ptr 0x{reg.ptr:x})")


def _pool_step(say: Say) -> None:
    import time

    from . import HostBuffer, MemoryPool

    with Stream() as s, MemoryPool(0, release_threshold=64 << 20) as pool, \
            MemoryPool(0, cache=True) as cached:
        bufs = [pool.allocate(1 << 20, stream=s) for _ in range(8)]
        st = pool.stats()
        say(f"8 x 1 MiB from a stream-ordered pool: used {st.used_current >> 20} MiB, "
            f"reserved {st.reserved_current >> 20} MiB")
        for b in bufs:
            b.free()
        for _ in range(100):
            cached.allocate(1 << 20, stream=s).free()
        say(f"100 allocate + free pairs through MemoryPool(cache=True): the pool reserved "
            f"{cached.stats().reserved_current >> 20} MiB, the block cache holds "
            f"{cached.cached_bytes >> 20} MiB for the next 1 MiB request on this stream")
        if not _simulated():
            for p, name in ((pool, "MemoryPool"), (cached, "MemoryPool(cache=True)")):
                s.synchronize()
                t0 = time.perf_counter()
                for _ in range(1000):
                    p.allocate(1 << 20, stream=s).free()
                s.synchronize()
                say(f"{name}: a 1 MiB allocate + free pair costs "
                    f"{(time.perf_counter() - t0) * 1e3:.2f} us")
        s.synchronize()
    with HostBuffer.pooled(4096) as h:
        h.array[:] = 3
        say(f"a 4 KiB pinned buffer from the shared pinned pool (HostBuffer.pooled): "
            f"sum {int(h.array.sum())}")


def _copy_batch_step(say: Say) -> None:
    import numpy as np

    from . import DeviceBuffer, HostBuffer, copy_batch

    n, block = 1024, 4096
    rng = np.random.default_rng(0)
    slots = rng.permutation(4 * n)[:n].astype(np.int64) * block  # scattered device slots
    with Stream() as s, HostBuffer.empty(n * block, np.uint8) as host, \
            DeviceBuffer.empty(4 * n * block) as dev, HostBuffer.zeros(block, np.uint8) as one:
        host.array[:] = np.repeat(np.arange(n) % 251, block).astype(np.uint8)
        src = np.arange(n, dtype=np.int64) * block
        copy_batch(dev, host, dst_offsets=slots, src_offsets=src,
                   sizes=np.full(n, block, np.int64), stream=s)
        k = 700
        copy_batch(one, dev, dst_offsets=[0], src_offsets=[int(slots[k])], sizes=[block],
                   stream=s)
        s.synchronize()
        ok = bool((one.array == k % 251).all())
        say(f"copy_batch: {n} blocks of {block >> 10} KiB from pinned memory to scattered "
            f"device slots in one call; block {k} read back: {'identical' if ok else 'WRONG'}")


def _make_batch(batch: int, out: Any) -> None:
    """The tour's Loader batches: a worker process fills ``out`` with the batch's number."""
    out[...] = batch


def _loader_step(say: Say) -> None:
    import numpy as np

    from . import Loader

    seen = []
    # Its own pool, so that the batches' memory goes back to the device at the end; workers
    # from a fork server, since a process that initialised CUDA has the driver's threads.
    with _own_pool() as pool:
        with Loader(_make_batch, 6, (256, 256), np.float32, workers=2, pool=pool,
                    start_method="forkserver") as loader:
            for buf in loader:
                with buf:
                    seen.append(float(buf.to_numpy(np.float32, (256, 256))[0, 0]))
        # On a GPU a batch's buffer closed while its copy from the ring may still run is
        # released once that copy is done: wait for it before the pool closes.
        _settle()
    say(f"a Loader: 2 worker processes wrote {len(seen)} batches of 256 KiB into a shared "
        f"pinned ring, each copied to the device in order: {seen}")


def _pageable_step(say: Say) -> None:
    import numpy as np

    from . import DeviceBuffer, copy, release_staging, staging_settings

    a = np.arange(16 << 20, dtype=np.float32)  # 64 MiB, plain (pageable) numpy memory
    back = np.empty_like(a)
    with DeviceBuffer.empty(a.nbytes) as dev:
        copy(dev, a)
        copy(back, dev)
    cfg = staging_settings()
    say(f"copy() of a {a.nbytes >> 20} MiB pageable numpy array and back, staged through "
        f"{cfg.buffers} pinned buffers of {cfg.chunk >> 20} MiB by {cfg.threads} thread(s): "
        f"{'identical' if np.array_equal(a, back) else 'DIFFERENT'}")
    release_staging()


def _managed_step(say: Say) -> None:
    import numpy as np

    from . import Location, ManagedBuffer, MemAdvice, MigrationPolicy, PrefetchPlan

    with Stream() as s, ManagedBuffer.zeros(8 << 20, np.uint8) as buf:
        buf.array[:] = 1  # the CPU writes through the same pointer the GPU uses
        buf.advise(MemAdvice.SET_READ_MOSTLY, offset=0, nbytes=4 << 20)
        info = buf.range_info(0, 4 << 20)
        say(f"managed 8 MiB, read-mostly advised on the first half: {info.read_mostly}")
        plan = PrefetchPlan()
        for i in range(64):
            plan.add(buf, Location.device(0), offset=i * (128 << 10), nbytes=128 << 10)
        say(f"a plan of {len(plan)} adjacent 128 KiB prefetches compiles to "
            f"{len(plan.dry_run(s))} driver call(s)")
        plan.execute(s)
        s.synchronize()
        say(f"last prefetch location of the first 8 MiB: "
            f"{buf.range_info(0, 8 << 20).last_prefetch_location}")
        policy = MigrationPolicy.prefer_host()
        say(f"{policy!r} issues {[(a.name, str(loc)) for a, loc in policy.advice]}")


def _vmm_step(say: Say) -> None:
    from . import GrowableBuffer, granularity

    g = granularity(0)
    with GrowableBuffer(1 << 30) as buf:
        ptr = buf.ptr
        for size in (8 << 20, 64 << 20, 256 << 20):
            buf.resize(size)
        say(f"granularity {g >> 20} MiB; a growable buffer went 8 -> 64 -> 256 MiB "
            f"at one address: {buf.ptr == ptr} (capacity {buf.capacity >> 20} MiB)")
        buf.resize(16 << 20)
        say(f"shrunk back to {buf.nbytes >> 20} MiB, unmapping what is not needed")


def _peer_step(say: Say) -> None:
    import numpy as np

    from . import DeviceBuffer, copy

    if device_count() < 2:
        say("one device here: copies between GPUs need two")
        return
    a = np.arange(1 << 20, dtype=np.int32)
    with DeviceBuffer.from_array(a, device=0) as src, \
            DeviceBuffer.empty(a.nbytes, device=1) as dst:
        copy(dst, src)  # enables peer access between the two on first use
        back = dst.to_numpy(np.int32, a.shape)
        peer = Device(0).can_access_peer(1)
    say(f"copied {a.nbytes >> 20} MiB from device 0 to device 1 "
        f"({'through peer access' if peer else 'staged by the driver: no peer access'}): "
        f"{'identical' if np.array_equal(a, back) else 'DIFFERENT'}")


def _observe_step(say: Say) -> None:
    from . import DeviceBuffer, HostBuffer, memory_stats, track

    with track(stacks=True) as t:
        keep = HostBuffer.empty(4096)  # still alive when the block ends: reported below
        with DeviceBuffer.empty(2 << 20):
            used = memory_stats().by_kind
            say(f"memory_stats() while a buffer of each is alive: device "
                f"{used['device'].current >> 20} MiB in {used['device'].live}, pinned "
                f"{used['pinned'].current >> 10} KiB in {used['pinned'].live}")
    live = t.live()
    say(f"track(stacks=True) recorded {len(t.events())} events; still alive at its end, "
        f"as a leak report lists them (each with its allocation stack):")
    for alloc in live:
        say(f"  {alloc.nbytes} bytes of {alloc.kind} memory at 0x{alloc.address:x}, "
            f"allocated with a stack of {len(alloc.stack or ())} frame(s)")
    keep.close()
    say("(set CUDA_MEMKIT_LEAK_REPORT=1 to get that report for everything alive at exit)")


def _frameworks_step(say: Say) -> None:
    import importlib.util

    if importlib.util.find_spec("cupy") is None:
        say("CuPy is not installed: with it, cuda_memkit.allocators.use_with_cupy() puts "
            "CuPy's allocations on a cuda_memkit pool")
        return
    if _simulated():
        say("CuPy is installed, but runs on a GPU only: on one, use_with_cupy() puts its "
            "allocations on a cuda_memkit pool")
        return
    import cupy

    from . import memory_stats
    from .allocators import use_with_cupy

    with _own_pool() as pool:
        with use_with_cupy(pool, cache=False):
            x = cupy.arange(1 << 20, dtype=cupy.float32)
            total = float((x * 2).sum())
            held = memory_stats().by_kind["pool"].live
            del x
            # CuPy's arrays (and temporaries) dropped, its work done: their memory goes back
            # to the pool before CuPy's allocator is restored and the pool closes.
            cupy.cuda.Device(0).synchronize()
            _settle()
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()
        _settle()
    say(f"CuPy on a cuda_memkit pool: a sum of 1M float32 = {total:.0f}, "
        f"{held} allocation(s) in cuda_memkit's statistics while the arrays lived")


def steps() -> list[tuple[str, Step]]:
    """Return the tour's (title, step) pairs in order."""
    return [
        ("Devices, streams and errors", _core_step),
        ("Pinned host memory and transfers", _pinned_step),
        ("Memory pools and the block cache", _pool_step),
        ("Many blocks in one call: copy_batch", _copy_batch_step),
        ("Feeding the GPU from worker processes: Loader", _loader_step),
        ("Pageable numpy arrays: staged copies", _pageable_step),
        ("Managed memory, hints and prefetch plans", _managed_step),
        ("Virtual memory: a buffer that grows in place", _vmm_step),
        ("Several GPUs: a peer copy", _peer_step),
        ("Observing memory: statistics and leak reports", _observe_step),
        ("CuPy on cuda_memkit memory", _frameworks_step),
    ]


def doctor_checks() -> list[tuple[str, Callable[[], str]]]:
    """Return (name, check) pairs; a check returns a detail string or raises."""

    def driver() -> str:
        v = int(_driver.call("cuDriverGetVersion"))
        return f"driver {v // 1000}.{v % 1000 // 10}, backend {_driver.backend_name()}"

    def devices() -> str:
        n = device_count()
        if n < 1:
            raise RuntimeError("no CUDA device")
        return f"{n} device(s)"

    def alloc() -> str:
        from ._core._context import ensure_context

        ensure_context(0)
        ptr = _driver.call("cuMemAlloc", 1 << 20)
        _driver.call("cuMemsetD8", ptr, 0, 1 << 20)
        _driver.call("cuMemFree", ptr)
        return "1 MiB device allocation, memset and free"

    def stream() -> str:
        with Stream() as s:
            s.synchronize()
        return "stream create/synchronize/destroy"

    return [("driver", driver), ("devices", devices), ("device memory", alloc),
            ("streams", stream)]
