"""The comparisons with other libraries that the benchmark report draws from the results.

Used by ``scripts/bench_report.py``: each comparison picks rows of one run (a
benchmark script compares cuda_memkit with the peers in the same process,
interleaved), draws them as bars and fills the numbers of the why page. The
rows of the existing scripts are picked by the patterns in ``SPECS``; a new
script needs no entry here: rows carrying ``"compare": TITLE`` and
``"library": NAME`` (``cuda_memkit``, ``CuPy``, ``cuda.core``, ``PyTorch``,
``RMM``, ``raw driver``) form the comparison of that title, the first
cuda_memkit row being the one the others are set against.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: What a table cell shows for nothing (an en dash): in a comparison, no call for it.
NONE = "\u2013"
#: What a comparison's cell shows for a library with such a call that the run did not measure.
NOT_MEASURED = "not measured"
#: The peers of the why page's table, in its column order.
PEERS = ("cuda.core", "CuPy", "RMM", "PyTorch")
MEMKIT = "cuda_memkit"
#: Units where more is better; every other unit (times) is better smaller.
HIGHER = {"gbps", "GB/s", "batches_s", "batches/s"}
UNITS = {"us": "us", "gbps": "GB/s", "ms": "ms", "median_ms": "ms"}
#: Bumped when the drawing code changes, so that every plot is drawn again.
PLOT_STYLE = 2
#: The comparisons of the headline plot (README, home page), in its panel order.
HEADLINE = ("pool-pair", "small-blocks", "pageable-h2d", "loader-64", "cupy-step")


@dataclass(frozen=True)
class Spec:
    """Rows of one benchmark that make a comparison: ``(library, label, case pattern)``."""

    id: str
    title: str
    short: str
    bench: str
    key: str
    unit: str
    about: str
    rows: tuple[tuple[str, str, str], ...]
    #: Labels of cuda_memkit rows that are what a user gets without asking for more (the
    #: default pool, the default adaptor): every plot and table shows them.
    defaults: tuple[str, ...] = ()
    #: Libraries with no call for this (a "\u2013" in the why page), not merely unmeasured.
    no_api: tuple[str, ...] = ()


_N4 = r"^\d+ x 4 KiB pinned->device: "
_H2D, _D2H = r"^\d+ MiB pageable H2D: ", r"^\d+ MiB pageable D2H: "
_P2P = r"^256 MiB device 0 -> 1: "

SPECS = (
    Spec("pool-pair", "Allocate + free a 1 MiB device block", "1 MiB pool block",
         "bench_pool", "us", "us per pair",
         "One allocate + free pair from a stream-ordered pool: the cost every temporary "
         "array pays.",
         ((MEMKIT, "`MemoryPool(cache=True)`", r"^1 MiB: MemoryPool\(cache=True\)"),
          (MEMKIT, "`MemoryPool(0)`, the default (no cache)",
           r"^1 MiB: MemoryPool\.allocate.*\(uncached\)"),
          (MEMKIT, "`MemoryPool.default(0)`, the device's pool",
           r"^1 MiB: MemoryPool\.default\(0\)"),
          ("CuPy", "`MemoryPool().malloc`", r"^1 MiB: CuPy MemoryPool\(\)"),
          ("CuPy", "`malloc_async`", r"^1 MiB: CuPy malloc_async"),
          ("cuda.core", "`Device.allocate` + `Buffer.close`", r"^1 MiB: cuda\.core"),
          ("PyTorch", "`torch.empty(device='cuda')`", r"^1 MiB: torch\.empty"),
          ("RMM", "`DeviceBuffer`, `PoolMemoryResource`",
           r"^1 MiB: RMM DeviceBuffer, PoolMemoryResource"),
          ("RMM", "`DeviceBuffer`, `CudaAsyncMemoryResource`",
           r"^1 MiB: RMM DeviceBuffer, CudaAsyncMemoryResource"),
          ("RMM", "`PoolMemoryResource.allocate` + `deallocate`",
           r"^1 MiB: RMM PoolMemoryResource\.allocate"),
          ("RMM", "`CudaAsyncMemoryResource.allocate` + `deallocate`",
           r"^1 MiB: RMM CudaAsyncMemoryResource\.allocate"),
          ("raw driver", "`cuMemAllocFromPoolAsync` + `cuMemFreeAsync`",
           r"^1 MiB: raw cuMemAllocFromPoolAsync")),
         defaults=("`MemoryPool(0)`, the default (no cache)",
                   "`MemoryPool.default(0)`, the device's pool")),
    Spec("pinned-pair", "Allocate + free a 4 KiB pinned block", "4 KiB pinned block",
         "bench_pool", "us", "us per pair",
         "A small pinned staging buffer: `cuMemHostAlloc` pins pages on every call, so every "
         "library caches them.",
         ((MEMKIT, "`HostBuffer.pooled(4096)`", r"^4 KiB pinned: HostBuffer\.pooled"),
          ("CuPy", "`alloc_pinned_memory`", r"^4 KiB pinned: CuPy alloc_pinned_memory"),
          ("cuda.core", "`PinnedMemoryResource`", r"^4 KiB pinned: cuda\.core"),
          ("PyTorch", "`torch.empty(pin_memory=True)`", r"^4 KiB pinned: torch\.empty"),
          ("RMM", "`PoolMemoryResource(PinnedHostMemoryResource)`",
           r"^4 KiB pinned: RMM PoolMemoryResource\(PinnedHostMemoryResource\)"),
          ("RMM", "`PinnedHostMemoryResource`",
           r"^4 KiB pinned: RMM PinnedHostMemoryResource"),
          ("raw driver", "`cuMemHostAlloc` + `cuMemFreeHost`, other small blocks alive",
           r"^4 KiB pinned: raw cuMemHostAlloc"))),
    Spec("small-blocks", "Copy 4 KiB blocks from pinned memory to scattered device slots",
         "4 KiB blocks to scattered slots", "bench_transfers", "gbps", "GB/s",
         "A KV-cache swap: many small blocks, each to its own slot. The driver spends about "
         "as long per copy, batched or not, as a 4 KiB block takes to move.",
         ((MEMKIT, "`copy_batch`", _N4 + r"copy_batch \(auto\)"),
          (MEMKIT, "`CopyBatch.execute`, prebuilt", _N4 + r"CopyBatch\.execute"),
          ("cuda.core", "`copy_batch`, prebuilt `Buffer`s", _N4 + r"cuda\.core"),
          ("CuPy", "one contiguous copy + a scatter kernel", _N4 + r"1 contiguous copy"),
          ("raw driver", "a loop of `cuMemcpyAsync`", _N4 + r"raw loop"),
          ("raw driver", "one contiguous copy of the same bytes", _N4 + r"raw contiguous")),
         no_api=("RMM", "PyTorch")),
    Spec("pageable-h2d", "Copy a pageable numpy array to the device", "pageable array to device",
         "bench_transfers", "gbps", "GB/s",
         "A 1 GiB array that was never pinned: the driver stages it through a small bounce "
         "buffer; cuda_memkit stages it through pinned buffers on worker threads, one per CPU "
         "core the process may use, at most 16 (the label names how many this run had). "
         "PyTorch and CuPy copy on one thread.",
         ((MEMKIT, "`copy(dev, array)`", _H2D + r"memkit staged"),
          ("PyTorch", "`pin_memory().to()`", _H2D + r"torch pin_memory"),
          ("PyTorch", "`copy_` via a pinned tensor", _H2D + r"torch copy_ via"),
          ("CuPy", "`cupy.asarray`", _H2D + r"cupy asarray"),
          ("raw driver", "`cuMemcpyHtoD` from pageable memory", _H2D + r"driver pageable")),
         no_api=("RMM",)),
    Spec("pageable-d2h", "Copy device memory into a pageable numpy array",
         "device to pageable array", "bench_transfers", "gbps", "GB/s",
         "The same 1 GiB the other way.",
         ((MEMKIT, "`copy(array, dev)`", _D2H + r"memkit staged"),
          ("PyTorch", "`copy_` into `from_numpy(array)`", _D2H + r"torch copy_ into"),
          ("PyTorch", "`copy_` via a pinned tensor", _D2H + r"torch copy_ via"),
          ("CuPy", "`get(out=array)`", _D2H + r"cupy get"),
          ("raw driver", "`cuMemcpyDtoH` into pageable memory", _D2H + r"driver pageable")),
         no_api=("RMM",)),
    Spec("peer-copy", "Copy 256 MiB from one GPU to another", "256 MiB between two GPUs",
         "bench_multigpu", "gbps", "GB/s",
         "A pipeline stage handing its activations to the next GPU (two GPUs linked by "
         "NVLink). Without peer access the driver stages the copy through host memory.",
         ((MEMKIT, "`copy` of `DeviceBuffer`s", _P2P + r"cm\.copy DeviceBuffer"),
          (MEMKIT, "`copy` of `PoolBuffer`s (`peers=`)", _P2P + r"cm\.copy PoolBuffer"),
          (MEMKIT, "`copy` of `GrowableBuffer`s (`peers=`)", _P2P + r"cm\.copy GrowableBuffer"),
          ("PyTorch", "`y.copy_(x)`", _P2P + r"torch y\.copy_"),
          ("raw driver", "`cuMemcpyAsync` with peer access",
           _P2P + r"raw cuMemcpyAsync, peer access"),
          ("raw driver", "`cuMemcpy` without peer access (staged)",
           r"^256 MiB: cm\.copy without peer access"))),
    Spec("loader-64", "Feed the GPU 64 MiB batches from 8 worker processes", "64 MiB batches",
         "bench_loader", "batches_s", "batches/s",
         "Each batch made by a worker process and copied to the device: PyTorch's "
         "`DataLoader(pin_memory=True)` copies it once more on one thread.",
         ((MEMKIT, "`Loader`", r"^64 MiB: cuda_memkit\.Loader vs DataLoader"),
          ("PyTorch", "`DataLoader(num_workers=8, pin_memory=True)`",
           r"^64 MiB: torch DataLoader"),
          ("raw driver", "workers filling slots and raw copies, no Loader",
           r"^64 MiB: floor: fills")),
         no_api=("cuda.core", "CuPy", "RMM")),
    Spec("cupy-step", "A CuPy training step (small MLP) under each allocator",
         "CuPy training step, small MLP", "bench_workload", "us", "us per step",
         "Forward, backward and SGD update of a two-layer MLP (64 x 256, hidden 512), "
         "every temporary allocated through CuPy's current allocator.",
         ((MEMKIT, "`cupy_allocator()`", r"^small .*: memkit cached$"),
          (MEMKIT, "`cupy_allocator(cache=False)`", r"^small .*: memkit uncached$"),
          ("CuPy", "`MemoryPool` (CuPy's default)", r"^small .*: cupy pool$"),
          ("CuPy", "`malloc_async`", r"^small .*: malloc_async$"),
          ("RMM", "`rmm_cupy_allocator` (`PoolMemoryResource`)", r"^small .*: rmm$")),
         no_api=("cuda.core", "PyTorch")),
    Spec("cupy-alloc", "Allocate + free 1 MiB through CuPy's allocator hook",
         "1 MiB via cupy.cuda.alloc", "bench_frameworks", "us", "us per pair",
         "`cupy.cuda.alloc`, what every CuPy array calls, with `set_allocator` set to each "
         "library's allocator.",
         ((MEMKIT, "`cupy_allocator()`",
           r"^1 MiB via cupy\.cuda\.alloc: memkit adaptor \(cached, default\)"),
          (MEMKIT, "`cupy_allocator(cache=False)`",
           r"^1 MiB via cupy\.cuda\.alloc: memkit adaptor, uncached"),
          ("CuPy", "`MemoryPool` (CuPy's default)",
           r"^1 MiB via cupy\.cuda\.alloc: CuPy MemoryPool"),
          ("CuPy", "`malloc_async`", r"^1 MiB via cupy\.cuda\.alloc: CuPy malloc_async"),
          ("RMM", "`rmm_cupy_allocator` (`PoolMemoryResource`)",
           r"^1 MiB via cupy\.cuda\.alloc: RMM rmm_cupy_allocator")),
         no_api=("cuda.core", "PyTorch")),
    Spec("dask-job", "A CuPy dask.array job on a dask-cuda worker", "CuPy dask.array job",
         "bench_dask", "ms", "ms per job",
         "Chunked matrix products and reductions of a CuPy-backed `dask.array` on "
         "`LocalCUDACluster`, each worker's CuPy allocating through each library's pool.",
         ((MEMKIT, "`MemkitPlugin`", r"chunks: MemkitPlugin"),
          ("RMM", "`rmm_pool_size` + `rmm_cupy_allocator`", r"chunks: rmm_cupy_allocator"),
          ("CuPy", "`MemoryPool` (CuPy's default)", r"chunks: CuPy's default MemoryPool")),
         no_api=("cuda.core", "PyTorch")),
)


def fmt_value(key: str, v: Any) -> str:
    """A value of row key ``key`` as the report prints it."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if key in ("size", "nbytes") and isinstance(v, int):
        for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
            if v >= 1 << shift and v % (1 << shift) == 0:
                return f"{v >> shift} {unit}"
        return f"{v} B"
    if key == "ratio" or key.startswith("vs_") or key.endswith("_vs_raw"):
        return f"{v:.3f}x"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        a = abs(v)
        return f"{v:.1f}" if a >= 100 else f"{v:.2f}" if a >= 10 else f"{v:.3f}"
    return str(v)


