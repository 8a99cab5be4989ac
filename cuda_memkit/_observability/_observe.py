"""Records shared by statistics, tracking and leak reports.

* :class:`Frame`: one line of a Python stack (file, line, function).
* :class:`MemoryEvent`: one allocation, free or resize seen by a tracker.
* :class:`Allocation`: one live allocation, with where it was made.
* :func:`format_bytes`, :func:`where`: the wording every report uses.
* :func:`capture_stack`: the stack of the call that allocated (its caller
  skips cuda_memkit's own frames, :data:`PACKAGE_DIR`).

Nothing here reads the ledger or talks to the driver.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import FrameType
from typing import Any, NamedTuple

__all__ = [
    "ACTIONS",
    "ALLOC",
    "FREE",
    "GROW",
    "MAX_FRAMES",
    "PACKAGE_DIR",
    "SHRINK",
    "Allocation",
    "Frame",
    "MemoryEvent",
    "RawFrame",
    "capture_stack",
    "format_bytes",
    "format_stack",
    "frames",
    "where",
]

#: What a tracked event records, by code (the hot path stores the int).
ALLOC, FREE, GROW, SHRINK = 0, 1, 2, 3
#: Event actions by code.
ACTIONS = ("alloc", "free", "grow", "shrink")

#: Frames under this directory are cuda_memkit's own: a stack starts at the first frame outside.
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
#: The most frames kept of one stack (the innermost ones).
MAX_FRAMES = 64

#: A frame as captured on the hot path: ``(file, line, function)``.
RawFrame = tuple[str, int, str]


class Frame(NamedTuple):
    """One line of a Python stack: where an allocation was made.

    Attributes
    ----------
    file : str
        The source file.
    line : int
        The line number.
    function : str
        The function (``<module>`` at module level).
    """

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


def capture_stack(f: FrameType | None) -> tuple[RawFrame, ...]:
    """The stack from frame ``f`` outwards, innermost first, at most :data:`MAX_FRAMES` frames."""
    out: list[RawFrame] = []
    n = 0
    while f is not None and n < MAX_FRAMES:
        code = f.f_code
        out.append((code.co_filename, f.f_lineno, code.co_name))
        f = f.f_back
        n += 1
    return tuple(out)


def frames(raw: tuple[RawFrame, ...] | None) -> tuple[Frame, ...] | None:
    """Captured frames (innermost first) as :class:`Frame` objects, outermost first."""
    if raw is None:
        return None
    return tuple(Frame(*fr) for fr in reversed(raw))


def format_bytes(n: int) -> str:
    """``n`` bytes for people: ``"512 B"``, ``"3.0 KiB"``, ``"1.50 GiB"``."""
    if abs(n) < 1024:
        return f"{n} B"
    for unit, shift in (("KiB", 10), ("MiB", 20), ("GiB", 30), ("TiB", 40)):
        if abs(n) < 1 << (shift + 10) or unit == "TiB":
            v = n / (1 << shift)
            return f"{v:.2f} {unit}" if abs(v) < 10 else f"{v:.1f} {unit}"
    raise AssertionError("unreachable")  # pragma: no cover


def where(kind: str, device: int | None, pool: int | None) -> str:
    """``"pool on device 0 (pool 0x5a1)"``: a ledger account in words."""
    out = f"{kind} on {'host' if device is None else f'device {device}'}"
    if pool is not None:
        out += f" (pool 0x{pool:x})"
    return out


def format_stack(stack: tuple[Frame, ...] | None, *, limit: int = 12,
                 skip: tuple[str, ...] = (), indent: str = "    ") -> list[str]:
    """Lines of a stack, most recent call last (like a traceback), at most ``limit`` frames.

    With ``skip`` (e.g. ``("/_pytest/",)``), the stack starts after the last
    frame whose file contains one of them: a test runner's frames go, the
    test's own stay.
    """
    if not stack:
        return [f"{indent}(no stack recorded)"]
    kept = list(stack)
    if skip:
        cut = [i for i, fr in enumerate(kept) if any(s in fr.file for s in skip)]
        if cut and cut[-1] < len(kept) - 1:
            kept = kept[cut[-1] + 1:]
    lines = []
    if len(kept) > limit:
        lines.append(f"{indent}... {len(kept) - limit} outer frame(s)")
        kept = kept[-limit:]
    lines.extend(f'{indent}File "{fr.file}", line {fr.line}, in {fr.function}' for fr in kept)
    return lines


@dataclass(frozen=True)
class MemoryEvent:
    """One allocation, free or resize recorded by :func:`cuda_memkit.track`.

    Attributes
    ----------
    time : float
        Seconds since the tracker started.
    action : str
        ``"alloc"``, ``"free"``, ``"grow"`` or ``"shrink"`` (a
        :class:`~cuda_memkit.GrowableBuffer` resized).
    kind : str
        The memory kind (a key of :data:`cuda_memkit.MEMORY_KINDS`).
    device : int or None
        The device holding the memory; ``None`` for host memory.
    pool : int or None
        The pool handle for kind ``"pool"``, else ``None``.
    address : int
        The allocation's address (for ``"vmm_physical"``: its allocation handle).
    nbytes : int
        Bytes allocated or freed (for a resize: the change).
    stream : int or None
        The stream handle of a pool allocation or free, else ``None``.
    thread : int
        ``threading.get_ident()`` of the thread that made the call.
    site : Frame or None
        For allocations and growth: the caller's line (the first frame
        outside cuda_memkit).
    stack : tuple of Frame or None
        With ``track(stacks=True)``, for allocations and growth: the caller's
        stack, outermost first (``stack[-1] == site``).
    """

    time: float
    action: str
    kind: str
    device: int | None
    pool: int | None
    address: int
    nbytes: int
    stream: int | None
    thread: int
    site: Frame | None = None
    stack: tuple[Frame, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The event as JSON-ready values (frames as ``[file, line, function]`` lists)."""
        return {
            "time": self.time, "action": self.action, "kind": self.kind, "device": self.device,
            "pool": self.pool, "address": self.address, "nbytes": self.nbytes,
            "stream": self.stream, "thread": self.thread,
            "site": None if self.site is None else list(self.site),
            "stack": None if self.stack is None else [list(f) for f in self.stack],
        }

    def __repr__(self) -> str:
        at = f" at {self.site}" if self.site is not None else ""
        return (f"<MemoryEvent {self.time:.6f}s {self.action} {format_bytes(self.nbytes)} "
                f"{where(self.kind, self.device, self.pool)} 0x{self.address:x}{at}>")


