"""``triton_radix`` backend: a histogram-first exact top-k for GPUs (CPU tensors run it through
the interpreter, for the tests).

Per row, two reads of it where the threshold bin is short, three where it is not:

1. **Coarse histogram.** The top ``HIST_BITS`` (8) bits of every visible key (sign and seven
   exponent bits of the fp32 value) go into a 256-bin histogram; suffix sums give the bin holding
   the k-th largest key, its count and the count above it.
2. **Fine histogram**, only when the coarse bin holds more than ``CAPACITY`` elements: a second
   read histograms the next 8 bits of the keys in that bin alone; the fine bin holding the k-th
   largest key (16 bits known) replaces the coarse one.
3. **Split.** A read writes every position above the threshold bin straight to the output and,
   when the bin holds at most ``CAPACITY`` elements, lists its positions in a per-row scratch
   buffer.
4. **Resolve.** The listed candidates alone are searched for the exact threshold
   (``triton_select.search``, four bits a round from the coarse bits: six rounds over the list,
   which is in L2) and written after the positions above the bin: those above the threshold, then
   the first tied ones.

A fine bin with more than ``CAPACITY`` elements skips the list: the search (on the 16 lower bits,
four rounds) and the write then run over the row, still exact. Rows with at most ``k`` visible
positions are written without reading the row.

Why 256 bins: ``tl.histogram``'s cost per element grows with its bins (counts at ``HIST_BITS``);
the one 4096-bin pass this replaced spent about 530 sm_90 instructions an element, a 256-bin pass
about 85, the split pass about 86 (its block-wide scan), from the SASS of this kernel.

Few rows, wide rows: one program per row would leave most SMs idle, so such calls split each row
into ``S`` chunks over four launches. Each chunk's program adds its coarse histogram into its
row's and stores its suffix sums; in the second launch each finds the coarse bin from the row's
histogram and, only if that bin overflows the list, does the same with the fine histogram of its
chunk. Each then finds the row's threshold bin and reads, from every earlier chunk's suffix sums
(the coarse level's, and the fine level's when used), how many of its elements lie above the bin
and in it, so it knows where its own positions go (deterministic: the only atomics are the integer
histogram adds); one program per row resolves the list. The result is the same as the
one-program path's, slot for slot.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..triton_internals.interpreter import interpreted
from .knobs import MAX_SPLIT, SPACES
from .triton_select import (SIGN, element_keys, emit, flag_mask, lens_strides, open_row, row_addresses, row_setup,
                            search, write_selection)
from .validate import TopkCall

#: the defaults of ``knobs.py``, on a GPU and for CPU tensors
BLOCK = SPACES["triton_radix"].gpu["BLOCK"]
CPU_BLOCK = SPACES["triton_radix"].cpu["BLOCK"]
#: threshold-bin candidates a row may list (int32 positions in the scratch buffer)
CAPACITY = 8192
#: Key bits one histogram pass resolves: the one place its width is set. ``tl.histogram``'s NVIDIA
#: lowering spends, per element, one ballot per bit and, for each 32 bins a lane owns, the AND of
#: the bit masks and a popcount, so its cost grows with the bins. Counted in the sm_90 SASS of a
#: loop that loads, keys and histograms 1024 elements a step (8 warps), instructions per element:
#: 4096 bins 517, 1024 bins 178, 256 bins 79, 64 bins 51; the load and key alone 14; a global
#: ``tl.atomic_add`` per element instead 20, whatever the bins, but its speed then rests on the
#: L2's rate for atomics to the same address, and logits crowd into few bins. 8 bits: two 256-bin
#: passes cost a third of one 4096-bin pass. A multiple of 4: the list search goes on four bits a
#: round below it.
_HIST_BITS = 8
HIST_BITS = tl.constexpr(_HIST_BITS)
NUM_BINS = tl.constexpr(1 << _HIST_BITS)
#: the unsigned bits of a key's coarse (first) level: what the list search starts from
COARSE_MASK = tl.constexpr(-(1 << (32 - _HIST_BITS)))
MAX_KEY = tl.constexpr(0x7FFFFFFF)
NUM_WARPS = SPACES["triton_radix"].gpu["num_warps"]
#: split rows into chunks when the rows are fewer than this many per SM ...
SPLIT_ROWS_PER_SM = 1
#: ... into at most MAX_SPLIT chunks (knobs.py), each at least MIN_CHUNK columns
MIN_CHUNK = 4096


@triton.jit
def _histogram(row_ptr, stride_col, first, last, low, high, LEVEL: tl.constexpr, BLOCK: tl.constexpr):
    """Histogram of key bits ``[32 - (LEVEL + 1) * HIST_BITS, 32 - LEVEL * HIST_BITS)`` of columns
    ``[first, last)``; level 1 counts only keys in ``[low, high]`` (the coarse threshold bin)."""
    hist = tl.zeros([NUM_BINS], dtype=tl.int32)
    for start in range(first, last, BLOCK):
        _, keys, live = element_keys(row_ptr, stride_col, row_ptr, start, last, False, BLOCK)
        if LEVEL > 0:
            live = live & (keys >= low) & (keys <= high)
        bins = ((keys ^ SIGN) >> (32 - (LEVEL + 1) * HIST_BITS)) & (NUM_BINS - 1)
        hist += tl.histogram(bins, NUM_BINS, mask=live)
    return hist


@triton.jit
def _threshold_bin(hist, n, kk):
    """The bin holding the ``kk``-th largest of the ``n`` counted keys, its count and the count above it."""
    bin_ids = tl.arange(0, NUM_BINS)
    at_or_above = n - tl.cumsum(hist, axis=0) + hist  # elements in bins >= b
    threshold_bin = tl.sum((at_or_above >= kk).to(tl.int32), axis=0) - 1
    in_bin = tl.sum(tl.where(bin_ids == threshold_bin, hist, 0), axis=0)
    above_bin = tl.sum(tl.where(bin_ids == threshold_bin, at_or_above, 0), axis=0) - in_bin
    return threshold_bin, in_bin, above_bin


@triton.jit
def _key_range(prefix, BITS: tl.constexpr):
    """The smallest and largest signed key whose top ``BITS`` unsigned bits are ``prefix``."""
    low = (prefix << (32 - BITS)) ^ SIGN
    return low, low | (((prefix * 0 + 1) << (32 - BITS)) - 1)


@triton.jit
def _fine_range(coarse_bin, fine_hist, in_coarse, above_coarse, kk):
    """The level-1 threshold bin inside the coarse one: its key range, count and the count above it."""
    fine_bin, in_bin, above_fine = _threshold_bin(fine_hist, in_coarse, kk - above_coarse)
    low, high = _key_range((coarse_bin << HIST_BITS) | fine_bin, 2 * HIST_BITS)
    return fine_bin, low, high, in_bin, above_coarse + above_fine


@triton.jit
def _threshold_range(row_ptr, stride_col, n, kk, capacity, BLOCK: tl.constexpr):
    """Key range ``[low, high]`` of the bin holding the ``kk``-th largest key, its count and the
    count above it: the coarse bin when its elements fit the list, else (a second pass, over the
    coarse bin's elements only) the fine bin inside it."""
    coarse = _histogram(row_ptr, stride_col, 0, n, 0, 0, 0, BLOCK)
    coarse_bin, in_bin, above_bin = _threshold_bin(coarse, n, kk)
    low, high = _key_range(coarse_bin, HIST_BITS)
    if in_bin > capacity:
        fine = _histogram(row_ptr, stride_col, 0, n, low, high, 1, BLOCK)
        _, low, high, in_bin, above_bin = _fine_range(coarse_bin, fine, in_bin, above_bin, kk)
    return low, high, in_bin, above_bin


@triton.jit
def _split(row_ptr, stride_col, first, last, low, high, written, listed, list_it, out_row, listed_ptr, table_row,
           block_size, HAS_TABLE: tl.constexpr, BLOCK: tl.constexpr):
    """Columns ``[first, last)``: keys above ``high`` to slots ``written, ...``; with ``list_it``,
    the positions of keys in ``[low, high]`` to list entries ``listed, ...``."""
    for start in range(first, last, BLOCK):
        positions, keys, live = element_keys(row_ptr, stride_col, row_ptr, start, last, False, BLOCK)
        above = live & (keys > high)
        inside = live & (keys >= low) & (keys <= high) & flag_mask(keys, list_it)
        # one scan for both ranks (BLOCK < 2**16): a scan over the block costs far more than a compare
        flags = above.to(tl.int32) | (inside.to(tl.int32) << 16)
        ranks = tl.cumsum(flags, axis=0)
        emit(out_row, written + (ranks & 0xFFFF) - 1, positions, above, table_row, block_size, HAS_TABLE)
        tl.store(listed_ptr + listed + (ranks >> 16) - 1, positions, mask=inside)
        counts = tl.sum(flags, axis=0)
        written += counts & 0xFFFF
        listed += counts >> 16


@triton.jit
def _resolve(row_ptr, stride_col, n, kk, low, in_bin, above_bin, capacity, out_row, listed_ptr, table_row,
             block_size, HAS_TABLE: tl.constexpr, BLOCK: tl.constexpr):
    """The exact threshold inside the threshold bin (key range from ``low``) and the write of the
    rest of the selection: from the list when it held the bin, else over the row. The list is
    searched from the coarse bits (whichever level its bin is: the fine bits are shared by all
    entries, so two more rounds over a short list find them); the row overflows only a fine bin."""
    if in_bin <= capacity:
        need = kk - above_bin
        threshold, gt = search(row_ptr, stride_col, listed_ptr, in_bin, (low ^ SIGN) & COARSE_MASK, n * 0, need,
                               32 - HIST_BITS - 4, True, BLOCK)
        write_selection(row_ptr, stride_col, listed_ptr, in_bin, threshold, above_bin, above_bin + gt, need - gt,
                        out_row, table_row, block_size, True, HAS_TABLE, BLOCK)
    else:
        threshold, gt = search(row_ptr, stride_col, row_ptr, n, low ^ SIGN, above_bin, kk, 32 - 2 * HIST_BITS - 4,
                               False, BLOCK)
        write_selection(row_ptr, stride_col, row_ptr, n, threshold, n * 0, gt, kk - gt, out_row, table_row,
                        block_size, False, HAS_TABLE, BLOCK)


@triton.jit
def select_row(row_ptr, stride_col, n, kk, capacity, out_row, listed_ptr, table_row, block_size,
               HAS_TABLE: tl.constexpr, BLOCK: tl.constexpr):
    """The whole one-program path for a row with ``n > k`` (slots ``[0, kk)``): histograms, split,
    resolve; ``listed_ptr`` is the row's scratch of ``capacity`` entries. ``triton_sample`` falls
    back to it."""
    low, high, in_bin, above_bin = _threshold_range(row_ptr, stride_col, n, kk, capacity, BLOCK)
    _split(row_ptr, stride_col, 0, n, low, high, n * 0, n * 0, in_bin <= capacity, out_row, listed_ptr, table_row,
           block_size, HAS_TABLE, BLOCK)
    tl.debug_barrier()  # the list is read back by other threads of the program
    _resolve(row_ptr, stride_col, n, kk, low, in_bin, above_bin, capacity, out_row, listed_ptr, table_row,
             block_size, HAS_TABLE, BLOCK)


@triton.jit
def _topk_radix_kernel(logits_ptr, lens_ptr, out_ptr, table_ptr, scratch_ptr, stride_row, stride_col, stride_lens_b,
                       stride_lens_j, stride_out, stride_table, width, k, block_size, capacity,
                       NEXT_N: tl.constexpr, LENS_2D: tl.constexpr, HAS_TABLE: tl.constexpr, BLOCK: tl.constexpr):
    n, kk, row_ptr, out_row, table_row, listed_ptr = open_row(
        logits_ptr, lens_ptr, out_ptr, table_ptr, scratch_ptr, tl.program_id(0), stride_row, stride_lens_b,
        stride_lens_j, stride_out, stride_table, width, k, block_size, capacity, NEXT_N, LENS_2D, HAS_TABLE, BLOCK)
    if n > k:
        select_row(row_ptr, stride_col, n, kk, capacity, out_row, listed_ptr, table_row, block_size, HAS_TABLE, BLOCK)


# ----------------------------------------------------------------------------- split rows
@triton.jit
def _chunk_histogram_kernel(logits_ptr, lens_ptr, total_ptr, suffix_ptr, stride_row, stride_col, stride_lens_b,
                            stride_lens_j, width, k, capacity, chunk, NEXT_N: tl.constexpr, LENS_2D: tl.constexpr,
                            LEVEL: tl.constexpr, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    """A chunk's level-``LEVEL`` histogram, added into its row's (``total``, zeroed by the caller),
    and its suffix sums (elements of the chunk in bins ``>= b``), from which later chunks read their
    offsets. Level 1 reads the row's level-0 histogram and counts nothing when the coarse bin fits
    the list."""
    row = tl.program_id(0)
    part = tl.program_id(1)
    _, n, kk = row_setup(lens_ptr, row, stride_lens_b, stride_lens_j, width, k, NEXT_N, LENS_2D)
    first = part * chunk
    last = tl.minimum(first + chunk, n)
    low = n * 0
    high = n * 0
    if LEVEL > 0:
        coarse_bin, in_bin, _ = _threshold_bin(_row_histogram(total_ptr, row, 0), n, kk)
        low, high = _key_range(coarse_bin, HIST_BITS)
        last = tl.where(in_bin > capacity, last, first)
    hist = _histogram(logits_ptr + row.to(tl.int64) * stride_row, stride_col, first, last, low, high, LEVEL, BLOCK)
    bin_ids = tl.arange(0, NUM_BINS)
    tl.atomic_add(total_ptr + (row.to(tl.int64) * 2 + LEVEL) * NUM_BINS + bin_ids, hist)
    suffix = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
    tl.store(suffix_ptr + ((row.to(tl.int64) * 2 + LEVEL) * SPLIT + part) * NUM_BINS + bin_ids, suffix)


@triton.jit
def _row_histogram(total_ptr, row, LEVEL: tl.constexpr):
    return tl.load(total_ptr + (row.to(tl.int64) * 2 + LEVEL) * NUM_BINS + tl.arange(0, NUM_BINS))


@triton.jit
def _row_threshold_range(total_ptr, row, n, kk, capacity):
    """:func:`_threshold_range` from the row's histograms (both levels), with the threshold bin of
    each level (the fine one ``-1`` when the coarse bin fits the list)."""
    coarse_bin, in_bin, above_bin = _threshold_bin(_row_histogram(total_ptr, row, 0), n, kk)
    low, high = _key_range(coarse_bin, HIST_BITS)
    fine_bin = n * 0 - 1
    if in_bin > capacity:
        fine_bin, low, high, in_bin, above_bin = _fine_range(coarse_bin, _row_histogram(total_ptr, row, 1), in_bin,
                                                             above_bin, kk)
    return coarse_bin, fine_bin, low, high, in_bin, above_bin


@triton.jit
def _earlier_chunks(suffix_ptr, row, part, threshold_bin, LEVEL: tl.constexpr, SPLIT: tl.constexpr):
    """Elements of the chunks before ``part`` in level-``LEVEL`` bins above ``threshold_bin`` and in
    it (zeros for bin ``-1``): two suffix sums of each."""
    parts = tl.arange(0, SPLIT)
    before = (parts < part) & flag_mask(parts, threshold_bin >= 0)
    suffix = suffix_ptr + ((row.to(tl.int64) * 2 + LEVEL) * SPLIT + parts) * NUM_BINS
    at_bin = tl.load(suffix + threshold_bin, mask=before, other=0)
    past_bin = tl.load(suffix + threshold_bin + 1, mask=before & flag_mask(parts, threshold_bin + 1 < NUM_BINS),
                       other=0)
    return tl.sum(past_bin, axis=0), tl.sum(at_bin - past_bin, axis=0)


@triton.jit
def _chunk_split_kernel(logits_ptr, lens_ptr, out_ptr, table_ptr, total_ptr, suffix_ptr, scratch_ptr, stride_row,
                        stride_col, stride_lens_b, stride_lens_j, stride_out, stride_table, width, k, block_size,
                        capacity, chunk, NEXT_N: tl.constexpr, LENS_2D: tl.constexpr, HAS_TABLE: tl.constexpr,
                        SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    part = tl.program_id(1)
    b, n, kk = row_setup(lens_ptr, row, stride_lens_b, stride_lens_j, width, k, NEXT_N, LENS_2D)
    if n > k:
        row_ptr, out_row, table_row = row_addresses(logits_ptr, out_ptr, table_ptr, row, b, stride_row, stride_out,
                                                    stride_table)
        coarse_bin, fine_bin, low, high, in_bin, _ = _row_threshold_range(total_ptr, row, n, kk, capacity)
        above_coarse, in_coarse = _earlier_chunks(suffix_ptr, row, part, coarse_bin, 0, SPLIT)
        above_fine, in_fine = _earlier_chunks(suffix_ptr, row, part, fine_bin, 1, SPLIT)
        listed = tl.where(fine_bin >= 0, in_fine, in_coarse)
        first = part * chunk
        _split(row_ptr, stride_col, first, tl.minimum(first + chunk, n), low, high, above_coarse + above_fine,
               listed, in_bin <= capacity, out_row, scratch_ptr + row.to(tl.int64) * capacity, table_row, block_size,
               HAS_TABLE, BLOCK)


@triton.jit
def _chunk_resolve_kernel(logits_ptr, lens_ptr, out_ptr, table_ptr, total_ptr, scratch_ptr, stride_row, stride_col,
                          stride_lens_b, stride_lens_j, stride_out, stride_table, width, k, block_size, capacity,
                          NEXT_N: tl.constexpr, LENS_2D: tl.constexpr, HAS_TABLE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    n, kk, row_ptr, out_row, table_row, listed_ptr = open_row(
        logits_ptr, lens_ptr, out_ptr, table_ptr, scratch_ptr, row, stride_row, stride_lens_b, stride_lens_j,
        stride_out, stride_table, width, k, block_size, capacity, NEXT_N, LENS_2D, HAS_TABLE, BLOCK)
    if n > k:
        _, _, low, _, in_bin, above_bin = _row_threshold_range(total_ptr, row, n, kk, capacity)
        _resolve(row_ptr, stride_col, n, kk, low, in_bin, above_bin, capacity, out_row, listed_ptr, table_row,
                 block_size, HAS_TABLE, BLOCK)


def split_for(rows: int, width: int, sms: int) -> int:
    """Chunks per row: 1 when the rows fill the GPU, else enough (a power of two, at most
    ``MAX_SPLIT``, chunks of at least ``MIN_CHUNK`` columns) to approach one program per SM."""
    if rows >= SPLIT_ROWS_PER_SM * sms:
        return 1
    split = 1
    while split < MAX_SPLIT and rows * split * 2 <= sms and width // (split * 2) >= MIN_CHUNK:
        split *= 2
    return split


def chunks_per_row(call: TopkCall, knobs: dict, split: int | None) -> int:
    """``split`` if given, else the ``split`` knob, else 1 on CPU and :func:`split_for` on a GPU: the
    rule both row-splitting backends (this one and ``triton_sample``) launch with."""
    split = split or knobs.get("split")
    device = call.logits.device
    if split is not None or device.type == "cpu":
        return split or 1
    rows, width = call.logits.shape
    return split_for(rows, width, torch.cuda.get_device_properties(device).multi_processor_count)


def launch(call: TopkCall, knobs: dict | None = None, split: int | None = None) -> None:
    """Select ``call``'s rows with ``knobs`` (``BLOCK``, ``num_warps``, ``split``: ``knobs.py``;
    absent ones take the device's defaults, ``split`` :func:`split_for`); ``split`` given
    here overrides the knob."""
    knobs = knobs or {}
    rows, width = call.logits.shape
    if rows == 0:
        return
    device = call.logits.device
    on_cpu = device.type == "cpu"
    split = chunks_per_row(call, knobs, split)
    capacity = max(1, min(CAPACITY, width))
    scratch = torch.empty((rows, capacity), dtype=torch.int32, device=device)
    table = call.block_table if call.block_table is not None else call.lengths  # never read without one
    options = {} if on_cpu else {"num_warps": knobs.get("num_warps", NUM_WARPS)}
    block = knobs.get("BLOCK") or (CPU_BLOCK if on_cpu else BLOCK)
    run = (lambda kernel: interpreted(kernel)) if on_cpu else (lambda kernel: kernel)
    lens = (call.lengths, *lens_strides(call.lengths))
    common = dict(NEXT_N=call.next_n, LENS_2D=call.lens_2d, BLOCK=block, **options)
    strides = (call.logits.stride(0), call.logits.stride(1))
    if split == 1:
        run(_topk_radix_kernel)[(rows,)](
            call.logits, call.lengths, call.out, table, scratch, *strides, *lens[1:], call.out.stride(0),
            table.stride(0), width, call.k, call.block_size, capacity, HAS_TABLE=call.block_table is not None,
            **common)
        return
    chunk = triton.cdiv(width, split)
    # both levels' histograms per row, and per chunk their suffix sums
    total = torch.zeros((rows, 2, NUM_BINS.value), dtype=torch.int32, device=device)
    suffix = torch.empty((rows, 2, split, NUM_BINS.value), dtype=torch.int32, device=device)
    for level in (0, 1):
        run(_chunk_histogram_kernel)[(rows, split)](
            call.logits, call.lengths, total, suffix, *strides, *lens[1:], width, call.k, capacity, chunk,
            LEVEL=level, SPLIT=split, **common)
    head = (call.logits, call.lengths, call.out, table, total)
    tail = (scratch, *strides, *lens[1:], call.out.stride(0), table.stride(0), width, call.k, call.block_size, capacity)
    has_table = call.block_table is not None
    run(_chunk_split_kernel)[(rows, split)](*head, suffix, *tail, chunk, HAS_TABLE=has_table, SPLIT=split, **common)
    run(_chunk_resolve_kernel)[(rows,)](*head, *tail, HAS_TABLE=has_table, **common)
