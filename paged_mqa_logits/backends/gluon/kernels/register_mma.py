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
* ``THREADS_PER_WARP``: 64 (AMD) or 32 (NVIDIA), for the staging layouts;
* ``HEAD_SUM(scores, scales, weights)``: the epilogue's weighted ReLU head sum, ``[H, T]`` ->
  ``[T]``: :func:`weighted_relu_head_sum` in fp32 (every arch's default), or a bf16 matrix
  product of the ReLU'd scores with hi/lo weight rows (gfx950 ``HeadSum=tensor``,
  ``kernels/mfma.py``; its sm_90 twin ``kernels/mma_v2.py``) built from :func:`relu_bf16`
  and :func:`weight_rows`.

Keys are gathered straight into the MMA's B operand layout. An arch that gathers them in
another layout takes the second entry point, :func:`register_mma_logits_kernel_key_layout`, the
same body with two more atoms: ``KEY_LAYOUT`` (the layout key tiles and their block ids are
gathered in) and ``KEY_OPERAND(keys, B_LAYOUT)`` (turns such a tile into the B operand; AMD
``KeyLoad=lds``, ``cdna_keys.py``). A separate entry point rather than defaulted parameters keeps
:func:`register_mma_logits_kernel`'s parameters, and so every kernel compiled from it, as they are.

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

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ....triton_internals.gluon_api import thread_barrier
from .device import (DYNAMIC_PARAMS, balanced_share, key_offset_parts, row_length, scale_offsets, scan_layout,
                     sequence_length, share_run, split_tile_range, tile_pages, visible_end)


# ----------------------------------------------------------------------------- paged gathers
@gluon.jit
def key_offsets(pages, tokens, d, stride_block, KV_BLOCK_SIZE: gl.constexpr, HEAD_DIM: gl.constexpr,
                PRESHUFFLE: gl.constexpr):
    """int64 byte offsets ``[D, T]`` of key bytes (dim ``d`` [D], token ``tokens`` [T]).

    ``pages``/``tokens`` are in ``SliceLayout(0, L)`` and ``d`` in ``SliceLayout(1, L)`` of the
    wanted layout ``L``."""
    token_part, dim_part = key_offset_parts(pages, tokens, d, stride_block, KV_BLOCK_SIZE, HEAD_DIM, PRESHUFFLE)
    return dim_part[:, None] + token_part[None, :]



@gluon.jit
def load_tile(kv_ptr, scale_ptr, pages_k, pages_s, tile, stride_block, CHUNK: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr,
              HEAD_DIM: gl.constexpr, PRESHUFFLE: gl.constexpr, B_LAYOUT: gl.constexpr, S_LAYOUT: gl.constexpr,
              LOAD_KV: gl.constexpr, KV_32BIT: gl.constexpr):
    """Keys ``[D, CHUNK]`` (in the MMA's B-operand layout) and scales ``[CHUNK]`` of ``tile``,
    given the tile's blocks in the two token layouts. Keys of masked tokens come from block 0
    (always a real block when the range is non-empty) and are never stored."""
    t_k = tile * CHUNK + gl.arange(0, CHUNK, gl.SliceLayout(0, B_LAYOUT))
    d = gl.arange(0, HEAD_DIM, gl.SliceLayout(1, B_LAYOUT))
    keys = LOAD_KV(kv_ptr, key_offsets(pages_k, t_k, d, stride_block, KV_BLOCK_SIZE, HEAD_DIM, PRESHUFFLE), KV_32BIT)
    t_s = tile * CHUNK + gl.arange(0, CHUNK, S_LAYOUT)
    scales = LOAD_KV(scale_ptr, scale_offsets(pages_s, t_s, stride_block, KV_BLOCK_SIZE, HEAD_DIM), KV_32BIT)
    return keys, scales


@gluon.jit
def load_tile_pages(table_row, tile, end, num_blocks, CHUNK: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr,
                    B_LAYOUT: gl.constexpr, S_LAYOUT: gl.constexpr, LOAD: gl.constexpr):
    """Blocks of ``tile``'s tokens in the key layout and in the scale layout (read twice from
    the table, L1-resident, rather than shuffled between layouts)."""
    t_k = tile * CHUNK + gl.arange(0, CHUNK, gl.SliceLayout(0, B_LAYOUT))
    t_s = tile * CHUNK + gl.arange(0, CHUNK, S_LAYOUT)
    return (tile_pages(table_row, t_k, end, num_blocks, KV_BLOCK_SIZE, LOAD),
            tile_pages(table_row, t_s, end, num_blocks, KV_BLOCK_SIZE, LOAD))


