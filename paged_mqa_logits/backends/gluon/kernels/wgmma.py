"""sm_90 peak-speed variant of the ``gluon`` backend: fp8 ``wgmma`` on key tiles streamed by cp.async.

Design (and why):

* **Tokens are the M dimension.** A tile is ``ChunkK`` keys ``[ChunkK, 128]`` fp8, token-major
  (= K-major, which fp8 wgmma requires of both operands). The B operand is ``Q^T``: Q of the
  sequence sits in shared memory (loaded once per program) and is viewed transposed, so one
  ``wgmma m64nNk32`` scores 64 keys against ``N = rows * H`` query heads. An accumulator row is
  a token and its columns are ``(j, h)``: the key scale is one register per accumulator row,
  the weights are per-column values (registers for one row group, else read from shared
  memory per group), and the head sum is in-thread adds plus two quad shuffles (the MMA layout
  gives each quad of lanes whole rows).
* **Each key is read once for all next_n rows.** The rows are cut into groups of at most
  ``RowsPerMMA`` rows (powers of two: Triton shapes are), ``N = group_rows * H <= 256``. Every
  group reuses the tile in shared memory. With several groups, the wgmma of group ``g + 1`` is
  issued before the epilogue of group ``g``, so the tensor cores and the fp32 epilogue
  (scale, ReLU, weight, head sum: ~3 fp32 ops per score) overlap inside the warpgroup; across
  programs, 2-3 programs per SM interleave the same way.
* **Keys arrive by per-token cp.async gathers** (16 bytes per thread) into a ring of
  ``num_stages`` tiles (NVMMA 128-byte swizzle, the wgmma A layout). A gather serves every
  block size (1..256), the block-table indirection and the Preshuffle byte order with the same
  code. (TMA would need the plain layout, 16-byte-aligned block strides and one box per block;
  the gather needs none of that and the copy engine is not the bottleneck.)
* **Two schedules** (``schedule.py``). ``Schedule=split``: program ``(split, b)`` owns tiles
  ``split, split + num_splits, ...`` of sequence ``b`` (round-robin); its first tiles do not
  depend on the lengths, so their block-table entries, Q and the weights load *in parallel*
  with the lengths (the chain before the first key copy is one memory latency, not two);
  ``SplitKV = 0`` sizes the grid for one wave (``wgmma.derive_splits``) from the
  host's context hint, so on a batch of widely spread lengths the short sequences' programs idle.
  ``Schedule=balanced``: one persistent wave of ``SMs x programs per SM`` programs (the
  compiled kernel's own occupancy, ``wgmma.resident_programs``), each taking an
  equal share of the batch's tiles from an in-kernel prefix sum over the lengths
  (``device.balanced_share``) and walking it as segments, one sequence each
  (:func:`_score_segment`: the ring restarts, Q and the weights are reloaded, at every sequence
  boundary). In steady state the table entries of the next tile to issue are prefetched one
  iteration ahead either way.
* **One warpgroup per program** (4 warps).

Ring protocol (iteration ``i``, tile ``i`` in slot ``i % S``, one cp.async group per tile, Q in
the group before them): ``cp.async.wait_group(S - 2)`` (this thread's copies of tile ``i``
landed; groups complete in order) -> ``fence.proxy.async`` (they become visible to the async
proxy wgmma reads through) -> ``bar.sync`` (everyone's did; everyone finished iteration
``i - 1``, whose wgmmas were waited for to 0 and whose scales were read) -> issue tile
``i + S - 1`` into the slot tile ``i - 1`` used -> wgmma + epilogue of tile ``i``. Copies past
the program's last tile are masked (zero-fill a slot nobody reads), so every iteration commits
exactly one group; the program waits for all groups before it exits (masked copies still write).
The compiler's shared-memory barrier analysis adds two more ``bar.sync`` per iteration (it
cannot tell ring slots apart); they are redundant but harmless.

Semantics follow ``problem.py``: row ``j`` sees ``p < min(row_len(b, j), max_model_len, table
width)``; nothing else of ``out`` is written; cache and output offsets are 64-bit; block ids
are clamped into ``[0, num_blocks)``. The key scale is factored out of the ReLU (exact for the
non-negative scales of fp8 quantisation).

This module is the device side: the kernel, its layouts and device helpers (the warp-specialised
variant, ``wgmma_ws.py``, reuses them). The knobs, the resource rules and the launch
plan are the host side, ``backends/gluon/wgmma.py``.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ....triton_internals.gluon_api import (async_copy, fence_async_shared, thread_barrier, warpgroup_mma,
                                            warpgroup_mma_wait)
from . import device
from .device import DYNAMIC_PARAMS

# The facts both sides read (the host module imports them from here: the kernel never imports
# the host side).
NUM_WARPS = 4  # one warpgroup, wgmma's unit
HEAD_DIM = 128
# Device-side copies of constants (jitted code may only read constexpr globals).
_D = gl.constexpr(HEAD_DIM)
#: NUM_WARPS as a constexpr, for layouts built in jitted code; shared with the wgmma_ws kernel
WARPS = gl.constexpr(NUM_WARPS)


# ----------------------------------------------------------------------------- layouts
# Every layout of the kernel, chosen here:
#
# COPY: a [rows, 128] byte tile, 16 bytes (one cp.async) per thread: 8 threads cover a 128-byte
#   row, a warp 4 rows, the warpgroup 16 rows; taller tiles repeat over registers.
# SCALE_COPY: [ChunkK] fp32 scales, one 4-byte cp.async per thread (replicas, when ChunkK < 128,
#   are predicated off by the compiler).
# MMA(N): the wgmma accumulator [ChunkK, N]: warp w holds rows 16w..16w+15 (+64 per repeat),
#   lane l rows l/4 and l/4+8 and columns 2(l%4), 2(l%4)+1 of every 8: a row's scores sit in one
#   quad of lanes.
# TILE_SMEM: NVMMA shared layout, 128-byte swizzle, 8-bit: the K-major A (keys) and B (Q^T,
#   through a transposed view of Q [rows*H, 128]) operands of fp8 wgmma.
# VEC_SMEM: plain 1-D/2-D shared vectors (scales ring, weights, row limits).
@gluon.constexpr_function
def _copy_layout():
    return gl.BlockedLayout([1, 16], [4, 8], [WARPS, 1], [1, 0])


@gluon.constexpr_function
def _scale_copy_layout():
    return gl.BlockedLayout([1], [32], [WARPS], [0])


@gluon.constexpr_function
def wgmma_acc_layout(n):
    """MMA(N): the layout of the wgmma accumulator ``[ChunkK, n]`` (see above); shared with the
    wgmma_ws and wgmma_pipes kernels."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, n, 32])


