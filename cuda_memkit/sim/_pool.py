"""Simulated driver functions for the pool feature (filled in by its issue)."""

from __future__ import annotations

__all__: list[str] = []
