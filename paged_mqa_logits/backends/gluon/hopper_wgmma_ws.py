"""sm_90 warp-specialised variant of the ``gluon`` backend: the wgmma kernel with its copies
moved to a producer warpgroup.

Why: in ``hopper_wgmma`` one warpgroup does everything for a tile in order: wait for its keys,
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
  not need) waits on *full*, runs the wgmmas and the epilogue exactly as ``hopper_wgmma``
  does (the same device helpers), then arrives on the slot's *empty* mbarrier. It reloads
  Q, the weights and the row limits at each sequence boundary of its share;
* no CTA-wide barrier per tile: the partitions meet only at the mbarriers, and
  ``CtasPerSM`` programs per SM interleave their consumers' wgmmas and epilogues;
* ``KeyCopy=tma``: the producer moves each tile's keys with one TMA box per cache block
  (a descriptor over ``[num_blocks, KV_BLOCK, 128]`` with the cache's block stride) instead
  of ``ChunkK * 8`` cp.async gathers with their address math, for caches whose base and
  block stride are 16-byte aligned and whose keys are not preshuffled (any other call of the
  config gathers). The scales still arrive by cp.async; the full barrier counts the producer
  threads' arrivals plus the TMA byte count's;
* ``Consumers`` 2 or 3: that many consumer warpgroups take the program's tiles in turn
  (tile ``k`` goes to consumer ``k % Consumers``), each with its own copy of Q, the weights
  and the row limits, all fed by the one producer. The register file then holds one producer
  per program instead of one per consumer: three consumers in one program get 152 registers
  each, three single-consumer programs 104, which is what the 128-column row groups of
  64 heads x next_n 2 need to overlap three epilogues without spilling.

Only the balanced schedule (``schedule.py``): the producer and the consumers walk the same
share, computed once before the partitions fork. Register split: ``maxnreg`` is set so that
``CtasPerSM`` programs of ``4 * (Consumers + 1)`` warps fill the register file; the producer
gets :data:`PRODUCER_REGS`, the consumers the rest in equal parts (``setmaxnreg``, emitted by
Triton).

Semantics, knobs and the row-group and tile-halving epilogues are ``hopper_wgmma``'s
(``ChunkK``, ``RowsPerMMA``, ``num_stages``, ``CtasPerSM``; plus ``Consumers``); see its docstring.
"""

from __future__ import annotations

import sys

import torch

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from ...arch import lds_limit
from ...problem import LaunchArgs, Problem
from ...schedule import persistent_programs
from ...triton_internals.gluon_api import TensorDescriptor, async_copy, fence_async_shared, thread_barrier, tma
from . import common, device
from . import hopper_wgmma as base
from .common import DYNAMIC_PARAMS

NUM_WARPS = base.NUM_WARPS  # the consumer warpgroup (the kernel's default partition)
PRODUCER_WARPS = 4  # the copy layouts of hopper_wgmma cover one warpgroup
#: producer registers per thread: tile addresses, the prefetched block ids, loop state
PRODUCER_REGS = {64: 56, 128: 88}
SM_REGISTERS = base.SM_REGISTERS
SM_SHARED_BYTES = base.SM_SHARED_BYTES
_D = gl.constexpr(base.HEAD_DIM)
_PRODUCER_WARPS = gl.constexpr(PRODUCER_WARPS)
_PRODUCER_THREADS = gl.constexpr(PRODUCER_WARPS * 32)
_CONSUMER_WARPS = gl.constexpr(NUM_WARPS)


