"""Does CuPy keep its callers' frames alive? Run it with and without compute-sanitizer.

    python scripts/cupy_frames_under_sanitizer.py
    compute-sanitizer --tool memcheck python scripts/cupy_frames_under_sanitizer.py

Plain CuPy: cuda_memkit is not imported. Each step runs a small function,
collects garbage, then counts that function's frames still alive after it
returned and the references to them the garbage collector can see (what an
H100 showed is in docs/decisions.md, "compute-sanitizer runs without host
backtraces"). ``tests/_sanitizer.py`` is what the suite does about it. Exits 0
when no frame is kept, 1 otherwise.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from types import FrameType

import cupy


def _empty() -> None:
    x = cupy.empty(1 << 20, dtype=cupy.float32)  # noqa: F841


def _arange() -> None:
    x = cupy.arange(1 << 20, dtype=cupy.float32)  # noqa: F841


def _multiply() -> None:
    x = cupy.empty(1 << 20, dtype=cupy.float32)
    y = x * 3  # noqa: F841


def _fft() -> None:
    x = cupy.fft.fft(cupy.ones(64, dtype=cupy.complex64))  # noqa: F841


def kept(fn: Callable[[], None]) -> tuple[int, int]:
    """Run ``fn``; its frames alive afterwards, and how many refer to them visibly."""
    fn()
    gc.collect()
    frames = [o for o in gc.get_objects() if type(o) is FrameType and o.f_code is fn.__code__]
    visible = sum(1 for r in gc.get_referrers(*frames) if r is not frames) if frames else 0
    return len(frames), visible


def main() -> int:
    print(f"CuPy {cupy.__version__}, Python {sys.version.split()[0]}")
    print(f"{'step':<10} {'frames kept':>11} {'visible referrers':>17}")
    total = 0
    for fn in (_empty, _arange, _multiply, _fft, _arange):
        n, visible = kept(fn)
        total += n
        print(f"{fn.__name__.lstrip('_'):<10} {n:>11} {visible:>17}")
    pool = cupy.get_default_memory_pool().used_bytes()
    print(f"CuPy pool bytes in use at the end: {pool}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
