"""Random sequences over owners and their views: one owner, one free.

A Hypothesis state machine allocates buffers of every kind, makes views of
them (numpy ``.array`` and slices of it, DLPack consumed by numpy or a
capsule kept unconsumed, ``__cuda_array_interface__``, ``as_array()`` typed
sub-views), copies between owners and views, frees, closes and collects, some
of it racing from two threads, and after every step checks that

* the ledger, the simulator's allocation table and the objects' ``closed``
  agree with a model: an owner's memory is live while it is open, or closed
  with exports (numpy arrays, DLPack capsules) still holding it;
* no address has two live owners, and the ledger holds nothing else new;
* views of freed memory are refused (``ClosedError``), never read.
"""

from __future__ import annotations

import gc
import itertools
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import cuda_memkit as cm
from cuda_memkit._core import _driver, _resource

pytestmark = [pytest.mark.usefixtures("default_pinned", "flush_pinned"),
              pytest.mark.uses_managed_memory]

SIM = _driver.backend_name() == "sim"
KINDS = ("HostBuffer", "HostBuffer.pooled", "DeviceBuffer", "ManagedBuffer",
         "device PoolBuffer", "host PoolBuffer", "managed PoolBuffer")
#: Kinds whose memory the CPU can read (a numpy view, DLPack into numpy).
HOST_VISIBLE = {"HostBuffer", "HostBuffer.pooled", "ManagedBuffer", "host PoolBuffer",
                "managed PoolBuffer"}
#: Kinds that export DLPack (``__dlpack__``).
DLPACK = {"DeviceBuffer", "ManagedBuffer", "device PoolBuffer", "host PoolBuffer",
          "managed PoolBuffer"}
SIZES = st.sampled_from([64, 256, 4096])


def live_keys() -> set[int]:
    return {int(key) for _a, key, _n in _resource.live_allocations()}  # type: ignore[call-overload]


@dataclass(eq=False)
class Owner:
    kind: str
    obj: Any
    ptr: int
    nbytes: int
    closed: bool = False
    holders: list[Any] = field(default_factory=list)  # exports that keep the memory
    views: list[Any] = field(default_factory=list)  # as_array() views and CAI dicts

    @property
    def live(self) -> bool:
        """Whether the memory must still be allocated."""
        return not self.closed or bool(self.holders)


