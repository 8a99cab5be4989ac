"""Stream-ordered memory pools: pools, pool buffers, attributes, statistics and IPC."""
