"""memory_stats() and reset_peak_stats(): every kind, exact sizes, sums, peaks, JSON, CLI.

The statistics read the allocation ledger; these tests compare them with the
sizes asked for (exact on both backends), and check that reading them makes
no driver call. Cross-checks against the driver (cuMemGetInfo, pool
statistics) are in test_stats_gpu.py.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit import _cli
from cuda_memkit._core import _driver

MiB = 1 << 20


@pytest.fixture(scope="module", autouse=True)
def _default_pinned() -> None:
    """Make the process-wide pinned pool (and its stream) before the leak check's snapshots."""
    cm.HostBuffer.pooled(1).close()
    cm.MemoryPool.default_pinned().trim()


@pytest.fixture(autouse=True)
def _settle() -> Iterator[None]:
    yield
    gc.collect()
    cm.MemoryPool.default_pinned().trim()
    cm.Device(0).synchronize()


def _current(stats: cm.MemoryStats, kind: str, device: int | None = None) -> int:
    return sum(s.current for s in stats.accounts
               if s.kind == kind and (device is None or s.device == device))


def _every_kind(stream: cm.Stream) -> tuple[list[Any], dict[str, int]]:
    """One allocation of every kind, of known sizes: (objects, kind -> bytes)."""
    g = cm.granularity(0)
    pool = cm.MemoryPool.default(0)
    phys = cm.PhysicalMemory.create(2 * g, device=0)
    rng = cm.AddressRange.reserve(4 * g)
    mapping = rng.map(phys)
    grow = cm.GrowableBuffer(8 * g)
    grow.resize(3 * g - 5)
    host_pool = cm.MemoryPool(location=cm.Location.host())
    objs = [
        cm.DeviceBuffer.empty(3 * MiB + 7),
        pool.allocate(12345, stream=stream),
        host_pool.allocate(4096, stream=stream),
        cm.ManagedBuffer.empty(8192),
        cm.HostBuffer.empty(1000),
        cm.HostBuffer.pooled(3000),
        cm.register_host(np.zeros(16384, np.uint8)),
        phys, mapping, rng, grow, host_pool,
    ]
    sizes = {"device": 3 * MiB + 7, "pool": 12345 + 4096, "managed": 8192, "pinned": 1000,
             "pinned_pooled": 3000, "registered": 16384, "vmm_physical": 2 * g,
             "vmm_mapped": 2 * g, "growable": 3 * g}
    return objs, sizes


def _close_all(objs: list[Any], stream: cm.Stream) -> None:
    for o in objs[:10]:
        o.close()
    objs[10].close()
    stream.synchronize()
    objs[11].close()


@pytest.mark.uses_managed_memory
def test_every_kind_counts_its_exact_size(stream: cm.Stream) -> None:
    before = cm.memory_stats()
    objs, sizes = _every_kind(stream)
    try:
        now = cm.memory_stats()
        for kind, n in sizes.items():
            assert _current(now, kind) - _current(before, kind) == n, kind
            assert now.by_kind[kind].current - before.by_kind[kind].current == n, kind
            assert now.by_kind[kind].live - before.by_kind[kind].live == (2 if kind == "pool"
                                                                          else 1), kind
            assert now.by_kind[kind].total - before.by_kind[kind].total == (2 if kind == "pool"
                                                                            else 1), kind
        # per device: device memory of device 0 (mapped ranges counted once, as physical)
        dev_kinds = ("device", "pool", "managed", "vmm_physical", "growable")
        host_pool_bytes = 4096
        d0 = now.by_device[0].current - before.by_device.get(0, cm.Usage()).current
        assert d0 == sum(sizes[k] for k in dev_kinds) - host_pool_bytes
        host = now.by_device[None].current - before.by_device.get(None, cm.Usage()).current
        assert host == sizes["pinned"] + sizes["pinned_pooled"] + sizes["registered"] + 4096
        assert now.current - before.current == d0 + host
        # the pools, one account each
        p = now.pool(cm.MemoryPool.default(0))
        assert p.kind == "pool" and p.device == 0 and p.current - before.pool(
            cm.MemoryPool.default(0)).current == 12345
        hp = now.pool(objs[11])
        assert (hp.device, hp.current, hp.live, hp.total) == (None, 4096, 1, 1)
        assert now.pool(objs[11].handle) == hp
    finally:
        _close_all(objs, stream)
    after = cm.memory_stats()
    for kind in sizes:
        assert _current(after, kind) == _current(before, kind), kind
    assert after.current == before.current and after.live == before.live


