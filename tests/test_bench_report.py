"""The benchmark report (scripts/bench_report.py): written from the recorded results alone.

The committed pages must be what the committed results make, so that no number on them can
drift from its run; the generator itself is tested on a small made-up run (every number
below is invented for the test).
"""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import bench_compare  # noqa: E402
import bench_report  # noqa: E402

sys.path.remove(str(ROOT / "scripts"))

MACHINE = {"date": "2030-01-02 03:04 UTC", "gpu": "Test GPU", "gpus": 2, "driver": "999.1",
           "memory_gib": 80, "python": "3.12.0", "versions": {"numpy": "2.0", "cupy": "14"},
           "commit": "abc1234"}


def _pool_rows() -> list[dict[str, Any]]:
    def row(case: str, us: float | None, target: str = "info", ok: bool | None = None,
            note: str = "") -> dict[str, Any]:
        r: dict[str, Any] = {"case": case, "us": us, "unit": "us/pair", "ratio": None,
                             "target": target, "ok": ok, "floor_us": None}
        if note:
            r["note"] = note
        return r

    return [
        row("1 MiB: raw cuMemAllocFromPoolAsync + cuMemFreeAsync", 2.0, "reference"),
        row("1 MiB: MemoryPool(cache=True).allocate(stream=s).free()", 1.0,
            "<= 1x CuPy MemoryPool().malloc (2.00x)", False),
        row("   the same row", 1.0, "ahead of torch (0.5x)", True),
        row("1 MiB: MemoryPool.allocate(stream=s).free() (uncached)", 2.5),
        row("1 MiB: CuPy MemoryPool().malloc (caching, direct)", 0.5),
        row("1 MiB: CuPy malloc_async", 1.5),
        row("1 MiB: cuda.core Device.allocate + Buffer.close", None, note="ImportError: no"),
        row("1 MiB: torch.empty(device='cuda')", 2.0),
        row("4 KiB pinned: HostBuffer.pooled(4096).close()", 0.8),
    ]


