"""The test harness's answer to CuPy's hidden frame references under compute-sanitizer.

``tests/_sanitizer.py`` clears finished frames that only C code refers to,
and only when ``CUDA_MEMKIT_SANITIZER=1``. Here a reference from C is made
with ``Py_IncRef`` on a finished frame, as CuPy's is under the sanitizer.
"""

from __future__ import annotations

import ctypes
import gc
import sys
import weakref
from collections.abc import Iterator
from types import FrameType

import pytest

from . import _sanitizer


class _Array:
    """Stands for an array in the frame's locals."""


def _frame_kept_from_c() -> tuple[weakref.ref[_Array], int]:
    local = _Array()  # what the kept frame holds
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(sys._getframe()))
    return weakref.ref(local), id(sys._getframe())


def _frame(fid: int) -> FrameType:
    return next(o for o in gc.get_objects() if type(o) is FrameType and id(o) == fid)


@pytest.fixture
def kept() -> Iterator[tuple[weakref.ref[_Array], int]]:
    ref, fid = _frame_kept_from_c()
    yield ref, fid
    ctypes.pythonapi.Py_DecRef(ctypes.py_object(_frame(fid)))  # the reference made above


@pytest.fixture
def sanitizing(monkeypatch: pytest.MonkeyPatch) -> None:
    """As under ``gpu-check sanitize``: ``release()`` acts."""
    monkeypatch.setattr(_sanitizer, "UNDER_SANITIZER", True)


def test_a_frame_kept_from_c_keeps_its_locals(kept: tuple[weakref.ref[_Array], int]) -> None:
    ref, fid = kept
    gc.collect()
    assert ref() is not None
    assert fid in {id(f) for f in _sanitizer.unseen_frames()}


def test_release_clears_it_only_when_asked(kept: tuple[weakref.ref[_Array], int],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    ref, _ = kept
    monkeypatch.setattr(_sanitizer, "UNDER_SANITIZER", False)
    assert _sanitizer.release() == 0
    assert ref() is not None  # outside the sanitizer nothing is touched
    monkeypatch.setattr(_sanitizer, "UNDER_SANITIZER", True)
    assert _sanitizer.release() >= 1
    assert ref() is None  # the frame let go of its locals


def test_frames_others_refer_to_are_left_alone(sanitizing: None) -> None:
    def finished() -> FrameType:
        local = _Array()  # noqa: F841
        return sys._getframe()

    f = finished()
    ref = weakref.ref(f.f_locals["local"])
    _sanitizer.release()
    assert ref() is not None and f.f_locals["local"] is ref()  # held by ``f``: not cleared


def test_executing_and_generator_frames_are_left_alone(sanitizing: None) -> None:
    def gen() -> Iterator[int]:
        local = _Array()
        yield 1
        yield id(local)

    g = gen()
    next(g)
    here = _Array()
    _sanitizer.release()
    assert next(g) > 1  # the suspended generator still runs
    assert isinstance(here, _Array)


def test_callers_kept_from_c_are_cleared_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # Under memcheck whole CuPy call stacks are kept from C (rfft -> _fft, seen on the H100):
    # the caller is also kept through the callee's f_back, a reference the collector sees.
    def inner() -> int:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(sys._getframe()))
        return id(sys._getframe())

    def outer() -> tuple[weakref.ref[_Array], int, int]:
        local = _Array()
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(sys._getframe()))
        return weakref.ref(local), inner(), id(sys._getframe())

    ref, inner_id, outer_id = outer()
    try:
        monkeypatch.setattr(_sanitizer, "UNDER_SANITIZER", True)
        assert _sanitizer.release() >= 2
        assert ref() is None
    finally:
        for fid in (inner_id, outer_id):
            ctypes.pythonapi.Py_DecRef(ctypes.py_object(_frame(fid)))


def test_frames_of_a_kept_traceback_are_left_alone(sanitizing: None) -> None:
    def inner() -> None:
        local = _Array()
        raise ValueError(id(local))

    def outer() -> None:
        inner()

    try:
        outer()
    except ValueError as e:
        exc = e
    tb = exc.__traceback__
    assert tb is not None and tb.tb_next is not None and tb.tb_next.tb_next is not None
    ref = weakref.ref(tb.tb_next.tb_next.tb_frame.f_locals["local"])
    del tb
    _sanitizer.release()
    assert ref() is not None  # pytest's reports keep tracebacks like this one
    del exc
