"""Device code of the sm_90 ``mma_v2`` variant: the atoms it hands the register-MMA kernel body
(``kernels/register_mma.py``): ``gl.load`` gathers, the e4m3 ``mma_v2`` and its accumulator
layout. The knobs and resource rules are the host side, ``mma_v2.py``.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ....triton_internals.gluon_api import mma_v2
from .register_mma import relu_bf16, weight_rows


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


@gluon.jit
def mma_bf16_head_sum(scores, scales, weights):
    """The ``HEAD_SUM`` atom of ``HeadSum=tensor`` on ``mma_v2`` (run as the AMD atom's twin by
    the GPU tests): the same ReLU'd bf16 scores and hi/lo weight rows in a bf16 ``m16n8k16``
    product. Its accumulator holds heads where the B operand wants tokens, so the operand comes
    through a layout conversion, and rows 0-1 of the result lie on different lanes (a masked sum)."""
    ACC: gl.constexpr = scores.type.layout
    HS: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=ACC.warps_per_cta, instr_shape=[16, 8])
    b = gl.convert_layout(relu_bf16(scores), gl.DotOperandLayout(1, HS, 2))
    a = weight_rows(weights, 16, gl.DotOperandLayout(0, HS, 2))
    out = mma_v2(a, b, gl.zeros([16, scores.shape[1]], gl.float32, HS))
    row = gl.arange(0, 16, gl.SliceLayout(1, HS))[:, None]
    logits = gl.sum(gl.where(row < 2, out, gl.zeros_like(out)), axis=0)
    return gl.convert_layout(logits, scales.type.layout) * scales