# ----------------------------------------------------------------------------- partitions
@gluon.jit
def _issue_keys_tma(key_desc, key_dst, full_bar, table_row, tile, end, num_blocks, CHUNK: gl.constexpr,
                    KV_BLOCK: gl.constexpr, KEY_BOX: gl.constexpr):
    """The keys of ``tile`` into one ring slot by TMA, one ``KEY_BOX x 128``-byte box per cache
    block part: one thread issues what the cp.async gather spreads over a warpgroup as
    ``CHUNK * 8`` 16-byte copies with their address math. Block ids are clamped into the cache
    like the gather's (the documented invalid-id rule); a box past ``end`` reloads the tile's
    first block, whose rows past ``end`` are never stored either."""
    mbarrier.expect(full_bar, CHUNK * _D)
    first_token = tile * CHUNK
    first_block = gl.maximum(gl.minimum(gl.load(table_row + first_token // KV_BLOCK), num_blocks - 1), 0)
    for part in gl.static_range(CHUNK // KEY_BOX):
        token = first_token + part * KEY_BOX
        block = first_block
        if part * KEY_BOX >= KV_BLOCK:  # a later cache block of the same tile
            block = gl.load(table_row + token // KV_BLOCK, mask=token < end, other=first_block)
            block = gl.maximum(gl.minimum(block, num_blocks - 1), 0)
        # a [1, KEY_BOX, 128] view of the slot rows (reshape, then slice: Triton reshapes no subslice)
        box = key_dst.reshape([1, CHUNK, _D]).slice(part * KEY_BOX, KEY_BOX, dim=1)
        tma.async_copy_global_to_shared(key_desc, [block, token % KV_BLOCK, 0], full_bar, box)


@gluon.jit
def _producer(kv_ptr, scale_ptr, lens_ptr, table_ptr, key_desc, key_ring, scale_ring, full_bars, empty_bars,
              item, stop, b, tile, stride_block, stride_lens_b, stride_lens_j, stride_table,
              max_model_len, max_blocks, num_blocks,
              NEXT_N: gl.constexpr, KV_BLOCK: gl.constexpr, CHUNK: gl.constexpr, STAGES: gl.constexpr,
              PRESHUFFLE: gl.constexpr, LENS_2D: gl.constexpr, KV_ALIGN: gl.constexpr, KEY_BOX: gl.constexpr):
    """Fill ring slot ``k % STAGES`` with the program's ``k``-th tile, for every tile of its share."""
    table_tokens = max_blocks * KV_BLOCK
    k = 0
    while item < stop:
        seq_len = device.sequence_length(lens_ptr, b, stride_lens_b, stride_lens_j, NEXT_N, LENS_2D)
        end = device.visible_end(seq_len, max_model_len, max_blocks, KV_BLOCK)
        count = gl.minimum(gl.cdiv(end, CHUNK) - tile, stop - item)
        table_row = table_ptr + b.to(gl.int64) * stride_table
        # The block ids of the next tile load while this one's slot is awaited and its copies
        # issued: the table lookup is a dependent global load in front of every gather.
        pages = base._tile_pages(table_row, tile, table_tokens, num_blocks, CHUNK, KV_BLOCK)
        for i in range(count):
            upcoming = base._tile_pages(table_row, tile + i + 1, table_tokens, num_blocks, CHUNK, KV_BLOCK)
            slot = k % STAGES
            mbarrier.wait(empty_bars.index(slot), ((k // STAGES) & 1) ^ 1)  # fresh barriers pass phase 1
            if KEY_BOX > 0:
                _issue_keys_tma(key_desc, key_ring.index(slot), full_bars.index(slot), table_row, tile + i, end,
                                num_blocks, CHUNK, KV_BLOCK, KEY_BOX)
                base._issue_scales(scale_ring.index(slot), scale_ptr, pages[1], tile + i, end, stride_block, CHUNK,
                                   KV_BLOCK)
            else:
                base._issue_tile(key_ring.index(slot), scale_ring.index(slot), kv_ptr, scale_ptr, pages, tile + i,
                                 end, stride_block, CHUNK, KV_BLOCK, PRESHUFFLE, KV_ALIGN)
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
    base._copy_query(q_ptr, q_smem, b, stride_q_b, stride_q_j, stride_q_h, NEXT_N, NEXT_N_POW2, HEADS, Q_ASYNC)
    if Q_ASYNC:
        async_copy.commit_group()
    weight_smem.store(base._load_weights(weights_ptr, b, stride_w, NEXT_N, NEXT_N_POW2, HEADS, vec_layout))
    limit_smem.store(base._row_limits(lens_ptr, b, seq_len, end, stride_lens_b, stride_lens_j,
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
              NEXT_N: gl.constexpr, NEXT_N_POW2: gl.constexpr, HEADS: gl.constexpr, KV_BLOCK: gl.constexpr,
              CHUNK: gl.constexpr, ROWS_PER_MMA: gl.constexpr, STAGES: gl.constexpr, LENS_2D: gl.constexpr,
              Q_ASYNC: gl.constexpr, ROLE: gl.constexpr, CONSUMERS: gl.constexpr):
    """Score the program's tiles ``k`` with ``k % CONSUMERS == ROLE`` (ring slot ``k % STAGES``)
    against their sequences' rows, with this consumer's own copy of Q, weights and limits."""
    q_mine = q_smem.index(ROLE)
    weight_mine = weight_smem.index(ROLE)
    limit_mine = limit_smem.index(ROLE)
    k = 0  # the program's tiles before this sequence's first, every consumer's
    while item < stop:
        seq_len = device.sequence_length(lens_ptr, b, stride_lens_b, stride_lens_j, NEXT_N, LENS_2D)
        end = device.visible_end(seq_len, max_model_len, max_blocks, KV_BLOCK)
        count = gl.minimum(gl.cdiv(end, CHUNK) - tile, stop - item)
        first = (ROLE - k % CONSUMERS + CONSUMERS) % CONSUMERS  # this consumer's first tile here
        if count > first:  # sequences with no tile of this consumer's (or none at all) are skipped
            _load_sequence_operands(q_ptr, weights_ptr, lens_ptr, q_mine, weight_mine, limit_mine, b, seq_len, end,
                                    stride_q_b, stride_q_j, stride_q_h, stride_w, stride_lens_b, stride_lens_j,
                                    NEXT_N, NEXT_N_POW2, HEADS, LENS_2D, Q_ASYNC)
            weight_regs = base._single_group_weights(weight_mine, NEXT_N, HEADS, ROWS_PER_MMA)
            for i in range(first, count, CONSUMERS):
                slot = (k + i) % STAGES
                mbarrier.wait(full_bars.index(slot), ((k + i) // STAGES) & 1)
                fence_async_shared()  # the producer's cp.async bytes, seen by wgmma's async proxy
                base._score_tile(key_ring.index(slot), q_mine, scale_ring.index(slot), weight_regs, weight_mine,
                                 limit_mine, out_ptr, b, tile + i, stride_out, NEXT_N, HEADS, CHUNK, ROWS_PER_MMA)
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
    key_desc,  # TMA descriptor of the keys, [num_blocks, KV_BLOCK, 128] (KEY_BOX > 0), else None
    NEXT_N: gl.constexpr, NEXT_N_POW2: gl.constexpr, HEADS: gl.constexpr, KV_BLOCK: gl.constexpr,
    CHUNK: gl.constexpr, ROWS_PER_MMA: gl.constexpr, STAGES: gl.constexpr,
    PRESHUFFLE: gl.constexpr, LENS_2D: gl.constexpr, KV_ALIGN: gl.constexpr, Q_ASYNC: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, CONSUMERS: gl.constexpr, CONSUMER_REGS: gl.constexpr, KEY_BOX: gl.constexpr,
):
    """Program ``p`` of the persistent grid scores its equal share of the batch's tiles
    (``schedule.py``): a producer warpgroup streams the tiles through the ring, the consumer
    warpgroup scores them (see the module docstring). ``num_splits`` is unused (1)."""
    tile_smem: gl.constexpr = base._tile_smem_layout()
    vec_smem: gl.constexpr = base._vec_smem_layout()
    key_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, CHUNK, _D], tile_smem)
    scale_ring = gl.allocate_shared_memory(gl.float32, [STAGES, CHUNK], vec_smem)
    q_smem = gl.allocate_shared_memory(gl.float8e4nv, [CONSUMERS, NEXT_N_POW2 * HEADS, _D], tile_smem)
    weight_smem = gl.allocate_shared_memory(gl.float32, [CONSUMERS, NEXT_N_POW2 * HEADS], vec_smem)
    limit_smem = gl.allocate_shared_memory(gl.int32, [CONSUMERS, NEXT_N_POW2], vec_smem)
    full_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        # one noinc arrive per producer thread, and the TMA byte count's arrive
        mbarrier.init(full_bars.index(s), count=_PRODUCER_THREADS + (KEY_BOX > 0))
        mbarrier.init(empty_bars.index(s), count=1)  # one arrive by the consumer

    item, stop, b, tile = device.balanced_share(
        lens_ptr, batch, stride_lens_b, stride_lens_j, max_model_len, max_blocks, gl.program_id(0),
        gl.num_programs(0), NEXT_N, LENS_2D, KV_BLOCK, CHUNK, device.scan_layout(32, base._WARPS))
    # Partition arguments are spelled out per call: a tuple held in a variable would turn the
    # constexprs in it into tensors. The first consumer is the default partition (Triton gives
    # it the registers the workers leave); the others are worker warpgroups of CONSUMER_REGS.
    if CONSUMERS == 1:
        gl.warp_specialize([
        (_consumer, (q_ptr, weights_ptr, out_ptr, lens_ptr, key_ring, scale_ring, q_smem, weight_smem, limit_smem,
                     full_bars, empty_bars, item, stop, b, tile,
                     stride_q_b, stride_q_j, stride_q_h, stride_w, stride_out, stride_lens_b, stride_lens_j,
                     max_model_len, max_blocks, NEXT_N, NEXT_N_POW2, HEADS, KV_BLOCK, CHUNK, ROWS_PER_MMA, STAGES,
                     LENS_2D, Q_ASYNC, 0, 1)),
        (_producer, (kv_ptr, scale_ptr, lens_ptr, table_ptr, key_desc, key_ring, scale_ring, full_bars, empty_bars,
                     item, stop, b, tile, stride_block, stride_lens_b, stride_lens_j, stride_table,
                     max_model_len, max_blocks, num_blocks,
                     NEXT_N, KV_BLOCK, CHUNK, STAGES, PRESHUFFLE, LENS_2D, KV_ALIGN, KEY_BOX)),
        ], [_PRODUCER_WARPS], [PRODUCER_REGS])
    elif CONSUMERS == 2:
        gl.warp_specialize([
        (_consumer, (q_ptr, weights_ptr, out_ptr, lens_ptr, key_ring, scale_ring, q_smem, weight_smem, limit_smem,
                     full_bars, empty_bars, item, stop, b, tile,
                     stride_q_b, stride_q_j, stride_q_h, stride_w, stride_out, stride_lens_b, stride_lens_j,
                     max_model_len, max_blocks, NEXT_N, NEXT_N_POW2, HEADS, KV_BLOCK, CHUNK, ROWS_PER_MMA, STAGES,
                     LENS_2D, Q_ASYNC, 0, 2)),
        (_consumer, (q_ptr, weights_ptr, out_ptr, lens_ptr, key_ring, scale_ring, q_smem, weight_smem, limit_smem,
                     full_bars, empty_bars, item, stop, b, tile,
                     stride_q_b, stride_q_j, stride_q_h, stride_w, stride_out, stride_lens_b, stride_lens_j,
                     max_model_len, max_blocks, NEXT_N, NEXT_N_POW2, HEADS, KV_BLOCK, CHUNK, ROWS_PER_MMA, STAGES,
                     LENS_2D, Q_ASYNC, 1, 2)),
        (_producer, (kv_ptr, scale_ptr, lens_ptr, table_ptr, key_desc, key_ring, scale_ring, full_bars, empty_bars,
                     item, stop, b, tile, stride_block, stride_lens_b, stride_lens_j, stride_table,
                     max_model_len, max_blocks, num_blocks,
                     NEXT_N, KV_BLOCK, CHUNK, STAGES, PRESHUFFLE, LENS_2D, KV_ALIGN, KEY_BOX)),
        ], [_CONSUMER_WARPS, _PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([
        (_consumer, (q_ptr, weights_ptr, out_ptr, lens_ptr, key_ring, scale_ring, q_smem, weight_smem, limit_smem,
                     full_bars, empty_bars, item, stop, b, tile,
                     stride_q_b, stride_q_j, stride_q_h, stride_w, stride_out, stride_lens_b, stride_lens_j,
                     max_model_len, max_blocks, NEXT_N, NEXT_N_POW2, HEADS, KV_BLOCK, CHUNK, ROWS_PER_MMA, STAGES,
                     LENS_2D, Q_ASYNC, 0, 3)),
        (_consumer, (q_ptr, weights_ptr, out_ptr, lens_ptr, key_ring, scale_ring, q_smem, weight_smem, limit_smem,
                     full_bars, empty_bars, item, stop, b, tile,
                     stride_q_b, stride_q_j, stride_q_h, stride_w, stride_out, stride_lens_b, stride_lens_j,
                     max_model_len, max_blocks, NEXT_N, NEXT_N_POW2, HEADS, KV_BLOCK, CHUNK, ROWS_PER_MMA, STAGES,
                     LENS_2D, Q_ASYNC, 1, 3)),
        (_consumer, (q_ptr, weights_ptr, out_ptr, lens_ptr, key_ring, scale_ring, q_smem, weight_smem, limit_smem,
                     full_bars, empty_bars, item, stop, b, tile,
                     stride_q_b, stride_q_j, stride_q_h, stride_w, stride_out, stride_lens_b, stride_lens_j,
                     max_model_len, max_blocks, NEXT_N, NEXT_N_POW2, HEADS, KV_BLOCK, CHUNK, ROWS_PER_MMA, STAGES,
                     LENS_2D, Q_ASYNC, 2, 3)),
        (_producer, (kv_ptr, scale_ptr, lens_ptr, table_ptr, key_desc, key_ring, scale_ring, full_bars, empty_bars,
                     item, stop, b, tile, stride_block, stride_lens_b, stride_lens_j, stride_table,
                     max_model_len, max_blocks, num_blocks,
                     NEXT_N, KV_BLOCK, CHUNK, STAGES, PRESHUFFLE, LENS_2D, KV_ALIGN, KEY_BOX)),
        ], [_CONSUMER_WARPS, _CONSUMER_WARPS, _PRODUCER_WARPS], [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])


# ============================================================================= host side
def max_registers(ctas: int, consumers: int = 1) -> int:
    """``maxnreg`` for ``ctas`` programs of ``consumers`` consumer warpgroups and one producer
    warpgroup per SM (a multiple of 8)."""
    threads = (consumers * NUM_WARPS + PRODUCER_WARPS) * 32
    return min(256, SM_REGISTERS // (ctas * threads) // 8 * 8)


def consumer_registers(chunk: int, ctas: int, consumers: int = 1) -> int:
    """What ``setmaxnreg`` gives each consumer warpgroup: the program's registers less the
    producer's, shared equally (a multiple of 8, at most 256)."""
    pool = (consumers + 1) * max_registers(ctas, consumers) - PRODUCER_REGS[chunk]
    return min(256, pool // consumers // 8 * 8)


def shared_bytes(problem: Problem, chunk: int, stages: int, consumers: int) -> int:
    """The ring, one Q/weights/limits set per consumer, a full and an empty mbarrier per slot."""
    pow2 = base.triton_next_pow2(problem.next_n)
    per_consumer = pow2 * problem.heads * (base.HEAD_DIM + 4) + 4 * pow2  # Q and weights rows, limits
    ring = stages * chunk * (base.HEAD_DIM + 4)
    return ring + consumers * per_consumer + 2 * 8 * stages


def fits(problem: Problem, chunk: int, rows: int, stages: int, ctas: int, consumers: int = 1) -> bool:
    """The consumers' accumulators and epilogues fit their registers (``hopper_wgmma``'s
    estimate; at most two row groups: with more, ptxas spills within a consumer's share; a
    consumer under 128 registers holds 64-token tiles of at most 64 columns only, ptxas) and
    ``ctas`` programs' shared memory fits an SM."""
    r = base.resources(problem, chunk, rows, stages)
    smem = shared_bytes(problem, chunk, stages, consumers)
    groups = base.row_groups(problem.next_n, min(rows, base._pow2_floor(problem.next_n)))
    regs = consumer_registers(chunk, ctas, consumers)
    if regs < 128 and (chunk != 64 or max(n for _, n in groups) * problem.heads > 64):
        return False
    return (len(groups) <= 2 and r["acc_regs"] <= r["acc_budget"] and (regs < 128 or r["regs_estimate"] <= regs)
            and smem <= lds_limit("sm_90") and ctas * (smem + 1024) <= SM_SHARED_BYTES)


def key_box(problem: Problem, key_copy: str, chunk: int, kv_align: int) -> int:
    """Tokens per TMA box of the keys (``KeyCopy=tma``), 0 for the cp.async gather: TMA needs
    a 16-byte aligned cache base and block stride and token-major keys (not preshuffled), and
    a box of at least one 8-row swizzle atom."""
    if key_copy != "tma" or problem.preshuffle or kv_align != 16 or problem.kv_block_size < 8:
        return 0
    return min(problem.kv_block_size, chunk)


#: the shared layout of one key box, ``[1, KEY_BOX, 128]`` fp8: the ring slot's 128-byte swizzle
KEY_BOX_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=3)


def key_descriptor(kv_cache, box: int):
    """A TMA descriptor over the keys of ``kv_cache`` (``[num_blocks, KV_BLOCK, 1, D + 4]``
    uint8): ``[num_blocks, KV_BLOCK, D]`` fp8 with the cache's block stride, boxes of
    ``[1, box, D]`` (zero-filled past the cache: no box reads outside it)."""
    num_blocks, kv_block = kv_cache.shape[0], kv_cache.shape[1]
    keys = kv_cache.view(torch.float8_e4m3fn)
    shape, strides = [num_blocks, kv_block, base.HEAD_DIM], [kv_cache.stride(0), base.HEAD_DIM, 1]
    view = torch.as_strided(keys, shape, strides, keys.storage_offset())
    return TensorDescriptor(view, shape, strides, [1, box, base.HEAD_DIM], KEY_BOX_LAYOUT)


#: ring depths of the multi-consumer programs: one program per SM keeps every tile in flight
MULTI_CONSUMER_STAGES = {64: 8, 128: 4}


class WgmmaWsVariant(base.WgmmaVariant):
    """``wgmma``'s knobs less ``SplitKV`` (balanced only), 1-3 programs per SM, 1-3 consumer
    warpgroups per program, keys by cp.async gather or TMA; its kernel."""

    name = "wgmma_ws"
    knob_space = {"ChunkK": (64, 128), "RowsPerMMA": (1, 2, 4, 8), "num_stages": range(2, 9),
                  "CtasPerSM": (1, 2, 3), "Consumers": (1, 2, 3), "KeyCopy": ("gather", "tma"),
                  "num_warps": (NUM_WARPS,), "Schedule": (common.BALANCED,)}
    kernel = wgmma_ws_logits_kernel

    def knobs(self, problem: Problem, config: dict) -> dict:
        """Unset knobs take the default config's values (``Consumers`` 1, ``KeyCopy`` gather)."""
        tile, default = self.tile_knobs(problem, config,
                                        default_keys=("ChunkK", "RowsPerMMA", "num_stages", "CtasPerSM"))
        ctas = int(config.get("CtasPerSM") or default["CtasPerSM"])
        self.require_in("CtasPerSM", ctas, self.knob_space["CtasPerSM"])
        consumers = int(config.get("Consumers") or 1)
        self.require_in("Consumers", consumers, self.knob_space["Consumers"])
        key_copy = config.get("KeyCopy") or "gather"
        self.require_in("KeyCopy", key_copy, self.knob_space["KeyCopy"])
        self.require(not (key_copy == "tma" and consumers == 3), "KeyCopy", key_copy,
                     "gather with Consumers=3 (TMA with three consumers faulted on the H200, see docs/PERF_NOTES.md)")
        schedule = config.get("Schedule") or common.BALANCED
        self.require(schedule == common.BALANCED, "Schedule", schedule,
                     f"{common.BALANCED} (the warp-specialised kernel runs the balanced schedule only)")
        return {**tile, "CtasPerSM": ctas, "Consumers": consumers, "KeyCopy": key_copy, "num_warps": NUM_WARPS,
                "Schedule": schedule}

    def admits(self, problem: Problem, config: dict) -> bool:
        k = self.knobs(problem, config)
        return fits(problem, k["ChunkK"], k["RowsPerMMA"], k["num_stages"], k["CtasPerSM"], k["Consumers"])

    def shape_reason(self, problem: Problem) -> str | None:
        reason = super().shape_reason(problem)
        if reason is None and not self.candidates(problem):
            reason = f"no warp-specialised configuration fits sm_90's registers and shared memory for " \
                     f"{problem.describe()}"
        return reason

    @staticmethod
    def _setting(chunk: int, rows: int, stages: int, ctas: int, consumers: int = 1, key_copy: str = "gather") -> dict:
        return {"ChunkK": chunk, "RowsPerMMA": rows, "num_stages": stages, "CtasPerSM": ctas, "Consumers": consumers,
                "KeyCopy": key_copy, "num_warps": NUM_WARPS, "Schedule": common.BALANCED}

    def candidate_groups(self, problem: Problem):
        """Per row grouping (the two widest that fit): ChunkK 64/128 x a shallow and a deep ring at
        two programs per SM (one program of one consumer leaves the tensor cores idle during its
        epilogue); three programs per SM where the consumer fits 104 registers; and one program
        per SM with two or three consumer warpgroups sharing its producer and ring, which leaves
        each consumer more registers than as many single-consumer programs would (152 against
        104 for three). Where the cache allows TMA (see :func:`key_box`), each of one or two
        consumers again with ``KeyCopy=tma``: one producer thread then moves a tile that the
        gather spreads over a warpgroup, which is what lets one producer feed two consumers."""
        settings, groupings = [], 0
        for rows in base._rows_options(problem):
            fitting = [(chunk, stages) for chunk in (64, 128) for stages in base._stages_for(chunk)
                       if fits(problem, chunk, rows, stages, 2)]
            settings += [self._setting(chunk, rows, stages, 2) for chunk, stages in fitting]
            settings += [self._setting(64, rows, stages, 3) for stages in base._stages_for(64)]
            settings += [self._setting(chunk, rows, stages, 1, consumers) for consumers in (2, 3)
                         for chunk, stages in MULTI_CONSUMER_STAGES.items()]
            groupings += bool(fitting)
            if groupings == 2:
                break
        for setting in settings:
            yield [setting]
        if key_box(problem, "tma", 64, 16 if problem.kv_aligned16 else 4):
            for setting in settings:
                if setting["Consumers"] < 3:
                    yield [dict(setting, KeyCopy="tma")]

    def default_config(self, problem: Problem) -> dict:
        """The widest row grouping that fits two programs per SM, 64-token tiles, the deep ring."""
        for rows in base._rows_options(problem):
            for chunk in (64, 128):
                for stages in reversed(base._stages_for(chunk)):
                    for ctas in (2, 1):
                        if fits(problem, chunk, rows, stages, ctas):
                            return {"variant": self.name, **self._setting(chunk, rows, stages, ctas)}
        raise ValueError(f"{self.owner}: no configuration fits {problem.describe()}")

    def constexprs(self, problem: Problem, config: dict) -> dict:
        k = self.knobs(problem, config)
        return dict(NEXT_N=problem.next_n, NEXT_N_POW2=base.triton_next_pow2(problem.next_n), HEADS=problem.heads,
                    KV_BLOCK=problem.kv_block_size, CHUNK=k["ChunkK"],
                    ROWS_PER_MMA=min(k["RowsPerMMA"], base._pow2_floor(problem.next_n)), STAGES=k["num_stages"],
                    PRESHUFFLE=problem.preshuffle, LENS_2D=problem.lens_2d, PRODUCER_REGS=PRODUCER_REGS[k["ChunkK"]],
                    CONSUMERS=k["Consumers"], CONSUMER_REGS=consumer_registers(k["ChunkK"], k["CtasPerSM"],
                                                                               k["Consumers"]))

    def options(self, problem: Problem, config: dict) -> dict:
        k = self.knobs(problem, config)
        return {"num_warps": NUM_WARPS, "maxnreg": max_registers(k["CtasPerSM"], k["Consumers"])}

    def grid(self, problem: Problem, config: dict, compiled=None) -> tuple[int, int]:
        """One persistent wave: ``CtasPerSM`` programs per SM (registers and shared memory are sized
        for exactly that many, see :func:`max_registers` and :func:`fits`)."""
        ctas = self.knobs(problem, config)["CtasPerSM"]
        return persistent_programs(problem.cu_num or base.SM_COUNT_H100, ctas), 1

    def plan(self, args: LaunchArgs, config: dict) -> tuple[tuple, int, dict]:
        p = args.problem
        return self.grid(p, config), 1, {**self.constexprs(p, config), **self.options(p, config)}

    def call_parts(self, args: LaunchArgs, config: dict) -> tuple[tuple, dict]:
        """The key descriptor (or ``None``) after the common arguments, the alignment and
        ``KEY_BOX`` constexprs: whether a ``KeyCopy=tma`` config moves keys by TMA depends on
        each call's cache address and stride."""
        aligned = self.call_constexprs(args)
        k = self.knobs(args.problem, config)
        box = key_box(args.problem, k["KeyCopy"], k["ChunkK"], aligned["KV_ALIGN"]) if args.num_blocks > 0 else 0
        return (key_descriptor(args.kv_cache, box) if box else None,), {**aligned, "KEY_BOX": box}

    def spec_arguments(self, problem: Problem, cfg: dict) -> tuple[tuple, dict, dict]:
        """``wgmma``'s typical call, plus the key descriptor over a small host cache of the
        typical block layout where the config moves keys by TMA."""
        runtime, consts, path = super().spec_arguments(problem, cfg)
        k = self.knobs(problem, cfg)
        box = key_box(problem, k["KeyCopy"], k["ChunkK"], consts["KV_ALIGN"])
        cache = torch.empty((2, problem.kv_block_size, 1, base.HEAD_DIM + 4), dtype=torch.uint8)
        return runtime + (key_descriptor(cache, box) if box else None,), {**consts, "KEY_BOX": box}, path

    def kernel_key(self, problem: Problem, cfg: dict) -> tuple:
        k = self.knobs(problem, cfg)
        return tuple(sorted(self.constexprs(problem, cfg).items())), k["CtasPerSM"], k["KeyCopy"]

    def matrix_candidates(self, problem: Problem) -> list[dict]:
        return self.candidates(problem)


VARIANT = WgmmaWsVariant()
