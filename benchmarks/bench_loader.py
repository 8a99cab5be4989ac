"""Feeding the GPU from worker processes: cuda_memkit's Loader against PyTorch's DataLoader.

    python benchmarks/bench_loader.py [--json PATH] [--quick] [--workers N] [--sizes MiB,...]
                                      [--rounds R]

Every batch is one copy from a preloaded array (two distinct batches, shared with the
workers by fork), made by ``--workers`` worker processes (default 8), then moved to
device 0. One table, every row measured in this run, the cases of a size taking turns in
each round (order shuffled per round, seeded), medians over the rounds; each sample is
one pass over ``n`` batches (fewer for larger batches), timed from the start of the pass
to the device having every batch, after two passes of warm-up (workers start, pools grow).
The ring cases run on two loaders of each kind, taking turns sample by sample (rings of
one kind differ by several percent, which one instance of each would put into the
ratios); the floor and the fills have rings of their own.

* ``DataLoader(num_workers=N, pin_memory=True)`` over a dataset whose item is the batch
  (a new tensor the worker fills), each batch sent with ``.to("cuda", non_blocking=True)``;
  the reference (PyTorch's loader: a copy into shared memory, a copy by the pin-memory
  thread, then the device copy). Missing torch: the row says so.
* The two limits: the workers filling ring slots with no copy to the device
  (``Loader(output="slot")``, each slot given back at once), and the pinned copy to the
  device (raw ``cuMemcpyHtoDAsync`` from ``cuMemHostAlloc`` memory, back to back).
* ``cuda_memkit.Loader`` (default output: a device buffer per batch, copied from the
  slot the worker filled).

Targets (one run on the GPU machine, 8 workers): 64 MiB batches >= 5x the DataLoader,
>= 0.9x the lesser of the two limits and >= 0.95x the floor (the fills and a raw copy of
each slot, no Loader); 4 MiB batches >= 8x the DataLoader. Other sizes
are information (``--sizes 1,4,16,64,256`` for the whole curve; notebook 09 plots it).
On the simulator the numbers are the simulator's (``--quick`` is implied there: two
workers, small batches, two rounds, no verdicts).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import shutil
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from harness import backend, check, measure

MiB = 1 << 20
#: Forking a process with threads (the CUDA driver's, torch's) draws Python 3.12's
#: DeprecationWarning; the workers here run only this script's code and the loaders'.
FORK_WARNING = r"This process .* is multi-threaded"
TARGETS = {64: {"torch": 5.0, "limit": 0.9, "floor": 0.95}, 4: {"torch": 8.0}}


def copy_batch(src: np.ndarray[Any, Any], batch: int, out: np.ndarray[Any, Any]) -> None:
    """The ring workers' make_batch: one copy from the preloaded array."""
    np.copyto(out, src[batch % len(src)])


class TorchBatches:
    """The DataLoader's dataset: item ``i`` is a new tensor holding one preloaded batch."""

    def __init__(self, src: np.ndarray[Any, Any], n: int) -> None:
        self.src = src
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import torch

        t = torch.empty(self.src.shape[1:], dtype=torch.uint8)
        t.numpy()[...] = self.src[i % len(self.src)]
        return t


