"""Frames that memcheck keeps alive, and letting go of them.

Seen on the H100 (compute-sanitizer 2025.3.1 memcheck, CuPy 14.2.0, Python 3.12,
2026-11-25): under memcheck with host backtraces on (its default), a function that
launches a kernel (``cupy.arange``, the FFTs, cuda_memkit's block-copy kernel) stays
alive after it returns, held by one reference that the garbage collector cannot see,
and every array in its locals with it; ``scripts/cupy_frames_under_sanitizer.py``
shows it with CuPy alone. Without the sanitizer, or with ``--show-backtrace no``
(what ``scripts/gpu-check sanitize`` passes), nothing is kept. So the checks that
everything was given back cannot hold under a sanitizer run with backtraces unless
those frames let go of their locals.

``scripts/gpu-check sanitize`` sets ``CUDA_MEMKIT_SANITIZER=1``. Only then
does :func:`release` clear such frames; anywhere else it does nothing, so the
checks of every other run are exactly as strict as they were.
"""

from __future__ import annotations

import gc
import os
import sys
from types import FrameType

#: Set by ``scripts/gpu-check sanitize`` for the processes it runs under memcheck.
UNDER_SANITIZER = os.environ.get("CUDA_MEMKIT_SANITIZER") == "1"

# a generator's or coroutine's frame is cleared by closing it: never touch those
_SUSPENDABLE = 0x20 | 0x80 | 0x200  # CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR


def unseen_frames() -> list[FrameType]:
    """Frames that nothing but C code keeps: no tracked object, no running function.

    A frame is anchored if a tracked object other than a frame refers to it (a
    traceback, a list, a generator), if a running function's variable does
    (the garbage collector does not look into those: they are looked at
    here), or if an anchored frame does (its ``f_back``, which a finished
    frame keeps). The rest are returned: executing frames (the interpreter's
    stack holds them) and finished frames kept only from C.
    """
    gc.collect()
    frames = [o for o in gc.get_objects()
              if type(o) is FrameType and not o.f_code.co_flags & _SUSPENDABLE]
    ids = {id(f) for f in frames}
    here = sys._getframe()
    anchored: set[int] = set()
    edges: dict[int, list[int]] = {}  # frame -> the frames it refers to
    for r in gc.get_referrers(*frames):
        if r is frames or r is here:
            continue
        targets = [id(x) for x in gc.get_referents(r) if id(x) in ids and x is not r]
        if id(r) in ids:
            edges[id(r)] = targets
        else:
            anchored.update(targets)
    for top in sys._current_frames().values():
        running: FrameType | None = top
        while running is not None:
            if running is not here:
                anchored.update(id(v) for v in running.f_locals.values() if id(v) in ids)
            running = running.f_back
    todo = list(anchored)
    while todo:
        for j in edges.get(todo.pop(), ()):
            if j not in anchored:
                anchored.add(j)
                todo.append(j)
    return [f for f in frames if id(f) not in anchored]


def release() -> int:
    """Clear the locals of finished frames kept only from C (under the sanitizer).

    Returns how many frames were cleared. Does nothing unless
    ``CUDA_MEMKIT_SANITIZER=1``.
    """
    if not UNDER_SANITIZER:
        return 0
    cleared = 0
    for f in unseen_frames():
        try:
            f.clear()  # its locals: the arrays it kept alive
        except RuntimeError:  # still executing: the interpreter's own
            continue
        cleared += 1
    gc.collect()
    return cleared
