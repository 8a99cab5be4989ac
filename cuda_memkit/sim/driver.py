"""The CPU simulator's twin of ``cuda.bindings.driver``.

Same function names, call forms and ``(CUresult, *outputs)`` return tuples as
the bindings, reusing their enum and struct types. Select it with
``CUDA_MEMKIT_BACKEND=sim`` or ``cuda_memkit.use_backend("sim")``.
"""

from __future__ import annotations

from ._capture import *  # noqa: F403
from ._contexts import *  # noqa: F403
from ._copy_batch import *  # noqa: F403
from ._core import *  # noqa: F403
from ._kernels import *  # noqa: F403
from ._managed import *  # noqa: F403
from ._peer import *  # noqa: F403
from ._pinned import *  # noqa: F403
from ._pool import *  # noqa: F403
from ._vmm import *  # noqa: F403
