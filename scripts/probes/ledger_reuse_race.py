"""Probe: can the ledger lose an allocation when the driver reuses a just-freed address?

    python3 scripts/probes/ledger_reuse_race.py        (on the GPU; also runs on the simulator)

DeviceBuffer, ManagedBuffer and HostBuffer (cuMemHostAlloc) free their memory
with the driver first and leave the ledger afterwards (``finally:
account.remove(ptr)``), and their ledger key is the address. If another
thread allocates between the two steps and the driver hands it the address
just freed, its ``add`` overwrites the entry and the late ``remove`` then
drops the NEW allocation: the ledger (memory_stats, track, leak checks) says
it is gone while it is alive, and the old bytes are never subtracted.

This probe makes that interleaving deterministic: it wraps ``_driver.call`` so
that right after the driver's free (before the ledger's remove) one more
buffer of the same size is allocated, as another thread could. Per kind it
prints whether the driver reused the address and whether the ledger still
holds the new buffer. "LOST" rows are the defect; the fix is to leave the
ledger before the driver call (ownership is given up either way).
Writes $OUT/ledger_reuse_race.json when $OUT is set.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import cuda_memkit as cm
from cuda_memkit._core import _driver, _resource

FREES = {"device": "cuMemFree", "managed": "cuMemFree", "pinned": "cuMemFreeHost"}


def make(kind: str) -> object:
    if kind == "device":
        return cm.DeviceBuffer.empty(4096)
    if kind == "managed":
        return cm.ManagedBuffer.empty(4096)
    return cm.HostBuffer.empty(4096)


def account(kind: str) -> _resource.Account:
    return _resource.account(kind, None if kind == "pinned" else 0)


def probe(kind: str) -> dict[str, object]:
    real = _driver.call
    other: list[object] = []

    def call(api: str, *args: object) -> object:
        out = real(api, *args)
        if api == FREES[kind] and not other:
            other.append(make(kind))  # "another thread", between the free and the remove
        return out

    first = make(kind)
    addr = first.ptr  # type: ignore[attr-defined]
    _driver.call = call
    try:
        first.close()  # type: ignore[attr-defined]
    finally:
        _driver.call = real
    new = other[0]
    acct = account(kind)
    reused = new.ptr == addr  # type: ignore[attr-defined]
    held = new.ptr in acct.live  # type: ignore[attr-defined]
    current = acct.current
    new.close()  # type: ignore[attr-defined]
    return {"kind": kind, "address_reused": reused, "new_buffer_in_ledger": held,
            "ledger_bytes_while_new_alive": current, "ledger_bytes_after": acct.current,
            "verdict": "ok" if held and acct.current == 0 else "LOST"}


def main() -> None:
    cm.Device(0).set_current()
    rows = [probe(k) for k in FREES]
    print(f"ledger_reuse_race on backend {cm.backend_name()}")
    print(f"{'kind':9} {'reused':>7} {'in ledger':>10} {'bytes (new alive)':>18} "
          f"{'bytes after':>12}  verdict")
    for r in rows:
        print(f"{r['kind']:9} {r['address_reused']!s:>7} {r['new_buffer_in_ledger']!s:>10} "
              f"{r['ledger_bytes_while_new_alive']:>18} {r['ledger_bytes_after']:>12}  "
              f"{r['verdict']}")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "ledger_reuse_race.json"), "w") as f:
            json.dump({"backend": cm.backend_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
