"""What each release call answers when the releasing thread's current context is not the owner's.

After a CuPy cuFFT plan failure, pool buffers collected later once warned
``cuMemFreeAsync: CUDA_ERROR_INVALID_CONTEXT`` and kept their memory. This probe
records, on the real driver, for every call cuda_memkit releases with, what it
returns in each situation a finalizer may run in, whether a retry with device
0's primary context pushed frees it, and what the situation does to other calls.

Resources are made on the main thread with device 0's primary context current
(as cuda_memkit makes them); then the release call runs:

  primary              control: the owner's primary context current
  none                 on a new thread with no current context
  created_alive        a cuCtxCreate context of device 0 current
  destroyed_elsewhere  a created context, current here, destroyed by another thread
                       (it stays current here: documented CONTEXT_IS_DESTROYED)
  other_device         device 1's primary context current (needs two devices)
  destroyed_stream     (cuMemFreeAsync only) the allocation stream was destroyed first
  cupy_cufft_failure   right after a CuPy FFT plan creation failed inside a user
                       allocator that raises (needs CuPy)
  set_stale_handle     cuCtxSetCurrent(handle of a context destroyed on this thread):
                       the riskiest, run last

Each case runs in a child process of its own (a crash loses only that case).

    python3 scripts/probes/invalid_context_probe.py            # all cases, on the GPU
    python3 scripts/probes/invalid_context_probe.py --backend sim   # dry run on the simulator

Prints one table (rows: release calls, columns: situations; a cell is the
first answer, ``->`` the answer of the retry with the primary context pushed)
and a survey of other calls per situation; writes ``$OUT/invalid_context.json``
when ``$OUT`` is set.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

APIS = [
    "cuMemFreeAsync(stream)", "cuMemFreeAsync(legacy)", "cuMemFree", "cuMemFree(managed)",
    "cuMemFreeHost", "cuMemHostUnregister", "cuMemRelease", "cuMemUnmap", "cuMemAddressFree",
    "cuMemPoolDestroy", "cuStreamDestroy", "cuEventDestroy",
]
SITUATIONS = ["primary", "none", "created_alive", "destroyed_elsewhere", "other_device",
              "destroyed_stream", "cupy_cufft_failure", "set_stale_handle"]
MiB = 1 << 20
SIZE = 64 * MiB  # device allocations: large enough to see in cuMemGetInfo

cu: Any = None


def load(backend: str) -> None:
    global cu
    if backend == "sim":  # a dry run: the simulator's functions, the bindings' types
        os.environ["CUDA_MEMKIT_BACKEND"] = "sim"
        import types

        from cuda.bindings import driver as real

        from cuda_memkit.sim import driver as sim_driver

        class Mixed(types.SimpleNamespace):
            def __getattr__(self, attr: str) -> Any:
                return getattr(sim_driver, attr, None) or getattr(real, attr)

        cu = Mixed()
    else:
        from cuda.bindings import driver as cuda_driver

        cu = cuda_driver


def name(res: Any) -> str:
    err = res[0] if isinstance(res, tuple) else res
    try:
        n = str(err.name)
    except AttributeError:
        n = f"CUresult({int(err)})"
    return "OK" if n == "CUDA_SUCCESS" else n.replace("CUDA_ERROR_", "")


def ok(res: Any) -> Any:
    if res[0] != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"setup call failed: {name(res)}")
    return res[1] if len(res) == 2 else (None if len(res) == 1 else res[1:])


def on_thread(fn: Any) -> Any:
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(fn()))
    t.start()
    t.join()
    return box[0] if box else None


def current() -> int:
    return int(cu.cuCtxGetCurrent()[1])


# -- resources -------------------------------------------------------------------------------


class Env:
    """Device 0's primary context and what a release call needs."""

    def __init__(self) -> None:
        ok(cu.cuInit(0))
        self.dev = ok(cu.cuDeviceGet(0))
        self.primary = ok(cu.cuDevicePrimaryCtxRetain(self.dev))
        ok(cu.cuCtxSetCurrent(self.primary))
        self.ndev = int(ok(cu.cuDeviceGetCount()))
        self.stream = ok(cu.cuStreamCreate(1))
        self.keep: list[Any] = []

    def loc(self) -> Any:
        loc = cu.CUmemLocation()
        loc.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        loc.id = 0
        return loc

    def vmm_prop(self) -> Any:
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location = self.loc()
        return prop

    def granularity(self) -> int:
        return int(ok(cu.cuMemGetAllocationGranularity(
            self.vmm_prop(),
            cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)))

    def pool(self) -> Any:
        props = cu.CUmemPoolProps()
        props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        props.handleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE
        props.location = self.loc()
        return ok(cu.cuMemPoolCreate(props))

    def make(self, api: str) -> tuple[Any, Any, Any]:
        """(release(stream) -> result, cleanup(), freed() -> bool or None) for ``api``."""
        s = self.stream
        if api.startswith("cuMemFreeAsync"):
            pool = self.pool()
            p = ok(cu.cuMemAllocFromPoolAsync(SIZE, pool, s))
            ok(cu.cuStreamSynchronize(s))
            stream = s if api.endswith("(stream)") else cu.CUstream(0)

            def cleanup() -> None:  # (never touches the stream: a case destroys it)
                cu.cuCtxPushCurrent(self.primary)
                cu.cuCtxSynchronize()
                cu.cuCtxPopCurrent()
                cu.cuMemPoolDestroy(pool)
            return (lambda st=stream: cu.cuMemFreeAsync(p, st), cleanup,
                    lambda: self.gone(p))
        if api == "cuMemFree":
            p = ok(cu.cuMemAlloc(SIZE))
            return lambda: cu.cuMemFree(p), lambda: None, lambda: self.gone(p)
        if api == "cuMemFree(managed)":
            p = ok(cu.cuMemAllocManaged(SIZE, 1))
            return lambda: cu.cuMemFree(p), lambda: None, lambda: self.gone(p)
        if api == "cuMemFreeHost":
            p = ok(cu.cuMemHostAlloc(4 * MiB, 0))
            return lambda: cu.cuMemFreeHost(p), lambda: None, lambda: self.gone(p)
        if api == "cuMemHostUnregister":
            buf = (ctypes.c_char * (4 * MiB))()
            self.keep.append(buf)
            addr = ctypes.addressof(buf)
            ok(cu.cuMemHostRegister(addr, 4 * MiB, 0))
            return lambda: cu.cuMemHostUnregister(addr), lambda: None, lambda: self.gone(addr)
        g = self.granularity()
        if api == "cuMemRelease":
            h = ok(cu.cuMemCreate(g, self.vmm_prop(), 0))
            return lambda: cu.cuMemRelease(h), lambda: None, lambda: None
        if api == "cuMemUnmap":
            h = ok(cu.cuMemCreate(g, self.vmm_prop(), 0))
            p = ok(cu.cuMemAddressReserve(g, 0, 0, 0))
            ok(cu.cuMemMap(p, g, 0, h, 0))

            def cleanup() -> None:
                cu.cuMemRelease(h)
                cu.cuMemAddressFree(p, g)
            return lambda: cu.cuMemUnmap(p, g), cleanup, lambda: None
        if api == "cuMemAddressFree":
            p = ok(cu.cuMemAddressReserve(g, 0, 0, 0))
            return lambda: cu.cuMemAddressFree(p, g), lambda: None, lambda: None
        if api == "cuMemPoolDestroy":
            pool = self.pool()
            return lambda: cu.cuMemPoolDestroy(pool), lambda: None, lambda: None
        if api == "cuStreamDestroy":
            st = ok(cu.cuStreamCreate(1))
            return lambda: cu.cuStreamDestroy(st), lambda: None, lambda: None
        if api == "cuEventDestroy":
            ev = ok(cu.cuEventCreate(2))
            return lambda: cu.cuEventDestroy(ev), lambda: None, lambda: None
        raise ValueError(api)

    def gone(self, ptr: Any) -> bool:
        """Whether the driver no longer knows ``ptr`` (asked with the primary context)."""
        ok(cu.cuCtxPushCurrent(self.primary))
        try:
            res = cu.cuPointerGetAttribute(
                cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_RANGE_SIZE, ptr)
            return res[0] != cu.CUresult.CUDA_SUCCESS
        finally:
            cu.cuCtxPopCurrent()

    def free_mem(self) -> int:
        ok(cu.cuCtxPushCurrent(self.primary))
        try:
            cu.cuCtxSynchronize()
            return int(ok(cu.cuMemGetInfo())[0])
        finally:
            cu.cuCtxPopCurrent()


