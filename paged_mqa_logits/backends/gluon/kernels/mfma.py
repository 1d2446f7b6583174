"""Device code of the CDNA ``mfma`` variant (gfx942 / gfx950): the atoms it hands the
register-MMA kernel body (``kernels/register_mma.py``): buffer-load gathers, the fp8 MFMA
(plain and ``f8f6f4``), the accumulator layout, and the ``KeyLoad=lds`` key layouts and operand
conversions. The knobs and resource rules that pick among them are the host side, ``mfma.py``
and ``cdna_keys.py``.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .register_mma import relu_bf16, weight_rows

NUM_WARPS = 4  # one wave per SIMD of the CU
#: bytes of one token's keys (head_dim 128, fp8): one row of a plain cache block
ROW_BYTES = 128
#: bytes one lane reads per load instruction when the cache is 16-byte aligned
VECTOR_BYTES = 16


# ----------------------------------------------------------------------------- atoms
@gluon.jit
def buffer_gather(base, offsets, mask, other):
    """32-bit offsets from a uniform 64-bit base: one buffer descriptor, no per-lane 64-bit math."""
    return gl.amd.cdna3.buffer_load(base, offsets, mask=mask, other=other)


@gluon.jit
def cache_gather(base, offsets, KV_32BIT: gl.constexpr):
    """Cache bytes at 64-bit ``offsets``: buffer loads when the cache fits 31 bits, else global."""
    if KV_32BIT:
        return gl.amd.cdna3.buffer_load(base, offsets.to(gl.int32))
    else:
        return gl.load(base + offsets)


@gluon.jit
def mfma_fp8(a, b, acc):
    return gl.amd.cdna3.mfma(a, b, acc)


@gluon.jit
def mfma_f8f6f4(a, b, acc):
    # No scale tensors: unit e8m0 scales, so this is the plain fp8 product.
    return gl.amd.cdna4.mfma_scaled(a, None, "e4m3", b, None, "e4m3", acc)


def mfma_layout(arch: str, heads: int, chunk: int, kind: str) -> gl.amd.AMDMFMALayout:
    """The accumulator layout (see the module docstring for why this shape)."""
    tile = 32 if chunk // NUM_WARPS >= 32 and heads % 32 == 0 else 16
    k = {("fp8", 32): 16, ("fp8", 16): 32, ("f8f6f4", 32): 64, ("f8f6f4", 16): 128}[(kind, tile)]
    return gl.amd.AMDMFMALayout(version=3 if arch == "gfx942" else 4, instr_shape=[tile, tile, k],
                                transposed=False, warps_per_cta=[1, NUM_WARPS])


# ----------------------------------------------------------------------------- KeyLoad=lds
# ----------------------------------------------------------------------------- device side
@gluon.constexpr_function
def gather_layout(tile_tokens, num_warps, threads_per_warp):
    """``[D, ChunkK]`` keys, the dim fastest: a lane holds 16 contiguous bytes of each of its
    ``tile_tokens / 8`` tokens, 8 lanes cover a 128-byte row, so one load instruction of a wave
    reads 8 whole rows; a wave covers ``tile_tokens`` consecutive tokens and the waves take
    consecutive groups, round-robin, as the MFMA accumulator's ``warps_per_cta = [1, W]`` does."""
    lanes_per_row = ROW_BYTES // VECTOR_BYTES
    return gl.BlockedLayout([VECTOR_BYTES, tile_tokens // (threads_per_warp // lanes_per_row)],
                            [lanes_per_row, threads_per_warp // lanes_per_row], [1, num_warps], [0, 1])


@gluon.jit
def keys_to_operand(keys, B_LAYOUT: gl.constexpr):
    """Gathered keys -> the MFMA B operand (32x32 tiles: Triton lowers it through LDS)."""
    return gl.convert_layout(keys, B_LAYOUT)


@gluon.constexpr_function
def staging_layout():
    """``[D, ChunkK]`` fp8 in LDS, rows of 128 bytes, 16-byte vectors: XOR-swizzled by row (8
    phases), so the 8 lanes writing one row and the lanes reading 16 bytes of 8 consecutive rows
    at the same dim land on 8 different 16-byte bank groups (128 bytes of distinct banks)
    instead of one."""
    return gl.SwizzledSharedLayout(VECTOR_BYTES, 1, ROW_BYTES // VECTOR_BYTES, [0, 1])


@gluon.jit
def keys_through_lds(keys, B_LAYOUT: gl.constexpr):
    """Gathered keys -> the MFMA B operand through an explicit LDS round trip (16x16 tiles)."""
    staged = gl.allocate_shared_memory(keys.dtype, keys.shape, staging_layout(), keys)
    return staged.load(B_LAYOUT)


# ----------------------------------------------------------------------------- HeadSum=tensor
@gluon.constexpr_function
def head_sum_k_width(acc):
    """bf16 values per lane and K block of the head-sum MFMA: 8 for gfx950's ``32x32x16`` /
    ``16x16x32`` bf16 MFMA, 4 for gfx942's ``32x32x8`` / ``16x16x16``."""
    return 8 if acc.version == 4 else 4


@gluon.constexpr_function
def head_sum_layout(acc):
    """The bf16 MFMA of the head sum, on the score MFMA's tile and waves: its B operand ``[H, T]``
    then holds, per lane, the same token and the same heads as the score accumulator, so the
    conversion moves no data between lanes (the heads only change order, :func:`operand_heads`)."""
    tile = acc.instr_shape[0]
    k = head_sum_k_width(acc) * (64 // tile)
    return gl.amd.AMDMFMALayout(version=acc.version, instr_shape=[tile, tile, k], transposed=False,
                                warps_per_cta=acc.warps_per_cta)


@gluon.jit
def operand_heads(x, K_BLOCK: gl.constexpr, K_WIDTH: gl.constexpr):
    """``x`` ``[H, ...]`` with its heads reordered into the head-sum MFMA's K order: a lane of the
    score accumulator holds groups of 4 heads, ``K_WIDTH / 4`` groups a K block apart; the bf16
    operand wants ``K_WIDTH`` consecutive K. Reordering the weights the same way leaves the sum."""
    GROUPS: gl.constexpr = K_WIDTH // 4
    LANES: gl.constexpr = K_BLOCK // K_WIDTH
    H: gl.constexpr = x.shape[0]
    if GROUPS == 1:
        return x
    else:
        if len(x.shape) == 1:
            y = gl.permute(gl.reshape(x, [H // K_BLOCK, GROUPS, LANES, 4]), [0, 2, 1, 3])
            return gl.reshape(y, [H])
        else:
            y = gl.permute(gl.reshape(x, [H // K_BLOCK, GROUPS, LANES, 4, x.shape[1]]), [0, 2, 1, 3, 4])
            return gl.reshape(y, [H, x.shape[1]])


@gluon.jit
def mfma_bf16_head_sum(scores, scales, weights):
    """``HeadSum=tensor``: ``sum_h w[h] * relu(scores[h, t])`` as a bf16 MFMA ``W[TILE, H] @
    relu(S)[H, T]`` whose row 0 holds ``bf16(w)`` and row 1 ``bf16(w - bf16(w))``, the two
    output rows added in fp32, times the token scales. Weights are loop-invariant: their split
    and operand are hoisted out of the tile loop."""
    ACC: gl.constexpr = scores.type.layout
    HS: gl.constexpr = head_sum_layout(ACC)
    K_WIDTH: gl.constexpr = head_sum_k_width(ACC)
    K_BLOCK: gl.constexpr = HS.instr_shape[2]
    TILE: gl.constexpr = HS.instr_shape[0]
    A: gl.constexpr = gl.DotOperandLayout(0, HS, K_WIDTH)
    b = gl.convert_layout(operand_heads(relu_bf16(scores), K_BLOCK, K_WIDTH), gl.DotOperandLayout(1, HS, K_WIDTH))
    a = weight_rows(operand_heads(weights, K_BLOCK, K_WIDTH), TILE, A)
    out = gl.amd.cdna3.mfma(a, b, gl.zeros([TILE, scores.shape[1]], gl.float32, HS))
    # rows 4a + 2b + c: registers hold c and b; keep b = 0, add c = 0 (hi) and 1 (lo), sum the
    # (zero but for a = 0) rows a
    quads = gl.permute(gl.reshape(out, [TILE // 4, 2, 2, scores.shape[1]]), [0, 3, 1, 2])
    hi_rows, lo_rows = gl.split(quads)
    hi_row, _ = gl.split(hi_rows)
    lo_row, _ = gl.split(lo_rows)
    return gl.convert_layout(gl.sum(hi_row + lo_row, axis=0), scales.type.layout) * scales
