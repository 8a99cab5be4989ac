"""Stream capture into CUDA graphs, and the graph memory handed out during a capture.

:class:`Graph` owns an executable graph and the graph it was made from
(``cuStreamEndCapture`` + ``cuGraphInstantiate``); :func:`begin_capture`,
:func:`end_capture` and :func:`is_capturing` are what ``Stream.begin_capture``,
``Stream.end_capture`` and ``Stream.is_capturing`` call.

Memory allocated while a stream captures
----------------------------------------
A graph bakes in every address it touched, and replays its work on them at
every launch. So an allocation on a capturing stream must not be served from
memory anyone else can get back while the graph may still run. cuda_memkit
serves it with the driver's graph memory nodes: ``cuMemAllocFromPoolAsync`` on
the capturing stream, never a cached block. The address then belongs to the
graph for the graph's life, and the driver lends it to nobody else.

What happens when the holder frees such a block (:func:`release_graph_block`):

* on a stream that still captures the same capture: ``cuMemFreeAsync`` there
  (a free node: the graph frees it at every launch);
* after the capture: a graph allocation cannot be freed before a launch
  allocated it (the driver refuses). The block is kept (:class:`CaptureRecord`)
  and stays in the ledger (kind ``graph``) until it can go: for a
  :class:`Graph` of cuda_memkit's, when the graph is closed; for a graph
  someone else captured (CuPy, torch, cuda.core, raw driver calls), whose
  launches and destruction cuda_memkit cannot see, at the next
  :func:`retry_deferred` (every later allocation during a capture,
  ``MemoryPool.empty_cache()``, :func:`cuda_memkit.release_graph_memory`).

Knowing that a stream captures costs a driver query, too much for every
allocation, so the allocation paths ask only while :data:`active` is non-zero:
while a capture begun by :func:`begin_capture` (or a capture entry point
cuda_memkit wraps, see :func:`note_capture`) is under way, or after
:func:`watch_captures` asked for it.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from cuda.bindings import driver as _cu

from . import _driver
from ._checks import check_bool, one_of
from ._constants import STREAM_LEGACY
from ._context import context_retry, primary_pushed
from ._errors import CudaError
from ._resource import Resource, account, make_finalizer

__all__ = ["CAPTURE_MODES", "CaptureRecord", "Graph", "Hold", "active", "begin_capture",
           "capture_id", "capture_id_on_release", "capture_may_run", "end_capture",
           "flag_hooks", "give_later", "has_deferred",
           "hold_until_gone", "is_capturing", "keep_for_graph", "mirror", "note_capture",
           "own_open", "record_for", "relaxed", "release_graph_block", "retry_deferred",
           "watch_captures", "watch_frameworks", "wrap_entry_points"]

#: The capture modes ``begin_capture`` accepts -> ``CUstreamCaptureMode``.
CAPTURE_MODES = {"global": 0, "thread_local": 1, "relaxed": 2}
_ACTIVE = 1  # CU_STREAM_CAPTURE_STATUS_ACTIVE
_INVALID_VALUE = 1  # CUDA_ERROR_INVALID_VALUE
#: CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH: a relaunch frees what the previous
#: launch allocated and did not free, so that the graph's outputs stay readable between
#: launches (at the same addresses) and a relaunch never fails on them.
AUTO_FREE_ON_LAUNCH = 1

#: Captures that may be under way: begun by begin_capture() and not ended, announced by
#: note_capture(), plus one while watch_captures() is on. While non-zero the allocation
#: paths ask the driver whether their stream captures.
active = 0
_watching = False
#: Called with the new value of :data:`active` (the block cache keeps its own copy, read
#: on every allocation).
flag_hooks: list[Callable[[int], None]] = []
_lock = threading.RLock()

#: Set by ``_stream`` when it loads (it imports this module, so this one cannot import it):
#: the ``CUstream`` of anything a ``stream=`` argument accepts (ClosedError for a closed one).
stream_of: Callable[[object], Any] | None = None


def _change(delta: int) -> None:
    global active
    with _lock:
        active = max(0, active + delta)
        for hook in list(flag_hooks):
            hook(active)


class relaxed:
    """The calling thread's capture mode relaxed for a block (cuThreadExchangeStreamCaptureMode).

    A capture in global mode makes the driver refuse, and invalidates the
    capture for, calls such as ``cuMemAllocFromPoolAsync`` on another stream;
    cuda_memkit's own allocations that are not part of the graph (a pinned
    block for a descriptor) are made relaxed, as PyTorch does around its own.
    """

    __slots__ = ("old",)

    def __enter__(self) -> None:
        self.old = _driver.call("cuThreadExchangeStreamCaptureMode",
                                _cu.CUstreamCaptureMode(CAPTURE_MODES["relaxed"]))

    def __exit__(self, *exc: object) -> None:
        _driver.call("cuThreadExchangeStreamCaptureMode", self.old)


def mirror(space: dict[str, Any], name: str) -> None:
    """Keep ``space[name]`` (a hot path module's global) equal to :data:`active`.

    A module global costs the allocation paths one load; an attribute of this
    module would cost two.
    """
    def hook(n: int) -> None:
        space[name] = n

    flag_hooks.append(hook)
    hook(active)


#: Streams seen capturing a capture cuda_memkit did not begin or hear of (an allocation on
#: them asked the driver, under watch_captures): ``CUstream`` objects, while they capture.
_seen: dict[int, Any] = {}


def capture_may_run() -> bool:
    """Whether a capture may be under way now, as far as cuda_memkit knows.

    Ours (``begin_capture``), CuPy's (announced), and foreign ones an
    allocation saw (asked again here: the driver answers
    ``cuStreamGetCaptureInfo`` during any capture). While one may run, no
    call that the driver refuses during a global capture is made for
    cuda_memkit's own bookkeeping (event queries, frees on other streams, a
    device synchronize): it would invalidate that capture.
    """
    if active - _watching > 0:
        return True
    for h, cus in list(_seen.items()):
        try:
            if capture_id(cus):
                return True
        except CudaError:  # the stream is gone
            pass
        _seen.pop(h, None)
    return False


def note_capture(begun: bool) -> None:
    """A capture began (``True``) or ended (``False``) through an entry point we wrap."""
    _change(1 if begun else -1)


def watch_captures(enabled: bool = True) -> None:
    """Ask the driver on every allocation whether its stream captures.

    Captures begun with :meth:`Stream.begin_capture`, CuPy's
    ``Stream.begin_capture`` (under the CuPy allocator) and torch's
    ``CUDAGraph`` (imported before a pool was made) are seen without it. Turn
    it on for any other capture (raw driver calls, cuda.core's
    ``GraphBuilder``, whose class takes no wrapper in cuda.core 1.2, a library
    imported after every pool was made): each allocation then costs one more
    driver query.

    Parameters
    ----------
    enabled : bool, default True
        On or off.
    """
    global _watching
    check_bool(enabled, "enabled")
    with _lock:
        if enabled != _watching:
            _watching = enabled
            _change(1 if enabled else -1)


def wrap_entry_points(cls: Any, begin: str, end: str) -> bool:
    """Make ``cls.<begin>`` and ``cls.<end>`` (a capture API) call :func:`note_capture`.

    Wrapped once per class; ``False`` where the class cannot take the wrapper (an
    extension type), which :func:`watch_captures` then has to cover.
    """
    if getattr(cls, "_memkit_watched", False):
        return True
    begin_fn, end_fn = getattr(cls, begin, None), getattr(cls, end, None)
    if begin_fn is None or end_fn is None:
        return False

    def begin_capture(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = begin_fn(self, *args, **kwargs)
        note_capture(True)
        return out

    def end_capture(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return end_fn(self, *args, **kwargs)
        finally:
            note_capture(False)

    try:
        setattr(cls, begin, begin_capture)
        setattr(cls, end, end_capture)
        cls._memkit_watched = True
    except (AttributeError, TypeError):
        return False
    return True


#: Capture entry points of other libraries, wrapped by :func:`watch_frameworks` once their
#: module is loaded: (module, class, begin, end).
FRAMEWORK_CAPTURES = (
    ("torch.cuda", "CUDAGraph", "capture_begin", "capture_end"),
    # cuda.core has moved its graph builder between releases
    ("cuda.core", "GraphBuilder", "begin_building", "end_building"),
    ("cuda.core.graph", "GraphBuilder", "begin_building", "end_building"),
    ("cuda.core.experimental", "GraphBuilder", "begin_building", "end_building"),
)


def watch_frameworks() -> dict[str, bool]:
    """Wrap the capture entry points of torch and cuda.core where they are already imported.

    Called whenever a pool object is made (cheap: a look in ``sys.modules``;
    nothing is imported). Returns, per class found, whether its captures are now
    seen without :func:`watch_captures`.
    """
    seen = {}
    for module, name, begin, end in FRAMEWORK_CAPTURES:
        mod = sys.modules.get(module)
        cls = getattr(mod, name, None) if mod is not None else None
        if cls is not None:
            seen[f"{module}.{name}"] = wrap_entry_points(cls, begin, end)
    return seen


def _check_mode(mode: object) -> int:
    return CAPTURE_MODES[one_of(mode, "mode", tuple(CAPTURE_MODES))]


# -- what the driver says about a stream ------------------------------------------------------


def _capture_info(cus: Any) -> tuple[int, int]:
    """``(status, id)`` of the capture on stream ``cus`` (status 0: none; 2: invalidated)."""
    res = _driver.function("cuStreamGetCaptureInfo")(cus)
    if res[0]:
        _driver.check("cuStreamGetCaptureInfo", res)
    return int(res[1]), int(res[2])


def capture_id(cus: Any) -> int:
    """The id of the capture under way on stream ``cus``; 0 when it does not capture."""
    state, ident = _capture_info(cus)
    return ident if state == _ACTIVE else 0


def capture_id_on_release(cus: Any, device: int | None) -> int:
    """:func:`capture_id` for a release path: never a failed release because of the query.

    A context error (the current context destroyed, none current) is asked again
    with device ``device``'s primary context pushed; any other error is no
    capture (a stream the driver cannot describe captures nothing the release
    could break, and the free itself reports what is wrong).
    """
    try:
        return context_retry(device, capture_id, cus)
    except CudaError:
        return 0


def is_capturing(cus: Any) -> bool:
    """Whether stream ``cus`` captures now (``cuStreamIsCapturing``)."""
    return int(_driver.call("cuStreamIsCapturing", cus)) != 0


# -- captures and the graph memory handed out in them -------------------------------------------


class CaptureRecord:
    """One capture's graph memory: the blocks freed by their holders and not freeable yet.

    Attributes
    ----------
    id : int
        The driver's capture id.
    own : bool
        Whether cuda_memkit's :func:`begin_capture` began it (its graph is a
        :class:`Graph`, whose launches and close cuda_memkit sees).
    launched : bool
        Whether the graph was launched (own graphs only).
    gone : bool
        Whether the graph was closed (own graphs only).
    dropped : list
        ``(block, stream, device, account, nbytes)`` of every block freed by
        its holder that could not be freed yet; still in the ledger.
    """

    __slots__ = ("device", "dropped", "gone", "held", "id", "kept", "launched", "own")

    def __init__(self, ident: int, own: bool, device: int = 0) -> None:
        self.id = ident
        self.own = own
        self.device = device
        self.launched = False
        self.gone = False
        self.dropped: list[tuple[Any, Any, int, Any, int]] = []
        #: Pinned blocks given back while the graph may read them (see hold_until_gone).
        self.held: list[Hold] = []
        #: Objects the graph reads at each launch, kept alive with it (keep_for_graph).
        self.kept: list[Any] = []


class Hold:
    """A pinned block given back while graphs that may use it exist: back once all are gone."""

    __slots__ = ("block", "done", "owner", "records")

    def __init__(self, owner: Any, block: Any, records: list[CaptureRecord]) -> None:
        self.owner = owner  # the bin the block goes back to
        self.block = block
        self.records = records
        self.done = False


#: Captures with memory kept for their graph, by capture id (own captures: from the end of
#: the capture until their Graph is closed; others: while they have dropped blocks).
_records: dict[int, CaptureRecord] = {}
#: Records of captures begun by begin_capture() and not ended yet, by capture id.
_own_open: dict[int, CaptureRecord] = {}
#: The same records by the ``int`` handle of their capturing stream.
_own_streams: dict[int, CaptureRecord] = {}


def record_for(cus: Any) -> CaptureRecord | None:
    """The record of the capture under way on ``cus`` (made on first use); None: none."""
    ident = capture_id(cus)
    if not ident:
        return None
    with _lock:  # a foreign capture's record is kept only once it holds a dropped block
        rec = _records.get(ident) or _own_open.get(ident)
        if rec is None:
            rec = CaptureRecord(ident, False)
            if _watching:
                _seen[id(cus)] = cus
        return rec


def _free(block: Any, cus: Any) -> Any:
    return _driver.function("cuMemFreeAsync")(block, cus)


def _live_cus(holder: Any) -> Any:
    """The ``CUstream`` of a block's stream holder while it surely exists; else ``None``.

    The holder is a ``Stream``, a ``StreamRef`` or the ``CUstream`` itself. A
    stream known only by its handle (no object held), or a ``Stream`` closed or
    collected, may have been destroyed, and the driver can crash on a
    destroyed handle: such a block is freed after a device synchronize on the
    legacy stream instead.
    """
    cus = getattr(holder, "_custream", None)
    if cus is None:
        return None
    fin = getattr(holder, "_finalizer", None)
    if fin is not None:  # a Stream that owns its handle: alive until its finalizer ran
        return cus if fin.alive else None
    return cus if getattr(holder, "obj", None) is not None else None


def _still_capturing(cus: Any, rec: CaptureRecord) -> bool:
    """Whether ``cus`` still captures ``rec``'s capture (a stream gone does not)."""
    if cus is None:
        return False
    try:
        return capture_id(cus) == rec.id
    except CudaError:
        return False