# -- situations -------------------------------------------------------------------------------


def cupy_failure(env: Env, out: dict[str, Any]) -> None:
    """Make a CuPy FFT plan fail inside a user allocator that raises (the case that warned)."""
    import cupy

    x = cupy.arange(1 << 16, dtype=cupy.complex64)

    def refuse(size: int) -> Any:
        raise MemoryError(f"test allocator refuses {size} bytes")

    cupy.cuda.set_allocator(refuse)
    try:
        cupy.fft.fft(x)
        out["cupy_fft"] = "no error"
    except Exception as exc:  # what CuPy raised is part of the record
        out["cupy_fft"] = f"{type(exc).__name__}: {str(exc)[:160]}"
    finally:
        cupy.cuda.set_allocator(cupy.cuda.MemoryPool().malloc)


def in_situation(env: Env, situation: str, body: Any, out: dict[str, Any]) -> Any:
    """Run ``body()`` in ``situation``; return its result (None: not possible here)."""
    def record_ctx() -> None:
        c = current()
        out["ctx_current"] = hex(c)
        out["ctx_is_primary"] = c == int(env.primary)
        out["cuCtxGetDevice"] = name(cu.cuCtxGetDevice())

    if situation in ("primary", "destroyed_stream"):
        record_ctx()
        return body()
    if situation == "none":
        def run() -> Any:
            record_ctx()
            return body()
        return on_thread(run)
    if situation == "created_alive":
        ctx = ok(cu.cuCtxCreate(None, 0, env.dev))
        try:
            record_ctx()
            return body()
        finally:
            cu.cuCtxPopCurrent()
            cu.cuCtxDestroy(ctx)
    if situation == "destroyed_elsewhere":
        ctx = on_thread(lambda: ok(cu.cuCtxCreate(None, 0, env.dev)))
        ok(cu.cuCtxSetCurrent(ctx))
        out["cuCtxDestroy(elsewhere)"] = name(on_thread(lambda: cu.cuCtxDestroy(ctx)))
        try:
            record_ctx()
            return body()
        finally:
            cu.cuCtxSetCurrent(env.primary)
    if situation == "other_device":
        if env.ndev < 2:
            out["skipped"] = "one device"
            return None
        other = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(1))))
        ok(cu.cuCtxSetCurrent(other))
        try:
            record_ctx()
            return body()
        finally:
            cu.cuCtxSetCurrent(env.primary)
    if situation == "cupy_cufft_failure":
        try:
            import cupy  # noqa: F401
        except Exception as exc:  # not installed, or no GPU for it
            out["skipped"] = f"CuPy not usable: {type(exc).__name__}"
            return None
        cupy_failure(env, out)
        record_ctx()
        return body()
    if situation == "set_stale_handle":
        ctx = ok(cu.cuCtxCreate(None, 0, env.dev))
        out["cuCtxDestroy(here)"] = name(cu.cuCtxDestroy(ctx))
        out["current_after_destroy_is_primary"] = current() == int(env.primary)
        res = cu.cuCtxSetCurrent(ctx)
        out["cuCtxSetCurrent(stale)"] = name(res)
        try:
            record_ctx()
            return body()
        finally:
            cu.cuCtxSetCurrent(env.primary)
    raise ValueError(situation)


