"""Probe framework: call helpers, value conversion, the case recorder and the registry.

Every driver call of a probe goes through :func:`call` (or :func:`qcall` in timing
loops, :func:`ok` for setup calls that must succeed): it returns a :class:`Res` with
the ``CUresult`` name and the outputs, never raises for a driver error, logs the
call when running in a child process (for crash recovery) and, in dry mode,
fakes the outputs of a call that failed only because libcuda is missing.

A probe is a function ``fn(c: Case)`` registered with ``@probe("X_name")``; it
records steps with ``c(label, fn, *args)`` / ``c.record(label, name)`` and values
with ``c.val(key, value)``.  The registry :data:`CASES` keeps the registration
order, which is the run order.
"""

from __future__ import annotations

import enum
import json
import os
import re
import sys
from collections.abc import Callable
from typing import NamedTuple

try:
    from cuda.bindings import driver as d
except ImportError as exc:  # pragma: no cover
    print(f"gpu_probe: cannot import cuda.bindings.driver: {exc}", file=sys.stderr)
    sys.exit(2)


class _Run:
    """Process-wide run state (set by the runner; read by :func:`call` and probes)."""

    def __init__(self) -> None:
        self.dry = False  # --dry: no libcuda expected; outputs faked from docstrings
        self.child = False  # True in a child process (every case runs in one)
        self.call_idx = 0  # number of driver calls made so far in the current case (child)
        self.skip_calls: set = set()  # call indices of the current case that crashed before
        self.poison: set = set()  # "function:enum,args" signatures that crashed before
        self.case = ""  # name of the case running now (child)
        # testing the crash recovery: GPU_PROBE_TEST_CRASH="CASE:INDEX" kills the child there
        self.test_crash = os.environ.get("GPU_PROBE_TEST_CRASH", "")
        self.entry = ""  # path of the entry-point script (the child runs it with --child)


RUN = _Run()

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
UINT64_MAX = (1 << 64) - 1
PAGE = 4096

# ---------------------------------------------------------------------------
# call helpers
# ---------------------------------------------------------------------------


def _is_nolib(exc: BaseException) -> bool:
    return type(exc).__name__ in ("DynamicLibNotFoundError", "DynamicLibNotAvailableError")


_RET_RE = re.compile(r"^(\w+) : (.+)$")


_FAKE_CACHE: dict = {}


def _fake_outputs(fn) -> list:
    """Outputs of ``fn`` faked from its docstring (dry mode only)."""
    key = getattr(fn, "__name__", repr(fn))
    if key not in _FAKE_CACHE:
        _FAKE_CACHE[key] = _fake_outputs_uncached(fn)
    return list(_FAKE_CACHE[key])


def _fake_outputs_uncached(fn) -> list:
    doc = fn.__doc__ or ""
    i = doc.find("Returns\n-------\n")
    j = doc.find("See Also", i)
    outs = []
    if i >= 0:
        block = doc[i : j if j > 0 else None].splitlines()
        for line in block[3:]:
            m = _RET_RE.match(line)
            if not m:
                continue
            t = m.group(2)
            mm = re.search(r"~\.(\w+)", t)
            if mm and hasattr(d, mm.group(1)):
                cls = getattr(d, mm.group(1))
                val = None
                try:
                    val = cls()  # structs: a no-argument instance (an int would be a pointer)
                    int(val)  # handles are int-like: give them a plausible value
                    val = cls(0x7F0000200000)
                except Exception:
                    pass
                outs.append(val)
            elif t.startswith("int"):
                outs.append(2 * MiB)
            elif t.startswith("float"):
                outs.append(1.0)
            elif t.startswith("bytes"):
                outs.append(b"dry")
            elif t.startswith("list"):
                outs.append([0])
            else:
                outs.append(0x7F0000200000)
    return outs


class Res:
    """One call's outcome: .name (CUresult name or exception dict), .outs."""

    __slots__ = ("name", "outs")

    def __init__(self, name, outs):
        self.name = name
        self.outs = list(outs) + [None] * 8

    @property
    def ok(self) -> bool:
        return self.name == "CUDA_SUCCESS"

    @property
    def v(self):
        return self.outs[0]


def exc_rec(e: BaseException) -> dict:
    return {"exception": type(e).__name__, "message": str(e)[:300]}


