"""Memory statistics of every kind: :func:`memory_stats` and :func:`reset_peak_stats`.

Both read the allocation ledger (:mod:`cuda_memkit._core._resource`), which every
owning object keeps up to date as it allocates and frees; nothing here keeps a
count of its own, and neither function calls the driver. The numbers are the
library's own bookkeeping: the bytes each allocation asked for, not the
driver's rounded sizes.

Peaks
-----
A ledger account (one memory kind on one device, one pool for pool buffers)
keeps an exact peak: the highest number of bytes it held at once. A sum of
peaks is not a peak (two 1 GiB buffers that never lived at the same time
would make 2 GiB), and keeping exact peaks of sums would cost every
allocation a second update, so only accounts report peaks:
:attr:`KindStats.peak`. The sums (:class:`Usage`, per kind over devices and
pools, per device over kinds) report current bytes, live allocations and
allocations made. For the peak of several kinds together over a stretch of a
program, use :func:`cuda_memkit.track` and its timeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._core._checks import check_int
from .._core._device import Device, check_ordinal
from .._core._resource import KINDS, LEDGER, Account, settle
from ._observe import format_bytes, where

__all__ = ["MEMORY_KINDS", "KindStats", "MemoryStats", "Usage", "memory_stats",
           "reset_peak_stats"]

#: Every memory kind cuda_memkit accounts for, in reporting order: kind -> what it holds.
MEMORY_KINDS: dict[str, str] = dict(KINDS)

#: Kinds whose bytes are another kind's memory seen again: a mapping of a
#: PhysicalMemory occupies no memory of its own, and a SharedHostRing's segment
#: is registered host memory (under "registered"), so totals leave them out.
ALIAS_KINDS = frozenset({"vmm_mapped", "shared_ring", "managed_resident"})

_ANY: Any = object()  # MemoryStats.pool() given a bare handle: any device


@dataclass(frozen=True, repr=False)
class KindStats:
    """Statistics of one memory kind on one device (of one pool, for pool buffers).

    Attributes
    ----------
    kind : str
        A key of :data:`MEMORY_KINDS`.
    device : int or None
        The device holding the memory; ``None`` for host memory (pinned,
        pooled pinned, registered, host pools).
    pool : int or None
        The pool handle (``MemoryPool.handle``) for kind ``"pool"``, else ``None``.
    current : int
        Bytes held now.
    peak : int
        The most bytes held at once since the first allocation or the last
        :func:`reset_peak_stats` (exact).
    live : int
        Allocations alive now.
    total : int
        Allocations made so far (cache hits included).
    cached : int
        Bytes freed by their users and held by block caches in front of this
        memory (``MemoryPool(cache=True)``, ``HostBuffer.pooled``, the
        adaptors), in rounded block sizes; not in ``current``.
    cached_peak : int
        The most bytes those caches held at once.
    """

    kind: str
    device: int | None
    pool: int | None
    current: int
    peak: int
    live: int
    total: int
    cached: int = 0
    cached_peak: int = 0

    @classmethod
    def of(cls, acct: Account) -> KindStats:
        """A snapshot of ledger account ``acct``."""
        return cls(acct.kind, acct.device, acct.pool, acct.current, acct.peak,
                   len(acct.live), acct.total, acct.cached, acct.cached_peak)

    def to_dict(self) -> dict[str, Any]:
        """The statistics as a JSON-ready dict."""
        return {"kind": self.kind, "device": self.device, "pool": self.pool,
                "current": self.current, "peak": self.peak, "live": self.live,
                "total": self.total, "cached": self.cached, "cached_peak": self.cached_peak}

    def __repr__(self) -> str:
        cached = f", {format_bytes(self.cached)} cached" if self.cached else ""
        return (f"<KindStats {where(self.kind, self.device, self.pool)}: "
                f"{format_bytes(self.current)} in {self.live} live, peak "
                f"{format_bytes(self.peak)}, {self.total} made{cached}>")


@dataclass(frozen=True, repr=False)
class Usage:
    """Sums over several accounts: a kind on all devices, or a device over all kinds.

    Attributes
    ----------
    current : int
        Bytes held now.
    live : int
        Allocations alive now.
    total : int
        Allocations made so far.

    Notes
    -----
    There is no peak: a sum of peaks is not a peak. Each :class:`KindStats`
    has its exact one.
    """

    current: int = 0
    live: int = 0
    total: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.current + other.current, self.live + other.live,
                     self.total + other.total)

    def to_dict(self) -> dict[str, int]:
        """The sums as a JSON-ready dict."""
        return {"current": self.current, "live": self.live, "total": self.total}

    def __repr__(self) -> str:
        return f"<Usage {format_bytes(self.current)} in {self.live} live, {self.total} made>"


def _usage(s: KindStats) -> Usage:
    return Usage(s.current, s.live, s.total)


@dataclass(frozen=True, repr=False)
class MemoryStats:
    """What :func:`memory_stats` returns: every account, with sums by kind and by device.

    Attributes
    ----------
    device : int or None
        The device the statistics were asked for (``None``: all memory,
        host memory included).
    accounts : tuple of KindStats
        One entry per memory kind and device (and pool), in the order of
        :data:`MEMORY_KINDS`; only kinds that were used in this process.
    """

    device: int | None
    accounts: tuple[KindStats, ...]

    @property
    def by_kind(self) -> dict[str, Usage]:
        """Sums per kind (over devices and pools), for every kind of :data:`MEMORY_KINDS`."""
        out = {k: Usage() for k in MEMORY_KINDS}
        for s in self.accounts:
            out[s.kind] = out[s.kind] + _usage(s)
        return out

    @property
    def by_device(self) -> dict[int | None, Usage]:
        """Sums per device (``None``: host memory) over kinds, aliases left out.

        A ``"vmm_mapped"`` range is PhysicalMemory (counted under
        ``"vmm_physical"``) seen through addresses, and a ``"shared_ring"``
        segment is registered memory (counted under ``"registered"``):
        counting them again would count the same bytes twice.
        """
        out: dict[int | None, Usage] = {}
        for s in self.accounts:
            if s.kind not in ALIAS_KINDS:
                out[s.device] = out.get(s.device, Usage()) + _usage(s)
        return out

    @property
    def current(self) -> int:
        """Bytes held now, all kinds (mapped ranges and rings left out: see :attr:`by_device`)."""
        return sum(s.current for s in self.accounts if s.kind not in ALIAS_KINDS)

    @property
    def cached(self) -> int:
        """Bytes held by block caches, all kinds (not in :attr:`current`)."""
        return sum(s.cached for s in self.accounts)

    @property
    def live(self) -> int:
        """Allocations alive now, all kinds (mapped ranges and rings left out)."""
        return sum(s.live for s in self.accounts if s.kind not in ALIAS_KINDS)

    @property
    def total(self) -> int:
        """Allocations made so far, all kinds (mappings and rings left out)."""
        return sum(s.total for s in self.accounts if s.kind not in ALIAS_KINDS)

    def kind(self, kind: str, device: int | Device | None = None) -> tuple[KindStats, ...]:
        """The accounts of ``kind`` (on ``device``, if given): one per device and pool.

        Raises
        ------
        ValueError
            For a kind that is not in :data:`MEMORY_KINDS`.
        """
        if kind not in MEMORY_KINDS:
            raise ValueError(f"unknown memory kind {kind!r}; one of {', '.join(MEMORY_KINDS)}")
        dev = None if device is None else check_ordinal(device)
        return tuple(s for s in self.accounts
                     if s.kind == kind and (dev is None or s.device == dev))

    def pool(self, pool: Any) -> KindStats:
        """The statistics of one pool's buffers (a :class:`MemoryPool` or its handle).

        A pool that never allocated gives zeros. For a pool that was closed,
        pass the handle it had (a closed pool has no ``handle``).
        """
        handle = check_int(getattr(pool, "handle", pool), "pool", "a MemoryPool or its int handle")
        device = getattr(pool, "device", _ANY)  # a handle alone: any device
        for s in self.accounts:
            if s.kind == "pool" and s.pool == handle and device in (_ANY, s.device):
                return s
        return KindStats("pool", None if device is _ANY else device, handle, 0, 0, 0, 0)

    def to_dict(self) -> dict[str, Any]:
        """Everything as JSON-ready values.

        Keys: ``"device"``, ``"accounts"`` (a list of :meth:`KindStats.to_dict`),
        ``"by_kind"`` (kind -> sums), ``"by_device"`` (``"host"`` or the
        ordinal as a string -> sums) and ``"all"`` (the sums of everything).
        """
        return {
            "device": self.device,
            "accounts": [s.to_dict() for s in self.accounts],
            "by_kind": {k: u.to_dict() for k, u in self.by_kind.items()},
            "by_device": {("host" if d is None else str(d)): u.to_dict()
                          for d, u in sorted(self.by_device.items(),
                                             key=lambda kv: -1 if kv[0] is None else kv[0])},
            "all": {"current": self.current, "live": self.live, "total": self.total,
                    "cached": self.cached},
        }

    def table(self) -> str:
        """The accounts and the sums as a text table (what ``repr`` shows)."""
        scope = "all devices and host" if self.device is None else f"device {self.device}"
        lines = [f"cuda_memkit memory ({scope}; peaks are per account)",
                 f"{'kind':<17}{'device':>7}  {'pool':<16}{'current':>12}{'peak':>12}"
                 f"{'live':>8}{'made':>9}{'cached':>12}"]
        for s in self.accounts:
            lines.append(
                f"{s.kind:<17}{'host' if s.device is None else s.device:>7}  "
                f"{'-' if s.pool is None else hex(s.pool):<16}{format_bytes(s.current):>12}"
                f"{format_bytes(s.peak):>12}{s.live:>8}{s.total:>9}"
                f"{format_bytes(s.cached):>12}")
        if not self.accounts:
            lines.append("(nothing allocated)")
        for dev, u in sorted(self.by_device.items(), key=lambda kv: -1 if kv[0] is None
                             else kv[0]):
            name = "host" if dev is None else f"device {dev}"
            lines.append(f"total {name}: {format_bytes(u.current)} in {u.live} live, "
                         f"{u.total} made")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.table()


def _order(acct: Account) -> tuple[int, int, int]:
    kinds = list(KINDS)
    return (kinds.index(acct.kind), -1 if acct.device is None else acct.device,
            -1 if acct.pool is None else acct.pool)


def _accounts(device: int | Device | None) -> list[Account]:
    dev = None if device is None else check_ordinal(device)
    settle()
    accts = [a for a in list(LEDGER.values()) if dev is None or a.device == dev]
    accts.sort(key=_order)
    return accts


def memory_stats(device: int | Device | None = None) -> MemoryStats:
    """Memory held through cuda_memkit now, per kind, device and pool.

    Always on and cheap: it reads the allocation ledger that every
    allocation and free updates, and makes no driver call. Sizes are the
    bytes asked for, not the driver's rounded sizes.

    Parameters
    ----------
    device : int or Device, optional
        Only this device's memory; default: every device and the host.

    Returns
    -------
    MemoryStats
        ``stats.accounts`` has one :class:`KindStats` (current and peak
        bytes, live and total allocations) per kind and device (and pool);
        ``stats.by_kind`` and ``stats.by_device`` sum them up.

    Raises
    ------
    TypeError, ValueError
        For a device that is not an ordinal >= 0 or a :class:`Device`.

    Notes
    -----
    Peaks are exact per account only; sums carry none (see
    :class:`Usage`). Each account is read without a lock: while other
    threads allocate, the numbers of different accounts may be from moments
    a few operations apart.

    Examples
    --------
    >>> cm.reset_peak_stats()  # peaks are process-wide: start from what is live now
    >>> buf = cm.DeviceBuffer.empty(1 << 20)
    >>> cm.memory_stats().by_kind["device"].current
    1048576
    >>> cm.memory_stats(0).kind("device")[0].peak
    1048576
    >>> buf.close()
    """
    return MemoryStats(None if device is None else check_ordinal(device),
                       tuple(KindStats.of(a) for a in _accounts(device)))


def reset_peak_stats(device: int | Device | None = None) -> None:
    """Set every account's peak (of ``device``, if given) to its current bytes.

    Parameters
    ----------
    device : int or Device, optional
        Only this device's accounts; default: all, host memory included.
    """
    for acct in _accounts(device):
        acct.reset_peak()