def child(api: str, situation: str) -> dict[str, Any]:
    env = Env()
    out: dict[str, Any] = {"api": api, "situation": situation}
    if situation == "destroyed_stream" and api != "cuMemFreeAsync(stream)":
        out["skipped"] = "only for cuMemFreeAsync(stream)"
        return out
    device_memory = api in ("cuMemFree", "cuMemFree(managed)") or api.startswith(
        "cuMemFreeAsync")
    free0 = env.free_mem() if device_memory else None
    release, cleanup, freed = env.make(api)
    if situation == "destroyed_stream":
        out["cuStreamDestroy(first)"] = name(cu.cuStreamDestroy(env.stream))
        env.stream = None

    def body() -> dict[str, Any]:
        r: dict[str, Any] = {"first": name(release())}
        if r["first"] != "OK":  # the fix under test: push the owner's primary context, retry
            r["push_primary"] = name(cu.cuCtxPushCurrent(env.primary))
            r["retry"] = name(release())
            if r["retry"] != "OK" and api.startswith("cuMemFreeAsync"):
                cu.cuCtxSynchronize()  # then free on the legacy stream of the primary context
                r["retry_legacy_stream"] = name(release(cu.CUstream(0)))
            popped = cu.cuCtxPopCurrent()
            r["pop"] = name(popped)
            r["current_after_pop"] = hex(current())
        return r

    result = in_situation(env, situation, body, out)
    if result is not None:
        out.update(result)
        g = freed()
        if g is not None:
            out["freed"] = g
        if free0 is not None:
            out["free_memory_delta"] = env.free_mem() - free0
    try:
        cleanup()
    except Exception as exc:  # cleanup of a failed case is best effort
        out["cleanup"] = repr(exc)
    return out


