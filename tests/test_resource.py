from __future__ import annotations

import gc
from typing import Any

import pytest

import cuda_memkit as cm
from cuda_memkit._core import _driver
from cuda_memkit._core._resource import Resource, host_array, make_finalizer

released: list[tuple[Any, ...]] = []


def _record(*args: Any) -> None:
    released.append(args)


def _fail(code: int) -> None:
    _driver.check("cuFakeRelease", (code, None))


class Thing(Resource):
    def __init__(self, n: int, release: Any = _record) -> None:
        self._open(make_finalizer(self, f"thing {n}", release, n))


def setup_function() -> None:
    released.clear()


def test_close_releases_once_and_is_idempotent() -> None:
    t = Thing(1)
    t.close()
    t.close()
    assert released == [(1,)]
    assert t.closed
    with pytest.raises(cm.ClosedError, match="Thing is closed"):
        t._check_open()


def test_gc_runs_the_same_release() -> None:
    Thing(2)
    gc.collect()
    assert released == [(2,)]


def test_finalizer_does_not_capture_owner() -> None:
    import weakref

    t = Thing(3)
    ref = weakref.ref(t)
    del t
    assert ref() is None
    assert released == [(3,)]


def test_context_manager() -> None:
    with Thing(4) as t:
        assert not t.closed
    assert t.closed and released == [(4,)]
    with pytest.raises(cm.ClosedError):
        with t:
            pass


def test_release_failure_becomes_warning() -> None:
    t = Thing(1, release=_fail)
    with pytest.warns(cm.MemkitWarning, match="releasing thing 1 failed: cuFakeRelease"):
        t.close()


def test_release_failure_in_gc_becomes_warning() -> None:
    t = Thing(1, release=_fail)
    with pytest.warns(cm.MemkitWarning, match="releasing thing 1 failed"):
        del t
        gc.collect()


def test_views_defer_the_release() -> None:
    import numpy as np

    store = np.arange(8, dtype=np.int32)
    t = Thing(5)
    view = host_array(t, store.ctypes.data, (8,), np.dtype(np.int32))
    assert view.base is not None
    t.close()
    assert released == []  # the view still points at the memory
    assert view[3] == 3
    del t
    gc.collect()
    assert released == []
    del view
    gc.collect()
    assert released == [(5,)]


def test_host_array_of_null_pointer_is_empty() -> None:
    import numpy as np

    t = Thing(6)
    arr = host_array(t, 0, (0,), np.dtype(np.float64))
    assert arr.shape == (0,) and arr.dtype == np.float64
    t.close()
