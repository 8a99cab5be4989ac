"""Helpers shared by the conformance tests: exact-error checks, threads, undo lists."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from cuda.bindings import driver as cu

import cuda_memkit as cm
from cuda_memkit._core import _driver

#: What the H100 answers for a failing call: (exact class, CUresult).
Want = tuple[type[cm.CudaError], cu.CUresult]


def expect(want: Want, api: str, *args: Any) -> cm.CudaError:
    """Call ``api``; it must raise exactly ``want`` (class and code), naming ``api``."""
    cls, code = want
    with pytest.raises(cm.CudaError) as info:
        _driver.call(api, *args)
    err = info.value
    assert err.code == int(code), f"{api}: got {err.name}, expected {code.name}"
    assert type(err) is cls
    assert err.api == api
    return err


def expect_error(cls: type[cm.CudaError], code: cu.CUresult, api: str,
                 *args: Any) -> cm.CudaError:
    """:func:`expect` with the class and the code as two arguments."""
    return expect((cls, code), api, *args)


def outcome(want: Want | None, api: str, *args: Any) -> Any:
    """Call ``api``; it must succeed (``want`` is ``None``) or raise exactly ``want``."""
    if want is None:
        return _driver.call(api, *args)
    expect(want, api, *args)
    return None


def in_fresh_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on a new thread (no current context); return its result or raise its error."""
    box: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            box.append((True, fn()))
        except BaseException as exc:  # handed back to the test thread
            box.append((False, exc))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    ok, value = box[0]
    if not ok:
        raise value
    return value


class Undo:
    """Driver calls to make at teardown, last registered first."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, tuple[Any, ...]]] = []

    def __call__(self, api: str, *args: Any) -> None:
        self.steps.append((api, args))

    def run(self) -> None:
        for api, args in reversed(self.steps):
            _driver.call(api, *args)
        self.steps.clear()
