"""Feeding the GPU from worker processes: :class:`~cuda_memkit.Loader`, over a shared ring."""