@gluon.constexpr_function
def key_gather_layout(key_layout, b_layout):
    """The layout key tiles are gathered in: the MMA's B operand itself (``key_layout`` None),
    or an arch's own gather layout whose tiles ``KEY_OPERAND`` turns into the operand."""
    return b_layout if key_layout is None else key_layout


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
def relu_bf16(scores):
    """``relu(scores)`` rounded to bf16 (to nearest even): the rounding first (gfx950: one
    ``v_cvt_pk_bf16_f32`` per two scores), then the ReLU on the packed pair as a 16-bit integer
    max with 0 (bf16 is sign-magnitude: every negative, -0 included, is a negative int16), one
    ``v_pk_max_i16`` per two scores; rounding commutes with the ReLU."""
    bits = scores.to(gl.bfloat16).to(gl.int16, bitcast=True)
    return gl.maximum(bits, gl.zeros_like(bits)).to(gl.bfloat16, bitcast=True)


@gluon.jit
def weight_rows(weights, TILE: gl.constexpr, A: gl.constexpr):
    """The A operand ``[TILE, H]`` bf16 of a head-sum product from ``[H]`` fp32 weights: row 0
    ``hi = bf16(w)``, row 1 ``lo = bf16(w - hi)`` (together ~16 mantissa bits), the rest zero."""
    w = gl.convert_layout(weights, gl.SliceLayout(0, A))
    hi = w.to(gl.bfloat16)
    lo = (w - hi.to(gl.float32)).to(gl.bfloat16)
    row = gl.arange(0, TILE, gl.SliceLayout(1, A))[:, None]
    return gl.where(row == 0, hi[None, :], gl.where(row == 1, lo[None, :], gl.zeros_like(lo)[None, :]))


@gluon.jit
def store_row_logits(out_ptr, row, stride_out, tokens, logits, row_end):
    """``out[row, t] = logits`` where ``t < row_end``; 64-bit row offset, 32-bit columns. The
    fp32 logits are rounded once, here, to the output's dtype (a no-op for fp32 logits)."""
    base = out_ptr + row.to(gl.int64) * stride_out
    gl.store(base + tokens, logits.to(out_ptr.dtype.element_ty), mask=tokens < row_end)


@gluon.jit
def score_row(q, keys, scales, weights, out_ptr, row, stride_out, tokens, row_end,
              HEADS: gl.constexpr, CHUNK: gl.constexpr, ACC: gl.constexpr, MMA: gl.constexpr, HEAD_SUM: gl.constexpr):
    """One query row (operands in registers) against one key tile: MMA, epilogue, masked store."""
    scores = MMA(q, keys, gl.zeros([HEADS, CHUNK], gl.float32, ACC))
    store_row_logits(out_ptr, row, stride_out, tokens, HEAD_SUM(scores, scales, weights), row_end)


@gluon.jit
def score_staged_row(q_smem, w_smem, keys, scales, out_ptr, row, stride_out, tokens, row_end,
                     HEADS: gl.constexpr, HEAD_CHUNK: gl.constexpr, CHUNK: gl.constexpr, ACC: gl.constexpr,
                     K_WIDTH: gl.constexpr, MMA: gl.constexpr, HEAD_SUM: gl.constexpr):
    """One query row staged in shared memory (``[H, D]`` fp8 and ``[H]`` fp32) against one key
    tile, ``HEAD_CHUNK`` heads per MMA: only one head chunk's operand and scores are live."""
    logits = gl.zeros([CHUNK], gl.float32, gl.SliceLayout(0, ACC))
    for h0 in gl.static_range(0, HEADS, HEAD_CHUNK):
        q = q_smem.slice(h0, HEAD_CHUNK).load(gl.DotOperandLayout(0, ACC, K_WIDTH))
        w = w_smem.slice(h0, HEAD_CHUNK).load(gl.SliceLayout(1, ACC))
        scores = MMA(q, keys, gl.zeros([HEAD_CHUNK, CHUNK], gl.float32, ACC))
        logits += HEAD_SUM(scores, scales, w)
    store_row_logits(out_ptr, row, stride_out, tokens, logits, row_end)


