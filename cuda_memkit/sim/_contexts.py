"""Simulated non-primary contexts and the context stack.

``cuCtxCreate`` / ``cuCtxDestroy`` / ``cuCtxPushCurrent`` / ``cuCtxPopCurrent``
as the CUDA documentation describes them, so that tests can make "another
context" current (a created context of the same device) or leave a destroyed
one current on a thread, the situation a finalizer may be collected in.

Modelled:

* A created context gets its own handle and belongs to its device; it becomes
  current on the calling thread, the previous one pushed below it.
* ``cuCtxDestroy`` pops the context if it is current on the calling thread; on
  other threads it stays current, and their calls then fail
  (``_state.STALE_CONTEXT_ERROR`` from the calls ``_state.STALE_CONTEXT_CHECKED``
  lists and every call needing a context), as on the H100;
  ``tests/conformance/test_contexts.py`` checks it against the GPU.
* ``cuCtxSetCurrent`` replaces the top of the stack; ``cuCtxSetCurrent(NULL)``
  pops it.

Not modelled: resources made while a created context is current (streams,
``cuMemAlloc`` memory) are not destroyed with it; tests free them first.
"""

from __future__ import annotations

from typing import Any

from cuda.bindings import driver as cu

from . import _state as S
from ._state import CONTEXTS, Fail, R, api

__all__ = [
    "cuCtxCreate",
    "cuCtxDestroy",
    "cuCtxPopCurrent",
    "cuCtxPushCurrent",
]


def M() -> S.Machine:
    return S.MACHINE


def _live(h: int) -> bool:
    m = M()
    ordinal = m.ctx_device(h)
    if ordinal is None:
        return False
    if h in m.ext.get(CONTEXTS, {}):
        return True
    return m.primary_retain[ordinal] > 0


@api(1)
def cuCtxCreate(ctxCreateParams: Any, flags: Any, dev: Any) -> cu.CUcontext:
    m = M()
    d = m.device(dev)
    if int(flags) < 0 or int(flags) & ~0xFF:
        raise Fail(R.CUDA_ERROR_INVALID_VALUE)
    h = m.new_ctx(d.ordinal)
    m.ctx_stack().append(m.current_ctx)
    m.current_ctx = h
    return cu.CUcontext(h)


@api(0)
def cuCtxDestroy(ctx: Any) -> None:
    m = M()
    h = int(ctx) if ctx is not None else 0
    created = m.ext.get(CONTEXTS, {})
    if h not in created:  # NULL, a primary context, or one destroyed already
        raise Fail(R.CUDA_ERROR_INVALID_CONTEXT)
    m.stale_ctx[h] = created.pop(h)  # its device: cuCtxGetDevice still answers (H100)
    if m.current_ctx == h:
        stack = m.ctx_stack()
        m.current_ctx = stack.pop() if stack else 0


@api(0)
def cuCtxPushCurrent(ctx: Any) -> None:
    m = M()
    h = int(ctx) if ctx is not None else 0
    if not h or not _live(h):
        raise Fail(R.CUDA_ERROR_INVALID_CONTEXT)
    m.ctx_stack().append(m.current_ctx)
    m.current_ctx = h


@api(1)
def cuCtxPopCurrent() -> cu.CUcontext:
    m = M()
    h = m.current_ctx
    if not h:
        raise Fail(R.CUDA_ERROR_INVALID_CONTEXT)
    stack = m.ctx_stack()
    m.current_ctx = stack.pop() if stack else 0
    return cu.CUcontext(h)
