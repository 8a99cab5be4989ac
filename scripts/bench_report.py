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
                   "torch in the same run. Targets (issue 22): the `MemoryPool(cache=True)` "
                   "1 MiB pair at most CuPy's caching `MemoryPool().malloc` pair and ahead of "
                   "cuda.core and torch; the uncached pair <= 1.35x the raw pair; "
                   "`HostBuffer.pooled(4096).close()` <= 0.8x CuPy's pinned pool. Each "
                   "target row carries the pure-Python floor of its kind (column `floor "
                   "us`: not memkit, the thinnest wrapper with the same API) measured in "
                   "the same run."),
    "bench_transfers": ("Many blocks and pageable arrays",
                        "Scattered blocks pinned->device through `copy_batch` against a raw "
                        "loop, a raw batch call and one contiguous copy; 1 GiB pageable "
                        "arrays through staged `copy()` against the driver's path, "
                        "register+copy, torch and CuPy; 4096-entry prefetch plans built "
                        "from arrays against the whole-range prefetch."),
    "bench_frameworks": ("CuPy and numba adaptors",
                         "The 1 MiB pair through CuPy's own entry point under CuPy's "
                         "allocators and memkit's adaptor (cached by default, and "
                         "uncached), `cupy.empty`, a workload, and the pinned allocator. "
                         "Targets (issue 22): workload <= 1.0x CuPy's `MemoryPool` and <= "
                         "0.92x `malloc_async`; `cupy.empty(1 MiB)` <= 1.05x CuPy's "
                         "`MemoryPool`; the `cupy.cuda.alloc` pair <= 1.35x CuPy's "
                         "`MemoryPool` and <= 0.5x `malloc_async`; the pinned adaptor <= "
                         "1.2x CuPy's pinned pool. The floor column is the pure-Python "
                         "cached allocator of the same run: not memkit, a yardstick."),
    "bench_workload": ("A CuPy training step",
                       "A 2-layer MLP forward+backward+SGD step in CuPy at three sizes, "
                       "time per iteration under `malloc_async`, CuPy's `MemoryPool`, the "
                       "memkit adaptor uncached and cached, and the pure-Python cached "
                       "floor; ratios against `malloc_async` (info rows)."),
    "bench_observe": ("Observing memory",
                      "The cost of tracking (`track()`, `track(stacks=True)`) on the pool "
                      "pair, the pooled pinned pair and `HostBuffer.empty`. The statistics "
                      "themselves are always on (the ledger): their cost is in the "
                      "before/after rows of the memory pools section."),
}


def main() -> None:
    folder = pathlib.Path(sys.argv[1])
    out = ["# Benchmarks", "",
           "Measured on the lent H100 (`scripts/gpu-check bench` runs every script; each "
           "table compares against raw `cuda.bindings` and the other libraries measured "
           "in that same run; where tables come from different runs, the sections say "
           "so). Re-run with `bash scripts/gpu-check bench` on a "
           "GPU machine; each script also runs on the simulator (`--quick`), where it labels "
           "its numbers as simulated.", ""]
    machine = folder / "machine.txt"
    if machine.exists():
        out += ["## Machine", "", "```text", machine.read_text().strip(), "```", ""]
    extra = folder / "extra.md"  # sections written by hand (before/after, targets)
    runs = {}  # optional runs.txt: "bench_pool: device run 8 of 2026-11-24" per line
    if (folder / "runs.txt").exists():
        for ln in (folder / "runs.txt").read_text().splitlines():
            name, _, where = ln.partition(":")
            runs[name.strip()] = where.strip()
    for name, (title, text) in INTRO.items():
        log = folder / f"{name}.log"
        if not log.exists():
            continue
        lines = []  # the table, without warnings (and the source line Python echoes)
        after_warning = False
        for ln in log.read_text().splitlines():
            if "Warning" in ln or (after_warning and ln.startswith("  ")):
                after_warning = "Warning" in ln
                continue
            after_warning = False
            lines.append(ln)
        where = f" ({runs[name]})" if name in runs else ""
        out += [f"## {title}", "", text, "", f"`python benchmarks/{name}.py`{where}", "",
                "```text", *lines, "```", ""]
    if extra.exists():
        out += [extra.read_text().rstrip(), ""]
    print("\n".join(out))


if __name__ == "__main__":
    main()
