"""Bad-input cases: statistics and tracking."""

from __future__ import annotations

import cuda_memkit as cm

from ._bad_input_table import case

# == statistics and tracking =============================================================

case("memory_stats(device='0')", lambda o: cm.memory_stats("0"), TypeError, "device")
case("memory_stats(device=-1)", lambda o: cm.memory_stats(-1), ValueError, "device")
case("memory_stats(device=True)", lambda o: cm.memory_stats(True), TypeError, "device")
case("reset_peak_stats(device=1.0)", lambda o: cm.reset_peak_stats(1.0), TypeError, "device")
case("reset_peak_stats(device=-2)", lambda o: cm.reset_peak_stats(-2), ValueError, "device")
case("track(stacks='yes')", lambda o: cm.track("yes"), TypeError, "stacks")
case("track(threads='mine')", lambda o: cm.track(threads="mine"), ValueError, "threads")
case("track(threads=1)", lambda o: cm.track(threads=1), TypeError, "threads")


def _reentered(o):  # type: ignore[no-untyped-def]
    t = cm.track()
    with t:
        pass
    with t:  # a tracker records once
        pass


case("Tracker re-entered", _reentered, RuntimeError, "track")
case("Tracker.save(unwritable path)",
     lambda o: cm.track().save("/nonexistent-dir/x/track.json"), FileNotFoundError,
     "nonexistent|track")