def _try_free(block: Any, holder: Any, device: int) -> bool:
    """Free a launched graph allocation after its stream's work; False: not possible now.

    Not possible: the driver refuses (no launch allocated it since its last
    free), or its stream is gone while a capture may be under way (the
    device synchronize that would order the free could break that capture).
    """
    cus = _live_cus(holder)
    if cus is None:  # its stream may be gone: after everything, on the legacy stream
        if capture_may_run():
            return False
        with primary_pushed(device):
            _driver.call("cuCtxSynchronize")
            res = _free(block, _cu.CUstream(STREAM_LEGACY))
    else:
        res = _free(block, cus)
    if not res[0]:
        return True
    if int(res[0]) != _INVALID_VALUE:
        _driver.check("cuMemFreeAsync", res)
    return False


def release_graph_block(rec: CaptureRecord, block: Any, holder: Any, device: int,
                        acct: Any, nbytes: int) -> None:
    """Free graph allocation ``block`` (its ledger entry removed by the caller), or keep it.

    ``holder`` is what holds the block's stream (see :func:`_live_cus`). Kept
    blocks go back into the ledger and into ``rec.dropped``; see the module
    docstring for when each case frees.
    """
    # Freed by its holder now, on its stream as every free is (a capturing stream exists).
    cus = getattr(holder, "_custream", holder)
    if _still_capturing(cus, rec):  # the capture is still under way: a free node
        _driver.check("cuMemFreeAsync", _free(block, cus))
        return
    if rec.own and not rec.gone:  # the graph may still run: freed when it is closed
        _keep(rec, block, holder, device, acct, nbytes)
        return
    if rec.own and not rec.launched:  # closed unlaunched: the address went with the graph
        return
    if capture_may_run() or not _try_free(block, holder, device):
        _keep(rec, block, holder, device, acct, nbytes)  # tried again later
        return
    _trim(device)  # the driver keeps freed graph memory mapped until asked


