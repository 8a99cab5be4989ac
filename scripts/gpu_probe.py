#!/usr/bin/env python3
"""Probe the real CUDA driver through raw ``cuda.bindings.driver`` calls.

Records, for each case, the exact ``CUresult`` name the driver returns at
each step, plus measured values, so that the CPU simulator
(``cuda_memkit.sim``) can reproduce them verbatim.

Usage::

    python3 scripts/gpu_probe.py OUT.json            # on a GPU machine
    python3 scripts/gpu_probe.py --dry OUT.json      # no GPU: argument-form check
    python3 scripts/gpu_probe.py --list              # the registered cases
    python3 scripts/gpu_probe.py --cases 'B_*,A_memset' OUT.json   # a subset

Options: ``--cases P1,P2,...`` runs the cases matching any pattern (a shell glob
against the whole name, or ``re:REGEX`` searched in it; a pattern matching no
case is an error); ``--only REGEX`` (older form) keeps the cases whose name
matches REGEX; ``--list`` prints the selected cases (name, module, isolated)
and runs nothing.

Output JSON maps case name -> {"result": ..., "values": ..., "note": ...}.
"result" is one CUresult name for a one-step case, otherwise an ordered dict
step-label -> CUresult name (a Python exception is recorded as
{"exception": type name, "message": str}).

Every case runs in a child process (consecutive ordinary cases share one;
cases that might crash or poison the context get their own, "isolated":
true, and end with cuCtxSynchronize#after / cuMemAlloc#after steps).  When a
child dies (e.g. SIGSEGV inside the driver), the parent re-runs the case
with the fatal call skipped; that step is recorded as {"crash": ...} and the
case gets a "crashes" list (call index, function, rc).  _meta.crashed_cases
lists them.  GPU_PROBE_TEST_CRASH="CASE:INDEX" simulates such a crash.

--dry: without libcuda every binding raises DynamicLibNotFoundError *after*
converting its arguments, so a dry run checks every call's argument forms;
outputs are faked from the docstrings.  Values in a dry run mean nothing.

Safety: managed allocations <= 256 MiB; huge sizes only in calls that fail;
no multicast objects; no clock or reset changes.

Layout: ``scripts/driver_probe/`` holds the framework (``_framework.py``: call
helpers, ``Case``, ``@probe``; ``_helpers.py``: locations and resources;
``_runner.py``: child processes and crash recovery) and one module per feature
section: ``core.py`` (A), ``pinned.py`` (B), ``managed.py`` (C), ``vmm.py`` (D),
``pool.py`` (E), ``peer.py`` (F: two devices; its answers are recorded apart, in
``tests/conformance/h200x2_probe.json``: ``--cases 'F_*'`` on a machine with two
GPUs), ``capture.py`` (G: stream capture, graph memory nodes).  This file only
parses the arguments and runs.

Adding a probe
--------------
Write a decorated function in the feature module it belongs to::

    @probe("B_hostalloc_zero_flags")            # isolated=True if it may crash
    def b_hostalloc_zero(c: Case):
        h = pinned(c, 4096)                      # setup; freed when the case ends
        r = c("cuMemHostGetFlags", d.cuMemHostGetFlags, h)   # a recorded step
        c.val("flags", jv(r.v))                  # a recorded value

``c(label, fn, *args)`` calls ``fn`` and records its CUresult under ``label``;
``call`` makes an unrecorded call, ``ok`` a setup call that must succeed;
``c.defer(fn, *args)`` runs at the end of the case; an isolated case ends with
``ctx_after(c)``.  Case names are unique (a duplicate raises at import) and
start with the section letter.  The case runs in registration order; check it
with ``--list`` and ``--dry --cases NAME``.  A new feature module goes in
``driver_probe.FEATURES``.  ``tests/test_probe_layout.py`` checks that every
case of ``tests/conformance/h100_probe.json`` is still registered.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import driver_probe
from driver_probe import _runner
from driver_probe._framework import RUN


def main(argv) -> int:
    ap = argparse.ArgumentParser(prog="gpu_probe.py", add_help=True)
    ap.add_argument("out", nargs="?", help="output JSON file")
    ap.add_argument("--dry", action="store_true", help="no GPU: argument-form check")
    ap.add_argument("--cases", help="comma-separated globs (or re:REGEX) of case names")
    ap.add_argument("--only", help="regex searched in case names (older form)")
    ap.add_argument("--list", action="store_true", help="list the selected cases and exit")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # internal: JSON spec of a child run
    args = ap.parse_args(argv[1:])
    RUN.dry = args.dry
    RUN.entry = os.path.abspath(__file__)
    driver_probe.load()
    if args.child is not None:
        return _runner.child_main(json.loads(args.child))
    try:
        probes = _runner.select(args.cases, args.only)
    except ValueError as e:
        print(f"gpu_probe: {e}", file=sys.stderr)
        return 2
    if args.list:
        _runner.list_cases(probes)
        return 0
    if not args.out:
        print(__doc__)
        return 1
    return _runner.run(args.out, probes)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
