"""Ownership machinery shared by every owning object.

* :func:`make_finalizer` builds a ``weakref.finalize`` from a module-level
  release function and plain ints, never capturing the owner, so that
  :meth:`Resource.close` and garbage collection run the same code path.
* Failures inside a release become :class:`MemkitWarning` warnings (a
  finalizer must not raise); at interpreter shutdown releases are skipped (a
  leak is better than a dangling pointer or a crash).
* :class:`Resource` gives ``close()`` (idempotent), the context-manager
  protocol, the ``closed`` property and a clear :class:`ClosedError`.
* Owning objects refuse ``copy.copy``, ``copy.deepcopy`` and pickling
  (:class:`Unshareable`): a copy would be a second owner, freeing the memory
  a second time.
* Exports (:func:`host_array` numpy views, DLPack capsules) hold the buffer's
  :class:`Exports` record: the memory stays allocated while any export is
  alive, and a ``close()`` made meanwhile frees it when the last one goes.
  :func:`array_protocol` is numpy 2's ``__array__(dtype, copy)`` for every
  host-visible kind.
* :class:`Transaction` undoes the completed steps of a multi-step operation
  that failed part way.
* The allocation ledger (:class:`Account`, :func:`account`): every owning
  object registers its memory when it exists and leaves when it is freed,
  whichever path frees it; statistics, tracking and leak checks read it.
"""

from __future__ import annotations

import atexit
import enum
import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from . import _driver
from ._errors import ClosedError, CudaError, MemkitWarning

if TYPE_CHECKING:
    import numpy as np
    from typing_extensions import Self


class State(enum.Enum):
    """Lifecycle state of an owning object."""

    OPEN = "open"
    CLOSED = "closed"


# Module constants: an enum member lookup on a hot path costs more than a global load
# (docs/decisions.md, "Measurements behind code comments").
OPEN = State.OPEN
CLOSED = State.CLOSED


#: ``[True]`` once the interpreter exits: set by an ``atexit`` handler, before any module
#: is torn down. A ``__del__`` binds it as a default argument (``_exiting=EXITING``) and
#: releases nothing once it is set, so that it reads no module global (teardown sets them
#: to ``None``): a leak at exit is better than a driver call, or a traceback, during
#: teardown. One list index, where ``sys.is_finalizing()`` is a call.
EXITING: list[bool] = [False]


def _at_exit() -> None:
    EXITING[0] = True


atexit.register(_at_exit)


def run_release(what: str | tuple[str, int], release: Callable[..., None],
                 args: tuple[Any, ...]) -> None:
    if sys.is_finalizing():
        return
    try:
        release(*args)
    except CudaError as exc:
        if not isinstance(what, str):
            what = f"{what[0]} 0x{what[1]:x}"
        warnings.warn(f"cuda_memkit: releasing {what} failed: {exc}", MemkitWarning, stacklevel=2)


def driver_release(api: str, *args: Any) -> None:
    """Release function that makes one driver call: ``api(*args)``."""
    _driver.call(api, *args)


def make_finalizer(
    owner: object, what: str | tuple[str, int], release: Callable[..., None], *args: Any
) -> weakref.finalize:  # type: ignore[type-arg]
    """Build the finalizer that releases ``owner``'s resource.

    Parameters
    ----------
    owner : object
        The object whose collection triggers the release.
    what : str or (str, int)
        Human-readable description for warnings, e.g. ``"HostBuffer 0x7f.."``;
        a ``(kind, address)`` pair is formatted so only if a warning is due.
    release : callable
        A module-level function (never a bound method of ``owner``).
    *args
        Plain values (ints, tuples of ints) passed to ``release``.

    Returns
    -------
    weakref.finalize
        Call it to release now; it runs at most once. It does not run at
        interpreter exit.
    """
    fin = weakref.finalize(owner, run_release, what, release, args)
    fin.atexit = False
    return fin


#: How to share what an owning object owns, for the refusal to copy or pickle it.
SHARE_MEMORY = ("share the object itself, a view of its memory (.array, as_array(), "
                "numpy.from_dlpack / torch.from_dlpack / cupy.from_dlpack), or an IPC "
                "export handle (MemoryPool.export + PoolBuffer.export, PhysicalMemory.export)")