@gluon.constexpr_function
def tile_smem_layout():
    """The NVMMA 128-byte-swizzled layout of a key or Q tile in shared memory (the wgmma operand);
    shared with the wgmma_ws, wgmma_pipes and wgmma_fp4 kernels."""
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)


@gluon.constexpr_function
def vec_smem_layout():
    """The plain layout of a 1-D vector (weights, row limits, scales) in shared memory; shared
    with the wgmma_ws, wgmma_pipes and wgmma_fp4 kernels."""
    return gl.SwizzledSharedLayout(1, 1, 1, [0])


# The tensor-core head sum (``HeadSum=tensor``), for a row group of ``rows`` rows:
#
# HEADSUM(rows): the accumulator [ChunkK, n] of the head-sum wgmma, n = headsum_columns(rows)
#   (a hi and a lo column per row, at least wgmma's smallest N, 8). Its A operand is
#   DotOperandLayout(0, HEADSUM, k_width=2): a lane of MMA(N) holds the two adjacent columns of
#   its rows that one bf16x2 register of that operand layout holds, so the ReLU'd scores, packed
#   by ``cvt.rn.relu.bf16x2.f32``, convert to it without moving a value.
# HEADSUM_SMEM(K): the head-sum weights [n, K] bf16, K-major (the B operand read transposed, as Q
#   is), in the widest swizzle a K-row of bf16 fills (64 bytes at K = 32).
# HEADSUM_FILL: the warpgroup writing those weights, 8 bf16 (16 bytes) per thread.
@gluon.constexpr_function
def headsum_columns(rows):
    return max(8, 2 * int(rows))


@gluon.constexpr_function
def headsum_layout(rows):
    """HEADSUM(rows): the layout of the head-sum wgmma's accumulator (see above); shared with the
    wgmma_pipes kernel."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                     instr_shape=[16, headsum_columns(rows), 16])


@gluon.constexpr_function
def headsum_smem_layout(k):
    return gl.NVMMASharedLayout(swizzle_byte_width=min(128, 2 * int(k)), element_bitwidth=16, rank=2)


@gluon.constexpr_function
def _headsum_fill_layout():
    return gl.BlockedLayout([1, 8], [1, 32], [WARPS, 1], [1, 0])


# ----------------------------------------------------------------------------- row groups
@gluon.constexpr_function
def row_groups(next_n, rows_per_mma):
    """``(first_row, rows)`` of each wgmma: greedy powers of two of at most ``rows_per_mma``,
    e.g. next_n 7, RowsPerMMA 4 -> (0, 4), (4, 2), (6, 1)."""
    groups, row = [], 0
    while row < next_n:
        size = 1
        while size * 2 <= min(rows_per_mma, next_n - row):
            size *= 2
        groups.append((row, size))
        row += size
    return tuple(groups)


@gluon.constexpr_function
def part_groups(next_n, rows_per_mma, part, row_split):
    """Indices of the row groups consumer part ``part`` of ``row_split`` scores (every
    ``row_split``-th group from ``part``)."""
    return tuple(range(part, len(row_groups(next_n, rows_per_mma)), row_split))


@gluon.constexpr_function
def part_group_count(next_n, rows_per_mma, row_split):
    """Row groups of a consumer's first part (the most any part scores)."""
    return len(part_groups(next_n, rows_per_mma, 0, row_split))


@gluon.constexpr_function
def headsum_rows(next_n, rows_per_mma):
    """Rows of every row group (``HeadSum=tensor`` runs only where the groups are equal)."""
    return row_groups(next_n, rows_per_mma)[0][1]


@gluon.constexpr_function
def _num_groups(next_n, rows_per_mma):
    return len(row_groups(next_n, rows_per_mma))


@gluon.constexpr_function
def group_first_row(next_n, rows_per_mma, g):
    """The first row of row group ``g`` (of :func:`row_groups`)."""
    return row_groups(next_n, rows_per_mma)[g][0]


@gluon.constexpr_function
def group_rows(next_n, rows_per_mma, g):
    """The number of rows of row group ``g`` (of :func:`row_groups`)."""
    return row_groups(next_n, rows_per_mma)[g][1]


# ----------------------------------------------------------------------------- device helpers
@gluon.jit
def gather(base, offsets, mask, other):
    """A masked register load of ``base + offsets``; the wgmma kernels' one gather helper."""
    return gl.load(base + offsets, mask=mask, other=other)


@gluon.jit
def row_limits(lens_ptr, b, seq_len, end, stride_lens_b, stride_lens_j, j, NEXT_N: gl.constexpr,
                LENS_2D: gl.constexpr):
    """First invisible position ``min(row_len(b, j), end)`` of query rows ``j`` (a tensor;
    rows ``j >= NEXT_N`` get 0). Vector form of ``device.row_length``."""
    if LENS_2D:
        row_len = gl.load(lens_ptr + b.to(gl.int64) * stride_lens_b + j * stride_lens_j, mask=j < NEXT_N, other=0)
    else:
        row_len = seq_len - (NEXT_N - 1) + j
    return gl.where(j < NEXT_N, gl.minimum(gl.maximum(row_len, 0), end), 0)


