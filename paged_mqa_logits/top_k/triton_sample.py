"""``triton_sample`` backend: a sample-seeded threshold, so a row is read once in the common case
(GPUs; CPU tensors run the same source through the interpreter, for the tests).

Per row with ``n > k`` visible positions (rows with at most ``k`` are written without reading): a row
of at most ``held_row_for(BLOCK, width, columns)`` positions (``HELD_ROW``, 8192, when the block is as long) is
loaded into registers whole and selected there (:func:`select_held_row`: one read, no sample, no
list); a longer one takes three steps:

1. **Seed.** ``SAMPLE`` (2048) keys, ``SAMPLE_PIECES`` (16) contiguous pieces spread evenly over
   the row (the row itself when it is no longer), held in registers. :func:`narrow` finds a key
   ``T`` with between ``rank`` and ``1.25 rank`` sample keys ``>= T`` (or, where ties leave none,
   the largest with at least ``rank``): ``rank`` is the sample's expected hits among the row's top
   ``k`` plus four standard deviations and four, so fewer than ``k`` listed is rare at any ``k`` and
   length (``k`` itself when the sample is the row).
2. **Compact.** One read of the row lists every key ``>= T`` in a per-row scratch list
   (``max(CAPACITY, 4 k)`` entries, at most the width), as one int64 entry each (:func:`pack`:
   the value's bits above the position), and counts them. The test is a float compare against
   ``T``'s value (NaN kept apart): a superset only where ``T`` is +0.0 (-0.0 joins), so still every
   key ``>=`` some threshold, and the count is the list's. On NVIDIA GPUs each step's load is issued
   before the previous step is listed (one program an SM has no other warps to hide it behind;
   :func:`prefetch_for`), and where the list is sparse its entries are stored from the registers that
   hold them (:func:`list_in_place_for`).
3. **Finish.** When ``k <= count`` and the list fits, its entries are loaded into registers
   (``REGISTER_LIST`` at most, sized by the launcher to the longest list the seed aims at for the
   call's width; the values come with the positions, so nothing is gathered from the row)
   and :func:`narrow` finds the exact k-th largest key (stopping once exactly ``k`` keys are at or
   above the threshold); those above it, then the first tied ones, are written. A list longer than
   the registers hold is searched where it lies (its positions unpacked in place;
   ``triton_select.search`` / ``write_selection``). Otherwise the seed was too high (count below
   ``k``: a sample unlike its row) or too low (ties, or again an unrepresentative sample: the list
   overflowed) and the row goes ``triton_radix``'s way (``triton_radix.select_row``): the result
   never depends on the sample.

Why :func:`narrow` interpolates: every round is a block-wide reduction, and this kernel is
latency-bound, so rounds cost more than the arithmetic around them. A one-bit-a-round descent took
about 11 rounds for the seed and 19-20 for the finish on standard-normal rows; two probes a round
(where the rank would lie if the keys between the bracket's ends were spread evenly, and the
bracket's middle, packed into one reduction) take 4-7 for the seed and about 8 for the finish
(numpy model of both searches over the same keys). Ties at the k-th key leave only the halving: 18-28
rounds for a held row of 8192 with 16-4 distinct values, where the descent, too, ran to its last bits
(23-31). bf16 logits are searched on their keys' 16 high bits (:func:`search_keys`; the low 16 are zero
in every one): their full keys took up to 25 rounds, halving gaps no key falls into. A held row's first
round probes where the row's mean and deviation put the k-th largest (:func:`bracket`): about 5 rounds
instead of 10 on normal-looking rows of 8192.

Counted in sm_90 SASS by ``tools/topk_sass.py`` (a JIT launch's specialisation: 16-byte aligned row, column
stride 1; instructions per element a thread handles), defaults ``BLOCK`` 8192 over 8 warps: the compaction
loop 23 an element stored in place (rows of at least ``16 k``), 30 through ``tl.store`` (the load and key
mapping alone about 10; the 8-byte entry's store about 5 more than a position's); the seed 416 instructions a
thread plus 123 a round (about 5 rounds: 2.0 an element of a 128k row); the register finish over 8192 entries
1462 a thread plus 234 a round (about 8 rounds: 6.5 an element of a 128k row); a held row of 8192 1973 plus
235 a round (about 4 rounds after the peeled first). So about 32 an element in all at 128k and k 2048, with
one read of the row, against ``triton_radix``'s 79 + 64 (two reads) or 79 + 98 + 64 (three), counted the same
way. Short rows pay the fixed parts over fewer elements (fewer warps and smaller blocks are the tuner's to
try). Why the compaction looks as it does, each alternative counted the same way in a loop that loads,
compares and lists:

* one 1-D ``tl.cumsum`` over the block (as ``triton_radix``'s split pass): 66 (1024 a step), 62 (4096);
* ``[R, E]`` pieces of ``E`` contiguous elements, the scan along the piece: 51-56;
* ``[E, R]`` stripes (here: element ``(e, r)`` at ``start + e R + r``, ``R = 128 x num_warps``, so
  each thread's elements of a column are its own and the scan down them is register adds, one
  block scan of ``R`` column counts a step), the store addressed by the 2-D slots: 27-34 (Triton's
  coalescing gives the scattered store a layout of its own, so the keep masks and positions go
  through shared memory); comparing floats instead of mapped keys saves about 3; the same store
  issued from the registers that hold the entries (``triton_select.store`` with ``IN_PLACE``, inline
  PTX): 23-26, the loop NVIDIA GPUs run on rows of at least ``16 k`` (:func:`list_in_place_for`);
* the same with the store's pointers, values and mask flattened apart by
  ``tl.reshape(..., can_reorder=True)``: 17-20, but **wrong**: each flattened tensor may be ordered
  its own way, and on an H100 the pairing broke (list entries lost) where the interpreter, which
  never reorders, passed;
* a global ``tl.atomic_add`` slot per survivor: 35 (and the list order would not be deterministic).

Few rows, wide rows: each row is cut into ``split`` chunks over two launches (never when every row is
held whole: the chunks would list nothing, in a launch of their own). Every chunk's program
computes the same seed from the same sample and lists its chunk's survivors in its own part of the
scratch (counts per chunk); one program per row then gathers the parts in chunk order into one list
and finishes as above, or falls back to ``triton_radix.select_row`` over the row. A row held whole
lists nothing: the finish's program selects it. Deterministic: no atomics.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..triton_internals.interpreter import interpreted
from .knobs import HELD_ROW, SPACES
from .triton_radix import MAX_KEY, chunks_per_row, select_row
from .triton_select import SIGN, emit, lens_strides, open_row, order_keys, row_setup, search, store, write_selection
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
#: the most listed keys the finish holds in registers (a power of two); longer lists are searched
#: where they lie (``triton_select.search``)
REGISTER_LIST = 8192
#: the key of -inf: thresholds at or below it keep every non-NaN value
NEG_INF_KEY = tl.constexpr(-2139095041)
#: :func:`bracket`'s first probes, this many standard deviations either side of the normal estimate (0.1 took
#: fewer rounds than 0.2 and 0.35 in the model quoted there)
PROBE_SPREAD = tl.constexpr(0.1)


@triton.jit
def search_keys(x, live, row_ptr):
    """The keys :func:`narrow` searches for the values ``x`` of ``row_ptr``'s logits: ``order_keys``, the
    smallest int32 where not ``live``; for bf16 logits shifted down by the 16 bits that are zero in every
    one of their keys (the same order, still one key a value), so that no round halves a gap that no key
    can fall into: for a held row of 8192 standard-normal values and k 2048, 7-9 rounds shifted against
    8-25 (median 21) unshifted; fp32 7-12 (median 10) (numpy model of :func:`narrow`, 20 rows each)."""
    keys = order_keys(x)
    if row_ptr.dtype.element_ty == tl.bfloat16:
        keys = keys >> 16
    return tl.where(live, keys, SIGN)


@triton.jit
def row_key(key, row_ptr):
    """A :func:`search_keys` key as an fp32 one: for bf16 logits the least fp32 key of its bf16 keys (their low
    bits zero), so ``>=`` against it keeps the same values."""
    if row_ptr.dtype.element_ty == tl.bfloat16:
        key = key << 16
    return key


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
def _min_max(low_a, high_a, low_b, high_b):
    return tl.minimum(low_a, low_b), tl.maximum(high_a, high_b)


@triton.jit
def _bracket_combine(low_a, high_a, sum_a, squares_a, low_b, high_b, sum_b, squares_b):
    low, high = _min_max(low_a, high_a, low_b, high_b)
    return low, high, sum_a + sum_b, squares_a + squares_b


@triton.jit
def normal_quantile(p):
    """The standard normal quantile of ``p`` in ``[0, 1]`` (fp32): ``4.91 (p^0.14 - (1 - p)^0.14)``, within
    0.004 of it over ``[0.01, 0.99]`` and 0.05 at 0.001 and 0.999 (Tukey's lambda distribution)."""
    return 4.91 * (tl.exp2(0.14 * tl.log2(p)) - tl.exp2(0.14 * tl.log2(1.0 - p)))


@triton.jit
def bracket(keys, x, live, count, target, row_ptr, PROBES: tl.constexpr):
    """Where :func:`narrow` starts, from one reduction over the ``count`` live keys (:func:`search_keys` of the
    values ``x`` of ``row_ptr``'s logits): the bracket (the smallest live key and one past the largest, int64)
    and, with ``PROBES``, the first round's two probes (int64 keys; equal, so unused, without): the values
    ``PROBE_SPREAD`` standard deviations either side of where the ``target``-th largest would lie were the
    values normal (mean and deviation of the live ones), unless they lie either side of zero. The probes only
    steer the search, never its result: a normal-looking row starts with a bracket of about a tenth of its
    keys, where the bracket's own halving first spends about three rounds on the signs and exponents of floats
    no key is near. In a numpy model of :func:`narrow` (30-40 rows each; standard-normal rows and sums of 64
    heads' weighted ReLUs), a held row of 8192 at k 2048 takes 4.3-5.4 rounds against 9.9-10.7, rows of
    2100-7000 3.5-7.4 against 6.8-11.5; rows with one huge value and exponential rows about one round more.
    Probes either side of zero (a row of twice ``k``, the target at the mean) would leave a bracket across the
    sign, which the halving crosses one exponent a round (10.9 rounds against 10.0): those rows search as
    without. On an H100, same run, rows held whole ran 1.10-1.24x faster at 64-1024 rows of 8k (bf16 1.24x)
    and 0.98x at 64 x 4096 (``benchmarks/h100/topk_probes_ab.csv``). Only held rows use them
    (:func:`select_held_row`): the seed's window of ranks is wide, and stopping at the first key in it
    lengthened its lists (0.83-0.93x at 64-256 rows of 32k and 256 of 128k, 1.03x at 1024 x 32k); the list
    finish's keys are a distribution's upper tail, where they saved no time (0.99-1.01x at 32k-128k), and with
    ``BLOCK`` 2048 over 4 warps, whose register list already spills, 8k rows through the list ran about 5%
    slower."""
    lows = _flat(tl.where(live, keys, MAX_KEY), keys.numel)
    highs = _flat(keys, keys.numel)
    if PROBES:
        values = tl.where(live, x, 0.0)
        low, high, total, squares = tl.reduce(
            (lows, highs, _flat(values, values.numel), _flat(values * values, values.numel)), 0, _bracket_combine)
        live_count = count.to(tl.float32)
        mean = total / live_count
        deviation = tl.sqrt(tl.maximum(squares / live_count - mean * mean, 0.0))
        middle = mean + normal_quantile(1.0 - target.to(tl.float32) / live_count) * deviation
        probe_low = search_keys(middle - PROBE_SPREAD * deviation, True, row_ptr).to(tl.int64)
        probe_high = search_keys(middle + PROBE_SPREAD * deviation, True, row_ptr).to(tl.int64)
        probe_high = tl.where((probe_low < 0) & (probe_high >= 0), probe_low, probe_high)
    else:
        low, high = tl.reduce((lows, highs), 0, _min_max)
        probe_low = low.to(tl.int64)
        probe_high = probe_low
    return low.to(tl.int64), high.to(tl.int64) + 1, probe_low, probe_high


@triton.jit
def narrow(keys, low, low_count, high, high_count, rank_low, rank_high, probe_low, probe_high):
    """A key ``T`` with at least ``rank_low`` of the register-held 2-D ``keys`` ``>= T`` and at most
    ``rank_high`` (dead keys the smallest int32, below every live one), or, where ties leave no such
    key, the largest ``T`` with at least ``rank_low``. Starts from the bracket ``[low, high)`` (int64
    keys, ``low_count >= rank_low`` keys ``>= low``, ``high_count < rank_low`` ``>= high``) and narrows
    it with two probes a round, counted in one block reduction (the counts packed in 16-bit halves:
    at most 65535 keys). The first round probes ``probe_low`` and ``probe_high`` (:func:`bracket`; moved
    inside the bracket) when they differ; every other round the key where the middle of the ranks would
    lie if the keys between the bracket's ends were spread evenly (interpolation: about 8 rounds where
    keys are spread, against about 20 one bit a round) and the middle of the bracket, so a round at
    least halves it (at most 34 rounds, where ties or gaps defeat the interpolation). Returns ``T``
    (int64), its count and the rounds taken."""
    target = (rank_low + rank_high) // 2
    seeded = probe_low < probe_high
    rounds = low_count * 0
    while (low_count > rank_high) & (high - low > 1):
        width = high - low
        share = tl.div_rn((low_count - target).to(tl.float32), (low_count - high_count).to(tl.float32))
        guess = low + tl.minimum(tl.maximum((width.to(tl.float32) * share).to(tl.int64), 1), width - 1)
        middle = low + width // 2
        first = tl.where(seeded, tl.minimum(tl.maximum(probe_low, low + 1), high - 1), tl.minimum(guess, middle))
        second = tl.where(seeded, tl.minimum(tl.maximum(probe_high, low + 1), high - 1), tl.maximum(guess, middle))
        seeded = seeded & False
        # first <= second, so a key at or above second counts for both: 0x10001, one select where two
        # flags shifted and or-ed took more (a held row's round 235 instructions against 274, tools/topk_sass.py)
        both = _total(tl.where(keys >= second.to(tl.int32), 0x10001, (keys >= first.to(tl.int32)).to(tl.int32)))
        first_count = both & 0xFFFF
        second_count = both >> 16
        # counts fall as the probes rise: the bracket becomes [second, high), [first, second) or [low, first)
        second_kept = second_count >= rank_low
        first_kept = first_count >= rank_low
        high = tl.where(second_kept, high, tl.where(first_kept, second, first))
        high_count = tl.where(second_kept, high_count, tl.where(first_kept, second_count, first_count))
        low = tl.where(second_kept, second, tl.where(first_kept, first, low))
        low_count = tl.where(second_kept, second_count, tl.where(first_kept, first_count, low_count))
        rounds += 1
    return low, low_count, rounds


@triton.jit
def seed_threshold(row_ptr, stride_col, n, kk):
    """The seed ``T`` (a signed key) from the row's sample: a key with at least ``rank`` and at most
    ``rank + rank / 4`` sample keys ``>= T`` (:func:`narrow`; the largest with at least ``rank``
    where ties leave none)."""
    PIECE: tl.constexpr = SAMPLE // SAMPLE_PIECES
    pieces = tl.arange(0, SAMPLE_PIECES)[:, None]
    within = tl.arange(0, PIECE)[None, :]
    # pieces never overlap (n > SAMPLE); the first SAMPLE columns when the row is no longer
    positions = tl.where(n > SAMPLE, pieces * (n // SAMPLE_PIECES), pieces * PIECE) + within
    live = positions < n
    x = tl.load(row_ptr + positions.to(tl.int64) * stride_col, mask=live, other=0.0).to(tl.float32)
    keys = search_keys(x, live, row_ptr)  # dead ones below every real key (-inf's is above them)
    # the sample's expected hits among the row's top kk, plus four standard deviations and four:
    # fewer than kk listed is then rare at every k and length; the sample is the row when n <= SAMPLE
    hits = (kk * SAMPLE + n - 1) // n
    slack = tl.sqrt_rn(hits.to(tl.float32)).to(tl.int32) * 4 + 4  # sqrt_rn: the same on every device
    rank = tl.where(n > SAMPLE, tl.minimum(hits + slack, SAMPLE), kk)
    sampled = tl.minimum(n, SAMPLE)
    low, high, probe_low, probe_high = bracket(keys, x, live, sampled, rank, row_ptr, False)
    threshold, _, _ = narrow(keys, low, sampled, high, n * 0, rank, rank + rank // 4, probe_low, probe_high)
    return row_key(threshold.to(tl.int32), row_ptr)


@triton.jit
def threshold_value(threshold):
    """The fp32 value whose ``x >= value`` keeps the non-NaN keys ``>= threshold`` (and -0.0 with
    +0.0's key): the key's float, -inf for keys at or below -inf's, NaN above +inf's (keeps none)."""
    bits = tl.where(threshold < 0, threshold ^ MAX_KEY, threshold)
    bits = tl.where(threshold <= NEG_INF_KEY, NEG_INF_KEY ^ MAX_KEY, bits)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def pack(x, positions):
    """List entries: an fp32 value's bits above its position (int64), so the finish loads a listed
    value with its position, no gather from the row, and the compaction stores one 8-byte entry."""
    return (x.to(tl.int32, bitcast=True).to(tl.int64) << 32) | positions.to(tl.int64)


@triton.jit
def unpack(entries):
    """Positions and fp32 values of :func:`pack`'s entries."""
    return (entries & 0xFFFFFFFF).to(tl.int32), (entries >> 32).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _step_positions(start, STRIPES: tl.constexpr, BLOCK: tl.constexpr):
    """The positions of the step ``[start, start + BLOCK)`` as ``[STRIPES, BLOCK / STRIPES]`` stripes."""
    COLUMNS: tl.constexpr = BLOCK // STRIPES
    return start + tl.arange(0, STRIPES)[:, None] * COLUMNS + tl.arange(0, COLUMNS)[None, :]


@triton.jit
def _load_step(row_ptr, stride_col, start, last, MASKED: tl.constexpr, STRIPES: tl.constexpr, BLOCK: tl.constexpr):
    """The fp32 values of the step at ``start`` (below ``last`` when ``MASKED``, else unmasked)."""
    positions = _step_positions(start, STRIPES, BLOCK)
    if MASKED:
        return tl.load(row_ptr + positions.to(tl.int64) * stride_col, mask=positions < last, other=0.0).to(tl.float32)
    return tl.load(row_ptr + positions.to(tl.int64) * stride_col).to(tl.float32)


@triton.jit
def _list_step(x, start, last, value, listed, list_ptr, capacity, MASKED: tl.constexpr, STRIPES: tl.constexpr,
               BLOCK: tl.constexpr, IN_PLACE: tl.constexpr):
    """List the entries (:func:`pack`) of the step at ``start`` whose value ``x`` is ``>= value`` or NaN (below
    ``last`` when ``MASKED``), from entry ``listed`` on (none at or past ``capacity``); the new count."""
    positions = _step_positions(start, STRIPES, BLOCK)
    keep = (x >= value) | (x != x)
    if MASKED:
        keep = keep & (positions < last)
    flags = keep.to(tl.int32)
    column_counts = tl.sum(flags, axis=0)
    # a thread's stripes are one column's: this scan stays in registers; the block scan is one per column
    slots = (listed - 1 + tl.cumsum(column_counts, axis=0) - column_counts)[None, :] + tl.cumsum(flags, axis=0)
    store(list_ptr + slots, pack(x, positions), keep & (slots < capacity), IN_PLACE)
    return listed + tl.sum(column_counts, axis=0)


@triton.jit
def compact(row_ptr, stride_col, first, last, value, list_ptr, capacity, STRIPES: tl.constexpr, BLOCK: tl.constexpr,
            PREFETCH: tl.constexpr, IN_PLACE: tl.constexpr):
    """The positions of ``[first, last)`` whose value is ``>= value`` or NaN, with their values, listed
    from ``list_ptr`` (:func:`pack`, at most ``capacity``); returns how many there are (also past
    ``capacity``). Full steps load unmasked; with ``PREFETCH`` (:func:`prefetch_for`) each before its
    predecessor is listed: a program an SM (the finish's registers) has no other warps to hide a load's
    latency behind, so the next step's load is in flight while the scans and stores of this one run."""
    listed = first * 0
    full = last - (last - first) % BLOCK
    if first < full:
        if PREFETCH:
            x = _load_step(row_ptr, stride_col, first, last, False, STRIPES, BLOCK)
            for start in range(first, full - BLOCK, BLOCK):
                following = _load_step(row_ptr, stride_col, start + BLOCK, last, False, STRIPES, BLOCK)
                listed = _list_step(x, start, last, value, listed, list_ptr, capacity, False, STRIPES, BLOCK,
                                    IN_PLACE)
                x = following
            listed = _list_step(x, full - BLOCK, last, value, listed, list_ptr, capacity, False, STRIPES, BLOCK,
                                IN_PLACE)
        else:
            for start in range(first, full, BLOCK):
                x = _load_step(row_ptr, stride_col, start, last, False, STRIPES, BLOCK)
                listed = _list_step(x, start, last, value, listed, list_ptr, capacity, False, STRIPES, BLOCK,
                                    IN_PLACE)
    if full < last:
        x = _load_step(row_ptr, stride_col, full, last, True, STRIPES, BLOCK)
        listed = _list_step(x, full, last, value, listed, list_ptr, capacity, True, STRIPES, BLOCK, IN_PLACE)
    return listed


@triton.jit
def _select_held(keys, x, positions, live, count, kk, out_row, table_row, block_size, row_ptr,
                 HAS_TABLE: tl.constexpr, PROBES: tl.constexpr, IN_PLACE: tl.constexpr):
    """The top ``kk`` of ``count`` live keys held in registers as ``[stripes, columns]`` (entry
    ``(e, c)`` is ``e columns + c``: the compaction's layout, so the scans stay cheap; at most 65535
    entries; dead keys the smallest int32; ``x`` their values): the exact k-th largest key by :func:`narrow`
    (stopping once exactly ``kk`` keys are at or above the threshold; its first probes from :func:`bracket`
    with ``PROBES``), then the positions of those above it and of the first tied ones, in the order of the
    columns' scans, stored in place with ``IN_PLACE`` (``triton_select.store``, :func:`in_place_for`)."""
    low, high, probe_low, probe_high = bracket(keys, x, live, count, kk, row_ptr, PROBES)
    threshold, _, _ = narrow(keys, low, count, high, count * 0, kk, kk, probe_low, probe_high)
    threshold = threshold.to(tl.int32)
    # both ranks in one scan: above the threshold in the low half, tied in the high
    flags = (keys > threshold).to(tl.int32) | ((keys == threshold).to(tl.int32) << 16)
    column_counts = tl.sum(flags, axis=0)
    ranks = (tl.cumsum(column_counts, axis=0) - column_counts)[None, :] + tl.cumsum(flags, axis=0)
    gt = tl.sum(column_counts, axis=0) & 0xFFFF
    # the threshold's ties take the slots after every key above it, while slots are left
    slots = tl.where(keys > threshold, ranks & 0xFFFF, gt + (ranks >> 16)) - 1
    take = (keys >= threshold) & (slots < kk)
    emit(out_row, slots, positions, take, table_row, block_size, HAS_TABLE, IN_PLACE)


@triton.jit
def select_held_row(row_ptr, stride_col, n, kk, out_row, table_row, block_size, HAS_TABLE: tl.constexpr,
                    ROW: tl.constexpr, COLUMNS: tl.constexpr, IN_PLACE: tl.constexpr):
    """A row of ``n <= ROW`` visible positions selected whole in registers (:func:`_select_held`):
    one read, no sample, no list."""
    STRIPES: tl.constexpr = ROW // COLUMNS
    positions = tl.arange(0, STRIPES)[:, None] * COLUMNS + tl.arange(0, COLUMNS)[None, :]
    live = positions < n
    x = tl.load(row_ptr + positions.to(tl.int64) * stride_col, mask=live, other=0.0).to(tl.float32)
    _select_held(search_keys(x, live, row_ptr), x, positions, live, n, kk, out_row, table_row, block_size, row_ptr,
                 HAS_TABLE, True, IN_PLACE)


@triton.jit
def _finish_in_registers(row_ptr, kk, count, out_row, list_ptr, table_row, block_size, HAS_TABLE: tl.constexpr,
                         LIST: tl.constexpr, COLUMNS: tl.constexpr, IN_PLACE: tl.constexpr):
    """The top ``kk`` of ``count <= LIST`` listed entries (:func:`pack`: no gather from the row; ``row_ptr``
    only for its dtype, :func:`search_keys`), loaded into registers as ``[LIST / COLUMNS, COLUMNS]`` and
    selected there (:func:`_select_held`)."""
    STRIPES: tl.constexpr = LIST // COLUMNS
    entries = tl.arange(0, STRIPES)[:, None] * COLUMNS + tl.arange(0, COLUMNS)[None, :]
    live = entries < count
    positions, x = unpack(tl.load(list_ptr + entries, mask=live, other=0))
    _select_held(search_keys(x, live, row_ptr), x, positions, live, count, kk, out_row, table_row, block_size,
                 row_ptr, HAS_TABLE, False, IN_PLACE)


@triton.jit
def _unpack_positions(list_ptr, positions_ptr, count, BLOCK: tl.constexpr):
    """The positions of ``count`` packed entries as int32 from ``positions_ptr``, the same memory
    (its first half: each step overwrites only entries already loaded, by every thread once the
    barrier has passed)."""
    for start in range(0, count, BLOCK):
        entries = start + tl.arange(0, BLOCK)
        positions, _ = unpack(tl.load(list_ptr + entries, mask=entries < count, other=0))
        tl.debug_barrier()
        tl.store(positions_ptr + entries, positions, mask=entries < count)
    tl.debug_barrier()


@triton.jit
def finish(row_ptr, stride_col, n, kk, count, capacity, out_row, list_ptr, positions_ptr, table_row, block_size,
           HAS_TABLE: tl.constexpr, REGISTER_LIST: tl.constexpr, LIST_BLOCK: tl.constexpr, IN_PLACE: tl.constexpr):
    """Slots ``[0, kk)`` from the ``count`` listed entries at ``list_ptr`` when they hold the top ``kk``
    and fit (in registers when at most ``REGISTER_LIST``; else their positions are unpacked to
    ``positions_ptr``, the same memory as int32, and searched where they lie), else from
    ``triton_radix``'s path over the row (with ``positions_ptr`` for its list)."""
    if (count >= kk) & (count <= tl.minimum(capacity, REGISTER_LIST)):
        _finish_in_registers(row_ptr, kk, count, out_row, list_ptr, table_row, block_size, HAS_TABLE, REGISTER_LIST,
                             LIST_BLOCK, IN_PLACE)
    elif (count >= kk) & (count <= capacity):
        _unpack_positions(list_ptr, positions_ptr, count, LIST_BLOCK)
        threshold, gt = search(row_ptr, stride_col, positions_ptr, count, n * 0, n * 0, kk, 28, True, LIST_BLOCK)
        write_selection(row_ptr, stride_col, positions_ptr, count, threshold, n * 0, gt, kk - gt, out_row, table_row,
                        block_size, True, HAS_TABLE, LIST_BLOCK)
    else:
        select_row(row_ptr, stride_col, n, kk, capacity, out_row, positions_ptr, table_row, block_size, HAS_TABLE,
                   LIST_BLOCK)


@triton.jit
def _topk_sample_kernel(logits_ptr, lens_ptr, out_ptr, table_ptr, scratch_ptr, entries_ptr, stride_row, stride_col,
                        stride_lens_b, stride_lens_j, stride_out, stride_table, width, k, block_size, capacity,
                        NEXT_N: tl.constexpr, LENS_2D: tl.constexpr, HAS_TABLE: tl.constexpr, STRIPES: tl.constexpr,
                        REGISTER_LIST: tl.constexpr, LIST_BLOCK: tl.constexpr, ROW: tl.constexpr,
                        BLOCK: tl.constexpr, PREFETCH: tl.constexpr, IN_PLACE: tl.constexpr,
                        LIST_IN_PLACE: tl.constexpr, LISTS: tl.constexpr):
    """One program a row: rows of at most ``ROW`` visible positions whole in registers, longer ones
    seeded, compacted and finished (only with ``LISTS``: the width exceeds ``ROW``). ``entries_ptr`` (int64,
    ``capacity`` a row) and ``scratch_ptr`` (int32, ``2 capacity`` a row) are the same memory: the list, and the
    fallbacks' view of it."""
    row = tl.program_id(0)
    n, kk, row_ptr, out_row, table_row, positions_ptr = open_row(
        logits_ptr, lens_ptr, out_ptr, table_ptr, scratch_ptr, row, stride_row, stride_lens_b, stride_lens_j,
        stride_out, stride_table, width, k, block_size, 2 * capacity, NEXT_N, LENS_2D, HAS_TABLE, LIST_BLOCK)
    if (n > k) & (n <= ROW):
        select_held_row(row_ptr, stride_col, n, kk, out_row, table_row, block_size, HAS_TABLE, ROW, LIST_BLOCK,
                        IN_PLACE)
    elif LISTS:  # a constexpr: without it, the list path's registers are not allocated
        if n > k:
            list_ptr = entries_ptr + row.to(tl.int64) * capacity
            value = threshold_value(seed_threshold(row_ptr, stride_col, n, kk))
            count = compact(row_ptr, stride_col, n * 0, n, value, list_ptr, capacity, STRIPES, BLOCK, PREFETCH,
                            LIST_IN_PLACE)
            tl.debug_barrier()  # the list is read back by other threads of the program
            finish(row_ptr, stride_col, n, kk, count, capacity, out_row, list_ptr, positions_ptr, table_row,
                   block_size, HAS_TABLE, REGISTER_LIST, LIST_BLOCK, IN_PLACE)


# ----------------------------------------------------------------------------- split rows
@triton.jit
def _chunk_compact_kernel(logits_ptr, lens_ptr, parts_ptr, counts_ptr, stride_row, stride_col, stride_lens_b,
                          stride_lens_j, width, k, capacity, chunk, NEXT_N: tl.constexpr, LENS_2D: tl.constexpr,
                          SPLIT: tl.constexpr, STRIPES: tl.constexpr, ROW: tl.constexpr, BLOCK: tl.constexpr,
                          PREFETCH: tl.constexpr, LIST_IN_PLACE: tl.constexpr):
    """One chunk: the row's seed (every chunk computes the same), its survivors listed in its own part
    of the scratch (int64 entries), their count (past the part's capacity too) in ``counts``; nothing
    for a row of at most ``ROW`` visible positions (the finish holds it whole)."""
    row = tl.program_id(0)
    part = tl.program_id(1)
    _, n, kk = row_setup(lens_ptr, row, stride_lens_b, stride_lens_j, width, k, NEXT_N, LENS_2D)
    first = tl.minimum(part * chunk, n)
    last = tl.minimum(first + chunk, n)
    count = n * 0
    if (n > k) & (n > ROW):
        row_ptr = logits_ptr + row.to(tl.int64) * stride_row
        value = threshold_value(seed_threshold(row_ptr, stride_col, n, kk))
        part_ptr = parts_ptr + (row.to(tl.int64) * SPLIT + part) * capacity
        count = compact(row_ptr, stride_col, first, last, value, part_ptr, capacity, STRIPES, BLOCK, PREFETCH,
                        LIST_IN_PLACE)
    tl.store(counts_ptr + row * SPLIT + part, count)


@triton.jit
def _chunk_finish_kernel(logits_ptr, lens_ptr, out_ptr, table_ptr, parts_ptr, counts_ptr, scratch_ptr, entries_ptr,
                         stride_row, stride_col, stride_lens_b, stride_lens_j, stride_out, stride_table, width, k,
                         block_size, capacity, NEXT_N: tl.constexpr, LENS_2D: tl.constexpr, HAS_TABLE: tl.constexpr,
                         SPLIT: tl.constexpr, REGISTER_LIST: tl.constexpr, LIST_BLOCK: tl.constexpr,
                         ROW: tl.constexpr, IN_PLACE: tl.constexpr):
    """One program a row: the chunks' parts gathered in chunk order into one list, then :func:`finish`
    (``scratch_ptr`` and ``entries_ptr`` as in ``_topk_sample_kernel``); a row of at most ``ROW``
    visible positions is selected whole in registers instead."""
    row = tl.program_id(0)
    n, kk, row_ptr, out_row, table_row, positions_ptr = open_row(
        logits_ptr, lens_ptr, out_ptr, table_ptr, scratch_ptr, row, stride_row, stride_lens_b, stride_lens_j,
        stride_out, stride_table, width, k, block_size, 2 * capacity, NEXT_N, LENS_2D, HAS_TABLE, LIST_BLOCK)
    if (n > k) & (n <= ROW):
        select_held_row(row_ptr, stride_col, n, kk, out_row, table_row, block_size, HAS_TABLE, ROW, LIST_BLOCK,
                        IN_PLACE)
    elif n > k:
        list_ptr = entries_ptr + row.to(tl.int64) * capacity
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
        finish(row_ptr, stride_col, n, kk, total, capacity, out_row, list_ptr, positions_ptr, table_row, block_size,
               HAS_TABLE, REGISTER_LIST, LIST_BLOCK, IN_PLACE)


def capacity_for(k: int, width: int) -> int:
    """List entries a row gets: ``max(CAPACITY, 4 k)`` (lists run to about 2 k at k 2048 of 128k),
    at most the width."""
    return max(1, min(max(CAPACITY, 4 * k), width))


def register_list_for(k: int, width: int) -> int:
    """The finish's register-held list (a power of two): 1.1x the longest list the seed aims at for
    rows of ``width`` (its rank's hits and slack, 1.25x for the window, scaled to the row; the longest
    at full width), at most ``REGISTER_LIST``: a search round costs every held entry, so the margin is
    small (a row whose list overflows is searched where it lies). At k 2048: 4096 entries up to rows of
    about 45k (32k lists ran to 3726 on an H200), 8192 beyond. With 1.25x, 32k rows held 8192: 4096 ran
    1.12-1.14x faster at 64-256 rows of 32k on an H100 (``benchmarks/h100/topk_sample_ab.csv``)."""
    scale = max(width, SAMPLE.value) / SAMPLE.value
    expected = 1.25 * (k + 4 * math.sqrt(k * scale) + 5 * scale) if width > SAMPLE.value else 1.25 * k
    return min(REGISTER_LIST, triton.next_power_of_2(int(1.1 * expected)),
               triton.next_power_of_2(capacity_for(k, width)))


def prefetch_for(arch: str) -> bool:
    """Whether :func:`compact` loads each step before listing the previous one on ``arch`` (``"cpu"``,
    ``"sm_90"``, ``"gfx942"``, ...): on an H100 it ran 1.12-1.27x from 256 rows
    (``benchmarks/h100/topk_sample_ab.csv``); on CDNA it raises the compaction's VGPRs from 129 to 209
    (``tools/topk_amd_model.py``), so fewer waves a SIMD hide latency, the way CDNA hides it, and no AMD
    GPU has run it: AMD GPUs keep the loop that loads each step as it lists it. CPU tensors run the
    NVIDIA path (the interpreter checks both, ``tests/top_k/test_topk.py``)."""
    return not arch.startswith("gfx")


def in_place_for(arch: str) -> bool:
    """Whether the selection is stored in place (``triton_select.store``: inline PTX, each thread storing what it
    holds; the compaction's list too where it is sparse, :func:`list_in_place_for`) on ``arch`` (``"cpu"``,
    ``"cuda"``, ``"sm_90"``, ``"gfx942"``, ...): NVIDIA GPUs only; the interpreter runs no PTX, and AMD GPUs keep
    ``tl.store`` (no AMD GPU has measured what its layout costs)."""
    return arch == "cuda" or arch.startswith("sm_")


#: the narrowest rows, in multiples of ``k``, whose compaction lists in place (:func:`list_in_place_for`)
LIST_IN_PLACE_WIDTH = 16


def list_in_place_for(arch: str, k: int, width: int) -> bool:
    """Whether the compaction's list entries are stored in place too (:func:`in_place_for`): only on rows at least
    :data:`LIST_IN_PLACE_WIDTH` ``k`` wide, where the list is sparse. ``tl.store`` converts the entries to a layout
    whose adjacent threads hold the stripes of one column, then of the next, so a warp's store covers adjacent
    slots; in place, each thread holds four adjacent columns of one stripe, so a warp's store spreads over the
    slots of 128 columns. Where a third of the row is listed (8k columns at k 2048, ``BLOCK`` 2048 over 4 warps)
    that cost 0.78x at 1024 rows on an H100: the shared memory it saves does not pay for the spread; at 32k-128k
    (2-8% listed) it gained 1.07-1.38x at 64-256 rows (``benchmarks/h100/topk_list_in_place_ab.csv``)."""
    return in_place_for(arch) and width >= LIST_IN_PLACE_WIDTH * k


def held_row_for(block: int, width: int, columns: int) -> int:
    """The longest row selected whole in registers (a power of two, whole steps of ``columns``):
    ``HELD_ROW`` at most, no more than a compaction step (``block``: the knob that sizes the
    registers) or the row width needs, and one step of ``columns`` at least (so more than ``block``
    where ``block`` is shorter than a step's columns)."""
    return max(columns, min(HELD_ROW, block, triton.next_power_of_2(max(width, 1))))


#: what :func:`launch` may stop after, for ``tools/topk_phases.py``: the seed alone, or the seed and the compaction
PHASES = ("seed", "compaction")


def listed_positions(entries: torch.Tensor) -> torch.Tensor:
    """The int32 positions of :func:`pack`'s int64 list entries (a torch op, outside any timing)."""
    return (entries & 0xFFFFFFFF).to(torch.int32)


def launch(call: TopkCall, knobs: dict | None = None, split: int | None = None, stop_after: str | None = None):
    """Select ``call``'s rows with ``knobs`` (``BLOCK``, ``num_warps``, ``split``: ``knobs.py``;
    absent ones take the device's defaults, ``split`` ``triton_radix.split_for``); ``split`` given
    here overrides the knob. Without ``stop_after``, a call whose rows are all held whole
    (:func:`held_row_for`) runs split 1 whatever is asked: chunks would list nothing.

    ``stop_after`` (one of :data:`PHASES`) times a phase alone: the chunk kernel runs (with any
    ``split``, 1 included) with empty chunks (``"seed"``) or the row's (``"compaction"``), nothing
    is written to ``call.out``, and ``(parts, counts)`` come back: each chunk's list
    (``[rows, split, capacity]`` int64 entries of :func:`pack`; :func:`listed_positions` reads their
    positions) and its survivors (``[rows, split]``, also past the capacity; 0 for a row with at
    most ``k`` visible positions, and for a row held whole: :func:`held_row_for`)."""
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
    held_row = held_row_for(block, width, list_block)
    lists = width > held_row or stop_after is not None
    if not lists:  # every row is held whole by one program: chunks would list nothing, and no scratch is read
        split = 1
    entries = torch.empty((rows, capacity) if lists else (1, 1), dtype=torch.int64, device=device)
    scratch = entries.view(torch.int32)  # the same memory, 2 capacity int32 a row
    table = call.block_table if call.block_table is not None else call.lengths  # never read without one
    options = {} if on_cpu else {"num_warps": warps}
    run = (lambda kernel: interpreted(kernel)) if on_cpu else (lambda kernel: kernel)
    lens_args = lens_strides(call.lengths)
    common = dict(NEXT_N=call.next_n, LENS_2D=call.lens_2d, **options)
    strides = (call.logits.stride(0), call.logits.stride(1))
    has_table = call.block_table is not None
    arch = "gfx" if not on_cpu and torch.version.hip else device.type
    prefetch, in_place, list_in_place = prefetch_for(arch), in_place_for(arch), list_in_place_for(arch, call.k, width)
    if split == 1 and stop_after is None:
        run(_topk_sample_kernel)[(rows,)](
            call.logits, call.lengths, call.out, table, scratch, entries, *strides, *lens_args, call.out.stride(0),
            table.stride(0), width, call.k, call.block_size, capacity, HAS_TABLE=has_table, STRIPES=block // columns,
            REGISTER_LIST=register_list, LIST_BLOCK=list_block, ROW=held_row, BLOCK=block, PREFETCH=prefetch,
            IN_PLACE=in_place, LIST_IN_PLACE=list_in_place, LISTS=lists, **common)
        return None
    chunk = 0 if stop_after == "seed" else triton.cdiv(width, split)
    parts = torch.empty((rows, split, capacity), dtype=torch.int64, device=device)
    counts = torch.empty((rows, split), dtype=torch.int32, device=device)
    run(_chunk_compact_kernel)[(rows, split)](
        call.logits, call.lengths, parts, counts, *strides, *lens_args, width, call.k, capacity, chunk, SPLIT=split,
        STRIPES=block // columns, ROW=held_row, BLOCK=block, PREFETCH=prefetch,
        LIST_IN_PLACE=list_in_place, **common)
    if stop_after is not None:
        return parts, counts
    run(_chunk_finish_kernel)[(rows,)](
        call.logits, call.lengths, call.out, table, parts, counts, scratch, entries, *strides, *lens_args,
        call.out.stride(0), table.stride(0), width, call.k, call.block_size, capacity, HAS_TABLE=has_table, SPLIT=split,
        REGISTER_LIST=register_list, LIST_BLOCK=list_block, ROW=held_row, IN_PLACE=in_place, **common)
    return None