class Ownership(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.stream = cm.Stream()
        self.host_pool = cm.MemoryPool(location=cm.Location.host())
        self.managed_pool = cm.MemoryPool(managed=True)
        self.owners: list[Owner] = []
        self.baseline = live_keys()

    # -- making ------------------------------------------------------------------------
    def _make(self, kind: str, n: int) -> Any:
        s = self.stream
        if kind == "HostBuffer":
            return cm.HostBuffer.zeros(n)
        if kind == "HostBuffer.pooled":
            return cm.HostBuffer.pooled(n)
        if kind == "DeviceBuffer":
            return cm.DeviceBuffer.empty(n)
        if kind == "ManagedBuffer":
            return cm.ManagedBuffer.zeros(n)
        pool = {"device PoolBuffer": cm.MemoryPool.default(0), "host PoolBuffer": self.host_pool,
                "managed PoolBuffer": self.managed_pool}[kind]
        buf = pool.allocate(n, stream=s)
        s.synchronize()  # the CPU may read host and managed pool memory at once
        return buf

    @rule(kind=st.sampled_from(KINDS), n=SIZES, in_thread=st.booleans())
    def allocate(self, kind: str, n: int, in_thread: bool) -> None:
        if in_thread:
            out: list[Any] = []
            t = threading.Thread(target=lambda: out.append(self._make(kind, n)))
            t.start()
            t.join()
            obj = out[0]
        else:
            obj = self._make(kind, n)
        self.owners.append(Owner(kind, obj, obj.ptr, n))

    # -- views -------------------------------------------------------------------------
    def _pick(self, data: st.DataObject, pred: Any = None) -> Owner | None:
        cands = [o for o in self.owners if pred is None or pred(o)]
        return data.draw(st.sampled_from(cands)) if cands else None

    @precondition(lambda self: self.owners)
    @rule(data=st.data(), how=st.sampled_from(["numpy", "sub-numpy", "dlpack-numpy",
                                                "capsule", "cai", "as_array"]))
    def view(self, data: st.DataObject, how: str) -> None:
        o = self._pick(data)
        if o is None:
            return
        visible = o.kind in HOST_VISIBLE
        if how in ("numpy", "sub-numpy", "dlpack-numpy") and not visible:
            how = "as_array" if o.kind != "HostBuffer" else how
        if how in ("capsule", "as_array", "cai") and o.kind in ("HostBuffer",
                                                               "HostBuffer.pooled"):
            how = "numpy"
        if how == "dlpack-numpy" and o.kind not in DLPACK:
            how = "numpy"
        if o.closed:
            with pytest.raises(cm.ClosedError):
                self._export(o, how)
            return
        self._export(o, how)

    def _export(self, o: Owner, how: str) -> None:
        obj = o.obj
        if how == "numpy":
            o.holders.append(obj.array)
        elif how == "sub-numpy":
            a = obj.array
            o.holders.append(a[o.nbytes // 4: o.nbytes // 2])
        elif how == "dlpack-numpy":
            x = np.from_dlpack(obj)
            assert x.ctypes.data == o.ptr
            o.holders.append(x)
        elif how == "capsule":
            o.holders.append(obj.__dlpack__())
        elif how == "cai":
            cai = obj.__cuda_array_interface__
            assert cai["data"][0] == o.ptr
            o.views.append(cai)
        else:
            o.views.append(obj.as_array("u1", o.nbytes // 2))

    @precondition(lambda self: any(o.holders for o in self.owners))
    @rule(data=st.data())
    def drop_export(self, data: st.DataObject) -> None:
        o = self._pick(data, lambda o: o.holders)
        if o is None:
            return
        o.holders.pop(data.draw(st.integers(0, len(o.holders) - 1)))

    # -- copies ------------------------------------------------------------------------
    @precondition(lambda self: self.owners)
    @rule(data=st.data())
    def copy(self, data: st.DataObject) -> None:
        if not self.owners:
            return
        dst = self._pick(data)
        src = self._pick(data)
        assert dst is not None and src is not None
        use_view = data.draw(st.booleans())
        d_obj: Any = dst.obj
        if use_view and dst.views and not isinstance(dst.views[-1], dict):
            d_obj = dst.views[-1]
        n = min(dst.nbytes, src.nbytes) // 2
        if dst.closed or src.closed:
            with pytest.raises(cm.ClosedError):
                cm.copy(d_obj, src.obj, nbytes=n)
            return
        cm.copy(d_obj, src.obj, nbytes=n)

    @precondition(lambda self: any(o.holders for o in self.owners))
    @rule(data=st.data())
    def copy_into_export(self, data: st.DataObject) -> None:
        """A numpy export of a closed owner still points at memory that is ours."""
        o = self._pick(data, lambda o: any(isinstance(h, np.ndarray) for h in o.holders))
        if o is None:
            return
        arr = next(h for h in o.holders if isinstance(h, np.ndarray))
        if arr.flags.writeable and arr.nbytes:
            cm.copy(arr, np.full(arr.shape, 9, arr.dtype))
            assert int(arr[0]) == 9

    # -- freeing -----------------------------------------------------------------------
    def _free(self, o: Owner) -> str:
        """free() a pool buffer, close() anything else; what happened."""
        try:
            if o.kind.endswith("PoolBuffer") and not o.closed:
                o.obj.free()
            else:
                o.obj.close()
        except cm.ClosedError:
            return "closed"
        except BufferError:
            return "refused"  # numpy views alive: free() refuses, the buffer stays
        return "done"

    @precondition(lambda self: self.owners)
    @rule(data=st.data(), racing=st.booleans())
    def free(self, data: st.DataObject, racing: bool) -> None:
        o = self._pick(data)
        if o is None:
            return
        if racing:
            results: list[str] = []
            gate = threading.Barrier(2)

            def go() -> None:
                gate.wait()
                results.append(self._free(o))

            threads = [threading.Thread(target=go) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:
            results = [self._free(o)]
        if "done" in results:
            o.closed = True
        assert o.obj.closed == o.closed, (o.kind, results)

    @precondition(lambda self: self.owners)
    @rule(data=st.data())
    def close(self, data: st.DataObject) -> None:
        o = self._pick(data)
        if o is None:
            return
        o.obj.close()
        o.closed = True

    @rule()
    def collect(self) -> None:
        gc.collect()

    @precondition(lambda self: any(o.closed and not o.live for o in self.owners))
    @rule()
    def forget_dead(self) -> None:
        """Drop the objects of owners whose memory is gone (their views stay refused)."""
        for o in [o for o in self.owners if o.closed and not o.live]:
            for v in o.views:
                if not isinstance(v, dict):
                    with pytest.raises(cm.ClosedError):
                        v.ptr  # noqa: B018
            self.owners.remove(o)

    # -- the checks ----------------------------------------------------------------------
    @invariant()
    def ledger_table_and_objects_agree(self) -> None:
        keys = live_keys()
        spans: list[tuple[int, int, Owner]] = []
        for o in self.owners:
            assert o.obj.closed == o.closed, o.kind
            if o.live:
                assert o.ptr in keys, f"{o.kind} 0x{o.ptr:x}: live memory missing from the ledger"
                spans.append((o.ptr, o.ptr + o.nbytes, o))
                if SIM:
                    from cuda_memkit.sim import machine

                    a = machine().find(o.ptr)
                    assert a is not None and a.start <= o.ptr and o.ptr + o.nbytes <= a.end, (
                        f"{o.kind} 0x{o.ptr:x}: live memory missing from the simulator")
            else:
                assert o.ptr not in keys or any(
                    p.live and p.ptr == o.ptr for p in self.owners if p is not o), (
                    f"{o.kind} 0x{o.ptr:x}: freed memory still in the ledger")
        spans.sort(key=lambda s: s[0])
        for (_a0, a1, oa), (b0, _b1, ob) in itertools.pairwise(spans):
            assert a1 <= b0, f"0x{b0:x} has two live owners: {oa.kind} and {ob.kind}"
        ours = {o.ptr for o in self.owners if o.live}
        assert keys - self.baseline <= ours, "the ledger holds memory no owner has"

    def teardown(self) -> None:
        for o in self.owners:
            o.holders.clear()
            o.views.clear()
            o.obj.close()
        self.owners.clear()
        gc.collect()
        self.stream.synchronize()
        self.host_pool.close()
        self.managed_pool.close()
        self.stream.close()


TestOwnership = Ownership.TestCase
TestOwnership.settings = settings(max_examples=20, stateful_step_count=30, deadline=None,
                                  suppress_health_check=[HealthCheck.too_slow])