def test_peaks_are_per_account_and_reset() -> None:
    cm.reset_peak_stats()
    base = _current(cm.memory_stats(), "device", 0)
    bufs = [cm.DeviceBuffer.empty(MiB) for _ in range(3)]
    for b in bufs[:2]:
        b.close()
    (dev,) = cm.memory_stats(0).kind("device")
    assert dev.current == base + MiB and dev.peak == base + 3 * MiB
    # a reset for another device leaves device 0's peak alone
    cm.reset_peak_stats(device=1 if cm.device_count() > 1 else 99)
    assert cm.memory_stats(0).kind("device")[0].peak == base + 3 * MiB
    cm.reset_peak_stats(cm.Device(0))
    assert cm.memory_stats(0).kind("device")[0].peak == base + MiB
    bufs[2].close()
    assert cm.memory_stats(0).kind("device")[0].peak == base + MiB
    cm.reset_peak_stats()
    assert all(s.peak == s.current for s in cm.memory_stats().accounts)


def test_sums_carry_no_peak() -> None:
    u = cm.memory_stats().by_kind["device"]
    assert isinstance(u, cm.Usage) and not hasattr(u, "peak")
    assert cm.Usage(1, 2, 3) + cm.Usage(10, 20, 30) == cm.Usage(11, 22, 33)


def test_device_filter_and_kind_lookup(two_devices: None) -> None:
    a = cm.DeviceBuffer.empty(1000, device=0)
    b = cm.DeviceBuffer.empty(2000, device=1)
    h = cm.HostBuffer.empty(64)
    try:
        s1 = cm.memory_stats(1)
        assert s1.device == 1 and {s.device for s in s1.accounts} == {1}
        assert s1.kind("device")[0].current - 0 >= 2000
        assert all(s.kind != "pinned" for s in s1.accounts)  # host memory has no device
        everything = cm.memory_stats()
        assert {0, 1, None} <= set(everything.by_device)
        assert [s.device for s in everything.kind("device")][:2] == [0, 1]
        assert everything.kind("device", 1) == s1.kind("device")
    finally:
        a.close()
        b.close()
        h.close()


def test_kinds_cover_the_ledger_and_order() -> None:
    assert list(cm.MEMORY_KINDS) == ["device", "pool", "managed", "pinned", "pinned_pooled",
                                     "registered", "vmm_physical", "vmm_mapped", "growable",
                                     "shared_ring", "managed_resident"]
    stats = cm.memory_stats()
    assert list(stats.by_kind) == list(cm.MEMORY_KINDS)
    order = [list(cm.MEMORY_KINDS).index(s.kind) for s in stats.accounts]
    assert order == sorted(order)


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="device"):
        cm.memory_stats("0")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=">= 0"):
        cm.memory_stats(-1)
    with pytest.raises(TypeError):
        cm.reset_peak_stats(1.5)  # type: ignore[arg-type]
    stats = cm.memory_stats()
    with pytest.raises(ValueError, match="unknown memory kind 'gpu'"):
        stats.kind("gpu")
    with pytest.raises(TypeError, match="MemoryPool"):
        stats.pool("pool")
    assert stats.pool(0xDEAD) == cm.KindStats("pool", None, 0xDEAD, 0, 0, 0, 0)


def test_no_driver_call(monkeypatch: pytest.MonkeyPatch) -> None:
    with cm.DeviceBuffer.empty(100):
        def refuse(*args: object) -> None:
            raise AssertionError(f"driver called: {args[:1]}")

        monkeypatch.setattr(_driver, "call", refuse)
        monkeypatch.setattr(_driver, "function", refuse)
        stats = cm.memory_stats()
        cm.reset_peak_stats()
        repr(stats)
        json.dumps(stats.to_dict())
        monkeypatch.undo()


