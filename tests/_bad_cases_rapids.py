"""Bad-input cases, part 5: the Dask integration (cuda_memkit.dask).

Each case imports ``cuda_memkit.dask`` when it runs (skipped where ``distributed`` is not
installed): its options are refused when the plugin is made, before any worker sees it, and
the client functions refuse what is not a ``distributed.Client``.
"""

from __future__ import annotations

from typing import Any

import pytest

from ._bad_input_table import case


def _dask() -> Any:
    pytest.importorskip("distributed")
    import cuda_memkit.dask

    return cuda_memkit.dask


def _plugin(**kw: Any) -> Any:
    return _dask().MemkitPlugin(**kw)


case("MemkitPlugin(device=-1)", lambda o: _plugin(device=-1), ValueError, "device")
case("MemkitPlugin(device='0')", lambda o: _plugin(device="0"), TypeError, "device")
case("MemkitPlugin(device=True)", lambda o: _plugin(device=True), TypeError, "device")
case("MemkitPlugin(reserve=-1)", lambda o: _plugin(reserve=-1), ValueError, "reserve")
case("MemkitPlugin(reserve='lots')", lambda o: _plugin(reserve="lots"), ValueError, "reserve")
case("MemkitPlugin(reserve=1.5)", lambda o: _plugin(reserve=1.5), TypeError, "reserve")
case("MemkitPlugin(release_threshold below reserve)",
     lambda o: _plugin(reserve=2 << 20, release_threshold=1 << 20), ValueError,
     "release_threshold")
case("MemkitPlugin(max_size below reserve)",
     lambda o: _plugin(reserve=2 << 20, max_size=1 << 20), ValueError, "max_size")
case("MemkitPlugin(cache=1)", lambda o: _plugin(cache=1), TypeError, "cache")
case("MemkitPlugin(cache_limit without cache)",
     lambda o: _plugin(cache=False, cache_limit=1 << 20), ValueError, "cache_limit")
case("MemkitPlugin(pinned='yes')", lambda o: _plugin(pinned="yes"), TypeError, "pinned")
case("MemkitPlugin(cupy=1)", lambda o: _plugin(cupy=1), TypeError, "cupy")
case("MemkitPlugin(metrics=None)", lambda o: _plugin(metrics=None), TypeError, "metrics")
case("dask.memory_stats(not a client)", lambda o: _dask().memory_stats(object()), TypeError,
     "client")
case("dask.unregister(not a client)", lambda o: _dask().unregister("tcp://x"), TypeError,
     "client")
