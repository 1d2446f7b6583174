"""sm_90 kernel of the ``wgmma_fp4_pipes`` variant: the ``wgmma_pipes`` consumers, unchanged,
fed MXFP4 keys by producer warpgroups that widen them to e4m3 into the pipes' shared-memory ring.

Why: ``hopper_fp4.py`` widens in the warps that also wait for the loads and run the epilogue, so
the widening, the load latency and the wgmmas take turns. Here the widening runs in its own
warps and overlaps the consumers' wgmmas and epilogues.

What a ring slot holds is exactly what the pipes consumers read (``kernels/hopper_pipes.py``):
a 64-token e4m3 key tile in the 128-byte NVMMA swizzle and one fp32 per token. The widening of
``hopper_fp4.py`` (``_load_tile``, ``_widen_words``, ``_widen_query``; exact within
``E4M3_SPREAD_LIMIT`` binades, docs/CONTRACT.md) gives exactly that: e4m3 bytes plus the token
factor ``2^(M - 133)``, which takes the place of the fp8 key scale; the query heads' factors are
folded into the weights (``w * relu(s * x) = (w * s) * relu(x)``, s > 0).

Per team (the pipes' teams of ``ROW_SPLIT`` consumer warpgroups, ``TEAMS`` rings), one producer
**warpgroup** (:data:`PRODUCER_WARPS`; the widening's layout is ``hopper_fp4``'s one-warpgroup
layout, and ``setmaxnreg`` works per warpgroup anyway) walks the same share as the consumers:

* the packed words and exponent words of its next tile are loaded into registers before the
  current tile is widened (their latency hides under the widening and the slot wait);
* it widens the tile, waits for the slot's *empty*, stores the words and factors into the slot,
  fences them for wgmma's async proxy, syncs its four warps (named barrier of the partition)
  and one thread arrives on *full* (count 1): the release arrive of the pipes' plain-load Q;
* team 0's producer widens each sequence's Q into the Q ring's stage and stores its weights
  times the head factors, one sequence ahead, the same way (``q_full`` count 1).

The consumers are ``hopper_pipes._consumer`` with ``KEY_BOX = 0`` (their fence after *full*:
harmless here). ``clean_logits``: the consumers' epilogue stores ``-inf`` where a row does not
see a position of its tiles and up to ``max_model_len``, and the producers store the columns
past each sequence's tiles with ``hopper_pipes._clean_team_tails`` (its layout sized for their warps).

The host side (knobs, register split, resources, launch plan) is ``backends/gluon/hopper_fp4_pipes.py``.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from ....triton_internals.gluon_api import fence_async_shared, reinterpret_shared, thread_barrier
from . import hopper_wgmma as wg
from .hopper_fp4 import _load_tile, _wide_smem_layout, _widen_query, _widen_words
from .hopper_pipes import (_SCALE_BOX_LAYOUT, _TAIL_UNIT, _clean_team_tails, _consumer, _program_share, _segment,
                           _team_slot)

#: the facts the host side reads
CONSUMER_WARPS = 4
PRODUCER_WARPS = 4  # hopper_fp4's widening layout spans one warpgroup
TILE = 64
HEAD_DIM = wg.HEAD_DIM
DYNAMIC_PARAMS = ("max_model_len", "max_blocks", "num_splits", "batch", "num_blocks", "clean_logits")

_D = gl.constexpr(HEAD_DIM)
_TILE = gl.constexpr(TILE)
_WORDS = gl.constexpr(HEAD_DIM // 4)  # int32 words of a widened row
_CONSUMER_WARPS = gl.constexpr(CONSUMER_WARPS)
_PRODUCER_WARPS = gl.constexpr(PRODUCER_WARPS)


@gluon.jit
def _publish(full_bar):
    """Make this partition's shared stores visible to wgmma and tell the consumers: every thread
    fences its own stores for the async proxy, the warpgroup meets, one thread arrives."""
    fence_async_shared()
    thread_barrier()
    mbarrier.arrive(full_bar, count=1)


@gluon.jit
def _widen_sequence_query(q_ptr, q_scale_ptr, weights_ptr, q_ring, weight_ring, q_full, q_empty, q_iter, b,
                          stride_q_b, stride_q_j, stride_q_h, stride_qs_b, stride_qs_j, stride_w,
                          NEXT_N: gl.constexpr, NEXT_N_POW2: gl.constexpr, HEADS: gl.constexpr):
    """Sequence ``b``'s Q, widened, and its weights times the heads' factors into Q stage ``q_iter % 2``."""
    vec_layout: gl.constexpr = gl.BlockedLayout([1], [32], [_PRODUCER_WARPS], [0])  # _widen_query's factors
    stage = q_iter % 2
    mbarrier.wait(q_empty.index(stage), ((q_iter // 2) & 1) ^ 1)  # fresh barriers pass phase 1
    q_wide = reinterpret_shared(q_ring.index(stage), gl.int32, [NEXT_N_POW2 * HEADS, _WORDS], _wide_smem_layout())
    head_factor = _widen_query(q_ptr, q_scale_ptr, q_wide, b, stride_q_b, stride_q_j, stride_q_h, stride_qs_b,
                               stride_qs_j, NEXT_N, NEXT_N_POW2, HEADS)
    weights = wg._load_weights(weights_ptr, b, stride_w, NEXT_N, NEXT_N_POW2, HEADS, vec_layout)
    weight_ring.index(stage).store(weights * head_factor)
    _publish(q_full.index(stage))


@gluon.jit
def _producer(pointers, strides, q_scale_strides, sizes, buffers, share, tail_share,
              NEXT_N: gl.constexpr, NEXT_N_POW2: gl.constexpr, HEADS: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr,
              STAGES: gl.constexpr, LENS_2D: gl.constexpr, TEAM: gl.constexpr, TEAMS: gl.constexpr):
    """Widen team ``TEAM``'s tiles of the share into its ring (team 0 also every sequence's Q),
    then store its part of the share's ``-inf`` tail when cleaning."""
    q_ptr, words_ptr, q_scale_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr = pointers
    stride_q_b, stride_q_j, stride_q_h, stride_block, stride_w, stride_out, stride_lens_b, stride_lens_j, \
        stride_table = strides
    stride_qs_b, stride_qs_j = q_scale_strides
    max_model_len, max_blocks, num_blocks, clean_logits = sizes
    key_ring, scale_ring, q_ring, weight_ring, full_bars, empty_bars, q_full, q_empty = buffers
    item, stop, b, tile = share
    k = 0  # the program's tiles before this sequence's first, every team's
    q_iter = 0  # sequences with tiles so far
    while item < stop:
        _, end, count = _segment(lens_ptr, b, tile, item, stop, stride_lens_b, stride_lens_j, max_model_len,
                                 max_blocks, NEXT_N, KV_BLOCK_SIZE, LENS_2D)
        if count > 0:
            table_row = table_ptr + b.to(gl.int64) * stride_table
            first = (TEAM - k % TEAMS + TEAMS) % TEAMS  # this team's first tile here
            # the sequence's first tile loads while team 0 widens its Q
            words, exponent_words = _load_tile(words_ptr, table_row, tile + first, wg._issue_end(first, count, end),
                                               stride_block, num_blocks, _TILE, KV_BLOCK_SIZE)
            if TEAM == 0:
                _widen_sequence_query(q_ptr, q_scale_ptr, weights_ptr, q_ring, weight_ring, q_full, q_empty, q_iter,
                                      b, stride_q_b, stride_q_j, stride_q_h, stride_qs_b, stride_qs_j, stride_w,
                                      NEXT_N, NEXT_N_POW2, HEADS)
            q_iter += 1
            for i in range(first, count, TEAMS):
                # the next tile's loads go out before this one is widened and its slot awaited
                next_words, next_exponents = _load_tile(words_ptr, table_row, tile + i + TEAMS,
                                                        wg._issue_end(i + TEAMS, count, end), stride_block,
                                                        num_blocks, _TILE, KV_BLOCK_SIZE)
                wide, factor = _widen_words(words, exponent_words, _TILE)
                slot, phase = _team_slot((k + i) // TEAMS, STAGES)
                ring_slot = TEAM * STAGES + slot
                mbarrier.wait(empty_bars.index(ring_slot), phase ^ 1)
                key_words = reinterpret_shared(key_ring.index(ring_slot), gl.int32, [_TILE, _WORDS], _wide_smem_layout())
                key_words.store(wide)
                scale_ring.index(ring_slot).reshape([_TILE]).store(factor)
                _publish(full_bars.index(ring_slot))
                words = next_words
                exponent_words = next_exponents
        k += count
        item += count
        b += 1
        tile = tile * 0
    if clean_logits != 0:
        _clean_team_tails(out_ptr, lens_ptr, tail_share, stride_out, stride_lens_b, stride_lens_j, max_model_len,
                          max_blocks, NEXT_N, KV_BLOCK_SIZE, LENS_2D, TEAM, TEAMS, _PRODUCER_WARPS)


# ----------------------------------------------------------------------------- the kernel
@gluon.jit(do_not_specialize=DYNAMIC_PARAMS)
def fp4_pipes_logits_kernel(
    q_ptr, kv_bytes_ptr, kv_words_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr,
    stride_q_b, stride_q_j, stride_q_h,
    stride_block,  # bytes between cache blocks (multiple of 4)
    stride_w, stride_out, stride_lens_b, stride_lens_j, stride_table,
    max_model_len, max_blocks, num_splits, batch, num_blocks,
    q_scale_ptr, stride_qs_b, stride_qs_j,
    clean_logits,  # 1: -inf where a row sees nothing, up to max_model_len
    NEXT_N: gl.constexpr, NEXT_N_POW2: gl.constexpr, HEADS: gl.constexpr, KV_BLOCK_SIZE: gl.constexpr,
    ROWS_PER_MMA: gl.constexpr, STAGES: gl.constexpr, LENS_2D: gl.constexpr, BALANCED: gl.constexpr,
    CONSUMERS: gl.constexpr, ROW_SPLIT: gl.constexpr, OVERLAP: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    PRODUCER_REGS: gl.constexpr,
):
    """The arguments of every Gluon kernel (``kv_bytes_ptr`` unused: the cache is read as 32-bit
    words), the query exponents, ``clean_logits``; the program's share scored by ``CONSUMERS``
    pipes consumers in teams of ``ROW_SPLIT``, one widening producer warpgroup and ring per team."""
    TEAMS: gl.constexpr = CONSUMERS // ROW_SPLIT
    tile_smem: gl.constexpr = wg._tile_smem_layout()
    key_ring = gl.allocate_shared_memory(gl.float8e4nv, [TEAMS * STAGES, _TILE, _D], tile_smem)
    scale_ring = gl.allocate_shared_memory(gl.float32, [TEAMS * STAGES, 1, _TILE], _SCALE_BOX_LAYOUT)
    q_ring = gl.allocate_shared_memory(gl.float8e4nv, [2, NEXT_N_POW2 * HEADS, _D], tile_smem)
    weight_ring = gl.allocate_shared_memory(gl.float32, [2, NEXT_N_POW2 * HEADS], wg._vec_smem_layout())
    full_bars = gl.allocate_shared_memory(gl.int64, [TEAMS * STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [TEAMS * STAGES, 1], mbarrier.MBarrierLayout())
    q_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(TEAMS * STAGES):
        mbarrier.init(full_bars.index(s), count=1)  # the producer's one release arrive (see _publish)
        mbarrier.init(empty_bars.index(s), count=32 * _CONSUMER_WARPS * ROW_SPLIT)  # every consumer thread
    for s in gl.static_range(2):
        mbarrier.init(q_full.index(s), count=1)
        mbarrier.init(q_empty.index(s), count=32 * _CONSUMER_WARPS * CONSUMERS)

    share = _program_share(lens_ptr, batch, stride_lens_b, stride_lens_j, max_model_len, max_blocks, num_splits,
                           NEXT_N, KV_BLOCK_SIZE, LENS_2D, BALANCED, 0, _CONSUMER_WARPS)
    if clean_logits != 0:
        tail_share = _program_share(lens_ptr, batch, stride_lens_b, stride_lens_j, max_model_len, max_blocks,
                                    num_splits, NEXT_N, KV_BLOCK_SIZE, LENS_2D, BALANCED, _TAIL_UNIT, _CONSUMER_WARPS)
    else:
        tail_share = share
    # the consumers read out_ptr and lens_ptr of the pipes' pointer tuple; the producer the rest
    pointers = (q_ptr, kv_words_ptr, q_scale_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr)
    strides = (stride_q_b, stride_q_j, stride_q_h, stride_block, stride_w, stride_out, stride_lens_b, stride_lens_j,
               stride_table)
    q_scale_strides = (stride_qs_b, stride_qs_j)
    sizes = (max_model_len, max_blocks, num_blocks, clean_logits)
    buffers = (key_ring, scale_ring, q_ring, weight_ring, full_bars, empty_bars, q_full, q_empty)
    # The partitions per (CONSUMERS, ROW_SPLIT), spelled out (constexprs held in a tuple variable
    # would become tensors); consumer 0 is the default partition; KEY_BOX 0: no TMA.
    if CONSUMERS == 1:
        gl.warp_specialize([
            (_consumer, (pointers, strides, sizes, buffers, share, NEXT_N, HEADS, KV_BLOCK_SIZE, ROWS_PER_MMA, STAGES,
                         LENS_2D, 0, 0, 1, 0, 1, OVERLAP)),
            (_producer, (pointers, strides, q_scale_strides, sizes, buffers, share, tail_share, NEXT_N, NEXT_N_POW2,
                         HEADS, KV_BLOCK_SIZE, STAGES, LENS_2D, 0, 1)),
        ], [_PRODUCER_WARPS], [PRODUCER_REGS])
    elif ROW_SPLIT == 1:
        gl.warp_specialize([
            (_consumer, (pointers, strides, sizes, buffers, share, NEXT_N, HEADS, KV_BLOCK_SIZE, ROWS_PER_MMA, STAGES,
                         LENS_2D, 0, 0, 2, 0, 1, OVERLAP)),
            (_consumer, (pointers, strides, sizes, buffers, share, NEXT_N, HEADS, KV_BLOCK_SIZE, ROWS_PER_MMA, STAGES,
                         LENS_2D, 0, 1, 2, 0, 1, OVERLAP)),
            (_producer, (pointers, strides, q_scale_strides, sizes, buffers, share, tail_share, NEXT_N, NEXT_N_POW2,
                         HEADS, KV_BLOCK_SIZE, STAGES, LENS_2D, 0, 2)),
            (_producer, (pointers, strides, q_scale_strides, sizes, buffers, share, tail_share, NEXT_N, NEXT_N_POW2,
                         HEADS, KV_BLOCK_SIZE, STAGES, LENS_2D, 1, 2)),
        ], [_CONSUMER_WARPS, _PRODUCER_WARPS, _PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (pointers, strides, sizes, buffers, share, NEXT_N, HEADS, KV_BLOCK_SIZE, ROWS_PER_MMA, STAGES,
                         LENS_2D, 0, 0, 1, 0, 2, OVERLAP)),
            (_consumer, (pointers, strides, sizes, buffers, share, NEXT_N, HEADS, KV_BLOCK_SIZE, ROWS_PER_MMA, STAGES,
                         LENS_2D, 0, 0, 1, 1, 2, OVERLAP)),
            (_producer, (pointers, strides, q_scale_strides, sizes, buffers, share, tail_share, NEXT_N, NEXT_N_POW2,
                         HEADS, KV_BLOCK_SIZE, STAGES, LENS_2D, 0, 1)),
        ], [_CONSUMER_WARPS, _PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])
