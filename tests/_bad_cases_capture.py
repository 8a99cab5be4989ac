"""Bad-input cases: capture into CUDA graphs (Stream.begin_capture, Graph, watch_captures)."""

from __future__ import annotations

from types import SimpleNamespace

import cuda_memkit as cm

from ._bad_input_table import case


def _closed_graph(o: SimpleNamespace) -> cm.Graph:
    o.stream.begin_capture()
    graph = o.stream.end_capture()
    graph.close()
    return graph


case("Stream.begin_capture(mode='bogus')", lambda o: o.stream.begin_capture(mode="bogus"),
     ValueError, "mode")
case("Stream.begin_capture(mode=1)", lambda o: o.stream.begin_capture(mode=1), TypeError,
     "mode")
case("Stream.begin_capture(closed stream)", lambda o: o.closed.Stream.begin_capture(),
     cm.ClosedError, "closed")
case("Stream.end_capture(closed stream)", lambda o: o.closed.Stream.end_capture(),
     cm.ClosedError, "closed")
case("Stream.is_capturing(closed stream)", lambda o: o.closed.Stream.is_capturing,
     cm.ClosedError, "closed")
case("Graph() made directly", lambda o: cm.Graph(), TypeError, "end_capture")
case("Graph.launch(closed graph)", lambda o: _closed_graph(o).launch(o.stream),
     cm.ClosedError, "closed")
case("watch_captures(enabled=1)", lambda o: cm.watch_captures(1), TypeError, "enabled")
case("watch_captures(enabled='yes')", lambda o: cm.watch_captures("yes"), TypeError,
     "enabled")
