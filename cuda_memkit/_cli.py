"""``python -m cuda_memkit``: info, stats, doctor and tour."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from ._core import _driver
from ._core._errors import CudaDriverNotFoundError, CudaError

Say = Callable[[str], None]


class _UsageError(Exception):
    """A bad command-line or environment setting: reported in one line, exit status 2."""


def _requested_backend(flag: str | None) -> str | None:
    """Return the backend asked for by ``--backend`` or else ``CUDA_MEMKIT_BACKEND``, or None.

    Both sources are held to the same rule: a named backend is used as named
    (never replaced by the simulator), and a name that is not a backend is an error.
    """
    if flag is not None:
        return flag
    raw = os.environ.get(_driver.ENV_VAR)
    if raw is None:
        return None
    name = raw.strip().lower()  # the library's own reading of the variable
    if name not in _driver.BACKENDS:
        raise _UsageError(f"{_driver.ENV_VAR}={raw!r} is not a backend; "
                          f"choose one of {', '.join(_driver.BACKENDS)}")
    return name


def _select_backend(requested: str | None, say: Say) -> str:
    """Use the requested backend; with none, the real driver or, if absent, the simulator."""
    if requested:
        _driver.use_backend(requested)
        return requested
    if _driver.is_loaded():  # a program that chose its backend and then calls main()
        return _driver.backend_name()
    try:
        _driver.call("cuDriverGetVersion")
        return "cuda"
    except CudaDriverNotFoundError:
        _driver.reset_backend()
        _driver.use_backend("sim")
        say("No NVIDIA driver here: showing the CPU simulator, every figure [simulated].")
        say("")
        return "sim"


def _label(backend: str) -> str:
    return "sim (CPU simulator: SIMULATED devices)" if backend == "sim" else "cuda (real driver)"


def _figures(backend: str, say: Say) -> Say:
    """Return ``say`` that marks each line ``[simulated]`` on the simulator (its figures are)."""
    if backend != "sim":
        return say
    return lambda line: say(f"{line}  [simulated]" if line.strip() else line)


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
    fig = _figures(backend, say)
    fig(f"driver version : {v // 1000}.{v % 1000 // 10}")
    say(f"cuda-bindings  : {bindings}")
    n = device_count()
    fig(f"devices        : {n}")
    for i in range(n):
        dev = Device(i)
        free, total = dev.mem_info()
        major, minor = dev.compute_capability
        fig(f"  [{i}] {dev.name}  sm_{major}{minor}  "
            f"{total / 2**30:.1f} GiB total, {free / 2**30:.1f} GiB free")
        caps = dev.capabilities()
        yes = [k for k, on in caps.items() if on]
        no = [k for k, on in caps.items() if not on]
        say(f"      supports: {', '.join(yes) or '-'}")
        if no:
            say(f"      lacks   : {', '.join(no)}")
    usage_by_kind(fig)
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
        fig = _figures(backend, say)
        for line in stats.table().splitlines():
            fig(line)
        say("(a fresh process holds nothing: use cuda_memkit.memory_stats() in your program)")
    return 0


def cmd_doctor(backend: str, say: Say) -> int:
    """Check that the basics work; exit 1 if any check fails."""
    from ._tour import doctor_checks

    failures = 0
    checks = doctor_checks()
    for i, (name, check) in enumerate(checks):
        try:
            detail = check()
            say(f"ok    {name}{': ' + detail if detail else ''}")
        except CudaDriverNotFoundError as exc:
            # Without a driver every later check fails the same way: name them once.
            failures += 1
            say(f"FAIL  {name}: {exc}")
            rest = [n for n, _ in checks[i + 1:]]
            if rest:
                say(f"skip  {', '.join(rest)}: they need the driver")
            break
        except (CudaError, ValueError, TypeError, RuntimeError) as exc:
            failures += 1
            say(f"FAIL  {name}: {type(exc).__name__}: {exc}")
    say(f"{'all checks passed' if not failures else f'{failures} check(s) failed'} "
        f"on {_label(backend)}")
    return 1 if failures else 0


def cmd_tour(backend: str, say: Say) -> int:
    """Run the tour: each feature once, on small buffers (see ``_tour.steps``)."""
    import gc

    from ._core._device import Device
    from ._tour import steps

    say(f"cuda_memkit tour on {_label(backend)}")
    fig = _figures(backend, say)
    dev = Device(0)
    free_before = dev.mem_info()[0]
    for title, step in steps():
        say("")
        say(f"== {title}")
        step(lambda line: fig("   " + line))
    gc.collect()
    dev.synchronize()
    free_after = dev.mem_info()[0]
    say("")
    lost = free_before - free_after
    # The driver keeps the device pages it took for managed memory after that memory is
    # freed (~120 MiB on the H100 and H200; the simulator keeps the managed step's 8 MiB,
    # as a GPU does); anything beyond that is a leak.
    allowance = (160 << 20) if backend == "cuda" else (16 << 20)
    if lost > allowance:
        fig(f"tour finished, but device 0 has {lost / 2**20:.1f} MiB less free memory: a leak")
        return 1
    if lost > 4 << 20:
        fig(f"(the driver still holds {lost / 2**20:.0f} MiB of device pages from the managed "
            "step: its cache of freed managed memory, not a leak)")
    fig(f"tour finished; device 0 free memory before/after: {free_before / 2**30:.3f} / "
        f"{free_after / 2**30:.3f} GiB")
    return 0


# name -> (one-line description, more detail for the command's own --help)
COMMANDS: dict[str, tuple[str, str]] = {
    "info": ("show the backend, the driver and every device with its memory and capabilities",
             "Ends with what this process holds through cuda_memkit, per memory kind."),
    "stats": ("print memory_stats(): what this process holds through cuda_memkit",
              "A fresh process holds nothing: call cuda_memkit.memory_stats() in your program "
              "for your own figures."),
    "doctor": ("check that the driver, devices, device memory and streams work",
               "Exits 1 if a check fails."),
    "tour": ("run a short tour of what cuda_memkit does, each feature once on small buffers",
             "It shows typed driver errors; pinned memory and copies; pools with their "
             "statistics and the block cache; copy_batch of 1024 scattered 4 KiB blocks; a "
             "Loader's worker processes filling a pinned ring; a staged copy of a pageable "
             "numpy array; managed memory with a prefetch plan; a growable virtual-memory "
             "buffer; a peer copy between two devices; memory_stats() and a leak report; "
             "CuPy on a cuda_memkit pool where CuPy and a GPU are there. Without a driver it "
             "runs on the CPU simulator (two simulated devices), every figure marked "
             "[simulated] and no timings shown. Exits 1 if device memory is missing "
             "afterwards."),
}

_BACKEND_HELP = (f"the backend: cuda (the real driver) or sim (the CPU simulator); default: "
                 f"${_driver.ENV_VAR} if set, else the real driver, or the simulator (with a "
                 "notice) where no driver is installed; a backend named here or in "
                 f"${_driver.ENV_VAR} is never replaced by the simulator")


def _prog(argv0: str) -> str:
    """The command as it was invoked: ``python -m cuda_memkit`` or the script's name."""
    name = os.path.basename(argv0)
    return "python -m cuda_memkit" if name in ("__main__.py", "-c", "") else name


