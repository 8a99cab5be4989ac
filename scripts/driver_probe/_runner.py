"""Runner: every case in a child process, crash recovery, the JSON file and the summary.

The parent (:func:`run`) starts a child process (the entry point with ``--child
SPEC``) for each run of consecutive ordinary cases and one per isolated case.  The
child prints ``BEGIN`` / ``CALL`` / ``STEP`` / ``VAL`` / ``CASE`` lines; when it dies
(e.g. SIGSEGV inside the driver), the parent re-runs the case with the fatal call
skipped (recorded as ``{"crash": ...}``) and adds a ``crashes`` list to the case.
"""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import sys
import threading
import time
import traceback

import numpy as np

from ._framework import CASES, RUN, Case, Ctx, Probe, call, d, exc_rec, jv, ok

# cases the runner itself records (not registered probes)
RUNNER_CASES = ("A_first_cuInit",)


def set_primary():
    if Ctx.ctx is not None and not RUN.dry:
        d.cuCtxSetCurrent(Ctx.ctx)  # raw: not counted as a step call


def run_case(name, fn) -> dict:
    RUN.call_idx = 0
    c = Case(name)
    set_primary()
    t0 = time.perf_counter()
    try:
        fn(c)
    except Exception as e:
        c.record("python_exception", exc_rec(e))
        c.note("case aborted: " + "".join(traceback.format_exception_only(type(e), e)).strip())
    finally:
        try:
            set_primary()
            c.finish()
        except Exception:
            pass
    out = c.as_json()
    out["seconds"] = round(time.perf_counter() - t0, 3)
    return out


def child_main(spec: dict) -> int:
    """Run ``spec["cases"]`` in order in this (child) process."""
    RUN.child = True
    RUN.poison.update(spec.get("poison", []))
    init_driver()
    table = {n: f for n, f, _ in CASES}
    for name in spec["cases"]:
        RUN.skip_calls = set(spec.get("skip", {}).get(name, []))
        RUN.case = name
        print("BEGIN " + name, flush=True)
        out = run_case(name, table[name])
        print("CASE " + json.dumps({"name": name, "out": out}, default=repr), flush=True)
    return 0


def spawn(names, skip, poison, idle_timeout=30.0):
    """Run cases ``names`` in one child; returns (finished, partial, rc, stderr tail).

    ``partial`` describes the case the child died in (None when it ended normally):
    {"name", "steps", "values", "last_call": (index, function) or None}.
    """
    import queue

    spec = {"cases": names, "skip": skip, "poison": sorted(poison)}
    cmd = [sys.executable, RUN.entry, "--child", json.dumps(spec)]
    if RUN.dry:
        cmd.append("--dry")
    pr = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    q: queue.Queue = queue.Queue()

    def reader():
        for line in pr.stdout:
            q.put(line)
        q.put(None)

    err_chunks: list = []

    def ereader():
        for line in pr.stderr:
            err_chunks.append(line)
            del err_chunks[:-40]

    threading.Thread(target=reader, daemon=True).start()
    threading.Thread(target=ereader, daemon=True).start()
    finished: dict = {}
    cur, steps, vals, last = None, {}, {}, None
    timed_out = False
    while True:
        try:
            line = q.get(timeout=idle_timeout)
        except Exception:  # queue.Empty: the child hangs
            timed_out = True
            pr.kill()
            break
        if line is None:
            break
        line = line.rstrip("\n")
        if line.startswith("BEGIN "):
            cur, steps, vals, last = line[6:], {}, {}, None
            print(f"    child: {cur}", flush=True)
        elif line.startswith("CALL "):
            parts = line.split(" ")
            last = (int(parts[1]), parts[2], parts[3] if len(parts) > 3 else "")
        elif line.startswith("STEP "):
            steps.update(json.loads(line[5:]))
        elif line.startswith("VAL "):
            vals.update(json.loads(line[4:]))
        elif line.startswith("CASE "):
            obj = json.loads(line[5:])
            finished[obj["name"]] = obj["out"]
            cur = None
    rc = pr.wait()
    if timed_out:
        rc = f"hung>{idle_timeout}s(killed)"
    partial = None
    if cur is not None:
        partial = {"name": cur, "steps": steps, "values": vals, "last_call": last}
    return finished, partial, rc, "".join(err_chunks)[-400:]


