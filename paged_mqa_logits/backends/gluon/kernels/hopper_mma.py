"""Device code of the sm_90 ``mma_v2`` variant: the atoms it hands the register-MMA kernel body
(``kernels/register_mma.py``): ``gl.load`` gathers, the e4m3 ``mma_v2`` and its accumulator
layout. The knobs and resource rules are the host side, ``hopper_mma.py``.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ....triton_internals.gluon_api import mma_v2


# ----------------------------------------------------------------------------- atoms
@gluon.jit
def global_gather(base, offsets, mask, other):
    return gl.load(base + offsets, mask=mask, other=other)


@gluon.jit
def cache_gather(base, offsets, KV_32BIT: gl.constexpr):
    return gl.load(base + offsets)


@gluon.jit
def mma_e4m3(a, b, acc):
    return mma_v2(a, b, acc)


def mma_layout(num_warps: int) -> gl.NVMMADistributedLayout:
    return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, num_warps], instr_shape=[16, 8])
