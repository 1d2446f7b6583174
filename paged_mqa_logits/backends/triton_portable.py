"""``triton`` backend: one plain-Triton kernel for any Triton GPU, and CPU via the interpreter.

Work is scheduled as ``schedule.py`` describes: with ``Schedule=balanced`` a persistent grid of
``SMs * PROGRAMS_PER_SM`` programs per row group, each taking an equal share of the batch's
chunks from an in-kernel prefix sum over the lengths; with ``Schedule=split`` (the default: this
portable kernel is the CPU path and never the sm_90 pick, see docs/VERIFICATION.md) one program
per (row group, KV split, sequence). A program walks its
chunks of a sequence, gathers each chunk of ``ChunkK`` keys through the block table once, and
scores it against all rows of its group at once: a single ``[ChunkK, D] x [D, rows * H]`` dot,
so with ``RowsPerProgram >= next_n`` a KV page is read once. Smaller groups bound the
accumulator's registers (``next_n * H`` columns per token); their repeated reads of a chunk
come from L2. The head reduction then folds ``[ChunkK, rows, H]`` to ``[ChunkK, rows]``.

MXFP4 inputs are decoded to exact fp32 values as they are loaded (``_fp4_values``) and
multiplied in bf16 on GPUs that have it; bf16 logits are the fp32 logits rounded once, by hand,
just before the store.

CPU tensors run through the Triton interpreter (an :class:`InterpretedFunction` made from the
same Python source), which computes in fp32 after the load because its fp8 arithmetic is not
trustworthy (docs/VERIFICATION.md), and whose own fp32 -> bf16 cast truncates. There the balanced grid has ``CPU_PROGRAMS`` programs per
row group: the interpreter runs programs one after another, and several shares exercise the
segment boundaries the GPU sees.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..problem import LaunchArgs, Problem, Target
from ..schedule import BALANCED, SCHEDULES, SPLIT, derive_split_kv, persistent_programs
from . import MAX_SPLIT_KV, check_knob_space
from ..triton_internals.interpreter import interpreted

#: programs per SM the balanced schedule's persistent grid is sized for
PROGRAMS_PER_SM = 2
#: balanced programs per row group on CPU (see the module docstring)
CPU_PROGRAMS = 3


@triton.jit
def _sequence_length(lens_ptr, b, stride_lens_b, stride_lens_j, NEXT_N: tl.constexpr, LENS_2D: tl.constexpr):
    """Tokens that size sequence ``b``'s work: ``L_b`` (1-D) or ``max_j lens[b, j]`` (2-D).

    Scalar loads rather than a vector ``tl.max``: the interpreter returns reductions as
    1-element arrays, which numpy 2 refuses as loop bounds.
    """
    seq_len = tl.load(lens_ptr + b * stride_lens_b)
    if LENS_2D:
        for j in tl.static_range(1, NEXT_N):
            seq_len = tl.maximum(seq_len, tl.load(lens_ptr + b * stride_lens_b + j * stride_lens_j))
    return tl.maximum(seq_len, 0)


@triton.jit
def row_lengths(lens_ptr, b, seq_len, j, stride_lens_b, stride_lens_j, NEXT_N: tl.constexpr, LENS_2D: tl.constexpr):
    """Visible length of query rows ``j`` of sequence ``b`` (0 for padding rows ``j >= NEXT_N``)."""
    if LENS_2D:
        lens = tl.load(lens_ptr + b * stride_lens_b + j * stride_lens_j, mask=j < NEXT_N, other=0)
    else:
        lens = seq_len - (NEXT_N - 1) + j
    return tl.where(j < NEXT_N, tl.maximum(lens, 0), 0)


#: sequences whose lengths one scan step of the balanced schedule reads
SCAN_BLOCK = tl.constexpr(512)


@triton.jit
def _e2m1(codes):
    """fp32 values of int32 e2m1 codes (bit 3 the sign; bits 1-2 the exponent, bit 0 the
    mantissa), built from their bits: exact, and free of any float conversion."""
    exponent = (codes >> 1) & 3
    mantissa = codes & 1
    bits = tl.where(exponent > 0, ((exponent + 126) << 23) | (mantissa << 22), mantissa * 0x3F000000)
    return (bits | ((codes & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def _ue8m0(exponents):
    """fp32 ``2^(e - 127)`` of int32 ue8m0 bytes ``e``, from the bits (``e = 0``: ``2^-127``)."""
    return tl.where(exponents == 0, 0x400000, exponents << 23).to(tl.float32, bitcast=True)


@triton.jit
def _fp4_values(byte_ptrs, exponent_words, mask, HEAD_DIM: tl.constexpr):
    """fp32 ``[R, HEAD_DIM]`` values of MXFP4 rows: ``byte_ptrs`` ``[R, HEAD_DIM / 2]`` addresses
    of each row's packed bytes (each byte loaded once, its low nibble the even element),
    ``exponent_words`` ``[R]`` int32 (four ue8m0 bytes, group 0 in the low byte). Each value is
    exact (a power of two times an e2m1 value), so any dot dtype with fp32's exponent range
    multiplies it exactly."""
    byte = tl.arange(0, HEAD_DIM // 2)
    packed = tl.load(byte_ptrs, mask=mask, other=0).to(tl.int32)
    scale = _ue8m0((exponent_words[:, None] >> ((byte // 16) * 8)[None, :]) & 0xFF)  # 32 elements = 16 bytes a group
    even = _e2m1(packed & 0xF) * scale
    odd = _e2m1(packed >> 4) * scale
    return tl.reshape(tl.join(even, odd), (even.shape[0], HEAD_DIM))


@triton.jit
def _round_to_bf16(x):
    """``x`` rounded to the nearest bf16 (ties to even), still fp32: the cast that follows is
    exact, wherever it runs (the interpreter's own fp32 -> bf16 cast truncates)."""
    bits = x.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return tl.where(x != x, x, rounded.to(tl.float32, bitcast=True))


@triton.jit
def _block_tiles(lens_ptr, first_seq, batch, stride_lens_b, stride_lens_j, max_model_len, max_blocks,
                 NEXT_N: tl.constexpr, LENS_2D: tl.constexpr, KV_BLOCK_SIZE: tl.constexpr, CHUNK: tl.constexpr):
    """Tiles of sequences ``first_seq .. first_seq + SCAN_BLOCK`` (0 past the batch)."""
    seq = first_seq + tl.arange(0, SCAN_BLOCK)
    valid = seq < batch
    row = lens_ptr + seq.to(tl.int64) * stride_lens_b
    seq_len = tl.load(row, mask=valid, other=0)
    if LENS_2D:
        for j in tl.static_range(1, NEXT_N):
            seq_len = tl.maximum(seq_len, tl.load(row + j * stride_lens_j, mask=valid, other=0))
    end = tl.minimum(tl.minimum(tl.maximum(seq_len, 0), max_model_len), max_blocks * KV_BLOCK_SIZE)
    return tl.cdiv(end, CHUNK)


@triton.jit
def _balanced_share(lens_ptr, batch, stride_lens_b, stride_lens_j, max_model_len, max_blocks, program, num_programs,
                    NEXT_N: tl.constexpr, LENS_2D: tl.constexpr, KV_BLOCK_SIZE: tl.constexpr, CHUNK: tl.constexpr):
    """``(start, stop, seq, tile)`` of ``program``'s equal share of the batch's tiles, from an
    in-kernel prefix sum over the lengths (``schedule.share`` / ``schedule.locate``)."""
    total = tl.zeros((), tl.int32)
    for first_seq in range(0, batch, SCAN_BLOCK):
        tiles = _block_tiles(lens_ptr, first_seq, batch, stride_lens_b, stride_lens_j, max_model_len, max_blocks,
                             NEXT_N, LENS_2D, KV_BLOCK_SIZE, CHUNK)
        total += tl.sum(tiles, axis=0)
    start = (total.to(tl.int64) * program // num_programs).to(tl.int32)
    stop = (total.to(tl.int64) * (program + 1) // num_programs).to(tl.int32)
    seq = tl.zeros((), tl.int32)
    before = tl.zeros((), tl.int32)
    carried = tl.zeros((), tl.int32)
    for first_seq in range(0, batch, SCAN_BLOCK):
        tiles = _block_tiles(lens_ptr, first_seq, batch, stride_lens_b, stride_lens_j, max_model_len, max_blocks,
                             NEXT_N, LENS_2D, KV_BLOCK_SIZE, CHUNK)
        cum = tl.cumsum(tiles, 0) + carried
        done = cum <= start
        seq += tl.sum(done.to(tl.int32), axis=0)
        before = tl.maximum(before, tl.max(tl.where(done, cum, 0), axis=0))
        carried += tl.sum(tiles, axis=0)
    return start, stop, seq, start - before


@triton.jit
def _score_segment(q_ptr, q_scale_ptr, kv_fp8_ptr, kv_f32_ptr, weights_ptr, out_ptr, lens_ptr, block_table_ptr,
                   b, row_group, chunk_begin, chunk_end,
                   stride_q_b, stride_q_j, stride_q_h, stride_qs_b, stride_qs_j, stride_block, stride_w, stride_out,
                   stride_lens_b, stride_lens_j, stride_table, max_model_len, max_blocks, num_blocks,
                   NEXT_N: tl.constexpr, ROWS: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                   KV_BLOCK_SIZE: tl.constexpr, CHUNK: tl.constexpr, PRESHUFFLE: tl.constexpr, LENS_2D: tl.constexpr,
                   DOT_DTYPE: tl.constexpr, NUM_STAGES: tl.constexpr, KV_FP4: tl.constexpr, OUT_BF16: tl.constexpr):
    """Chunks ``[chunk_begin, chunk_end)`` of sequence ``b`` scored against next_n rows
    ``[row_group*ROWS, (row_group+1)*ROWS)``. ``KV_FP4``: MXFP4 queries and keys (``kv_fp8_ptr``
    the cache bytes, ``kv_f32_ptr`` its int32 exponent words); ``OUT_BF16``: bf16 logits."""
    M: tl.constexpr = ROWS * HEADS
    # bytes of a key (and of a query head): an fp8 byte, or half a byte, per element
    KEY_BYTES: tl.constexpr = HEAD_DIM // 2 if KV_FP4 else HEAD_DIM
    seq_len = _sequence_length(lens_ptr, b, stride_lens_b, stride_lens_j, NEXT_N, LENS_2D)
    j = row_group * ROWS + tl.arange(0, ROWS)
    row_len = row_lengths(lens_ptr, b, seq_len, j, stride_lens_b, stride_lens_j, NEXT_N, LENS_2D)
    end = tl.minimum(tl.minimum(seq_len, max_model_len), max_blocks * KV_BLOCK_SIZE)

    # The group's query rows stacked: m = r * HEADS + h for row j = row_group * ROWS + r.
    m = tl.arange(0, M)
    d = tl.arange(0, HEAD_DIM)
    j_of_m = row_group * ROWS + m // HEADS
    q_offsets = b.to(tl.int64) * stride_q_b + j_of_m * stride_q_j + (m % HEADS) * stride_q_h
    if KV_FP4:
        q_words = tl.load(q_scale_ptr + b.to(tl.int64) * stride_qs_b + j_of_m * stride_qs_j + m % HEADS,
                          mask=j_of_m < NEXT_N, other=0)
        q_bytes = q_ptr + q_offsets[:, None] + tl.arange(0, KEY_BYTES)[None, :]
        q = _fp4_values(q_bytes, q_words, (j_of_m < NEXT_N)[:, None], HEAD_DIM)
    else:
        q = tl.load(q_ptr + q_offsets[:, None] + d[None, :], mask=(j_of_m < NEXT_N)[:, None], other=0.0)
    q = q.to(DOT_DTYPE)
    w = tl.load(weights_ptr + (b.to(tl.int64) * NEXT_N + j_of_m) * stride_w + m % HEADS, mask=j_of_m < NEXT_N, other=0.0)
    w = tl.reshape(w, (ROWS, HEADS))

    out_rows = out_ptr + (b.to(tl.int64) * NEXT_N + j) * stride_out
    visible_end = tl.minimum(row_len, end)
    table_row = block_table_ptr + b.to(tl.int64) * stride_table
    t = tl.arange(0, CHUNK)
    for chunk in tl.range(chunk_begin, chunk_end, num_stages=NUM_STAGES):
        token = chunk * CHUNK + t
        in_range = token < end
        block = tl.load(table_row + token // KV_BLOCK_SIZE, mask=in_range, other=0)
        # Whatever the table holds, no gather leaves the cache: ids are clamped into
        # [0, num_blocks) (an invalid id yields a real block's logits, the documented rule).
        block = tl.maximum(tl.minimum(block, num_blocks - 1), 0).to(tl.int64)
        slot = token % KV_BLOCK_SIZE
        column = tl.arange(0, KEY_BYTES)  # the bytes of a key
        if PRESHUFFLE:
            key_offsets = ((slot // 16 * 16 * KEY_BYTES + slot % 16 * 16)[:, None]
                           + (column // 16 * 256 + column % 16)[None, :])
        else:
            key_offsets = (slot * KEY_BYTES)[:, None] + column[None, :]
        key_ptrs = kv_fp8_ptr + (block * stride_block)[:, None] + key_offsets
        # the token's 4-byte word after the block's keys: its fp32 scale, or its fp4 exponents
        word = tl.load(kv_f32_ptr + block * (stride_block // 4) + (KV_BLOCK_SIZE * KEY_BYTES // 4) + slot, mask=in_range,
                       other=0)
        if KV_FP4:
            keys = _fp4_values(key_ptrs, word, in_range[:, None], HEAD_DIM)
        else:
            keys = tl.load(key_ptrs, mask=in_range[:, None], other=0.0)

        # Tokens on the M side of the dot: the head reduction then runs along N, inside a thread
        # and its quad, instead of across warps.
        scores = tl.dot(keys.to(DOT_DTYPE), tl.trans(q))  # [CHUNK, M] fp32
        scores = tl.reshape(scores, (CHUNK, ROWS, HEADS))
        logits = tl.sum(tl.maximum(scores, 0.0) * w[None, :, :], axis=2)  # [CHUNK, ROWS]
        if not KV_FP4:
            # The per-token scale is factored out of the ReLU (exact for the non-negative scales
            # fp8 quantisation produces, as in DeepGEMM): two ALU ops per score instead of three.
            logits = logits * word[:, None]
        if OUT_BF16:
            logits = _round_to_bf16(logits)
        visible = token[:, None] < visible_end[None, :]
        tl.store(out_rows[None, :] + token[:, None], logits.to(out_ptr.dtype.element_ty), mask=visible)


# Sizes that vary per call stay unspecialised so one compiled kernel serves every batch.
@triton.jit(do_not_specialize=("max_model_len", "max_blocks", "num_splits", "batch", "num_blocks"))
def _paged_mqa_logits_kernel(
    q_ptr, q_scale_ptr, kv_fp8_ptr, kv_f32_ptr, weights_ptr, out_ptr, lens_ptr, block_table_ptr,
    stride_q_b, stride_q_j, stride_q_h, stride_qs_b, stride_qs_j,
    stride_block,  # bytes between cache blocks
    stride_w, stride_out, stride_lens_b, stride_lens_j, stride_table,
    max_model_len, max_blocks, num_splits, batch, num_blocks,
    NEXT_N: tl.constexpr, ROWS: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    KV_BLOCK_SIZE: tl.constexpr, CHUNK: tl.constexpr, PRESHUFFLE: tl.constexpr, LENS_2D: tl.constexpr,
    DOT_DTYPE: tl.constexpr, NUM_STAGES: tl.constexpr, BALANCED: tl.constexpr, KV_FP4: tl.constexpr,
    OUT_BF16: tl.constexpr,
):
    """Balanced: program (row group g, p) of a persistent grid scores its equal share of the
    batch's chunks (``schedule.py``) for rows [g*ROWS, (g+1)*ROWS), segment by segment.
    Split: program (g, split s, sequence b) scores an even share of sequence b's chunks. Row
    groups of one share are adjacent program ids, so when next_n > ROWS the repeated KV reads
    of a chunk hit L2."""
    row_group = tl.program_id(0)
    if BALANCED:
        item, stop, b, tile = _balanced_share(lens_ptr, batch, stride_lens_b, stride_lens_j, max_model_len,
                                              max_blocks, tl.program_id(1), tl.num_programs(1), NEXT_N, LENS_2D,
                                              KV_BLOCK_SIZE, CHUNK)
        while item < stop:
            seq_len = _sequence_length(lens_ptr, b, stride_lens_b, stride_lens_j, NEXT_N, LENS_2D)
            tiles = tl.cdiv(tl.minimum(tl.minimum(seq_len, max_model_len), max_blocks * KV_BLOCK_SIZE), CHUNK)
            count = tl.minimum(tiles - tile, stop - item)
            _score_segment(q_ptr, q_scale_ptr, kv_fp8_ptr, kv_f32_ptr, weights_ptr, out_ptr, lens_ptr,
                           block_table_ptr, b, row_group, tile, tile + count,
                           stride_q_b, stride_q_j, stride_q_h, stride_qs_b, stride_qs_j, stride_block, stride_w,
                           stride_out, stride_lens_b, stride_lens_j, stride_table, max_model_len, max_blocks,
                           num_blocks, NEXT_N, ROWS, HEADS, HEAD_DIM, KV_BLOCK_SIZE, CHUNK, PRESHUFFLE, LENS_2D,
                           DOT_DTYPE, NUM_STAGES, KV_FP4, OUT_BF16)
            item += tl.maximum(count, 0)  # zero-length sequences between long ones hold no items
            b += 1
            tile = tile * 0
    else:
        split = tl.program_id(1)
        b = tl.program_id(2)
        seq_len = _sequence_length(lens_ptr, b, stride_lens_b, stride_lens_j, NEXT_N, LENS_2D)
        num_chunks = tl.cdiv(tl.minimum(tl.minimum(seq_len, max_model_len), max_blocks * KV_BLOCK_SIZE), CHUNK)
        per_split = tl.cdiv(num_chunks, num_splits)
        chunk_begin = split * per_split
        _score_segment(q_ptr, q_scale_ptr, kv_fp8_ptr, kv_f32_ptr, weights_ptr, out_ptr, lens_ptr, block_table_ptr,
                       b, row_group, chunk_begin, tl.minimum(chunk_begin + per_split, num_chunks),
                       stride_q_b, stride_q_j, stride_q_h, stride_qs_b, stride_qs_j, stride_block, stride_w,
                       stride_out, stride_lens_b, stride_lens_j, stride_table, max_model_len, max_blocks, num_blocks,
                       NEXT_N, ROWS, HEADS, HEAD_DIM, KV_BLOCK_SIZE, CHUNK, PRESHUFFLE, LENS_2D, DOT_DTYPE, NUM_STAGES,
                       KV_FP4, OUT_BF16)


def _dot_dtype(problem: Problem, interpreter: bool):
    if interpreter:
        return tl.float32
    if problem.shape_key.kv_format == "fp4":
        # the dequantised values are exact in any dtype with fp32's exponent range: bf16 where
        # the chip multiplies it (sm_80+, every gfx this package knows), else fp32 (tf32: exact too)
        bf16 = problem.arch.startswith("gfx") or (problem.arch.startswith("sm_") and int(problem.arch[3:]) >= 80)
        return tl.bfloat16 if bf16 else tl.float32
    native_fp8 = problem.arch.startswith("gfx") or (problem.arch.startswith("sm_") and int(problem.arch[3:]) >= 89)
    if native_fp8:
        return tl.float8e4nv if problem.fp8 == "fn" else tl.float8e4b8
    return tl.float16  # fp8 e4m3 values are exact in fp16


class TritonBackend:
    name = "triton"
    knobs = ("ChunkK", "SplitKV", "RowsPerProgram", "num_warps", "num_stages", "Schedule")
    #: what the kernel compiles for: power-of-two tiles (tl.arange, tl.dot's M >= 16)
    KNOB_SPACE = {"ChunkK": (16, 32, 64, 128, 256), "SplitKV": range(0, MAX_SPLIT_KV + 1),
                  "RowsPerProgram": (1, 2, 4, 8), "num_warps": (1, 2, 4, 8, 16), "num_stages": range(1, 9),
                  "Schedule": SCHEDULES}

    def check_config(self, config: dict, problem: Problem | None = None) -> str | None:
        return check_knob_space(self.name, config, self.KNOB_SPACE)

    def unsupported(self, problem: Problem) -> str | None:
        key = problem.shape_key
        if key.heads & (key.heads - 1):
            return f"heads must be a power of two for tl.arange, got {key.heads}"
        if problem.arch == "cpu" and problem.fp8 == "fnuz":  # the cpu arch runs in the interpreter
            return "the Triton interpreter (CPU) cannot load e4m3fnuz (fp8e4b8) tensors"
        return None

    def unavailable(self, target: Target) -> str | None:
        if target.device_type not in ("cpu", "cuda"):
            return f"device type {target.device_type} is not a Triton target"
        return None

    def candidates(self, problem: Problem) -> list[dict]:
        rows_options = sorted({min(r, triton.next_power_of_2(problem.shape_key.next_n)) for r in (1, 2, 4, 8)})
        out = []
        for chunk in (64, 128):
            for rows in rows_options:
                for warps in (4, 8):
                    for stages in (3, 4):
                        out.append({"ChunkK": chunk, "SplitKV": 0, "RowsPerProgram": rows, "num_warps": warps,
                                    "num_stages": stages, "Schedule": BALANCED})
        # and the per-sequence split (the default), where one or two sequences make the
        # balanced schedule's length scan pure latency
        return out + [self.default_config(problem)]

    def default_config(self, problem: Problem) -> dict:
        rows = min(triton.next_power_of_2(problem.shape_key.next_n), max(1, 256 // problem.shape_key.heads))
        return {"ChunkK": 64, "SplitKV": 0, "RowsPerProgram": rows, "num_warps": 4, "num_stages": 3,
                "Schedule": SPLIT}

    def launch(self, args: LaunchArgs, config: dict) -> None:
        p = args.problem
        key = p.shape_key
        # The chip, not the tensors' device, picks the interpreter: CPU tensors always run as the
        # cpu arch, and where they stand in for a GPU's memory (aot.verify's simulated device)
        # the GPU kernel is what must run.
        on_cpu = p.arch == "cpu"
        chunk = int(config.get("ChunkK") or 64)
        rows = min(int(config.get("RowsPerProgram") or 8), triton.next_power_of_2(key.next_n))
        row_groups = triton.cdiv(key.next_n, rows)
        schedule = config.get("Schedule") or SPLIT
        if schedule not in SCHEDULES:
            raise ValueError(f"triton: Schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
        splits = int(config.get("SplitKV") or 0)
        if schedule == BALANCED:
            programs = CPU_PROGRAMS if on_cpu else persistent_programs(p.cu_num, PROGRAMS_PER_SM)
            grid = (row_groups, programs, 1)
            splits = 1
        else:
            if splits <= 0:
                splits = derive_split_kv(max(p.cu_num, 1), key.batch * row_groups, p.work_context, chunk)
            grid = (row_groups, splits, key.batch)
        fp4 = key.kv_format == "fp4"
        kv_fp8 = args.kv_cache.view(args.q.dtype)  # uint8 for fp4
        kv_f32 = args.kv_cache.view(torch.int32 if fp4 else torch.float32)
        q_scale = args.q_scale if fp4 else args.q  # any pointer when there is none: never read
        scale_strides = (q_scale.stride(0), q_scale.stride(1)) if fp4 else (0, 0)
        lens = args.context_lens
        lens_strides = (lens.stride(0), lens.stride(1) if lens.dim() == 2 else 0)
        kernel = interpreted(_paged_mqa_logits_kernel) if on_cpu else _paged_mqa_logits_kernel
        stages = int(config.get("num_stages") or 3)
        options = {} if on_cpu else {"num_warps": int(config.get("num_warps") or 4), "num_stages": stages}
        kernel[grid](
            args.q, q_scale, kv_fp8, kv_f32, args.weights, args.out, lens, args.block_table,
            args.q.stride(0), args.q.stride(1), args.q.stride(2), *scale_strides,
            args.kv_cache.stride(0), args.weights.stride(0), args.out.stride(0), *lens_strides,
            args.block_table.stride(0), args.max_model_len, args.max_blocks, splits, key.batch, args.num_blocks,
            NEXT_N=key.next_n, ROWS=rows, HEADS=key.heads, HEAD_DIM=key.head_dim, KV_BLOCK_SIZE=key.kv_block_size,
            CHUNK=chunk, PRESHUFFLE=key.preshuffle, LENS_2D=p.lens_2d, DOT_DTYPE=_dot_dtype(p, on_cpu),
            NUM_STAGES=stages, BALANCED=schedule == BALANCED, KV_FP4=fp4, OUT_BF16=key.logits_dtype == "bf16",
            **options,
        )


BACKEND = TritonBackend()