def batch_count(nbytes: int, quick: bool) -> int:
    """Batches per pass: about 4 GiB, between 32 and 512 (16 with --quick)."""
    if quick:
        return 16
    return max(32, min(512, (4 << 30) // nbytes))


class Cases:
    """The loaders and buffers of one batch size, made once, measured in rounds."""

    def __init__(self, cm: Any, raw: Any, nbytes: int, n: int, workers: int,
                 simulated: bool) -> None:
        self.cm, self.raw, self.nbytes, self.n = cm, raw, nbytes, n
        self.src = np.empty((2, nbytes), np.uint8)
        self.src[0].fill(1)
        self.src[1].fill(2)
        make = functools.partial(copy_batch, self.src)
        # The Loader copies on the same kind of stream as the floor's raw copies.
        self.stream = int(check(raw.cuStreamCreate(1)))
        # Two of each, made in turns and used in turns (one per sample): rings of one kind
        # differ by several percent, and one instance of each would put that into the
        # ratio. The floor and the fills have rings of their own: a ring that also served
        # the fills ran twice the passes of the Loader's (see docs/decisions.md).
        self.loaders: list[Any] = []
        self.floors: list[Any] = []
        self.fills: list[Any] = []
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", FORK_WARNING, DeprecationWarning)
            for _ in range(2):
                self.loaders.append(cm.Loader(make, n, nbytes, workers=workers,
                                              start_method="fork", stream=self.stream))
                for rings in (self.floors, self.fills):
                    rings.append(cm.Loader(make, n, nbytes, workers=workers,
                                           start_method="fork", output="slot"))
        self._turn = dict.fromkeys(("loader", "fill", "both"), 0)
        self.host = int(check(raw.cuMemHostAlloc(nbytes, 0)))
        ctypes.memset(self.host, 1, nbytes)
        self.dev = int(check(raw.cuMemAlloc(nbytes)))
        self.torch: Any = None
        self.torch_error = ""
        if not simulated:
            self._torch(workers)

    def _torch(self, workers: int) -> None:
        try:
            import torch
            from torch.utils.data import DataLoader
        except ImportError:
            self.torch_error = "torch is not installed"
            return
        self.torch = DataLoader(TorchBatches(self.src, self.n), batch_size=None,
                                num_workers=workers, pin_memory=True, persistent_workers=True,
                                prefetch_factor=2, multiprocessing_context="fork")
        self._sync_torch = torch.cuda.synchronize

    def sync(self) -> None:
        check(self.raw.cuCtxSynchronize())

    def _next(self, case: str, instances: list[Any]) -> Any:
        """The instance ``case`` uses this time: each in turn."""
        k = self._turn[case]
        self._turn[case] = k + 1
        return instances[k % len(instances)]

    def run_loader(self) -> None:
        for _buf in self._next("loader", self.loaders):
            pass  # each buffer is freed (stream-ordered) as the next one comes
        self.sync()

    def run_fill(self) -> None:
        for slot in self._next("fill", self.fills):
            slot.close()

    def run_both(self) -> None:
        """Workers fill slots while each is copied by the raw driver: no Loader work at all."""
        fn, wait, h = self.raw.cuMemcpyHtoDAsync, self.raw.cuStreamSynchronize, self.stream
        for slot in self._next("both", self.floors):
            check(fn(self.dev, slot.ptr, self.nbytes, h))
            check(wait(h))  # the slot goes back once the copy has read it
            slot.close()

    def run_copy(self) -> None:
        fn, h = self.raw.cuMemcpyHtoDAsync, self.stream
        for _ in range(self.n):
            check(fn(self.dev, self.host, self.nbytes, h))
        check(self.raw.cuStreamSynchronize(h))

    def run_torch(self) -> None:
        for t in self.torch:
            t.to("cuda", non_blocking=True)
        self._sync_torch()

    def cases(self) -> dict[str, Callable[[], None]]:
        out = {"loader": self.run_loader, "fill": self.run_fill, "copy": self.run_copy,
               "both": self.run_both}
        if self.torch is not None:
            out["torch"] = self.run_torch
        return out

    def close(self) -> None:
        for loader in self.loaders + self.floors + self.fills:
            loader.close()
        self.sync()
        # The Loaders' buffers went back to the default pool's cache on this stream:
        # freed now, before the stream goes.
        self.cm.MemoryPool.default(0, cache=True).empty_cache()
        self.torch = None  # persistent workers end with the DataLoader
        check(self.raw.cuStreamDestroy(self.stream))
        check(self.raw.cuMemFree(self.dev))
        check(self.raw.cuMemFreeHost(self.host))


def measure_cases(cases: dict[str, Callable[[], None]], rounds: int, seed: int,
                  failed: dict[str, str]) -> dict[str, float]:
    """Median seconds per pass of each case (``harness.measure``: shuffled rounds, warm-up).

    The DataLoader may fail where this machine's /dev/shm is too small for its batches:
    its first pass is tried alone, and on failure the case is dropped (``failed`` says why).
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", FORK_WARNING, DeprecationWarning)
        if "torch" in cases:
            try:
                cases["torch"]()
            except RuntimeError as exc:
                failed["torch"] = f"{type(exc).__name__}: {exc}"[:200]
                del cases["torch"]
        loops = {k: functools.partial(_passes, fn) for k, fn in cases.items()}
        medians = measure(loops, dict.fromkeys(cases, 1), rounds, lambda: None, seed)
    return {k: v for k, v in medians.items() if v is not None}


def _passes(fn: Callable[[], None], n: int) -> None:
    for _ in range(n):
        fn()


def size_rows(mib: float, times: dict[str, float], n: int, nbytes: int,
              torch_error: str, verdicts: bool) -> list[dict[str, Any]]:
    """The table's rows for one batch size (``times``: median seconds per pass)."""
    rate = {k: n / t for k, t in times.items()}
    label = f"{mib:g} MiB"
    rows: list[dict[str, Any]] = []

    def row(case: str, key: str, ratio: float | None = None, vs: str = "",
            target: str = "", ok: bool | None = None) -> None:
        r = rate.get(key)
        rows.append({"size_mib": mib, "case": f"{label}: {case}", "key": key,
                     "batches_s": r, "gbps": None if r is None else r * nbytes / 1e9,
                     "ratio": ratio, "vs": vs, "target": target, "ok": ok})

    goals = TARGETS.get(int(mib), {}) if float(mib).is_integer() else {}
    if "torch" in rate:
        row("torch DataLoader(pin_memory=True), .to(cuda)", "torch", 1.0, "", "reference")
    else:
        rows.append({"size_mib": mib, "case": f"{label}: torch DataLoader", "key": "torch",
                     "batches_s": None, "gbps": None, "ratio": None, "vs": "",
                     "target": f"skipped: {torch_error or 'not measured'}", "ok": None})
    limit = min(rate["fill"], rate["copy"])
    row("limit: workers fill slots, no device copy", "fill", rate["fill"] / limit, "limit")
    row("limit: pinned copy (raw cuMemcpyHtoDAsync)", "copy", rate["copy"] / limit, "limit")
    # Both at once (the fills and the copies share the host's memory bandwidth), with no
    # Loader work: what any design of the ring reaches on this machine.
    row("floor: fills + a raw copy of each slot, no Loader", "both", rate["both"] / limit,
        "limit")
    ours = rate["loader"]
    if "torch" in rate:
        goal = goals.get("torch")
        ratio = ours / rate["torch"]
        row("cuda_memkit.Loader vs DataLoader", "loader", ratio, "torch",
            f">= {goal:g}x" if goal else "info",
            (ratio >= goal) if goal and verdicts else None)
    goal = goals.get("limit")
    ratio = ours / limit
    target = f">= {goal:g}x" if goal else "info"
    floor = rate["both"] / limit
    if goal and ratio < goal and floor < goal:
        target += (f"; BLOCKED: the floor (fills and raw copies at once, no Loader) is "
                   f"{floor:.2f}x, the Loader {ours / rate['both']:.2f}x of it")
    row("cuda_memkit.Loader vs the lesser limit", "loader", ratio, "limit", target,
        (ratio >= goal) if goal and verdicts else None)
    goal = goals.get("floor")
    ratio = ours / rate["both"]
    row("cuda_memkit.Loader vs the floor", "loader", ratio, "floor",
        f">= {goal:g}x" if goal else "info", (ratio >= goal) if goal and verdicts else None)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'case':62} {'batches/s':>10} {'GB/s':>7} {'ratio':>13}  target")
    for r in rows:
        b = "n/a" if r["batches_s"] is None else f"{r['batches_s']:10.1f}"
        g = "" if r["gbps"] is None else f"{r['gbps']:7.2f}"
        ratio = "" if r["ratio"] is None else f"{r['ratio']:6.2f}x {r['vs']}"
        verdict = "" if r["ok"] is None else (" OK" if r["ok"] else
                                              " BLOCKED" if "BLOCKED" in r["target"] else " MISS")
        print(f"{r['case']:62} {b:>10} {g:>7} {ratio:>13}  {r['target']}{verdict}")


def run(sizes_mib: list[float], workers: int, rounds: int, quick: bool,
        seed: int = 0) -> dict[str, Any]:
    """Measure every size; return what ``--json`` writes (also notebook 09's data)."""
    import cuda_memkit as cm

    backend_name, simulated, raw = backend()
    rows: list[dict[str, Any]] = []
    for mib in sizes_mib:
        nbytes = int(mib * MiB)
        n = batch_count(nbytes, quick)
        cases = Cases(cm, raw, nbytes, n, workers, simulated)
        failed: dict[str, str] = {}
        try:
            times = measure_cases(cases.cases(), rounds, seed, failed)
        finally:
            cases.close()
        why = failed.get("torch", cases.torch_error)
        rows += size_rows(mib, times, n, nbytes, why, not simulated)
    shm = shutil.disk_usage("/dev/shm").total if not simulated else 0
    return {"backend": backend_name, "simulated": simulated, "device": cm.Device(0).name,
            "title": "Feeding the GPU from worker processes",
            "about": (f"{workers} worker processes, each batch one copy from a preloaded "
                      "array, moved to device 0: PyTorch's DataLoader(pin_memory=True) "
                      "against cuda_memkit's Loader and the ring's two limits (the workers "
                      "filling slots with no copy, the pinned copy alone); batches/s, "
                      "medians of interleaved rounds, two rings of each kind taking turns "
                      "(key and size_mib: notebook 09's series)."),
            "workers": workers, "rounds": rounds, "shm_bytes": shm, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--quick", action="store_true", help="small and short (the simulator's)")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--sizes", default="4,64", help="batch sizes in MiB, comma-separated")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    _name, simulated, _raw = backend()
    quick = args.quick or simulated
    sizes = [0.0625, 0.25] if quick else [float(x) for x in args.sizes.split(",")]
    workers = 2 if quick else args.workers
    rounds = 2 if quick else args.rounds
    result = run(sizes, workers, rounds, quick)
    note = " -- SIMULATED: numbers are the CPU simulator's, not a GPU's" if simulated else ""
    print(f"bench_loader on backend {result['backend']} ({result['device']}){note}")
    print(f"{workers} workers, median of {rounds} interleaved rounds (one pass each), "
          f"/dev/shm {result['shm_bytes'] / (1 << 30):.0f} GiB")
    print_table(result["rows"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