class Unshareable:
    """Refuses ``copy.copy``, ``copy.deepcopy`` and pickling with ``TypeError``.

    An owning object's copy would be a second owner of the same memory (or
    handle), and both would free it; an unpickled one would own an address of
    another process. Subclasses say how to share instead in ``_share_hint``.
    """

    __slots__ = ()
    _share_hint: str = SHARE_MEMORY

    def _refuse(self, what: str) -> TypeError:
        return TypeError(f"a {type(self).__name__} owns what it holds and cannot be {what} "
                         f"(a copy would be a second owner, freeing it twice): {self._share_hint}")

    def __copy__(self) -> Any:
        raise self._refuse("copied")

    def __deepcopy__(self, memo: object) -> Any:
        raise self._refuse("copied")

    def __reduce_ex__(self, protocol: object) -> Any:
        raise self._refuse("pickled")

    def __reduce__(self) -> Any:
        raise self._refuse("pickled")


class Resource(Unshareable):
    """Base class of every object that owns a driver resource."""

    # Subclasses without __slots__ get a __dict__; slotted ones (PoolBuffer)
    # stay dict-free, which keeps their __class__ assignment cheap. Hidden
    # from mypy, which would otherwise refuse the attributes subclasses with
    # a __dict__ set.
    if not TYPE_CHECKING:
        __slots__ = ("__weakref__",)

    _state: State = CLOSED
    _finalizer: weakref.finalize | None = None  # type: ignore[type-arg]
    #: A weak reference to the buffer's :class:`Exports` (None: never exported).
    _views: weakref.ref[Exports] | None = None

    def _open(self, finalizer: weakref.finalize | None) -> None:  # type: ignore[type-arg]
        """Mark the object open, owning the release done by ``finalizer``."""
        self._finalizer = finalizer
        self._state = OPEN

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._state is CLOSED

    def _check_open(self) -> None:
        if self._state is CLOSED:
            raise ClosedError(f"{type(self).__name__} is closed; it cannot be used any more")

    def close(self) -> None:
        """Release the resource now. Calling it again does nothing.

        If exports of this memory (numpy views from ``.array``, DLPack
        capsules and the arrays made from them) are still alive, the memory
        is released when the last of them is gone instead, so no export ever
        points at freed memory. The object itself is closed at once.
        """
        if self._state is CLOSED:
            return
        self._state = CLOSED
        views = self._views
        if views is not None and views() is not None:
            return  # released by the Exports record once the last export is gone
        if any(hook(self) for hook in release_hooks):
            return  # an asynchronous copy still uses the memory: released after it
        self._release_deferred()

    def _release_deferred(self) -> None:
        """The release: at once from ``close()``, or deferred while exports were alive (once)."""
        fin = self._finalizer
        if fin is not None:
            fin()

    def __enter__(self) -> Self:
        self._check_open()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self._close_on_error()
        except Exception as err:  # never replace the exception in flight: report this one
            warn_exit_failed(self, err)

    def _close_on_error(self) -> None:
        """What leaving a ``with`` block by an exception does: :meth:`close`."""
        self.close()


def warn_exit_failed(owner: object, err: BaseException) -> None:
    """A cleanup that failed while an exception propagated: a warning, never a new exception."""
    warnings.warn(f"cuda_memkit: {type(owner).__name__} was left by an exception, and cleaning "
                  f"it up failed too ({type(err).__name__}: {err}); the original exception "
                  "propagates", MemkitWarning, stacklevel=3)


# -- exports --------------------------------------------------------------------------


class Exports:
    """What every export of one buffer's memory holds: numpy views, DLPack capsules.

    Made on the buffer's first export, so buffers never exported (the pool hot
    paths) pay nothing; the buffer keeps only a weak reference to it
    (``_views``), so it dies with the last export. It holds the buffer, whose
    own release (finalizer or ``__del__``) therefore cannot run while an
    export is alive; ``close()`` made meanwhile only marks the buffer closed,
    and this record runs the release when the last export goes.
    """

    __slots__ = ("__weakref__", "owner")

    def __init__(self, owner: Resource) -> None:
        self.owner = owner

    def __del__(self) -> None:
        owner = self.owner
        if owner.closed and not sys.is_finalizing():
            if any(hook(owner) for hook in release_hooks):
                return
            owner._release_deferred()


