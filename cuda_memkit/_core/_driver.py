"""The driver gateway: the only module that calls backend functions.

Every driver call in cuda_memkit goes through :func:`call`, which turns the
bindings' ``(CUresult, ...)`` tuples into the payload or a typed exception.

The backend is the real ``cuda.bindings.driver`` (``"cuda"``, the default) or
the CPU simulator ``cuda_memkit.sim.driver`` (``"sim"``), chosen by
:func:`use_backend` or the ``CUDA_MEMKIT_BACKEND`` environment variable. The
backend is loaded, and ``cuInit`` called, on the first driver call, never at
import time.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from ._errors import CudaDriverNotFoundError, error_class

__all__ = ["backend_name", "use_backend"]

BACKENDS = ("cuda", "sim")
ENV_VAR = "CUDA_MEMKIT_BACKEND"

_lock = threading.RLock()
_chosen: str | None = None  # set by use_backend()
_active: str | None = None  # the backend actually loaded
_mod: Any = None
_fns: dict[str, Callable[..., Any]] = {}

_NO_DRIVER_HELP = (
    "no NVIDIA driver (libcuda.so) was found on this machine. Install the NVIDIA "
    "driver to use a GPU, or run on the CPU simulator: set CUDA_MEMKIT_BACKEND=sim "
    "or call cuda_memkit.use_backend('sim') before the first CUDA call"
)


def _requested() -> str:
    name = _chosen if _chosen is not None else os.environ.get(ENV_VAR, "cuda").strip().lower()
    if name not in BACKENDS:
        raise ValueError(f"{ENV_VAR}={name!r} is not a backend; use one of {BACKENDS}")
    return name


def use_backend(name: str) -> None:
    """Choose the backend: ``"cuda"`` (the real driver) or ``"sim"`` (CPU simulator).

    Call it before the first CUDA operation. Choosing the backend already in
    use is a no-op; switching after a backend was loaded raises, because
    objects created on one backend are meaningless on the other.

    Parameters
    ----------
    name : str
        ``"cuda"`` or ``"sim"``.

    Raises
    ------
    ValueError
        If ``name`` is not a backend.
    RuntimeError
        If another backend is already loaded.
    """
    global _chosen
    if not isinstance(name, str) or name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, not {name!r}")
    with _lock:
        if _active is not None and _active != name:
            raise RuntimeError(
                f"the {_active!r} backend is already in use; choose the backend "
                "before the first CUDA call"
            )
        _chosen = name


def backend_name() -> str:
    """Return the name of the backend in use, or the one the first call will load.

    Returns
    -------
    str
        ``"cuda"`` or ``"sim"``.
    """
    return _active if _active is not None else _requested()


def is_loaded() -> bool:
    """Return whether a backend has been loaded (a driver call was made)."""
    return _active is not None


def _translate_missing(exc: BaseException, api: str) -> CudaDriverNotFoundError | None:
    """Turn the bindings' "no libcuda" / "function not found" errors into ours."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if "DynamicLibNotFoundError" in names:
        return CudaDriverNotFoundError(-1, api, description=_NO_DRIVER_HELP)
    if "FunctionNotFoundError" in names:
        return CudaDriverNotFoundError(
            -1,
            api,
            "CUDA_DRIVER_FUNCTION_NOT_FOUND",
            f"the installed NVIDIA driver does not provide {api}; update the driver",
        )
    return None


def _load() -> None:
    """Import the requested backend and initialise it (``cuInit(0)``)."""
    global _active, _mod
    name = _requested()
    mod: Any
    if name == "sim":
        from ..sim import driver as sim_driver

        mod = sim_driver
    else:
        from cuda.bindings import driver as cuda_driver

        mod = cuda_driver
    try:
        res = mod.cuInit(0)
    except RuntimeError as exc:
        missing = _translate_missing(exc, "cuInit")
        if missing is not None:
            # The loader's own error (cuda.pathfinder's search) says nothing our message does not.
            raise missing from None
        raise
    if res[0]:
        _raise(mod, res[0], "cuInit")
    _mod = mod
    _active = name


