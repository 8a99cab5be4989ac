"""Staged pageable copies: the pinned-staging pipeline of cuda_memkit._transfer._staging."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import cuda_memkit as cm
from cuda_memkit._core import _driver
from cuda_memkit._transfer import _staging
from cuda_memkit._transfer._staging import staged_copy

from ._helpers import record_calls

KiB, MiB = 1 << 10, 1 << 20
CHUNK = 256 * KiB


@pytest.fixture(autouse=True)
def small_staging() -> Iterator[None]:
    """Small chunks so that a few MiB make a real pipeline; everything released after."""
    old = _staging.staging_settings()
    _staging.configure_staging(enabled=True, threshold=MiB, chunk=CHUNK, buffers=3, threads=2,
                               streams=2)
    yield
    _staging.release_staging()
    _staging.configure_staging(**{f: getattr(old, f) for f in
                          ("enabled", "threshold", "chunk", "buffers", "threads", "streams")})
    assert not staging_threads()


def staging_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(_staging.THREAD_PREFIX)]


def data(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


@pytest.fixture
def dev() -> Iterator[cm.DeviceBuffer]:
    d = cm.DeviceBuffer.empty(4 * MiB)
    yield d
    d.close()


# -- results ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [MiB, 3 * MiB + 123, 4 * MiB, CHUNK * 5 + 1])
def test_round_trip(dev: cm.DeviceBuffer, n: int) -> None:
    src = data(n, n)
    assert staged_copy(dev.ptr, src) is True
    assert (dev.to_numpy()[:n] == src).all()
    out = np.zeros(n, np.uint8)
    assert staged_copy(out, dev.ptr) is True
    assert (out == src).all()


def test_typed_multidimensional_arrays(dev: cm.DeviceBuffer) -> None:
    src = np.arange(512 * 1024, dtype=np.float32).reshape(512, 1024)  # 2 MiB
    assert staged_copy(dev.ptr, src)
    out = np.zeros_like(src)
    assert staged_copy(out, dev.ptr)
    assert (out == src).all()


def test_prefix_and_user_stream(dev: cm.DeviceBuffer, stream: cm.Stream,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    src = data(3 * MiB, 1)
    with record_calls(monkeypatch) as calls:
        assert staged_copy(dev.ptr, src, 2 * MiB, stream=stream)
    got = dev.to_numpy()
    assert (got[:2 * MiB] == src[:2 * MiB]).all()
    assert not (got[2 * MiB:3 * MiB] == src[2 * MiB:]).all()
    # ordered after the user's stream: an event recorded there, waited for by both streams
    records = [a for api, a in calls if api == "cuEventRecord"]
    assert records and int(records[0][1]) == stream.handle
    waits = [a for api, a in calls if api == "cuStreamWaitEvent"]
    assert len(waits) == 2 and {int(w[1]) for w in waits} == {int(records[0][0])}
    copies = [a for api, a in calls if api == "cuStreamSynchronize"]
    assert len(copies) == 2  # complete on return


def test_default_orders_after_the_legacy_stream(dev: cm.DeviceBuffer,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    with record_calls(monkeypatch) as calls:
        staged_copy(dev.ptr, data(2 * MiB))
    records = [a for api, a in calls if api == "cuEventRecord"]
    assert int(records[0][1]) == 0


def test_ring_is_reused_and_released(dev: cm.DeviceBuffer) -> None:
    src = data(2 * MiB)
    staged_copy(dev.ptr, src)
    assert _staging.cached_bytes() == 3 * CHUNK
    assert len(staging_threads()) <= 2
    staged_copy(dev.ptr, src)
    assert _staging.cached_bytes() == 3 * CHUNK
    _staging.configure_staging(chunk=2 * CHUNK)  # other sizes: the old ring goes
    assert _staging.cached_bytes() == 0 and not staging_threads()
    staged_copy(dev.ptr, src)
    assert _staging.cached_bytes() == 6 * CHUNK
    _staging.configure_staging(threshold=2 * MiB)  # the threshold alone keeps the ring
    assert _staging.cached_bytes() == 6 * CHUNK
    _staging.release_staging()
    _staging.release_staging()
    assert _staging.cached_bytes() == 0 and not staging_threads()


def test_concurrent_copies(dev: cm.DeviceBuffer) -> None:
    other = cm.DeviceBuffer.empty(4 * MiB)
    srcs = [data(3 * MiB, 10), data(3 * MiB, 11)]
    errors: list[BaseException] = []

    def work(k: int, d: cm.DeviceBuffer) -> None:
        try:
            for _ in range(3):
                staged_copy(d.ptr, srcs[k])
        except BaseException as exc:
            errors.append(exc)

    try:
        ts = [threading.Thread(target=work, args=(0, dev)),
              threading.Thread(target=work, args=(1, other))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not errors
        assert (dev.to_numpy()[:3 * MiB] == srcs[0]).all()
        assert (other.to_numpy()[:3 * MiB] == srcs[1]).all()
    finally:
        other.close()


def test_second_device_keeps_the_current_context(two_devices: None) -> None:
    cm.Device(0).set_current()
    d1 = cm.DeviceBuffer.empty(2 * MiB, device=1)
    cm.Device(0).set_current()
    before = int(_driver.call("cuCtxGetCurrent"))
    try:
        src = data(2 * MiB, 5)
        assert staged_copy(d1.ptr, src)
        assert int(_driver.call("cuCtxGetCurrent")) == before
        assert (d1.to_numpy() == src).all()
    finally:
        d1.close()


# -- when it steps aside -----------------------------------------------------------------


def test_not_staged(dev: cm.DeviceBuffer, monkeypatch: pytest.MonkeyPatch) -> None:
    small = data(MiB - 1)
    assert staged_copy(dev.ptr, small) is False  # below the threshold
    pinned = cm.HostBuffer.empty(2 * MiB)
    try:
        assert staged_copy(pinned.ptr, data(2 * MiB)) is False  # not device memory
    finally:
        pinned.close()
    _staging.configure_staging(enabled=False)
    with record_calls(monkeypatch) as calls:
        assert staged_copy(dev.ptr, data(2 * MiB)) is False
    assert not calls
    assert _staging.cached_bytes() == 0


@pytest.mark.uses_managed_memory
def test_managed_memory_is_not_staged() -> None:
    m = cm.ManagedBuffer.empty(2 * MiB)
    try:
        assert staged_copy(m.ptr, data(2 * MiB)) is False
    finally:
        m.close()


def test_env_switch_turns_staging_off() -> None:
    code = "from cuda_memkit._transfer import _staging; print(_staging.staging_settings().enabled)"
    env = dict(os.environ, CUDA_MEMKIT_STAGING="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


# -- bad input and failures ------------------------------------------------------------------


@pytest.mark.parametrize(("args", "kw", "exc"), [
    (("dev", "strided"), {}, ValueError),
    (("readonly", "dev"), {}, ValueError),
    (("dev", [1, 2, 3]), {}, TypeError),
    (("array", "array"), {}, TypeError),
    (("dev", "array"), {"nbytes": 3 * MiB}, ValueError),
    (("dev", "array"), {"nbytes": -1}, ValueError),
    (("dev", "array"), {"stream": "s"}, TypeError),
])
def test_bad_input(dev: cm.DeviceBuffer, args: tuple[str, str], kw: dict[str, Any],
                   exc: type[Exception], monkeypatch: pytest.MonkeyPatch) -> None:
    ro = data(2 * MiB)
    ro.flags.writeable = False
    objs: dict[str, Any] = {"dev": dev.ptr, "strided": data(4 * MiB)[::2], "readonly": ro,
                            "array": data(2 * MiB)}
    resolved = [objs.get(a, a) if isinstance(a, str) else a for a in args]
    with record_calls(monkeypatch) as calls, pytest.raises(exc):
        staged_copy(*resolved, **kw)
    assert not [c for c in calls if c[0].startswith("cuMemcpy")]


def test_device_range_too_small_fails_mid_pipeline() -> None:
    # The fourth 256 KiB chunk straddles the end of the allocation: the driver refuses it
    # (a chunk starting past the end could land in a neighbouring allocation).
    small = cm.DeviceBuffer.empty(MiB - 128 * KiB)
    try:
        with pytest.raises(cm.CudaInvalidValueError):
            staged_copy(small.ptr, data(3 * MiB))
        assert _staging.cached_bytes() == 0 and not staging_threads()
        with pytest.raises(cm.CudaInvalidValueError):
            staged_copy(np.zeros(3 * MiB, np.uint8), small.ptr)
        assert _staging.cached_bytes() == 0 and not staging_threads()
    finally:
        small.close()


@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_worker_failure_drains_and_releases(dev: cm.DeviceBuffer, direction: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    real = _driver.call
    seen = []

    def flaky(api: str, *args: Any) -> Any:
        if api == "cuEventSynchronize":
            seen.append(args)
            if len(seen) == 3:
                raise cm.CudaError(999, api, "CUDA_ERROR_UNKNOWN", "injected")
        return real(api, *args)

    monkeypatch.setattr(_driver, "call", flaky)
    src = data(4 * MiB)
    with pytest.raises(cm.CudaError, match="injected"):
        if direction == "h2d":
            staged_copy(dev.ptr, src)
        else:
            staged_copy(np.zeros(4 * MiB, np.uint8), dev.ptr)
    assert _staging.cached_bytes() == 0 and not staging_threads()
    monkeypatch.setattr(_driver, "call", real)
    assert staged_copy(dev.ptr, src)  # a new ring works
    assert (dev.to_numpy() == src).all()


def test_issue_failure_drains_and_releases(dev: cm.DeviceBuffer,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    real = _driver.function

    def failing(api: str) -> Any:
        fn = real(api)
        if api != "cuMemcpyHtoDAsync":
            return fn
        count = [0]

        def wrapped(*args: Any) -> Any:
            count[0] += 1
            if count[0] == 4:
                raise KeyboardInterrupt
            return fn(*args)
        return wrapped

    monkeypatch.setattr(_driver, "function", failing)
    with pytest.raises(KeyboardInterrupt):
        staged_copy(dev.ptr, data(4 * MiB))
    assert _staging.cached_bytes() == 0 and not staging_threads()


@pytest.mark.parametrize(("change", "exc"), [
    ({"chunk": 1000}, ValueError), ({"buffers": 1}, ValueError), ({"threads": 0}, ValueError),
    ({"threshold": -1}, ValueError), ({"chunk": 4096.0}, TypeError), ({"enabled": 1}, TypeError),
    ({"streams": True}, TypeError), ({"colour": "red"}, TypeError),
])
def test_configure_refuses_bad_values(change: dict[str, Any], exc: type[Exception]) -> None:
    before = _staging.staging_settings()
    with pytest.raises(exc):
        _staging.configure_staging(**change)
    assert _staging.staging_settings() == before


# -- through copy() -------------------------------------------------------------------------


def _calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every staged_copy the transfer module makes (passed through)."""
    from cuda_memkit._transfer import _transfers

    seen: list[str] = []
    real = _transfers.staged_copy

    def spy(dst: Any, src: Any, nbytes: int | None = None, **kw: Any) -> bool:
        done = real(dst, src, nbytes, **kw)
        if done:
            seen.append("H2D" if isinstance(src, np.ndarray) else "D2H")
        return done

    monkeypatch.setattr(_transfers, "staged_copy", spy)
    return seen