#: Asked before a closed resource's memory is released, in order: a hook that returns
#: True has taken the release over (``_inflight`` registers one that waits for the
#: asynchronous copies still using the memory; this module cannot import it).
release_hooks: list[Callable[[Resource], bool]] = []


_exports_lock = threading.Lock()


def exports_of(owner: Resource) -> Exports:
    """The :class:`Exports` record a new export of ``owner``'s memory must hold.

    Raises
    ------
    ClosedError
        If ``owner`` is closed (checked after the record is registered, so a
        ``close()`` on another thread either sees the export or is seen here).
    """
    with _exports_lock:  # one record per buffer, whichever thread exports first
        ref = owner._views
        rec = ref() if ref is not None else None
        if rec is None:
            rec = Exports(owner)
            owner._views = weakref.ref(rec)
    if owner.closed:
        raise ClosedError(f"{type(owner).__name__} is closed; it cannot be exported any more")
    return rec


def exports_alive(owner: Resource) -> bool:
    """Whether exports of ``owner``'s memory are alive."""
    ref = owner._views
    return ref is not None and ref() is not None


class ArrayHolder:
    """The object numpy keeps as ``base``: an array interface plus the owner's exports."""

    __slots__ = ("__array_interface__", "__weakref__", "exports")

    def __init__(self, exports: Exports, interface: dict[str, Any]) -> None:
        self.exports = exports
        self.__array_interface__ = interface

    @property
    def owner(self) -> Resource:
        """The buffer whose memory the array views."""
        return self.exports.owner


def host_array(
    owner: Resource,
    ptr: int,
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    *,
    readonly: bool = False,
) -> np.ndarray[Any, Any]:
    """Return a zero-copy C-contiguous numpy array over host-accessible memory.

    The array (and every view of it) holds ``owner``'s :class:`Exports`:
    ``owner.close()`` defers the release until every such array is gone.
    """
    import numpy as np

    if ptr == 0:
        # numpy refuses NULL data; a zero-length buffer has no memory at all.
        return np.empty(shape, dtype)
    holder = ArrayHolder(
        exports_of(owner),
        {"data": (ptr, readonly), "shape": shape, "typestr": dtype.str, "version": 3,
         "descr": dtype.descr},
    )
    return np.asarray(holder)


def array_protocol(arr: np.ndarray[Any, Any], dtype: Any, copy: bool | None
                   ) -> np.ndarray[Any, Any]:
    """The ``__array__(dtype, copy)`` of numpy 2 over ``arr``, a zero-copy view of a buffer.

    ``copy=True`` always copies; ``copy=False`` raises ``ValueError`` where a
    copy is needed (another dtype); ``copy=None`` returns the view when it can.
    One rule for every host-visible kind (``np.array(buf)`` passes
    ``copy=True`` and so copies; ``np.asarray(buf)`` views).
    """
    import numpy as np

    if dtype is not None and np.dtype(dtype) != arr.dtype:
        if copy is False:
            raise ValueError(f"converting the buffer from {arr.dtype} to {np.dtype(dtype)} "
                             "needs a copy, and copy=False was asked for")
        out: np.ndarray[Any, Any] = arr.astype(dtype)
        return out
    if copy:
        dup: np.ndarray[Any, Any] = arr.copy()
        return dup
    return arr


# -- transactions ---------------------------------------------------------------------


class Transaction:
    """Undo log of a multi-step operation (VMM map + access, pool create + attributes).

    Push the undo of each step right after the step succeeded; if the block
    raises, the undos run in reverse order (their own failures become
    warnings, the original error propagates). On success nothing runs.
    """

    __slots__ = ("_steps",)

    def __init__(self) -> None:
        self._steps: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def push(self, fn: Callable[..., Any], *args: Any) -> None:
        """Register ``fn(*args)`` as the undo of the step that just succeeded."""
        self._steps.append((fn, args))

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        steps, self._steps = self._steps, []
        if exc_type is not None:
            for fn, args in reversed(steps):
                try:
                    fn(*args)
                except CudaError as err:
                    warnings.warn(f"cuda_memkit: undoing a failed step also failed: {err}",
                                  MemkitWarning, stacklevel=2)


