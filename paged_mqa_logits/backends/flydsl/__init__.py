"""FlyDSL backend for gfx942 (fp8 e4m3fnuz) and gfx950 (fp8 e4m3fn).

* ``plan.py``      -- the static work split of a kernel and what it costs (pure Python)
* ``backend.py``   -- the Backend object: what it serves, knobs, guarded launch
* ``algorithm.py`` -- the kernel body, written against an ``ops`` interface
* ``ir.py``        -- those ops as FlyDSL/MLIR builders (the real kernel; imports flydsl)
* ``kernel.py``    -- the ``@flyc.kernel`` / ``@flyc.jit`` launcher (imports flydsl)
* ``emulate.py``   -- those ops on NumPy lanes: the kernel's own code checked on a CPU
* ``build.py``     -- compile-only builds for both archs without a GPU (child processes)

Nothing here imports flydsl at import time; ``ir``/``kernel`` are imported on first use.
"""

from .backend import BACKEND

__all__ = ["BACKEND"]