@gluon.jit
def score_tile_rows(q_smem, w_smem, qs, ws, keys, scales, out_ptr, row0, stride_out, tile, row_ends, range_end,
                    HEADS: gl.constexpr, HEAD_CHUNK: gl.constexpr, CHUNK: gl.constexpr, ROWS: gl.constexpr,
                    Q_IN_LDS: gl.constexpr, ACC: gl.constexpr, K_WIDTH: gl.constexpr, MMA: gl.constexpr,
                    KEY_OPERAND: gl.constexpr, CLIP: gl.constexpr, HEAD_SUM: gl.constexpr):
    """Every row of the program against one gathered key tile, stored where the row sees the
    token (and, with ``CLIP``, the token lies before ``range_end``)."""
    B_LAYOUT: gl.constexpr = gl.DotOperandLayout(1, ACC, K_WIDTH)
    tokens = tile * CHUNK + gl.arange(0, CHUNK, gl.SliceLayout(0, ACC))
    if KEY_OPERAND is None:
        operand = keys
    else:
        operand = KEY_OPERAND(keys, B_LAYOUT)
    for r in gl.static_range(ROWS):
        if CLIP:
            row_end = gl.minimum(row_ends[r], range_end)
        else:
            row_end = row_ends[r]
        if Q_IN_LDS:
            score_staged_row(q_smem.index(r), w_smem.index(r), operand, scales, out_ptr, row0 + r, stride_out, tokens,
                             row_end, HEADS, HEAD_CHUNK, CHUNK, ACC, K_WIDTH, MMA, HEAD_SUM)
        else:
            score_row(qs[r], operand, scales, ws[r], out_ptr, row0 + r, stride_out, tokens, row_end, HEADS, CHUNK, ACC,
                      MMA, HEAD_SUM)