def _parser(prog: str) -> argparse.ArgumentParser:
    from . import __version__

    # --backend goes before or after the command: both parsers know it, the value given wins.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--backend", choices=_driver.BACKENDS, default=argparse.SUPPRESS,
                        help=_BACKEND_HELP)
    ap = argparse.ArgumentParser(
        prog=prog, parents=[common],
        description="cuda_memkit command line: look at the driver, the devices and memory "
                    "through cuda_memkit. Without a command, runs info.",
        epilog=f"Each command has its own help: {prog} COMMAND --help")
    ap.add_argument("--version", action="version", version=f"cuda_memkit {__version__}")
    sub = ap.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    for name, (summary, detail) in COMMANDS.items():
        p = sub.add_parser(name, parents=[common], help=summary,
                           description=f"{summary[0].upper()}{summary[1:]}. {detail}")
        if name == "stats":
            p.add_argument("--json", action="store_true",
                           help="print memory_stats() as JSON (notices go to stderr)")
    return ap


def _run(argv: Sequence[str] | None) -> int:
    # A program passing argv calls the module, not a script: name it the canonical way.
    ap = _parser(_prog(sys.argv[0] if sys.argv else "") if argv is None
                 else "python -m cuda_memkit")
    args = ap.parse_args(argv)
    command = args.command or "info"
    as_json = bool(getattr(args, "json", False))
    try:
        requested = _requested_backend(getattr(args, "backend", None))
    except _UsageError as exc:
        ap.error(str(exc))

    def say(line: str) -> None:
        print(line, flush=True)

    def say_err(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    # With --json, stdout carries the JSON alone: notices go to stderr.
    backend = _select_backend(requested, say_err if as_json else say)
    try:
        if command == "stats":
            return cmd_stats(backend, say, as_json)
        commands = {"info": cmd_info, "doctor": cmd_doctor, "tour": cmd_tour}
        return commands[command](backend, say)
    except CudaDriverNotFoundError as exc:
        say_err(f"error: {exc}")
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m cuda_memkit``: run a command, return the exit status."""
    try:
        return _run(argv)
    except BrokenPipeError:
        # The reader went away (``... | head``): stop quietly as shell tools do, and point
        # stdout at /dev/null so that the interpreter's final flush cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool stopped by a closed pipe


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