def survey(situation: str) -> dict[str, Any]:
    """What other calls answer in ``situation`` (resources made with the primary context)."""
    env = Env()
    p = ok(cu.cuMemAlloc(MiB))
    out: dict[str, Any] = {"situation": situation}

    def body() -> dict[str, str]:
        r: dict[str, str] = {}
        r["cuCtxSynchronize"] = name(cu.cuCtxSynchronize())
        r["cuMemGetInfo"] = name(cu.cuMemGetInfo())
        res = cu.cuMemAlloc(4096)
        r["cuMemAlloc(4096)"] = name(res)
        r["cuStreamQuery(own stream)"] = name(cu.cuStreamQuery(env.stream))
        r["cuStreamQuery(legacy)"] = name(cu.cuStreamQuery(cu.CUstream(0)))
        r["cuPointerGetAttribute"] = name(cu.cuPointerGetAttribute(
            cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_RANGE_SIZE, p))
        g = env.granularity()
        va = cu.cuMemAddressReserve(g, 0, 0, 0)
        r["cuMemAddressReserve"] = name(va)
        ev = cu.cuEventCreate(2)
        r["cuEventCreate"] = name(ev)
        ok(cu.cuCtxPushCurrent(env.primary))
        if res[0] == cu.CUresult.CUDA_SUCCESS:
            cu.cuMemFree(res[1])
        if va[0] == cu.CUresult.CUDA_SUCCESS:
            cu.cuMemAddressFree(va[1], g)
        if ev[0] == cu.CUresult.CUDA_SUCCESS:
            cu.cuEventDestroy(ev[1])
        cu.cuCtxPopCurrent()
        return r

    if situation == "destroyed_stream":
        out["skipped"] = "not a context situation"
        return out
    result = in_situation(env, situation, body, out)
    if result is not None:
        out.update(result)
    cu.cuMemFree(p)
    return out


