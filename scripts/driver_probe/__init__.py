"""The cases of ``scripts/gpu_probe.py``: a framework and one module per feature.

``_framework``  call helpers (``call``, ``qcall``, ``ok``), dry-mode fakes, JSON values
                (``jv``, ``tv``), the ``Case`` recorder, the ``@probe`` registry, ``Ctx``
``_helpers``    locations, resources freed at case end, ``ctx_after``, ``ptr_attrs``
``_runner``     child processes, crash recovery, case selection, JSON file, summary
``core`` (A), ``pinned`` (B), ``managed`` (C), ``vmm`` (D), ``pool`` (E), ``peer`` (F,
                two devices), ``capture`` (G, stream capture and graph memory): the cases

:func:`load` imports the feature modules in :data:`FEATURES` order, which is the
order the cases run in.
"""

from __future__ import annotations

import importlib

# feature modules, in run order; a new feature module is added here
FEATURES = ("core", "pinned", "managed", "vmm", "pool", "peer", "capture")


def load() -> list:
    """Import every feature module; return the registry (a list of ``Probe``)."""
    for name in FEATURES:
        importlib.import_module(f"{__name__}.{name}")
    from ._framework import CASES

    return list(CASES)