def _write_run(folder: Path, *, simulated: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    pool = {"backend": "sim" if simulated else "cuda", "simulated": simulated,
            "rows": _pool_rows()}
    multi = {"backend": "cuda", "title": "Several GPUs", "about": "Copies between two GPUs.",
             "rows": [
                 {"case": "peer copy 1 GiB: memkit copy", "gbps": 300.0, "ratio": 1.0,
                  "compare": "Copy 1 GiB between two GPUs", "library": "cuda_memkit",
                  "label": "`copy(dst, src)`"},
                 {"case": "peer copy 1 GiB: torch copy_", "gbps": 350.0,
                  "compare": "Copy 1 GiB between two GPUs", "library": "PyTorch",
                  "label": "`copy_`"}]}
    empty = {"backend": "cuda", "rows": [], "not_measured": "needs CuPy on a GPU"}
    for name, data in (("bench_pool", pool), ("bench_multigpu", multi),
                       ("bench_workload", empty)):
        (folder / f"{name}.json").write_text(json.dumps(data))
    (folder / "machine.json").write_text(json.dumps(MACHINE))


@pytest.fixture
def site(tmp_path: Path) -> tuple[Path, Path]:
    """A results folder holding an imported made-up run, and a docs folder with regions."""
    run = tmp_path / "run"
    _write_run(run)
    results, docs = tmp_path / "results", tmp_path / "site" / "docs"
    docs.mkdir(parents=True)
    region = "x\n<!-- bench-report:{0} -->\nold\n<!-- /bench-report:{0} -->\ny\n"
    (docs / "index.md").write_text(region.format("headline"))
    (docs / "why.md").write_text(region.format("peers"))
    (docs.parent / "README.md").write_text(region.format("headline"))
    assert sorted(bench_report.take_results(run, results, False)) == [
        "bench_multigpu", "bench_pool", "bench_workload"]
    return results, docs


def test_committed_pages_are_what_the_committed_results_make() -> None:
    problems = bench_report.stale(bench_report.RESULTS, ROOT / "docs")
    assert problems == [], "run: python scripts/bench_report.py\n" + "\n".join(problems)


def test_committed_results_are_a_gpus() -> None:
    for path in bench_report.RESULTS.glob("bench_*.json"):
        data = json.loads(path.read_text())
        assert not data.get("simulated") and data.get("backend") != "sim", path.name
        assert data.get("machine", {}).get("gpu"), f"{path.name}: no machine record"


def test_import_stores_each_result_with_its_machine(site: tuple[Path, Path]) -> None:
    results, _docs = site
    pool = json.loads((results / "bench_pool.json").read_text())
    assert pool["machine"] == MACHINE
    assert pool["rows"] == _pool_rows()
    assert not (results / "machine.json").exists()


def test_import_refuses_simulated_results(tmp_path: Path) -> None:
    _write_run(tmp_path / "run", simulated=True)
    with pytest.raises(SystemExit, match="simulated results, not a GPU's: bench_pool"):
        bench_report.take_results(tmp_path / "run", tmp_path / "results", False)
    assert not (tmp_path / "results").exists()
    assert "bench_pool" in bench_report.take_results(tmp_path / "run", tmp_path / "results",
                                                     True)


@pytest.mark.parametrize("form", ["tarball", "summary"])
def test_import_takes_what_gpu_check_brings_back(tmp_path: Path, form: str) -> None:
    run = tmp_path / "work" / "results"
    _write_run(run)
    if form == "tarball":
        source = tmp_path / "results.tar.gz"
        with tarfile.open(source, "w:gz") as tar:
            tar.add(tmp_path / "work", arcname=".")
            log = b"not json"
            info = tarfile.TarInfo("./bench_pool.log")
            info.size = len(log)
            tar.addfile(info, io.BytesIO(log))
    else:
        source = tmp_path / "summary.json"
        source.write_text(json.dumps({
            "suite": {}, "machine": MACHINE,
            "benchmarks": {p.stem: json.loads(p.read_text()) for p in run.glob("bench_*.json")}}))
    names = bench_report.take_results(source, tmp_path / "results", False)
    assert sorted(names) == ["bench_multigpu", "bench_pool", "bench_workload"]
    stored = json.loads((tmp_path / "results" / "bench_multigpu.json").read_text())
    assert stored["machine"] == MACHINE


def test_import_without_results_says_so(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    with pytest.raises(SystemExit, match="no bench_"):
        bench_report.take_results(tmp_path / "run", tmp_path / "results", False)


def test_report_tables_targets_and_machine(site: tuple[Path, Path]) -> None:
    results, docs = site
    files, _plots = bench_report.render(results, docs)
    page = files[docs / "benchmarks.md"]
    assert "- GPU: 2 x Test GPU (80 GiB), driver 999.1" in page
    assert "- host: CPU cores not recorded" in page
    assert "commit: abc1234" in page and "2030-01-02 03:04 UTC" in page
    # One table per group of rows, every row with its anchor; a continuation row stays in it.
    assert "**1 MiB**" in page and "**4 KiB pinned**" in page
    assert ('<span id="pool-1-mib-memorypool-cache-true-allocate-stream-s-free"></span>'
            "MemoryPool(cache=True).allocate(stream=s).free()") in page
    assert '<span id="pool-1-mib-the-same-row"></span>the same row' in page
    assert "| us/pair | floor us | target |" not in page  # an empty column is left out
    assert "&lt;= 1x CuPy MemoryPool().malloc (2.00x) **missed**" in page
    assert "ahead of torch (0.5x) **met**" in page
    # The targets table gathers both verdicts in plain words; a script that did not measure
    # says why.
    targets = page.split("## Targets", 1)[1].split("## ", 1)[0]
    assert targets.count("**missed**") == 1 and targets.count("**met**") == 1
    assert "OK" not in targets and "MISS" not in targets and "BLOCKED" not in targets
    assert "Not measured in this run: needs CuPy on a GPU." in page
    # A script the report does not know gets a section under its own title.
    assert "## Several GPUs\n\nCopies between two GPUs.\n\n`python benchmarks/bench_multigpu.py`" \
        in page
    # Every known area has its section, measured or not (the guides link to them).
    for title, _about in bench_report.AREAS.values():
        assert f"\n## {title}\n" in page
    assert "`python benchmarks/bench_vmm.py`: not in the recorded results." in page


def test_comparisons_say_plainly_where_a_peer_is_faster(site: tuple[Path, Path]) -> None:
    results, docs = site
    files, _plots = bench_report.render(results, docs)
    page = files[docs / "benchmarks.md"]
    pool = page.split("{#pool-pair}", 1)[1].split("###", 1)[0]
    assert "| [CuPy](#pool-1-mib-cupy-memorypool-malloc-caching-direct) | `MemoryPool().malloc` |" \
        in pool
    assert "**2.00x faster**" in pool        # CuPy's pool: 0.5 against memkit's 1.0
    assert "| 1.50x slower |" in pool        # malloc_async
    assert "not measured</span>" in pool and "ImportError: no" in pool
    assert "images/benchmarks/pool-pair-" in pool
    # Throughput: more is better; a comparison tagged in the rows of a new script.
    multi = page.split("{#copy-1-gib-between-two-gpus}", 1)[1].split("##", 1)[0]
    assert "GB/s, higher is better" in multi and "**1.17x faster**" in multi
    why = files[docs / "why.md"]
    assert ("CuPy's `MemoryPool().malloc` (0.500 us per pair) is 2.00x faster than "
            "cuda_memkit's `MemoryPool(cache=True)` (1.000).") in why
    assert "PyTorch's `copy_` (350.0 GB/s) is 1.17x faster" in why
    assert "RMM is measured by no benchmark of this run" in why
    assert "*Measured on Test GPU, 2030-01-02, every library in the same run.*" in why
    assert why.startswith("x\n<!-- bench-report:peers -->\n") and why.endswith(
        "<!-- /bench-report:peers -->\ny\n")


def test_headline_regions_name_the_plot(site: tuple[Path, Path]) -> None:
    results, docs = site
    files, plots = bench_report.render(results, docs)
    readme, index = files[docs.parent / "README.md"], files[docs / "index.md"]
    headline = next(n for n in plots if n.startswith("headline-"))
    assert f"(docs/images/benchmarks/{headline})" in readme
    assert f"({bench_report.README_LINKS}benchmarks.md)" in readme
    assert f"(images/benchmarks/{headline})" in index and "(benchmarks.md)" in index
    assert isinstance(plots[headline], bench_compare.Headline)


def test_write_draws_the_plots_and_then_nothing_is_stale(site: tuple[Path, Path]) -> None:
    pytest.importorskip("matplotlib", reason="the plots are drawn with matplotlib")
    results, docs = site
    folder = docs / bench_report.IMAGES
    folder.mkdir(parents=True)
    (folder / "pool-pair-0000000000.png").write_bytes(b"an old plot")
    assert bench_report.stale(results, docs)
    bench_report.write(results, docs)
    assert bench_report.stale(results, docs) == []
    names = sorted(p.name for p in folder.glob("*.png"))
    assert not any(n.startswith("pool-pair-0000") for n in names)
    # The pinned comparison has cuda_memkit's row alone in this run: nothing to set it against.
    assert {n.split("-")[0] for n in names} == {"copy", "headline", "pool"}
    assert all((folder / n).read_bytes().startswith(b"\x89PNG") for n in names)
    # A number changes: the page and the plot's name change with it.
    data = json.loads((results / "bench_pool.json").read_text())
    data["rows"][1]["us"] = 0.9
    (results / "bench_pool.json").write_text(json.dumps(data))
    problems = bench_report.stale(results, docs)
    assert any("benchmarks.md is not what the results make" in p for p in problems)
    assert any(p.startswith("missing plot images/benchmarks/pool-pair-") for p in problems)


def test_without_results_every_page_says_none_is_recorded(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "why.md").write_text("<!-- bench-report:peers -->\nx\n<!-- /bench-report:peers -->\n")
    files, plots = bench_report.render(tmp_path / "none", docs)
    assert plots == {}
    assert "No GPU run is recorded in `benchmarks/results/` yet." in files[docs / "benchmarks.md"]
    assert "No GPU run is recorded yet" in files[docs / "why.md"]


def test_an_unknown_region_is_an_error() -> None:
    with pytest.raises(SystemExit, match="unknown bench-report region 'nope'"):
        bench_report.fill_regions("<!-- bench-report:nope -->\n<!-- /bench-report:nope -->",
                                  {"peers": ""})


@pytest.mark.parametrize("key, value, text", [
    ("size", 32 << 20, "32 MiB"), ("size", 3000, "3000 B"), ("ratio", 1.23456, "1.235x"),
    ("vs_raw", 2.0, "2.000x"), ("us", 123.456, "123.5"), ("us", 12.345, "12.35"),
    ("us", 1.23456, "1.235"), ("entries", 64, "64"), ("ok", True, "yes")])
def test_values_are_formatted_by_their_key(key: str, value: Any, text: str) -> None:
    assert bench_compare.fmt_value(key, value) == text


# -- figures that agree with themselves ------------------------------------------------------

RATE = ("/s", "per second")


def _committed() -> list[bench_compare.Comparison]:
    benches = bench_report.load(bench_report.RESULTS)
    return bench_compare.comparisons(benches, bench_report.row_anchors(benches))


def test_each_plots_better_direction_follows_its_unit() -> None:
    """A rate is better higher, a time lower: in the words under each plot's axis too."""
    plt = pytest.importorskip("matplotlib.pyplot", reason="the plots are drawn with matplotlib")
    comps = [c for c in _committed() if c.plottable()]
    assert len(comps) >= 5
    for c in comps:
        rate = any(r in c.unit for r in RATE)
        assert c.higher_better is rate, (c.id, c.unit)
        for view in (c, c.headline_view()):
            fig, ax = plt.subplots()
            try:
                view.bars(ax)
                label = ax.get_xlabel()
            finally:
                plt.close(fig)
            assert label == f"{c.unit}, {'higher' if rate else 'lower'} is better", (c.id, label)


def test_a_plots_name_changes_with_its_words() -> None:
    """A plot is drawn only when its file is missing: its name must change with its labels."""
    c = next(c for c in _committed() if c.id == "loader-64")
    flipped = bench_compare.Comparison(c.id, c.title, c.short, c.bench, c.unit,
                                       not c.higher_better, c.about, c.entries)
    assert flipped.digest() != c.digest()


def test_two_way_rates_are_the_bytes_of_both_ways_over_the_time() -> None:
    """A row set against one direction states a total that is its ratio times that rate."""
    rows = bench_compare.rows_of(json.loads(
        (bench_report.RESULTS / "bench_multigpu.json").read_text()))
    one = next(r for r in rows if r["case"].endswith("copy_async one direction"))
    both = next(r for r in rows if r.get("vs") == "one way")
    assert both["gbps"] == pytest.approx(both["ratio"] * one["gbps"], rel=1e-6)
    per_direction = float(both["note"].split()[2])
    assert per_direction == pytest.approx(both["gbps"] / 2, abs=0.05)


def test_the_raw_pinned_pairs_say_what_else_is_alive() -> None:
    """The same raw call in two tables, in two situations: each row names its own."""
    pool = [r["case"] for r in bench_compare.rows_of(json.loads(
        (bench_report.RESULTS / "bench_pool.json").read_text()))]
    pinned = [r["case"] for r in bench_compare.rows_of(json.loads(
        (bench_report.RESULTS / "bench_pinned.json").read_text()))]
    raw = [c for c in pool + pinned if "raw cuMemHostAlloc" in c]
    assert len(raw) >= 2
    assert all("(other small pinned blocks alive)" in c or "(no other pinned memory alive)" in c
               for c in raw), raw


def test_defaults_are_shown_beside_the_best_and_behind_whom(site: tuple[Path, Path]) -> None:
    results, docs = site
    files, _plots = bench_report.render(results, docs)
    why = files[docs / "why.md"]
    assert "2.500 <small>MemoryPool(0), the default (no cache)</small>" in why
    assert ("cuda_memkit's `MemoryPool(0)`, the default (no cache) (2.500 us per pair): "
            "behind CuPy's `MemoryPool().malloc` (0.500, 5.00x faster)") in why
    benches = bench_report.load(results)
    pool = next(c for c in bench_compare.comparisons(benches, bench_report.row_anchors(benches))
                if c.id == "pool-pair")
    shown = [e.label for e in pool.headline_view().entries]
    assert "`MemoryPool(0)`, the default (no cache)" in shown
    assert not any(e.library == "raw driver" for e in pool.headline_view().entries)


def test_not_measured_is_not_no_call(site: tuple[Path, Path]) -> None:
    """In the numbers table a dash means no such call; a library with one that the run did
    not measure says so."""
    results, docs = site
    files, _plots = bench_report.render(results, docs)
    why = files[docs / "why.md"]
    pool_row = next(line for line in why.splitlines() if "(benchmarks.md#pool-pair)" in line)
    assert pool_row.split(" | ")[4] == "<small>not measured</small>"  # RMM has a pool
    assert "A dash (\u2013): the library has no call for it; *not measured*:" in why
    loader = next(s for s in bench_compare.SPECS if s.id == "loader-64")
    assert "CuPy" in loader.no_api and "PyTorch" not in loader.no_api


def test_captions_name_every_run_the_comparisons_come_from(site: tuple[Path, Path]) -> None:
    results, docs = site
    path = results / "bench_multigpu.json"
    data = json.loads(path.read_text())
    data["machine"] = {**data["machine"], "date": "2030-02-03 04:05 UTC", "commit": "def5678"}
    path.write_text(json.dumps(data))
    files, _plots = bench_report.render(results, docs)
    why, index = files[docs / "why.md"], files[docs / "index.md"]
    caption = ("*Measured on Test GPU in 2 runs, 2030-01-02 to 2030-02-03, every library of a "
               "question in the same run")
    assert caption + ".*" in why and caption + "; cuda_memkit in colour." in index
    assert "every library in the same run" not in why + index
    assert "RMM is measured by no benchmark of these runs" in why