def _trim(device: int) -> None:
    """``cuDeviceGraphMemTrim``: the graph memory no graph uses back to the system.

    Called on release paths: a context error is retried with the device's
    primary context pushed, and a trim that still fails is skipped (the memory
    goes at the next trim), never a failed release.
    """
    try:
        context_retry(device, _driver.call, "cuDeviceGraphMemTrim", _cu.CUdevice(device))
    except CudaError:
        pass


def _keep(rec: CaptureRecord, block: Any, holder: Any, device: int, acct: Any,
          nbytes: int) -> None:
    acct.restore(block, nbytes)
    with _lock:  # one record per capture id, whichever object of it the bin held
        _records.setdefault(rec.id, rec).dropped.append((block, holder, device, acct, nbytes))


def keep_for_graph(cus: Any, objects: list[Any]) -> None:
    """Keep ``objects`` alive while the graph being captured on ``cus`` may run.

    For what a captured launch reads in place (the copy kernel's descriptors):
    until the graph is closed for a capture of cuda_memkit's, for the process
    for a foreign one (its end cannot be seen). Nothing if ``cus`` does not capture.
    """
    rec = record_for(cus)
    if rec is not None:
        with _lock:
            _records.setdefault(rec.id, rec).kept.extend(objects)


#: Gives of ordinary pool blocks made on a capturing stream: ``(bin, block, stream holder)``,
#: made again by :func:`retry_deferred` once no capture may run.
_later: list[tuple[Any, Any, Any]] = []
#: Graphs closed while a capture may have been under way: ``(exec, graph, device)``,
#: destroyed by :func:`retry_deferred` once no capture may run.
_doomed: list[tuple[int, int, int]] = []