@dataclass
class Entry:
    """One library's row of a comparison."""

    library: str
    label: str
    value: float | None
    anchor: str = ""
    note: str = ""
    #: What a user gets without asking for more: shown in every plot and table.
    default: bool = False


@dataclass
class Comparison:
    """Rows of one run that answer one question, cuda_memkit's first."""

    id: str
    title: str
    short: str
    bench: str
    unit: str
    higher_better: bool
    about: str
    entries: list[Entry] = field(default_factory=list)
    no_api: tuple[str, ...] = ()

    def measured(self) -> list[Entry]:
        return [e for e in self.entries if e.value is not None]

    def plottable(self) -> bool:
        return any(e.library == MEMKIT for e in self.measured()) and len(self.measured()) > 1

    def digest(self) -> str:
        """Of everything the plot shows: a change of its words names a new file, as of its
        numbers (a plot is only drawn when its file is missing)."""
        data = [PLOT_STYLE, self.title, self.short, self.unit_words(),
                [(e.library, e.label, e.value) for e in self.entries]]
        return hashlib.sha1(json.dumps(data).encode()).hexdigest()[:10]

    def reference(self) -> Entry | None:
        """cuda_memkit's answer: its first measured row."""
        return next((e for e in self.measured() if e.library == MEMKIT), None)

    def speed(self, e: Entry) -> str:
        """How ``e`` compares with cuda_memkit's answer, in words."""
        ref = self.reference()
        if ref is None or e.value is None or ref.value is None or e is ref:
            return ""
        if not e.value or not ref.value:
            return ""
        times = e.value / ref.value if self.higher_better else ref.value / e.value
        if abs(times - 1) < 0.005:
            return "as fast"
        return f"**{times:.2f}x faster**" if times > 1 else f"{1 / times:.2f}x slower"

    def speed_against(self, e: Entry, base: Entry) -> float:
        """How many times faster ``e`` is than ``base`` (below 1: slower)."""
        if not e.value or not base.value:
            return 1.0
        return e.value / base.value if self.higher_better else base.value / e.value

    def unit_words(self) -> str:
        return f"{self.unit}, {'higher' if self.higher_better else 'lower'} is better"

    def section(self, plot: str | None) -> list[str]:
        out = [f"### {self.title} {{#{self.id}}}", "", self.about, ""]
        if not self.entries:
            return [*out, f"Not in these results (`{self.bench}`).", ""]
        if plot:
            out += [f"![{self.title}]({plot})", ""]
        out += [f"`{self.bench}`, {self.unit_words()}; the last column sets each row "
                "against cuda_memkit's first.", "",
                f"| library | what | {self.unit} | against cuda_memkit |", "|---|---|---:|---|"]
        for e in self.entries:
            value = NOT_MEASURED if e.value is None else fmt_value("x", e.value)
            link = f"[{e.library}](#{e.anchor})" if e.anchor else e.library
            why = e.note if e.value is None and e.note else ""
            what = e.label + (f" <small>({why})</small>" if why else "")
            out.append(f'| {link} | {what} | <span class="num">{value}</span> | '
                       f"{self.speed(e)} |")
        return [*out, ""]

    def bars(self, ax: Any) -> None:
        shown = self.measured()
        colours = {MEMKIT: "#3f51b5", "raw driver": "#d0d0d0"}
        labels = [f"{e.library}: {e.label.replace('`', '')}" for e in shown]
        values = [float(e.value or 0) for e in shown]
        ax.barh(range(len(shown)), values, color=[colours.get(e.library, "#8a8a8a")
                                                  for e in shown])
        ax.set_yticks(range(len(shown)), labels, fontsize=8)
        ax.invert_yaxis()
        top = max(values)
        for i, v in enumerate(values):
            ax.text(v + top * 0.01, i, fmt_value("x", v), va="center", fontsize=8)
        ax.set_xlim(0, top * 1.18)
        ax.set_xlabel(self.unit_words(), fontsize=8)
        ax.set_title(self.short, fontsize=9)
        ax.spines[["top", "right"]].set_visible(False)
        ax.tick_params(axis="x", labelsize=8)

    def headline_view(self) -> Comparison:
        """cuda_memkit's answer, its defaults and the other libraries' rows, without the raw
        driver's."""
        ref = self.reference()
        keep = [e for e in self.entries
                if e is ref or e.default or e.library not in (MEMKIT, "raw driver")]
        return Comparison(self.id, self.title, self.short, self.bench, self.unit,
                          self.higher_better, self.about, keep, self.no_api)

    def draw(self, path: Path) -> None:
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(7.2, 0.32 * len(self.measured()) + 1.1))
        self.bars(ax)
        _save(fig, path)


