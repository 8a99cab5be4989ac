"""Host memory: pinned allocations, their block cache, registered host arrays."""
