"""The register-MMA kernel shared by the AMD (MFMA) and sm_90 (``mma_v2``) variants.

One ``@gluon.jit`` kernel body, :func:`register_mma_logits_kernel`, serves gfx942, gfx950 and
sm_90. Everything an arch changes comes in as constexpr *arch atoms*:

* ``ACC``: the accumulator layout (``AMDMFMALayout`` or ``NVMMADistributedLayout`` v2) of the
  ``[H, ChunkK]`` scores, warps side by side along the tokens (``warps_per_cta = [1, W]``), so
  every warp holds all heads of its tokens and the head reduction never leaves the warp;
* ``K_WIDTH``: the dot-operand packing (16 fp8 = 16 contiguous bytes per lane, so keys and
  queries are loaded straight into the operand layouts with 16-byte loads on both arches);
* ``MMA(a, b, acc)``: ``cdna3.mfma``, ``cdna4.mfma_scaled`` or ``mma_v2``;
* ``LOAD(base, offsets, mask, other)``: a gather from a scalar 64-bit base with 32-bit offsets
  (AMD: ``buffer_load``; NVIDIA: ``gl.load``);
* ``LOAD_KV(base, offsets, KV_32BIT)``: a gather from the KV cache with 64-bit offsets (AMD:
  ``buffer_load`` when the host proved the whole cache lies within 2^31 bytes of its base,
  else ``gl.load`` on 64-bit addresses; NVIDIA: ``gl.load``);
* ``THREADS_PER_WARP``: 64 (AMD) or 32 (NVIDIA), for the staging layouts.

Everything else (row lengths, the split's chunk range, block-table walk, paged key / scale
byte offsets, Preshuffle, the ReLU-weight head reduction, the masked stores) is the code
below, so the H200 runs of the ``mma_v2`` variant execute exactly the index, mask and epilogue
code the AMD kernels run.

Work decomposition (``schedule.py``). A program covers ``ROWS`` consecutive query rows
``j = g*ROWS .. g*ROWS+ROWS-1`` (row group ``g``; ``ROWS`` is 1 for the per-row variant,
``next_n`` for the shared-KV one) over a range of tiles: with ``Schedule=split`` it owns
``(sequence b, KV split s, row group g)`` and an even share of ``b``'s tiles; with
``Schedule=balanced`` the grid is one persistent wave per row group and each program takes an
equal share of the whole batch's tiles, found by :func:`balanced_share` (an in-kernel prefix
sum over the lengths), walking it sequence by sequence (:func:`score_rows_segment` per
segment: query rows and weights are reloaded when the sequence changes). Per ``ChunkK``-token
tile of its range it gathers the keys and scales once, then for each of its rows runs
``scores[H, ChunkK] = Q_j[H, D] @ K^T[D, ChunkK]`` and stores
``sum_h w[j, h] * relu(scores[h, t] * scale[t])`` where the row sees ``t``.
Query rows live in registers, or in shared memory when ``Q_IN_LDS``. With ``PREFETCH`` tiles
are register-double-buffered: the keys of tile ``c + 1`` and the block-table entries of tile
``c + 2`` are in flight while tile ``c`` is scored; without, a wave holds one tile and relies
on the other waves of its CU to hide the latency (half the key registers).

Row semantics (``problem.py``): ``row_len = max(L_b - next_n + j + 1, 0)`` (1-D lengths) or
``max(lens[b, j], 0)`` (2-D); the sequence length sizing the work is ``L_b`` / ``max_j``; row
``j`` sees ``t < min(row_len, max_model_len, max_blocks * kv_block_size)``.

Offsets: every per-program base (query row, weights row, block-table row, output row) is a
64-bit scalar; cache offsets are 64-bit (``block_id * stride0``); per-lane offsets that stay
inside one row (head, dim, token < max_model_len) are 32-bit. Block ids read from the table are
clamped into ``[0, num_blocks)`` (:func:`tile_pages`), so no table value makes a gather leave
the cache.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ...problem import Problem, kv_fits_32bit  # noqa: F401  (the 32-bit cache rule; launchers use it from here)
from ...schedule import BALANCED, BALANCED_MIN_BATCH, SCHEDULES, SPLIT, persistent_programs
from ...triton_internals.gluon_api import thread_barrier
from ...triton_internals.specialise import StandIn
from ..base import check_knob_space, describe_allowed

#: kernel parameters that change from call to call without changing the code: never
#: specialised, so a warm-up compile serves every later call (and CI compiles what runs)
DYNAMIC_PARAMS = ("max_model_len", "max_blocks", "num_splits", "batch", "num_blocks")


# ----------------------------------------------------------------------------- row lengths
@gluon.jit
def sequence_length(lens_ptr, b, stride_lens_b, stride_lens_j, NEXT_N: gl.constexpr, LENS_2D: gl.constexpr):
    """Tokens that size sequence ``b``'s work: ``L_b`` (1-D) or ``max_j lens[b, j]`` (2-D), >= 0.

    Scalar loads: a handful of uniform reads, no layout needed."""
    row = lens_ptr + b.to(gl.int64) * stride_lens_b
    seq_len = gl.load(row)
    if LENS_2D:
        for j in gl.static_range(1, NEXT_N):
            seq_len = gl.maximum(seq_len, gl.load(row + j * stride_lens_j))
    return gl.maximum(seq_len, 0)


@gluon.jit
def row_length(lens_ptr, b, j, seq_len, stride_lens_b, stride_lens_j, NEXT_N: gl.constexpr, LENS_2D: gl.constexpr):
    """Visible length of query row ``(b, j)`` (scalar ``j``, static or dynamic), >= 0."""
    if LENS_2D:
        row_len = gl.load(lens_ptr + b.to(gl.int64) * stride_lens_b + j * stride_lens_j)
    else:
        row_len = seq_len - (NEXT_N - 1) + j
    return gl.maximum(row_len, 0)


@gluon.jit
def visible_end(seq_len, max_model_len, max_blocks, KV_BLOCK: gl.constexpr):
    """First position no row of the sequence may see: ``min(seq_len, max_model_len, table width)``."""
    return gl.minimum(gl.minimum(seq_len, max_model_len), max_blocks * KV_BLOCK)


@gluon.jit
def split_tile_range(end, split, num_splits, CHUNK: gl.constexpr):
    """``[first, stop)`` tiles of ``CHUNK`` tokens owned by KV split ``split``: an even share of
    the tiles the sequence actually has (so the host's split count only needs to be an upper
    bound; programs with an empty range do nothing)."""
    num_tiles = gl.cdiv(end, CHUNK)
    first = num_tiles * split // num_splits
    stop = num_tiles * (split + 1) // num_splits
    return first, stop


# ----------------------------------------------------------------------------- balanced schedule
#: sequences whose lengths one scan step reads (a multiple of every kernel's thread count)
SCAN_BLOCK = gl.constexpr(512)


@gluon.constexpr_function
def scan_layout(threads_per_warp, num_warps):
    """1-D layout of one scan step: ``SCAN_BLOCK`` lengths spread over the whole program."""
    return gl.BlockedLayout([SCAN_BLOCK // (threads_per_warp * num_warps)], [threads_per_warp], [num_warps], [0])


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _block_tiles(lens_ptr, first_seq, batch, stride_lens_b, stride_lens_j, max_model_len, max_blocks,
                 NEXT_N: gl.constexpr, LENS_2D: gl.constexpr, KV_BLOCK: gl.constexpr, CHUNK: gl.constexpr,
                 LAYOUT: gl.constexpr):
    """Tiles of sequences ``first_seq .. first_seq + SCAN_BLOCK`` (0 past the batch): vector
    form of ``sequence_length`` / ``visible_end``."""
    seq = first_seq + gl.arange(0, SCAN_BLOCK, LAYOUT)
    valid = seq < batch
    row = lens_ptr + seq.to(gl.int64) * stride_lens_b
    seq_len = gl.load(row, mask=valid, other=0)
    if LENS_2D:
        for j in gl.static_range(1, NEXT_N):
            seq_len = gl.maximum(seq_len, gl.load(row + j * stride_lens_j, mask=valid, other=0))
    end = gl.minimum(gl.minimum(gl.maximum(seq_len, 0), max_model_len), max_blocks * KV_BLOCK)
    return seq, gl.cdiv(end, CHUNK)


@gluon.jit
def balanced_share(lens_ptr, batch, stride_lens_b, stride_lens_j, max_model_len, max_blocks, program, num_programs,
                   NEXT_N: gl.constexpr, LENS_2D: gl.constexpr, KV_BLOCK: gl.constexpr, CHUNK: gl.constexpr,
                   LAYOUT: gl.constexpr):
    """``(start, stop, seq, tile)``: program ``program``'s items ``[start, stop)`` of the batch's
    tiles and the (sequence, tile) of ``start`` (``schedule.share`` / ``schedule.locate``).

    Two passes over the lengths (the second from L1): the total, then the prefix sum locating
    ``start``: ``seq = #{b : cum(b) <= start}`` and ``tile = start - max{cum(b) <= start}``
    with ``cum`` the inclusive prefix sum of the tile counts."""
    total = gl.to_tensor(0)
    for first_seq in range(0, batch, SCAN_BLOCK):
        _, tiles = _block_tiles(lens_ptr, first_seq, batch, stride_lens_b, stride_lens_j, max_model_len, max_blocks,
                                NEXT_N, LENS_2D, KV_BLOCK, CHUNK, LAYOUT)
        total += gl.sum(tiles, axis=0)
    start = (total.to(gl.int64) * program // num_programs).to(gl.int32)
    stop = (total.to(gl.int64) * (program + 1) // num_programs).to(gl.int32)
    seq = gl.to_tensor(0)
    before = gl.to_tensor(0)
    carried = gl.to_tensor(0)
    for first_seq in range(0, batch, SCAN_BLOCK):
        _, tiles = _block_tiles(lens_ptr, first_seq, batch, stride_lens_b, stride_lens_j, max_model_len, max_blocks,
                                NEXT_N, LENS_2D, KV_BLOCK, CHUNK, LAYOUT)
        cum = gl.associative_scan(tiles, 0, _add) + carried
        done = cum <= start
        seq += gl.sum(done.to(gl.int32), axis=0)
        before = gl.maximum(before, gl.max(gl.where(done, cum, 0), axis=0))
        carried += gl.sum(tiles, axis=0)
    return start, stop, seq, start - before


# ----------------------------------------------------------------------------- paged gathers
@gluon.jit
def tile_pages(table_row, tokens, end, num_blocks, KV_BLOCK: gl.constexpr, LOAD: gl.constexpr):
    """int64 cache block of each token (tokens at or past ``end`` get block 0 and their table
    entries are never read: they may be garbage or past the table's width).

    Block ids are clamped into ``[0, num_blocks)``: whatever the table holds, no gather leaves
    the cache (an invalid id yields the logits of a real block, the documented rule; two
    integer ops per token, off the memory path)."""
    pages = LOAD(table_row, tokens // KV_BLOCK, tokens < end, 0)
    return gl.maximum(gl.minimum(pages, num_blocks - 1), 0).to(gl.int64)


@gluon.jit
def key_offset_parts(pages, tokens, d, stride_block, KV_BLOCK: gl.constexpr, HEAD_DIM: gl.constexpr,
                     PRESHUFFLE: gl.constexpr):
    """The byte offset of key (token, dim) split into a per-token part (int64, the page base
    included) and a per-dim part, so kernels can lay the ``[T, D]`` or ``[D, T]`` sum out as
    their MMA operand needs: plain ``page*stride + slot*D | d``; Preshuffle
    ``page*stride + (slot//16)*16*D + (slot%16)*16 | (d//16)*256 + d%16``."""
    slot = tokens % KV_BLOCK
    if PRESHUFFLE:
        token_part = (slot // 16) * (16 * HEAD_DIM) + (slot % 16) * 16
        dim_part = (d // 16) * 256 + d % 16
    else:
        token_part = slot * HEAD_DIM
        dim_part = d
    return pages * stride_block + token_part, dim_part


@gluon.jit
def key_offsets(pages, tokens, d, stride_block, KV_BLOCK: gl.constexpr, HEAD_DIM: gl.constexpr,
                PRESHUFFLE: gl.constexpr):
    """int64 byte offsets ``[D, T]`` of key bytes (dim ``d`` [D], token ``tokens`` [T]).

    ``pages``/``tokens`` are in ``SliceLayout(0, L)`` and ``d`` in ``SliceLayout(1, L)`` of the
    wanted layout ``L``."""
    token_part, dim_part = key_offset_parts(pages, tokens, d, stride_block, KV_BLOCK, HEAD_DIM, PRESHUFFLE)
    return dim_part[:, None] + token_part[None, :]


@gluon.jit
def scale_offsets(pages, tokens, stride_block, KV_BLOCK: gl.constexpr, HEAD_DIM: gl.constexpr):
    """int64 offsets, in fp32 elements, of the scales of ``tokens``: byte
    ``block*stride0 + KV_BLOCK*D + 4*slot`` (``stride0`` is a multiple of 4, checked on the host)."""
    return pages * (stride_block // 4) + (KV_BLOCK * HEAD_DIM // 4) + tokens % KV_BLOCK


@gluon.jit
def load_tile(kv_ptr, scale_ptr, pages_k, pages_s, tile, stride_block, CHUNK: gl.constexpr, KV_BLOCK: gl.constexpr,
              HEAD_DIM: gl.constexpr, PRESHUFFLE: gl.constexpr, B_LAYOUT: gl.constexpr, S_LAYOUT: gl.constexpr,
              LOAD_KV: gl.constexpr, KV_32BIT: gl.constexpr):
    """Keys ``[D, CHUNK]`` (in the MMA's B-operand layout) and scales ``[CHUNK]`` of ``tile``,
    given the tile's blocks in the two token layouts. Keys of masked tokens come from block 0
    (always a real block when the range is non-empty) and are never stored."""
    t_k = tile * CHUNK + gl.arange(0, CHUNK, gl.SliceLayout(0, B_LAYOUT))
    d = gl.arange(0, HEAD_DIM, gl.SliceLayout(1, B_LAYOUT))
    keys = LOAD_KV(kv_ptr, key_offsets(pages_k, t_k, d, stride_block, KV_BLOCK, HEAD_DIM, PRESHUFFLE), KV_32BIT)
    t_s = tile * CHUNK + gl.arange(0, CHUNK, S_LAYOUT)
    scales = LOAD_KV(scale_ptr, scale_offsets(pages_s, t_s, stride_block, KV_BLOCK, HEAD_DIM), KV_32BIT)
    return keys, scales


@gluon.jit
def load_tile_pages(table_row, tile, end, num_blocks, CHUNK: gl.constexpr, KV_BLOCK: gl.constexpr,
                    B_LAYOUT: gl.constexpr, S_LAYOUT: gl.constexpr, LOAD: gl.constexpr):
    """Blocks of ``tile``'s tokens in the key layout and in the scale layout (read twice from
    the table, L1-resident, rather than shuffled between layouts)."""
    t_k = tile * CHUNK + gl.arange(0, CHUNK, gl.SliceLayout(0, B_LAYOUT))
    t_s = tile * CHUNK + gl.arange(0, CHUNK, S_LAYOUT)
    return (tile_pages(table_row, t_k, end, num_blocks, KV_BLOCK, LOAD),
            tile_pages(table_row, t_s, end, num_blocks, KV_BLOCK, LOAD))


# ----------------------------------------------------------------------------- query rows
@gluon.jit
def load_query(q_ptr, b, j, stride_q_b, stride_q_j, stride_q_h, HEADS: gl.constexpr, HEAD_DIM: gl.constexpr,
               LAYOUT: gl.constexpr, LOAD: gl.constexpr):
    """``q[b, j]`` as ``[H, D]`` fp8 in ``LAYOUT`` (last dim contiguous, checked on the host)."""
    base = q_ptr + b.to(gl.int64) * stride_q_b + j.to(gl.int64) * stride_q_j
    h = gl.arange(0, HEADS, gl.SliceLayout(1, LAYOUT))
    d = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, LAYOUT))
    return LOAD(base, h[:, None] * stride_q_h + d[None, :], None, None)


@gluon.jit
def load_weights(weights_ptr, row, stride_w, HEADS: gl.constexpr, LAYOUT: gl.constexpr, LOAD: gl.constexpr):
    """``weights[row, :]`` as ``[H]`` fp32 in ``LAYOUT``."""
    base = weights_ptr + row.to(gl.int64) * stride_w
    return LOAD(base, gl.arange(0, HEADS, LAYOUT), None, None)


# ----------------------------------------------------------------------------- epilogue
@gluon.jit
def weighted_relu_head_sum(scores, scales, weights):
    """``[H, T]`` scores -> ``[T]`` logits: ``sum_h weights[h] * relu(scores[h, t] * scales[t])``.

    ``scales`` is in ``SliceLayout(0, scores.layout)``, ``weights`` in ``SliceLayout(1, ...)``.
    The per-token scale is factored out of the ReLU (exact for the non-negative scales fp8
    quantisation produces, as the sm_90 kernels and DeepGEMM do): two fp32 ops per score."""
    return gl.sum(gl.maximum(scores, 0.0) * weights[:, None], axis=0) * scales


@gluon.jit
def store_row_logits(out_ptr, row, stride_out, tokens, logits, row_end):
    """``out[row, t] = logits`` where ``t < row_end``; 64-bit row offset, 32-bit columns."""
    base = out_ptr + row.to(gl.int64) * stride_out
    gl.store(base + tokens, logits, mask=tokens < row_end)


@gluon.jit
def score_row(q, keys, scales, weights, out_ptr, row, stride_out, tokens, row_end,
              HEADS: gl.constexpr, CHUNK: gl.constexpr, ACC: gl.constexpr, MMA: gl.constexpr):
    """One query row (operands in registers) against one key tile: MMA, epilogue, masked store."""
    scores = MMA(q, keys, gl.zeros([HEADS, CHUNK], gl.float32, ACC))
    store_row_logits(out_ptr, row, stride_out, tokens, weighted_relu_head_sum(scores, scales, weights), row_end)


@gluon.jit
def score_staged_row(q_smem, w_smem, keys, scales, out_ptr, row, stride_out, tokens, row_end,
                     HEADS: gl.constexpr, HEAD_CHUNK: gl.constexpr, CHUNK: gl.constexpr, ACC: gl.constexpr,
                     K_WIDTH: gl.constexpr, MMA: gl.constexpr):
    """One query row staged in shared memory (``[H, D]`` fp8 and ``[H]`` fp32) against one key
    tile, ``HEAD_CHUNK`` heads per MMA: only one head chunk's operand and scores are live."""
    logits = gl.zeros([CHUNK], gl.float32, gl.SliceLayout(0, ACC))
    for h0 in gl.static_range(0, HEADS, HEAD_CHUNK):
        q = q_smem.slice(h0, HEAD_CHUNK).load(gl.DotOperandLayout(0, ACC, K_WIDTH))
        w = w_smem.slice(h0, HEAD_CHUNK).load(gl.SliceLayout(1, ACC))
        scores = MMA(q, keys, gl.zeros([HEAD_CHUNK, CHUNK], gl.float32, ACC))
        logits += weighted_relu_head_sum(scores, scales, w)
    store_row_logits(out_ptr, row, stride_out, tokens, logits, row_end)


# ----------------------------------------------------------------------------- the kernel
@gluon.jit
def score_rows_segment(q_ptr, kv_ptr, scale_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr, q_smem, w_smem,
                       b, group, first, stop,
                       stride_q_b, stride_q_j, stride_q_h, stride_block, stride_w, stride_out, stride_lens_b,
                       stride_lens_j, stride_table, max_model_len, max_blocks, num_blocks,
                       NEXT_N: gl.constexpr, HEADS: gl.constexpr, HEAD_DIM: gl.constexpr, KV_BLOCK: gl.constexpr,
                       CHUNK: gl.constexpr, ROWS: gl.constexpr, PRESHUFFLE: gl.constexpr, LENS_2D: gl.constexpr,
                       Q_IN_LDS: gl.constexpr, HEAD_CHUNK: gl.constexpr, PREFETCH: gl.constexpr,
                       KV_32BIT: gl.constexpr, ACC: gl.constexpr, K_WIDTH: gl.constexpr, MMA: gl.constexpr,
                       LOAD: gl.constexpr, LOAD_KV: gl.constexpr, THREADS_PER_WARP: gl.constexpr):
    """Tiles ``[first, stop)`` of sequence ``b`` scored against its rows ``group*ROWS ..
    + ROWS``: Q and the weights loaded once, then the (prefetching) tile loop."""
    A_LAYOUT: gl.constexpr = gl.DotOperandLayout(0, ACC, K_WIDTH)
    B_LAYOUT: gl.constexpr = gl.DotOperandLayout(1, ACC, K_WIDTH)
    TOKENS: gl.constexpr = gl.SliceLayout(0, ACC)  # scales, logits, output columns
    HEADS_L: gl.constexpr = gl.SliceLayout(1, ACC)  # weights
    seq_len = sequence_length(lens_ptr, b, stride_lens_b, stride_lens_j, NEXT_N, LENS_2D)
    end = visible_end(seq_len, max_model_len, max_blocks, KV_BLOCK)
    if first < stop:
        j0 = group * ROWS
        row0 = b * NEXT_N + j0
        if Q_IN_LDS:
            # Stage Q and the weights in shared memory once; per tile, each row's operand is read
            # from there HEAD_CHUNK heads at a time (registers would hold ROWS*H*D/lanes bytes:
            # every warp needs all heads of Q for its tokens). The compiler's barrier before the
            # first read sits inside the tile loop; it also keeps those loop-invariant reads from
            # being hoisted out of the loop into registers (measured: an explicit barrier here
            # instead doubles the VGPRs and spills).
            STAGE: gl.constexpr = gl.BlockedLayout([1, 16], [THREADS_PER_WARP // 8, 8], [gl.num_warps(), 1], [1, 0])
            VEC: gl.constexpr = gl.BlockedLayout([1], [THREADS_PER_WARP], [gl.num_warps()], [0])
            for r in gl.static_range(ROWS):
                q_smem.index(r).store(load_query(q_ptr, b, j0 + r, stride_q_b, stride_q_j, stride_q_h, HEADS, HEAD_DIM,
                                                 STAGE, LOAD))
                w_smem.index(r).store(load_weights(weights_ptr, row0 + r, stride_w, HEADS, VEC, LOAD))
        else:
            qs = ()
            ws = ()
            for r in gl.static_range(ROWS):
                qs = qs + (load_query(q_ptr, b, j0 + r, stride_q_b, stride_q_j, stride_q_h, HEADS, HEAD_DIM,
                                      A_LAYOUT, LOAD),)
                ws = ws + (load_weights(weights_ptr, row0 + r, stride_w, HEADS, HEADS_L, LOAD),)
        row_ends = ()
        for r in gl.static_range(ROWS):
            row_len = row_length(lens_ptr, b, j0 + r, seq_len, stride_lens_b, stride_lens_j, NEXT_N, LENS_2D)
            row_ends = row_ends + (gl.minimum(row_len, end),)

        table_row = table_ptr + b.to(gl.int64) * stride_table
        if PREFETCH:
            # Prologue: keys of tile `first`, blocks of tile `first + 1`.
            pages_k, pages_s = load_tile_pages(table_row, first, end, num_blocks, CHUNK, KV_BLOCK, B_LAYOUT, TOKENS, LOAD)
            keys, scales = load_tile(kv_ptr, scale_ptr, pages_k, pages_s, first, stride_block, CHUNK, KV_BLOCK,
                                     HEAD_DIM, PRESHUFFLE, B_LAYOUT, TOKENS, LOAD_KV, KV_32BIT)
            pages_k, pages_s = load_tile_pages(table_row, first + 1, end, num_blocks, CHUNK, KV_BLOCK, B_LAYOUT, TOKENS, LOAD)
        for tile in range(first, stop):
            if PREFETCH:
                # In flight while this tile is scored: keys of tile + 1, blocks of tile + 2 (tiles
                # past the range read block 0 or the next split's blocks; never stored).
                next_keys, next_scales = load_tile(kv_ptr, scale_ptr, pages_k, pages_s, tile + 1, stride_block, CHUNK,
                                                   KV_BLOCK, HEAD_DIM, PRESHUFFLE, B_LAYOUT, TOKENS, LOAD_KV, KV_32BIT)
                pages_k, pages_s = load_tile_pages(table_row, tile + 2, end, num_blocks, CHUNK, KV_BLOCK, B_LAYOUT, TOKENS, LOAD)
            else:
                # One tile of keys in registers: other waves of the CU hide the load latency.
                tile_pages_k, tile_pages_s = load_tile_pages(table_row, tile, end, num_blocks, CHUNK, KV_BLOCK, B_LAYOUT, TOKENS,
                                                             LOAD)
                keys, scales = load_tile(kv_ptr, scale_ptr, tile_pages_k, tile_pages_s, tile, stride_block, CHUNK,
                                         KV_BLOCK, HEAD_DIM, PRESHUFFLE, B_LAYOUT, TOKENS, LOAD_KV, KV_32BIT)
            tokens = tile * CHUNK + gl.arange(0, CHUNK, TOKENS)
            for r in gl.static_range(ROWS):
                if Q_IN_LDS:
                    score_staged_row(q_smem.index(r), w_smem.index(r), keys, scales, out_ptr, row0 + r, stride_out,
                                     tokens, row_ends[r], HEADS, HEAD_CHUNK, CHUNK, ACC, K_WIDTH, MMA)
                else:
                    score_row(qs[r], keys, scales, ws[r], out_ptr, row0 + r, stride_out, tokens, row_ends[r],
                              HEADS, CHUNK, ACC, MMA)
            if PREFETCH:
                keys = next_keys
                scales = next_scales
        if Q_IN_LDS:
            thread_barrier()  # every warp is done with this segment's Q before the next one's


@gluon.jit(do_not_specialize=DYNAMIC_PARAMS)
def register_mma_logits_kernel(
    q_ptr, kv_ptr, scale_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr,
    stride_q_b, stride_q_j, stride_q_h,
    stride_block,  # bytes between cache blocks (multiple of 4)
    stride_w, stride_out, stride_lens_b, stride_lens_j, stride_table,
    max_model_len, max_blocks, num_splits, batch, num_blocks,
    NEXT_N: gl.constexpr, HEADS: gl.constexpr, HEAD_DIM: gl.constexpr, KV_BLOCK: gl.constexpr,
    CHUNK: gl.constexpr, ROWS: gl.constexpr, PRESHUFFLE: gl.constexpr, LENS_2D: gl.constexpr,
    Q_IN_LDS: gl.constexpr, HEAD_CHUNK: gl.constexpr, PREFETCH: gl.constexpr, KV_32BIT: gl.constexpr,
    BALANCED: gl.constexpr,
    # arch atoms
    ACC: gl.constexpr, K_WIDTH: gl.constexpr, MMA: gl.constexpr, LOAD: gl.constexpr, LOAD_KV: gl.constexpr,
    THREADS_PER_WARP: gl.constexpr,
):
    """Balanced: program ``p`` (of a persistent grid, row group fastest) scores its equal share
    of the batch's tiles (``schedule.py``) for row group ``p % ROW_GROUPS``, segment by segment.
    Split: program ``(b, split, group)`` scores an even share of sequence ``b``'s tiles."""
    ROW_GROUPS: gl.constexpr = NEXT_N // ROWS
    if Q_IN_LDS:
        q_smem = gl.allocate_shared_memory(q_ptr.dtype.element_ty, [ROWS, HEADS, HEAD_DIM],
                                           gl.SwizzledSharedLayout(16, 1, 8, [1, 0]))
        w_smem = gl.allocate_shared_memory(gl.float32, [ROWS, HEADS], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    else:
        q_smem = 0
        w_smem = 0

    # Programs with the row group fastest: the programs that read the same keys run side by
    # side (L2 reuse when ROWS < NEXT_N).
    pid = gl.program_id(0)
    group = pid % ROW_GROUPS
    if BALANCED:
        item, stop, b, tile = balanced_share(
            lens_ptr, batch, stride_lens_b, stride_lens_j, max_model_len, max_blocks, pid // ROW_GROUPS,
            gl.num_programs(0) // ROW_GROUPS, NEXT_N, LENS_2D, KV_BLOCK, CHUNK,
            scan_layout(THREADS_PER_WARP, gl.num_warps()))
        while item < stop:
            seq_len = sequence_length(lens_ptr, b, stride_lens_b, stride_lens_j, NEXT_N, LENS_2D)
            tiles = gl.cdiv(visible_end(seq_len, max_model_len, max_blocks, KV_BLOCK), CHUNK)
            count = gl.minimum(tiles - tile, stop - item)
            score_rows_segment(q_ptr, kv_ptr, scale_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr, q_smem, w_smem,
                               b, group, tile, tile + count,
                               stride_q_b, stride_q_j, stride_q_h, stride_block, stride_w, stride_out, stride_lens_b,
                               stride_lens_j, stride_table, max_model_len, max_blocks, num_blocks,
                               NEXT_N, HEADS, HEAD_DIM, KV_BLOCK, CHUNK, ROWS, PRESHUFFLE, LENS_2D, Q_IN_LDS,
                               HEAD_CHUNK, PREFETCH, KV_32BIT, ACC, K_WIDTH, MMA, LOAD, LOAD_KV, THREADS_PER_WARP)
            item += gl.maximum(count, 0)  # zero-length sequences between long ones hold no items
            b += 1
            tile = tile * 0
    else:
        split = (pid // ROW_GROUPS) % num_splits
        b = pid // (ROW_GROUPS * num_splits)
        seq_len = sequence_length(lens_ptr, b, stride_lens_b, stride_lens_j, NEXT_N, LENS_2D)
        first, stop = split_tile_range(visible_end(seq_len, max_model_len, max_blocks, KV_BLOCK), split, num_splits,
                                       CHUNK)
        score_rows_segment(q_ptr, kv_ptr, scale_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr, q_smem, w_smem,
                           b, group, first, stop,
                           stride_q_b, stride_q_j, stride_q_h, stride_block, stride_w, stride_out, stride_lens_b,
                           stride_lens_j, stride_table, max_model_len, max_blocks, num_blocks,
                           NEXT_N, HEADS, HEAD_DIM, KV_BLOCK, CHUNK, ROWS, PRESHUFFLE, LENS_2D, Q_IN_LDS,
                           HEAD_CHUNK, PREFETCH, KV_32BIT, ACC, K_WIDTH, MMA, LOAD, LOAD_KV, THREADS_PER_WARP)


# ============================================================================= host side
# Shared by the variant modules that launch register_mma_logits_kernel (cdna.py, hopper_mma.py).

#: knobs every register-MMA variant reads (CSV spelling); arch modules add their own
COMMON_KNOBS = ("ChunkK", "SplitKV", "ReuseKV", "Schedule")
CHUNK_SIZES = (64, 128, 256)


def default_schedule(problem) -> str:
    """The schedule of a config that does not name one. sm_90: ``balanced`` from
    ``schedule.BALANCED_MIN_BATCH`` sequences on, ``split`` below (measured on the H200, see
    there). CDNA: ``split``, which the shipped priors were chosen for: the balanced body costs
    the MFMA kernel 24 VGPRs and its key prefetch at WavePerEU 4 (static proxies, no MI300/MI355X
    measurement yet); ``balanced`` is a tuner candidate there. Tuned rows name their schedule."""
    if problem.arch == "sm_90" and problem.batch >= BALANCED_MIN_BATCH:
        return BALANCED
    return SPLIT


def schedule_of(problem, config: dict) -> str:
    """The ``Schedule`` knob (``balanced`` / ``split``), its default when unset."""
    value = config.get("Schedule")
    if value is None:
        return default_schedule(problem)
    if value not in SCHEDULES:
        raise ValueError(f"Schedule must be one of {', '.join(SCHEDULES)}, got {value!r}")
    return value


def program_grid(problem, config: dict, splits: int, rows: int, programs_per_cu: int) -> tuple[tuple[int], int]:
    """``(grid, num_splits)`` of register_mma_logits_kernel: one persistent wave of
    ``cu_num * programs_per_cu`` programs per row group (balanced), or ``batch * splits`` per
    row group (split)."""
    groups = problem.next_n // rows
    if schedule_of(problem, config) == BALANCED:
        return (persistent_programs(problem.cu_num, programs_per_cu) * groups,), 1
    return (problem.batch * splits * groups,), splits



def shape_reason(problem, archs: tuple[str, ...], fp8_by_arch: dict[str, str]) -> str | None:
    """Why the register-MMA kernel cannot serve ``problem`` on these archs (``None``: it can)."""
    if problem.arch not in archs:
        return f"arch {problem.arch} is not one of {', '.join(archs)}"
    if problem.device_type != "cuda" and not problem.hypothetical:
        return f"gluon kernels run on GPU tensors, got device type {problem.device_type!r}"
    if problem.fp8 != fp8_by_arch[problem.arch]:
        return f"{problem.arch} computes in fp8 e4m3{fp8_by_arch[problem.arch]}, got e4m3{problem.fp8}"
    if problem.head_dim != 128:
        return f"head_dim must be 128, got {problem.head_dim}"
    h = problem.heads
    if h < 16 or h & (h - 1):
        return f"heads must be a power of two >= 16 (tensor shapes are powers of two), got {h}"
    if problem.preshuffle and problem.kv_block_size % 16:
        return f"Preshuffle needs kv_block_size % 16 == 0, got {problem.kv_block_size}"
    return None


def config_key(config: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in config.items() if v is not None))


def rows_per_program(next_n: int, reuse_kv) -> int:
    """``ReuseKV=0``: one row per program (keys re-read per row, from L2); ``1``: all rows."""
    return next_n if int(reuse_kv or 0) else 1


def kernel_arguments(args, num_splits: int) -> tuple:
    """Runtime (non-constexpr) arguments of register_mma_logits_kernel, in order."""
    q, kv, w, out, lens, table = args.q, args.kv_cache, args.weights, args.out, args.context_lens, args.block_table
    # 1-D lengths have no j stride; 1 keeps the same specialisation as contiguous 2-D lengths.
    stride_lens_j = lens.stride(1) if lens.dim() == 2 else 1
    return (
        q, kv.view(q.dtype), kv.view(torch.float32), w, out, lens, table,
        q.stride(0), q.stride(1), q.stride(2), kv.stride(0), w.stride(0), out.stride(0),
        lens.stride(0), stride_lens_j, table.stride(0),
        args.max_model_len, args.max_blocks, num_splits, args.problem.batch, args.num_blocks,
    )


def typical_arguments(problem, *, kv_32bit: bool = True, num_splits: int = 2) -> tuple:
    """Stand-ins for what :func:`kernel_arguments` passes on a typical vLLM call of ``problem``:
    contiguous q / weights / lengths, packed cache blocks, an output as wide as
    ``max_model_len`` and a block table as wide as the output."""
    fp8 = torch.float8_e4m3fnuz if problem.fp8 == "fnuz" else torch.float8_e4m3fn
    b, n, h, d, bs = problem.batch, problem.next_n, problem.heads, problem.head_dim, problem.kv_block_size
    width = problem.max_model_len
    max_blocks = -(-width // bs)
    block_bytes = bs * (d + 4)
    cache_bytes = (1 << 30) if kv_32bit else (1 << 33)
    rows = b * n
    return (
        StandIn(fp8, b * n * h * d), StandIn(fp8, cache_bytes), StandIn(torch.float32, cache_bytes),
        StandIn(torch.float32, rows * h * 4), StandIn(torch.float32, rows * width * 4),
        StandIn(torch.int32, rows * 4), StandIn(torch.int32, b * max_blocks * 4),
        n * h * d, h * d, d, block_bytes, h, width,
        n if problem.lens_2d else 1, 1, max_blocks,
        width, max_blocks, num_splits, b, cache_bytes // block_bytes,
    )


# ----------------------------------------------------------------------------- compile specs
#: problem fields a compile config may set (the rest take typical values)
PROBLEM_FIELDS = ("heads", "next_n", "kv_block_size", "preshuffle", "lens_2d")


def problem_for(arch: str, fp8: str, fields: dict):
    """A hypothetical :class:`Problem` for compiling: ``fields`` (see :data:`PROBLEM_FIELDS`) over
    typical values (64 heads, next_n 1, 64-token blocks, 2-D lengths, 128k positions)."""
    return Problem(
        arch=arch, cu_num=int(fields.get("cu_num") or 0), batch=int(fields.get("batch") or 64),
        next_n=int(fields.get("next_n", 1)), heads=int(fields.get("heads", 64)), head_dim=128,
        kv_block_size=int(fields.get("kv_block_size", 64)), preshuffle=bool(fields.get("preshuffle", False)),
        context=fields.get("context"), lens_2d=bool(fields.get("lens_2d", True)), fp8=fp8, device_type="cuda",
        max_model_len=int(fields.get("max_model_len") or 131072), hypothetical=True,
    )


def problem_fields(problem) -> dict:
    return {name: getattr(problem, name) for name in PROBLEM_FIELDS}


def spec_name(backend: str, variant: str, arch: str, problem, knobs: dict, kv_32bit: bool) -> str:
    """Filesystem-safe unique name: backend_variant_arch_shape_knobs."""
    shape = (f"h{problem.heads}_n{problem.next_n}_bs{problem.kv_block_size}{'p' if problem.preshuffle else ''}"
             f"_{'l2' if problem.lens_2d else 'l1'}{'' if kv_32bit else '_kv64'}")
    knob_text = "_".join(f"{k}{v}" for k, v in sorted(knobs.items()) if k != "variant")
    return f"{backend}_{variant}_{arch}_{shape}_{knob_text}"


def representative_problems(arch: str) -> list[dict]:
    """Shapes whose candidates ``compile`` builds by default (and CI by subsets of it).

    What changes the generated code is: heads (operand and reduction sizes), next_n (rows per
    program with ReuseKV, the 2-D length loop), kv_block_size (block-table index math:
    1 / power-of-two sizes below, equal to and above ChunkK), Preshuffle (key offsets) and
    1-D vs 2-D lengths; the knobs multiply these. Batch, context and CU count only change
    host-side numbers (grid, SplitKV), never the kernel.
    """
    out = []
    for heads in (32, 64):
        for next_n in (1, 2, 4, 8):
            out.append({"heads": heads, "next_n": next_n, "kv_block_size": 64, "preshuffle": True, "lens_2d": True})
        out.append({"heads": heads, "next_n": 3, "kv_block_size": 64, "preshuffle": False, "lens_2d": False})
    for bs, pre in ((1, False), (16, True), (16, False), (128, True), (256, False)):
        out.append({"heads": 64, "next_n": 2, "kv_block_size": bs, "preshuffle": pre, "lens_2d": True})
    return out


def candidate_matrix(arch: str, fp8: str, candidates) -> list[dict]:
    """Every candidate (``candidates(problem)``) of every :func:`representative_problems` shape,
    as compile configs (problem fields + knobs)."""
    out = []
    for fields in representative_problems(arch):
        problem = problem_for(arch, fp8, fields)
        out += [dict(fields, **cand) for cand in candidates(problem)]
    return out


def check_variant_config(module, config: dict, problem=None) -> str | None:
    """A variant module's ``check_config``: every knob in its ``KNOB_SPACE`` with an allowed
    value, then its own knob parser ``_knobs`` on ``problem`` (or on the typical problem of
    each of its archs: accepted if one accepts), which judges the combinations."""
    owner = f"gluon/{module.VARIANT}"
    if config.get("variant") not in (None, module.VARIANT):
        return f"{owner} cannot run variant {config['variant']!r}"
    if problem is not None and problem.arch not in module.ARCHS:
        return f"{owner} runs on {', '.join(module.ARCHS)}, not {problem.arch}"
    error = check_knob_space(owner, config, module.KNOB_SPACE, extra=("variant",))
    if error is not None:
        return error
    problems = [problem] if problem is not None else [problem_for(a, module.FP8[a], {}) for a in module.ARCHS]
    errors = []
    for p in problems:
        try:
            module._knobs(p, config)
            return None
        except ValueError as exc:
            errors.append(str(exc))
    allowed = "; ".join(f"{k} {describe_allowed(v)}" for k, v in module.KNOB_SPACE.items())
    return f"{'; '.join(errors)} (allowed: {allowed})"
