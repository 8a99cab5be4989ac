"""Write docs/benchmarks.md from an unpacked gpu-check results folder.

    python scripts/bench_report.py RESULTS_DIR > docs/benchmarks.md

RESULTS_DIR is ``results.tar.gz`` of ``scripts/gpu-check`` unpacked: its
``machine.txt`` and ``bench_*.log`` tables are quoted verbatim.
"""

from __future__ import annotations

import pathlib
import sys

INTRO = {
    "bench_driver": ("Driver gateway",
                     "Per-call cost of `_driver.call` against the raw binding, and import time. "
                     "Targets: <= 0.3 us added per call; `import cuda_memkit` <= 1.2x "
                     "`import cuda.bindings.driver`."),
    "bench_pinned": ("Pinned host memory",
                     "256 MiB transfers through `copy()` against raw `cuMemcpy*Async` on raw "
                     "pinned memory, and `HostBuffer` allocation against raw "
                     "`cuMemHostAlloc`/`cuMemFreeHost`. Targets: >= 0.97x raw bandwidth both "
                     "ways; allocation within 5 % of raw."),
    "bench_managed": ("Managed memory prefetch",
                      "512 MiB of managed memory prefetched to the GPU as one range, as "
                      "`PrefetchPlan`s of 64 x 8 MiB and 4096 x 128 KiB entries, and as raw "
                      "loops / raw batch calls of the same entries. Target: the plans within "
                      "1.1x of the whole-range prefetch."),
    "bench_vmm": ("Virtual memory",
                  "Growing a `GrowableBuffer` by one 32 MiB chunk at buffer sizes from 32 MiB "
                  "to 8 GiB, against raw create+map+set-access of one chunk and "
                  "cuMemAlloc+copy+free. Target: <= 1.2x raw per chunk, flat in buffer size."),
    "bench_pool": ("Memory pools",
                   "Allocate+free pairs from pools against raw calls, CuPy, cuda.core and "
                   "torch in the same run. Targets: 1 MiB pair <= 1.25x raw and faster than "
                   "CuPy, cuda.core and torch; 4 KiB pinned pair no slower than CuPy's pinned "
                   "pool."),
}


def main() -> None:
    folder = pathlib.Path(sys.argv[1])
    out = ["# Benchmarks", "",
           "Measured on the lent H100 by `scripts/gpu-check` (all benchmarks in one run; "
           "every table compares against raw `cuda.bindings` and the other libraries "
           "measured in that same run). Re-run with `bash scripts/gpu-check bench` on a "
           "GPU machine; each script also runs on the simulator (`--quick`), where it labels "
           "its numbers as simulated.", ""]
    machine = folder / "machine.txt"
    if machine.exists():
        out += ["## Machine", "", "```text", machine.read_text().strip(), "```", ""]
    for name, (title, text) in INTRO.items():
        log = folder / f"{name}.log"
        if not log.exists():
            continue
        lines = [ln for ln in log.read_text().splitlines() if "Warning" not in ln
                 and not ln.startswith("  main()")]
        out += [f"## {title}", "", text, "", f"`python benchmarks/{name}.py`", "",
                "```text", *lines, "```", ""]
    print("\n".join(out))


if __name__ == "__main__":
    main()
