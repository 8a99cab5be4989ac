"""``__exit__`` never replaces an exception in flight, for every object with a ``with`` block.

Leaving a block by an exception closes the object as leaving it normally
does, and the user's exception propagates unchanged; a cleanup that fails
too (a pool with live buffers) becomes a :class:`MemkitWarning`.
"""

from __future__ import annotations

from typing import Any

import pytest

import cuda_memkit as cm
from cuda_memkit._core._resource import Resource

from ._kinds import KINDS, Env, close_all, kind_params

pytestmark = pytest.mark.usefixtures("default_pinned", "flush_pinned")


class Boom(KeyError):
    pass


def _first(obj: Any) -> Any:
    return obj[0] if isinstance(obj, list) else obj


@pytest.mark.parametrize("kind", kind_params(sorted(KINDS)))
def test_exception_propagates_and_the_object_closes(kind: str) -> None:
    with cm.Stream() as stream:
        obj = KINDS[kind](Env(stream))
        target = _first(obj)
        err = Boom("mine")
        with pytest.raises(Boom) as info:
            with target:
                raise err
        assert info.value is err
        assert target.closed
        stream.synchronize()
        close_all(obj)


def test_pool_with_live_buffers_closes_as_forced_and_warns() -> None:
    with cm.Stream() as stream:
        err = Boom("mine")
        with pytest.raises(Boom) as info, pytest.warns(cm.MemkitWarning, match="left by an "
                                                       "exception with"):
            with cm.MemoryPool(0) as pool:
                buf = pool.allocate(4096, stream=stream)
                raise err
        assert info.value is err
        assert pool.closed
        with pytest.raises(cm.ClosedError):
            pool.allocate(16, stream=stream)
        buf.free()  # the buffer stays valid after a forced close, and frees into the pool
        stream.synchronize()


def test_pool_left_normally_with_live_buffers_still_refuses() -> None:
    with cm.Stream() as stream:
        pool = cm.MemoryPool(0)
        buf = pool.allocate(4096, stream=stream)
        with pytest.raises(BufferError, match="free them"), pool:
            pass
        assert not pool.closed
        buf.free()
        stream.synchronize()
        pool.close()


def test_device_block_restores_the_context_and_propagates() -> None:
    before = cm.Device(0)
    err = Boom("mine")
    with pytest.raises(Boom) as info, before:
        raise err
    assert info.value is err


def test_tracker_stopped_inside_a_failing_block() -> None:
    err = Boom("mine")
    with pytest.raises(Boom) as info, cm.track() as t:
        t.stop()
        raise err
    assert info.value is err


class _Refusing(Resource):
    """An owner whose release fails (as a driver refusing it would)."""

    def __init__(self) -> None:
        self._open(None)

    def close(self) -> None:
        super().close()
        raise RuntimeError("release refused")


def test_cleanup_failure_becomes_a_warning() -> None:
    err = Boom("mine")
    obj = _Refusing()
    with pytest.raises(Boom) as info, pytest.warns(cm.MemkitWarning, match="release refused"):
        with obj:
            raise err
    assert info.value is err and obj.closed
    with pytest.raises(RuntimeError, match="release refused"), _Refusing():
        pass  # no exception in flight: the cleanup's own error is the one raised