@dataclass
class Headline:
    """The panels of the headline plot."""

    parts: list[Comparison]

    def draw(self, path: Path) -> None:
        plt = _pyplot()
        parts = [c.headline_view() for c in self.parts]
        heights = [0.32 * len(c.measured()) + 1.0 for c in parts]
        fig, axes = plt.subplots(len(parts), 1, figsize=(7.2, sum(heights)),
                                 gridspec_kw={"height_ratios": heights}, squeeze=False)
        for c, ax in zip(parts, axes[:, 0], strict=True):
            c.bars(ax)
        _save(fig, path)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    _pyplot().close(fig)


def rows_of(data: dict[str, Any]) -> list[dict[str, Any]]:
    """A benchmark's rows (its JSON's ``rows``, dicts only)."""
    return [r for r in data.get("rows", []) if isinstance(r, dict)]


def _value_key(row: dict[str, Any]) -> str | None:
    return next((k for k in UNITS if isinstance(row.get(k), (int, float))), None)


def comparisons(benches: dict[str, dict[str, Any]], anchors: dict[str, list[str]]
                ) -> list[Comparison]:
    """The comparisons these results hold: ``SPECS`` first, then those tagged in the rows.

    ``anchors``: the HTML id of each row of each benchmark, for the links to the tables.
    """
    out = []
    for spec in SPECS:
        data = benches.get(spec.bench)
        c = Comparison(spec.id, spec.title, spec.short, spec.bench, spec.unit,
                       spec.key in HIGHER, spec.about, no_api=spec.no_api)
        if data is not None:
            rows = rows_of(data)
            for lib, label, pattern in spec.rows:
                for i, r in enumerate(rows):
                    case = str(r.get("case", ""))
                    if re.search(pattern, case):
                        # The threads a row used belong beside its number, not only in the table.
                        threads = re.search(r"\((\d+ threads)\)", case)
                        shown = f"{label}, {threads[1]}" if threads else label
                        c.entries.append(Entry(lib, shown, r.get(spec.key),
                                               anchors[spec.bench][i], str(r.get("note", "")),
                                               label in spec.defaults))
                        break
        out.append(c)
    tagged: dict[str, Comparison] = {}
    for name, data in benches.items():
        for i, r in enumerate(rows_of(data)):
            key = _value_key(r)
            if not (r.get("compare") and r.get("library") and key):
                continue
            title = str(r["compare"])
            c = tagged.get(title)
            if c is None:
                unit = str(r.get("unit") or UNITS[key])
                better = r.get("better", "higher" if key in HIGHER else "lower")
                c = tagged[title] = Comparison(_slug(title), title, title, name, unit,
                                               better == "higher", str(r.get("about", "")))
            c.entries.append(Entry(str(r["library"]), str(r.get("label", r.get("case", ""))),
                                   r[key], anchors[name][i], str(r.get("note", ""))))
    for c in tagged.values():  # cuda_memkit's rows first: the first is the reference
        c.entries.sort(key=lambda e: e.library != MEMKIT)
    return out + list(tagged.values())


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _cell(c: Comparison, library: str, best: Entry | None) -> str:
    """A why-table cell: each of the library's rows, its value (bold if the best of all);
    "\u2013" where the library has no call for it, "not measured" where the run has no row."""
    mine = [e for e in c.entries if e.library == library]
    if not mine:
        return NONE if library in c.no_api else f"<small>{NOT_MEASURED}</small>"
    parts = []
    for e in mine:
        value = NOT_MEASURED if e.value is None else fmt_value("x", e.value)
        value = f"**{value}**" if e is best else value
        # plain words, not code: a long call may wrap inside this narrow cell
        parts.append(f"{value} <small>{e.label.replace('`', '')}</small>")
    return "<br>".join(parts)


