"""Ownership machinery shared by every owning object.

* :func:`make_finalizer` builds a ``weakref.finalize`` from a module-level
  release function and plain ints, never capturing the owner, so that
  :meth:`Resource.close` and garbage collection run the same code path.
* Failures inside a release become :class:`MemkitWarning` warnings (a
  finalizer must not raise); at interpreter shutdown releases are skipped (a
  leak is better than a dangling pointer or a crash).
* :class:`Resource` gives ``close()`` (idempotent), the context-manager
  protocol, the ``closed`` property and a clear :class:`ClosedError`.
* :func:`host_array` makes a zero-copy numpy view of host-accessible memory
  that keeps its owner alive; the owner defers its release until such views
  are gone.
"""

from __future__ import annotations

import collections
import enum
import sys
import warnings
import weakref
from collections.abc import Callable
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


#: Operands of asynchronous copies still in flight, per stream handle: (event,
#: references) pairs, owned by ``_memory`` (``copy_async``, ``reap_pending``);
#: here so that allocation paths can test it without importing ``_memory``.
pending_operands: dict[int, collections.deque[tuple[Any, tuple[Any, ...]]]] = {}

# Module constants: an enum member lookup costs ~120 ns on hot paths.
_OPEN = State.OPEN
_CLOSED = State.CLOSED


def _run_release(what: str | tuple[str, int], release: Callable[..., None],
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
    fin = weakref.finalize(owner, _run_release, what, release, args)
    fin.atexit = False
    return fin


class Resource:
    """Base class of every object that owns a driver resource."""

    # Subclasses without __slots__ get a __dict__; slotted ones (PoolBuffer)
    # stay dict-free, which keeps their __class__ assignment cheap. Hidden
    # from mypy, which would otherwise refuse the attributes subclasses with
    # a __dict__ set.
    if not TYPE_CHECKING:
        __slots__ = ("__weakref__",)

    _state: State = _CLOSED
    _finalizer: weakref.finalize | None = None  # type: ignore[type-arg]
    _views: weakref.WeakSet[Any] | None = None

    def _open(self, finalizer: weakref.finalize | None) -> None:  # type: ignore[type-arg]
        """Mark the object open, owning the release done by ``finalizer``."""
        self._finalizer = finalizer
        self._state = _OPEN

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._state is _CLOSED

    def _check_open(self) -> None:
        if self._state is _CLOSED:
            raise ClosedError(f"{type(self).__name__} is closed; it cannot be used any more")

    def close(self) -> None:
        """Release the resource now. Calling it again does nothing.

        If numpy views of this memory (from ``.array``) are still alive, the
        memory is released when the last of them is collected instead, so no
        view ever points at freed memory. The object itself is closed at once.
        """
        if self._state is _CLOSED:
            return
        self._state = _CLOSED
        if self._views:
            return  # the finalizer runs once the views (which hold us) are gone
        fin = self._finalizer
        if fin is not None:
            fin()

    def __enter__(self) -> Self:
        self._check_open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _ArrayHolder:
    """The object numpy keeps as ``base``: an array interface plus the owner."""

    __slots__ = ("__array_interface__", "__weakref__", "owner")

    def __init__(self, owner: object, interface: dict[str, Any]) -> None:
        self.owner = owner
        self.__array_interface__ = interface


def host_array(
    owner: Resource,
    ptr: int,
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    *,
    readonly: bool = False,
) -> np.ndarray[Any, Any]:
    """Return a zero-copy C-contiguous numpy array over host-accessible memory.

    The array keeps ``owner`` alive; ``owner.close()`` defers the release
    until every such array is gone.
    """
    import numpy as np

    if ptr == 0:
        # numpy refuses NULL data; a zero-length buffer has no memory at all.
        return np.empty(shape, dtype)
    holder = _ArrayHolder(
        owner,
        {"data": (ptr, readonly), "shape": shape, "typestr": dtype.str, "version": 3,
         "descr": dtype.descr},
    )
    views = owner._views
    if views is None:
        views = owner._views = weakref.WeakSet()
    views.add(holder)
    return np.asarray(holder)
