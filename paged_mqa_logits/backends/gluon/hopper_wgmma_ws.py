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
* no CTA-wide barrier per tile: the two partitions meet only at the mbarriers, and
  ``CtasPerSM`` programs per SM interleave their consumers' wgmmas and epilogues.

Only the balanced schedule (``schedule.py``): the producer and the consumer walk the same
share, computed once before the partitions fork. Register split: ``maxnreg`` is set so that
``CtasPerSM`` programs of 8 warps fill the register file; the producer gets
:data:`PRODUCER_REGS`, the consumer the rest (``setmaxnreg``, emitted by Triton).

Semantics, knobs and the row-group and tile-halving epilogues are ``hopper_wgmma``'s
(``ChunkK``, ``RowsPerMMA``, ``num_stages``, ``CtasPerSM``); see its docstring.
"""

from __future__ import annotations

import sys

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from ...arch import lds_limit
from ...problem import LaunchArgs, Problem
from ...schedule import persistent_programs
from ...triton_internals.gluon_api import async_copy, fence_async_shared, thread_barrier
from ..base import CompileSpec
from . import common
from . import hopper_wgmma as base

VARIANT = "wgmma_ws"
ARCHS = ("sm_90",)
KNOBS = ("ChunkK", "RowsPerMMA", "num_stages", "CtasPerSM", "num_warps", "Schedule")
KNOB_SPACE = {"ChunkK": (64, 128), "RowsPerMMA": (1, 2, 4, 8), "num_stages": range(2, 9),
              "CtasPerSM": (1, 2, 3), "num_warps": (4,), "Schedule": (common.BALANCED,)}
FP8 = base.FP8
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
def _producer(kv_ptr, scale_ptr, lens_ptr, table_ptr, key_ring, scale_ring, full_bars, empty_bars,
              item, stop, b, tile, stride_block, stride_lens_b, stride_lens_j, stride_table,
              max_model_len, max_blocks, num_blocks,
              NEXT_N: gl.constexpr, KV_BLOCK: gl.constexpr, CHUNK: gl.constexpr, STAGES: gl.constexpr,
              PRESHUFFLE: gl.constexpr, LENS_2D: gl.constexpr, KV_ALIGN: gl.constexpr):
    """Fill ring slot ``k % STAGES`` with the program's ``k``-th tile, for every tile of its share."""
    table_tokens = max_blocks * KV_BLOCK
    k = 0
    while item < stop:
        seq_len = common.sequence_length(lens_ptr, b, stride_lens_b, stride_lens_j, NEXT_N, LENS_2D)
        end = common.visible_end(seq_len, max_model_len, max_blocks, KV_BLOCK)
        count = gl.minimum(gl.cdiv(end, CHUNK) - tile, stop - item)
        table_row = table_ptr + b.to(gl.int64) * stride_table
        # The block ids of the next tile load while this one's slot is awaited and its copies
        # issued: the table lookup is a dependent global load in front of every gather.
        pages = base._tile_pages(table_row, tile, table_tokens, num_blocks, CHUNK, KV_BLOCK)
        for i in range(count):
            upcoming = base._tile_pages(table_row, tile + i + 1, table_tokens, num_blocks, CHUNK, KV_BLOCK)
            slot = k % STAGES
            mbarrier.wait(empty_bars.index(slot), ((k // STAGES) & 1) ^ 1)  # fresh barriers pass phase 1
            base._issue_tile(key_ring.index(slot), scale_ring.index(slot), kv_ptr, scale_ptr, pages, tile + i, end,
                             stride_block, CHUNK, KV_BLOCK, PRESHUFFLE, KV_ALIGN)
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
              Q_ASYNC: gl.constexpr):
    """Score ring slot ``k % STAGES`` (the program's ``k``-th tile) against its sequence's rows."""
    k = 0
    while item < stop:
        seq_len = common.sequence_length(lens_ptr, b, stride_lens_b, stride_lens_j, NEXT_N, LENS_2D)
        end = common.visible_end(seq_len, max_model_len, max_blocks, KV_BLOCK)
        count = gl.minimum(gl.cdiv(end, CHUNK) - tile, stop - item)
        if count > 0:  # zero-length sequences between long ones hold no tiles
            _load_sequence_operands(q_ptr, weights_ptr, lens_ptr, q_smem, weight_smem, limit_smem, b, seq_len, end,
                                    stride_q_b, stride_q_j, stride_q_h, stride_w, stride_lens_b, stride_lens_j,
                                    NEXT_N, NEXT_N_POW2, HEADS, LENS_2D, Q_ASYNC)
            weight_regs = base._single_group_weights(weight_smem, NEXT_N, HEADS, ROWS_PER_MMA)
            for i in range(count):
                slot = k % STAGES
                mbarrier.wait(full_bars.index(slot), (k // STAGES) & 1)
                fence_async_shared()  # the producer's cp.async bytes, seen by wgmma's async proxy
                base._score_tile(key_ring.index(slot), q_smem, scale_ring.index(slot), weight_regs, weight_smem,
                                 limit_smem, out_ptr, b, tile + i, stride_out, NEXT_N, HEADS, CHUNK, ROWS_PER_MMA)
                thread_barrier()  # every warp's wgmma and scale reads of the slot are done ...
                mbarrier.arrive(empty_bars.index(slot), count=1)  # ... before one thread frees it
                k += 1
            item += count
        b += 1
        tile = tile * 0


# ----------------------------------------------------------------------------- the kernel
@gluon.jit(do_not_specialize=common.DYNAMIC_PARAMS)
def wgmma_ws_logits_kernel(
    q_ptr, kv_ptr, scale_ptr, weights_ptr, out_ptr, lens_ptr, table_ptr,
    stride_q_b, stride_q_j, stride_q_h,
    stride_block,  # bytes between cache blocks (multiple of 4)
    stride_w, stride_out, stride_lens_b, stride_lens_j, stride_table,
    max_model_len, max_blocks, num_splits, batch, num_blocks,
    NEXT_N: gl.constexpr, NEXT_N_POW2: gl.constexpr, HEADS: gl.constexpr, KV_BLOCK: gl.constexpr,
    CHUNK: gl.constexpr, ROWS_PER_MMA: gl.constexpr, STAGES: gl.constexpr,
    PRESHUFFLE: gl.constexpr, LENS_2D: gl.constexpr, KV_ALIGN: gl.constexpr, Q_ASYNC: gl.constexpr,
    PRODUCER_REGS: gl.constexpr,
):
    """Program ``p`` of the persistent grid scores its equal share of the batch's tiles
    (``schedule.py``): a producer warpgroup streams the tiles through the ring, the consumer
    warpgroup scores them (see the module docstring). ``num_splits`` is unused (1)."""
    tile_smem: gl.constexpr = base._tile_smem_layout()
    vec_smem: gl.constexpr = base._vec_smem_layout()
    key_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, CHUNK, _D], tile_smem)
    scale_ring = gl.allocate_shared_memory(gl.float32, [STAGES, CHUNK], vec_smem)
    q_smem = gl.allocate_shared_memory(gl.float8e4nv, [NEXT_N_POW2 * HEADS, _D], tile_smem)
    weight_smem = gl.allocate_shared_memory(gl.float32, [NEXT_N_POW2 * HEADS], vec_smem)
    limit_smem = gl.allocate_shared_memory(gl.int32, [NEXT_N_POW2], vec_smem)
    full_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(full_bars.index(s), count=_PRODUCER_THREADS)  # one noinc arrive per producer thread
        mbarrier.init(empty_bars.index(s), count=1)  # one arrive by the consumer

    item, stop, b, tile = common.balanced_share(
        lens_ptr, batch, stride_lens_b, stride_lens_j, max_model_len, max_blocks, gl.program_id(0),
        gl.num_programs(0), NEXT_N, LENS_2D, KV_BLOCK, CHUNK, common.scan_layout(32, base._WARPS))
    gl.warp_specialize([
        (_consumer, (q_ptr, weights_ptr, out_ptr, lens_ptr, key_ring, scale_ring, q_smem, weight_smem, limit_smem,
                     full_bars, empty_bars, item, stop, b, tile,
                     stride_q_b, stride_q_j, stride_q_h, stride_w, stride_out, stride_lens_b, stride_lens_j,
                     max_model_len, max_blocks,
                     NEXT_N, NEXT_N_POW2, HEADS, KV_BLOCK, CHUNK, ROWS_PER_MMA, STAGES, LENS_2D, Q_ASYNC)),
        (_producer, (kv_ptr, scale_ptr, lens_ptr, table_ptr, key_ring, scale_ring, full_bars, empty_bars,
                     item, stop, b, tile, stride_block, stride_lens_b, stride_lens_j, stride_table,
                     max_model_len, max_blocks, num_blocks,
                     NEXT_N, KV_BLOCK, CHUNK, STAGES, PRESHUFFLE, LENS_2D, KV_ALIGN)),
    ], [_PRODUCER_WARPS], [PRODUCER_REGS])


# ============================================================================= host side
def _knobs(problem: Problem, config: dict) -> tuple[int, int, int, int]:
    """``(ChunkK, RowsPerMMA, num_stages, CtasPerSM)``; ``None`` takes the default."""
    default = default_config(problem) if any(config.get(k) is None for k in KNOBS[:4]) else {}
    chunk = int(config.get("ChunkK") or default["ChunkK"])
    rows = int(config.get("RowsPerMMA") or default["RowsPerMMA"])
    stages = int(config.get("num_stages") or default["num_stages"])
    ctas = int(config.get("CtasPerSM") or default["CtasPerSM"])
    warps = int(config.get("num_warps") or NUM_WARPS)
    schedule = config.get("Schedule") or common.BALANCED
    if (chunk not in KNOB_SPACE["ChunkK"] or rows < 1 or rows & (rows - 1) or rows * problem.heads > base.MAX_MMA_N
            or not 2 <= stages <= 8 or ctas not in KNOB_SPACE["CtasPerSM"] or warps != NUM_WARPS
            or schedule != common.BALANCED):
        raise ValueError(f"gluon/{VARIANT}: unsupported knobs {config} for heads={problem.heads}"
                         + (" (the warp-specialised kernel runs the balanced schedule only)"
                            if schedule != common.BALANCED else ""))
    return chunk, rows, stages, ctas


def max_registers(ctas: int) -> int:
    """``maxnreg`` for ``ctas`` programs of consumer + producer warps per SM (a multiple of 8)."""
    threads = (NUM_WARPS + PRODUCER_WARPS) * 32
    return min(256, SM_REGISTERS // (ctas * threads) // 8 * 8)


def consumer_registers(chunk: int, ctas: int) -> int:
    """What ``setmaxnreg`` leaves the consumer warpgroup: its share of the program's registers
    plus what the producer gives up (at most 256)."""
    return min(256, 2 * max_registers(ctas) - PRODUCER_REGS[chunk])


def fits(problem: Problem, chunk: int, rows: int, stages: int, ctas: int) -> bool:
    """The consumer's accumulators and epilogue fit its registers (``hopper_wgmma``'s estimate;
    at most two row groups: with more, ptxas spills within the consumer's share; three programs
    per SM leave the consumer 104 registers, enough for 64-column row groups of 64-token tiles
    only) and ``ctas`` programs' shared memory fits an SM."""
    r = base.resources(problem, chunk, rows, stages)
    smem = r["smem"] + 2 * 8 * stages  # a full and an empty mbarrier (8 bytes each) per ring slot
    groups = base.row_groups(problem.next_n, min(rows, base._pow2_floor(problem.next_n)))
    if ctas == 3 and (chunk != 64 or max(n for _, n in groups) * problem.heads > 64):
        return False  # 104 consumer registers hold 64-token tiles of at most 64 columns (ptxas)
    return (len(groups) <= 2 and r["acc_regs"] <= r["acc_budget"]
            and (ctas == 3 or r["regs_estimate"] <= consumer_registers(chunk, ctas))
            and smem <= lds_limit("sm_90") and ctas * (smem + 1024) <= SM_SHARED_BYTES)


def constexprs(problem: Problem, config: dict) -> dict:
    chunk, rows, stages, _ = _knobs(problem, config)
    return dict(NEXT_N=problem.next_n, NEXT_N_POW2=base.triton_next_pow2(problem.next_n), HEADS=problem.heads,
                KV_BLOCK=problem.kv_block_size, CHUNK=chunk,
                ROWS_PER_MMA=min(rows, base._pow2_floor(problem.next_n)), STAGES=stages,
                PRESHUFFLE=problem.preshuffle, LENS_2D=problem.lens_2d, PRODUCER_REGS=PRODUCER_REGS[chunk])


def options(problem: Problem, config: dict) -> dict:
    return {"num_warps": NUM_WARPS, "maxnreg": max_registers(_knobs(problem, config)[3])}


def grid(problem: Problem, config: dict) -> tuple[int, int]:
    """One persistent wave: ``CtasPerSM`` programs per SM (registers and shared memory are sized
    for exactly that many, see :func:`max_registers` and :func:`fits`)."""
    ctas = _knobs(problem, config)[3]
    return persistent_programs(problem.cu_num or base.SM_COUNT_H100, ctas), 1


# ----------------------------------------------------------------------------- interface
def check_config(config: dict, problem: Problem | None = None) -> str | None:
    return common.check_variant_config(sys.modules[__name__], config, problem)


def unsupported(problem: Problem) -> str | None:
    reason = base.unsupported(problem)
    if reason is not None:
        return reason
    if not candidates(problem):
        return f"no warp-specialised configuration fits sm_90's registers and shared memory for {problem.describe()}"
    return None


def candidates(problem: Problem) -> list[dict]:
    """The two widest row groupings x ChunkK 64/128 x a shallow and a deep ring, two programs
    per SM (one program leaves the tensor cores idle during its consumer's epilogue); and three
    per SM where the consumer fits 104 registers (more consumers to overlap the epilogues)."""
    out, groupings = [], 0
    for rows in base._rows_options(problem):
        fitting = [(chunk, stages) for chunk in (64, 128) for stages in base._stages_for(chunk)
                   if fits(problem, chunk, rows, stages, 2)]
        out += [{"variant": VARIANT, "ChunkK": chunk, "RowsPerMMA": rows, "num_stages": stages, "CtasPerSM": 2,
                 "num_warps": NUM_WARPS, "Schedule": common.BALANCED} for chunk, stages in fitting]
        out += [{"variant": VARIANT, "ChunkK": 64, "RowsPerMMA": rows, "num_stages": stages, "CtasPerSM": 3,
                 "num_warps": NUM_WARPS, "Schedule": common.BALANCED}
                for stages in base._stages_for(64) if fits(problem, 64, rows, stages, 3)]
        groupings += bool(fitting)
        if groupings == 2:
            break
    return out


def default_config(problem: Problem) -> dict:
    """The widest row grouping that fits two programs per SM, 64-token tiles, the deep ring."""
    for rows in base._rows_options(problem):
        for chunk in (64, 128):
            for stages in reversed(base._stages_for(chunk)):
                for ctas in (2, 1):
                    if fits(problem, chunk, rows, stages, ctas):
                        return {"variant": VARIANT, "ChunkK": chunk, "RowsPerMMA": rows, "num_stages": stages,
                                "CtasPerSM": ctas, "num_warps": NUM_WARPS, "Schedule": common.BALANCED}
    raise ValueError(f"gluon/{VARIANT}: no configuration fits {problem.describe()}")


_PLANS: dict[tuple, tuple] = {}


def launch(args: LaunchArgs, config: dict) -> None:
    """One persistent wave; per-(problem, config) launch parameters are cached."""
    p = args.problem
    key = (p, common.config_key(config))
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = (grid(p, config), {**constexprs(p, config), **options(p, config)})
    launch_grid, kwargs = plan
    wgmma_ws_logits_kernel[launch_grid](*common.kernel_arguments(args, 1), **kwargs,
                                        **base.alignment(args.q, args.kv_cache))


# ----------------------------------------------------------------------------- compile specs
def compile_specs(arch: str, configs: list[dict] | None = None) -> list[CompileSpec]:
    """One spec per config (problem fields + knobs), specialised like a typical vLLM call."""
    specs = []
    for cfg in configs if configs is not None else compile_matrix(arch):
        problem = common.problem_for(arch, FP8[arch], cfg)
        chunk, rows, stages, ctas = _knobs(problem, cfg)
        knobs = {"variant": VARIANT, "ChunkK": chunk, "RowsPerMMA": rows, "num_stages": stages, "CtasPerSM": ctas,
                 "num_warps": NUM_WARPS, "Schedule": common.BALANCED}
        specs.append(base.typical_spec(wgmma_ws_logits_kernel, problem, cfg, knobs, constexprs(problem, cfg),
                                       options(problem, cfg)))
    return specs


def compile_matrix(arch: str) -> list[dict]:
    """Every candidate of ``common.representative_problems`` (deduplicated by kernel)."""
    out, seen = [], set()
    for fields in common.representative_problems(arch):
        problem = common.problem_for(arch, FP8[arch], fields)
        for cand in candidates(problem):
            key = (tuple(sorted(constexprs(problem, cand).items())), _knobs(problem, cand)[3])
            if key not in seen:
                seen.add(key)
                out.append(dict(fields, **cand))
    return out