# ----------------------------------------------------------------------------- the kernel
@gluon.jit
def score_rows_segment(q_ptr, kv_ptr, scale_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr, q_smem, w_smem,
                       b, group, first, stop,
                       stride_q_b, stride_q_j, stride_q_h, stride_block, stride_w, stride_out, stride_lens_b,
                       stride_lens_j, stride_table, max_model_len, max_blocks, num_blocks,
                       NEXT_N: gl.constexpr, HEADS: gl.constexpr, HEAD_DIM: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr,
                       CHUNK: gl.constexpr, ROWS: gl.constexpr, PRESHUFFLE: gl.constexpr, LENS_2D: gl.constexpr,
                       Q_IN_LDS: gl.constexpr, HEAD_CHUNK: gl.constexpr, PREFETCH: gl.constexpr,
                       KV_32BIT: gl.constexpr, ACC: gl.constexpr, K_WIDTH: gl.constexpr, MMA: gl.constexpr,
                       LOAD: gl.constexpr, LOAD_KV: gl.constexpr, THREADS_PER_WARP: gl.constexpr,
                       KEY_LAYOUT: gl.constexpr, KEY_OPERAND: gl.constexpr, HEAD_SUM: gl.constexpr):
    """Tiles ``[first, stop)`` of sequence ``b`` scored against its rows ``group*ROWS ..
    + ROWS``: Q and the weights loaded once, then the (prefetching) tile loop."""
    A_LAYOUT: gl.constexpr = gl.DotOperandLayout(0, ACC, K_WIDTH)
    B_LAYOUT: gl.constexpr = gl.DotOperandLayout(1, ACC, K_WIDTH)
    KEYS: gl.constexpr = key_gather_layout(KEY_LAYOUT, B_LAYOUT)  # the layout keys are gathered in
    TOKENS: gl.constexpr = gl.SliceLayout(0, ACC)  # scales, logits, output columns
    HEADS_L: gl.constexpr = gl.SliceLayout(1, ACC)  # weights
    seq_len = sequence_length(lens_ptr, b, stride_lens_b, stride_lens_j, NEXT_N, LENS_2D)
    end = visible_end(seq_len, max_model_len, max_blocks, KV_BLOCK_SIZE)
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
            qs = ()
            ws = ()
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
            pages_k, pages_s = load_tile_pages(table_row, first, end, num_blocks, CHUNK, KV_BLOCK_SIZE, KEYS, TOKENS, LOAD)
            keys, scales = load_tile(kv_ptr, scale_ptr, pages_k, pages_s, first, stride_block, CHUNK, KV_BLOCK_SIZE,
                                     HEAD_DIM, PRESHUFFLE, KEYS, TOKENS, LOAD_KV, KV_32BIT)
            pages_k, pages_s = load_tile_pages(table_row, first + 1, end, num_blocks, CHUNK, KV_BLOCK_SIZE, KEYS, TOKENS, LOAD)
        if PREFETCH == 2:
            # Two tiles per iteration in alternating registers: the keys loaded for the next
            # iteration are the loop-carried ones, so no register copy closes the iteration. The
            # second tile of an odd range is scored and not stored (its end is clipped to the range:
            # past it lie the next split's or segment's tiles).
            range_end = stop * CHUNK
            for tile in range(first, stop, 2):
                keys_b, scales_b = load_tile(kv_ptr, scale_ptr, pages_k, pages_s, tile + 1, stride_block, CHUNK,
                                             KV_BLOCK_SIZE, HEAD_DIM, PRESHUFFLE, KEYS, TOKENS, LOAD_KV, KV_32BIT)
                pages_k, pages_s = load_tile_pages(table_row, tile + 2, end, num_blocks, CHUNK, KV_BLOCK_SIZE, KEYS, TOKENS,
                                                   LOAD)
                score_tile_rows(q_smem, w_smem, qs, ws, keys, scales, out_ptr, row0, stride_out, tile, row_ends,
                                range_end, HEADS, HEAD_CHUNK, CHUNK, ROWS, Q_IN_LDS, ACC, K_WIDTH, MMA, KEY_OPERAND,
                                True, HEAD_SUM)
                keys, scales = load_tile(kv_ptr, scale_ptr, pages_k, pages_s, tile + 2, stride_block, CHUNK, KV_BLOCK_SIZE,
                                         HEAD_DIM, PRESHUFFLE, KEYS, TOKENS, LOAD_KV, KV_32BIT)
                pages_k, pages_s = load_tile_pages(table_row, tile + 3, end, num_blocks, CHUNK, KV_BLOCK_SIZE, KEYS, TOKENS,
                                                   LOAD)
                score_tile_rows(q_smem, w_smem, qs, ws, keys_b, scales_b, out_ptr, row0, stride_out, tile + 1, row_ends,
                                range_end, HEADS, HEAD_CHUNK, CHUNK, ROWS, Q_IN_LDS, ACC, K_WIDTH, MMA, KEY_OPERAND,
                                True, HEAD_SUM)
        else:
            for tile in range(first, stop):
                if PREFETCH:
                    # In flight while this tile is scored: keys of tile + 1, blocks of tile + 2 (tiles
                    # past the range read block 0 or the next split's blocks; never stored).
                    next_keys, next_scales = load_tile(kv_ptr, scale_ptr, pages_k, pages_s, tile + 1, stride_block,
                                                       CHUNK, KV_BLOCK_SIZE, HEAD_DIM, PRESHUFFLE, KEYS, TOKENS, LOAD_KV,
                                                       KV_32BIT)
                    pages_k, pages_s = load_tile_pages(table_row, tile + 2, end, num_blocks, CHUNK, KV_BLOCK_SIZE, KEYS,
                                                       TOKENS, LOAD)
                else:
                    # One tile of keys in registers: other waves of the CU hide the load latency.
                    tile_pages_k, tile_pages_s = load_tile_pages(table_row, tile, end, num_blocks, CHUNK, KV_BLOCK_SIZE,
                                                                 KEYS, TOKENS, LOAD)
                    keys, scales = load_tile(kv_ptr, scale_ptr, tile_pages_k, tile_pages_s, tile, stride_block, CHUNK,
                                             KV_BLOCK_SIZE, HEAD_DIM, PRESHUFFLE, KEYS, TOKENS, LOAD_KV, KV_32BIT)
                score_tile_rows(q_smem, w_smem, qs, ws, keys, scales, out_ptr, row0, stride_out, tile, row_ends,
                                stop * CHUNK, HEADS, HEAD_CHUNK, CHUNK, ROWS, Q_IN_LDS, ACC, K_WIDTH, MMA, KEY_OPERAND,
                                False, HEAD_SUM)
                if PREFETCH:
                    keys = next_keys
                    scales = next_scales
        if Q_IN_LDS:
            thread_barrier()  # every warp is done with this segment's Q before the next one's


