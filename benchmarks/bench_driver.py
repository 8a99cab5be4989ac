"""Gateway overhead per driver call and import time, against raw cuda.bindings.

    python benchmarks/bench_driver.py [--json PATH] [--quick]

Targets: <= 0.3 us added per call; ``import cuda_memkit`` <= 1.2x
``import cuda.bindings.driver``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import timeit

from harness import ROOT, backend


def per_call_us(a, b, number: int, repeat: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Best-of-``repeat`` time per call (us) of ``a`` and ``b``, timed alternately."""
    ta, tb = [], []
    for _ in range(repeat):
        ta.append(timeit.timeit(a, number=number))
        tb.append(timeit.timeit(b, number=number))
    return min(ta) / number * 1e6, min(tb) / number * 1e6


def _cumulative_us(stmt: str, module: str, env: dict[str, str]) -> int:
    """Import time (us) of ``stmt`` in a fresh process, from ``-X importtime``.

    Sums the cumulative times of the top-level imports named in ``module``
    (comma-separated), or of every top-level import when ``module`` is ``"*"``.
    """
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", stmt], env=env,
                         capture_output=True, text=True, check=True)
    total = 0
    wanted = module.split(",")
    for line in out.stderr.splitlines():
        parts = line.split("|")
        if len(parts) != 3 or not parts[1].strip().isdigit() or parts[2].startswith("  "):
            continue
        if module == "*" or parts[2].strip() in wanted:
            total += int(parts[1])
    return total


def import_times(runs: int) -> tuple[float, float, float]:
    """Median cumulative import time (ms) of the bindings, cuda_memkit, and everything.

    Measured with ``python -X importtime`` in fresh processes, so interpreter
    start-up noise does not enter; the three statements alternate.
    """
    env = {**os.environ, "PYTHONPATH": ROOT}
    cases = {
        "bindings": ("import cuda.bindings.driver", "cuda.bindings.driver"),
        "memkit": ("import cuda_memkit", "cuda_memkit"),
        "memkit_all": ("import cuda_memkit as c; [getattr(c, n) for n in c.__all__]", "*"),
        "startup": ("pass", "*"),  # what every interpreter imports anyway
    }
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(runs):
        for key, (stmt, module) in cases.items():
            samples[key].append(_cumulative_us(stmt, module, env) / 1e3)
    startup = statistics.median(samples["startup"])
    return (statistics.median(samples["bindings"]), statistics.median(samples["memkit"]),
            statistics.median(samples["memkit_all"]) - startup)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()

    from cuda_memkit._core import _driver

    backend_name, simulated, raw = backend()
    number = 20_000 if args.quick else 200_000
    repeat = 5 if args.quick else 21
    rows = []
    for api in ("cuDriverGetVersion", "cuCtxGetCurrent"):
        fn = getattr(raw, api)
        r, g = per_call_us(fn, lambda api=api: _driver.call(api), number, repeat)
        rows.append({"case": f"{api} per call", "raw_us": r, "memkit_us": g,
                     "added_us": g - r, "ratio": g / r, "target": "added <= 0.3 us",
                     "ok": g - r <= 0.3})
    runs = 5 if args.quick else 15
    base, ours, every = import_times(runs)
    rows.append({"case": "import cuda_memkit (-X importtime)", "raw_ms": base, "memkit_ms": ours,
                 "ratio": ours / base, "target": "<= 1.2x", "ok": ours / base <= 1.2})
    rows.append({"case": "import + load every feature module", "raw_ms": base,
                 "memkit_ms": every, "ratio": every / base, "target": "info", "ok": True})

    label = " (SIMULATED backend: per-call numbers are the simulator's)" if simulated else ""
    print(f"bench_driver on backend {backend_name}{label}")
    print(f"{'case':38} {'raw':>10} {'cuda_memkit':>12} {'added':>9} {'ratio':>7}  target")
    for row in rows:
        if "raw_us" in row:
            print(f"{row['case']:38} {row['raw_us']:8.3f}us {row['memkit_us']:10.3f}us "
                  f"{row['added_us']:7.3f}us {row['ratio']:6.2f}x  {row['target']}"
                  f" {'OK' if row['ok'] else 'MISS'}")
        else:
            print(f"{row['case']:38} {row['raw_ms']:8.1f}ms {row['memkit_ms']:10.1f}ms "
                  f"{'':>9} {row['ratio']:6.2f}x  {row['target']}"
                  f"{'' if row['target'] == 'info' else (' OK' if row['ok'] else ' MISS')}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"backend": backend_name, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