def test_copy_stages_large_pageable_copies(dev: cm.DeviceBuffer,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _calls(monkeypatch)
    src = data(dev.nbytes, seed=3)
    cm.copy(dev, src)
    out = np.empty_like(src)
    cm.copy(out, dev)
    assert seen == ["H2D", "D2H"] and np.array_equal(out, src)


def test_copy_staged_false_takes_the_drivers_path(dev: cm.DeviceBuffer,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _calls(monkeypatch)
    src = data(dev.nbytes, seed=4)
    cm.copy(dev, src, staged=False)
    out = np.empty_like(src)
    cm.copy(out, dev, staged=False)
    assert seen == [] and np.array_equal(out, src)
    with pytest.raises(TypeError, match="staged must be a bool"):
        cm.copy(dev, src, staged=1)  # type: ignore[arg-type]


def test_copy_small_and_pinned_copies_are_not_staged(dev: cm.DeviceBuffer,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _calls(monkeypatch)
    cm.copy(dev, data(1000, seed=5), nbytes=1000)  # below the threshold
    with cm.HostBuffer.from_array(data(dev.nbytes, seed=6)) as h:
        cm.copy(dev, h)  # pinned: the driver's full-speed path
    assert seen == []


def test_stream_copies_stage_only_with_allow_pageable(dev: cm.DeviceBuffer,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _calls(monkeypatch)
    src = data(dev.nbytes, seed=7)
    with cm.Stream() as s:
        with pytest.raises(ValueError, match="pageable"):
            cm.copy(dev, src, stream=s)  # refused before anything is issued
        assert seen == []
        cm.copy(dev, src, stream=s, allow_pageable=True)  # complete on return
        out = np.empty_like(src)
        cm.copy(out, dev, stream=s, allow_pageable=True)
        assert np.array_equal(out, src)
        s.synchronize()
    assert seen == ["H2D", "D2H"]
