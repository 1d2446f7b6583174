"""``triton_sample`` backend: a sample-seeded threshold, so a row is read once in the common case
(GPUs; CPU tensors run the same source through the interpreter, for the tests).

Per row with ``n > k`` visible positions (rows with at most ``k`` are written without reading):

1. **Seed.** ``SAMPLE`` (2048) keys, ``SAMPLE_PIECES`` (16) contiguous pieces spread evenly over
   the row (the row itself when it is no longer), held in registers. A one-bit-a-round descent
   (:func:`descend`, at most ``SEED_BITS`` = 16 rounds) finds a 16-bit key prefix ``T`` with at
   least ``rank`` sample keys ``>= T`` (stopping once at most ``1.25 rank`` are): ``rank`` is the
   sample's expected hits among the row's top ``k`` plus four standard deviations and four, so
   fewer than ``k`` listed is rare at any ``k`` and length (``k`` itself when the sample is the row).
2. **Compact.** One read of the row lists the position of every key ``>= T`` in a per-row scratch
   list (``max(CAPACITY, 4 k)`` entries, at most the width) and counts them. The test is a float
   compare against ``T``'s value (NaN kept apart): a superset only where ``T`` is +0.0 (-0.0
   joins), so still every key ``>=`` some threshold, and the count is the list's.
3. **Finish.** When ``k <= count`` and the list fits, its keys are gathered into registers
   (``REGISTER_LIST`` at most, sized by the launcher to about 1.5x the longest list the seed aims at
   for the call's width), the top bits its smallest and largest key share are fixed, and the
   descent finds the exact k-th largest key (stopping once exactly ``k`` keys are at or above the
   prefix); those above it, then the first tied ones, are written. A list longer than the registers
   hold is searched where it lies (``triton_select.search`` / ``write_selection``). Otherwise the
   seed was too high (count below ``k``: a sample unlike its row) or too low (ties, or again an
   unrepresentative sample: the list overflowed) and the row goes ``triton_radix``'s way
   (``triton_radix.select_row``): the result never depends on the sample.

Counted in sm_90 SASS by ``tools/topk_sass.py`` (a JIT launch's specialisation: 16-byte aligned
row, column stride 1; instructions per element a thread handles), defaults ``BLOCK`` 8192 over 8
warps: the compaction loop 27 an element (the load and key mapping alone about 10); the seed 246
instructions a thread plus 51 a round (about 11 rounds: 1.6 an element of a 128k row); the register
finish over 8192 entries 2424 a thread plus 128 a round (about 20 rounds: 9.7 an element of a 128k
row). So about 38 an element in all at 128k and k 2048, with one read of the row, against
``triton_radix``'s 79 + 64 (two reads) or 79 + 98 + 64 (three), counted the same way. Short rows
pay the fixed parts over fewer elements (about 127 an element at 8k: fewer warps are the tuner's
to try). Why the compaction looks as it does, each alternative counted the same way in a loop that
loads, compares and lists:

* one 1-D ``tl.cumsum`` over the block (as ``triton_radix``'s split pass): 66 (1024 a step), 62 (4096);
* ``[R, E]`` pieces of ``E`` contiguous elements, the scan along the piece: 51-56;
* ``[E, R]`` stripes (here: element ``(e, r)`` at ``start + e R + r``, ``R = 128 x num_warps``, so
  each thread's elements of a column are its own and the scan down them is register adds, one
  block scan of ``R`` column counts a step), the store addressed by the 2-D slots: 27-34 (Triton's
  coalescing gives the scattered store a layout of its own, so the keep masks and positions go
  through shared memory); comparing floats instead of mapped keys saves about 3;
* the same with the store's pointers, values and mask flattened apart by
  ``tl.reshape(..., can_reorder=True)``: 17-20, but **wrong**: each flattened tensor may be ordered
  its own way, and on an H100 the pairing broke (list entries lost) where the interpreter, which
  never reorders, passed;
* a global ``tl.atomic_add`` slot per survivor: 35 (and the list order would not be deterministic).

Few rows, wide rows: each row is cut into ``split`` chunks over two launches. Every chunk's program
computes the same seed from the same sample and lists its chunk's survivors in its own part of the
scratch (counts per chunk); one program per row then gathers the parts in chunk order into one list
and finishes as above, or falls back to ``triton_radix.select_row`` over the row. Deterministic:
no atomics.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..triton_internals.interpreter import interpreted
from .knobs import SPACES
from .triton_radix import MAX_KEY, chunks_per_row, select_row
from .triton_select import SIGN, emit, lens_strides, open_row, order_keys, row_setup, search, write_selection
from .validate import TopkCall

#: the defaults of ``knobs.py``, on a GPU and for CPU tensors
BLOCK = SPACES["triton_sample"].gpu["BLOCK"]
NUM_WARPS = SPACES["triton_sample"].gpu["num_warps"]
CPU_BLOCK = SPACES["triton_sample"].cpu["BLOCK"]
#: elements a thread loads per stripe (one 16-byte load of fp32), and the columns of a step on CPU
LANE_ELEMENTS = 4
CPU_COLUMNS = 16
#: the finish's and the fallback's step on CPU (on a GPU: the step's columns, ``128 x num_warps``)
CPU_LIST_BLOCK = 64
#: the least list capacity a row gets (int32 positions); ``4 k`` where that is more
CAPACITY = 8192
SAMPLE = tl.constexpr(2048)
SAMPLE_PIECES = tl.constexpr(16)
#: key bits the seed resolves: 16 (sign, exponent, seven mantissa bits) put ``T`` within 1/128 of the
#: sample's rank-th key; more bits would cost a block reduction each
SEED_BITS = 16
SEED_LOWEST_BIT = tl.constexpr(1 << (32 - SEED_BITS))
#: the most listed keys the finish holds in registers (a power of two); longer lists are searched
#: where they lie (``triton_select.search``)
REGISTER_LIST = 8192
#: the key of -inf: thresholds at or below it keep every non-NaN value
NEG_INF_KEY = tl.constexpr(-2139095041)


@triton.jit
def _total(values):
    """The sum of a 2-D tensor (flattened in any order: one reduction, no data moved)."""
    return tl.sum(_flat(values, values.numel), axis=0)


@triton.jit
def _flat(values, SIZE: tl.constexpr):
    """A 2-D tensor as 1-D in whatever order moves no data: for reductions only. Not for stores:
    ``can_reorder`` lets the compiler order each flattened tensor its own way, so pointers, values
    and masks flattened apart need not stay paired (on an H100 a store so flattened lost list
    entries that the interpreter, which never reorders, kept)."""
    return tl.reshape(values, [SIZE], can_reorder=True)


@triton.jit
def descend(keys, above, rank_low, rank_high, prefix, bit, LOWEST_BIT: tl.constexpr):
    """A one-bit-a-round descent over register-held 2-D ``keys`` (dead ones the smallest int32, below
    every real key: no candidate counts them): from the top bit down to ``LOWEST_BIT``, the largest
    prefix ``T`` with at least ``rank_low`` keys ``>= T``, stopping early once at most ``rank_high``
    are. Starts from ``prefix`` (unsigned bits above ``bit``, which every live key has; ``0`` and the
    sign bit: none) with ``above`` live keys (at least ``rank_low``). Returns ``T`` (a signed key) and
    the live keys ``>= T``. One block reduction a round, so the rounds, not the keys, cost most."""
    while ((bit < 0) | (bit >= LOWEST_BIT)) & (above > rank_high):
        candidate = prefix | bit
        count = _total((keys >= (candidate ^ SIGN)).to(tl.int32))
        taken = count >= rank_low
        prefix = tl.where(taken, candidate, prefix)
        above = tl.where(taken, count, above)
        bit = (bit >> 1) & MAX_KEY
    return prefix ^ SIGN, above


@triton.jit
def seed_threshold(row_ptr, stride_col, n, kk):
    """The seed ``T`` (a signed key with its low ``32 - SEED_BITS`` bits clear) from the row's sample:
    the largest such key with at least ``rank`` sample keys ``>= T`` (the descent stops early once
    at most ``rank + rank / 4`` are, any of which serves as well)."""
    PIECE: tl.constexpr = SAMPLE // SAMPLE_PIECES
    pieces = tl.arange(0, SAMPLE_PIECES)[:, None]
    within = tl.arange(0, PIECE)[None, :]
    # pieces never overlap (n > SAMPLE); the first SAMPLE columns when the row is no longer
    positions = tl.where(n > SAMPLE, pieces * (n // SAMPLE_PIECES), pieces * PIECE) + within
    live = positions < n
    x = tl.load(row_ptr + positions.to(tl.int64) * stride_col, mask=live, other=0.0).to(tl.float32)
    keys = tl.where(live, order_keys(x), SIGN)  # below every real key (-inf's is above it)
    # the sample's expected hits among the row's top kk, plus four standard deviations and four:
    # fewer than kk listed is then rare at every k and length; the sample is the row when n <= SAMPLE
    hits = (kk * SAMPLE + n - 1) // n
    slack = tl.sqrt_rn(hits.to(tl.float32)).to(tl.int32) * 4 + 4  # sqrt_rn: the same on every device
    rank = tl.where(n > SAMPLE, tl.minimum(hits + slack, SAMPLE), kk)
    threshold, _ = descend(keys, tl.minimum(n, SAMPLE), rank, rank + rank // 4, n * 0, n * 0 + SIGN,
                           SEED_LOWEST_BIT)
    return threshold


@triton.jit
def threshold_value(threshold):
    """The fp32 value whose ``x >= value`` keeps the non-NaN keys ``>= threshold`` (and -0.0 with
    +0.0's key): the key's float, -inf for keys at or below -inf's, NaN above +inf's (keeps none)."""
    bits = tl.where(threshold < 0, threshold ^ MAX_KEY, threshold)
    bits = tl.where(threshold <= NEG_INF_KEY, NEG_INF_KEY ^ MAX_KEY, bits)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _compact_step(row_ptr, stride_col, start, last, value, listed, list_ptr, capacity, MASKED: tl.constexpr,
                  STRIPES: tl.constexpr, BLOCK: tl.constexpr):
    """List the positions of ``[start, start + BLOCK)`` (below ``last`` when ``MASKED``) whose value is
    ``>= value`` or NaN, from entry ``listed`` on (none at or past ``capacity``); the new count."""
    COLUMNS: tl.constexpr = BLOCK // STRIPES
    positions = start + tl.arange(0, STRIPES)[:, None] * COLUMNS + tl.arange(0, COLUMNS)[None, :]
    if MASKED:
        live = positions < last
        x = tl.load(row_ptr + positions.to(tl.int64) * stride_col, mask=live, other=0.0).to(tl.float32)
        keep = live & ((x >= value) | (x != x))
    else:
        x = tl.load(row_ptr + positions.to(tl.int64) * stride_col).to(tl.float32)
        keep = (x >= value) | (x != x)
    flags = keep.to(tl.int32)
    column_counts = tl.sum(flags, axis=0)
    # a thread's stripes are one column's: this scan stays in registers; the block scan is one per column
    slots = (listed - 1 + tl.cumsum(column_counts, axis=0) - column_counts)[None, :] + tl.cumsum(flags, axis=0)
    store = keep & (slots < capacity)
    tl.store(list_ptr + slots, positions, mask=store)
    return listed + tl.sum(column_counts, axis=0)


@triton.jit
def compact(row_ptr, stride_col, first, last, value, list_ptr, capacity, STRIPES: tl.constexpr, BLOCK: tl.constexpr):
    """Positions of ``[first, last)`` whose value is ``>= value`` or NaN, listed from ``list_ptr`` (at
    most ``capacity``); returns how many there are (also past ``capacity``). Full steps load unmasked."""
    listed = first * 0
    full = last - (last - first) % BLOCK
    for start in range(first, full, BLOCK):
        listed = _compact_step(row_ptr, stride_col, start, last, value, listed, list_ptr, capacity, False, STRIPES,
                               BLOCK)
    if full < last:
        listed = _compact_step(row_ptr, stride_col, full, last, value, listed, list_ptr, capacity, True, STRIPES,
                               BLOCK)
    return listed


@triton.jit
def _finish_in_registers(row_ptr, stride_col, kk, count, out_row, list_ptr, table_row, block_size,
                         HAS_TABLE: tl.constexpr, LIST: tl.constexpr, COLUMNS: tl.constexpr):
    """The top ``kk`` of ``count <= LIST`` listed positions, their keys held in registers as
    ``[LIST / COLUMNS, COLUMNS]`` (entry ``(e, c)`` is ``e COLUMNS + c``: the compaction's layout, so
    the scans stay cheap): the exact k-th largest key by :func:`descend` (one bit a round, stopping
    once exactly ``kk`` keys are at or above the prefix), then those above it and the first tied
    ones, in the order of the columns' scans."""
    STRIPES: tl.constexpr = LIST // COLUMNS
    entries = tl.arange(0, STRIPES)[:, None] * COLUMNS + tl.arange(0, COLUMNS)[None, :]
    live = entries < count
    positions = tl.load(list_ptr + entries, mask=live, other=0)
    x = tl.load(row_ptr + positions.to(tl.int64) * stride_col, mask=live, other=0.0).to(tl.float32)
    keys = tl.where(live, order_keys(x), SIGN)
    # the top bits the smallest and largest listed keys share, every listed key has: no rounds for them
    # (sign and exponent bits, often, where the list is a long row's top; two reductions)
    low = tl.min(_flat(tl.where(live, keys, MAX_KEY), LIST), axis=0) ^ SIGN
    high = tl.max(_flat(keys, LIST), axis=0) ^ SIGN
    prefix = count * 0
    bit = count * 0 + SIGN
    while (bit != 0) & ((low & bit) == (high & bit)):
        prefix = prefix | (low & bit)
        bit = (bit >> 1) & MAX_KEY
    threshold, _ = descend(keys, count, kk, kk, prefix, bit, 1)
    # both ranks in one scan (LIST < 2**16): above the threshold in the low half, tied in the high
    flags = (keys > threshold).to(tl.int32) | ((keys == threshold).to(tl.int32) << 16)
    column_counts = tl.sum(flags, axis=0)
    ranks = (tl.cumsum(column_counts, axis=0) - column_counts)[None, :] + tl.cumsum(flags, axis=0)
    gt = tl.sum(column_counts, axis=0) & 0xFFFF
    rank_tie = (ranks >> 16) - 1
    is_gt = keys > threshold
    slots = tl.where(is_gt, (ranks & 0xFFFF) - 1, gt + rank_tie)
    take = is_gt | ((keys == threshold) & (rank_tie < kk - gt))
    emit(out_row, slots, positions, take, table_row, block_size, HAS_TABLE)


@triton.jit
def finish(row_ptr, stride_col, n, kk, count, capacity, out_row, list_ptr, table_row, block_size,
           HAS_TABLE: tl.constexpr, REGISTER_LIST: tl.constexpr, LIST_BLOCK: tl.constexpr):
    """Slots ``[0, kk)`` from the ``count`` listed positions when they hold the top ``kk`` and fit
    (in registers when at most ``REGISTER_LIST``), else from ``triton_radix``'s path over the row
    (it reuses the list's scratch)."""
    if (count >= kk) & (count <= tl.minimum(capacity, REGISTER_LIST)):
        _finish_in_registers(row_ptr, stride_col, kk, count, out_row, list_ptr, table_row, block_size, HAS_TABLE,
                             REGISTER_LIST, LIST_BLOCK)
    elif (count >= kk) & (count <= capacity):
        threshold, gt = search(row_ptr, stride_col, list_ptr, count, n * 0, n * 0, kk, 28, True, LIST_BLOCK)
        write_selection(row_ptr, stride_col, list_ptr, count, threshold, n * 0, gt, kk - gt, out_row, table_row,
                        block_size, True, HAS_TABLE, LIST_BLOCK)
    else:
        select_row(row_ptr, stride_col, n, kk, capacity, out_row, list_ptr, table_row, block_size, HAS_TABLE,
                   LIST_BLOCK)


@triton.jit
def _topk_sample_kernel(logits_ptr, lens_ptr, out_ptr, table_ptr, scratch_ptr, stride_row, stride_col,
                        stride_lens_b, stride_lens_j, stride_out, stride_table, width, k, block_size, capacity,
                        NEXT_N: tl.constexpr, LENS_2D: tl.constexpr, HAS_TABLE: tl.constexpr, STRIPES: tl.constexpr,
                        REGISTER_LIST: tl.constexpr, LIST_BLOCK: tl.constexpr, BLOCK: tl.constexpr):
    n, kk, row_ptr, out_row, table_row, list_ptr = open_row(
        logits_ptr, lens_ptr, out_ptr, table_ptr, scratch_ptr, tl.program_id(0), stride_row, stride_lens_b,
        stride_lens_j, stride_out, stride_table, width, k, block_size, capacity, NEXT_N, LENS_2D, HAS_TABLE,
        LIST_BLOCK)
    if n > k:
        value = threshold_value(seed_threshold(row_ptr, stride_col, n, kk))
        count = compact(row_ptr, stride_col, n * 0, n, value, list_ptr, capacity, STRIPES, BLOCK)
        tl.debug_barrier()  # the list is read back by other threads of the program
        finish(row_ptr, stride_col, n, kk, count, capacity, out_row, list_ptr, table_row, block_size, HAS_TABLE,
               REGISTER_LIST, LIST_BLOCK)


# ----------------------------------------------------------------------------- split rows
@triton.jit
def _chunk_compact_kernel(logits_ptr, lens_ptr, parts_ptr, counts_ptr, stride_row, stride_col, stride_lens_b,
                          stride_lens_j, width, k, capacity, chunk, NEXT_N: tl.constexpr, LENS_2D: tl.constexpr,
                          SPLIT: tl.constexpr, STRIPES: tl.constexpr, BLOCK: tl.constexpr):
    """One chunk: the row's seed (every chunk computes the same), its survivors listed in its own part
    of the scratch, their count (past the part's capacity too) in ``counts``."""
    row = tl.program_id(0)
    part = tl.program_id(1)
    _, n, kk = row_setup(lens_ptr, row, stride_lens_b, stride_lens_j, width, k, NEXT_N, LENS_2D)
    first = tl.minimum(part * chunk, n)
    last = tl.minimum(first + chunk, n)
    count = n * 0
    if n > k:
        row_ptr = logits_ptr + row.to(tl.int64) * stride_row
        value = threshold_value(seed_threshold(row_ptr, stride_col, n, kk))
        part_ptr = parts_ptr + (row.to(tl.int64) * SPLIT + part) * capacity
        count = compact(row_ptr, stride_col, first, last, value, part_ptr, capacity, STRIPES, BLOCK)
    tl.store(counts_ptr + row * SPLIT + part, count)


@triton.jit
def _chunk_finish_kernel(logits_ptr, lens_ptr, out_ptr, table_ptr, parts_ptr, counts_ptr, scratch_ptr, stride_row,
                         stride_col, stride_lens_b, stride_lens_j, stride_out, stride_table, width, k, block_size,
                         capacity, NEXT_N: tl.constexpr, LENS_2D: tl.constexpr, HAS_TABLE: tl.constexpr,
                         SPLIT: tl.constexpr, REGISTER_LIST: tl.constexpr, LIST_BLOCK: tl.constexpr):
    """One program a row: the chunks' parts gathered in chunk order into one list, then :func:`finish`."""
    row = tl.program_id(0)
    n, kk, row_ptr, out_row, table_row, list_ptr = open_row(
        logits_ptr, lens_ptr, out_ptr, table_ptr, scratch_ptr, row, stride_row, stride_lens_b, stride_lens_j,
        stride_out, stride_table, width, k, block_size, capacity, NEXT_N, LENS_2D, HAS_TABLE, LIST_BLOCK)
    if n > k:
        counts = tl.load(counts_ptr + row * SPLIT + tl.arange(0, SPLIT))
        total = tl.sum(counts, axis=0)
        if total <= capacity:  # then every part fits, and so does the gathered list
            offset = n * 0
            for part in tl.static_range(SPLIT):
                size = tl.sum(tl.where(tl.arange(0, SPLIT) == part, counts, 0), axis=0)
                source = parts_ptr + (row.to(tl.int64) * SPLIT + part) * capacity
                for start in range(0, size, LIST_BLOCK):
                    entries = start + tl.arange(0, LIST_BLOCK)
                    tl.store(list_ptr + offset + entries, tl.load(source + entries, mask=entries < size),
                             mask=entries < size)
                offset += size
            tl.debug_barrier()  # the gathered list is read back by other threads of the program
        finish(row_ptr, stride_col, n, kk, total, capacity, out_row, list_ptr, table_row, block_size, HAS_TABLE,
               REGISTER_LIST, LIST_BLOCK)


def capacity_for(k: int, width: int) -> int:
    """List entries a row gets: ``max(CAPACITY, 4 k)`` (lists run to about 2 k at k 2048 of 128k),
    at most the width."""
    return max(1, min(max(CAPACITY, 4 * k), width))


def register_list_for(k: int, width: int) -> int:
    """The finish's register-held list (a power of two): about 1.5x the longest list the seed aims at
    for rows of ``width`` (its rank's hits and slack, 1.25x for the early stop, scaled to the row;
    the longest at full width), at most ``REGISTER_LIST``: a descent round costs every held entry."""
    scale = max(width, SAMPLE.value) / SAMPLE.value
    expected = 1.25 * (k + 4 * math.sqrt(k * scale) + 5 * scale) if width > SAMPLE.value else 1.25 * k
    return min(REGISTER_LIST, triton.next_power_of_2(int(1.25 * expected)),
               triton.next_power_of_2(capacity_for(k, width)))


#: what :func:`launch` may stop after, for ``tools/topk_phases.py``: the seed alone, or the seed and the compaction
PHASES = ("seed", "compaction")


def launch(call: TopkCall, knobs: dict | None = None, split: int | None = None, stop_after: str | None = None):
    """Select ``call``'s rows with ``knobs`` (``BLOCK``, ``num_warps``, ``split``: ``knobs.py``;
    absent ones take the device's defaults, ``split`` ``triton_radix.split_for``); ``split`` given
    here overrides the knob.

    ``stop_after`` (one of :data:`PHASES`) times a phase alone: the chunk kernel runs (with any
    ``split``, 1 included) with empty chunks (``"seed"``) or the row's (``"compaction"``), nothing
    is written to ``call.out``, and ``(parts, counts)`` come back: each chunk's list
    (``[rows, split, capacity]``, positions) and its survivors (``[rows, split]``, also past the
    capacity; 0 for a row with at most ``k`` visible positions)."""
    knobs = knobs or {}
    if stop_after is not None and stop_after not in PHASES:
        raise ValueError(f"stop_after must be one of {PHASES} or None, got {stop_after!r}")
    rows, width = call.logits.shape
    if rows == 0:
        return None
    device = call.logits.device
    on_cpu = device.type == "cpu"
    split = chunks_per_row(call, knobs, split)
    block = knobs.get("BLOCK") or (CPU_BLOCK if on_cpu else BLOCK)
    warps = knobs.get("num_warps", NUM_WARPS)
    # a step's columns: four elements a lane (one 16-byte load) over every lane (64 a wave on CDNA)
    lanes = 32 if on_cpu else getattr(torch.cuda.get_device_properties(device), "warp_size", 32)
    columns = min(block, CPU_COLUMNS if on_cpu else LANE_ELEMENTS * lanes * warps)
    list_block = CPU_LIST_BLOCK if on_cpu else LANE_ELEMENTS * lanes * warps
    capacity = capacity_for(call.k, width)
    register_list = max(register_list_for(call.k, width), list_block)  # whole columns of the finish
    scratch = torch.empty((rows, capacity), dtype=torch.int32, device=device)
    table = call.block_table if call.block_table is not None else call.lengths  # never read without one
    options = {} if on_cpu else {"num_warps": warps}
    run = (lambda kernel: interpreted(kernel)) if on_cpu else (lambda kernel: kernel)
    lens_args = lens_strides(call.lengths)
    common = dict(NEXT_N=call.next_n, LENS_2D=call.lens_2d, **options)
    strides = (call.logits.stride(0), call.logits.stride(1))
    has_table = call.block_table is not None
    if split == 1 and stop_after is None:
        run(_topk_sample_kernel)[(rows,)](
            call.logits, call.lengths, call.out, table, scratch, *strides, *lens_args, call.out.stride(0),
            table.stride(0), width, call.k, call.block_size, capacity, HAS_TABLE=has_table, STRIPES=block // columns,
            REGISTER_LIST=register_list, LIST_BLOCK=list_block, BLOCK=block, **common)
        return None
    chunk = 0 if stop_after == "seed" else triton.cdiv(width, split)
    parts = torch.empty((rows, split, capacity), dtype=torch.int32, device=device)
    counts = torch.empty((rows, split), dtype=torch.int32, device=device)
    run(_chunk_compact_kernel)[(rows, split)](
        call.logits, call.lengths, parts, counts, *strides, *lens_args, width, call.k, capacity, chunk, SPLIT=split,
        STRIPES=block // columns, BLOCK=block, **common)
    if stop_after is not None:
        return parts, counts
    run(_chunk_finish_kernel)[(rows,)](
        call.logits, call.lengths, call.out, table, parts, counts, scratch, *strides, *lens_args, call.out.stride(0),
        table.stride(0), width, call.k, call.block_size, capacity, HAS_TABLE=has_table, SPLIT=split,
        REGISTER_LIST=register_list, LIST_BLOCK=list_block, **common)
    return None