# -- the allocation ledger ------------------------------------------------------------
#
# One Account per (kind, device, pool): its live allocations (allocation id ->
# bytes) and running counters. Every owning object adds its memory to its
# account when the memory exists and removes it when the memory is freed, on
# every path (close(), ``with``, garbage collection, a pool's free()), so the
# accounts always say what cuda_memkit holds. Sizes are the library's own
# (the bytes asked for), not the driver's rounded ones.
#
# Cost and threads: ``add`` / ``remove`` are a dict store / pop and a few
# integer updates on slots, no lock. Under the GIL a dict store or pop is
# atomic, and the ``+=`` updates run without a call between their load and
# store, so CPython does not switch threads or run a finalizer inside them
# (the eval loop only does that at calls and backward jumps; int arithmetic
# does not trigger the garbage collector). The two method calls are a small
# part of a real pool pair (docs/decisions.md, "Measurements behind code
# comments"), so the hot paths call them too.

#: The memory kinds, in reporting order: ledger account kind -> what it holds.
KINDS: dict[str, str] = {
    "device": "DeviceBuffer (cuMemAlloc)",
    "pool": "PoolBuffer (cuMemAllocFromPoolAsync), per pool",
    "managed": "ManagedBuffer (cuMemAllocManaged)",
    "pinned": "HostBuffer (cuMemHostAlloc)",
    "pinned_pooled": "HostBuffer from a pinned pool (HostBuffer.pooled, empty(pool=...))",
    "registered": "RegisteredHost (cuMemHostRegister)",
    "vmm_physical": "PhysicalMemory (cuMemCreate)",
    "vmm_mapped": "Mapping (cuMemMap)",
    "growable": "GrowableBuffer (mapped chunks)",
    "shared_ring": "SharedHostRing segments (registered: also counted under registered)",
    "managed_resident": "ManagedBuffer bytes cuda_memkit last prefetched to the device "
                        "(its own record; also counted under managed)",
}


class Account:
    """The live allocations of one memory kind on one device (and pool).

    Attributes
    ----------
    kind : str
        A key of :data:`KINDS`.
    device : int or None
        The device ordinal holding the memory; ``None`` for host memory.
    pool : int or None
        The pool handle (kind ``"pool"``), else ``None``.
    live : dict
        Allocation id -> bytes, for every allocation alive now. The id is the
        allocation's address or handle (unique among the account's live
        allocations); the owning object is found from it.
    current : int
        Bytes alive now (the sum of ``live``).
    peak : int
        Highest ``current`` since the account was made or :meth:`reset_peak`.
    total : int
        Allocations made since the account was made.
    caches : list
        Block caches in front of this memory (``cuda_memkit._pools._cache``):
        what they hold is not in use (not in ``live``), see :attr:`cached`.
    """

    __slots__ = ("__weakref__", "caches", "current", "device", "kind", "live", "peak", "pool",
                 "total")

    def __init__(self, kind: str, device: int | None, pool: int | None = None) -> None:
        self.kind = kind
        self.device = device
        self.pool = pool
        self.live: dict[object, int] = {}
        self.current = 0
        self.peak = 0
        self.total = 0
        self.caches: list[Any] = []

    @property
    def cached(self) -> int:
        """Bytes freed by their users and held by the block caches of this memory."""
        return sum(c.cached for c in list(self.caches))

    @property
    def cached_peak(self) -> int:
        """The most bytes those caches held at once (exact for the usual single cache)."""
        return sum(c.peak for c in list(self.caches))

    def add(self, key: object, nbytes: int, stream: Any = None) -> None:
        """Register allocation ``key`` of ``nbytes`` bytes (ordered on ``stream``, if any).

        ``stream`` is a handle (int) or a ``CUstream``: the watchers get its int.
        """
        self.live[key] = nbytes
        c = self.current = self.current + nbytes
        if c > self.peak:
            self.peak = c
        self.total += 1
        if watchers:
            notify(self, key, nbytes, True, stream)

    def remove(self, key: object, stream: Any = None) -> int | None:
        """Allocation ``key`` was freed: its bytes, or ``None`` if it was not registered.

        The ``dict.pop`` is the claim of a release: of two threads releasing one
        allocation, exactly one gets its bytes (and frees it).
        """
        n = self.live.pop(key, None)
        if n is not None:
            self.current -= n
            if watchers:
                notify(self, key, n, False, stream)
        return n

    def restore(self, key: object, nbytes: int, stream: Any = None) -> None:
        """A release the driver refused: allocation ``key`` of ``nbytes`` is live again.

        Not a new allocation (:attr:`total` stays); watchers, told of the free,
        are told of the allocation again.
        """
        self.live[key] = nbytes
        self.current += nbytes
        if watchers:
            notify(self, key, nbytes, True, stream)

    def resize(self, key: object, nbytes: int) -> None:
        """Live allocation ``key`` now holds ``nbytes`` (a growable buffer resized)."""
        old = self.live.get(key)
        if old is None:
            return
        self.live[key] = nbytes
        c = self.current = self.current + nbytes - old
        if c > self.peak:
            self.peak = c
        if watchers:
            if nbytes > old:
                notify(self, key, nbytes - old, True)
            else:
                notify(self, key, old - nbytes, False)

    def reset_peak(self) -> None:
        """Set :attr:`peak` to :attr:`current` (and the caches' peaks to what they hold)."""
        self.peak = self.current
        for c in list(self.caches):
            c.peak = c.cached

    def __repr__(self) -> str:
        where = "host" if self.device is None else f"device {self.device}"
        pool = f" pool 0x{self.pool:x}" if self.pool is not None else ""
        return (f"<Account {self.kind} {where}{pool}: {len(self.live)} live, "
                f"{self.current} bytes, peak {self.peak}, {self.total} made>")