def give_later(owner: Any, block: Any, holder: Any) -> None:
    """``owner.give(block, holder)`` once no capture may run (see :data:`_later`)."""
    with _lock:
        _later.append((owner, block, holder))


def has_deferred() -> bool:
    """Whether kept blocks of foreign captures, or gives made during a capture, wait."""
    return bool(_later or _doomed) or any(r.dropped and not r.own
                                          for r in list(_records.values()))


def own_open() -> list[CaptureRecord]:
    """The records of the captures begun by :func:`begin_capture` and not ended yet."""
    return list(_own_open.values())


def hold_until_gone(records: list[CaptureRecord], owner: Any, block: Any) -> None:
    """Give ``block`` back to bin ``owner`` once every graph of ``records`` is closed."""
    hold = Hold(owner, block, records)
    with _lock:
        for rec in records:
            rec.held.append(hold)
            _records.setdefault(rec.id, rec)


def retry_deferred() -> int:
    """Free the kept blocks of foreign captures that can be freed now; the bytes freed.

    Nothing while a capture may be under way (:func:`capture_may_run`).
    """
    freed = 0
    if capture_may_run():
        return 0
    with _lock:
        later, _later[:] = list(_later), []
        doomed, _doomed[:] = list(_doomed), []
        records = [r for r in _records.values() if r.dropped and not r.own]
    for owner, block, holder in later:
        owner.give(block, holder)
    for exe, graph, device in doomed:
        with primary_pushed(device):
            _driver.call("cuCtxSynchronize")  # its last launch is done
        _destroy_now(exe, graph, device)
    devices: set[int] = set()
    for rec in records:
        with _lock:
            dropped, rec.dropped = rec.dropped, []
        for item in dropped:
            block, holder, device, acct, nbytes = item
            if acct.remove(block) is None:
                continue
            if _try_free(block, holder, device):
                freed += nbytes
                devices.add(device)
                continue
            acct.restore(block, nbytes)
            with _lock:
                rec.dropped.append(item)
        with _lock:
            if not rec.dropped and not rec.kept and rec.id not in _own_open:
                _records.pop(rec.id, None)
    for device in devices:  # the driver keeps freed graph memory mapped until asked
        _trim(device)
    return freed