# -- parent ---------------------------------------------------------------------------------


def run_child(args: list[str], backend: str, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--backend", backend, *args]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        sig = -proc.returncode if proc.returncode < 0 else None
        return {"error": (f"crashed (signal {sig})" if sig else f"rc={proc.returncode}"),
                "stderr": proc.stderr[-600:]}
    out: dict[str, Any] = json.loads(lines[-1])
    out["seconds"] = round(time.monotonic() - t0, 2)
    return out


SHORT = {"INVALID_CONTEXT": "INV_CTX", "CONTEXT_IS_DESTROYED": "CTX_DESTROYED",
         "INVALID_VALUE": "INV_VALUE", "INVALID_HANDLE": "INV_HANDLE",
         "NOT_PERMITTED": "NOT_PERM", "NOT_SUPPORTED": "NOT_SUPP"}


def short(text: str) -> str:
    return SHORT.get(text, text)


def cell(r: dict[str, Any]) -> str:
    if "error" in r:
        return r["error"][:18]
    if "skipped" in r:
        return "-"
    text = short(r.get("first", "?"))
    if "retry" in r:
        text += f"->{short(r['retry'])}"
        if "retry_legacy_stream" in r:
            text += f"/{short(r['retry_legacy_stream'])}"
    if r.get("freed") is False:
        text += " (kept)"
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["cuda", "sim"], default="cuda")
    ap.add_argument("--child", nargs=2, metavar=("API", "SITUATION"))
    ap.add_argument("--survey", metavar="SITUATION")
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args()
    load(args.backend)
    if args.child:
        print(json.dumps(child(*args.child)), flush=True)
        return 0
    if args.survey:
        print(json.dumps(survey(args.survey)), flush=True)
        return 0
    results = [run_child(["--child", a, s], args.backend, args.timeout) | {"api": a,
                                                                           "situation": s}
               for s in SITUATIONS for a in APIS]
    surveys = [run_child(["--survey", s], args.backend, args.timeout) | {"situation": s}
               for s in SITUATIONS if s != "destroyed_stream"]
    width = max(len(a) for a in APIS) + 2
    cols = [s for s in SITUATIONS]
    print(f"{'release call':<{width}}" + "".join(f"{s[:22]:>24}" for s in cols))
    for a in APIS:
        row = {r["situation"]: r for r in results if r["api"] == a}
        print(f"{a:<{width}}" + "".join(f"{cell(row[s])[:22]:>24}" for s in cols))
    print("\ncell: first answer -> answer with device 0's primary context pushed "
          "[/ then on the legacy stream]; (kept): still allocated afterwards; -: not applicable;"
          "\n      INV_CTX = INVALID_CONTEXT, CTX_DESTROYED = CONTEXT_IS_DESTROYED")
    print("\nother calls per situation:")
    keys = sorted({k for sv in surveys for k in sv if k.startswith("cu")})
    for sv in surveys:
        bits = ", ".join(f"{k}={sv[k]}" for k in keys if k in sv)
        extra = sv.get("error") or sv.get("skipped") or ""
        print(f"  {sv['situation']:<20} {bits}{('  ' + extra) if extra else ''}")
    cufft = [r for r in results if r["situation"] == "cupy_cufft_failure" and "cupy_fft" in r]
    if cufft:
        r = cufft[0]
        print(f"\nCuPy FFT with a refusing allocator: {r['cupy_fft']}; afterwards current "
              f"context {r.get('ctx_current')} (primary: {r.get('ctx_is_primary')}), "
              f"cuCtxGetDevice {r.get('cuCtxGetDevice')}")
    out_dir = os.environ.get("OUT")
    if out_dir:
        path = os.path.join(out_dir, "invalid_context.json")
        with open(path, "w") as f:
            json.dump({"backend": args.backend, "results": results, "surveys": surveys}, f,
                      indent=1)
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
