"""Write the benchmark report from the recorded results of one GPU run.

    python scripts/bench_report.py                  # write the report from benchmarks/results/
    python scripts/bench_report.py --import PATH    # first take a GPU run's results, then write
    python scripts/bench_report.py --check          # exit 1 if a written file is out of date
    python scripts/bench_report.py --machine PATH   # record this machine (gpu-check bench does)

``--import`` takes what ``bash scripts/gpu-check bench`` brought back (its
``results.tar.gz``, its ``summary.json``, or an unpacked folder): every
``bench_*.json`` and the ``machine.json`` beside them. Each result is stored as
``benchmarks/results/<bench>.json`` with the machine record of its run; results
of the simulator are refused (``--allow-simulated`` takes them, for a preview
written elsewhere with ``--results`` and ``--docs``).

What is written, from those files alone:

* ``docs/benchmarks.md``: the machine and versions, the comparisons with the
  other libraries (a plot each), every target, and one table per benchmark;
* the plots, ``docs/images/benchmarks/<name>-<digest>.png`` (the digest is
  that of the plotted numbers, so the page names the data it shows);
* the regions between ``<!-- bench-report:NAME -->`` and
  ``<!-- /bench-report:NAME -->`` of README.md, docs/index.md and docs/why.md
  (the headline plot, the table of numbers beside each peer).

Any benchmark script's JSON is rendered (see ``benchmarks/harness.py`` for the
format): rows are dicts with a ``case`` (``"group: case"`` splits the table),
value keys (``us``, ``gbps``, ``ms`` ...), and optionally ``ratio``/``vs``,
``target``/``ok`` and ``note``. A row with ``library`` and ``compare`` keys
joins the comparison of that title; the comparisons of the existing scripts
are listed in ``bench_compare.py``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import re
import sys
import tarfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_compare
from bench_compare import NONE, Comparison, fmt_value, rows_of

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
IMAGES = "images/benchmarks"  # under docs/
#: The README links to the pages beside it, relative to the checkout (it is also the package's
#: description).
README_LINKS = "docs/"
REGION = re.compile(r"(<!-- bench-report:([\w-]+) -->\n)(.*?)(<!-- /bench-report:\2 -->)", re.S)

#: What each benchmark measures, in the order of the report. A script not listed here is
#: reported after them, under the ``title`` and ``about`` of its JSON (or its name).
AREAS: dict[str, tuple[str, str]] = {
    "bench_driver": (
        "Driver gateway",
        "The cost the library's one gateway to the driver adds to a raw binding call, and "
        "the time to import `cuda_memkit` against `import cuda.bindings.driver`."),
    "bench_pinned": (
        "Pinned host memory",
        "Large copies through `copy()` against raw `cuMemcpy*Async` on raw pinned memory, "
        "and `HostBuffer` allocation against raw `cuMemHostAlloc` / `cuMemFreeHost` with no "
        "other pinned memory alive in the process: each pair pins and maps new pages, in "
        "milliseconds. The memory pools' table measures the same raw 4 KiB pair while the "
        "other libraries' small pinned blocks are alive there, in microseconds: the driver "
        "serves a small `cuMemHostAlloc` from a pinned chunk it keeps while another small "
        "block lives in it (a different case, not a different call; the decision log has "
        "the measurement)."),
    "bench_pool": (
        "Memory pools",
        "Allocate + free pairs from pools against the raw driver pair, CuPy, cuda.core and "
        "PyTorch in the same run. The pure-Python floors (not cuda_memkit) show what the "
        "thinnest wrapper with the same API costs; `floor us` is the floor of a target row."),
    "bench_transfers": (
        "Many blocks and pageable arrays",
        "Scattered blocks through `copy_batch` against a raw loop, raw batch calls, "
        "cuda.core and one contiguous copy of the same bytes; pageable arrays through "
        "staged `copy()` against the driver's path, PyTorch and CuPy; prefetch plans built "
        "from arrays."),
    "bench_frameworks": (
        "CuPy adaptors",
        "CuPy's own entry points (`cupy.cuda.alloc`, `cupy.empty`, a small workload) under "
        "CuPy's allocators and cuda_memkit's adaptors."),
    "bench_workload": (
        "A CuPy training step",
        "A two-layer MLP forward + backward + SGD step in CuPy at three sizes under "
        "`malloc_async`, CuPy's `MemoryPool` and cuda_memkit's adaptor."),
    "bench_managed": (
        "Managed memory prefetch",
        "Managed memory prefetched to the GPU as one range and as `PrefetchPlan`s of many "
        "entries, against raw loops and raw batch calls of the same entries."),
    "bench_vmm": (
        "Virtual memory",
        "Growing a `GrowableBuffer` by one chunk at buffer sizes up to 8 GiB, against raw "
        "create + map + set-access of one chunk and a re-allocation with a copy."),
    "bench_observe": (
        "Observing memory",
        "What tracking (`track()`, `track(stacks=True)`) adds to the pool pair, the pooled "
        "pinned pair and `HostBuffer.empty`. The statistics are always on: their cost is "
        "inside every memkit row of the other tables."),
    "bench_multigpu": (
        "Several GPUs",
        "Copies between two GPUs (whole buffers of every kind, both directions at once, "
        "scattered 4 KiB blocks through the copy kernel, a sweep of sizes against PyTorch), "
        "and NCCL collectives through `torch.distributed` and nccl4py on every kind of "
        "cuda_memkit memory against `torch.empty`."),
    "bench_oversub": (
        "Data larger than the GPU",
        "A managed array three times what the squeezed GPU has free, walked in 256 MiB chunks "
        "by a real kernel in three patterns, five ways in the same run: the explicit pinned "
        "double-buffer (the limit of the link), page faults, zero-copy advice, read-mostly + "
        "prefetch, and `AccessPlan`; the bounds rows show what limits a mechanism. GB/s of "
        "data, higher is better."),
}

#: Column headers of the known row keys; other keys are shown under their own name.
HEADERS = {"gbps": "GB/s", "ms": "ms", "median_ms": "ms", "raw_us": "raw us",
           "memkit_us": "memkit us", "added_us": "added us", "raw_ms": "raw ms",
           "memkit_ms": "memkit ms", "growable_us": "GrowableBuffer us",
           "realloc_us": "realloc + copy us", "realloc_vs_raw": "realloc vs raw",
           "floor_us": "floor us", "vs_raw": "vs raw", "vs_off": "vs untracked",
           "driver_calls": "driver calls", "size": "size"}
#: Keys that are not columns: folded into others (``vs`` into ratio, ``ok`` into target,
#: ``unit`` into the header), or shown elsewhere (``note``), or kept for the comparisons.
FOLDED = {"case", "vs", "ok", "target", "unit", "note", "path", "group", "library",
          "compare", "better"}


# -- the results ------------------------------------------------------------------------------


def load(results: Path) -> dict[str, dict[str, Any]]:
    """Every ``bench_*.json`` under ``results``, by benchmark name, in the report's order."""
    found = {p.stem: json.loads(p.read_text()) for p in sorted(results.glob("bench_*.json"))}
    order = [n for n in AREAS if n in found] + sorted(n for n in found if n not in AREAS)
    return {n: found[n] for n in order}


