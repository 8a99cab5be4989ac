"""What a :class:`~cuda_memkit.Tracker` recorded, for people: summaries, timelines, JSON, plots.

Everything here is built from the tracker's event tuples when asked for, so
recording stays cheap.

JSON schema (``cuda_memkit.track/1``), written by :meth:`Tracker.save`::

    {
      "schema": "cuda_memkit.track/1",
      "backend": "cuda" | "sim",
      "started_at": float,        # time.time() at start
      "duration": float,          # seconds recorded
      "stacks": bool, "threads": "all" | "current",
      "baseline": {kind: bytes},  # bytes held per kind at start (every kind)
      "events": [event, ...],     # MemoryEvent.to_dict(), in order
      "live": [allocation, ...],  # Allocation.to_dict(): made while recording, alive at save
      "summary": {"kinds": [...], "sites": [...]},
      "errors": [str, ...]        # failures inside the watcher (normally empty)
    }

An event: ``time`` (seconds since start), ``action`` ("alloc", "free",
"grow", "shrink"), ``kind``, ``device`` (null: host), ``pool`` (pool handle or
null), ``address``, ``nbytes``, ``stream`` (handle or null), ``thread``,
``site`` (``[file, line, function]`` or null) and ``stack`` (a list of those,
outermost first, or null).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from dataclasses import dataclass
from typing import Any, Protocol

from .._core import _driver
from .._core._resource import KINDS
from ._observe import ALLOC, FREE, GROW, Allocation, Frame, MemoryEvent, format_bytes

__all__ = ["SCHEMA", "KindSummary", "SiteSummary", "Timeline", "TrackSummary", "plot", "save",
           "summarize", "timeline", "to_dict"]

SCHEMA = "cuda_memkit.track/1"


class Tracker(Protocol):
    """What this module reads of a :class:`cuda_memkit.Tracker` (no import: no cycle)."""

    _t0: int
    _events: list[tuple[Any, ...]]
    _live: dict[tuple[Any, object], list[Any]]
    stacks: bool
    threads: str
    errors: list[Exception]

    @property
    def baseline(self) -> dict[str, int]: ...
    @property
    def duration(self) -> float: ...
    @property
    def started_at(self) -> float: ...
    def events(self) -> list[MemoryEvent]: ...
    def live(self) -> list[Allocation]: ...


@dataclass(frozen=True)
class Timeline:
    """Bytes of one memory kind over time (:meth:`Tracker.timeline`).

    Attributes
    ----------
    kind : str
        The memory kind.
    times : tuple of float
        Seconds since the tracker started: 0, then one entry per event of the
        kind, then the end of the recording.
    nbytes : tuple of int
        Bytes held from each time on (a step function).
    peak : int
        The most bytes held.
    peak_time : float
        When the peak was first reached.
    """

    kind: str
    times: tuple[float, ...]
    nbytes: tuple[int, ...]
    peak: int
    peak_time: float


@dataclass(frozen=True)
class KindSummary:
    """One kind's line of :meth:`Tracker.summary`.

    Attributes
    ----------
    kind : str
        The memory kind.
    allocations, frees : int
        Allocations and frees recorded.
    allocated_bytes, freed_bytes : int
        Bytes allocated and freed (growth and shrinking included).
    live, live_bytes : int
        Allocations made while recording that are still alive, and their bytes.
    start_bytes, peak_bytes, end_bytes : int
        The kind's timeline: bytes held at the start, at most, at the end.
    """

    kind: str
    allocations: int
    frees: int
    allocated_bytes: int
    freed_bytes: int
    live: int
    live_bytes: int
    start_bytes: int
    peak_bytes: int
    end_bytes: int


@dataclass(frozen=True)
class SiteSummary:
    """One call site's line of :meth:`Tracker.summary`.

    Attributes
    ----------
    site : Frame or None
        The first line outside cuda_memkit that allocated (``None``: unknown).
    kinds : tuple of str
        The kinds it allocated.
    allocations : int
        Allocations made there.
    allocated_bytes : int
        Bytes allocated there (growth of a growable buffer counts at the
        line that resized it).
    live, live_bytes : int
        Of those, still alive, and their bytes now.
    """

    site: Frame | None
    kinds: tuple[str, ...]
    allocations: int
    allocated_bytes: int
    live: int
    live_bytes: int


@dataclass(frozen=True, repr=False)
class TrackSummary:
    """Tables by kind and by call site (:meth:`Tracker.summary`); ``print()`` it.

    Attributes
    ----------
    kinds : tuple of KindSummary
        Kinds with events or live memory, in the order of ``MEMORY_KINDS``.
    sites : tuple of SiteSummary
        Call sites, those holding the most live bytes first, then those that
        allocated the most.
    duration : float
        Seconds recorded.
    """

    kinds: tuple[KindSummary, ...]
    sites: tuple[SiteSummary, ...]
    duration: float

    def to_dict(self) -> dict[str, Any]:
        """The tables as JSON-ready values."""
        return {
            "duration": self.duration,
            "kinds": [vars(k).copy() for k in self.kinds],
            "sites": [{**vars(s), "site": None if s.site is None else list(s.site),
                       "kinds": list(s.kinds)} for s in self.sites],
        }

    def table(self, max_sites: int = 20) -> str:
        """Both tables as text, at most ``max_sites`` call sites."""
        f = format_bytes
        lines = [f"cuda_memkit tracking summary ({self.duration:.3f} s)",
                 f"{'kind':<14}{'allocs':>8}{'frees':>8}{'allocated':>12}{'live':>7}"
                 f"{'live bytes':>12}{'start':>12}{'peak':>12}{'end':>12}"]
        for k in self.kinds:
            lines.append(f"{k.kind:<14}{k.allocations:>8}{k.frees:>8}{f(k.allocated_bytes):>12}"
                         f"{k.live:>7}{f(k.live_bytes):>12}{f(k.start_bytes):>12}"
                         f"{f(k.peak_bytes):>12}{f(k.end_bytes):>12}")
        if not self.kinds:
            lines.append("(no events)")
        lines += ["", "by call site (live bytes first):",
                  f"{'live bytes':>12}{'live':>7}{'allocs':>8}{'allocated':>12}  "
                  f"{'kinds':<22}site"]
        for s in self.sites[:max_sites]:
            lines.append(f"{f(s.live_bytes):>12}{s.live:>7}{s.allocations:>8}"
                         f"{f(s.allocated_bytes):>12}  {','.join(s.kinds):<22}"
                         f"{'(unknown)' if s.site is None else s.site}")
        if len(self.sites) > max_sites:
            lines.append(f"... {len(self.sites) - max_sites} more site(s)")
        if not self.sites:
            lines.append("(no allocations)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return self.table()


def timeline(tr: Tracker) -> dict[str, Timeline]:
    """Memory over time per kind (see :meth:`Tracker.timeline`)."""
    t0 = tr._t0
    base = tr.baseline
    points: dict[str, tuple[list[float], list[int]]] = {}
    cur = dict(base)
    for t, acct, _key, n, op, *_rest in list(tr._events):
        kind = acct.kind
        if kind not in points:
            points[kind] = ([0.0], [base.get(kind, 0)])
        cur[kind] = cur.get(kind, 0) + (n if op in (ALLOC, GROW) else -n)
        times, values = points[kind]
        times.append((t - t0) / 1e9)
        values.append(cur[kind])
    end = tr.duration
    out = {}
    for kind in KINDS:
        if kind not in points:
            continue
        times, values = points[kind]
        times.append(max(end, times[-1]))
        values.append(values[-1])
        peak = max(values)
        i = values.index(peak)
        out[kind] = Timeline(kind, tuple(times), tuple(values), peak, times[i])
    return out


def summarize(tr: Tracker) -> TrackSummary:
    """The tables of :meth:`Tracker.summary`."""
    counts: dict[str, list[int]] = {}  # kind -> allocs, frees, allocated, freed
    sites: dict[Frame | None, list[Any]] = {}  # -> kinds set, allocs, bytes, live, live bytes
    raw_sites: dict[Any, Frame | None] = {}

    def site_of(raw: Any) -> Frame | None:
        fr = raw_sites.get(raw, False)
        if fr is False:
            fr = raw_sites[raw] = None if raw is None else Frame(*raw)
        return fr  # type: ignore[return-value]

    for _t, acct, _key, n, op, _s, _tid, site, _stack in list(tr._events):
        c = counts.setdefault(acct.kind, [0, 0, 0, 0])
        if op == ALLOC:
            c[0] += 1
            c[2] += n
        elif op == GROW:
            c[2] += n
        elif op == FREE:
            c[1] += 1
            c[3] += n
        else:
            c[3] += n
        if op in (ALLOC, GROW):
            row = sites.setdefault(site_of(site), [set(), 0, 0, 0, 0])
            row[0].add(acct.kind)
            row[1] += op == ALLOC
            row[2] += n
    live_by_kind: dict[str, list[int]] = {}
    for (acct, _key), rec in list(tr._live.items()):
        lk = live_by_kind.setdefault(acct.kind, [0, 0])
        lk[0] += 1
        lk[1] += rec[1]
        row = sites.setdefault(site_of(rec[4]), [set(), 0, 0, 0, 0])
        row[0].add(acct.kind)
        row[3] += 1
        row[4] += rec[1]
    lines = timeline(tr)
    kinds = []
    for kind in KINDS:
        if kind not in counts and kind not in live_by_kind:
            continue
        c = counts.get(kind, [0, 0, 0, 0])
        lv = live_by_kind.get(kind, [0, 0])
        tl = lines.get(kind)
        start = tr.baseline.get(kind, 0)
        kinds.append(KindSummary(kind, c[0], c[1], c[2], c[3], lv[0], lv[1], start,
                                 tl.peak if tl else start, tl.nbytes[-1] if tl else start))
    order = list(KINDS)
    site_rows = [SiteSummary(site, tuple(sorted(row[0], key=order.index)), row[1], row[2],
                             row[3], row[4]) for site, row in sites.items()]
    site_rows.sort(key=lambda s: (-s.live_bytes, -s.allocated_bytes, -s.allocations))
    return TrackSummary(tuple(kinds), tuple(site_rows), tr.duration)


def to_dict(tr: Tracker) -> dict[str, Any]:
    """Everything a tracker recorded (the ``cuda_memkit.track/1`` schema)."""
    return {
        "schema": SCHEMA,
        "backend": _driver.backend_name(),
        "started_at": tr.started_at,
        "duration": tr.duration,
        "stacks": tr.stacks,
        "threads": tr.threads,
        "baseline": tr.baseline,
        "events": [e.to_dict() for e in tr.events()],
        "live": [a.to_dict() for a in tr.live()],
        "summary": summarize(tr).to_dict(),
        "errors": [f"{type(e).__name__}: {e}" for e in tr.errors],
    }


def save(tr: Tracker, path: Any) -> None:
    """Write ``to_dict(tr)`` as JSON to ``path``, atomically.

    The text goes to a new temporary file in the target's directory, which then
    replaces the target (``os.replace``): a failed write (a full disk, a file
    size limit) leaves an existing file as it was, and only the temporary file,
    which this function made, is removed. A target that exists but is not a
    regular file (a device, a FIFO: ``/dev/stdout``) is written in place and
    never removed or replaced.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or path-like, not {type(path).__name__}")
    text = json.dumps(to_dict(tr), indent=1)
    target = os.path.realpath(os.fspath(path))  # replace a symlink's file, not the link
    what = f"cannot save the tracking record to {os.fspath(path)!r}"
    try:
        st: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise _os_error(exc, what) from exc
    try:
        if st is not None and not stat.S_ISREG(st.st_mode):
            with open(target, "a", encoding="utf-8") as fh:  # "a": nothing truncated
                fh.write(text)
            return
        _write_replace(target, text, st)
    except OSError as exc:
        raise _os_error(exc, what) from exc


