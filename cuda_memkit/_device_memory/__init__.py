"""Device memory from ``cuMemAlloc``: ``DeviceBuffer``."""