def machine_record() -> dict[str, Any]:
    """This machine: GPUs, driver, Python and the versions of every library measured."""
    import datetime
    import os
    import platform
    import shutil
    import subprocess
    from importlib import metadata

    rec: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version()}
    try:  # the cores this process may use: the staging threads and the loader's workers
        rec["cpus"] = len(os.sched_getaffinity(0))
    except AttributeError:
        rec["cpus"] = os.cpu_count()
    smi = shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             check=False).stdout.strip().splitlines()
        if out:
            name, driver, mib = (x.strip() for x in out[0].split(","))
            rec.update(gpu=name, gpus=len(out), driver=driver, memory_gib=round(int(mib) / 1024))
    versions = {}
    for dist in ("cuda-bindings", "numpy", "cupy-cuda13x", "cupy", "torch", "cuda-core",
                 "numba-cuda", "cuda_memkit"):
        try:
            versions[dist.replace("-cuda13x", "")] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    rec["versions"] = versions
    commit = _git("rev-parse", "--short", "HEAD")
    if commit:
        rec["commit"] = commit
    return rec


def _git(*args: str) -> str:
    import subprocess

    try:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                              check=False).stdout.strip()
    except OSError:
        return ""


def take_results(source: Path, results: Path, allow_simulated: bool) -> list[str]:
    """Store the results of one GPU run (a tarball, a folder or a summary.json) in ``results``.

    Each stored file is the benchmark's JSON with ``machine``: the record of its run.
    Returns the names stored; raises ``SystemExit`` for simulated results or none at all.
    """
    files: dict[str, Any] = {}
    if source.is_dir():
        files = {p.name: json.loads(p.read_text()) for p in source.rglob("*.json")}
    elif source.name.endswith((".tar.gz", ".tgz", ".tar")):
        with tarfile.open(source) as tar:
            for m in tar.getmembers():
                f = tar.extractfile(m) if m.isfile() and m.name.endswith(".json") else None
                if f is not None:
                    files[Path(m.name).name] = json.load(io.TextIOWrapper(f))
    else:  # gpu-check's summary.json
        summary = json.loads(source.read_text())
        files = {f"{k}.json": v for k, v in summary.get("benchmarks", {}).items()}
        if "machine" in summary:
            files["machine.json"] = summary["machine"]
    machine = files.pop("machine.json", None) or {}
    if "commit" not in machine:  # the GPU machine's copy of the tree has no history
        commit = _git("rev-parse", "--short", "HEAD")
        if commit:
            machine["commit"] = commit + (" (+ changes)" if _git("status", "--porcelain") else "")
    benches = {k[:-5]: v for k, v in files.items()
               if k.startswith("bench_") and isinstance(v, dict) and "error" not in v}
    if not benches:
        raise SystemExit(f"no bench_*.json results in {source}")
    simulated = [n for n, d in benches.items() if d.get("simulated") or d.get("backend") == "sim"]
    if simulated and not allow_simulated:
        raise SystemExit(f"simulated results, not a GPU's: {', '.join(simulated)} "
                         "(--allow-simulated takes them for a preview)")
    results.mkdir(parents=True, exist_ok=True)
    for name, data in benches.items():
        data = {**data, "machine": machine}
        (results / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")
    return list(benches)


# -- rendering --------------------------------------------------------------------------------


def slug(text: str) -> str:
    """An HTML id made of ``text``'s words."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def md_text(text: str) -> str:
    """``text`` safe inside a Markdown table cell (no emphasis, no tags, no cell breaks)."""
    return (text.replace("\\", "\\\\").replace("|", "\\|").replace("*", "\\*")
            .replace("_", "\\_").replace("<", "&lt;").replace("`", "\\`"))


def _split(row: dict[str, Any], last_group: str) -> tuple[str, str]:
    """The row's group and case text: ``"group: case"``, or a continuation of the last."""
    case = str(row.get("case", ""))
    if "group" in row or "path" in row:
        return str(row.get("group", row.get("path"))), case
    if case.startswith(" "):
        return last_group, case.strip()
    if "case" not in row and "size" in row:
        return "", fmt_value("size", row["size"])
    group, sep, rest = case.partition(": ")
    return (group, rest) if sep else ("", case)


def _columns(rows: list[dict[str, Any]]) -> list[str]:
    """The row keys shown as columns, in the order they first appear."""
    cols: list[str] = []
    for r in rows:
        for k, v in r.items():
            if (k not in FOLDED and k not in cols and v is not None
                    and not isinstance(v, (list, dict)) and not (k == "size" and "case" not in r)):
                cols.append(k)
    return cols


def _header(key: str, rows: list[dict[str, Any]]) -> str:
    units = {r.get("unit") for r in rows if r.get(key) is not None}
    if key == "us" and len(units) == 1 and None not in units:
        return str(units.pop())
    return HEADERS.get(key, key.replace("_", " "))


def _cell(key: str, row: dict[str, Any], header: str) -> str:
    v = row.get(key)
    if v is None:
        return NONE
    if key == "ratio" and row.get("vs"):
        return f'<span class="num">{v:.3f}x</span> {md_text(str(row["vs"]))}'
    text = fmt_value(key, v)
    if key == "us" and row.get("unit") and header != row["unit"]:
        text += f" {row['unit']}"
    return f'<span class="num">{md_text(text)}</span>'


def _target(row: dict[str, Any], plain: bool = False) -> str:
    """The target cell: the bound and whether this run met it.

    ``plain``: the bound alone in plain words (the summary table), without how the scripts
    split a miss between the library and what its promises cost.
    """
    target, ok = str(row.get("target") or ""), row.get("ok")
    if target in ("info", "reference"):  # no bound: nothing to meet or miss
        return f"<small>{target}</small>"
    verdict = "" if ok is None else ("**met**" if ok else "**missed**")
    return " ".join(x for x in (md_text(plain_target(target) if plain else target), verdict)
                    if x)


#: The scripts' words for their yardsticks, and what they mean to a reader of the report.
PLAIN = ((re.compile(r"\bits floor \+ ledger\b"),
          "the thinnest Python wrapper with the same API and statistics"),
         (re.compile(r"\bthe floor \(fills and raw copies at once, no Loader\)"),
          "workers filling slots and raw copies, without the Loader"))


def plain_target(target: str) -> str:
    """A target in plain words: the bound and this run's figure, nothing of the analysis."""
    text = target.split(";", 1)[0].strip()
    for pattern, words in PLAIN:
        text = pattern.sub(words, text)
    return text


def row_anchors(benches: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """The HTML id of every row of every benchmark (the rows' links, unique on the page)."""
    ids = {spec.id for spec in bench_compare.SPECS}
    anchors = {}
    for name, data in benches.items():
        last, mine = "", []
        for r in rows_of(data):
            last, case = _split(r, last)
            mine.append(_unique(slug(f"{name.removeprefix('bench_')} {last} {case}"), ids))
        anchors[name] = mine
    return anchors


def bench_tables(data: dict[str, Any], anchors: list[str]) -> list[str]:
    """The Markdown of one benchmark's tables: one per group of rows."""
    rows = rows_of(data)
    if not rows:
        why = data.get("not_measured") or "no rows"
        return [f"Not measured in this run: {md_text(str(why))}.", ""]
    groups: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    last = ""
    for r, anchor in zip(rows, anchors, strict=True):
        last, case = _split(r, last)
        groups.setdefault(last, []).append((case, anchor, r))
    out: list[str] = []
    for group, members in groups.items():
        grows = [r for _, _, r in members]
        cols = _columns(grows)
        heads = [_header(c, grows) for c in cols]
        has_target = any(r.get("target") or r.get("ok") is not None for r in grows)
        if group:
            out += [f"**{md_text(group)}**", ""]
        out.append("| case | " + " | ".join(heads) + (" | target |" if has_target else " |"))
        out.append("|---|" + "---:|" * len(cols) + ("---|" if has_target else ""))
        notes = []
        for case, anchor, r in members:
            label = md_text(case) if case else NONE
            if r.get("note"):
                notes.append(f"{case}: {r['note']}")
                label += f" <sup>{len(notes)}</sup>"
            cells = [f'<span id="{anchor}"></span>{label}']
            cells += [_cell(c, r, h) for c, h in zip(cols, heads, strict=True)]
            if has_target:
                cells.append(_target(r))
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
        if notes:
            out += [f"{i}. {md_text(n)}" for i, n in enumerate(notes, 1)] + [""]
    return out


def _unique(anchor: str, ids: set[str]) -> str:
    n, base = 2, anchor
    while anchor in ids:
        anchor, n = f"{base}-{n}", n + 1
    ids.add(anchor)
    return anchor


def machine_lines(machine: dict[str, Any]) -> list[str]:
    """Device, driver, library versions, date and commit, as a short list."""
    if not machine:
        return ["- machine: not recorded"]
    gpu = machine.get("gpu", "unknown GPU")
    if machine.get("gpus", 1) > 1:
        gpu = f"{machine['gpus']} x {gpu}"
    if machine.get("memory_gib"):
        gpu += f" ({machine['memory_gib']} GiB)"
    vers = ", ".join(f"{k} {v}" for k, v in machine.get("versions", {}).items())
    host = (f"- host: {machine['cpus']} CPU cores for the process"
            if machine.get("cpus") else "- host: CPU cores not recorded")
    return [f"- GPU: {gpu}, driver {machine.get('driver', '?')}", host,
            f"- Python {machine.get('python', '?')}; {vers}",
            f"- date: {machine.get('date', '?')}; commit: {machine.get('commit', 'not recorded')}"]


def targets_table(benches: dict[str, dict[str, Any]]) -> list[str]:
    """Every row that has a target, with its verdict."""
    lines = ["| benchmark | case | result | target |", "|---|---|---:|---|"]
    for name, data in benches.items():
        last = ""
        for r in rows_of(data):
            last, case = _split(r, last)
            if r.get("ok") is None or r.get("target") in ("info", "reference"):
                continue
            value = next((fmt_value(k, r[k]) + (f" {r['unit']}" if k == "us" and r.get("unit")
                                                 else f" {HEADERS.get(k, k)}")
                          for k in ("us", "gbps", "ms", "median_ms", "growable_us", "added_us",
                                    "memkit_ms")
                          if r.get(k) is not None), NONE)
            ratio = f"{r['ratio']:.3f}x {r.get('vs', '')}".strip() if r.get("ratio") else ""
            result = f"{value}, {ratio}" if ratio else value
            label = f"{group_label(last)}{case}"
            lines.append(f"| {name.removeprefix('bench_')} | {md_text(label)} | "
                         f'<span class="num">{md_text(result)}</span> | '
                         f"{_target(r, plain=True)} |")
    return [*lines, ""] if len(lines) > 2 else ["No recorded row has a target.", ""]


def group_label(group: str) -> str:
    return f"{group}: " if group else ""


def report(benches: dict[str, dict[str, Any]], comparisons: list[Comparison],
           plots: dict[str, str], anchors: dict[str, list[str]]) -> str:
    """The Markdown of docs/benchmarks.md: every section, measured or not (guides link them)."""
    machines = {json.dumps(d.get("machine", {}), sort_keys=True) for d in benches.values()}
    out = ["# Benchmarks", "",
           "<!-- Written by scripts/bench_report.py from benchmarks/results/: edit those, "
           "not this page. -->", "",
           "Each benchmark script measures cuda_memkit, the raw `cuda.bindings` calls and the "
           "other libraries **in the same process, interleaved**, and reports medians. "
           "Compare the rows of one table; absolute times move between runs with the host.",
           "", "- `ratio`: against the row named after it (`contig`: one contiguous copy of the "
           "same bytes; `raw`: the raw driver calls).",
           "- `target`: the bound the project holds the row to, and whether this run met it; "
           "`info` and `reference` rows have none.",
           "- Reproduce: `bash scripts/gpu-check bench` on a GPU machine, then "
           "`python scripts/bench_report.py --import .gpu-out/results.tar.gz`; each script also "
           "runs alone (`python benchmarks/bench_pool.py`; `--quick` on the simulator, which "
           "labels its numbers simulated).", ""]
    out += ["## Machine", ""]
    if not benches:
        out += ["No GPU run is recorded in `benchmarks/results/` yet.", ""]
    elif len(machines) == 1:
        out += [*machine_lines(next(iter(benches.values())).get("machine", {})), ""]
    else:
        out += ["The benchmarks below come from more than one run:", ""]
        runs: dict[str, list[str]] = {}
        for name, data in benches.items():
            runs.setdefault(json.dumps(data.get("machine", {}), sort_keys=True), []).append(name)
        for key, names in runs.items():
            out += [f"**{', '.join(names)}**", "", *machine_lines(json.loads(key)), ""]
    out += ["## Against the other libraries", "",
            "The comparisons the [why page](why.md) quotes: cuda_memkit's bars in colour, the "
            "other libraries' in grey, the raw driver's in light grey.", ""]
    for c in comparisons:
        out += c.section(plots.get(c.id))
    out += ["## Targets", "", "Every row that carries a target, and whether this run met it "
            "(the tables below give the detail).", ""]
    out += targets_table(benches)
    for name in [*AREAS, *(n for n in benches if n not in AREAS)]:
        data = benches.get(name)
        # A script's own title and intro (in its JSON) win over the defaults listed here.
        title, about = AREAS.get(name, (name, ""))
        title = str((data or {}).get("title", title))
        about = str((data or {}).get("about", about))
        out += [f"## {title}", ""]
        if about:
            out += [about, ""]
        if data is None:
            out += [f"`python benchmarks/{name}.py`: not in the recorded results.", ""]
            continue
        if len(machines) > 1:
            m = data.get("machine", {})
            out += [f"Measured {m.get('date', '?')} on {m.get('gpu', '?')}.", ""]
        out += [f"`python benchmarks/{name}.py`", ""]
        out += bench_tables(data, anchors[name])
    return "\n".join(out).rstrip() + "\n"


def fill_regions(text: str, regions: dict[str, str]) -> str:
    """``text`` with each ``bench-report`` region replaced by its new content."""
    def sub(m: re.Match[str]) -> str:
        if m.group(2) not in regions:
            raise SystemExit(f"unknown bench-report region {m.group(2)!r}")
        return m.group(1) + regions[m.group(2)] + m.group(4)

    return REGION.sub(sub, text)


def render(results: Path, docs: Path) -> tuple[dict[Path, str], dict[str, Comparison]]:
    """Everything the results make: ``{path: text}`` and the plots by file name."""
    benches = load(results)
    anchors = row_anchors(benches)
    comparisons = bench_compare.comparisons(benches, anchors)
    plots = {c.id: f"{IMAGES}/{c.id}-{c.digest()}.png" for c in comparisons if c.plottable()}
    headline = [c for c in comparisons
                if c.id in bench_compare.HEADLINE and c.headline_view().plottable()]
    if headline:
        digest = hashlib.sha1("".join(c.digest() for c in headline).encode()).hexdigest()[:10]
        plots["headline"] = f"{IMAGES}/headline-{digest}.png"
    files = {docs / "benchmarks.md": report(benches, comparisons, plots, anchors)}
    regions_docs = bench_compare.regions(benches, comparisons, plots.get("headline"), "")
    regions_readme = bench_compare.regions(benches, comparisons, plots.get("headline"), "docs/",
                                           README_LINKS)
    for page, regions in ((docs / "index.md", regions_docs), (docs / "why.md", regions_docs),
                          (docs.parent / "README.md", regions_readme)):
        if page.exists():
            files[page] = fill_regions(page.read_text(), regions)
    by_file = {Path(p).name: c for c in comparisons if (p := plots.get(c.id))}
    if "headline" in plots:
        by_file[Path(plots["headline"]).name] = bench_compare.Headline(headline)
    return files, by_file


def write(results: Path, docs: Path) -> list[Path]:
    """Write the report, the regions and the plots; remove plots no page names any more."""
    files, plots = render(results, docs)
    changed = [p for p, text in files.items() if not p.exists() or p.read_text() != text]
    for p in changed:
        p.write_text(files[p])
    folder = docs / IMAGES
    folder.mkdir(parents=True, exist_ok=True)
    for name, plot in plots.items():
        if not (folder / name).exists():
            plot.draw(folder / name)
            changed.append(folder / name)
    for old in folder.glob("*.png"):
        if old.name not in plots:
            old.unlink()
            changed.append(old)
    return changed


def stale(results: Path, docs: Path) -> list[str]:
    """What differs from what the results make (the plots by name: their names carry the data)."""
    files, plots = render(results, docs)
    problems = [f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p} is not what the "
                "results make" for p, text in files.items()
                if not p.exists() or p.read_text() != text]
    folder = docs / IMAGES
    have = {p.name for p in folder.glob("*.png")} if folder.exists() else set()
    problems += [f"missing plot {IMAGES}/{n}" for n in sorted(set(plots) - have)]
    problems += [f"plot no page shows: {IMAGES}/{n}" for n in sorted(have - set(plots))]
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--import", dest="source", type=Path,
                    help="take a GPU run's results first (results.tar.gz, summary.json, folder)")
    ap.add_argument("--allow-simulated", action="store_true",
                    help="take simulated results too (for a preview: use --results elsewhere)")
    ap.add_argument("--check", action="store_true", help="only say what is out of date")
    ap.add_argument("--machine", type=Path, help="write this machine's record there and stop")
    ap.add_argument("--results", type=Path, default=RESULTS, help="the results folder")
    ap.add_argument("--docs", type=Path, default=ROOT / "docs", help="the docs folder")
    args = ap.parse_args()
    if args.machine:
        args.machine.parent.mkdir(parents=True, exist_ok=True)
        args.machine.write_text(json.dumps(machine_record(), indent=1) + "\n")
        return 0
    if args.source:
        names = take_results(args.source, args.results, args.allow_simulated)
        print(f"took {len(names)} result(s): {', '.join(sorted(names))}")
    if args.check:
        problems = stale(args.results, args.docs)
        for p in problems:
            print(p)
        if problems:
            print("run: python scripts/bench_report.py", file=sys.stderr)
        return 1 if problems else 0
    for p in write(args.results, args.docs):
        print(f"{'wrote' if p.exists() else 'removed'} {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
