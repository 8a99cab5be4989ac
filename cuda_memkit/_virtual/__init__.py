"""Virtual memory management: address ranges, physical memory, mappings, growable buffers."""
