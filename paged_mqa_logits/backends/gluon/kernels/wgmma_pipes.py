"""sm_90 kernel of the ``wgmma_pipes`` variant: fp8 wgmma consumers, each team of them fed by its
own producer warp through its own ring of key tiles, so that the consumer loop waits on memory
and never on another warpgroup.

Why this shape (what bounded the ``wgmma_ws`` kernel at 64 heads, next_n 2 and 4): its consumers
shared one ring and one producer warpgroup, and freed a slot with one thread's arrive after a
warpgroup-wide ``bar.sync``; a consumer that finished early waited for the slowest warp of its
warpgroup, and the producer, issuing in one order for every consumer, for the slowest consumer.
Here, per 64-token tile:

* a **team** of ``ROW_SPLIT`` consumer warpgroups (1: a consumer scores every row group of its
  tiles; 2: each scores every other group, so a consumer holds half the accumulators, 64 heads x
  next_n 4 then runs as four consumers of 104 registers) owns a ring of ``STAGES`` slots, a
  *full* and an *empty* mbarrier per slot, and one **producer warp**. Team ``t`` takes tiles
  ``k`` with ``k % TEAMS == t`` of the program's share;
* the producer waits for its slot to be empty and moves the tile's keys and scales with one TMA
  box each per cache block (``KEY_BOX > 0``: 16-byte aligned, token-major caches of blocks of
  16 tokens or more), or gathers them with cp.async (any other cache); the block ids of the next
  tile load while it waits;
* the consumer waits for *full*, issues its wgmmas, reads the two scales per thread it needs,
  waits for the wgmmas and **arrives on *empty* at once, every thread for itself**
  (``cp.async.mbarrier.arrive.noinc`` with no copy pending: an arrive that needs no barrier
  among the warps) and only then runs the epilogue from registers;
* the sequence's Q (wgmma's B operand), weights and row limits stay put across its tiles: Q
  and the weights in a two-stage ring that team 0's producer fills one sequence ahead, the
  weights and limits in registers;
* ``clean_logits`` (a runtime flag, so one compiled kernel serves both): the epilogue stores
  ``-inf`` where a row does not see a position of its tiles, and after their last tile the
  producers store ``-inf`` over the columns past each sequence's tiles up to
  ``max_model_len``, in units of ``TAIL_UNIT`` columns shared out like the tiles.

Schedules (``schedule.py``): ``BALANCED`` walks the program's equal share of the batch's tiles;
otherwise program ``(split, b)`` walks tiles ``[first, stop)`` of sequence ``b``. Every
partition walks the same share: they agree on every sequence's tile count without talking.

Semantics follow ``problem.py`` and ``wgmma.py``: row ``j`` of sequence ``b`` sees
``p < min(row_len(b, j), max_model_len, table width)``; the key scale is factored out of the
ReLU; block ids are clamped into the cache; cache and output offsets are 64-bit.

The knobs, the register split, the resource rules, the descriptors and the launch plan are the
host side, ``backends/gluon/wgmma_pipes.py``.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from ....triton_internals.gluon_api import (async_copy, fence_async_shared, thread_barrier, tma, warpgroup_mma,
                                             warpgroup_mma_wait)
from . import device
from . import wgmma as wg

#: the facts the host side reads
CONSUMER_WARPS = 4  # a warpgroup: wgmma's unit
PRODUCER_WARPS = 1  # one warp per team issues its TMA boxes (or its cp.async gathers)
TILE = 64  # tokens per tile: one wgmma's M
HEAD_DIM = wg.HEAD_DIM
#: columns of one unit of a sequence's ``-inf`` tail (``clean_logits``)
TAIL_UNIT = 512
#: kernel parameters that change from call to call without changing the code
DYNAMIC_PARAMS = ("max_model_len", "max_blocks", "num_splits", "batch", "num_blocks", "clean_logits")

_D = gl.constexpr(HEAD_DIM)
_TILE = gl.constexpr(TILE)
_TAIL_UNIT = gl.constexpr(TAIL_UNIT)
_CONSUMER_WARPS = gl.constexpr(CONSUMER_WARPS)
_PRODUCER_WARPS = gl.constexpr(PRODUCER_WARPS)


# ----------------------------------------------------------------------------- layouts
# Every layout of the kernel, chosen here:
#
# KEY_BOX / SCALE_BOX: the shared layouts a TMA box lands in: a [1, box, 128] fp8 key box in
#   the ring slot's 128-byte swizzle (wgmma's A layout), a [1, box] fp32 scale box unswizzled.
#   The host builds the descriptors with them.
# PRODUCER_COPY: one warp gathering a [64, 128] byte tile, 16 bytes per cp.async: 8 lanes per
#   128-byte row, 4 rows per instruction, 16 repeats.
# PRODUCER_VEC: one warp over a vector (scales, weights), one element per lane per repeat.
# TAIL: the producer's warps storing a [rows, TAIL_UNIT] block of -inf, 4 logits (16 bytes of fp32)
#   per lane.
# The consumer's layouts are wgmma's: the wgmma accumulator (MMA), the NVMMA tile layout
# of keys and Q, and whatever the head-sum reduction of the accumulator gives.
KEY_BOX_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=3)
SCALE_BOX_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
_KEY_BOX_LAYOUT = gl.constexpr(KEY_BOX_LAYOUT)
_SCALE_BOX_LAYOUT = gl.constexpr(SCALE_BOX_LAYOUT)


@gluon.constexpr_function
def _producer_copy_layout():
    return gl.BlockedLayout([1, 16], [4, 8], [1, 1], [1, 0])


@gluon.constexpr_function
def _producer_vec_layout():
    return gl.BlockedLayout([1], [32], [1], [0])


@gluon.constexpr_function
def _tail_layout(warps):
    return gl.BlockedLayout([1, 4], [1, 32], [1, warps], [1, 0])


@gluon.constexpr_function
def _pow2(n):
    return 1 << (max(int(n), 1) - 1).bit_length()


@gluon.constexpr_function
def _boxes_per_tile(kv_block_size):
    """Cache blocks (TMA boxes) a tile spans."""
    return max(1, TILE // kv_block_size)


# ----------------------------------------------------------------------------- the walk
@gluon.jit
def _segment(lens_ptr, b, tile, item, stop, stride_lens_b, stride_lens_j, max_model_len, max_blocks,
             NEXT_N: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr, LENS_2D: gl.constexpr):
    """``(seq_len, end, count)`` of the share's run inside sequence ``b`` from its tile ``tile``:
    what every partition computes identically, so they agree on the program's tiles."""
    seq_len = device.sequence_length(lens_ptr, b, stride_lens_b, stride_lens_j, NEXT_N, LENS_2D)
    end = device.visible_end(seq_len, max_model_len, max_blocks, KV_BLOCK_SIZE)
    count = gl.minimum(gl.cdiv(end, _TILE) - tile, stop - item)
    return seq_len, end, count


