"""What the benchmark scripts share: the backend, raw driver results, interleaved timing.

Imported by the ``bench_*.py`` scripts (run as ``python benchmarks/bench_x.py``,
so this folder is on ``sys.path``); it puts the repository root on the path
too, for ``import cuda_memkit`` from a checkout.
"""

from __future__ import annotations

import gc
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

#: A timed loop: ``fn(n)`` runs ``n`` iterations (pairs, copies, ...).
Loop = Callable[[int], None]


def backend() -> tuple[str, bool, Any]:
    """Make device 0 current; return ``(backend name, simulated, raw driver module)``.

    The raw module is ``cuda.bindings.driver`` on a GPU and the simulator's
    twin (the same call forms) on the simulator.
    """
    import cuda_memkit as cm
    from cuda_memkit._core import _driver

    cm.Device(0).set_current()
    name = _driver.backend_name()
    if name == "sim":
        from cuda_memkit.sim import driver as raw
    else:
        from cuda.bindings import driver as raw
    return name, name == "sim", raw


def check(res: Any) -> Any:
    """Payload of a raw ``(CUresult, ...)`` tuple; raise on failure."""
    if int(res[0]):
        raise RuntimeError(f"driver call failed: {res[0]!r}")
    return res[1] if len(res) == 2 else res[1:] if len(res) > 2 else None


def measure(cases: dict[str, Loop | None], counts: dict[str, int], samples: int,
            sync: Callable[[], None], seed: int) -> dict[str, float | None]:
    """Median seconds per iteration of each case (``None`` for a case given as ``None``).

    Each sample runs every case once, ``counts[case]`` iterations, in an order
    shuffled per sample (``seed`` fixed), so that drift hits the cases alike
    and no case always follows the same one; garbage a case left behind is
    collected before the next one's timing starts. A warm-up round first
    (pools grow, caches fill).
    """
    live = {k: fn for k, fn in cases.items() if fn is not None}
    for key, fn in live.items():
        fn(max(counts[key] // 10, 2))
        sync()
    times: dict[str, list[float]] = {k: [] for k in live}
    order = list(live)
    rng = random.Random(seed)
    for _ in range(samples):
        rng.shuffle(order)
        for key in order:
            fn, n = live[key], counts[key]
            gc.collect()
            t0 = time.perf_counter()
            fn(n)
            sync()
            times[key].append((time.perf_counter() - t0) / n)
    return {k: (statistics.median(times[k]) if k in times else None) for k in cases}