def run_all(names, isolated_set, results, out_path, t_all, max_attempts=10, budget_s=170.0):
    """Run every case in a child process; a case that kills its child is re-run
    with the fatal call skipped (recorded as {"crash": ...})."""
    skip: dict = {}
    crashes: dict = {}
    poison: set = set()
    sig_seen: set = set()
    i = 0
    while i < len(names):
        name = names[i]
        if name in isolated_set:
            batch = [name]
        else:
            batch = []
            for n in names[i:]:
                if n in isolated_set:
                    break
                batch.append(n)
        print(
            f"[{time.perf_counter() - t_all:7.2f}s] child for {batch[0]} (+{len(batch) - 1})",
            flush=True,
        )
        t0 = time.perf_counter()
        finished, partial, rc, err = spawn(batch, skip, poison)
        for n in batch:
            if n in finished:
                out = finished[n]
                if n in crashes:
                    out["crashes"] = crashes[n]
                    msg = (
                        f"the process died {len(crashes[n])}x in this case: "
                        "the fatal calls were skipped on re-run (see crashes)"
                    )
                    out["note"] = "; ".join(x for x in (out.get("note"), msg) if x)
                if n in isolated_set:
                    out["isolated"] = True
                results[n] = out
                i += 1
        if partial is not None:
            pname = partial["name"]
            last = partial["last_call"]
            crashes.setdefault(pname, []).append(
                {
                    "call_index": last[0] if last else None,
                    "function": last[1] if last else None,
                    "signature": last[2] if last else None,
                    "rc": rc,
                    "steps_before": len(partial["steps"]),
                    "stderr": err[-200:],
                }
            )
            print(f"    !! child died in {pname} at call {last} rc={rc}", flush=True)
            in_budget = time.perf_counter() - t_all < budget_s
            if last is not None and len(crashes[pname]) < max_attempts and in_budget:
                skip.setdefault(pname, []).append(last[0])
                if last[2]:  # the same enum signature died twice: skip it everywhere
                    if last[2] in sig_seen:
                        poison.add(last[2])
                    sig_seen.add(last[2])
            else:
                results[pname] = {
                    "result": partial["steps"],
                    "values": partial["values"],
                    "note": "process died; partial results",
                    "crashes": crashes[pname],
                }
                i += 1
        elif len(finished) < len(batch):
            # child ended without running everything (e.g. init failure)
            n = batch[len(finished)]
            results[n] = {"result": {}, "values": {}, "note": f"child ended rc={rc}: {err}"}
            i += 1
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True, default=repr)
        del t0


def init_driver(parent=False) -> dict:
    r = call(d.cuInit, 0)
    if isinstance(r.name, dict):
        msg = r.name.get("message", "")
        print(
            "gpu_probe: the CUDA driver library (libcuda) could not be loaded: "
            f"{r.name.get('exception')}: {msg}\n"
            "Run this on a machine with an NVIDIA GPU and driver, or use --dry.",
            file=sys.stderr,
        )
        sys.exit(2)
    if not r.ok:
        print(f"gpu_probe: cuInit(0) returned {r.name}", file=sys.stderr)
        sys.exit(2)
    Ctx.count = ok(d.cuDeviceGetCount).v
    Ctx.dev = ok(d.cuDeviceGet, 0).v
    if parent:  # the parent only reports; every case runs in a child process
        return {"result": r.name, "values": {"device_count": Ctx.count}, "note": "first cuInit(0)"}
    Ctx.ctx = ok(d.cuDevicePrimaryCtxRetain, Ctx.dev).v
    ok(d.cuCtxSetCurrent, Ctx.ctx)
    return {
        "result": "CUDA_SUCCESS",
        "values": {"device_count": Ctx.count},
        "note": "first cuInit(0)",
    }