@gluon.jit
def logits_programs(
    q_ptr, kv_ptr, scale_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr,
    stride_q_b, stride_q_j, stride_q_h,
    stride_block,  # bytes between cache blocks (multiple of 4)
    stride_w, stride_out, stride_lens_b, stride_lens_j, stride_table,
    max_model_len, max_blocks, num_splits, batch, num_blocks,
    NEXT_N: gl.constexpr, HEADS: gl.constexpr, HEAD_DIM: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr,
    CHUNK: gl.constexpr, ROWS: gl.constexpr, PRESHUFFLE: gl.constexpr, LENS_2D: gl.constexpr,
    Q_IN_LDS: gl.constexpr, HEAD_CHUNK: gl.constexpr, PREFETCH: gl.constexpr, KV_32BIT: gl.constexpr,
    BALANCED: gl.constexpr,
    # arch atoms
    ACC: gl.constexpr, K_WIDTH: gl.constexpr, MMA: gl.constexpr, LOAD: gl.constexpr, LOAD_KV: gl.constexpr,
    THREADS_PER_WARP: gl.constexpr,
    KEY_LAYOUT: gl.constexpr, KEY_OPERAND: gl.constexpr, HEAD_SUM: gl.constexpr,
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
            gl.num_programs(0) // ROW_GROUPS, NEXT_N, LENS_2D, KV_BLOCK_SIZE, CHUNK,
            scan_layout(THREADS_PER_WARP, gl.num_warps()))
        while item < stop:
            count = share_run(lens_ptr, b, tile, item, stop, stride_lens_b, stride_lens_j, max_model_len, max_blocks,
                              NEXT_N, LENS_2D, KV_BLOCK_SIZE, CHUNK)
            score_rows_segment(q_ptr, kv_ptr, scale_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr, q_smem, w_smem,
                               b, group, tile, tile + count,
                               stride_q_b, stride_q_j, stride_q_h, stride_block, stride_w, stride_out, stride_lens_b,
                               stride_lens_j, stride_table, max_model_len, max_blocks, num_blocks,
                               NEXT_N, HEADS, HEAD_DIM, KV_BLOCK_SIZE, CHUNK, ROWS, PRESHUFFLE, LENS_2D, Q_IN_LDS,
                               HEAD_CHUNK, PREFETCH, KV_32BIT, ACC, K_WIDTH, MMA, LOAD, LOAD_KV, THREADS_PER_WARP,
                               KEY_LAYOUT, KEY_OPERAND, HEAD_SUM)
            item += gl.maximum(count, 0)  # zero-length sequences between long ones hold no items
            b += 1
            tile = tile * 0
    else:
        split = (pid // ROW_GROUPS) % num_splits
        b = pid // (ROW_GROUPS * num_splits)
        seq_len = sequence_length(lens_ptr, b, stride_lens_b, stride_lens_j, NEXT_N, LENS_2D)
        first, stop = split_tile_range(visible_end(seq_len, max_model_len, max_blocks, KV_BLOCK_SIZE), split, num_splits,
                                       CHUNK)
        score_rows_segment(q_ptr, kv_ptr, scale_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr, q_smem, w_smem,
                           b, group, first, stop,
                           stride_q_b, stride_q_j, stride_q_h, stride_block, stride_w, stride_out, stride_lens_b,
                           stride_lens_j, stride_table, max_model_len, max_blocks, num_blocks,
                           NEXT_N, HEADS, HEAD_DIM, KV_BLOCK_SIZE, CHUNK, ROWS, PRESHUFFLE, LENS_2D, Q_IN_LDS,
                           HEAD_CHUNK, PREFETCH, KV_32BIT, ACC, K_WIDTH, MMA, LOAD, LOAD_KV, THREADS_PER_WARP,
                           KEY_LAYOUT, KEY_OPERAND, HEAD_SUM)


@gluon.jit(do_not_specialize=DYNAMIC_PARAMS)
def register_mma_logits_kernel(
    q_ptr, kv_ptr, scale_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr,
    stride_q_b, stride_q_j, stride_q_h,
    stride_block,  # bytes between cache blocks (multiple of 4)
    stride_w, stride_out, stride_lens_b, stride_lens_j, stride_table,
    max_model_len, max_blocks, num_splits, batch, num_blocks,
    NEXT_N: gl.constexpr, HEADS: gl.constexpr, HEAD_DIM: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr,
    CHUNK: gl.constexpr, ROWS: gl.constexpr, PRESHUFFLE: gl.constexpr, LENS_2D: gl.constexpr,
    Q_IN_LDS: gl.constexpr, HEAD_CHUNK: gl.constexpr, PREFETCH: gl.constexpr, KV_32BIT: gl.constexpr,
    BALANCED: gl.constexpr,
    # arch atoms
    ACC: gl.constexpr, K_WIDTH: gl.constexpr, MMA: gl.constexpr, LOAD: gl.constexpr, LOAD_KV: gl.constexpr,
    THREADS_PER_WARP: gl.constexpr, HEAD_SUM: gl.constexpr,
):
    """The kernel: keys gathered straight into the MMA's B operand (:func:`logits_programs`)."""
    logits_programs(q_ptr, kv_ptr, scale_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr,
                    stride_q_b, stride_q_j, stride_q_h, stride_block, stride_w, stride_out, stride_lens_b,
                    stride_lens_j, stride_table, max_model_len, max_blocks, num_splits, batch, num_blocks,
                    NEXT_N, HEADS, HEAD_DIM, KV_BLOCK_SIZE, CHUNK, ROWS, PRESHUFFLE, LENS_2D, Q_IN_LDS, HEAD_CHUNK,
                    PREFETCH, KV_32BIT, BALANCED, ACC, K_WIDTH, MMA, LOAD, LOAD_KV, THREADS_PER_WARP,
                    None, None, HEAD_SUM)


@gluon.jit(do_not_specialize=DYNAMIC_PARAMS)
def register_mma_logits_kernel_key_layout(
    q_ptr, kv_ptr, scale_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr,
    stride_q_b, stride_q_j, stride_q_h,
    stride_block,  # bytes between cache blocks (multiple of 4)
    stride_w, stride_out, stride_lens_b, stride_lens_j, stride_table,
    max_model_len, max_blocks, num_splits, batch, num_blocks,
    NEXT_N: gl.constexpr, HEADS: gl.constexpr, HEAD_DIM: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr,
    CHUNK: gl.constexpr, ROWS: gl.constexpr, PRESHUFFLE: gl.constexpr, LENS_2D: gl.constexpr,
    Q_IN_LDS: gl.constexpr, HEAD_CHUNK: gl.constexpr, PREFETCH: gl.constexpr, KV_32BIT: gl.constexpr,
    BALANCED: gl.constexpr,
    # arch atoms
    ACC: gl.constexpr, K_WIDTH: gl.constexpr, MMA: gl.constexpr, LOAD: gl.constexpr, LOAD_KV: gl.constexpr,
    THREADS_PER_WARP: gl.constexpr,
    KEY_LAYOUT: gl.constexpr, KEY_OPERAND: gl.constexpr, HEAD_SUM: gl.constexpr,
):
    """The kernel with keys gathered in ``KEY_LAYOUT`` and turned into the B operand by
    ``KEY_OPERAND`` (see the module docstring; :func:`logits_programs`)."""
    logits_programs(q_ptr, kv_ptr, scale_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr,
                    stride_q_b, stride_q_j, stride_q_h, stride_block, stride_w, stride_out, stride_lens_b,
                    stride_lens_j, stride_table, max_model_len, max_blocks, num_splits, batch, num_blocks,
                    NEXT_N, HEADS, HEAD_DIM, KV_BLOCK_SIZE, CHUNK, ROWS, PRESHUFFLE, LENS_2D, Q_IN_LDS, HEAD_CHUNK,
                    PREFETCH, KV_32BIT, BALANCED, ACC, K_WIDTH, MMA, LOAD, LOAD_KV, THREADS_PER_WARP,
                    KEY_LAYOUT, KEY_OPERAND, HEAD_SUM)