def _defaults_behind(c: Comparison) -> list[str]:
    """A line for each cuda_memkit default that other libraries beat: which, and by how much."""
    ref, out = c.reference(), []
    for d in c.entries:
        if not d.default or d is ref or d.value is None:
            continue
        ahead = [e for e in c.measured() if e.library not in (MEMKIT, "raw driver")
                 and c.speed_against(e, d) > 1.005]
        if ahead:
            named = ", ".join(f"{e.library}'s {e.label} ({fmt_value('x', e.value)}, "
                              f"{c.speed_against(e, d):.2f}x faster)" for e in ahead)
            out.append(f"- **{c.title}**, cuda_memkit's {d.label} "
                       f"({fmt_value('x', d.value)} {c.unit}): behind {named}.")
    return out


def best_library_entry(c: Comparison) -> Entry | None:
    """The best measured row of a library (the raw driver's rows are limits, not rivals)."""
    rivals = [e for e in c.measured() if e.library != "raw driver"]
    return max(rivals, key=lambda e: float(e.value or 0) * (1 if c.higher_better else -1),
               default=None)


def regions(benches: dict[str, dict[str, Any]], comps: list[Comparison], headline: str | None,
            prefix: str, link: str = "") -> dict[str, str]:
    """The text of each ``bench-report`` region of README.md (``prefix`` "docs/") and docs/.

    ``link`` goes before page names in links (the README links to the site's sources).
    """
    report = f"{link}benchmarks.md"
    if not benches:
        none = ("*No GPU run is recorded yet: `bash scripts/gpu-check bench` on a GPU machine, "
                f"then `python scripts/bench_report.py --import ...` fills this in "
                f"([benchmarks]({report})).*\n")
        return {"headline": none, "peers": none}
    where, one_run = measured_where(benches, comps)
    same = ("every library in the same run" if one_run
            else "every library of a question in the same run")
    head = (f"![cuda_memkit against CuPy, cuda.core and PyTorch, one GPU run per question]"
            f"({prefix}{headline})\n\n" if headline else "")
    head += (f"*Measured on {where}, {same}; cuda_memkit in colour. "
             f"The [benchmark report]({report}) has every table, including where others "
             "are faster.*\n")
    rows = [f"| | {MEMKIT} | " + " | ".join(PEERS) + " |", "|---|" + "---|" * (len(PEERS) + 1)]
    faster = []
    for c in comps:
        if not c.entries:
            continue
        best, ref = best_library_entry(c), c.reference()
        rows.append(f"| [{c.title}]({report}#{c.id}) <small>({c.unit_words()})</small> | "
                    + " | ".join(_cell(c, lib, best) for lib in (MEMKIT, *PEERS)) + " |")
        if best is not None and ref is not None and best.library != MEMKIT:
            faster.append(f"- **{c.title}**: {best.library}'s {best.label} "
                          f"({fmt_value('x', best.value)} {c.unit}) is {c.speed(best).strip('*')} "
                          f"than cuda_memkit's {ref.label} ({fmt_value('x', ref.value)}).")
        faster += _defaults_behind(c)
    peers = "\n".join(rows) + ("\n\nThe best of each row in bold. A dash (\u2013): the library "
                               "has no call for it; *not measured*: it has one, which this run "
                               "did not measure.\n\n")
    if not any(e.library == "RMM" for c in comps for e in c.entries):
        peers += (f"RMM is measured by no benchmark of {'this run' if one_run else 'these runs'} "
                  "(it is not installed there).\n\n")
    if faster:
        peers += "Where a peer is faster, plainly:\n\n" + "\n".join(faster) + "\n"
    else:
        peers += "No peer is faster than cuda_memkit in these comparisons.\n"
    peers += f"\n*Measured on {where}, {same}.*\n"
    return {"headline": head, "peers": peers}


def measured_where(benches: dict[str, dict[str, Any]], comps: list[Comparison]
                   ) -> tuple[str, bool]:
    """``(where, one run)`` for a caption: the GPU and date(s) of the runs ``comps`` come from.

    A comparison's rows come from one script, hence one run; the results of different
    scripts may come from different runs, which the caption then says.
    """
    used = [benches[c.bench] for c in comps if c.entries and c.bench in benches] or list(
        benches.values())
    machines = [b.get("machine", {}) for b in used]
    runs = {(m.get("date", ""), m.get("commit", "")) for m in machines}
    gpus = sorted({str(m.get("gpu", "one GPU")) for m in machines})
    dates = sorted({str(m.get("date", ""))[:10] for m in machines} - {""})
    span = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}" if dates else ""
    if len(runs) == 1:
        return f"{', '.join(gpus)}, {span}".strip(", "), True
    return f"{' and '.join(gpus)} in {len(runs)} runs, {span}".strip(", "), False