@gluon.jit
def copy_query(q_ptr, q_smem, b, stride_q_b, stride_q_j, stride_q_h, NEXT_N: gl.constexpr,
               NEXT_N_POW2: gl.constexpr, HEADS: gl.constexpr, Q_ASYNC: gl.constexpr):
    """Sequence ``b``'s query rows into ``q_smem`` (row ``j * H + h``; rows past ``NEXT_N * H``
    zero): a cp.async the caller commits and waits for, or, when q rows are not 16-byte aligned
    (cp.async needs >= 4), a plain load stored to shared memory."""
    copy_layout: gl.constexpr = _copy_layout()
    m = gl.arange(0, NEXT_N_POW2 * HEADS, gl.SliceLayout(1, copy_layout))
    d = gl.arange(0, _D, gl.SliceLayout(0, copy_layout))
    q_rows = b.to(gl.int64) * stride_q_b + (m // HEADS) * stride_q_j + (m % HEADS) * stride_q_h
    q_ptrs = q_ptr + q_rows[:, None] + d[None, :]
    q_mask = (m < NEXT_N * HEADS)[:, None]
    if Q_ASYNC:
        async_copy.async_copy_global_to_shared(q_smem, q_ptrs, mask=q_mask)
    else:
        q_smem.store(gl.load(q_ptrs, mask=q_mask, other=0.0))


@gluon.jit
def load_weights(weights_ptr, b, stride_w, NEXT_N: gl.constexpr, NEXT_N_POW2: gl.constexpr, HEADS: gl.constexpr,
                  LAYOUT: gl.constexpr):
    """Sequence ``b``'s weights in Q's row order (``j * H + h``; 0 past ``NEXT_N * H``)."""
    mw = gl.arange(0, NEXT_N_POW2 * HEADS, LAYOUT)
    return gl.load(weights_ptr + (b.to(gl.int64) * NEXT_N + mw // HEADS) * stride_w + mw % HEADS,
                   mask=mw < NEXT_N * HEADS, other=0.0)


@gluon.jit
def _key_offsets(pages, tokens, d, stride_block, KV_BLOCK_SIZE: gl.constexpr, PRESHUFFLE: gl.constexpr):
    """int64 byte offsets ``[T, D]`` (token-major, the orientation of a wgmma A tile) of the key
    bytes of ``tokens`` (with cache blocks ``pages``) and dims ``d``."""
    token_part, dim_part = device.key_offset_parts(pages, tokens, d, stride_block, KV_BLOCK_SIZE, _D, PRESHUFFLE)
    return token_part[:, None] + dim_part[None, :]


@gluon.jit
def key_scale_pages(table_row, tile, table_tokens, num_blocks, CHUNK: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr):
    """Cache blocks of ``tile``'s tokens in the two copy layouts (read twice from the table,
    L1-resident, rather than moved between layouts). Masked by the table width only, a host
    value, so they can load before the lengths arrive; entries past a sequence may be garbage
    (-1): those tokens are never copied."""
    key_tokens = tile * CHUNK + gl.arange(0, CHUNK, gl.SliceLayout(1, _copy_layout()))
    scale_tokens = tile * CHUNK + gl.arange(0, CHUNK, _scale_copy_layout())
    return (device.tile_pages(table_row, key_tokens, table_tokens, num_blocks, KV_BLOCK_SIZE, gather),
            device.tile_pages(table_row, scale_tokens, table_tokens, num_blocks, KV_BLOCK_SIZE, gather))


@gluon.jit
def issue_tile(key_dst, scale_dst, kv_ptr, scale_ptr, pages, tile, end, stride_block,
               CHUNK: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr, PRESHUFFLE: gl.constexpr, KV_ALIGN: gl.constexpr):
    """cp.async the keys and scales of ``tile``'s tokens ``< end`` into one ring slot (masked
    tokens are zero-filled and never stored); ``pages`` from :func:`key_scale_pages`.

    ``KV_ALIGN``: 16 when the cache base and block stride are 16-byte aligned (the JIT then
    knows it and copies 16 bytes per cp.async); else 4, which the contract guarantees (fp32
    scales) but the JIT cannot see, so it is stated on the addresses (cp.async moves >= 4)."""
    key_pages, scale_pages = pages
    copy_layout: gl.constexpr = _copy_layout()
    tokens = tile * CHUNK + gl.arange(0, CHUNK, gl.SliceLayout(1, copy_layout))
    d = gl.arange(0, _D, gl.SliceLayout(0, copy_layout))
    offsets = _key_offsets(key_pages, tokens, d, stride_block, KV_BLOCK_SIZE, PRESHUFFLE)
    key_ptrs = kv_ptr + offsets
    if KV_ALIGN < 16:
        key_ptrs = gl.multiple_of(key_ptrs, [KV_ALIGN, KV_ALIGN])
    async_copy.async_copy_global_to_shared(key_dst, key_ptrs, mask=(tokens < end)[:, None])
    issue_scales(scale_dst, scale_ptr, scale_pages, tile, end, stride_block, CHUNK, KV_BLOCK_SIZE)


@gluon.jit
def issue_scales(scale_dst, scale_ptr, scale_pages, tile, end, stride_block, CHUNK: gl.constexpr,
                 KV_BLOCK_SIZE: gl.constexpr):
    """cp.async the fp32 scales of ``tile``'s tokens ``< end`` (the rest are zero-filled)."""
    scale_tokens = tile * CHUNK + gl.arange(0, CHUNK, _scale_copy_layout())
    async_copy.async_copy_global_to_shared(
        scale_dst, scale_ptr + device.scale_offsets(scale_pages, scale_tokens, stride_block, KV_BLOCK_SIZE, _D),
        mask=scale_tokens < end)


@gluon.jit
def group_logits(scores, scale, weight, CHUNK: gl.constexpr, ROWS: gl.constexpr, HEADS: gl.constexpr):
    """``[CHUNK, ROWS*H]`` scores -> ``[CHUNK, ROWS]``: ``scale * sum_h w * relu(score)``.
    ``scale`` is per accumulator row (token), ``weight`` per column (j, h). Factoring the key
    scale out of the ReLU (exact for the non-negative scales of fp8 quantisation, as DeepGEMM
    does) leaves two fp32 ops per score: the epilogue is what bounds next_n >= 2."""
    y = gl.maximum(scores, 0.0) * weight[None, :]
    logits = gl.sum(gl.reshape(y, [CHUNK, ROWS, HEADS]), axis=2)
    return logits * gl.convert_layout(scale, gl.SliceLayout(1, logits.type.layout))[:, None]


@gluon.jit
def write_headsum_weights(headsum_smem, weight_smem, FIRST_ROW: gl.constexpr, ROWS: gl.constexpr,
                          HEADS: gl.constexpr):
    """``headsum_smem`` ``[n, ROWS*H]`` bf16 := the row group's weights as the B operand of the head
    sum: column ``(r, h)`` holds ``hi = bf16(w[r, h])`` in row ``2r`` and ``lo = bf16(w - hi)`` in row
    ``2r + 1``, zero elsewhere, so ``hi + lo`` keeps ~16 bits of each weight. Read from the fp32
    weights of the sequence in ``weight_smem`` (row ``j``'s head ``h`` at ``j * H + h``)."""
    N: gl.constexpr = headsum_columns(ROWS)
    K: gl.constexpr = ROWS * HEADS
    layout: gl.constexpr = _headsum_fill_layout()
    w = weight_smem.slice(FIRST_ROW * HEADS, K).load(gl.SliceLayout(0, layout))
    hi = w.to(gl.bfloat16)
    lo = (w - hi.to(gl.float32)).to(gl.bfloat16)
    column = gl.arange(0, N, gl.SliceLayout(1, layout))[:, None]
    hi_column = 2 * (gl.arange(0, K, gl.SliceLayout(0, layout)) // HEADS)[None, :]
    zero = gl.zeros([N, K], gl.bfloat16, layout)
    headsum_smem.store(gl.where(column == hi_column, hi[None, :] + zero,
                                gl.where(column == hi_column + 1, lo[None, :] + zero, zero)))


@gluon.jit
def issue_tensor_head_sum(scores, headsum_smem, ROWS: gl.constexpr):
    """Start the head sum of a row group's ``[ChunkK, ROWS*H]`` fp32 scores on the tensor cores:
    ReLU and round to bf16 in one ``cvt.rn.relu.bf16x2.f32`` per two scores, then a bf16 wgmma
    against the split weights (:func:`write_headsum_weights`). Returns ``(token, operand)``, both
    to be kept alive until :func:`finish_tensor_head_sum`."""
    layout: gl.constexpr = headsum_layout(ROWS)
    relu = gl.inline_asm_elementwise("cvt.rn.relu.bf16x2.f32 $0, $2, $1;", "=r,r,r", [scores],
                                     dtype=gl.bfloat16, is_pure=True, pack=2)
    operand = gl.convert_layout(relu, gl.DotOperandLayout(0, layout, 2))
    acc = gl.zeros([scores.shape[0], headsum_columns(ROWS)], gl.float32, layout)
    return warpgroup_mma(operand, headsum_smem.permute((1, 0)), acc, use_acc=False, is_async=True), operand


@gluon.jit
def finish_tensor_head_sum(pending, operand, scale, NEWER: gl.constexpr):
    """Wait for a head-sum wgmma (``NEWER`` later ones stay in flight) and return
    ``[ChunkK, n/2]``: ``scale * (hi + lo)`` per row of the group (columns past its rows are 0)."""
    pairs, _ = warpgroup_mma_wait(NEWER, deps=(pending, operand))
    summed = gl.sum(gl.reshape(pairs, [pairs.shape[0], pairs.shape[1] // 2, 2]), axis=2)
    return summed * gl.convert_layout(scale, gl.SliceLayout(1, summed.type.layout))[:, None]


@gluon.jit
def headsum_row_limits(lens_ptr, b, seq_len, end, stride_lens_b, stride_lens_j, NEXT_N: gl.constexpr,
                       FIRST_ROW: gl.constexpr, ROWS: gl.constexpr, LENS_2D: gl.constexpr, TOKENS: gl.constexpr):
    """The visible limits of a row group's rows in the layout of :func:`finish_tensor_head_sum`'s
    ``[TOKENS, n/2]`` result (which depends on TOKENS: the sum is over a reshape); the columns the
    head sum pads the group with (rows of other groups, or past next_n) get 0, so nothing of theirs
    is stored. The wgmma_ws and wgmma_pipes kernels' one source of these limits."""
    pairs = gl.zeros([TOKENS, headsum_columns(ROWS)], gl.float32, headsum_layout(ROWS))
    summed = gl.sum(gl.reshape(pairs, [TOKENS, headsum_columns(ROWS) // 2, 2]), axis=2)
    j = FIRST_ROW + gl.arange(0, summed.shape[1], gl.SliceLayout(0, summed.type.layout))
    limit = row_limits(lens_ptr, b, seq_len, end, stride_lens_b, stride_lens_j, j, NEXT_N, LENS_2D)
    return gl.where(j < FIRST_ROW + ROWS, limit, 0)


@gluon.jit
def store_logits(out_ptr, logits, b, tile, limits, stride_out, NEXT_N: gl.constexpr,
                 FIRST_ROW: gl.constexpr, ROWS: gl.constexpr, CHUNK: gl.constexpr):
    """``out[b*NEXT_N + j, p] = logits`` for rows ``FIRST_ROW..+ROWS`` where ``p < limits[j]``."""
    _store_logits_from(out_ptr, logits, b, tile * CHUNK, limits, stride_out, NEXT_N, FIRST_ROW, ROWS, CHUNK)


@gluon.jit
def _store_logits_from(out_ptr, logits, b, first_token, limits, stride_out, NEXT_N: gl.constexpr,
                       FIRST_ROW: gl.constexpr, ROWS: gl.constexpr, TOKENS: gl.constexpr):
    """The logits of tokens ``first_token..+TOKENS`` (see :func:`store_logits`), rounded once
    to the output's dtype (a no-op for fp32 logits)."""
    layout: gl.constexpr = logits.type.layout
    p = first_token + gl.arange(0, TOKENS, gl.SliceLayout(1, layout))
    j = FIRST_ROW + gl.arange(0, ROWS, gl.SliceLayout(0, layout))
    row_start = (b.to(gl.int64) * NEXT_N + j) * stride_out
    gl.store(out_ptr + row_start[None, :] + p[:, None], logits.to(out_ptr.dtype.element_ty),
             mask=p[:, None] < limits[None, :])


@gluon.jit
def _score_tile_halves(keys, q_smem, scale_slot, weight_regs, limit_smem, out_ptr, b, tile, stride_out,
                       NEXT_N: gl.constexpr, HEADS: gl.constexpr, CHUNK: gl.constexpr):
    """A single row group over a 128-token tile as two 64-token wgmmas: the second runs on the
    tensor cores while the first half's epilogue runs on the ALUs (same registers as one
    128-row accumulator)."""
    HALF: gl.constexpr = CHUNK // 2
    layout: gl.constexpr = wgmma_acc_layout(NEXT_N * HEADS)
    q_t = q_smem.slice(0, NEXT_N * HEADS).permute((1, 0))
    first = warpgroup_mma(keys.slice(0, HALF), q_t, gl.zeros([HALF, NEXT_N * HEADS], gl.float32, layout),
                          use_acc=False, is_async=True)
    second = warpgroup_mma(keys.slice(HALF, HALF), q_t, gl.zeros([HALF, NEXT_N * HEADS], gl.float32, layout),
                           use_acc=False, is_async=True)
    first = warpgroup_mma_wait(1, deps=(first,))
    logits = group_logits(first, scale_slot.slice(0, HALF).load(gl.SliceLayout(1, layout)), weight_regs,
                          HALF, NEXT_N, HEADS)
    limits = limit_smem.load(gl.SliceLayout(0, logits.type.layout))
    _store_logits_from(out_ptr, logits, b, tile * CHUNK, limits, stride_out, NEXT_N, 0, NEXT_N, HALF)
    second = warpgroup_mma_wait(0, deps=(second,))
    logits = group_logits(second, scale_slot.slice(HALF, HALF).load(gl.SliceLayout(1, layout)), weight_regs,
                          HALF, NEXT_N, HEADS)
    _store_logits_from(out_ptr, logits, b, tile * CHUNK + HALF, limits, stride_out, NEXT_N, 0, NEXT_N, HALF)


@gluon.jit
def issue_group(keys, q_smem, g: gl.constexpr, NEXT_N: gl.constexpr, HEADS: gl.constexpr, CHUNK: gl.constexpr,
                ROWS_PER_MMA: gl.constexpr):
    """Start the asynchronous wgmma of row group ``g``: scores ``[CHUNK, rows*H]``."""
    first: gl.constexpr = group_first_row(NEXT_N, ROWS_PER_MMA, g)
    rows: gl.constexpr = group_rows(NEXT_N, ROWS_PER_MMA, g)
    acc = gl.zeros([CHUNK, rows * HEADS], gl.float32, wgmma_acc_layout(rows * HEADS))
    return warpgroup_mma(keys, q_smem.slice(first * HEADS, rows * HEADS).permute((1, 0)), acc, use_acc=False,
                         is_async=True)


@gluon.jit
def _finish_group(scores, scale_slot, weight_smem, limit_smem, out_ptr, b, tile, stride_out, g: gl.constexpr,
                  NEXT_N: gl.constexpr, HEADS: gl.constexpr, CHUNK: gl.constexpr, ROWS_PER_MMA: gl.constexpr):
    """Epilogue and store of row group ``g`` of a tile (its wgmma already waited for)."""
    first: gl.constexpr = group_first_row(NEXT_N, ROWS_PER_MMA, g)
    rows: gl.constexpr = group_rows(NEXT_N, ROWS_PER_MMA, g)
    layout: gl.constexpr = wgmma_acc_layout(rows * HEADS)
    scale = scale_slot.load(gl.SliceLayout(1, layout))
    weight = weight_smem.slice(first * HEADS, rows * HEADS).load(gl.SliceLayout(0, layout))
    logits = group_logits(scores, scale, weight, CHUNK, rows, HEADS)
    limits = limit_smem.slice(first, rows).load(gl.SliceLayout(0, logits.type.layout))
    store_logits(out_ptr, logits, b, tile, limits, stride_out, NEXT_N, first, rows, CHUNK)


@gluon.jit
def score_tile_groups(keys, q_smem, scale_slot, weight_smem, limit_smem, out_ptr, b, tile, stride_out,
                      NEXT_N: gl.constexpr, HEADS: gl.constexpr, CHUNK: gl.constexpr, ROWS_PER_MMA: gl.constexpr,
                      FIRST_GROUP: gl.constexpr, GROUP_STEP: gl.constexpr):
    """Row groups ``FIRST_GROUP, FIRST_GROUP + GROUP_STEP, ...`` of one tile (every group: 0, 1;
    none when ``FIRST_GROUP`` is past the last); each next group's wgmma runs during the
    previous group's epilogue."""
    NUM_GROUPS: gl.constexpr = _num_groups(NEXT_N, ROWS_PER_MMA)
    if FIRST_GROUP < NUM_GROUPS:
        pending = issue_group(keys, q_smem, FIRST_GROUP, NEXT_N, HEADS, CHUNK, ROWS_PER_MMA)
        for g in gl.static_range(FIRST_GROUP + GROUP_STEP, NUM_GROUPS, GROUP_STEP):
            issued = issue_group(keys, q_smem, g, NEXT_N, HEADS, CHUNK, ROWS_PER_MMA)
            done = warpgroup_mma_wait(1, deps=(pending,))
            _finish_group(done, scale_slot, weight_smem, limit_smem, out_ptr, b, tile, stride_out, g - GROUP_STEP,
                          NEXT_N, HEADS, CHUNK, ROWS_PER_MMA)
            pending = issued
        done = warpgroup_mma_wait(0, deps=(pending,))
        LAST: gl.constexpr = FIRST_GROUP + (NUM_GROUPS - 1 - FIRST_GROUP) // GROUP_STEP * GROUP_STEP
        _finish_group(done, scale_slot, weight_smem, limit_smem, out_ptr, b, tile, stride_out, LAST,
                      NEXT_N, HEADS, CHUNK, ROWS_PER_MMA)


@gluon.jit
def single_group_weights(weight_smem, NEXT_N: gl.constexpr, HEADS: gl.constexpr, ROWS_PER_MMA: gl.constexpr):
    """When one wgmma covers every row, its weights in the accumulator's column layout, kept in
    registers for a whole segment; 0 with several row groups, whose epilogues read their
    slices of ``weight_smem`` per tile. ``weight_smem`` must be visible to every thread."""
    if _num_groups(NEXT_N, ROWS_PER_MMA) == 1:
        weight_regs = weight_smem.slice(0, NEXT_N * HEADS).load(gl.SliceLayout(0, wgmma_acc_layout(NEXT_N * HEADS)))
    else:
        weight_regs = 0
    return weight_regs


@gluon.jit
def score_tile(keys, q_smem, scale_slot, weight_regs, weight_smem, limit_smem, out_ptr, b, tile, stride_out,
                NEXT_N: gl.constexpr, HEADS: gl.constexpr, CHUNK: gl.constexpr, ROWS_PER_MMA: gl.constexpr):
    """Scores, epilogue and store of one tile (its keys and scales landed in a ring slot)
    against all next_n rows of sequence ``b``: a single row group as two 64-token halves
    (128-token tiles) or whole, else every row group (:func:`score_tile_groups`).
    ``weight_regs`` from :func:`single_group_weights`."""
    NUM_GROUPS: gl.constexpr = _num_groups(NEXT_N, ROWS_PER_MMA)
    if NUM_GROUPS == 1 and CHUNK == 128:
        _score_tile_halves(keys, q_smem, scale_slot, weight_regs, limit_smem, out_ptr, b, tile, stride_out,
                           NEXT_N, HEADS, CHUNK)
    elif NUM_GROUPS == 1:
        mma_layout: gl.constexpr = wgmma_acc_layout(NEXT_N * HEADS)
        scores = warpgroup_mma(keys, q_smem.slice(0, NEXT_N * HEADS).permute((1, 0)),
                               gl.zeros([CHUNK, NEXT_N * HEADS], gl.float32, mma_layout), use_acc=False,
                               is_async=True)
        scale = scale_slot.load(gl.SliceLayout(1, mma_layout))
        scores = warpgroup_mma_wait(0, deps=(scores,))
        logits = group_logits(scores, scale, weight_regs, CHUNK, NEXT_N, HEADS)
        limits = limit_smem.load(gl.SliceLayout(0, logits.type.layout))
        store_logits(out_ptr, logits, b, tile, limits, stride_out, NEXT_N, 0, NEXT_N, CHUNK)
    else:
        score_tile_groups(keys, q_smem, scale_slot, weight_smem, limit_smem, out_ptr, b, tile, stride_out,
                          NEXT_N, HEADS, CHUNK, ROWS_PER_MMA, 0, 1)


@gluon.jit
def allocate_headsum_weights(placeholder, NEXT_N: gl.constexpr, HEADS: gl.constexpr, ROWS_PER_MMA: gl.constexpr,
                             COPIES: gl.constexpr, ROW_SPLIT: gl.constexpr, HEAD_SUM: gl.constexpr):
    """``HeadSum=tensor``: the head sum's split weights, one ``[n, rows * H]`` bf16 buffer per row
    group of a part (every ``ROW_SPLIT``-th group), ``COPIES`` times (one per consumer warpgroup);
    else ``placeholder``, never read (a warp-specialised partition's arguments cannot hold None)."""
    if HEAD_SUM:
        ROWS: gl.constexpr = headsum_rows(NEXT_N, ROWS_PER_MMA)
        smem = gl.allocate_shared_memory(
            gl.bfloat16, [COPIES * part_group_count(NEXT_N, ROWS_PER_MMA, ROW_SPLIT), headsum_columns(ROWS),
                          ROWS * HEADS], headsum_smem_layout(ROWS * HEADS))
    else:
        smem = placeholder
    return smem


@gluon.jit
def tensor_operands(weight_smem, headsum_smem, lens_ptr, b, seq_len, end, stride_lens_b, stride_lens_j,
                    NEXT_N: gl.constexpr, HEADS: gl.constexpr, ROWS_PER_MMA: gl.constexpr, LENS_2D: gl.constexpr,
                    CHUNK: gl.constexpr, GROUPS: gl.constexpr, ROLE: gl.constexpr):
    """``HeadSum=tensor``: the split bf16 weights of each row group in ``GROUPS`` (those warpgroup
    ``ROLE`` scores) into its buffer of ``headsum_smem`` (from the sequence's fp32 weights in
    ``weight_smem``, already visible to the warpgroup), and the groups' row limits in registers;
    visible to wgmma's async proxy on return. The wgmma, wgmma_fp4 and wgmma_ws kernels' one copy."""
    limits = ()
    for i in gl.static_range(len(GROUPS)):
        # (no constexpr locals: a static loop may not rebind them)
        write_headsum_weights(headsum_smem.index(ROLE * len(GROUPS) + i), weight_smem,
                              group_first_row(NEXT_N, ROWS_PER_MMA, GROUPS[i]),
                              group_rows(NEXT_N, ROWS_PER_MMA, GROUPS[i]), HEADS)
        limits = limits + (headsum_row_limits(lens_ptr, b, seq_len, end, stride_lens_b, stride_lens_j, NEXT_N,
                                              group_first_row(NEXT_N, ROWS_PER_MMA, GROUPS[i]),
                                              group_rows(NEXT_N, ROWS_PER_MMA, GROUPS[i]), LENS_2D, CHUNK),)
    fence_async_shared()  # the weights' generic-proxy stores, seen by wgmma's async proxy
    thread_barrier()  # ... from every warp of the warpgroup
    return limits


@gluon.jit
def score_tile_tensor(keys, q_smem, scale_slot, headsum_smem, limits, out_ptr, b, tile, stride_out,
                      NEXT_N: gl.constexpr, HEADS: gl.constexpr, CHUNK: gl.constexpr, ROWS_PER_MMA: gl.constexpr,
                      GROUPS: gl.constexpr, ROLE: gl.constexpr):
    """``HeadSum=tensor``: the score wgmmas of the row groups ``GROUPS`` of one tile, all in flight
    at once; each, once done, ReLU'd and packed to bf16 and fed to its head-sum wgmma (while the
    later score wgmmas still run); then each group's ``scale * (hi + lo)`` stored. Waits count
    wgmmas in issue order: retiring the ``i``-th score with ``i`` head sums issued after the
    scores leaves ``len(GROUPS) - 1`` newer ones in flight, whichever they are. Every wgmma has
    retired on return, so the caller may free the tile."""
    L: gl.constexpr = len(GROUPS)
    pending = ()
    for i in gl.static_range(L):
        pending = pending + (issue_group(keys, q_smem, GROUPS[i], NEXT_N, HEADS, CHUNK, ROWS_PER_MMA),)
    ROWS0: gl.constexpr = group_rows(NEXT_N, ROWS_PER_MMA, GROUPS[0])
    scale = scale_slot.load(gl.SliceLayout(1, wgmma_acc_layout(ROWS0 * HEADS)))
    sums = ()
    operands = ()
    for i in gl.static_range(L):
        scores = warpgroup_mma_wait(L - 1, deps=(pending[i],))
        head_sum, operand = issue_tensor_head_sum(scores, headsum_smem.index(ROLE * L + i),
                                                  group_rows(NEXT_N, ROWS_PER_MMA, GROUPS[i]))
        sums = sums + (head_sum,)
        operands = operands + (operand,)
    for i in gl.static_range(L):
        logits = finish_tensor_head_sum(sums[i], operands[i], scale, L - 1 - i)
        store_logits(out_ptr, logits, b, tile, limits[i], stride_out, NEXT_N,
                     group_first_row(NEXT_N, ROWS_PER_MMA, GROUPS[i]), logits.shape[1], CHUNK)


# ----------------------------------------------------------------------------- the kernel
@gluon.jit
def _score_segment(q_ptr, kv_ptr, scale_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr,
                   key_ring, scale_ring, q_smem, weight_smem, limit_smem, headsum_smem,
                   b, first, step, n_given,
                   stride_q_b, stride_q_j, stride_q_h, stride_block, stride_w, stride_out, stride_lens_b,
                   stride_lens_j, stride_table, max_model_len, max_blocks, num_blocks,
                   NEXT_N: gl.constexpr, NEXT_N_POW2: gl.constexpr, HEADS: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr,
                   CHUNK: gl.constexpr, ROWS_PER_MMA: gl.constexpr, STAGES: gl.constexpr,
                   PRESHUFFLE: gl.constexpr, LENS_2D: gl.constexpr, KV_ALIGN: gl.constexpr, Q_ASYNC: gl.constexpr,
                   BALANCED: gl.constexpr, HEAD_SUM: gl.constexpr):
    """Score tiles ``first, first + step, ...`` of sequence ``b`` against all its next_n rows:
    ``n_given`` tiles (balanced schedule), or as many as the sequence has from ``first`` on
    (``Schedule=split``, where the lengths are read here). The shared memory is the caller's,
    reused from segment to segment; everything in flight has landed when this returns. With
    ``HEAD_SUM``, the head sum on the tensor cores (:func:`score_tile_tensor`, every row group)."""
    vec_layout: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    NUM_GROUPS: gl.constexpr = _num_groups(NEXT_N, ROWS_PER_MMA)
    GROUPS: gl.constexpr = part_groups(NEXT_N, ROWS_PER_MMA, 0, 1)

    # 1. What does not depend on the lengths, so that it loads in parallel with them: Q (the
    #    first cp.async group), the weights, the block-table entries of the first tiles.
    copy_query(q_ptr, q_smem, b, stride_q_b, stride_q_j, stride_q_h, NEXT_N, NEXT_N_POW2, HEADS, Q_ASYNC)
    async_copy.commit_group()  # (an empty group without cp.async: the counting stays the same)
    weights = load_weights(weights_ptr, b, stride_w, NEXT_N, NEXT_N_POW2, HEADS, vec_layout)
    table_row = table_ptr + b.to(gl.int64) * stride_table
    table_tokens = max_blocks * KV_BLOCK_SIZE
    first_pages = ()
    for s in gl.static_range(STAGES - 1):
        first_pages = first_pages + (key_scale_pages(table_row, first + s * step, table_tokens, num_blocks, CHUNK,
                                                 KV_BLOCK_SIZE),)

    # 2. The lengths: this sequence's visible end (and, splitting, this program's tile count).
    seq_len = device.sequence_length(lens_ptr, b, stride_lens_b, stride_lens_j, NEXT_N, LENS_2D)
    end = device.visible_end(seq_len, max_model_len, max_blocks, KV_BLOCK_SIZE)
    if BALANCED:
        n = n_given
    else:
        n = gl.cdiv(gl.cdiv(end, CHUNK) - first, step)
    if n > 0:
        # Weights and row limits go through shared memory once; each row group's epilogue
        # reads its slice in the accumulator's column layout.
        weight_smem.store(weights)
        limit_smem.store(row_limits(lens_ptr, b, seq_len, end, stride_lens_b, stride_lens_j,
                                     gl.arange(0, NEXT_N_POW2, vec_layout), NEXT_N, LENS_2D))

        # 3. Prologue: tiles 0..STAGES-2 in flight, one cp.async group each (masked past the end).
        for s in gl.static_range(STAGES - 1):
            issue_tile(key_ring.index(s), scale_ring.index(s), kv_ptr, scale_ptr, first_pages[s],
                       first + s * step, issue_end(s, n, end), stride_block, CHUNK, KV_BLOCK_SIZE,
                       PRESHUFFLE, KV_ALIGN)
            async_copy.commit_group()
        pages = key_scale_pages(table_row, first + (STAGES - 1) * step, table_tokens, num_blocks, CHUNK, KV_BLOCK_SIZE)

        if HEAD_SUM:
            thread_barrier()  # the weights stored above, seen by every thread
            limits = tensor_operands(weight_smem, headsum_smem, lens_ptr, b, seq_len, end, stride_lens_b,
                                     stride_lens_j, NEXT_N, HEADS, ROWS_PER_MMA, LENS_2D, CHUNK, GROUPS, 0)
        else:
            if NUM_GROUPS == 1:
                thread_barrier()  # the weights stored above, seen by every thread
            weight_regs = single_group_weights(weight_smem, NEXT_N, HEADS, ROWS_PER_MMA)

        # 4. Steady state: tile i lives in slot i % STAGES.
        for i in range(n):
            slot = i % STAGES
            tile = first + i * step
            async_copy.wait_group(STAGES - 2)  # Q and tiles 0..i landed (this thread's copies)
            fence_async_shared()  # ... and are visible to wgmma's async proxy
            thread_barrier()  # ... for every thread; and tile i-1's slot is free

            ahead = i + STAGES - 1
            issue_tile(key_ring.index(ahead % STAGES), scale_ring.index(ahead % STAGES), kv_ptr, scale_ptr, pages,
                       first + ahead * step, issue_end(ahead, n, end), stride_block, CHUNK,
                       KV_BLOCK_SIZE, PRESHUFFLE, KV_ALIGN)
            async_copy.commit_group()
            pages = key_scale_pages(table_row, first + (ahead + 1) * step, table_tokens, num_blocks, CHUNK,
                                    KV_BLOCK_SIZE)

            if HEAD_SUM:
                score_tile_tensor(key_ring.index(slot), q_smem, scale_ring.index(slot), headsum_smem, limits, out_ptr,
                                  b, tile, stride_out, NEXT_N, HEADS, CHUNK, ROWS_PER_MMA, GROUPS, 0)
            else:
                score_tile(key_ring.index(slot), q_smem, scale_ring.index(slot), weight_regs, weight_smem,
                           limit_smem, out_ptr, b, tile, stride_out, NEXT_N, HEADS, CHUNK, ROWS_PER_MMA)
    async_copy.wait_group(0)  # no copy may outlive the segment (the tail groups are masked)
    thread_barrier()  # every thread is done with Q, the ring and the vectors before the next segment


@gluon.jit
def issue_end(i, n, end):
    """The ``end`` a copy of the segment's ``i``-th tile is masked with: the sequence's end for
    the segment's own tiles, 0 past them (so a balanced share never copies the next program's
    tiles, and a copy past the segment is one that moves nothing)."""
    return gl.where(i < n, end, 0)


@gluon.jit(do_not_specialize=DYNAMIC_PARAMS)
def wgmma_logits_kernel(
    q_ptr, kv_ptr, scale_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr,
    stride_q_b, stride_q_j, stride_q_h,
    stride_block,  # bytes between cache blocks (multiple of 4)
    stride_w, stride_out, stride_lens_b, stride_lens_j, stride_table,
    max_model_len, max_blocks, num_splits, batch, num_blocks,
    NEXT_N: gl.constexpr, NEXT_N_POW2: gl.constexpr, HEADS: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr,
    CHUNK: gl.constexpr, ROWS_PER_MMA: gl.constexpr, STAGES: gl.constexpr,
    PRESHUFFLE: gl.constexpr, LENS_2D: gl.constexpr, KV_ALIGN: gl.constexpr, Q_ASYNC: gl.constexpr,
    BALANCED: gl.constexpr, HEAD_SUM: gl.constexpr = 0,
):
    """Balanced: program ``p`` of the persistent grid scores its equal share of the batch's
    tiles (``schedule.py``), segment by segment. Split: program ``(split, b)`` scores tiles
    ``split, split + num_splits, ...`` of sequence ``b``. Either way against all next_n rows
    of the sequence (see the module docstring)."""
    tile_smem: gl.constexpr = tile_smem_layout()
    vec_smem: gl.constexpr = vec_smem_layout()
    Q_ROWS: gl.constexpr = NEXT_N_POW2 * HEADS
    key_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, CHUNK, _D], tile_smem)
    scale_ring = gl.allocate_shared_memory(gl.float32, [STAGES, CHUNK], vec_smem)
    q_smem = gl.allocate_shared_memory(gl.float8e4nv, [Q_ROWS, _D], tile_smem)
    weight_smem = gl.allocate_shared_memory(gl.float32, [Q_ROWS], vec_smem)
    limit_smem = gl.allocate_shared_memory(gl.int32, [NEXT_N_POW2], vec_smem)
    headsum_smem = allocate_headsum_weights(weight_smem, NEXT_N, HEADS, ROWS_PER_MMA, 1, 1, HEAD_SUM)

    if BALANCED:
        item, stop, b, tile = device.balanced_share(
            lens_ptr, batch, stride_lens_b, stride_lens_j, max_model_len, max_blocks, gl.program_id(0),
            gl.num_programs(0), NEXT_N, LENS_2D, KV_BLOCK_SIZE, CHUNK, device.scan_layout(32, WARPS))
        while item < stop:
            count = device.share_run(lens_ptr, b, tile, item, stop, stride_lens_b, stride_lens_j, max_model_len,
                                     max_blocks, NEXT_N, LENS_2D, KV_BLOCK_SIZE, CHUNK)
            if count > 0:  # zero-length sequences between long ones hold no items
                _score_segment(q_ptr, kv_ptr, scale_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr,
                               key_ring, scale_ring, q_smem, weight_smem, limit_smem, headsum_smem, b, tile, 1, count,
                               stride_q_b, stride_q_j, stride_q_h, stride_block, stride_w, stride_out,
                               stride_lens_b, stride_lens_j, stride_table, max_model_len, max_blocks, num_blocks,
                               NEXT_N, NEXT_N_POW2, HEADS, KV_BLOCK_SIZE, CHUNK, ROWS_PER_MMA, STAGES, PRESHUFFLE,
                               LENS_2D, KV_ALIGN, Q_ASYNC, BALANCED, HEAD_SUM)
                item += count
            b += 1
            tile = tile * 0
    else:
        _score_segment(q_ptr, kv_ptr, scale_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr,
                       key_ring, scale_ring, q_smem, weight_smem, limit_smem, headsum_smem, gl.program_id(1),
                       gl.program_id(0),
                       num_splits, 0,
                       stride_q_b, stride_q_j, stride_q_h, stride_block, stride_w, stride_out,
                       stride_lens_b, stride_lens_j, stride_table, max_model_len, max_blocks, num_blocks,
                       NEXT_N, NEXT_N_POW2, HEADS, KV_BLOCK_SIZE, CHUNK, ROWS_PER_MMA, STAGES, PRESHUFFLE,
                       LENS_2D, KV_ALIGN, Q_ASYNC, BALANCED, HEAD_SUM)

