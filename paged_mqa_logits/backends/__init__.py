"""The backends: every way the package can compute the logits, behind one small interface.

* :mod:`.base` -- the :class:`~.base.Backend` protocol every backend implements, the knob-space
  helpers, and the cross-compilation shapes (``CompileSpec``, ``CompileRecord``);
* :mod:`.registry` -- name -> backend object, loaded on first use;
* ``torch_ref``, ``triton_portable``, ``gluon/``, ``flydsl/`` -- the backends themselves.

The names below are re-exported so ``backends.get(name)`` and friends read as before.
"""

from __future__ import annotations

from .base import (MAX_SPLIT_KV, Backend, CompileRecord, CompileSpec, check_knob_space, describe_allowed,
                   formats_unsupported, kernel_writes_tails, value_allowed)
from .registry import check_config, get, load_error, names, register, why_not

__all__ = ["Backend", "CompileRecord", "CompileSpec", "MAX_SPLIT_KV", "check_config", "check_knob_space",
           "describe_allowed", "formats_unsupported", "get", "kernel_writes_tails", "load_error", "names", "register", "value_allowed",
           "why_not"]
