"""Releases (close() and garbage collection) whatever context the releasing thread has.

A buffer may be collected on any thread, with any context current there: none,
another device's primary context, a context the application created, or one
that was destroyed (by another thread, or by a library's failure path) and left
current. Every kind must still release its memory, raise nothing, warn nothing,
and leave the thread's current context as it was.

A release that the driver refuses for want of a usable context
(``CUDA_ERROR_INVALID_CONTEXT``, ``CUDA_ERROR_CONTEXT_IS_DESTROYED``) is retried
with the owning device's primary context pushed and popped again
(``_context.context_retry``). The simulator models a destroyed context left
current as the H100 answered it (``cuda_memkit/sim/_state.py``:
``STALE_CONTEXT_*``; ``scripts/probes/invalid_context_probe.py``).
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import cuda_memkit as cm

from . import _leaks
from ._contexts import (
    created_context,
    current,
    on_thread,
    other_device_current,
    sim_mark,
    sim_release_since,
    stale_context_current,
)
from ._kinds import KINDS, MANAGED, Env, close_all, kind_params, leaks_since

pytestmark = pytest.mark.usefixtures("default_pinned")


@pytest.fixture(autouse=True)
def flush(default_pinned: cm.MemoryPool, backend: str) -> Iterator[None]:
    """Trim the pinned pool; on the simulator, free what a failed release left behind.

    A test here fails when a release fails; freeing its leftovers (raw driver
    calls) keeps them from changing what later tests see (device bytes in use,
    default pool statistics). The leak check then sees a clean machine.
    """
    mark = sim_mark() if backend == "sim" else None
    yield
    gc.collect()
    default_pinned.trim()
    if mark is not None:
        sim_release_since(mark)


@pytest.fixture
def env() -> Iterator[Env]:
    s = cm.Stream()
    yield Env(s)
    s.synchronize()
    s.close()


def _memkit_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, cm.MemkitWarning)]


def _release(obj: list[Any], how: str) -> None:
    """Close (``how == "close"``) or drop the object; it is gone afterwards either way."""
    try:
        if how == "close":
            close_all(obj[0])
    finally:
        obj.clear()
        gc.collect()


SITUATIONS: dict[str, Callable[[], Any]] = {
    "destroyed context current": stale_context_current,
    "created context current": created_context,
    "other device current": other_device_current,
}

KIND_IDS = kind_params(list(KINDS))


def _settled_snapshot(env: Env) -> _leaks.Snapshot:
    """A leak snapshot once the stream is idle and pinned blocks went back to the driver."""
    env.stream.synchronize()
    cm.MemoryPool.default_pinned().trim()
    return _leaks.snapshot()


def _run(situation: Callable[[], Any], obj: list[Any], how: str
         ) -> tuple[str | None, list[str], int, int]:
    """Release ``obj`` inside ``situation``: (error, MemkitWarnings, ctx before, ctx after)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with situation() as ctx:
            error: str | None = None
            try:
                _release(obj, how)
            except Exception as exc:  # reported by the caller, after the context is restored
                error = repr(exc)  # (not the exception: its traceback would keep frames alive)
            still = current()
    return error, _memkit_warnings(caught), ctx, still


@pytest.mark.parametrize("how", ["close", "gc"])
@pytest.mark.parametrize("kind", KIND_IDS)
@pytest.mark.parametrize("situation", list(SITUATIONS))
def test_release_with_any_current_context(situation: str, kind: str, how: str,
                                          env: Env) -> None:
    """A release with a destroyed (or another) context current still frees.

    The memory is gone (exact on the simulator), with no exception and no
    MemkitWarning.
    """
    before = _settled_snapshot(env)
    obj = [KINDS[kind](env)]
    error, warned, _ctx, _still = _run(SITUATIONS[situation], obj, how)
    leaked = leaks_since(before, lambda: _settled_snapshot(env), kind in MANAGED)
    assert error is None, f"{kind}.{how} raised {error} with a {situation}"
    assert not warned, warned
    assert not leaked, f"{kind} not freed: {leaked}"


@pytest.mark.parametrize("how", ["close", "gc"])
@pytest.mark.parametrize("kind", KIND_IDS)
def test_release_on_a_thread_without_context(kind: str, how: str, env: Env) -> None:
    """A buffer made on this thread, dropped (or closed) on a thread with no context."""
    before = _settled_snapshot(env)
    obj = [KINDS[kind](env)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        on_thread(lambda: _release(obj, how))
    assert not _memkit_warnings(caught), _memkit_warnings(caught)
    leaked = leaks_since(before, lambda: _settled_snapshot(env), kind in MANAGED)
    assert not leaked, f"{kind} not freed: {leaked}"


def _no_context() -> Any:
    """A 'situation' for _run: the block runs on a thread without context."""
    import contextlib

    @contextlib.contextmanager
    def cm_() -> Iterator[int]:
        yield 0

    return cm_()


@pytest.mark.parametrize("kind", KIND_IDS)
@pytest.mark.parametrize("situation", ["no context", *SITUATIONS])
def test_release_leaves_the_current_context_alone(situation: str, kind: str, env: Env) -> None:
    """A release leaves the releasing thread's current context as it was.

    Garbage collection runs finalizers on whatever thread allocates at that
    moment: a thread that had no context must not get device 0's, one with its
    own context must not lose it. The context current before the release is
    current after it.
    """
    obj = [KINDS[kind](env)]
    if situation == "no context":
        error, _warned, ctx, still = on_thread(lambda: _run(_no_context, obj, "gc"))
    else:
        error, _warned, ctx, still = _run(SITUATIONS[situation], obj, "gc")
    assert still == ctx, (f"releasing a {kind} changed the current context "
                          f"(0x{ctx:x} -> 0x{still:x}); error: {error}")


@pytest.mark.sim_only
@pytest.mark.parametrize("how", ["close", "gc"])
def test_pool_buffer_whose_stream_handle_was_destroyed(how: str) -> None:
    """A pool buffer allocated on an int stream handle that was destroyed is still freed.

    A buffer keeps a :class:`Stream` object alive, but not a stream given as an
    int handle (what an allocator adaptor gets from CuPy's ``.ptr``). Once its
    owner destroys the stream, ``cuMemFreeAsync`` on it answers
    ``CUDA_ERROR_INVALID_CONTEXT`` (the H100, ``E_free_async_destroyed_stream``)
    with a context current. The memory is freed (after synchronizing the
    pool's device, on the legacy stream), with at most one MemkitWarning and no
    exception. Simulator only: the real driver must never see a destroyed
    stream handle in a test.
    """
    s = cm.Stream()
    handle = s.handle
    before = _leaks.snapshot()
    buf = [cm.MemoryPool.default(0).allocate(cm.granularity(0), stream=handle)]
    s.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        error: str | None = None
        try:
            _release(buf, how)
        except Exception as exc:
            error = repr(exc)
    assert error is None, f"{how} raised {error}"
    assert len(_memkit_warnings(caught)) <= 1, _memkit_warnings(caught)
    after = _leaks.snapshot()
    assert not before.leaks(after), f"not freed: {before.leaks(after)}"