# -- our own captures -----------------------------------------------------------------------


def begin_capture(cus: Any, mode: object) -> None:
    """``cuStreamBeginCapture`` on ``cus`` in ``mode`` (checked first)."""
    code = _check_mode(mode)
    device = int(_driver.call("cuStreamGetDevice", cus))  # refused once the stream captures
    _driver.call("cuStreamBeginCapture", cus, _cu.CUstreamCaptureMode(code))
    try:
        ident = capture_id(cus)
    except BaseException:
        _driver.function("cuStreamEndCapture")(cus)  # (best effort) no capture left behind
        raise
    rec = CaptureRecord(ident, True, device)
    with _lock:
        _own_open[ident] = rec
        _own_streams[int(cus)] = rec
    _change(1)


def end_capture(cus: Any) -> Graph:
    """``cuStreamEndCapture`` on ``cus``, instantiated: the :class:`Graph`."""
    # Our own capture is found by its stream: the driver may not give the id of an
    # invalidated capture (nor answer at all), and the capture must end here all the same
    # (else :data:`active` stays up for the process).
    with _lock:
        rec = _own_streams.pop(int(cus), None)
        if rec is not None:
            _own_open.pop(rec.id, None)
    if rec is not None:
        ident = rec.id
    else:
        try:
            ident = _capture_info(cus)[1]
        except CudaError:
            ident = 0
        with _lock:
            rec = _own_open.pop(ident, None) if ident else None
            if rec is not None:
                for h, r in list(_own_streams.items()):
                    if r is rec:
                        del _own_streams[h]
    # cuStreamGetDevice is refused while the stream captures: the device noted at the
    # beginning, or (a capture begun elsewhere) the current context's.
    device = rec.device if rec is not None else int(_driver.call("cuCtxGetDevice"))
    try:
        graph = _driver.call("cuStreamEndCapture", cus)
    except BaseException:
        if rec is not None:  # no graph: its memory went with the capture
            _close_record(rec)
        raise
    finally:
        if rec is not None:
            _change(-1)
    if rec is None:  # a capture someone else began: its graph is ours now all the same
        rec = CaptureRecord(ident, True, device)
    with _lock:
        _records.setdefault(rec.id, rec)
        rec = _records[rec.id]
        rec.own = True
    try:
        exe = _driver.call("cuGraphInstantiate", graph, AUTO_FREE_ON_LAUNCH)
    except BaseException:
        _driver.call("cuGraphDestroy", graph)
        _close_record(rec)
        raise
    made = Graph._made(int(graph), int(exe), device, rec)
    if _later or _doomed:  # what waited for the capture to end: now
        retry_deferred()
    return made