@dataclass(frozen=True)
class Allocation:
    """One live allocation: what it is and where it was made.

    Attributes
    ----------
    kind, device, pool, address
        As in :class:`MemoryEvent`.
    nbytes : int
        Bytes it holds now.
    time : float or None
        When it was made, in seconds since the tracker started (``None`` if
        it was made before tracking started).
    stream : int or None
        The stream of a pool allocation, else ``None``.
    thread : int or None
        The thread that made it (``None`` if unknown).
    site : Frame or None
        The line that made it (``None`` if unknown).
    stack : tuple of Frame or None
        The stack that made it, outermost first, if stacks were recorded.
    """

    kind: str
    device: int | None
    pool: int | None
    address: int
    nbytes: int
    time: float | None = None
    stream: int | None = None
    thread: int | None = None
    site: Frame | None = None
    stack: tuple[Frame, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The allocation as JSON-ready values."""
        return {
            "kind": self.kind, "device": self.device, "pool": self.pool,
            "address": self.address, "nbytes": self.nbytes, "time": self.time,
            "stream": self.stream, "thread": self.thread,
            "site": None if self.site is None else list(self.site),
            "stack": None if self.stack is None else [list(f) for f in self.stack],
        }

    def describe(self, *, limit: int = 12, skip: tuple[str, ...] = ()) -> str:
        """Several lines: size, kind, address and the allocation stack (or site)."""
        head = (f"{format_bytes(self.nbytes)} ({self.nbytes} bytes) of "
                f"{where(self.kind, self.device, self.pool)} at 0x{self.address:x}")
        if self.stack:
            return "\n".join([head + ", allocated at (most recent call last):",
                              *format_stack(self.stack, limit=limit, skip=skip)])
        if self.site is not None:
            return f"{head}, allocated at {self.site}"
        return f"{head} (allocation site not recorded)"

    def __repr__(self) -> str:
        at = f" at {self.site}" if self.site is not None else ""
        return (f"<Allocation {format_bytes(self.nbytes)} "
                f"{where(self.kind, self.device, self.pool)} 0x{self.address:x}{at}>")

