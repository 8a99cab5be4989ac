"""Managed memory: buffers, range advice and prefetches, policies, prefetch plans."""