def test_results_are_frozen_typed_and_json() -> None:
    with cm.DeviceBuffer.empty(4096):
        stats = cm.memory_stats()
        s = stats.kind("device", 0)[0]
        with pytest.raises(AttributeError):
            s.current = 0  # type: ignore[misc]
        d = json.loads(json.dumps(stats.to_dict()))
        assert d["device"] is None
        assert {a["kind"] for a in d["accounts"]} >= {"device"}
        assert set(d["by_kind"]) == set(cm.MEMORY_KINDS)
        assert d["by_device"]["0"]["current"] == stats.by_device[0].current
        assert d["all"] == {"current": stats.current, "live": stats.live, "total": stats.total,
                            "cached": stats.cached}
        assert s.to_dict()["current"] == s.current
        text = repr(stats)
        assert "peaks are per account" in text and "device" in text and "total device 0" in text
        assert "device on device 0" in repr(s) and "KiB" in repr(s)


def test_vmm_mapped_is_not_counted_twice() -> None:
    g = cm.granularity(0)
    before = cm.memory_stats()
    with cm.PhysicalMemory.create(g) as phys, cm.AddressRange.reserve(g) as rng:
        with rng.map(phys):
            now = cm.memory_stats()
            assert now.by_kind["vmm_mapped"].current - before.by_kind["vmm_mapped"].current == g
            assert now.by_device[0].current - before.by_device[0].current == g
            assert now.current - before.current == g


# -- the command line ---------------------------------------------------------------------


def test_cli_stats_json(capsys: pytest.CaptureFixture[str]) -> None:
    with cm.DeviceBuffer.empty(5000):
        assert _cli.main(["stats", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["backend"] == _driver.backend_name()
        assert out["by_kind"]["device"]["current"] == cm.memory_stats().by_kind["device"].current
        assert out["by_kind"]["device"]["current"] >= 5000


def test_cli_stats_table_and_info(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli.main(["stats"]) == 0
    assert "peaks are per account" in capsys.readouterr().out
    assert _cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "current usage by kind" in out
    for kind in cm.MEMORY_KINDS:
        assert f"  {kind} " in out


def test_cli_json_needs_stats(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _cli.main(["info", "--json"])
    assert "unrecognized arguments: --json" in capsys.readouterr().err  # a stats option only


# -- an address reused between the driver's free and the ledger (fixed: ledger first) ----------


@pytest.mark.uses_managed_memory
@pytest.mark.parametrize("kind", ["device", "managed", "pinned", "registered"])
def test_an_address_reused_between_free_and_ledger_exit_stays_counted(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another thread allocating right after the driver's free may get the same address.

    The interleaving is made deterministic: when the driver call that frees
    returns, the ledger receives what that other thread's allocation would
    register (same address). Its entry must survive the first owner's exit.
    """
    from cuda_memkit._core import _resource

    frees = {"device": "cuMemFree", "managed": "cuMemFree", "pinned": "cuMemFreeHost",
             "registered": "cuMemHostUnregister"}
    arr = np.zeros(4096, np.uint8)
    acct = _resource.account(kind, None if kind in ("pinned", "registered") else 0)
    base = acct.current
    obj: Any = {"device": lambda: cm.DeviceBuffer.empty(4096),
                "managed": lambda: cm.ManagedBuffer.empty(4096),
                "pinned": lambda: cm.HostBuffer.empty(4096),
                "registered": lambda: cm.register_host(arr)}[kind]()
    ptr = obj.ptr
    real = _driver.call

    def call(api: str, *args: Any) -> Any:
        out = real(api, *args)
        if api == frees[kind] and int(args[0]) == ptr:
            acct.add(ptr, 999)  # the other thread's new allocation, at the same address
        return out

    monkeypatch.setattr(_driver, "call", call)
    try:
        obj.close()
    finally:
        monkeypatch.undo()
        held = acct.live.pop(ptr, None)  # the simulated allocation goes (it owns no memory)
        acct.current = base  # with the defect, the freed 4096 bytes never left the account
    assert held == 999