#: Every account, by (kind, device, pool).
LEDGER: dict[tuple[str, int | None, int | None], Account] = {}
_ledger_lock = threading.Lock()

#: Callables ``(account, key, nbytes, allocated, stream)`` told of every add
#: and remove while non-empty (tracking); empty, they cost one truthiness test.
watchers: list[Callable[[Account, object, int, bool, int | None], None]] = []


def notify(acct: Account, key: object, nbytes: int, allocated: bool,
           stream: Any = None) -> None:
    """Tell every watcher of an allocation (``allocated``) or a free (on ``stream``, if any).

    ``stream`` is a handle (int) or a ``CUstream``; the watchers get its int.
    """
    if stream is not None:
        stream = int(stream)
    for w in list(watchers):
        w(acct, key, nbytes, allocated, stream)


def account(kind: str, device: int | None = None, pool: int | None = None) -> Account:
    """Return the account of ``kind`` memory on ``device`` (and ``pool``), made on first use."""
    key = (kind, device, pool)
    acct = LEDGER.get(key)
    if acct is None:
        if kind not in KINDS:
            raise ValueError(f"unknown memory kind {kind!r}")
        with _ledger_lock:
            acct = LEDGER.get(key)
            if acct is None:
                acct = LEDGER[key] = Account(kind, device, pool)
    return acct


def forget_account(kind: str, device: int | None, pool: int | None) -> None:
    """Drop an account that holds nothing (its pool was destroyed: the handle may be reused)."""
    with _ledger_lock:
        acct = LEDGER.get((kind, device, pool))
        if acct is not None and not acct.live:
            del LEDGER[(kind, device, pool)]


#: Callables that bring accounts kept lazily up to date (the managed residency
#: record folds its log of prefetches into its account): run by :func:`settle`.
settlers: list[Callable[[], None]] = []


def settle() -> None:
    """Bring every lazily kept account up to date (before reading the ledger)."""
    for fn in list(settlers):
        fn()


def live_allocations() -> list[tuple[Account, object, int]]:
    """Every live allocation: ``(account, allocation id, bytes)``."""
    out: list[tuple[Account, object, int]] = []
    for acct in list(LEDGER.values()):
        out.extend((acct, key, n) for key, n in list(acct.live.items()))
    return out
