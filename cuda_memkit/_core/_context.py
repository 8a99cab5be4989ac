"""Primary contexts: retained once per device, made current, pushed around releases."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from . import _driver
from ._constants import CONTEXT_IS_DESTROYED, INVALID_CONTEXT
from ._errors import CudaError

T = TypeVar("T")

__all__ = [
    "CONTEXT_ERRORS",
    "context_retry",
    "ensure_any_context",
    "ensure_context",
    "forget_contexts",
    "primary_context",
    "primary_pushed",
    "release_call",
    "retained_context",
]

# Primary contexts, retained once per device for the life of the process.
_ctx_lock = threading.Lock()
_primary: dict[int, int] = {}


def forget_contexts() -> None:
    """Forget the retained primary contexts (the simulated machine was replaced)."""
    with _ctx_lock:
        _primary.clear()


_driver.reset_hooks.append(forget_contexts)


def retained_context(ordinal: int) -> int | None:
    """The primary context retained for device ``ordinal``, ``None`` if none was yet."""
    return _primary.get(ordinal)


def primary_context(ordinal: int) -> int:
    """Return the (retained) primary context handle of device ``ordinal``."""
    ctx = _primary.get(ordinal)
    if ctx is None:
        with _ctx_lock:
            ctx = _primary.get(ordinal)
            if ctx is None:
                dev = _driver.call("cuDeviceGet", ordinal)
                ctx = int(_driver.call("cuDevicePrimaryCtxRetain", dev))
                _primary[ordinal] = ctx
    return ctx


#: What a release answers when the calling thread has no usable current
#: context: CUDA_ERROR_INVALID_CONTEXT (none) or CUDA_ERROR_CONTEXT_IS_DESTROYED
#: (another thread destroyed it); releases that answer either succeed with the
#: owning device's primary context pushed (see docs/decisions.md).
CONTEXT_ERRORS = frozenset({INVALID_CONTEXT, CONTEXT_IS_DESTROYED})


@contextlib.contextmanager
def primary_pushed(ordinal: int) -> Iterator[None]:
    """Device ``ordinal``'s primary context current inside; the thread's own after.

    ``cuCtxPushCurrent`` / ``cuCtxPopCurrent``: whatever was current before
    (nothing, another device's context, a destroyed one) is current again
    afterwards, so a finalizer never changes the collecting thread's state.
    """
    _driver.call("cuCtxPushCurrent", primary_context(ordinal))
    try:
        yield
    finally:
        _driver.call("cuCtxPopCurrent")


def context_retry(ordinal: int | None, call: Callable[..., T], *args: Any,
                  failed: CudaError | None = None) -> T:
    """``call(*args)``, made once more with a primary context pushed after a context error.

    The one place of the rule "no usable context: push the primary context and
    retry". ``call`` raises :class:`CudaError` for a failed driver call
    (:func:`_driver.call <cuda_memkit._core._driver.call>`, or a raw function
    checked). After :data:`CONTEXT_ERRORS` the call is retried once with the
    primary context of device ``ordinal`` (device 0 for host memory) pushed,
    and the thread's own context restored; other errors propagate.

    Parameters
    ----------
    failed : CudaError, optional
        The error a first try, made by the caller, already raised: the call
        is not tried again unpushed.
    """
    if failed is None:
        try:
            return call(*args)
        except CudaError as exc:
            failed = exc
    if failed.code not in CONTEXT_ERRORS:
        raise failed
    with primary_pushed(ordinal or 0):
        return call(*args)


def release_call(ordinal: int | None, api: str, *args: Any) -> None:
    """Make release call ``api(*args)``, whatever context is current on this thread.

    Tried as it is first (most releases need no context on the H100), then as
    :func:`context_retry` says: after :data:`CONTEXT_ERRORS`, once more with
    the primary context of device ``ordinal`` (device 0 for host memory)
    pushed, the thread's own context restored. Other errors propagate.
    """
    context_retry(ordinal, _driver.call, api, *args)


def ensure_any_context() -> int:
    """Make sure the calling thread has a current context (device 0's primary if none).

    One driver call when a context is current: the cheap form of
    :func:`ensure_context` for callers that do not need the device ordinal.

    Returns
    -------
    int
        The current context's handle (callers that key on it need not ask again).
    """
    ctx = int(_driver.call("cuCtxGetCurrent"))
    if not ctx:
        ensure_context(0)
        ctx = int(_driver.call("cuCtxGetCurrent"))
    return ctx


def ensure_context(ordinal: int | None = None) -> int:
    """Make sure the calling thread has a current context and return its device.

    With ``ordinal`` given, device ``ordinal``'s primary context becomes
    current (like ``cudaSetDevice``) unless it already is. With ``None``, the
    current context is kept if there is one, else device 0's primary context
    is made current.

    Returns
    -------
    int
        The ordinal of the current context's device.
    """
    cur = int(_driver.call("cuCtxGetCurrent"))
    if ordinal is None:
        if cur:
            return int(_driver.call("cuCtxGetDevice"))
        ordinal = 0
    want = primary_context(ordinal)
    if cur != want:
        _driver.call("cuCtxSetCurrent", want)
    return ordinal
