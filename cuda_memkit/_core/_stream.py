"""Streams: the Stream resource, what a ``stream=`` argument accepts, and their hooks."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, Union

from cuda.bindings import driver as _cu

from . import _capture, _driver
from ._checks import MAX_U64, check_bool, check_int, check_u64
from ._constants import EVENT_DISABLE_TIMING, STREAM_LEGACY, STREAM_NON_BLOCKING
from ._context import ensure_context
from ._device import Device, check_ordinal, sync_hooks
from ._errors import CudaError
from ._resource import Resource, driver_release, make_finalizer

__all__ = [
    "Stream",
    "StreamLike",
    "StreamRef",
    "buffer_stream",
    "custream",
    "forked_stream",
    "stream_close_hooks",
    "stream_destroyed",
    "stream_handle",
]


@contextlib.contextmanager
def forked_stream(stream: int) -> Iterator[int]:
    """A private non-blocking stream whose work is ordered as if it went to ``stream``.

    The private stream waits for the work already on ``stream`` (an event);
    on leaving the block, ``stream`` waits for the private stream's work (the
    same event, recorded again), also when the block raised, since work it
    issued before the error is in flight. The stream and the event are
    destroyed at once; the driver releases them when their work is done.
    """
    call = _driver.call
    ev = call("cuEventCreate", EVENT_DISABLE_TIMING)
    try:
        call("cuEventRecord", ev, stream)
        private = int(call("cuStreamCreate", STREAM_NON_BLOCKING))
        try:
            call("cuStreamWaitEvent", private, ev, 0)
            try:
                yield private
            finally:
                call("cuEventRecord", ev, private)
                call("cuStreamWaitEvent", stream, ev, 0)
        finally:
            call("cuStreamDestroy", private)
    finally:
        call("cuEventDestroy", ev)


StreamLike = Union["Stream", int, None, Any]
"""What every ``stream=`` argument accepts: a :class:`Stream`, an int handle,
``None`` (the legacy default stream), an object with ``__cuda_stream__``
(cuda.core, CuPy >= 13), or one with an int ``.cuda_stream`` (torch) or
``.ptr`` (older CuPy)."""



class Stream(Resource):
    """A CUDA stream.

    Parameters
    ----------
    device : Device or int, optional
        Device the stream belongs to; default: the current context's device
        (device 0 when there is none).
    non_blocking : bool, default True
        ``CU_STREAM_NON_BLOCKING``: no implicit synchronisation with the
        legacy default stream.
    priority : int, default 0
        Stream priority (lower numbers are higher priority).

    Notes
    -----
    ``Stream.from_handle(h)`` wraps a stream someone else owns; closing such
    a wrapper never destroys the stream.
    """

    _share_hint = ("share the Stream object itself, or wrap its handle without owning it "
                   "(Stream.from_handle(stream.handle))")

    #: The typed handle (``CUstream``) for driver calls that want one, made
    #: once; ``None`` once closed. The pool allocation path reads it, both as
    #: the handle and as the closed test (``_state``, which has a class
    #: default, is a slower generic attribute load).
    _custream: Any
    #: Held by ``close()`` to set ``_custream`` to ``None``, and by a release that
    #: frees memory on the stream from reading ``_custream`` to the driver call:
    #: a stream is never destroyed between the two (freeing on a destroyed
    #: stream handle can crash the process).
    release_lock: threading.Lock

    def __init__(
        self, device: Device | int | None = None, *, non_blocking: bool = True, priority: int = 0
    ) -> None:
        check_bool(non_blocking, "non_blocking")
        check_int(priority, "priority")
        ordinal = ensure_context(None if device is None else check_ordinal(device))
        flags = 1 if non_blocking else 0
        handle = int(_driver.call("cuStreamCreateWithPriority", flags, priority))
        self._handle = handle
        self.release_lock = threading.Lock()
        self._custream = _cu.CUstream(handle)
        self._device = ordinal
        self._owned = True
        self._open(make_finalizer(self, f"stream 0x{handle:x}", _destroy_stream, handle))

    @classmethod
    def from_handle(cls, handle: int) -> Stream:
        """Wrap an existing stream handle without taking ownership.

        Parameters
        ----------
        handle : int
            A ``CUstream`` handle as an int (``0``, ``CU_STREAM_LEGACY`` and
            ``CU_STREAM_PER_THREAD`` included); closing the wrapper never
            destroys it.
        """
        handle = check_u64(check_int(handle, "a stream handle"), "a stream handle")
        self = cls.__new__(cls)
        self._handle = handle
        self.release_lock = threading.Lock()
        self._custream = _cu.CUstream(handle)
        self._device = -1
        self._owned = False
        self._open(None)
        return self

    @classmethod
    def legacy_default(cls) -> Stream:
        """The legacy default stream (``CU_STREAM_LEGACY``)."""
        return cls.from_handle(STREAM_LEGACY)

    @property
    def handle(self) -> int:
        """The ``CUstream`` handle as an int."""
        self._check_open()
        return self._handle

    @property
    def owned(self) -> bool:
        """Whether closing this object destroys the stream."""
        return self._owned

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)

    def close(self) -> None:
        """Destroy the stream (if owned) and close the object; calling it again does nothing.

        Memory that block caches hold for the stream goes back to its pool
        first (:data:`stream_close_hooks`). A release of memory on the stream
        running on another thread finishes its driver call first (or frees
        as after the close).
        """
        lock = self.__dict__.get("release_lock")
        if lock is None:  # never fully made
            self._custream = None
        else:
            with lock:
                self._custream = None
        super().close()

    def synchronize(self) -> None:
        """Wait until all work queued on the stream has finished.

        The operands that asynchronous copies kept alive until now are let go here
        (:data:`sync_hooks`), so a buffer dropped after the copy is freed at once.
        """
        _driver.call("cuStreamSynchronize", self.handle)
        for hook in sync_hooks:
            hook()

    def query(self) -> bool:
        """Return ``True`` if all queued work has finished, ``False`` if not."""
        try:
            _driver.call("cuStreamQuery", self.handle)
        except CudaError as exc:
            if exc.code == int(_cu.CUresult.CUDA_ERROR_NOT_READY):
                return False
            raise
        return True

    # -- capture into a CUDA graph (cuda_memkit._core._capture) --------------------------
    def begin_capture(self, mode: str = "global") -> None:
        """Begin capturing the work issued on this stream into a CUDA graph.

        The work is recorded, not run, until :meth:`end_capture`. Memory
        cuda_memkit allocates on this stream during the capture belongs to
        the graph (see :class:`Graph`).

        Parameters
        ----------
        mode : {"global", "thread_local", "relaxed"}
            ``cuStreamBeginCapture``'s mode: which calls other threads (or
            this one) may make while the capture is under way.
        """
        self._check_open()
        _capture.begin_capture(self._custream, mode)

    def end_capture(self) -> _capture.Graph:
        """End the capture and return the instantiated :class:`Graph`."""
        self._check_open()
        return _capture.end_capture(self._custream)

    @property
    def is_capturing(self) -> bool:
        """Whether the stream captures into a graph now (``cuStreamIsCapturing``)."""
        self._check_open()
        return _capture.is_capturing(self._custream)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"0x{self._handle:x}"
        return f"<Stream {state}{'' if self._owned else ' (borrowed)'}>"


#: Called with an owned stream's int handle just before it is destroyed (``close()`` or
#: collection): the block caches of ``cuda_memkit._pools._cache`` register here, so that
#: memory freed on the stream goes back to its pool while the stream still exists
#: (a plug-in point, so that this layer imports nothing above it).
stream_close_hooks: list[Callable[[int], None]] = []


def _destroy_stream(handle: int) -> None:
    """Release function of an owned Stream: the close hooks, then ``cuStreamDestroy``."""
    try:
        for hook in list(stream_close_hooks):
            hook(handle)
    finally:
        driver_release("cuStreamDestroy", handle)


def stream_handle(stream: StreamLike) -> int:
    """Return the int ``CUstream`` handle of anything a ``stream=`` argument accepts.

    Raises
    ------
    TypeError
        For objects that are not streams.
    ClosedError
        For a closed :class:`Stream`.
    """
    if stream is None:
        return 0
    if type(stream) is Stream:
        return stream.handle
    if isinstance(stream, bool):
        raise TypeError("a stream cannot be a bool")
    if isinstance(stream, int):
        if stream < 0 or stream > MAX_U64:
            check_u64(stream, "a stream handle")  # raises the ValueError naming it
        return int(stream)
    if isinstance(stream, Stream):
        return stream.handle
    if isinstance(stream, _cu.CUstream):
        return int(stream)
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        value = proto() if callable(proto) else proto
        if isinstance(value, tuple) and len(value) == 2:
            return check_u64(value[1], "a stream handle")
        raise TypeError("__cuda_stream__ must return a (version, handle) tuple")
    for attr in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return check_u64(value, "a stream handle")
    raise TypeError(
        f"expected a stream (Stream, int handle, None, or an object with __cuda_stream__ "
        f"or .cuda_stream), not {type(stream).__name__}"
    )


# -- typed stream handles kept with the object they came from ---------------------------

_CUSTREAMS: dict[int, Any] = {}  # int handle -> CUstream


def custream(stream: StreamLike) -> Any:
    """Return the cached ``CUstream`` for anything a ``stream=`` argument accepts."""
    h = stream_handle(stream)
    cs = _CUSTREAMS.get(h)
    if cs is None:
        if len(_CUSTREAMS) >= 1024:
            _CUSTREAMS.clear()
        cs = _CUSTREAMS[h] = _cu.CUstream(h)
    return cs


class StreamRef:
    """What a buffer holds for a stream given as anything but a :class:`Stream`.

    It carries the ``CUstream`` as ``_custream``, the attribute a
    :class:`Stream` carries too, so a buffer reads its stream (and, for a
    ``Stream``, whether it was closed: ``None``) with one attribute load
    whatever it was given; ``obj`` keeps a stream object (CuPy, torch,
    cuda.core) alive as long as the buffer.
    """

    __slots__ = ("_custream", "obj")

    def __init__(self, cus: Any, obj: object) -> None:
        self._custream = cus
        self.obj = obj


def stream_destroyed(sref: Stream | StreamRef) -> bool:
    """Whether ``sref`` is a :class:`Stream` destroyed by its collection, ``_custream`` still set.

    A buffer and the Stream it was allocated on can be collected in one
    garbage cycle: the Stream's finalizer (a weakref callback) then runs
    before the buffer's ``__del__`` and destroys the stream, but leaves the
    object as it was. The buffer must not hand that handle to the driver (a
    destroyed stream handle is an error at best): it frees as if the stream
    had been closed.
    """
    fin = sref._finalizer if isinstance(sref, Stream) else None
    return fin is not None and not fin.alive


_HANDLE_REFS: dict[int, StreamRef] = {}  # int handles (and None): one shared StreamRef each


def buffer_stream(stream: StreamLike) -> Stream | StreamRef:
    """The object a buffer allocated on ``stream`` holds (its ``_custream`` set).

    Raises ClosedError for a closed :class:`Stream`.
    """
    if isinstance(stream, Stream):
        if stream._custream is None:
            stream._check_open()  # raises
        return stream
    if stream is None or type(stream) is int:
        ref = _HANDLE_REFS.get(stream)  # type: ignore[arg-type]
        if ref is None:
            if len(_HANDLE_REFS) >= 1024:
                _HANDLE_REFS.clear()
            ref = _HANDLE_REFS[stream] = StreamRef(custream(stream), None)  # type: ignore[index]
        return ref
    return StreamRef(custream(stream), stream)


# The capture module cannot import this one (this one imports it): it gets this here.
_capture.stream_of = custream
