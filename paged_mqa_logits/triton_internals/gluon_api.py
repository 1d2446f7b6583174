"""Gluon kernel-language entry points under one stable set of names across Triton releases.

Kernels use :data:`async_copy` (a module: ``async_copy.async_copy_global_to_shared``,
``commit_group``, ``wait_group``, ``mbarrier_arrive``), :data:`thread_barrier`,
:data:`fence_async_shared`, :data:`warpgroup_mma`, :data:`warpgroup_mma_wait` and
:data:`mma_v2`, :data:`tma` (a module: ``tma.async_copy_global_to_shared``) and the host-side
:data:`TensorDescriptor` from here. What differs:

* ``async_copy.async_copy_global_to_shared`` is ``async_copy.async_load`` from 3.8 on (3.9
  keeps the old name only to raise);
* ``gl.thread_barrier`` is ``gl.barrier`` from 3.7 on;
* ``tma.async_copy_global_to_shared`` is ``tma.async_load`` from 3.8 on;
* ``shared_memory_descriptor._reinterpret`` is ``.reinterpret`` in 3.9 (:data:`reinterpret_shared`).

Triton internals touched: none private (``triton.experimental.gluon.language.nvidia.ampere`` /
``.hopper``); the names are resolved on first use. Verified on Triton 3.6.0 and 3.9.0.
"""

from __future__ import annotations

import importlib
import types

from .lazy import attribute, module_getattr

_AMPERE = "triton.experimental.gluon.language.nvidia.ampere"
_HOPPER = "triton.experimental.gluon.language.nvidia.hopper"


def _async_copy():
    """The cp.async entry points as a module object, so that Gluon resolves
    ``async_copy.<name>`` in a kernel like the real module."""
    real = importlib.import_module(f"{_AMPERE}.async_copy")
    shim = types.ModuleType(f"{__name__}.async_copy",
                            "Gluon cp.async entry points (global -> shared copies, commit and wait groups).")
    # 3.8 renamed async_copy_global_to_shared to async_load (same arguments); 3.9 keeps the old
    # name as a stub that raises, so the new name must win.
    shim.async_copy_global_to_shared = getattr(real, "async_load", None) or real.async_copy_global_to_shared
    shim.commit_group = real.commit_group
    shim.wait_group = real.wait_group
    shim.mbarrier_arrive = real.mbarrier_arrive
    return shim


def _tma():
    """The Hopper TMA entry points as a module object (see :func:`_async_copy`)."""
    real = importlib.import_module(f"{_HOPPER}.tma")
    shim = types.ModuleType(f"{__name__}.tma", "Gluon TMA entry points (tensor-descriptor copies).")
    # 3.8 renamed async_copy_global_to_shared to async_load (same leading arguments)
    shim.async_copy_global_to_shared = getattr(real, "async_load", None) or real.async_copy_global_to_shared
    return shim


def _thread_barrier():
    gl = importlib.import_module("triton.experimental.gluon.language")
    # 3.7 replaced thread_barrier() by barrier(*, cluster=False); both sync the CTA.
    return getattr(gl, "barrier", None) or gl.thread_barrier


_LAZY = {
    "async_copy": _async_copy,
    "thread_barrier": _thread_barrier,
    "fence_async_shared": attribute(_HOPPER, "fence_async_shared"),
    "warpgroup_mma": attribute(_HOPPER, "warpgroup_mma"),
    "warpgroup_mma_wait": attribute(_HOPPER, "warpgroup_mma_wait"),
    "mma_v2": attribute(_AMPERE, "mma_v2"),
    "tma": _tma,
    #: the host-side TMA descriptor a kernel takes as an argument
    "TensorDescriptor": attribute("triton.experimental.gluon.nvidia.hopper", "TensorDescriptor"),
    #: ``smem.reinterpret(dtype, shape, layout)`` (``._reinterpret`` before 3.9) as a function
    "reinterpret_shared": attribute(f"{__package__}.gluon_shared", "reinterpret_shared"),
}

__all__ = sorted(_LAZY)


__getattr__ = module_getattr(__name__, globals(), _LAZY)

