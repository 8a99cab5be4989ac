"""``python -m cuda_memkit [--backend cuda|sim] [info|stats|doctor|tour]``: see ``--help``."""

from __future__ import annotations

import sys

from ._cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