def _short(x, n=60):
    if isinstance(x, dict):
        if "exception" in x:
            s = f"EXC {x['exception']}"
        else:
            s = ", ".join(f"{k}={_short(v, 30)}" for k, v in x.items())
    else:
        s = str(x)
    s = s.replace("CUDA_ERROR_", "E_").replace("CUDA_SUCCESS", "OK")
    return s if len(s) <= n else s[: n - 3] + "..."


def print_table(results):
    print("\n=== gpu_probe summary ===")
    for name, out in results.items():
        if name.startswith("_") or not isinstance(out, dict):
            continue
        res = out.get("result")
        if isinstance(res, dict) and "exception" not in res:
            print(
                f"{name} ({out.get('seconds', '')}s){' [isolated]' if out.get('isolated') else ''}"
            )
            for k, v in res.items():
                print(f"    {k:<58} {_short(v, 70)}")
        else:
            print(f"{name:<62} {_short(res, 70)}")
        if out.get("note"):
            print(f"    note: {_short(out['note'], 150)}")
    print("\n=== per-case result counts ===")
    for name, out in results.items():
        if name.startswith("_") or not isinstance(out, dict):
            continue
        res = out.get("result")
        vals = list(res.values()) if isinstance(res, dict) and "exception" not in res else [res]
        counts: dict = {}
        for v in vals:
            k = _short(v, 40)
            counts[k] = counts.get(k, 0) + 1
        print(
            f"{name:<34} {out.get('seconds', '')!s:>7}s  "
            + ", ".join(f"{k}x{n}" for k, n in counts.items())
        )
    print(f"total {results['_meta'].get('total_seconds')}s")


def select(patterns: str | None = None, only: str | None = None) -> list[Probe]:
    """Registered cases chosen by ``--cases`` ``patterns`` and/or the ``--only`` regex.

    ``patterns``: comma-separated; each a shell glob matched against the whole name
    (``B_*``, ``A_memset``), or ``re:REGEX`` searched in the name.  A pattern that
    matches no case raises ValueError (a typo must not run nothing silently).
    ``only``: a regex searched in the name (the original option; no such check).
    """
    chosen = list(CASES)
    if only:
        chosen = [p for p in chosen if re.search(only, p.name)]
    if patterns:
        keep: set = set()
        for pat in (x.strip() for x in patterns.split(",")):
            if not pat:
                continue
            if pat.startswith("re:"):
                hits = {p.name for p in chosen if re.search(pat[3:], p.name)}
            else:
                hits = {p.name for p in chosen if fnmatch.fnmatchcase(p.name, pat)}
            if not hits:
                raise ValueError(f"--cases pattern {pat!r} matches no registered case")
            keep |= hits
        chosen = [p for p in chosen if p.name in keep]
    return chosen


def list_cases(probes: list[Probe]) -> None:
    """Print one line per case: name, feature module, ``isolated`` when it runs alone."""
    for p in probes:
        module = p.fn.__module__.rpartition(".")[2]
        print(f"{p.name:<34} {module:<8} {'isolated' if p.isolated else ''}".rstrip())


def run(out_path: str, probes: list[Probe]) -> int:
    """Run ``probes`` (each in a child process), write ``out_path``, print the summary."""
    results = {
        "_meta": {
            "dry": RUN.dry,
            "python": sys.version.split()[0],
            "bindings": getattr(__import__("cuda.bindings").bindings, "__version__", "?"),
            "numpy": np.__version__,
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
    }
    t_all = time.perf_counter()
    results["A_first_cuInit"] = init_driver(parent=True)
    r = call(d.cuDeviceGetName, 256, Ctx.dev)
    results["_meta"]["device"] = jv(r.v).split("\x00")[0] if r.ok else r.name
    r = call(d.cuDriverGetVersion)
    results["_meta"]["driver_version"] = r.v
    names = [p.name for p in probes]
    isolated_set = {p.name for p in CASES if p.isolated}
    run_all(names, isolated_set, results, out_path, t_all)
    crashed = sorted(k for k, v in results.items() if isinstance(v, dict) and v.get("crashes"))
    if crashed:
        results["_meta"]["crashed_cases"] = crashed
    results["_meta"]["total_seconds"] = round(time.perf_counter() - t_all, 2)
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1, sort_keys=True, default=repr)
    print_table(results)
    return 0