def _resolve(api: str) -> Callable[..., Any]:
    with _lock:
        if _mod is None:
            _load()
        fn: Callable[..., Any] | None = getattr(_mod, api, None)
        if fn is None:
            raise CudaDriverNotFoundError(
                -1,
                api,
                "CUDA_DRIVER_FUNCTION_NOT_FOUND",
                f"the {_active} backend has no function {api}; update cuda-bindings",
            )
        _fns[api] = fn
        return fn


def _describe(mod: Any, code: Any) -> tuple[str, str]:
    try:
        name = str(code.name)
    except AttributeError:
        name = f"CUresult({int(code)})"
    description = ""
    try:
        res = mod.cuGetErrorString(code)
        if not res[0] and res[1] is not None:
            raw = res[1]
            description = raw.decode() if isinstance(raw, bytes) else str(raw)
    except (AttributeError, RuntimeError, TypeError, ValueError):
        # The description is a nicety: no backend yet, or a missing or failing
        # cuGetErrorString, must not hide the error we are reporting.
        description = ""
    return name, description


def _raise(mod: Any, code: Any, api: str) -> None:
    name, description = _describe(mod, code)
    raise error_class(int(code))(int(code), api, name, description)


def call(api: str, *args: Any) -> Any:
    """Call driver function ``api`` and return its payload or raise.

    Parameters
    ----------
    api : str
        The driver function's name, e.g. ``"cuMemAlloc"``.
    *args
        Its arguments, as the bindings take them.

    Returns
    -------
    Any
        ``None`` for calls with no output, the single output, or a tuple of
        outputs.

    Raises
    ------
    CudaError
        The subclass mapped from the ``CUresult``, naming ``api``.
    CudaDriverNotFoundError
        If libcuda is missing or lacks ``api``.
    """
    try:
        res = _fns[api](*args)
    except KeyError:
        if api in _fns:  # a KeyError from inside the function: not ours to handle
            raise
        res = None  # first call of ``api``: resolved below, outside the handler (no KeyError chain)
    except RuntimeError as exc:
        missing = _translate_missing(exc, api)
        if missing is not None:
            raise missing from None
        raise
    if res is None:
        return _first_call(api, args)
    if res[0]:
        _raise(_mod, res[0], api)
    if len(res) == 2:
        return res[1]
    return None if len(res) == 1 else res[1:]


def _first_call(api: str, args: tuple[Any, ...]) -> Any:
    """Resolve ``api`` (loading the backend if needed), then make the call."""
    _resolve(api)
    return _call(api, *args)


# The gateway itself, for _first_call: a spy patched over ``call`` (tests) sees
# one call, not the first one twice.
_call = call


def check(api: str, res: Any) -> Any:
    """Convert a ``(CUresult, ...)`` tuple already obtained to its payload or raise.

    For the rare caller that must hold the raw function (see :func:`function`).
    """
    if res[0]:
        _raise(_mod, res[0], api)
    n = len(res)
    if n == 2:
        return res[1]
    if n == 1:
        return None
    return res[1:]


def function(api: str) -> Callable[..., Any]:
    """Return the backend function ``api`` for a hot loop that checks with :func:`check`."""
    fn = _fns.get(api)
    if fn is None:
        fn = _resolve(api)
    return fn


#: Called, in registration order, when the machine behind the backend is replaced: the
#: backend forgotten (:func:`reset_backend`) or the simulated machine made anew
#: (``sim.reset()``). Library modules that keep something of one machine (retained
#: contexts, peer access, loaded kernel modules, default pools and their caches)
#: register the function that forgets it, so that neither this layer nor the simulator
#: imports them (a plug-in point, like ``_stream.stream_close_hooks``).
reset_hooks: list[Callable[[], None]] = []


def machine_replaced() -> None:
    """Run the :data:`reset_hooks`: what the library kept of the old machine is forgotten."""
    for hook in list(reset_hooks):
        hook()


def reset_backend() -> None:
    """Forget the loaded backend (tests; the CLI's fallback). Objects made before are invalid."""
    global _active, _mod, _chosen
    with _lock:
        _active = None
        _mod = None
        _chosen = None
        _fns.clear()
    machine_replaced()