def _close_record(rec: CaptureRecord, synced: bool = True) -> None:
    """The graph is gone: free what its holders dropped, give back the pinned blocks it held.

    ``synced``: no launch of the graph still runs (the device was synchronized);
    otherwise the dropped blocks a launch allocated are freed by a later
    :func:`retry_deferred`, on their streams.
    """
    rec.gone = True
    with _lock:
        dropped, rec.dropped = rec.dropped, []
        held, rec.held = rec.held, []
        rec.kept.clear()
        _records.pop(rec.id, None)
    for hold in held:
        if not hold.done and all(r.gone for r in hold.records):
            hold.done = True
            hold.owner.give(hold.block)
    if not rec.launched:  # nothing was ever allocated: the addresses went with the graph
        for block, _holder, _device, acct, _nbytes in dropped:
            acct.remove(block)
        return
    if not synced:
        rec.own = False  # freed as a foreign graph's, once they can be
        with _lock:
            rec.dropped.extend(dropped)
            _records[rec.id] = rec
        return
    for block, holder, device, acct, _nbytes in dropped:
        if acct.remove(block) is not None:
            _try_free(block, holder, device)  # refused: not allocated (nothing to free)


_GRAPHS = account("graph_exec")


def _destroy_graph(exe: int, graph: int, device: int, rec: CaptureRecord) -> None:
    """Release function of a :class:`Graph`: its dropped memory, the exec, the graph.

    Then the graph memory the device no longer uses goes back to the system
    (``cuDeviceGraphMemTrim``): the driver keeps it mapped, in 32 MiB chunks,
    until asked. While a capture may be under way none of these driver calls
    is made (one could invalidate that capture): the graph is destroyed, and
    its memory freed, at a later :func:`retry_deferred`.
    """
    _GRAPHS.remove(exe)
    if capture_may_run():
        _close_record(rec, synced=False)
        with _lock:
            _doomed.append((exe, graph, device))
        return
    try:
        with primary_pushed(device):
            _driver.call("cuCtxSynchronize")  # no launch of it still runs
        _close_record(rec)
    finally:
        _destroy_now(exe, graph, device)


