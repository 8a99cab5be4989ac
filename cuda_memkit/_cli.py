"""``python -m cuda_memkit``: info, stats, doctor and tour."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from ._core import _driver
from ._core._errors import CudaDriverNotFoundError, CudaError

Say = Callable[[str], None]


def _select_backend(requested: str | None, say: Say) -> str:
    """Use the requested backend; with none, the real driver or, if absent, the simulator."""
    if requested:
        _driver.use_backend(requested)
        return requested
    if _driver.backend_name() == "sim":
        return "sim"
    try:
        _driver.call("cuDriverGetVersion")
        return "cuda"
    except CudaDriverNotFoundError as exc:
        _driver.reset_backend()
        _driver.use_backend("sim")
        say("No NVIDIA driver was found on this machine:")
        say(f"  {exc.description}")
        say("Showing the CPU SIMULATOR instead. Everything below is SIMULATED.")
        say("")
        return "sim"


def _label(backend: str) -> str:
    return "sim (CPU simulator: SIMULATED devices)" if backend == "sim" else "cuda (real driver)"


def cmd_info(backend: str, say: Say) -> int:
    """Print backend, versions and every device with memory and capabilities."""
    from importlib.metadata import PackageNotFoundError, version

    from ._core._device import Device, device_count

    try:
        bindings = version("cuda-bindings")
    except PackageNotFoundError:
        bindings = "not installed"
    v = int(_driver.call("cuDriverGetVersion"))
    say(f"backend        : {_label(backend)}")
    say(f"driver version : {v // 1000}.{v % 1000 // 10}" + (" (simulated)" if backend == "sim"
                                                            else ""))
    say(f"cuda-bindings  : {bindings}")
    n = device_count()
    say(f"devices        : {n}")
    for i in range(n):
        dev = Device(i)
        free, total = dev.mem_info()
        major, minor = dev.compute_capability
        say(f"  [{i}] {dev.name}  sm_{major}{minor}  "
            f"{total / 2**30:.1f} GiB total, {free / 2**30:.1f} GiB free")
        caps = dev.capabilities()
        yes = [k for k, on in caps.items() if on]
        no = [k for k, on in caps.items() if not on]
        say(f"      supports: {', '.join(yes) or '-'}")
        if no:
            say(f"      lacks   : {', '.join(no)}")
    usage_by_kind(say)
    return 0


def usage_by_kind(say: Say) -> None:
    """Print what this process holds through cuda_memkit, per kind (``memory_stats()``)."""
    from ._observability._observe import format_bytes
    from ._observability._stats import MEMORY_KINDS, memory_stats

    stats = memory_stats()
    say("current usage by kind (this process; a fresh one holds nothing):")
    for kind, u in stats.by_kind.items():
        say(f"  {kind:<14} {format_bytes(u.current):>11} in {u.live:>4} live  "
            f"({MEMORY_KINDS[kind]})")


def cmd_stats(backend: str, say: Say, as_json: bool = False) -> int:
    """Print ``memory_stats()``: a table, or JSON with ``--json``."""
    import json

    from ._observability._stats import memory_stats

    stats = memory_stats()
    if as_json:
        print(json.dumps({"backend": backend, **stats.to_dict()}, indent=1), flush=True)
    else:
        say(f"backend: {_label(backend)}")
        say(stats.table())
        say("(a fresh process holds nothing: use cuda_memkit.memory_stats() in your program)")
    return 0


def cmd_doctor(backend: str, say: Say) -> int:
    """Check that the basics work; exit 1 on the first failure."""
    from ._tour import doctor_checks

    failures = 0
    for name, check in doctor_checks():
        try:
            detail = check()
            say(f"ok    {name}{': ' + detail if detail else ''}")
        except (CudaError, ValueError, TypeError, RuntimeError) as exc:
            failures += 1
            say(f"FAIL  {name}: {type(exc).__name__}: {exc}")
    say(f"{'all checks passed' if not failures else f'{failures} check(s) failed'} "
        f"on {_label(backend)}")
    return 1 if failures else 0


def cmd_tour(backend: str, say: Say) -> int:
    """Run a short end-to-end tour of every feature."""
    import gc

    from ._core._device import Device
    from ._tour import steps

    say(f"cuda_memkit tour on {_label(backend)}")
    dev = Device(0)
    free_before = dev.mem_info()[0]
    for title, step in steps():
        say("")
        say(f"== {title}")
        step(lambda line: say("   " + line))
    gc.collect()
    dev.synchronize()
    free_after = dev.mem_info()[0]
    say("")
    lost = free_before - free_after
    # The real driver keeps ~120 MiB of device pages after managed memory was
    # used and freed (seen on the H100); anything beyond that is a leak.
    allowance = (160 << 20) if backend == "cuda" else (4 << 20)
    if lost > allowance:
        say(f"tour finished, but device 0 has {lost / 2**20:.1f} MiB less free memory: a leak")
        return 1
    if lost > 4 << 20:
        say(f"(the driver still holds {lost / 2**20:.0f} MiB of device pages from the managed "
            "step: its cache of freed managed memory, not a leak)")
    say(f"tour finished; device 0 free memory before/after: {free_before / 2**30:.3f} / "
        f"{free_after / 2**30:.3f} GiB")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m cuda_memkit``."""
    ap = argparse.ArgumentParser(prog="python -m cuda_memkit",
                                 description="cuda_memkit command line")
    ap.add_argument("--backend", choices=_driver.BACKENDS,
                    help="force a backend (default: the real driver, else the simulator)")
    ap.add_argument("command", nargs="?", default="info",
                    choices=("info", "stats", "doctor", "tour"))
    ap.add_argument("--json", action="store_true",
                    help="stats: print memory_stats() as JSON")
    args = ap.parse_args(argv)
    if args.json and args.command != "stats":
        ap.error("--json goes with the stats command")

    def say(line: str) -> None:
        print(line, flush=True)

    def say_err(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    # With --json, stdout carries the JSON alone: notices go to stderr.
    backend = _select_backend(args.backend, say_err if args.json else say)
    if args.command == "stats":
        return cmd_stats(backend, say, args.json)
    commands = {"info": cmd_info, "doctor": cmd_doctor, "tour": cmd_tour}
    try:
        return commands[args.command](backend, say)
    except CudaDriverNotFoundError as exc:
        say(f"error: {exc}")
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