def call(fn, *args) -> Res:
    """Call ``fn(*args)`` (a binding or its name); never raises for a driver error."""
    if isinstance(fn, str):
        f = getattr(d, fn, None)
        if f is None:
            return Res({"exception": "AttributeError", "message": f"driver has no {fn}"}, [])
        fn = f
    RUN.call_idx += 1
    if RUN.child:
        fname = getattr(fn, "__name__", "?")
        enums = [a.name for a in args if isinstance(a, (enum.Enum, int)) and hasattr(a, "name")]
        sig = f"{fname}:{','.join(enums)}" if enums else ""
        if RUN.call_idx in RUN.skip_calls or (sig and sig in RUN.poison):
            return Res({"crash": "process died in this call in an earlier attempt; skipped"}, [])
        print(f"CALL {RUN.call_idx} {fname} {sig}".rstrip(), flush=True)
        if RUN.test_crash and RUN.test_crash == f"{RUN.case}:{RUN.call_idx}":
            os.kill(os.getpid(), 11)
    try:
        res = fn(*args)
    except BaseException as e:
        if RUN.dry and _is_nolib(e):
            return Res("CUDA_SUCCESS", _fake_outputs(fn))
        if isinstance(e, KeyboardInterrupt):
            raise
        return Res(exc_rec(e), [])
    if isinstance(res, tuple) and res:
        err = res[0]
        name = getattr(err, "name", None) or repr(err)
        return Res(name, res[1:])
    return Res(repr(res), [])


def qcall(fn, *args) -> Res:
    """call() without the child's call logging (for timing loops)."""
    if RUN.dry:
        return call(fn, *args)
    try:
        res = fn(*args)
    except Exception as e:
        return Res(exc_rec(e), [])
    return Res(getattr(res[0], "name", repr(res[0])), res[1:])


def ok(fn, *args) -> Res:
    """A call that must succeed (setup); raises otherwise."""
    r = call(fn, *args)
    if not r.ok:
        fname = fn if isinstance(fn, str) else fn.__name__
        raise RuntimeError(f"setup call {fname} failed: {r.name}")
    return r


def jv(x, depth=0):
    """JSON-friendly form of a binding value."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, bytes):
        return x.decode("latin-1")
    if isinstance(x, (list, tuple)):
        return [jv(y, depth + 1) for y in x][:64]
    if isinstance(x, dict):
        return {str(k): jv(v, depth + 1) for k, v in x.items()}
    if hasattr(x, "name") and hasattr(x, "value") and not hasattr(x, "getPtr"):
        return x.name  # enum
    try:
        return int(x)
    except Exception:
        pass
    if depth < 2 and hasattr(x, "getPtr"):
        out = {}
        for a in dir(x):
            if a.startswith("_") or a in ("getPtr",):
                continue
            try:
                out[a] = jv(getattr(x, a), depth + 1)
            except Exception as e:
                out[a] = f"<{type(e).__name__}>"
        return out
    return repr(x)[:200]


def tv(x) -> dict:
    return {"value": jv(x), "type": type(x).__name__}


# ---------------------------------------------------------------------------
# cases
# ---------------------------------------------------------------------------


class Case:
    """Collects steps of one case."""

    def __init__(self, name):
        self.name = name
        self.steps: dict = {}
        self.values: dict = {}
        self.notes: list = []
        self.cleanup: list = []

    def __call__(self, label, fn, *args) -> Res:
        r = call(fn, *args)
        self.record(label, r.name)
        return r

    def record(self, label, name):
        base, k = label, 2
        while label in self.steps:
            label = f"{base}#{k}"
            k += 1
        self.steps[label] = name
        if RUN.child:
            print("STEP " + json.dumps({label: name}), flush=True)

    def val(self, key, value):
        self.values[key] = value
        if RUN.child:
            print("VAL " + json.dumps({key: jv(value)}, default=repr), flush=True)

    def note(self, text):
        self.notes.append(text)

    def defer(self, fn, *args):
        """Run fn(*args) when the case ends (LIFO)."""
        self.cleanup.append((fn, args))

    def finish(self):
        for fn, args in reversed(self.cleanup):
            try:
                call(fn, *args)
            except Exception:
                pass
        self.cleanup.clear()

    def as_json(self):
        if len(self.steps) == 1:
            result = next(iter(self.steps.values()))
        else:
            result = self.steps
        return {"result": result, "values": jv(self.values), "note": "; ".join(self.notes)}


class Probe(NamedTuple):
    """One registered case: its name, its function ``fn(c: Case)``, whether it runs alone."""

    name: str
    fn: Callable
    isolated: bool


CASES: list[Probe] = []  # in registration order (= run order)


def probe(name: str, isolated: bool = False):
    """Register the decorated function ``fn(c: Case)`` as the case ``name``.

    ``isolated=True``: the case might crash or poison the context; it gets a child
    process of its own and should end with ``ctx_after(c)``.
    """

    def deco(fn):
        if any(p.name == name for p in CASES):
            raise ValueError(f"probe {name!r} registered twice")
        CASES.append(Probe(name, fn, isolated))
        return fn

    return deco


class Ctx:
    """The device and primary context of the run (set by the runner's init_driver)."""

    dev = None
    ctx = None
    count = 0
