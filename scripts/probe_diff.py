#!/usr/bin/env python3
"""Compare two output files of ``scripts/gpu_probe.py``.

Usage::

    python3 scripts/probe_diff.py A.json B.json            # exit 0: same apart from volatile fields
    python3 scripts/probe_diff.py --all A.json B.json      # volatile fields count too
    python3 scripts/probe_diff.py --labels A.json B.json   # case names and step labels only

Volatile fields (different on every run): ``seconds`` of a case, ``_meta``'s
``started`` and ``total_seconds``, timings (value keys ending ``_ms`` / ``_us``)
and addresses (value keys ending ``_hex``).  Prints one line per difference
(path, A's value, B's value) and a count of the volatile ones it ignored.
"""

from __future__ import annotations

import json
import sys

VOLATILE_KEYS = {"seconds", "started", "total_seconds"}
VOLATILE_SUFFIXES = ("_ms", "_us", "_hex")


def volatile(path: tuple) -> bool:
    key = str(path[-1]) if path else ""
    return key in VOLATILE_KEYS or key.endswith(VOLATILE_SUFFIXES)


def walk(a, b, path: tuple, out: list) -> None:
    if type(a) is not type(b):
        out.append((path, a, b))
    elif isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(((*path, k), a.get(k, "<absent>"), b.get(k, "<absent>")))
            else:
                walk(a[k], b[k], (*path, k), out)
    elif isinstance(a, list):
        if len(a) != len(b):
            out.append(((*path, "<len>"), len(a), len(b)))
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            walk(x, y, (*path, i), out)
    elif a != b:
        out.append((path, a, b))


def labels(res: dict) -> dict:
    out = {}
    for name, case in res.items():
        if name.startswith("_") or not isinstance(case, dict):
            continue
        r = case.get("result")
        steps = r if isinstance(r, dict) and "exception" not in r else {"<one step>": r}
        out[name] = dict.fromkeys(steps, "step")
    return out


def main(argv: list) -> int:
    args = list(argv[1:])
    keep_all = "--all" in args
    only_labels = "--labels" in args
    args = [x for x in args if x not in ("--all", "--labels")]
    if len(args) != 2:
        print(__doc__)
        return 2
    with open(args[0]) as f:
        a = json.load(f)
    with open(args[1]) as f:
        b = json.load(f)
    if only_labels:
        a, b = labels(a), labels(b)
    diffs: list = []
    walk(a, b, (), diffs)
    shown = [x for x in diffs if keep_all or not volatile(x[0])]
    for path, x, y in shown:
        print("/".join(map(str, path)), repr(x)[:100], "|", repr(y)[:100])
    ignored = len(diffs) - len(shown)
    print(f"{len(shown)} difference(s); {ignored} volatile difference(s) ignored")
    return 1 if shown else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
