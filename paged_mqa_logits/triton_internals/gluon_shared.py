"""``reinterpret_shared(smem, dtype, shape, layout)``: the same bytes of shared memory seen with
another dtype, shape and layout, as a function Gluon kernels can call on any supported Triton
(the descriptor method is ``_reinterpret`` up to 3.8 and ``reinterpret`` in 3.9). Kernels take it
from :mod:`.gluon_api`, which imports this module on first use."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import shared_memory_descriptor

if hasattr(shared_memory_descriptor, "reinterpret"):
    @gluon.jit
    def reinterpret_shared(smem, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
        return smem.reinterpret(dtype, shape, layout)
else:
    @gluon.jit
    def reinterpret_shared(smem, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
        return smem._reinterpret(dtype, shape, layout)
