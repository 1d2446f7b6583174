"""sm_90 warp-specialised variant of the ``gluon`` backend: the wgmma kernel with its copies
moved to a producer warpgroup.

Why: in ``wgmma`` one warpgroup does everything for a tile in order: wait for its keys,
a CTA-wide barrier, issue the next tile's table lookups and cp.async gathers (address math for
``ChunkK x 128`` bytes), the wgmma, then the fp32 epilogue. At next_n >= 2 with 64 heads the
epilogue and the copy issue sit on the critical path of the only warpgroup that feeds the
tensor cores, and the overlap comes only from other programs on the SM. Here:

* a **producer partition** (one warpgroup with few registers) walks the program's share of
  the balanced schedule and, for every tile, waits until a ring slot is empty, gathers the
  tile's keys and scales into it with cp.async and arrives on the slot's *full* mbarrier
  when its copies land (``cp.async.mbarrier.arrive.noinc``: no thread waits for its own
  copies). It runs up to ``num_stages`` tiles ahead, across sequence boundaries;
* the **consumer partition** (the default warpgroup, with the registers the producer does
  not need) waits on *full*, runs the wgmmas and the epilogue exactly as ``wgmma``
  does (the same device helpers), then arrives on the slot's *empty* mbarrier. It reloads
  Q, the weights and the row limits at each sequence boundary of its share;
* no CTA-wide barrier per tile: the partitions meet only at the mbarriers, and
  ``CtasPerSM`` programs per SM interleave their consumers' wgmmas and epilogues;
* ``KeyCopy=tma``: the producer moves each tile's keys with one TMA box per cache block
  (a descriptor over ``[num_blocks, KV_BLOCK_SIZE, 128]`` with the cache's block stride) instead
  of ``ChunkK * 8`` cp.async gathers with their address math, for caches whose base and
  block stride are 16-byte aligned and whose keys are not preshuffled (any other call of the
  config gathers). The scales still arrive by cp.async; the full barrier counts the producer
  threads' arrivals plus the TMA byte count's;
* ``Consumers`` 2 to 4: that many consumer warpgroups take the program's tiles in turn
  (tile ``k`` goes to consumer ``k % Consumers``), each with its own copy of Q, the weights
  and the row limits, all fed by the one producer. The register file then holds one producer
  per program instead of one per consumer: three consumers in one program get 152 registers
  each, three single-consumer programs 104, which is what the 128-column row groups of
  64 heads x next_n 2 need to overlap three epilogues without spilling;
* ``RowSplit=2``: the consumers work in teams of two on each tile (tile ``k`` goes to team
  ``k % (Consumers / 2)``), each scoring every other row group of it, so that a consumer
  holds half the accumulators: 64 heads x next_n 4 runs as four consumers of 104 registers
  per SM, each with one 128-column group, as DeepGEMM splits those rows over a CTA pair.
  The slot is freed when both consumers of the team have arrived on its *empty* barrier.

Only the balanced schedule (``schedule.py``): the producer and the consumers walk the same
share, computed once before the partitions fork. Register split: ``maxnreg`` is set so that
``CtasPerSM`` programs of ``4 * (Consumers + 1)`` warps fill the register file; the producer
gets ``PRODUCER_REGS``, the consumers the rest in equal parts (``setmaxnreg``, emitted by
Triton).

Semantics and the row-group and tile-halving epilogues are ``wgmma``'s; see its
docstring. This module is the device side; the knobs (``wgmma``'s ``ChunkK``,
``RowsPerMMA``, ``num_stages``, ``CtasPerSM``; plus ``Consumers``, ``RowSplit`` and ``KeyCopy``), the register
split, the resource rules, the TMA key descriptor and the launch plan are the host side,
``backends/gluon/wgmma_ws.py``.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from ....triton_internals.gluon_api import (async_copy, fence_async_shared, thread_barrier, tma, warpgroup_mma,
                                             warpgroup_mma_wait)
from . import device
from . import wgmma as base
from .device import DYNAMIC_PARAMS

# The facts both sides read (the host module imports them from here).
NUM_WARPS = base.NUM_WARPS  # the consumer warpgroup (the kernel's default partition)
PRODUCER_WARPS = 4  # the copy layouts of wgmma cover one warpgroup
#: the shared layout of one key box, ``[1, KEY_BOX, 128]`` fp8: the ring slot's 128-byte swizzle
#: (the host builds the TMA descriptor of the keys with it)
KEY_BOX_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=3)
_D = gl.constexpr(base.HEAD_DIM)
_PRODUCER_WARPS = gl.constexpr(PRODUCER_WARPS)
_PRODUCER_THREADS = gl.constexpr(PRODUCER_WARPS * 32)
_CONSUMER_WARPS = gl.constexpr(NUM_WARPS)


# ----------------------------------------------------------------------------- partitions
@gluon.jit
def _issue_keys_tma(key_desc, key_dst, full_bar, table_row, tile, end, num_blocks, CHUNK: gl.constexpr,
                    KV_BLOCK_SIZE: gl.constexpr, KEY_BOX: gl.constexpr):
    """The keys of ``tile`` into one ring slot by TMA, one ``KEY_BOX x 128``-byte box per cache
    block part: one thread issues what the cp.async gather spreads over a warpgroup as
    ``CHUNK * 8`` 16-byte copies with their address math. Block ids are clamped into the cache
    like the gather's (the documented invalid-id rule); a box past ``end`` reloads the tile's
    first block, whose rows past ``end`` are never stored either."""
    mbarrier.expect(full_bar, CHUNK * _D)
    first_token = tile * CHUNK
    first_block = gl.maximum(gl.minimum(gl.load(table_row + first_token // KV_BLOCK_SIZE), num_blocks - 1), 0)
    for part in gl.static_range(CHUNK // KEY_BOX):
        token = first_token + part * KEY_BOX
        block = first_block
        if part * KEY_BOX >= KV_BLOCK_SIZE:  # a later cache block of the same tile
            block = gl.load(table_row + token // KV_BLOCK_SIZE, mask=token < end, other=first_block)
            block = gl.maximum(gl.minimum(block, num_blocks - 1), 0)
        # a [1, KEY_BOX, 128] view of the slot rows (reshape, then slice: Triton reshapes no subslice)
        box = key_dst.reshape([1, CHUNK, _D]).slice(part * KEY_BOX, KEY_BOX, dim=1)
        tma.async_copy_global_to_shared(key_desc, [block, token % KV_BLOCK_SIZE, 0], full_bar, box)


@gluon.jit
def _producer(kv_ptr, scale_ptr, lens_ptr, table_ptr, key_desc, key_ring, scale_ring, full_bars, empty_bars,
              item, stop, b, tile, stride_block, stride_lens_b, stride_lens_j, stride_table,
              max_model_len, max_blocks, num_blocks,
              NEXT_N: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr, CHUNK: gl.constexpr, STAGES: gl.constexpr,
              PRESHUFFLE: gl.constexpr, LENS_2D: gl.constexpr, KV_ALIGN: gl.constexpr, KEY_BOX: gl.constexpr):
    """Fill ring slot ``k % STAGES`` with the program's ``k``-th tile, for every tile of its share."""
    table_tokens = max_blocks * KV_BLOCK_SIZE
    k = 0
    while item < stop:
        seq_len = device.sequence_length(lens_ptr, b, stride_lens_b, stride_lens_j, NEXT_N, LENS_2D)
        end = device.visible_end(seq_len, max_model_len, max_blocks, KV_BLOCK_SIZE)
        count = gl.minimum(gl.cdiv(end, CHUNK) - tile, stop - item)
        table_row = table_ptr + b.to(gl.int64) * stride_table
        # The block ids of the next tile load while this one's slot is awaited and its copies
        # issued: the table lookup is a dependent global load in front of every gather.
        pages = base.key_scale_pages(table_row, tile, table_tokens, num_blocks, CHUNK, KV_BLOCK_SIZE)
        for i in range(count):
            upcoming = base.key_scale_pages(table_row, tile + i + 1, table_tokens, num_blocks, CHUNK, KV_BLOCK_SIZE)
            slot = k % STAGES
            mbarrier.wait(empty_bars.index(slot), ((k // STAGES) & 1) ^ 1)  # fresh barriers pass phase 1
            if KEY_BOX > 0:
                _issue_keys_tma(key_desc, key_ring.index(slot), full_bars.index(slot), table_row, tile + i, end,
                                num_blocks, CHUNK, KV_BLOCK_SIZE, KEY_BOX)
                base.issue_scales(scale_ring.index(slot), scale_ptr, pages[1], tile + i, end, stride_block, CHUNK,
                                  KV_BLOCK_SIZE)
            else:
                base.issue_tile(key_ring.index(slot), scale_ring.index(slot), kv_ptr, scale_ptr, pages, tile + i,
                                end, stride_block, CHUNK, KV_BLOCK_SIZE, PRESHUFFLE, KV_ALIGN)
            async_copy.mbarrier_arrive(full_bars.index(slot), increment_count=False)
            pages = upcoming
            k += 1
        item += count  # >= 0: a share starts inside its first sequence's tiles
        b += 1
        tile = tile * 0


@gluon.jit
def _load_sequence_operands(q_ptr, weights_ptr, lens_ptr, q_smem, weight_smem, limit_smem, b, seq_len, end,
                            stride_q_b, stride_q_j, stride_q_h, stride_w, stride_lens_b, stride_lens_j,
                            NEXT_N: gl.constexpr, NEXT_N_POW2: gl.constexpr, HEADS: gl.constexpr,
                            LENS_2D: gl.constexpr, Q_ASYNC: gl.constexpr):
    """Q (wgmma's B operand), the weights and the row limits of sequence ``b`` into shared
    memory, visible to the whole consumer warpgroup and to wgmma's async proxy on return."""
    vec_layout: gl.constexpr = gl.BlockedLayout([1], [32], [_CONSUMER_WARPS], [0])
    thread_barrier()  # the previous sequence's wgmmas and epilogues are done with these buffers
    base.copy_query(q_ptr, q_smem, b, stride_q_b, stride_q_j, stride_q_h, NEXT_N, NEXT_N_POW2, HEADS, Q_ASYNC)
    if Q_ASYNC:
        async_copy.commit_group()
    weight_smem.store(base.load_weights(weights_ptr, b, stride_w, NEXT_N, NEXT_N_POW2, HEADS, vec_layout))
    limit_smem.store(base.row_limits(lens_ptr, b, seq_len, end, stride_lens_b, stride_lens_j,
                                      gl.arange(0, NEXT_N_POW2, vec_layout), NEXT_N, LENS_2D))
    if Q_ASYNC:
        async_copy.wait_group(0)
    fence_async_shared()
    thread_barrier()


@gluon.jit
def _consumer(q_ptr, weights_ptr, out_ptr, lens_ptr, key_ring, scale_ring, q_smem, weight_smem, limit_smem,
              full_bars, empty_bars, item, stop, b, tile,
              stride_q_b, stride_q_j, stride_q_h, stride_w, stride_out, stride_lens_b, stride_lens_j,
              max_model_len, max_blocks,
              NEXT_N: gl.constexpr, NEXT_N_POW2: gl.constexpr, HEADS: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr,
              CHUNK: gl.constexpr, ROWS_PER_MMA: gl.constexpr, STAGES: gl.constexpr, LENS_2D: gl.constexpr,
              Q_ASYNC: gl.constexpr, ROLE: gl.constexpr, CONSUMERS: gl.constexpr, ROW_SPLIT: gl.constexpr,
              headsum_smem, HEAD_SUM: gl.constexpr):
    """Score the program's tiles ``k`` with ``k % TEAMS == ROLE // ROW_SPLIT`` (ring slot
    ``k % STAGES``) against their sequences' rows, with this consumer's own copy of Q, weights
    and limits: every row group when ``ROW_SPLIT`` is 1, else the groups ``g`` with
    ``g % ROW_SPLIT == ROLE % ROW_SPLIT``, the team's other consumers scoring the rest. With
    ``HEAD_SUM``, the head sum on the tensor cores through this consumer's part of ``headsum_smem``."""
    TEAMS: gl.constexpr = CONSUMERS // ROW_SPLIT
    TEAM: gl.constexpr = ROLE // ROW_SPLIT
    PART: gl.constexpr = ROLE % ROW_SPLIT
    q_mine = q_smem.index(ROLE)
    weight_mine = weight_smem.index(ROLE)
    limit_mine = limit_smem.index(ROLE)
    GROUPS: gl.constexpr = base.part_groups(NEXT_N, ROWS_PER_MMA, PART, ROW_SPLIT)
    k = 0  # the program's tiles before this sequence's first, every consumer's
    while item < stop:
        seq_len = device.sequence_length(lens_ptr, b, stride_lens_b, stride_lens_j, NEXT_N, LENS_2D)
        end = device.visible_end(seq_len, max_model_len, max_blocks, KV_BLOCK_SIZE)
        count = gl.minimum(gl.cdiv(end, CHUNK) - tile, stop - item)
        first = (TEAM - k % TEAMS + TEAMS) % TEAMS  # this consumer's first tile here
        if count > first:  # sequences with no tile of this consumer's (or none at all) are skipped
            _load_sequence_operands(q_ptr, weights_ptr, lens_ptr, q_mine, weight_mine, limit_mine, b, seq_len, end,
                                    stride_q_b, stride_q_j, stride_q_h, stride_w, stride_lens_b, stride_lens_j,
                                    NEXT_N, NEXT_N_POW2, HEADS, LENS_2D, Q_ASYNC)
            if HEAD_SUM:
                limits = base.tensor_operands(weight_mine, headsum_smem, lens_ptr, b, seq_len, end, stride_lens_b,
                                              stride_lens_j, NEXT_N, HEADS, ROWS_PER_MMA, LENS_2D, CHUNK, GROUPS,
                                              ROLE)
            else:
                weight_regs = base.single_group_weights(weight_mine, NEXT_N, HEADS, ROWS_PER_MMA)
            for i in range(first, count, TEAMS):
                slot = (k + i) % STAGES
                mbarrier.wait(full_bars.index(slot), ((k + i) // STAGES) & 1)
                fence_async_shared()  # the producer's cp.async bytes, seen by wgmma's async proxy
                if HEAD_SUM:
                    base.score_tile_tensor(key_ring.index(slot), q_mine, scale_ring.index(slot), headsum_smem,
                                           limits, out_ptr, b, tile + i, stride_out, NEXT_N, HEADS, CHUNK,
                                           ROWS_PER_MMA, GROUPS, ROLE)
                elif ROW_SPLIT == 1:
                    base.score_tile(key_ring.index(slot), q_mine, scale_ring.index(slot), weight_regs, weight_mine,
                                     limit_mine, out_ptr, b, tile + i, stride_out, NEXT_N, HEADS, CHUNK, ROWS_PER_MMA)
                else:
                    base.score_tile_groups(key_ring.index(slot), q_mine, scale_ring.index(slot), weight_mine,
                                           limit_mine, out_ptr, b, tile + i, stride_out, NEXT_N, HEADS, CHUNK,
                                           ROWS_PER_MMA, PART, ROW_SPLIT)
                thread_barrier()  # every warp's wgmma and scale reads of the slot are done ...
                mbarrier.arrive(empty_bars.index(slot), count=1)  # ... before one thread frees it
        k += count
        item += count
        b += 1
        tile = tile * 0


# ----------------------------------------------------------------------------- the kernel
@gluon.jit(do_not_specialize=DYNAMIC_PARAMS)
def wgmma_ws_logits_kernel(
    q_ptr, kv_ptr, scale_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr,
    stride_q_b, stride_q_j, stride_q_h,
    stride_block,  # bytes between cache blocks (multiple of 4)
    stride_w, stride_out, stride_lens_b, stride_lens_j, stride_table,
    max_model_len, max_blocks, num_splits, batch, num_blocks,
    key_desc,  # TMA descriptor of the keys, [num_blocks, KV_BLOCK_SIZE, 128] (KEY_BOX > 0), else None
    NEXT_N: gl.constexpr, NEXT_N_POW2: gl.constexpr, HEADS: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr,
    CHUNK: gl.constexpr, ROWS_PER_MMA: gl.constexpr, STAGES: gl.constexpr,
    PRESHUFFLE: gl.constexpr, LENS_2D: gl.constexpr, KV_ALIGN: gl.constexpr, Q_ASYNC: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, CONSUMERS: gl.constexpr, CONSUMER_REGS: gl.constexpr, KEY_BOX: gl.constexpr,
    ROW_SPLIT: gl.constexpr, HEAD_SUM: gl.constexpr = 0,
):
    """Program ``p`` of the persistent grid scores its equal share of the batch's tiles
    (``schedule.py``): a producer warpgroup streams the tiles through the ring, the consumer
    warpgroup scores them (see the module docstring). ``num_splits`` is unused (1)."""
    tile_smem: gl.constexpr = base.tile_smem_layout()
    vec_smem: gl.constexpr = base.vec_smem_layout()
    key_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, CHUNK, _D], tile_smem)
    scale_ring = gl.allocate_shared_memory(gl.float32, [STAGES, CHUNK], vec_smem)
    q_smem = gl.allocate_shared_memory(gl.float8e4nv, [CONSUMERS, NEXT_N_POW2 * HEADS, _D], tile_smem)
    weight_smem = gl.allocate_shared_memory(gl.float32, [CONSUMERS, NEXT_N_POW2 * HEADS], vec_smem)
    limit_smem = gl.allocate_shared_memory(gl.int32, [CONSUMERS, NEXT_N_POW2], vec_smem)
    full_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    headsum_smem = base.allocate_headsum_weights(weight_smem, NEXT_N, HEADS, ROWS_PER_MMA, CONSUMERS, ROW_SPLIT,
                                                 HEAD_SUM)
    for s in gl.static_range(STAGES):
        # one noinc arrive per producer thread, and the TMA byte count's arrive
        mbarrier.init(full_bars.index(s), count=_PRODUCER_THREADS + (KEY_BOX > 0))
        mbarrier.init(empty_bars.index(s), count=ROW_SPLIT)  # one arrive by each consumer of the tile

    item, stop, b, tile = device.balanced_share(
        lens_ptr, batch, stride_lens_b, stride_lens_j, max_model_len, max_blocks, gl.program_id(0),
        gl.num_programs(0), NEXT_N, LENS_2D, KV_BLOCK_SIZE, CHUNK, device.scan_layout(32, base.WARPS))
    # Partition arguments are spelled out per call: a tuple held in a variable would turn the
    # constexprs in it into tensors. The first consumer is the default partition (Triton gives
    # it the registers the workers leave); the others are worker warpgroups of CONSUMER_REGS.
    if CONSUMERS == 1:
        gl.warp_specialize([
        (_consumer, (q_ptr, weights_ptr, out_ptr, lens_ptr, key_ring, scale_ring, q_smem, weight_smem, limit_smem,
                     full_bars, empty_bars, item, stop, b, tile,
                     stride_q_b, stride_q_j, stride_q_h, stride_w, stride_out, stride_lens_b, stride_lens_j,
                     max_model_len, max_blocks, NEXT_N, NEXT_N_POW2, HEADS, KV_BLOCK_SIZE, CHUNK, ROWS_PER_MMA, STAGES,
                     LENS_2D, Q_ASYNC, 0, 1, ROW_SPLIT, headsum_smem, HEAD_SUM)),
        (_producer, (kv_ptr, scale_ptr, lens_ptr, table_ptr, key_desc, key_ring, scale_ring, full_bars, empty_bars,
                     item, stop, b, tile, stride_block, stride_lens_b, stride_lens_j, stride_table,
                     max_model_len, max_blocks, num_blocks,
                     NEXT_N, KV_BLOCK_SIZE, CHUNK, STAGES, PRESHUFFLE, LENS_2D, KV_ALIGN, KEY_BOX)),
        ], [_PRODUCER_WARPS], [PRODUCER_REGS])
    elif CONSUMERS == 2:
        gl.warp_specialize([
        (_consumer, (q_ptr, weights_ptr, out_ptr, lens_ptr, key_ring, scale_ring, q_smem, weight_smem, limit_smem,
                     full_bars, empty_bars, item, stop, b, tile,
                     stride_q_b, stride_q_j, stride_q_h, stride_w, stride_out, stride_lens_b, stride_lens_j,
                     max_model_len, max_blocks, NEXT_N, NEXT_N_POW2, HEADS, KV_BLOCK_SIZE, CHUNK, ROWS_PER_MMA, STAGES,
                     LENS_2D, Q_ASYNC, 0, 2, ROW_SPLIT, headsum_smem, HEAD_SUM)),
        (_consumer, (q_ptr, weights_ptr, out_ptr, lens_ptr, key_ring, scale_ring, q_smem, weight_smem, limit_smem,
                     full_bars, empty_bars, item, stop, b, tile,
                     stride_q_b, stride_q_j, stride_q_h, stride_w, stride_out, stride_lens_b, stride_lens_j,
                     max_model_len, max_blocks, NEXT_N, NEXT_N_POW2, HEADS, KV_BLOCK_SIZE, CHUNK, ROWS_PER_MMA, STAGES,
                     LENS_2D, Q_ASYNC, 1, 2, ROW_SPLIT, headsum_smem, HEAD_SUM)),
        (_producer, (kv_ptr, scale_ptr, lens_ptr, table_ptr, key_desc, key_ring, scale_ring, full_bars, empty_bars,
                     item, stop, b, tile, stride_block, stride_lens_b, stride_lens_j, stride_table,
                     max_model_len, max_blocks, num_blocks,
                     NEXT_N, KV_BLOCK_SIZE, CHUNK, STAGES, PRESHUFFLE, LENS_2D, KV_ALIGN, KEY_BOX)),
        ], [_CONSUMER_WARPS, _PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])
    elif CONSUMERS == 3:
        gl.warp_specialize([
        (_consumer, (q_ptr, weights_ptr, out_ptr, lens_ptr, key_ring, scale_ring, q_smem, weight_smem, limit_smem,
                     full_bars, empty_bars, item, stop, b, tile,
                     stride_q_b, stride_q_j, stride_q_h, stride_w, stride_out, stride_lens_b, stride_lens_j,
                     max_model_len, max_blocks, NEXT_N, NEXT_N_POW2, HEADS, KV_BLOCK_SIZE, CHUNK, ROWS_PER_MMA, STAGES,
                     LENS_2D, Q_ASYNC, 0, 3, ROW_SPLIT, headsum_smem, HEAD_SUM)),
        (_consumer, (q_ptr, weights_ptr, out_ptr, lens_ptr, key_ring, scale_ring, q_smem, weight_smem, limit_smem,
                     full_bars, empty_bars, item, stop, b, tile,
                     stride_q_b, stride_q_j, stride_q_h, stride_w, stride_out, stride_lens_b, stride_lens_j,
                     max_model_len, max_blocks, NEXT_N, NEXT_N_POW2, HEADS, KV_BLOCK_SIZE, CHUNK, ROWS_PER_MMA, STAGES,
                     LENS_2D, Q_ASYNC, 1, 3, ROW_SPLIT, headsum_smem, HEAD_SUM)),
        (_consumer, (q_ptr, weights_ptr, out_ptr, lens_ptr, key_ring, scale_ring, q_smem, weight_smem, limit_smem,
                     full_bars, empty_bars, item, stop, b, tile,
                     stride_q_b, stride_q_j, stride_q_h, stride_w, stride_out, stride_lens_b, stride_lens_j,
                     max_model_len, max_blocks, NEXT_N, NEXT_N_POW2, HEADS, KV_BLOCK_SIZE, CHUNK, ROWS_PER_MMA, STAGES,
                     LENS_2D, Q_ASYNC, 2, 3, ROW_SPLIT, headsum_smem, HEAD_SUM)),
        (_producer, (kv_ptr, scale_ptr, lens_ptr, table_ptr, key_desc, key_ring, scale_ring, full_bars, empty_bars,
                     item, stop, b, tile, stride_block, stride_lens_b, stride_lens_j, stride_table,
                     max_model_len, max_blocks, num_blocks,
                     NEXT_N, KV_BLOCK_SIZE, CHUNK, STAGES, PRESHUFFLE, LENS_2D, KV_ALIGN, KEY_BOX)),
        ], [_CONSUMER_WARPS, _CONSUMER_WARPS, _PRODUCER_WARPS], [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([
        (_consumer, (q_ptr, weights_ptr, out_ptr, lens_ptr, key_ring, scale_ring, q_smem, weight_smem, limit_smem,
                     full_bars, empty_bars, item, stop, b, tile,
                     stride_q_b, stride_q_j, stride_q_h, stride_w, stride_out, stride_lens_b, stride_lens_j,
                     max_model_len, max_blocks, NEXT_N, NEXT_N_POW2, HEADS, KV_BLOCK_SIZE, CHUNK, ROWS_PER_MMA, STAGES,
                     LENS_2D, Q_ASYNC, 0, 4, ROW_SPLIT, headsum_smem, HEAD_SUM)),
        (_consumer, (q_ptr, weights_ptr, out_ptr, lens_ptr, key_ring, scale_ring, q_smem, weight_smem, limit_smem,
                     full_bars, empty_bars, item, stop, b, tile,
                     stride_q_b, stride_q_j, stride_q_h, stride_w, stride_out, stride_lens_b, stride_lens_j,
                     max_model_len, max_blocks, NEXT_N, NEXT_N_POW2, HEADS, KV_BLOCK_SIZE, CHUNK, ROWS_PER_MMA, STAGES,
                     LENS_2D, Q_ASYNC, 1, 4, ROW_SPLIT, headsum_smem, HEAD_SUM)),
        (_consumer, (q_ptr, weights_ptr, out_ptr, lens_ptr, key_ring, scale_ring, q_smem, weight_smem, limit_smem,
                     full_bars, empty_bars, item, stop, b, tile,
                     stride_q_b, stride_q_j, stride_q_h, stride_w, stride_out, stride_lens_b, stride_lens_j,
                     max_model_len, max_blocks, NEXT_N, NEXT_N_POW2, HEADS, KV_BLOCK_SIZE, CHUNK, ROWS_PER_MMA, STAGES,
                     LENS_2D, Q_ASYNC, 2, 4, ROW_SPLIT, headsum_smem, HEAD_SUM)),
        (_consumer, (q_ptr, weights_ptr, out_ptr, lens_ptr, key_ring, scale_ring, q_smem, weight_smem, limit_smem,
                     full_bars, empty_bars, item, stop, b, tile,
                     stride_q_b, stride_q_j, stride_q_h, stride_w, stride_out, stride_lens_b, stride_lens_j,
                     max_model_len, max_blocks, NEXT_N, NEXT_N_POW2, HEADS, KV_BLOCK_SIZE, CHUNK, ROWS_PER_MMA, STAGES,
                     LENS_2D, Q_ASYNC, 3, 4, ROW_SPLIT, headsum_smem, HEAD_SUM)),
        (_producer, (kv_ptr, scale_ptr, lens_ptr, table_ptr, key_desc, key_ring, scale_ring, full_bars, empty_bars,
                     item, stop, b, tile, stride_block, stride_lens_b, stride_lens_j, stride_table,
                     max_model_len, max_blocks, num_blocks,
                     NEXT_N, KV_BLOCK_SIZE, CHUNK, STAGES, PRESHUFFLE, LENS_2D, KV_ALIGN, KEY_BOX)),
        ], [_CONSUMER_WARPS, _CONSUMER_WARPS, _CONSUMER_WARPS, _PRODUCER_WARPS],
           [CONSUMER_REGS, CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])