def _write_replace(target: str, text: str, st: os.stat_result | None) -> None:
    """Write ``text`` to a new temporary file next to ``target``, then rename it over ``target``."""
    folder, name = os.path.split(target)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    # O_EXCL: a file of ours, never an existing one; mode 0o666 less the umask,
    # as open() gives a new file (an existing target's mode is kept below).
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if st is not None:
            os.chmod(tmp, stat.S_IMODE(st.st_mode))
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)  # the temporary file is ours; the target was never touched
        raise


def _os_error(exc: OSError, what: str) -> OSError:
    """``exc`` again, of the same class, with a message saying what failed."""
    msg = f"cuda_memkit: {what}: {exc.strerror or exc}"
    if exc.errno is None:
        return type(exc)(msg)
    return type(exc)(exc.errno, msg)


def _scale(peak: int) -> tuple[float, str]:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if peak >= 1 << shift:
            return float(1 << shift), unit
    return 1.0, "B"


def plot(tr: Tracker, path: Any = None, kinds: Any = None) -> Any:
    """Memory over time, one panel per kind, peaks marked (see :meth:`Tracker.plot`)."""
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or path-like, not {type(path).__name__}")
    wanted = None
    if kinds is not None:
        wanted = [kinds] if isinstance(kinds, str) else list(kinds)
        bad = [k for k in wanted if k not in KINDS]
        if bad:
            raise ValueError(f"unknown memory kind(s) {bad}; one of {', '.join(KINDS)}")
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError("Tracker.plot() needs matplotlib, which is not installed: "
                          "pip install matplotlib (or cuda_memkit[plot])") from exc
    lines = {k: tl for k, tl in timeline(tr).items() if wanted is None or k in wanted}
    rows = max(len(lines), 1)
    size = (8.0, 1.0 + 1.7 * rows)
    if path is None:
        import matplotlib.pyplot as plt

        fig, grid = plt.subplots(rows, 1, sharex=True, squeeze=False, figsize=size)
    else:
        from matplotlib.figure import Figure

        fig = Figure(figsize=size)
        grid = fig.subplots(rows, 1, sharex=True, squeeze=False)
    axes = list(grid[:, 0])
    colors = matplotlib.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    for i, (kind, tl) in enumerate(lines.items()):
        ax, color = axes[i], colors[i % len(colors)]
        div, unit = _scale(tl.peak)
        ax.step(tl.times, [v / div for v in tl.nbytes], where="post", color=color,
                label=f"{kind} (peak {format_bytes(tl.peak)})")
        ax.plot([tl.peak_time], [tl.peak / div], marker="v", color=color, markersize=8,
                linestyle="none")
        ax.annotate(f"peak {format_bytes(tl.peak)}", (tl.peak_time, tl.peak / div),
                    textcoords="offset points", xytext=(6, -10), fontsize="small")
        ax.set_ylabel(f"{kind}\n({unit})")
        ax.set_ylim(bottom=0, top=max(tl.peak / div, 1e-9) * 1.15)
        ax.grid(alpha=0.3)
    if not lines:
        axes[0].text(0.5, 0.5, "no events recorded", ha="center", va="center",
                     transform=axes[0].transAxes)
    axes[0].set_title(f"cuda_memkit memory held, by kind ({_driver.backend_name()} backend)")
    axes[-1].set_xlabel("seconds since tracking started")
    if path is not None:
        try:
            fig.savefig(os.fspath(path), dpi=100, bbox_inches="tight")
        except OSError as exc:
            raise _os_error(exc, f"cannot save the plot to {os.fspath(path)!r}") from exc
    return fig