def _destroy_now(exe: int, graph: int, device: int) -> None:
    try:
        _driver.call("cuGraphExecDestroy", _cu.CUgraphExec(exe))
    finally:
        _driver.call("cuGraphDestroy", _cu.CUgraph(graph))
    _trim(device)


#: Open graphs (tests and the leak report find them here).
open_graphs: weakref.WeakSet[Graph] = weakref.WeakSet()


class Graph(Resource):
    """A CUDA graph captured from a stream, ready to launch.

    Made by :meth:`Stream.end_capture`; ``close()``, a ``with`` block or
    garbage collection destroy it. Memory cuda_memkit allocated on the
    stream during the capture belongs to the graph: it stays at the same
    addresses between launches (each launch frees what the previous one left
    allocated, then allocates it again), and a buffer of it that you free is
    kept until the graph is closed.
    """

    _share_hint = "share the Graph object itself"
    _handle: int
    _exec: int
    _device: int
    _record: CaptureRecord

    def __init__(self) -> None:
        raise TypeError("a Graph is made by Stream.end_capture()")

    @classmethod
    def _made(cls, graph: int, exe: int, device: int, rec: CaptureRecord) -> Graph:
        self = cls.__new__(cls)
        self._handle = graph
        self._exec = exe
        self._device = device
        self._record = rec
        _GRAPHS.add(exe, 0)
        self._open(make_finalizer(self, ("Graph", exe), _destroy_graph, exe, graph, device,
                                  rec))
        open_graphs.add(self)
        return self

    @property
    def handle(self) -> int:
        """The ``CUgraph`` handle as an int."""
        self._check_open()
        return self._handle

    @property
    def exec_handle(self) -> int:
        """The ``CUgraphExec`` handle (the instantiated graph) as an int."""
        self._check_open()
        return self._exec

    @property
    def launched(self) -> bool:
        """Whether the graph was launched at least once."""
        return self._record.launched

    def launch(self, stream: object) -> None:
        """Launch the graph on ``stream`` (``cuGraphLaunch``).

        Parameters
        ----------
        stream : stream-like
            A :class:`Stream`, an int handle, ``None`` (the legacy default
            stream) or a framework's stream object.

        Raises
        ------
        ClosedError
            If the graph, or a :class:`Stream` given, is closed.
        """
        self._check_open()
        assert stream_of is not None
        cus = stream_of(stream)
        _driver.call("cuGraphLaunch", _cu.CUgraphExec(self._exec), cus)
        self._record.launched = True

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"0x{self._exec:x}"
        return f"<Graph {state}{' launched' if self._record.launched else ''}>"
