"""sm_90 MXFP4 variant of the ``gluon`` backend: e2m1 queries and keys widened to e4m3 in
registers and scored by the fp8 ``wgmma`` of ``wgmma.py``.

Why widening is exact: an e2m1 value times ``2^s`` is an e4m3 value for every ``s`` in -8..6
(the values span 0.5 * 2^-8 = 2^-9, e4m3's smallest subnormal, to 6 * 2^6 = 384 <= 448). A token
whose largest group exponent is ``M`` becomes e4m3 bytes of ``value * 2^(6 - (M - e_g))`` per
group ``g`` and one factor ``2^(M - 127 - 6)``, which plays the part of the fp8 path's per-token
key scale (applied after the head sum: it is positive, so it commutes with the ReLU). A query
head is widened the same way and its factor is folded into its weight (``w * relu(s * x) = (w *
s) * relu(x)``, s > 0). The tile is then an ordinary fp8 wgmma tile and
``wgmma.score_tile`` (row groups, 128-token halves, epilogue, store) runs unchanged.

The widening is two ``prmt`` byte permutes per four codes (the hot path; :func:`_widen_words`):
the eight e4m3 bytes of a group's magnitudes at its shift are two 32-bit *table words*
(:func:`_table_words`, computed once per token and group), a code's 3-bit magnitude indexes
them, and a second ``prmt`` gathers the codes' sign bits into the bytes' top bits.
The host module (``backends/gluon/wgmma_fp4.py``: ``widen_word``, ``e4m3_table_words``) holds
the plain-torch model of exactly these formulas, checked exhaustively on CPU
(``tests/backends/gluon/test_wgmma_fp4_host.py``).

Structure: the schedules (``split`` / ``balanced``) and segment walk of ``wgmma.py``;
per tile, the keys' packed words and exponent words are loaded with plain loads into registers
one tile ahead (so their latency overlaps the widening and scoring of the current tile), widened,
stored into one NVMMA-swizzled key tile (viewed as int32 words: the 128-byte swizzle moves the
same bytes whatever the element width) with the token factors beside it, fenced for the async
proxy, then scored. Preshuffled caches are declined by the host side.

The host side (knobs, resources, launch plan, compile matrix) is ``backends/gluon/wgmma_fp4.py``.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ....triton_internals.gluon_api import fence_async_shared, reinterpret_shared, thread_barrier
from . import device
from .device import DYNAMIC_PARAMS
from .wgmma import (NUM_WARPS, allocate_headsum_weights, gather, issue_end, load_weights, part_groups, row_limits,
                    score_tile, score_tile_tensor, single_group_weights, tensor_operands, tile_smem_layout,
                    vec_smem_layout)

# The widening's constants (the host module's torch model, ``wgmma_fp4.widen_word``, reads them
# from here). A group of a row is written as e4m3 bytes of ``value * 2^s`` with ``s = 6 - spread``,
# ``spread = M - e_g`` the binades it sits below the row's largest exponent ``M``.
#: the largest ``M - e_g`` (binades a group sits below its token's largest) widened exactly
E4M3_SPREAD_LIMIT = 14
#: e4m3 bytes of ``E2M1_VALUES[m] * 2^(6 - spread)`` as two little-endian words (codes 0-3,
#: codes 4-7) where some are e4m3 subnormals, which the arithmetic rule below does not give
SUBNORMAL_LOW_WORDS = {12: 0x0C080400, 13: 0x06040200, 14: 0x03020100}
SUBNORMAL_HIGH_WORDS = {14: 0x0C080604}
#: the arithmetic rule: for a normal result, code ``m >= 2`` is e4m3 byte ``(m << 2) + (6 + s) << 3``
#: (exponent field ``(m >> 1) + 6 + s``, mantissa bit ``m & 1``) and code 1 (0.5) is ``(6 + s) << 3``;
#: with ``s = 6 - spread`` each word is ``BASE + (12 - spread) * STEP`` per byte
LOW_BASE, LOW_STEP = 0x0C080000, 0x08080800
HIGH_BASE, HIGH_STEP = 0x1C181410, 0x08080808
#: PTX ``prmt`` selectors that gather the eight codes' sign bits: byte ``i`` of a packed word
#: holds codes ``2i`` (sign at bit 3) and ``2i + 1`` (sign at bit 7), so bytes of ``word << 4``
#: (low nibble's sign moved to bit 7) and of ``word`` interleave into the sign bytes of codes
#: 0-3 and of codes 4-7
SIGN_LOW_SELECTOR = 0x5140
SIGN_HIGH_SELECTOR = 0x7362

# Device copies of the facts the kernel reads (jitted code may only read constexpr globals).
_WARPS = gl.constexpr(NUM_WARPS)
_D = gl.constexpr(128)  # elements of a key / query head
_WORDS = gl.constexpr(16)  # 32-bit words of them
_SPREAD_LIMIT = gl.constexpr(E4M3_SPREAD_LIMIT)
_LOW_BASE = gl.constexpr(LOW_BASE)
_LOW_STEP = gl.constexpr(LOW_STEP)
_HIGH_BASE = gl.constexpr(HIGH_BASE)
_HIGH_STEP = gl.constexpr(HIGH_STEP)
_LOW_12 = gl.constexpr(SUBNORMAL_LOW_WORDS[12])
_LOW_13 = gl.constexpr(SUBNORMAL_LOW_WORDS[13])
_LOW_14 = gl.constexpr(SUBNORMAL_LOW_WORDS[14])
_HIGH_14 = gl.constexpr(SUBNORMAL_HIGH_WORDS[14])

# The widening of one packed word (eight codes, in element order) into two words of e4m3 bytes,
# given its group's table words (``wgmma_fp4.widen_word``): magnitude bytes by a prmt on the
# 3-bit codes (a prmt selector reads the low 16 bits: four codes), sign bytes by a byte prmt of
# ``word << 4`` and ``word`` that puts every code's sign bit at its byte's top bit; nine
# instructions per word once ptxas merges each ``and``/``or`` pair into one LOP3.
_WIDEN_ASM = gl.constexpr(f"""{{
.reg .b32 sel, mag, sgn, shifted, hi;
shl.b32 shifted, $2, 4;
and.b32 sel, $2, 0x77777777;
prmt.b32 mag, $3, $4, sel;
prmt.b32 sgn, shifted, $2, {SIGN_LOW_SELECTOR:#06x};
and.b32 sgn, sgn, 0x80808080;
or.b32 $0, mag, sgn;
shr.u32 hi, sel, 16;
prmt.b32 mag, $3, $4, hi;
prmt.b32 sgn, shifted, $2, {SIGN_HIGH_SELECTOR:#06x};
and.b32 sgn, sgn, 0x80808080;
or.b32 $1, mag, sgn;
}}""")


# ----------------------------------------------------------------------------- layouts
# WORDS: [rows, 4 groups, 4 words] packed int32: a thread holds one group (16 bytes) of one row,
#   4 threads a row, a warp 8 rows, the warpgroup 32 (taller tiles repeat over registers); a
#   group's table words are then computed once per thread and row.
# WIDE_SMEM: the widened tile as [rows, 32] int32 words in the 128-byte swizzle of the fp8
#   [rows, 128] wgmma operand (wgmma.tile_smem_layout) over the same bytes.
@gluon.constexpr_function
def _words_layout():
    return gl.BlockedLayout([1, 1, 4], [8, 4, 1], [_WARPS, 1, 1], [2, 1, 0])


@gluon.constexpr_function
def _wide_smem_layout():
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)


# ----------------------------------------------------------------------------- widening
@gluon.jit
def _table_words(spread):
    """``wgmma_fp4.e4m3_table_words``: the e4m3 bytes of the eight magnitudes of a group ``spread``
    binades below its row's largest exponent, as (codes 0-3, codes 4-7) words."""
    low = _LOW_BASE + (12 - spread) * _LOW_STEP
    high = _HIGH_BASE + (12 - spread) * _HIGH_STEP
    low = gl.where(spread == 12, _LOW_12, gl.where(spread == 13, _LOW_13, gl.where(spread == 14, _LOW_14, low)))
    high = gl.where(spread == 14, _HIGH_14, high)
    beyond = spread > _SPREAD_LIMIT
    return gl.where(beyond, 0, low), gl.where(beyond, 0, high)


@gluon.jit
def _largest_exponent(exponent_words):
    """``M``: the largest of the four ue8m0 bytes of each word."""
    e0 = exponent_words & 0xFF
    e1 = (exponent_words >> 8) & 0xFF
    e2 = (exponent_words >> 16) & 0xFF
    e3 = (exponent_words >> 24) & 0xFF
    return gl.maximum(gl.maximum(e0, e1), gl.maximum(e2, e3))


@gluon.jit
def _row_factor(top):
    """``wgmma_fp4.scale_of_exponent``: fp32 ``2^(M - 127 - 6)`` from the bits (subnormal below M = 7)."""
    return gl.where(top > 6, (top - 6) << 23, 1 << gl.minimum(top + 16, 22)).to(gl.float32, bitcast=True)


@gluon.jit
def _widen_words(words, exponent_words, ROWS: gl.constexpr):
    """Packed words ``[ROWS, 4, 4]`` (layout :func:`_words_layout`) and their rows' exponent
    words ``[ROWS]`` -> ``(e4m3 bytes as [ROWS, 32] int32 words, the rows' fp32 factors)``."""
    layout: gl.constexpr = _words_layout()
    top = _largest_exponent(exponent_words)  # [ROWS]
    group = gl.arange(0, 4, gl.SliceLayout(0, gl.SliceLayout(2, layout)))
    exponents = (exponent_words[:, None] >> (group * 8)[None, :]) & 0xFF  # [ROWS, 4]
    low, high = _table_words(top[:, None] - exponents)
    low3 = gl.broadcast(gl.expand_dims(low, 2), words)[0]
    high3 = gl.broadcast(gl.expand_dims(high, 2), words)[0]
    first, second = gl.inline_asm_elementwise(_WIDEN_ASM, "=r,=r,r,r,r", [words, low3, high3],
                                              dtype=(gl.int32, gl.int32), is_pure=True, pack=1)
    wide = gl.reshape(gl.join(first, second), [ROWS, 2 * _WORDS])  # word 2i: elements 8i..8i+3
    return wide, _row_factor(top)


# ----------------------------------------------------------------------------- loads
@gluon.jit
def _load_tile(words_ptr, table_row, tile, end, stride_block, num_blocks, CHUNK: gl.constexpr,
               KV_BLOCK_SIZE: gl.constexpr):
    """Registers ``(packed key words [CHUNK, 4, 4], exponent words [CHUNK])`` of ``tile``'s
    tokens ``< end`` (zeros past it: they widen to zeros and are never stored). ``words_ptr``
    is the cache as 32-bit words (block stride a multiple of 4 bytes, checked on the host)."""
    layout: gl.constexpr = _words_layout()
    row_layout: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, layout))
    tokens = tile * CHUNK + gl.arange(0, CHUNK, row_layout)
    valid = tokens < end
    pages = device.tile_pages(table_row, tokens, end, num_blocks, KV_BLOCK_SIZE, gather)
    block_words = pages * (stride_block // 4)
    slot = tokens % KV_BLOCK_SIZE
    exponent_words = gl.load(words_ptr + block_words + KV_BLOCK_SIZE * _WORDS + slot, mask=valid, other=0.0)
    g = gl.arange(0, 4, gl.SliceLayout(1, gl.SliceLayout(0, layout)))
    w = gl.arange(0, 4, gl.SliceLayout(0, gl.SliceLayout(0, layout)))
    in_row = g[:, None] * 4 + w[None, :]  # [4 groups, 4 words]
    row_start = block_words + slot * _WORDS
    ptrs = words_ptr + gl.expand_dims(gl.expand_dims(row_start, 1), 2) + gl.expand_dims(in_row, 0)
    words = gl.load(ptrs, mask=gl.expand_dims(gl.expand_dims(valid, 1), 2), other=0.0)
    return words.to(gl.int32, bitcast=True), exponent_words.to(gl.int32, bitcast=True)


@gluon.jit
def _widen_query(q_ptr, q_scale_ptr, q_wide, b, stride_q_b, stride_q_j, stride_q_h, stride_qs_b, stride_qs_j,
                 NEXT_N: gl.constexpr, NEXT_N_POW2: gl.constexpr, HEADS: gl.constexpr):
    """Sequence ``b``'s query heads widened into ``q_wide`` (row ``j * H + h``; rows past
    ``NEXT_N * H`` zero); returns each head's fp32 factor ``2^(Mq - 133)`` in the vector layout
    of ``wgmma.load_weights``. q rows may sit at any byte address: their bytes are
    loaded one by one and assembled into words (once per segment, off the hot path)."""
    ROWS: gl.constexpr = NEXT_N_POW2 * HEADS
    layout: gl.constexpr = _words_layout()
    bytes_layout: gl.constexpr = gl.BlockedLayout([1, 1, 4, 4], [8, 4, 1, 1], [_WARPS, 1, 1, 1], [3, 2, 1, 0])
    m = gl.arange(0, ROWS, gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, bytes_layout))))
    within: gl.constexpr = gl.SliceLayout(0, bytes_layout)  # [group, word, byte] of a row
    g = gl.arange(0, 4, gl.SliceLayout(1, gl.SliceLayout(2, within)))
    w = gl.arange(0, 4, gl.SliceLayout(0, gl.SliceLayout(2, within)))
    k = gl.arange(0, 4, gl.SliceLayout(0, gl.SliceLayout(1, within)))
    shift = 8 * gl.arange(0, 4, gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, bytes_layout))))
    row = b.to(gl.int64) * stride_q_b + (m // HEADS) * stride_q_j + (m % HEADS) * stride_q_h
    in_row = (g[:, None] * 16 + w[None, :] * 4)[:, :, None] + k[None, None, :]  # byte of (group, word, k)
    ptrs = q_ptr + row[:, None, None, None] + in_row[None, :, :, :]
    live = (m < NEXT_N * HEADS)[:, None, None, None]
    q_bytes = gl.load(ptrs, mask=live, other=0).to(gl.int32)
    words = gl.convert_layout(gl.sum(q_bytes << shift[None, None, None, :], axis=3), layout)

    row_layout: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, layout))
    mr = gl.arange(0, ROWS, row_layout)
    exponent_words = gl.load(q_scale_ptr + b.to(gl.int64) * stride_qs_b + (mr // HEADS) * stride_qs_j + mr % HEADS,
                             mask=mr < NEXT_N * HEADS, other=0)
    wide, factor = _widen_words(words, exponent_words, ROWS)
    q_wide.store(wide)
    return gl.convert_layout(factor, gl.BlockedLayout([1], [32], [_WARPS], [0]))


# ----------------------------------------------------------------------------- the kernel
@gluon.jit
def _score_segment(q_ptr, q_scale_ptr, words_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr,
                   key_wide, factor_smem, q_wide, weight_smem, limit_smem, headsum_smem, b, first, step, n_given,
                   stride_q_b, stride_q_j, stride_q_h, stride_qs_b, stride_qs_j, stride_block, stride_w, stride_out,
                   stride_lens_b, stride_lens_j, stride_table, max_model_len, max_blocks, num_blocks,
                   NEXT_N: gl.constexpr, NEXT_N_POW2: gl.constexpr, HEADS: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr,
                   CHUNK: gl.constexpr, ROWS_PER_MMA: gl.constexpr, LENS_2D: gl.constexpr, BALANCED: gl.constexpr,
                   HEAD_SUM: gl.constexpr):
    """Tiles ``first, first + step, ...`` of sequence ``b`` (``n_given`` of them when
    balanced, else all it has from ``first`` on), as ``wgmma._score_segment`` walks
    them; the shared memory is the caller's, reused from segment to segment. With ``HEAD_SUM``
    the head sum runs on the tensor cores (``wgmma.score_tile_tensor``), which frees the
    warpgroup's issue slots for the widening."""
    vec_layout: gl.constexpr = gl.BlockedLayout([1], [32], [_WARPS], [0])
    key_tile = reinterpret_shared(key_wide, gl.float8e4nv, [CHUNK, _D], tile_smem_layout())
    q_tile = reinterpret_shared(q_wide, gl.float8e4nv, [NEXT_N_POW2 * HEADS, _D], tile_smem_layout())
    table_row = table_ptr + b.to(gl.int64) * stride_table
    GROUPS: gl.constexpr = part_groups(NEXT_N, ROWS_PER_MMA, 0, 1)

    seq_len = device.sequence_length(lens_ptr, b, stride_lens_b, stride_lens_j, NEXT_N, LENS_2D)
    end = device.visible_end(seq_len, max_model_len, max_blocks, KV_BLOCK_SIZE)
    if BALANCED:
        n = n_given
    else:
        n = gl.cdiv(gl.cdiv(end, CHUNK) - first, step)
    if n > 0:
        words, exponent_words = _load_tile(words_ptr, table_row, first, end, stride_block, num_blocks, CHUNK,
                                           KV_BLOCK_SIZE)
        head_factor = _widen_query(q_ptr, q_scale_ptr, q_wide, b, stride_q_b, stride_q_j, stride_q_h,
                                   stride_qs_b, stride_qs_j, NEXT_N, NEXT_N_POW2, HEADS)
        weights = load_weights(weights_ptr, b, stride_w, NEXT_N, NEXT_N_POW2, HEADS, vec_layout)
        weight_smem.store(weights * head_factor)  # the query heads' factors ride on the weights
        limit_smem.store(row_limits(lens_ptr, b, seq_len, end, stride_lens_b, stride_lens_j,
                                     gl.arange(0, NEXT_N_POW2, vec_layout), NEXT_N, LENS_2D))
        thread_barrier()  # the weights, seen by every thread
        if HEAD_SUM:
            limits = tensor_operands(weight_smem, headsum_smem, lens_ptr, b, seq_len, end, stride_lens_b,
                                     stride_lens_j, NEXT_N, HEADS, ROWS_PER_MMA, LENS_2D, CHUNK, GROUPS, 0)
        else:
            weight_regs = single_group_weights(weight_smem, NEXT_N, HEADS, ROWS_PER_MMA)
        for i in range(n):
            tile = first + i * step
            # the next tile's loads go out before this one is widened and scored
            next_words, next_exponents = _load_tile(words_ptr, table_row, tile + step, issue_end(i + 1, n, end),
                                                    stride_block, num_blocks, CHUNK, KV_BLOCK_SIZE)
            wide, factor = _widen_words(words, exponent_words, CHUNK)
            thread_barrier()  # every thread's wgmma and factor reads of the previous tile are done
            key_wide.store(wide)
            factor_smem.store(factor)
            fence_async_shared()  # the tile (and, the first time, Q) visible to wgmma's async proxy
            thread_barrier()  # ... from every thread
            if HEAD_SUM:
                score_tile_tensor(key_tile, q_tile, factor_smem, headsum_smem, limits, out_ptr, b, tile, stride_out,
                                  NEXT_N, HEADS, CHUNK, ROWS_PER_MMA, GROUPS, 0)
            else:
                score_tile(key_tile, q_tile, factor_smem, weight_regs, weight_smem, limit_smem, out_ptr, b, tile,
                           stride_out, NEXT_N, HEADS, CHUNK, ROWS_PER_MMA)
            words = next_words
            exponent_words = next_exponents
    thread_barrier()  # everyone is done with Q, the tile and the vectors before the next segment


@gluon.jit(do_not_specialize=DYNAMIC_PARAMS)
def fp4_wgmma_logits_kernel(
    q_ptr, kv_bytes_ptr, kv_words_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr,
    stride_q_b, stride_q_j, stride_q_h,
    stride_block,  # bytes between cache blocks (multiple of 4)
    stride_w, stride_out, stride_lens_b, stride_lens_j, stride_table,
    max_model_len, max_blocks, num_splits, batch, num_blocks,
    q_scale_ptr, stride_qs_b, stride_qs_j,
    NEXT_N: gl.constexpr, NEXT_N_POW2: gl.constexpr, HEADS: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr,
    CHUNK: gl.constexpr, ROWS_PER_MMA: gl.constexpr, LENS_2D: gl.constexpr, BALANCED: gl.constexpr,
    HEAD_SUM: gl.constexpr = 0,
):
    """The arguments of every Gluon kernel (``common.kernel_arguments``; ``kv_bytes_ptr`` is
    unused: the cache is read as 32-bit words through ``kv_words_ptr``), then the query
    exponents. Balanced: program ``p`` scores its equal share of the batch's tiles; split:
    program ``(split, b)`` tiles ``split, split + num_splits, ...`` of sequence ``b``."""
    vec_smem: gl.constexpr = vec_smem_layout()
    Q_ROWS: gl.constexpr = NEXT_N_POW2 * HEADS
    key_wide = gl.allocate_shared_memory(gl.int32, [CHUNK, 2 * _WORDS], _wide_smem_layout())
    factor_smem = gl.allocate_shared_memory(gl.float32, [CHUNK], vec_smem)
    q_wide = gl.allocate_shared_memory(gl.int32, [Q_ROWS, 2 * _WORDS], _wide_smem_layout())
    weight_smem = gl.allocate_shared_memory(gl.float32, [Q_ROWS], vec_smem)
    limit_smem = gl.allocate_shared_memory(gl.int32, [NEXT_N_POW2], vec_smem)
    headsum_smem = allocate_headsum_weights(weight_smem, NEXT_N, HEADS, ROWS_PER_MMA, 1, 1, HEAD_SUM)

    if BALANCED:
        item, stop, b, tile = device.balanced_share(
            lens_ptr, batch, stride_lens_b, stride_lens_j, max_model_len, max_blocks, gl.program_id(0),
            gl.num_programs(0), NEXT_N, LENS_2D, KV_BLOCK_SIZE, CHUNK, device.scan_layout(32, _WARPS))
        while item < stop:
            count = device.share_run(lens_ptr, b, tile, item, stop, stride_lens_b, stride_lens_j, max_model_len,
                                     max_blocks, NEXT_N, LENS_2D, KV_BLOCK_SIZE, CHUNK)
            if count > 0:  # zero-length sequences between long ones hold no items
                _score_segment(q_ptr, q_scale_ptr, kv_words_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr,
                               key_wide, factor_smem, q_wide, weight_smem, limit_smem, headsum_smem, b, tile, 1,
                               count,
                               stride_q_b, stride_q_j, stride_q_h, stride_qs_b, stride_qs_j, stride_block, stride_w,
                               stride_out, stride_lens_b, stride_lens_j, stride_table, max_model_len, max_blocks,
                               num_blocks, NEXT_N, NEXT_N_POW2, HEADS, KV_BLOCK_SIZE, CHUNK, ROWS_PER_MMA, LENS_2D,
                               BALANCED, HEAD_SUM)
                item += count
            b += 1
            tile = tile * 0
    else:
        _score_segment(q_ptr, q_scale_ptr, kv_words_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr,
                       key_wide, factor_smem, q_wide, weight_smem, limit_smem, headsum_smem, gl.program_id(1),
                       gl.program_id(0),
                       num_splits, 0,
                       stride_q_b, stride_q_j, stride_q_h, stride_qs_b, stride_qs_j, stride_block, stride_w,
                       stride_out, stride_lens_b, stride_lens_j, stride_table, max_model_len, max_blocks, num_blocks,
                       NEXT_N, NEXT_N_POW2, HEADS, KV_BLOCK_SIZE, CHUNK, ROWS_PER_MMA, LENS_2D, BALANCED, HEAD_SUM)
