"""Steps of ``python -m cuda_memkit tour`` and checks of ``doctor``.

Each feature contributes a ``tour_step(say)`` function; this module lists them
in reading order.
"""

from __future__ import annotations

from collections.abc import Callable

from . import _driver
from ._device import Device, Stream, device_count
from ._errors import CudaError

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


def steps() -> list[tuple[str, Step]]:
    """Return the tour's (title, step) pairs in order."""
    out: list[tuple[str, Step]] = [("Devices, streams and errors", _core_step)]
    # -- feature tour steps --
    return out


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
        from ._device import ensure_context

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