@gluon.jit
def _team_slot(n, STAGES: gl.constexpr):
    """Slot and phase of a team's ``n``-th tile."""
    return n % STAGES, (n // STAGES) & 1


# ----------------------------------------------------------------------------- producer
@gluon.jit
def _tile_blocks(table_row, tile, end, num_blocks, KV_BLOCK_SIZE: gl.constexpr):
    """The cache block of each TMA box of ``tile``, clamped into the cache; a box starting at or
    past ``end`` takes the tile's first block (its rows are never stored), so every tile lands
    the same byte count."""
    BOXES: gl.constexpr = _boxes_per_tile(KV_BLOCK_SIZE)
    first_token = tile * _TILE
    first = gl.maximum(gl.minimum(gl.load(table_row + first_token // KV_BLOCK_SIZE), num_blocks - 1), 0)
    blocks = (first,)
    for part in gl.static_range(1, BOXES):
        token = first_token + part * KV_BLOCK_SIZE
        block = gl.load(table_row + token // KV_BLOCK_SIZE, mask=token < end, other=first)
        blocks = blocks + (gl.maximum(gl.minimum(block, num_blocks - 1), 0),)
    return blocks


@gluon.jit
def _issue_tile_tma(key_desc, scale_desc, key_slot, scale_slot, full_bar, blocks, tile, KV_BLOCK_SIZE: gl.constexpr):
    """One key box and one scale box per cache block of ``tile``, all counted on ``full_bar``."""
    BOXES: gl.constexpr = _boxes_per_tile(KV_BLOCK_SIZE)
    BOX: gl.constexpr = _TILE // BOXES
    mbarrier.expect(full_bar, _TILE * (_D + 4))
    slot_in_block = (tile * _TILE) % KV_BLOCK_SIZE  # 0 unless blocks are longer than a tile
    for part in gl.static_range(BOXES):
        key_box = key_slot.reshape([1, _TILE, _D]).slice(part * BOX, BOX, dim=1)
        tma.async_copy_global_to_shared(key_desc, [blocks[part], slot_in_block, 0], full_bar, key_box)
        scale_box = scale_slot.slice(part * BOX, BOX, dim=1)
        tma.async_copy_global_to_shared(scale_desc, [blocks[part], KV_BLOCK_SIZE * (_D // 4) + slot_in_block], full_bar,
                                        scale_box)


@gluon.jit
def _issue_tile_gather(kv_ptr, scale_ptr, key_slot, scale_slot, full_bar, table_row, tile, end, table_tokens,
                       num_blocks, stride_block, KV_BLOCK_SIZE: gl.constexpr, PRESHUFFLE: gl.constexpr,
                       KV_ALIGN: gl.constexpr):
    """cp.async the keys and scales of ``tile``'s tokens ``< end`` (the rest zero-filled, never
    stored), then one ``noinc`` arrive per lane on ``full_bar``, completed when its copies land."""
    copy_layout: gl.constexpr = _producer_copy_layout()
    vec_layout: gl.constexpr = _producer_vec_layout()
    tokens = tile * _TILE + gl.arange(0, _TILE, gl.SliceLayout(1, copy_layout))
    pages = device.tile_pages(table_row, tokens, gl.minimum(end, table_tokens), num_blocks, KV_BLOCK_SIZE, wg.gather)
    d = gl.arange(0, _D, gl.SliceLayout(0, copy_layout))
    token_part, dim_part = device.key_offset_parts(pages, tokens, d, stride_block, KV_BLOCK_SIZE, _D, PRESHUFFLE)
    key_ptrs = kv_ptr + (token_part[:, None] + dim_part[None, :])
    if KV_ALIGN < 16:
        key_ptrs = gl.multiple_of(key_ptrs, [KV_ALIGN, KV_ALIGN])
    async_copy.async_copy_global_to_shared(key_slot, key_ptrs, mask=(tokens < end)[:, None])
    scale_tokens = tile * _TILE + gl.arange(0, _TILE, vec_layout)
    scale_pages = device.tile_pages(table_row, scale_tokens, gl.minimum(end, table_tokens), num_blocks, KV_BLOCK_SIZE,
                                    wg.gather)
    scale_ptrs = scale_ptr + device.scale_offsets(scale_pages, scale_tokens, stride_block, KV_BLOCK_SIZE, _D)
    async_copy.async_copy_global_to_shared(scale_slot.reshape([_TILE]), scale_ptrs, mask=scale_tokens < end)
    async_copy.mbarrier_arrive(full_bar, increment_count=False)


@gluon.jit
def _issue_query(q_ptr, weights_ptr, q_stage, weight_stage, q_full, b, stride_q_b, stride_q_j, stride_q_h, stride_w,
                 NEXT_N: gl.constexpr, HEADS: gl.constexpr, Q_ASYNC: gl.constexpr):
    """Sequence ``b``'s query rows (row ``j * H + h``) and weights into one stage of the Q ring,
    then the arrive(s) on ``q_full``: per lane ``noinc`` after cp.async, or (q rows not 16-byte
    aligned: plain loads and stores) one release arrive once the warp's stores are done."""
    copy_layout: gl.constexpr = _producer_copy_layout()
    vec_layout: gl.constexpr = _producer_vec_layout()
    ROWS: gl.constexpr = NEXT_N * HEADS
    ROWS_POW2: gl.constexpr = _pow2(NEXT_N) * HEADS
    m = gl.arange(0, ROWS_POW2, gl.SliceLayout(1, copy_layout))
    d = gl.arange(0, _D, gl.SliceLayout(0, copy_layout))
    q_rows = b.to(gl.int64) * stride_q_b + (m // HEADS) * stride_q_j + (m % HEADS) * stride_q_h
    q_ptrs = q_ptr + q_rows[:, None] + d[None, :]
    mw = gl.arange(0, ROWS_POW2, vec_layout)
    w_ptrs = weights_ptr + (b.to(gl.int64) * NEXT_N + mw // HEADS) * stride_w + mw % HEADS
    if Q_ASYNC:
        async_copy.async_copy_global_to_shared(q_stage, q_ptrs, mask=(m < ROWS)[:, None])
        async_copy.async_copy_global_to_shared(weight_stage, w_ptrs, mask=mw < ROWS)
        async_copy.mbarrier_arrive(q_full, increment_count=False)
    else:
        q_stage.store(gl.load(q_ptrs, mask=(m < ROWS)[:, None], other=0.0))
        weight_stage.store(gl.load(w_ptrs, mask=mw < ROWS, other=0.0))
        fence_async_shared()  # the stores, visible to wgmma's async proxy
        thread_barrier()  # every lane's stores are done before the release arrive
        mbarrier.arrive(q_full, count=1)


@gluon.jit
def _clean_tail(out_ptr, lens_ptr, b, unit, count, step, stride_out, stride_lens_b, stride_lens_j,
                max_model_len, max_blocks, NEXT_N: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr, LENS_2D: gl.constexpr,
                WARPS: gl.constexpr):
    """``-inf`` over units ``unit, unit + step, ... < unit + count`` of sequence ``b``'s tail
    (columns from its last tile's end up to ``max_model_len``), every row of the sequence, by
    ``WARPS`` warps (the producer warp)."""
    layout: gl.constexpr = _tail_layout(WARPS)
    ROWS: gl.constexpr = _pow2(NEXT_N)
    seq_len = device.sequence_length(lens_ptr, b, stride_lens_b, stride_lens_j, NEXT_N, LENS_2D)
    tail_start = gl.cdiv(device.visible_end(seq_len, max_model_len, max_blocks, KV_BLOCK_SIZE), _TILE) * _TILE
    j = gl.arange(0, ROWS, gl.SliceLayout(1, layout))
    rows = out_ptr + (b.to(gl.int64) * NEXT_N + j) * stride_out
    minus_inf = gl.full([ROWS, _TAIL_UNIT], float("-inf"), out_ptr.dtype.element_ty, layout)
    for u in range(unit, unit + count, step):
        p = tail_start + u * _TAIL_UNIT + gl.arange(0, _TAIL_UNIT, gl.SliceLayout(0, layout))
        gl.store(rows[:, None] + p[None, :], minus_inf, mask=(j < NEXT_N)[:, None] & (p < max_model_len)[None, :])


@gluon.jit
def _clean_team_tails(out_ptr, lens_ptr, tail_share, stride_out, stride_lens_b, stride_lens_j, max_model_len,
                      max_blocks, NEXT_N: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr, LENS_2D: gl.constexpr,
                      TEAM: gl.constexpr, TEAMS: gl.constexpr, WARPS: gl.constexpr):
    """Team ``TEAM``'s part of the program's tail share (``_program_share`` in units of
    ``_TAIL_UNIT`` columns past each sequence's tiles): units alternate between the teams across
    sequences as tiles do. Called by the producer that cleans, with its warp count."""
    item, stop, b, unit = tail_share
    u = 0  # the program's tail units before this sequence's first
    while item < stop:
        seq_len = device.sequence_length(lens_ptr, b, stride_lens_b, stride_lens_j, NEXT_N, LENS_2D)
        end = device.visible_end(seq_len, max_model_len, max_blocks, KV_BLOCK_SIZE)
        units = gl.cdiv(gl.maximum(max_model_len - gl.cdiv(end, _TILE) * _TILE, 0), _TAIL_UNIT)
        count = gl.minimum(units - unit, stop - item)
        first = (TEAM - u % TEAMS + TEAMS) % TEAMS
        _clean_tail(out_ptr, lens_ptr, b, unit + first, gl.maximum(count - first, 0), TEAMS, stride_out,
                    stride_lens_b, stride_lens_j, max_model_len, max_blocks, NEXT_N, KV_BLOCK_SIZE, LENS_2D, WARPS)
        u += count
        item += count
        b += 1
        unit = unit * 0


@gluon.jit
def _producer(pointers, strides, sizes, key_desc, scale_desc, buffers, share, tail_share,
              NEXT_N: gl.constexpr, HEADS: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr, STAGES: gl.constexpr,
              PRESHUFFLE: gl.constexpr, LENS_2D: gl.constexpr, KV_ALIGN: gl.constexpr, Q_ASYNC: gl.constexpr,
              KEY_BOX: gl.constexpr, TEAM: gl.constexpr, TEAMS: gl.constexpr):
    """Fill team ``TEAM``'s ring with its tiles of the share (team 0 also the Q ring, one stage
    per sequence), then store its part of the share's ``-inf`` tail when cleaning."""
    q_ptr, kv_ptr, scale_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr = pointers
    stride_q_b, stride_q_j, stride_q_h, stride_block, stride_w, stride_out, stride_lens_b, stride_lens_j, \
        stride_table = strides
    max_model_len, max_blocks, num_blocks, clean_logits = sizes
    key_ring, scale_ring, q_ring, weight_ring, full_bars, empty_bars, q_full, q_empty = buffers
    item, stop, b, tile = share
    table_tokens = max_blocks * KV_BLOCK_SIZE
    k = 0  # the program's tiles before this sequence's first, every team's
    q_iter = 0  # sequences with tiles so far
    while item < stop:
        _, end, count = _segment(lens_ptr, b, tile, item, stop, stride_lens_b, stride_lens_j, max_model_len,
                                 max_blocks, NEXT_N, KV_BLOCK_SIZE, LENS_2D)
        if count > 0:
            if TEAM == 0:
                stage = q_iter % 2
                mbarrier.wait(q_empty.index(stage), ((q_iter // 2) & 1) ^ 1)  # fresh barriers pass phase 1
                _issue_query(q_ptr, weights_ptr, q_ring.index(stage), weight_ring.index(stage), q_full.index(stage),
                             b, stride_q_b, stride_q_j, stride_q_h, stride_w, NEXT_N, HEADS, Q_ASYNC)
            q_iter += 1
            table_row = table_ptr + b.to(gl.int64) * stride_table
            first = (TEAM - k % TEAMS + TEAMS) % TEAMS  # this team's first tile here
            if KEY_BOX > 0:
                blocks = _tile_blocks(table_row, tile + first, end, num_blocks, KV_BLOCK_SIZE)
            for i in range(first, count, TEAMS):
                if KEY_BOX > 0:  # the next tile's block ids load while this one's slot is awaited
                    upcoming = _tile_blocks(table_row, tile + gl.minimum(i + TEAMS, count - 1), end, num_blocks,
                                            KV_BLOCK_SIZE)
                slot, phase = _team_slot((k + i) // TEAMS, STAGES)
                mbarrier.wait(empty_bars.index(TEAM * STAGES + slot), phase ^ 1)
                ring_slot = TEAM * STAGES + slot
                if KEY_BOX > 0:
                    _issue_tile_tma(key_desc, scale_desc, key_ring.index(ring_slot), scale_ring.index(ring_slot),
                                    full_bars.index(ring_slot), blocks, tile + i, KV_BLOCK_SIZE)
                    blocks = upcoming
                else:
                    _issue_tile_gather(kv_ptr, scale_ptr, key_ring.index(ring_slot), scale_ring.index(ring_slot),
                                       full_bars.index(ring_slot), table_row, tile + i, end, table_tokens,
                                       num_blocks, stride_block, KV_BLOCK_SIZE, PRESHUFFLE, KV_ALIGN)
        k += count
        item += count
        b += 1
        tile = tile * 0
    if clean_logits != 0:
        _clean_team_tails(out_ptr, lens_ptr, tail_share, stride_out, stride_lens_b, stride_lens_j, max_model_len,
                          max_blocks, NEXT_N, KV_BLOCK_SIZE, LENS_2D, TEAM, TEAMS, _PRODUCER_WARPS)


# ----------------------------------------------------------------------------- consumer
@gluon.jit
def _group_layouts(NEXT_N: gl.constexpr, HEADS: gl.constexpr, ROWS_PER_MMA: gl.constexpr, g: gl.constexpr):
    """A zero accumulator of row group ``g`` and its head-summed ``[TILE, rows]`` form: their
    layouts are what the sequence's fp32 weights and limits are held in (the compiler drops the
    values)."""
    rows: gl.constexpr = wg.group_rows(NEXT_N, ROWS_PER_MMA, g)
    acc = gl.zeros([_TILE, rows * HEADS], gl.float32, wg.wgmma_acc_layout(rows * HEADS))
    summed = gl.sum(gl.reshape(acc, [_TILE, rows, HEADS]), axis=2)
    return acc, summed


@gluon.jit
def _group_operands(weight_stage, lens_ptr, b, seq_len, end, stride_lens_b, stride_lens_j, NEXT_N: gl.constexpr,
                    HEADS: gl.constexpr, ROWS_PER_MMA: gl.constexpr, LENS_2D: gl.constexpr, g: gl.constexpr,
                    headsum_smem=None, HEAD_SUM: gl.constexpr = 0):
    """Row group ``g``'s weights and its rows' visible limits (the head-summed layout). The weights
    are fp32 registers in the accumulator's column layout, or with ``HEAD_SUM`` the group's
    ``headsum_smem``, written here (the caller fences and syncs); rows the tensor head sum pads
    the group with get limit 0."""
    first: gl.constexpr = wg.group_first_row(NEXT_N, ROWS_PER_MMA, g)
    rows: gl.constexpr = wg.group_rows(NEXT_N, ROWS_PER_MMA, g)
    if HEAD_SUM:
        limit = wg.headsum_row_limits(lens_ptr, b, seq_len, end, stride_lens_b, stride_lens_j, NEXT_N, first, rows,
                                      LENS_2D, _TILE)
        wg.write_headsum_weights(headsum_smem, weight_stage, first, rows, HEADS)
        weight = headsum_smem
    else:
        acc, summed = _group_layouts(NEXT_N, HEADS, ROWS_PER_MMA, g)
        j = first + gl.arange(0, summed.shape[1], gl.SliceLayout(0, summed.type.layout))
        limit = wg.row_limits(lens_ptr, b, seq_len, end, stride_lens_b, stride_lens_j, j, NEXT_N, LENS_2D)
        weight = weight_stage.slice(first * HEADS, rows * HEADS).load(gl.SliceLayout(0, acc.type.layout))
    return weight, limit


@gluon.jit
def _sequence_operands(weight_stage, lens_ptr, b, seq_len, end, stride_lens_b, stride_lens_j,
                       NEXT_N: gl.constexpr, HEADS: gl.constexpr, ROWS_PER_MMA: gl.constexpr, LENS_2D: gl.constexpr,
                       GROUPS: gl.constexpr, headsum_smem=None, HEAD_SUM: gl.constexpr = 0,
                       CONSUMER: gl.constexpr = 0):
    """:func:`_group_operands` of every group of ``GROUPS``: registers for the whole sequence (with
    ``HEAD_SUM``: consumer ``CONSUMER``'s head-sum weights in shared memory, rewritten per sequence
    once every warp of the warpgroup is done with the previous sequence's wgmmas)."""
    weights = ()
    limits = ()
    if HEAD_SUM:
        thread_barrier()  # the warpgroup's last head-sum wgmmas of the previous sequence are done
    for i in gl.static_range(len(GROUPS)):
        if HEAD_SUM:
            group_smem = headsum_smem.index(CONSUMER * len(GROUPS) + i)
        else:
            group_smem = None
        weight, limit = _group_operands(weight_stage, lens_ptr, b, seq_len, end, stride_lens_b, stride_lens_j,
                                        NEXT_N, HEADS, ROWS_PER_MMA, LENS_2D, GROUPS[i], group_smem, HEAD_SUM)
        weights = weights + (weight,)
        limits = limits + (limit,)
    if HEAD_SUM:
        fence_async_shared()  # the weights' generic-proxy stores, seen by wgmma's async proxy
        thread_barrier()  # ... from every warp of the warpgroup
    return weights, limits


@gluon.jit
def _store_group(out_ptr, logits, limit, b, first_token, stride_out, max_model_len, cleaning,
                 NEXT_N: gl.constexpr, FIRST_ROW: gl.constexpr, ROWS: gl.constexpr, OWN_ROWS: gl.constexpr = 0):
    """``out[b*NEXT_N + j, p]`` for the group's rows: the logit where the row sees ``p``; when
    ``cleaning``, ``-inf`` from there up to ``max_model_len``; rounded once to the output's
    dtype (a no-op for fp32 logits). ``logits`` has ``ROWS`` columns, of which the first
    ``OWN_ROWS`` (all when 0) are the group's: the others are never stored."""
    layout: gl.constexpr = logits.type.layout
    p = first_token + gl.arange(0, _TILE, gl.SliceLayout(1, layout))
    j = FIRST_ROW + gl.arange(0, ROWS, gl.SliceLayout(0, layout))
    row_start = (b.to(gl.int64) * NEXT_N + j) * stride_out
    if OWN_ROWS > 0:
        store_end = gl.where(cleaning & (j < NEXT_N) & (j < FIRST_ROW + OWN_ROWS), max_model_len, limit)
    else:
        store_end = gl.where(cleaning & (j < NEXT_N), max_model_len, limit)
    value = gl.where(p[:, None] < limit[None, :], logits, float("-inf"))
    gl.store(out_ptr + row_start[None, :] + p[:, None], value.to(out_ptr.dtype.element_ty),
             mask=p[:, None] < store_end[None, :])


@gluon.jit
def _score_tile(keys, q_stage, scale_slot, empty_bar, weights, limits, out_ptr, b, tile, stride_out, max_model_len,
                cleaning, NEXT_N: gl.constexpr, HEADS: gl.constexpr, ROWS_PER_MMA: gl.constexpr,
                GROUPS: gl.constexpr, HEAD_SUM: gl.constexpr = 0):
    """Every wgmma of ``GROUPS`` on one landed tile, the slot freed by this thread as soon as
    they are done (its scales were read before they started), then the epilogues from
    registers. A consumer part with no group (more parts than row groups) frees it unscored."""
    if len(GROUPS) == 0:
        async_copy.mbarrier_arrive(empty_bar, increment_count=False)
    else:
        scale, pending = _issue_tile(keys, q_stage, scale_slot, NEXT_N, HEADS, ROWS_PER_MMA, GROUPS)
        _retire_tile(pending, scale, empty_bar, weights, limits, out_ptr, b, tile, stride_out, max_model_len,
                     cleaning, NEXT_N, HEADS, ROWS_PER_MMA, GROUPS, 0, HEAD_SUM)


@gluon.jit
def _await_tile(full_bars, n, STAGES: gl.constexpr, KEY_BOX: gl.constexpr, TEAM: gl.constexpr, TEAMS: gl.constexpr):
    """Wait until the program's ``n``-th tile (one of team ``TEAM``'s) has landed; its ring slot."""
    slot, phase = _team_slot(n // TEAMS, STAGES)
    ring_slot = TEAM * STAGES + slot
    mbarrier.wait(full_bars.index(ring_slot), phase)
    if KEY_BOX == 0:
        fence_async_shared()  # the gathered keys' cp.async bytes, seen by wgmma's async proxy
    return ring_slot


@gluon.jit
def _issue_tile(keys, q_stage, scale_slot, NEXT_N: gl.constexpr, HEADS: gl.constexpr, ROWS_PER_MMA: gl.constexpr,
                GROUPS: gl.constexpr):
    """The tile's scales (read while its slot is held) and its groups' wgmmas, in flight."""
    acc0, _ = _group_layouts(NEXT_N, HEADS, ROWS_PER_MMA, GROUPS[0])
    scale = scale_slot.reshape([_TILE]).load(gl.SliceLayout(1, acc0.type.layout))
    pending = ()
    for i in gl.static_range(len(GROUPS)):
        pending = pending + (wg.issue_group(keys, q_stage, GROUPS[i], NEXT_N, HEADS, _TILE, ROWS_PER_MMA),)
    return scale, pending


@gluon.jit
def _start_tile(key_ring, scale_ring, full_bars, q_stage, n, NEXT_N: gl.constexpr, HEADS: gl.constexpr,
                ROWS_PER_MMA: gl.constexpr, STAGES: gl.constexpr, KEY_BOX: gl.constexpr, TEAM: gl.constexpr,
                TEAMS: gl.constexpr, GROUPS: gl.constexpr):
    """:func:`_await_tile` then :func:`_issue_tile` of the program's ``n``-th tile: its ring
    slot, scales and wgmmas in flight."""
    ring_slot = _await_tile(full_bars, n, STAGES, KEY_BOX, TEAM, TEAMS)
    scale, pending = _issue_tile(key_ring.index(ring_slot), q_stage, scale_ring.index(ring_slot), NEXT_N, HEADS,
                                 ROWS_PER_MMA, GROUPS)
    return ring_slot, scale, pending


@gluon.jit
def _retire_tile(pending, scale, empty_bar, weights, limits, out_ptr, b, tile, stride_out, max_model_len, cleaning,
                 NEXT_N: gl.constexpr, HEADS: gl.constexpr, ROWS_PER_MMA: gl.constexpr, GROUPS: gl.constexpr,
                 NEWER: gl.constexpr, HEAD_SUM: gl.constexpr = 0):
    """Wait for a tile's wgmmas while ``NEWER`` later groups stay in flight, free its slot (every
    thread for itself), then its epilogues (with ``HEAD_SUM``: every group's head-sum wgmma
    issued before the first is waited for; ``NEWER`` is then 0, the host admits no overlap)."""
    scores = ()
    for i in gl.static_range(len(GROUPS)):
        scores = scores + (warpgroup_mma_wait(NEWER + len(GROUPS) - 1 - i, deps=(pending[i],)),)
    async_copy.mbarrier_arrive(empty_bar, increment_count=False)  # no copy pending: arrives now
    if HEAD_SUM:
        sums = ()
        operands = ()
        for i in gl.static_range(len(GROUPS)):
            head_sum, operand = wg.issue_tensor_head_sum(scores[i], weights[i],
                                                         wg.group_rows(NEXT_N, ROWS_PER_MMA, GROUPS[i]))
            sums = sums + (head_sum,)
            operands = operands + (operand,)
        for i in gl.static_range(len(GROUPS)):
            _finish_tensor_group(out_ptr, sums[i], operands[i], scale, limits[i], b, tile, stride_out, max_model_len,
                                 cleaning, NEXT_N, ROWS_PER_MMA, GROUPS[i], len(GROUPS) - 1 - i)
    else:
        for i in gl.static_range(len(GROUPS)):
            _finish_group(out_ptr, scores[i], scale, weights[i], limits[i], b, tile, stride_out, max_model_len,
                          cleaning, NEXT_N, HEADS, ROWS_PER_MMA, GROUPS[i])


@gluon.jit
def _score_tiles_overlapped(key_ring, scale_ring, full_bars, empty_bars, q_stage, weights, limits, out_ptr, b, tile,
                            k, first, count, stride_out, max_model_len, cleaning, NEXT_N: gl.constexpr,
                            HEADS: gl.constexpr, ROWS_PER_MMA: gl.constexpr, STAGES: gl.constexpr,
                            KEY_BOX: gl.constexpr, TEAM: gl.constexpr, TEAMS: gl.constexpr, GROUPS: gl.constexpr):
    """``Overlap=1``: the team's tiles ``first, first + TEAMS, ... < count`` of a sequence, each
    tile's wgmmas issued before the previous tile's epilogue, so a consumer's tensor-core work
    runs under its own epilogue rather than between its tiles. Two sets of accumulators, ``a``
    and ``b``, take the tiles in turn, two tiles per loop step: a set is retired before it is
    issued again, so neither is copied while its wgmmas run (ptxas would serialise them)."""
    L: gl.constexpr = len(GROUPS)
    n = gl.cdiv(gl.maximum(count - first, 0), TEAMS)  # the team's tiles here
    if n > 0:
        slot_a, scale_a, pending_a = _start_tile(key_ring, scale_ring, full_bars, q_stage, k + first, NEXT_N, HEADS,
                                                 ROWS_PER_MMA, STAGES, KEY_BOX, TEAM, TEAMS, GROUPS)
        j = 1
        while j + 1 < n:
            i = first + j * TEAMS
            slot_b, scale_b, pending_b = _start_tile(key_ring, scale_ring, full_bars, q_stage, k + i, NEXT_N, HEADS,
                                                     ROWS_PER_MMA, STAGES, KEY_BOX, TEAM, TEAMS, GROUPS)
            _retire_tile(pending_a, scale_a, empty_bars.index(slot_a), weights, limits, out_ptr, b, tile + i - TEAMS,
                         stride_out, max_model_len, cleaning, NEXT_N, HEADS, ROWS_PER_MMA, GROUPS, L)
            slot_a, scale_a, pending_a = _start_tile(key_ring, scale_ring, full_bars, q_stage, k + i + TEAMS, NEXT_N,
                                                     HEADS, ROWS_PER_MMA, STAGES, KEY_BOX, TEAM, TEAMS, GROUPS)
            _retire_tile(pending_b, scale_b, empty_bars.index(slot_b), weights, limits, out_ptr, b, tile + i,
                         stride_out, max_model_len, cleaning, NEXT_N, HEADS, ROWS_PER_MMA, GROUPS, L)
            j += 2
        last = first + (n - 1) * TEAMS
        if j < n:  # an even count: one tile left after the pairs
            slot_b, scale_b, pending_b = _start_tile(key_ring, scale_ring, full_bars, q_stage, k + last, NEXT_N, HEADS,
                                                     ROWS_PER_MMA, STAGES, KEY_BOX, TEAM, TEAMS, GROUPS)
            _retire_tile(pending_a, scale_a, empty_bars.index(slot_a), weights, limits, out_ptr, b,
                         tile + last - TEAMS, stride_out, max_model_len, cleaning, NEXT_N, HEADS, ROWS_PER_MMA,
                         GROUPS, L)
            _retire_tile(pending_b, scale_b, empty_bars.index(slot_b), weights, limits, out_ptr, b, tile + last,
                         stride_out, max_model_len, cleaning, NEXT_N, HEADS, ROWS_PER_MMA, GROUPS, 0)
        else:
            _retire_tile(pending_a, scale_a, empty_bars.index(slot_a), weights, limits, out_ptr, b, tile + last,
                         stride_out, max_model_len, cleaning, NEXT_N, HEADS, ROWS_PER_MMA, GROUPS, 0)


@gluon.jit
def _finish_group(out_ptr, scores, scale, weight, limit, b, tile, stride_out, max_model_len, cleaning,
                  NEXT_N: gl.constexpr, HEADS: gl.constexpr, ROWS_PER_MMA: gl.constexpr, g: gl.constexpr):
    """Epilogue and store of row group ``g`` of a tile."""
    first: gl.constexpr = wg.group_first_row(NEXT_N, ROWS_PER_MMA, g)
    rows: gl.constexpr = wg.group_rows(NEXT_N, ROWS_PER_MMA, g)
    logits = wg.group_logits(scores, scale, weight, _TILE, rows, HEADS)
    _store_group(out_ptr, logits, limit, b, tile * _TILE, stride_out, max_model_len, cleaning, NEXT_N, first, rows)


@gluon.jit
def _finish_tensor_group(out_ptr, pending, operand, scale, limit, b, tile, stride_out, max_model_len, cleaning,
                         NEXT_N: gl.constexpr, ROWS_PER_MMA: gl.constexpr, g: gl.constexpr, NEWER: gl.constexpr):
    """``HeadSum=tensor``: wait for row group ``g``'s head-sum wgmma, then its store (the rows the
    head sum pads the group with are not the group's and are never stored)."""
    logits = wg.finish_tensor_head_sum(pending, operand, scale, NEWER)
    _store_group(out_ptr, logits, limit, b, tile * _TILE, stride_out, max_model_len, cleaning, NEXT_N,
                 wg.group_first_row(NEXT_N, ROWS_PER_MMA, g), logits.shape[1],
                 wg.group_rows(NEXT_N, ROWS_PER_MMA, g))


@gluon.jit
def _consumer(pointers, strides, sizes, buffers, share,
              NEXT_N: gl.constexpr, HEADS: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr, ROWS_PER_MMA: gl.constexpr,
              STAGES: gl.constexpr, LENS_2D: gl.constexpr, KEY_BOX: gl.constexpr, TEAM: gl.constexpr,
              TEAMS: gl.constexpr, PART: gl.constexpr, ROW_SPLIT: gl.constexpr, OVERLAP: gl.constexpr,
              headsum_smem=None, HEAD_SUM: gl.constexpr = 0):
    """Score team ``TEAM``'s tiles of the share, row groups ``PART, PART + ROW_SPLIT, ...``; with
    ``HEAD_SUM``, the head sum on the tensor cores through this consumer's ``headsum_smem``."""
    GROUPS: gl.constexpr = wg.part_groups(NEXT_N, ROWS_PER_MMA, PART, ROW_SPLIT)
    q_ptr, kv_ptr, scale_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr = pointers
    stride_q_b, stride_q_j, stride_q_h, stride_block, stride_w, stride_out, stride_lens_b, stride_lens_j, \
        stride_table = strides
    max_model_len, max_blocks, num_blocks, clean_logits = sizes
    key_ring, scale_ring, q_ring, weight_ring, full_bars, empty_bars, q_full, q_empty = buffers
    item, stop, b, tile = share
    k = 0
    q_iter = 0
    while item < stop:
        seq_len, end, count = _segment(lens_ptr, b, tile, item, stop, stride_lens_b, stride_lens_j, max_model_len,
                                       max_blocks, NEXT_N, KV_BLOCK_SIZE, LENS_2D)
        if count > 0:
            stage = q_iter % 2
            mbarrier.wait(q_full.index(stage), (q_iter // 2) & 1)
            fence_async_shared()  # Q's cp.async bytes, seen by wgmma's async proxy
            q_stage = q_ring.index(stage)
            weights, limits = _sequence_operands(weight_ring.index(stage), lens_ptr, b, seq_len, end, stride_lens_b,
                                                 stride_lens_j, NEXT_N, HEADS, ROWS_PER_MMA, LENS_2D, GROUPS,
                                                 headsum_smem, HEAD_SUM, TEAM * ROW_SPLIT + PART)
            first = (TEAM - k % TEAMS + TEAMS) % TEAMS
            if OVERLAP and len(GROUPS) > 0:
                _score_tiles_overlapped(key_ring, scale_ring, full_bars, empty_bars, q_stage, weights, limits, out_ptr,
                                        b, tile, k, first, count, stride_out, max_model_len, clean_logits != 0,
                                        NEXT_N, HEADS, ROWS_PER_MMA, STAGES, KEY_BOX, TEAM, TEAMS, GROUPS)
            else:
                for i in range(first, count, TEAMS):
                    ring_slot = _await_tile(full_bars, k + i, STAGES, KEY_BOX, TEAM, TEAMS)
                    _score_tile(key_ring.index(ring_slot), q_stage, scale_ring.index(ring_slot),
                                empty_bars.index(ring_slot), weights, limits, out_ptr, b, tile + i, stride_out,
                                max_model_len, clean_logits != 0, NEXT_N, HEADS, ROWS_PER_MMA, GROUPS, HEAD_SUM)
            async_copy.mbarrier_arrive(q_empty.index(stage), increment_count=False)  # done with Q and weights
            q_iter += 1
        k += count
        item += count
        b += 1
        tile = tile * 0


# ----------------------------------------------------------------------------- the kernel
@gluon.jit
def _split_share(lens_ptr, stride_lens_b, stride_lens_j, max_model_len, max_blocks, num_splits,
                 NEXT_N: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr, LENS_2D: gl.constexpr, UNIT: gl.constexpr):
    """``Schedule=split``: program ``(split, b)``'s share as ``(item, stop, b, first)``: an even part
    of sequence ``b``'s tiles (``UNIT`` 0) or of its tail units."""
    b = gl.program_id(1)
    split = gl.program_id(0)
    seq_len = device.sequence_length(lens_ptr, b, stride_lens_b, stride_lens_j, NEXT_N, LENS_2D)
    tiles = gl.cdiv(device.visible_end(seq_len, max_model_len, max_blocks, KV_BLOCK_SIZE), _TILE)
    if UNIT > 0:
        tiles = gl.cdiv(gl.maximum(max_model_len - tiles * _TILE, 0), UNIT)
    first = tiles * split // num_splits
    return gl.to_tensor(0), tiles * (split + 1) // num_splits - first, b, first


@gluon.jit
def _program_share(lens_ptr, batch, stride_lens_b, stride_lens_j, max_model_len, max_blocks, num_splits,
                   NEXT_N: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr, LENS_2D: gl.constexpr, BALANCED: gl.constexpr,
                   UNIT: gl.constexpr, WARPS: gl.constexpr):
    """This program's share ``(item, stop, b, first)`` of the batch's tiles (``UNIT`` 0) or of
    its tails' units, by the schedule the kernel runs, computed by ``WARPS`` warps."""
    if BALANCED:
        share = device.balanced_share(lens_ptr, batch, stride_lens_b, stride_lens_j, max_model_len, max_blocks,
                                      gl.program_id(0), gl.num_programs(0), NEXT_N, LENS_2D, KV_BLOCK_SIZE, _TILE,
                                      device.scan_layout(32, WARPS), UNIT)
    else:
        share = _split_share(lens_ptr, stride_lens_b, stride_lens_j, max_model_len, max_blocks, num_splits,
                             NEXT_N, KV_BLOCK_SIZE, LENS_2D, UNIT)
    return share


@gluon.jit(do_not_specialize=DYNAMIC_PARAMS)
def wgmma_pipes_logits_kernel(
    q_ptr, kv_ptr, scale_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr,
    stride_q_b, stride_q_j, stride_q_h,
    stride_block,  # bytes between cache blocks (multiple of 4)
    stride_w, stride_out, stride_lens_b, stride_lens_j, stride_table,
    max_model_len, max_blocks, num_splits, batch, num_blocks,
    key_desc,  # TMA descriptors of the keys [num_blocks, KV_BLOCK_SIZE, 128] and of the scales
    scale_desc,  # [num_blocks, block stride / 4] fp32 (KEY_BOX > 0), else None
    clean_logits,  # 1: -inf where a row sees nothing, up to max_model_len
    NEXT_N: gl.constexpr, NEXT_N_POW2: gl.constexpr, HEADS: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr,
    ROWS_PER_MMA: gl.constexpr, STAGES: gl.constexpr, PRESHUFFLE: gl.constexpr, LENS_2D: gl.constexpr,
    KV_ALIGN: gl.constexpr, Q_ASYNC: gl.constexpr, KEY_BOX: gl.constexpr, BALANCED: gl.constexpr,
    CONSUMERS: gl.constexpr, ROW_SPLIT: gl.constexpr, OVERLAP: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, HEAD_SUM: gl.constexpr = 0,
):
    """Score the program's share (see the module docstring) with ``CONSUMERS`` consumer
    warpgroups in teams of ``ROW_SPLIT``, one producer warp and one ring per team."""
    TEAMS: gl.constexpr = CONSUMERS // ROW_SPLIT
    tile_smem: gl.constexpr = wg.tile_smem_layout()
    key_ring = gl.allocate_shared_memory(gl.float8e4nv, [TEAMS * STAGES, _TILE, _D], tile_smem)
    scale_ring = gl.allocate_shared_memory(gl.float32, [TEAMS * STAGES, 1, _TILE], _SCALE_BOX_LAYOUT)
    q_ring = gl.allocate_shared_memory(gl.float8e4nv, [2, NEXT_N_POW2 * HEADS, _D], tile_smem)
    weight_ring = gl.allocate_shared_memory(gl.float32, [2, NEXT_N_POW2 * HEADS], wg.vec_smem_layout())
    full_bars = gl.allocate_shared_memory(gl.int64, [TEAMS * STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [TEAMS * STAGES, 1], mbarrier.MBarrierLayout())
    q_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    headsum_smem = wg.allocate_headsum_weights(weight_ring, NEXT_N, HEADS, ROWS_PER_MMA, CONSUMERS, ROW_SPLIT,
                                               HEAD_SUM)
    for s in gl.static_range(TEAMS * STAGES):
        # the TMA byte count's arrive, or one noinc arrive per producer lane
        mbarrier.init(full_bars.index(s), count=1 if KEY_BOX > 0 else 32 * _PRODUCER_WARPS)
        mbarrier.init(empty_bars.index(s), count=32 * _CONSUMER_WARPS * ROW_SPLIT)  # every consumer thread
    for s in gl.static_range(2):
        mbarrier.init(q_full.index(s), count=32 * _PRODUCER_WARPS if Q_ASYNC else 1)
        mbarrier.init(q_empty.index(s), count=32 * _CONSUMER_WARPS * CONSUMERS)

    share = _program_share(lens_ptr, batch, stride_lens_b, stride_lens_j, max_model_len, max_blocks, num_splits,
                           NEXT_N, KV_BLOCK_SIZE, LENS_2D, BALANCED, 0, _CONSUMER_WARPS)
    if clean_logits != 0:
        tail_share = _program_share(lens_ptr, batch, stride_lens_b, stride_lens_j, max_model_len, max_blocks,
                                    num_splits, NEXT_N, KV_BLOCK_SIZE, LENS_2D, BALANCED, _TAIL_UNIT, _CONSUMER_WARPS)
    else:
        tail_share = share
    pointers = (q_ptr, kv_ptr, scale_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr)
    strides = (stride_q_b, stride_q_j, stride_q_h, stride_block, stride_w, stride_out, stride_lens_b, stride_lens_j,
               stride_table)
    sizes = (max_model_len, max_blocks, num_blocks, clean_logits)
    buffers = (key_ring, scale_ring, q_ring, weight_ring, full_bars, empty_bars, q_full, q_empty)
    # The partitions, spelled out per (CONSUMERS, ROW_SPLIT): constexprs passed in a tuple held
    # in a variable would become tensors. Consumer 0 is the default partition.
    if CONSUMERS == 1:
        gl.warp_specialize([
            (_consumer, (pointers, strides, sizes, buffers, share, NEXT_N, HEADS, KV_BLOCK_SIZE, ROWS_PER_MMA, STAGES,
                         LENS_2D, KEY_BOX, 0, 1, 0, 1, OVERLAP, headsum_smem, HEAD_SUM)),
            (_producer, (pointers, strides, sizes, key_desc, scale_desc, buffers, share, tail_share, NEXT_N, HEADS,
                         KV_BLOCK_SIZE, STAGES, PRESHUFFLE, LENS_2D, KV_ALIGN, Q_ASYNC, KEY_BOX, 0, 1)),
        ], [_PRODUCER_WARPS], [PRODUCER_REGS])
    elif CONSUMERS == 2 and ROW_SPLIT == 1:
        gl.warp_specialize([
            (_consumer, (pointers, strides, sizes, buffers, share, NEXT_N, HEADS, KV_BLOCK_SIZE, ROWS_PER_MMA, STAGES,
                         LENS_2D, KEY_BOX, 0, 2, 0, 1, OVERLAP, headsum_smem, HEAD_SUM)),
            (_consumer, (pointers, strides, sizes, buffers, share, NEXT_N, HEADS, KV_BLOCK_SIZE, ROWS_PER_MMA, STAGES,
                         LENS_2D, KEY_BOX, 1, 2, 0, 1, OVERLAP, headsum_smem, HEAD_SUM)),
            (_producer, (pointers, strides, sizes, key_desc, scale_desc, buffers, share, tail_share, NEXT_N, HEADS,
                         KV_BLOCK_SIZE, STAGES, PRESHUFFLE, LENS_2D, KV_ALIGN, Q_ASYNC, KEY_BOX, 0, 2)),
            (_producer, (pointers, strides, sizes, key_desc, scale_desc, buffers, share, tail_share, NEXT_N, HEADS,
                         KV_BLOCK_SIZE, STAGES, PRESHUFFLE, LENS_2D, KV_ALIGN, Q_ASYNC, KEY_BOX, 1, 2)),
        ], [_CONSUMER_WARPS, _PRODUCER_WARPS, _PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS, PRODUCER_REGS])
    elif CONSUMERS == 2:
        gl.warp_specialize([
            (_consumer, (pointers, strides, sizes, buffers, share, NEXT_N, HEADS, KV_BLOCK_SIZE, ROWS_PER_MMA, STAGES,
                         LENS_2D, KEY_BOX, 0, 1, 0, 2, OVERLAP, headsum_smem, HEAD_SUM)),
            (_consumer, (pointers, strides, sizes, buffers, share, NEXT_N, HEADS, KV_BLOCK_SIZE, ROWS_PER_MMA, STAGES,
                         LENS_2D, KEY_BOX, 0, 1, 1, 2, OVERLAP, headsum_smem, HEAD_SUM)),
            (_producer, (pointers, strides, sizes, key_desc, scale_desc, buffers, share, tail_share, NEXT_N, HEADS,
                         KV_BLOCK_SIZE, STAGES, PRESHUFFLE, LENS_2D, KV_ALIGN, Q_ASYNC, KEY_BOX, 0, 1)),
        ], [_CONSUMER_WARPS, _PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])
    elif CONSUMERS == 3:
        gl.warp_specialize([
            (_consumer, (pointers, strides, sizes, buffers, share, NEXT_N, HEADS, KV_BLOCK_SIZE, ROWS_PER_MMA, STAGES,
                         LENS_2D, KEY_BOX, 0, 3, 0, 1, OVERLAP, headsum_smem, HEAD_SUM)),
            (_consumer, (pointers, strides, sizes, buffers, share, NEXT_N, HEADS, KV_BLOCK_SIZE, ROWS_PER_MMA, STAGES,
                         LENS_2D, KEY_BOX, 1, 3, 0, 1, OVERLAP, headsum_smem, HEAD_SUM)),
            (_consumer, (pointers, strides, sizes, buffers, share, NEXT_N, HEADS, KV_BLOCK_SIZE, ROWS_PER_MMA, STAGES,
                         LENS_2D, KEY_BOX, 2, 3, 0, 1, OVERLAP, headsum_smem, HEAD_SUM)),
            (_producer, (pointers, strides, sizes, key_desc, scale_desc, buffers, share, tail_share, NEXT_N, HEADS,
                         KV_BLOCK_SIZE, STAGES, PRESHUFFLE, LENS_2D, KV_ALIGN, Q_ASYNC, KEY_BOX, 0, 3)),
            (_producer, (pointers, strides, sizes, key_desc, scale_desc, buffers, share, tail_share, NEXT_N, HEADS,
                         KV_BLOCK_SIZE, STAGES, PRESHUFFLE, LENS_2D, KV_ALIGN, Q_ASYNC, KEY_BOX, 1, 3)),
            (_producer, (pointers, strides, sizes, key_desc, scale_desc, buffers, share, tail_share, NEXT_N, HEADS,
                         KV_BLOCK_SIZE, STAGES, PRESHUFFLE, LENS_2D, KV_ALIGN, Q_ASYNC, KEY_BOX, 2, 3)),
        ], [_CONSUMER_WARPS, _CONSUMER_WARPS, _PRODUCER_WARPS, _PRODUCER_WARPS, _PRODUCER_WARPS],
           [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS, PRODUCER_REGS, PRODUCER_REGS])
    elif CONSUMERS == 4 and ROW_SPLIT == 1:
        gl.warp_specialize([
            (_consumer, (pointers, strides, sizes, buffers, share, NEXT_N, HEADS, KV_BLOCK_SIZE, ROWS_PER_MMA, STAGES,
                         LENS_2D, KEY_BOX, 0, 4, 0, 1, OVERLAP, headsum_smem, HEAD_SUM)),
            (_consumer, (pointers, strides, sizes, buffers, share, NEXT_N, HEADS, KV_BLOCK_SIZE, ROWS_PER_MMA, STAGES,
                         LENS_2D, KEY_BOX, 1, 4, 0, 1, OVERLAP, headsum_smem, HEAD_SUM)),
            (_consumer, (pointers, strides, sizes, buffers, share, NEXT_N, HEADS, KV_BLOCK_SIZE, ROWS_PER_MMA, STAGES,
                         LENS_2D, KEY_BOX, 2, 4, 0, 1, OVERLAP, headsum_smem, HEAD_SUM)),
            (_consumer, (pointers, strides, sizes, buffers, share, NEXT_N, HEADS, KV_BLOCK_SIZE, ROWS_PER_MMA, STAGES,
                         LENS_2D, KEY_BOX, 3, 4, 0, 1, OVERLAP, headsum_smem, HEAD_SUM)),
            (_producer, (pointers, strides, sizes, key_desc, scale_desc, buffers, share, tail_share, NEXT_N, HEADS,
                         KV_BLOCK_SIZE, STAGES, PRESHUFFLE, LENS_2D, KV_ALIGN, Q_ASYNC, KEY_BOX, 0, 4)),
            (_producer, (pointers, strides, sizes, key_desc, scale_desc, buffers, share, tail_share, NEXT_N, HEADS,
                         KV_BLOCK_SIZE, STAGES, PRESHUFFLE, LENS_2D, KV_ALIGN, Q_ASYNC, KEY_BOX, 1, 4)),
            (_producer, (pointers, strides, sizes, key_desc, scale_desc, buffers, share, tail_share, NEXT_N, HEADS,
                         KV_BLOCK_SIZE, STAGES, PRESHUFFLE, LENS_2D, KV_ALIGN, Q_ASYNC, KEY_BOX, 2, 4)),
            (_producer, (pointers, strides, sizes, key_desc, scale_desc, buffers, share, tail_share, NEXT_N, HEADS,
                         KV_BLOCK_SIZE, STAGES, PRESHUFFLE, LENS_2D, KV_ALIGN, Q_ASYNC, KEY_BOX, 3, 4)),
        ], [_CONSUMER_WARPS, _CONSUMER_WARPS, _CONSUMER_WARPS, _PRODUCER_WARPS, _PRODUCER_WARPS, _PRODUCER_WARPS,
            _PRODUCER_WARPS],
           [CONSUMER_REGS, CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS, PRODUCER_REGS, PRODUCER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (pointers, strides, sizes, buffers, share, NEXT_N, HEADS, KV_BLOCK_SIZE, ROWS_PER_MMA, STAGES,
                         LENS_2D, KEY_BOX, 0, 2, 0, 2, OVERLAP, headsum_smem, HEAD_SUM)),
            (_consumer, (pointers, strides, sizes, buffers, share, NEXT_N, HEADS, KV_BLOCK_SIZE, ROWS_PER_MMA, STAGES,
                         LENS_2D, KEY_BOX, 0, 2, 1, 2, OVERLAP, headsum_smem, HEAD_SUM)),
            (_consumer, (pointers, strides, sizes, buffers, share, NEXT_N, HEADS, KV_BLOCK_SIZE, ROWS_PER_MMA, STAGES,
                         LENS_2D, KEY_BOX, 1, 2, 0, 2, OVERLAP, headsum_smem, HEAD_SUM)),
            (_consumer, (pointers, strides, sizes, buffers, share, NEXT_N, HEADS, KV_BLOCK_SIZE, ROWS_PER_MMA, STAGES,
                         LENS_2D, KEY_BOX, 1, 2, 1, 2, OVERLAP, headsum_smem, HEAD_SUM)),
            (_producer, (pointers, strides, sizes, key_desc, scale_desc, buffers, share, tail_share, NEXT_N, HEADS,
                         KV_BLOCK_SIZE, STAGES, PRESHUFFLE, LENS_2D, KV_ALIGN, Q_ASYNC, KEY_BOX, 0, 2)),
            (_producer, (pointers, strides, sizes, key_desc, scale_desc, buffers, share, tail_share, NEXT_N, HEADS,
                         KV_BLOCK_SIZE, STAGES, PRESHUFFLE, LENS_2D, KV_ALIGN, Q_ASYNC, KEY_BOX, 1, 2)),
        ], [_CONSUMER_WARPS, _CONSUMER_WARPS, _CONSUMER_WARPS, _PRODUCER_WARPS, _PRODUCER_WARPS],
           [CONSUMER_REGS, CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS, PRODUCER_REGS])
