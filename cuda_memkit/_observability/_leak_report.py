"""Leak reports: what still owns memory, and where it was allocated.

``CUDA_MEMKIT_LEAK_REPORT=1`` in the environment when ``cuda_memkit`` is
imported calls :func:`install`: from then on a stack-recording tracker keeps
the allocation stack of every live allocation (no event list: its memory is
that of the live allocations), and at interpreter exit :func:`report_at_exit`
prints every allocation the ledger still holds to stderr, with its stack.
Finalizers do not run at interpreter exit, so what is alive then is exactly
what cuda_memkit will never free (the driver reclaims it with the process).

The pytest plugin (:mod:`cuda_memkit.pytest_plugin`) uses :func:`recorder`,
:func:`live_now` and :func:`format_leaks` for its per-test check.
"""

from __future__ import annotations

import atexit
import sys
import weakref
from typing import TextIO

from .._core._inflight import pending_operands, wait_pending
from .._core._resource import LEDGER, Account, live_allocations
from ._observe import Allocation, format_bytes, where
from ._tracking import Tracker

__all__ = ["account_bytes", "describe", "format_leaks", "grown_without_allocation", "install",
           "live_now", "recorder", "release", "report_at_exit"]

_recorder: Tracker | None = None
_at_exit = False  # install() was called: the recorder stays until exit


def recorder() -> Tracker:
    """The process's stack-recording tracker (live allocations only), started on first use."""
    global _recorder
    if _recorder is None:
        _recorder = Tracker(True, keep_events=False).start()
    return _recorder


def install() -> None:
    """Record allocation stacks from now on and report live memory at interpreter exit."""
    global _at_exit
    recorder()
    if not _at_exit:
        _at_exit = True
        # weakref's exit hook (which disables every finalizer) registered first, so that it
        # runs after the report (atexit is last in, first out): the report's reap still frees.
        weakref.finalize(report_at_exit, int).detach()
        atexit.register(report_at_exit)


def release() -> None:
    """Stop the recorder (the pytest session ended), unless a report at exit needs it."""
    global _recorder
    if _recorder is not None and not _at_exit:
        _recorder.halt()
        _recorder = None


def live_now() -> dict[tuple[Account, object], int]:
    """Every live allocation in the ledger: (account, allocation id) -> bytes."""
    return {(acct, key): n for acct, key, n in live_allocations()}


def account_bytes() -> dict[Account, int]:
    """Bytes held now per ledger account."""
    return {acct: acct.current for acct in list(LEDGER.values())}


def grown_without_allocation(before: dict[Account, int],
                             new: list[tuple[Account, object, int]]) -> list[str]:
    """Accounts holding more bytes than ``before`` that ``new`` allocations do not explain.

    A live allocation that grew (a GrowableBuffer resized) or a miscount.
    """
    explained: dict[Account, int] = {}
    for acct, _key, n in new:
        explained[acct] = explained.get(acct, 0) + n
    out = []
    for acct, now in account_bytes().items():
        extra = now - before.get(acct, 0) - explained.get(acct, 0)
        if extra > 0:
            out.append(f"{where(acct.kind, acct.device, acct.pool)} holds "
                       f"{format_bytes(extra)} ({extra} bytes) more with no new allocation "
                       f"(an allocation that grew, or a miscount)")
    return out


def describe(acct: Account, key: object, nbytes: int) -> Allocation:
    """Live allocation ``key`` of ``acct``, with its stack if one was recorded."""
    if _recorder is not None:
        rec = _recorder.allocation(acct, key)
        if rec is not None:
            return rec
    return Allocation(acct.kind, acct.device, acct.pool, int(key), nbytes)  # type: ignore[call-overload]


def format_leaks(title: str, entries: list[tuple[Account, object, int]], *, limit: int = 12,
                 skip: tuple[str, ...] = ()) -> str:
    """``title``, the count and bytes of ``entries``, then each one with its allocation stack."""
    total = sum(n for _a, _k, n in entries)
    lines = [f"{title}: {len(entries)} allocation(s) still own memory "
             f"({format_bytes(total)})"]
    for acct, key, n in entries:
        desc = describe(acct, key, n).describe(limit=limit, skip=skip)
        lines.extend("  " + line for line in desc.splitlines())
    return "\n".join(lines)


def report_at_exit(file: TextIO | None = None) -> None:
    """Print every allocation still alive (the atexit handler of :func:`install`)."""
    out = file if file is not None else sys.stderr
    if pending_operands:  # buffers closed under a copy are released after it: wait for it
        wait_pending()
    entries = live_allocations()
    if not entries:
        print("cuda_memkit leak report: no memory left at exit", file=out, flush=True)
        return
    print(format_leaks("cuda_memkit leak report at exit", entries), file=out, flush=True)
