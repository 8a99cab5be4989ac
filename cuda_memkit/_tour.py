"""Steps of ``python -m cuda_memkit tour`` and checks of ``doctor``.

Each feature contributes a ``tour_step(say)`` function; this module lists them
in reading order.
"""

from __future__ import annotations

from collections.abc import Callable

from ._core import _driver
from ._core._device import Device, device_count
from ._core._errors import CudaError
from ._core._stream import Stream

Say = Callable[[str], None]
Step = Callable[[Say], None]


def _core_step(say: Say) -> None:
    n = device_count()
    dev = Device(0)
    free, total = dev.mem_info()
    say(f"{n} device(s); device 0 is {dev.name} with {free / 2**30:.1f} of "
        f"{total / 2**30:.1f} GiB free")
    with Stream(dev) as s:
        s.synchronize()
        say(f"created, synchronised and closed stream 0x{s.handle:x}")
    try:
        _driver.call("cuMemFree", 0x1234000)
    except CudaError as exc:
        say(f"driver errors are typed exceptions: {type(exc).__name__}: {exc}")


def _pinned_step(say: Say) -> None:
    import numpy as np

    from . import DeviceBuffer, HostAllocFlags, HostBuffer, copy, register_host

    with Stream() as s, HostBuffer.empty((1024, 256), np.float32) as host, \
            DeviceBuffer.empty(host.nbytes) as dev:
        host.array[:] = np.arange(host.array.size, dtype=np.float32).reshape(host.shape)
        copy(dev, host, stream=s)
        back = HostBuffer.zeros(host.shape, np.float32, flags=HostAllocFlags.PORTABLE)
        copy(back, dev, stream=s)
        s.synchronize()
        same = bool((back.array == host.array).all())
        back.close()
        say(f"pinned {host.nbytes >> 10} KiB -> device -> pinned round trip on a stream: "
            f"{'identical' if same else 'DIFFERENT'}")
    page = np.zeros(1 << 16, np.uint8)
    with register_host(page) as reg:
        say(f"registered a {page.nbytes >> 10} KiB numpy array in place (ptr 0x{reg.ptr:x})")


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


def _pool_step(say: Say) -> None:
    import time

    import numpy as np

    from . import HostBuffer, Location, MemoryPool

    with Stream() as s, MemoryPool(0, release_threshold=64 << 20) as pool:
        bufs = [pool.allocate(1 << 20, stream=s) for _ in range(8)]
        st = pool.stats()
        say(f"8 x 1 MiB from a device pool: used {st.used_current >> 20} MiB, "
            f"reserved {st.reserved_current >> 20} MiB")
        for b in bufs:
            b.free()
        s.synchronize()
        t0 = time.perf_counter()
        for _ in range(1000):
            pool.allocate(1 << 20, stream=s).free()
        s.synchronize()
        say(f"allocate+free pair: {(time.perf_counter() - t0) * 1e3:.2f} us each "
            f"(stream-ordered, memory reused)")
        pool.trim()
    with MemoryPool(0, location=Location.host()) as pinned_pool:
        with HostBuffer.empty(1024, np.float32, pool=pinned_pool) as h:
            h.array[:] = 3.0
            say(f"a 4 KiB pinned buffer from a host pool: sum {float(h.array.sum())}")


def steps() -> list[tuple[str, Step]]:
    """Return the tour's (title, step) pairs in order."""
    return [
        ("Devices, streams and errors", _core_step),
        ("Pinned host memory and transfers", _pinned_step),
        ("Managed memory, hints and prefetch plans", _managed_step),
        ("Virtual memory: a buffer that grows in place", _vmm_step),
        ("Stream-ordered memory pools", _pool_step),
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
