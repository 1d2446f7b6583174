"""``flydsl`` backend (gfx942 / gfx950): see :mod:`paged_mqa_logits.backends.flydsl`.

Importing this module never imports flydsl; :func:`compile_candidates` builds the kernels for
either arch on a machine without a GPU.
"""

from .flydsl.backend import BACKEND
from .flydsl.build import compile_candidates

__all__ = ["BACKEND", "compile_candidates"]
