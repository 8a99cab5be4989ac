"""Helpers shared by the test modules: driver-call spies and raw device reads/writes."""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cuda_memkit._core import _driver
from cuda_memkit._pools import _cache

ROOT = Path(__file__).resolve().parent.parent

#: Driver calls as recorded by :func:`record_calls`: (api, args).
Calls = list[tuple[str, tuple[Any, ...]]]

#: The calls that apply managed-memory hints or move pages.
ISSUING = {"cuMemAdvise", "cuMemPrefetchAsync", "cuMemPrefetchBatchAsync",
           "cuMemDiscardBatchAsync", "cuMemDiscardAndPrefetchBatchAsync"}


@contextlib.contextmanager
def driver_spy(monkeypatch: pytest.MonkeyPatch,
               record: Callable[[str, tuple[Any, ...], bool], object]) -> Iterator[None]:
    """Every driver call the library makes inside, told to ``record(api, args, succeeded)``.

    It sees the calls through ``_driver.call``, through the functions
    ``_driver.function`` hands out, and through the block cache's pre-resolved
    ``cuMemAllocFromPoolAsync`` / ``cuMemFreeAsync`` (``_cache.ALLOC`` / ``FREE``),
    which a spy of the gateway alone misses.
    """
    real_call, real_function = _driver.call, _driver.function

    def call(api: str, *args: Any) -> Any:
        try:
            out = real_call(api, *args)
        except BaseException:
            record(api, args, False)
            raise
        record(api, args, True)
        return out

    def spied(api: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def raw(*args: Any) -> Any:
            res = fn(*args)
            record(api, args, not res[0])
            return res
        return raw

    alloc, free = _cache.driver_pair()
    with monkeypatch.context() as m:
        m.setattr(_driver, "call", call)
        m.setattr(_driver, "function", lambda api: spied(api, real_function(api)))
        m.setattr(_cache, "ALLOC", spied("cuMemAllocFromPoolAsync", alloc))
        m.setattr(_cache, "FREE", spied("cuMemFreeAsync", free))
        yield


@contextlib.contextmanager
def all_driver_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[Calls]:
    """Every driver call made inside (:func:`driver_spy`), as ``(api, args)``."""
    calls: Calls = []
    with driver_spy(monkeypatch, lambda api, args, ok: calls.append((api, args))):
        yield calls


@contextlib.contextmanager
def record_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[Calls]:
    """Record driver calls (passing them through)."""
    calls: Calls = []
    real = _driver.call

    def spy(api: str, *args: Any) -> Any:
        calls.append((api, args))
        return real(api, *args)

    with monkeypatch.context() as m:
        m.setattr(_driver, "call", spy)
        yield calls


@contextlib.contextmanager
def call_order(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The names of the driver calls made inside, in order (``cuEventSynchronize`` too,
    which the waits call through ``_driver.function``)."""
    order: list[str] = []
    real_call, real_function = _driver.call, _driver.function

    def call(api: str, *args: Any) -> Any:
        order.append(api)
        return real_call(api, *args)

    def function(api: str) -> Any:
        fn = real_function(api)
        return (lambda *a: (order.append(api), fn(*a))[1]) if api == "cuEventSynchronize" else fn

    with monkeypatch.context() as m:
        m.setattr(_driver, "call", call)
        m.setattr(_driver, "function", function)
        yield order


def run_script(script: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a fresh interpreter from the repository root, with this run's
    environment less its leak report and pytest options, plus ``env``."""
    full = {k: v for k, v in os.environ.items()
            if k not in ("CUDA_MEMKIT_LEAK_REPORT", "PYTEST_ADDOPTS")}
    full.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(script)], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=120)


def page_aligned_zeros(nbytes: int) -> np.ndarray:
    """Zeroed bytes starting a page, on pages of their own: the driver registers whole
    pages, and two small heap arrays sharing a page cannot be registered with different
    flags (the H100 refuses the second one)."""
    page = mmap.PAGESIZE
    base = np.zeros(nbytes + 2 * page, np.uint8)
    start = -base.ctypes.data % page
    return base[start:start + nbytes]


def without_hold(names: list[str]) -> list[str]:
    """``names`` without the tail an asynchronous call's hold on its buffer adds
    (``keep_alive``: ``cuEventCreate``, ``cuEventRecord``, and ``cuEventDestroy`` when the
    stream was already past it)."""
    for tail in (["cuEventCreate", "cuEventRecord", "cuEventDestroy"],
                 ["cuEventCreate", "cuEventRecord"]):
        if names[-len(tail):] == tail:
            return names[:-len(tail)]
    return names


@contextlib.contextmanager
def no_driver_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail if anything inside calls the driver.

    The block cache's pre-resolved pair (``_cache.ALLOC`` and ``_cache.FREE``)
    is refused too: it reaches the driver without ``_driver.call``.
    """

    def refuse(api: str, *args: Any) -> Any:
        raise AssertionError(f"unexpected driver call {api}")

    with monkeypatch.context() as m:
        m.setattr(_driver, "call", refuse)
        m.setattr(_driver, "function", lambda api: refuse(api))
        m.setattr(_cache, "ALLOC", functools.partial(refuse, "cuMemAllocFromPoolAsync"))
        m.setattr(_cache, "FREE", functools.partial(refuse, "cuMemFreeAsync"))
        yield


def issued(calls: Calls) -> list[str]:
    """The hint and migration calls among ``calls``, in order."""
    return [api for api, _ in calls if api in ISSUING]


def write(ptr: int, data: np.ndarray) -> None:
    """Copy ``data`` to device address ``ptr``."""
    _driver.call("cuMemcpyHtoD", ptr, data, data.nbytes)


def read(ptr: int, n: int) -> np.ndarray:
    """``n`` bytes from device address ``ptr``."""
    out = np.zeros(n, np.uint8)
    _driver.call("cuMemcpyDtoH", out, ptr, n)
    return out
