"""``triton_radix`` backend: a histogram-first exact top-k for GPUs (CPU tensors run it through
the interpreter, for the tests).

Over each row twice instead of nine times:

1. **Histogram.** The top 12 bits of every visible key (sign, exponent, three mantissa bits of
   the fp32 value) go into a 4096-bin histogram; suffix sums give the bin ``B`` holding the
   k-th largest key and the count above it.
2. **Split.** A second read writes every position of a bin above ``B`` straight to the output and
   lists the positions in ``B`` in a per-row scratch buffer (``CAPACITY`` entries).
3. **Resolve.** The listed candidates alone are searched for the exact threshold on the 20 lower
   bits (``triton_select.search``, five rounds over the list, which is in L2) and written
   after the positions above ``B``: those above the threshold, then the first tied ones.

A threshold bin with more than ``CAPACITY`` elements skips the list: the search and the write
then run over the row (five more reads), still exact. Rows with at most ``k`` visible positions
are written without reading the row.

Few rows, wide rows: one program per row would leave most SMs idle, so such calls split each row
into ``S`` chunks over three launches. Each chunk's program adds its histogram into its row's and
stores its suffix sums; each then finds ``B`` from the row's histogram and reads, from every
earlier chunk's suffix sums, how many of its elements lie above ``B`` and in ``B``, so it knows
where its own positions go (deterministic: the only atomics are the integer histogram adds); one
program per row resolves the list. The result is the same as the one-program path's, slot for slot.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..triton_internals.interpreter import interpreted
from .knobs import MAX_SPLIT, SPACES
from .triton_select import (SIGN, element_keys, emit, fill_tail, flag_mask, lens_strides, row_addresses, row_setup,
                            search, write_selection)
from .validate import TopkCall

#: the defaults of ``knobs.py``, on a GPU and for CPU tensors
BLOCK = SPACES["triton_radix"].gpu["BLOCK"]
CPU_BLOCK = SPACES["triton_radix"].cpu["BLOCK"]
#: threshold-bin candidates a row may list (int32 positions in the scratch buffer)
CAPACITY = 8192
HIST_BITS = tl.constexpr(12)
NUM_BINS = tl.constexpr(4096)
NUM_WARPS = SPACES["triton_radix"].gpu["num_warps"]
#: split rows into chunks when the rows are fewer than this many per SM ...
SPLIT_ROWS_PER_SM = 1
#: ... into at most MAX_SPLIT chunks (knobs.py), each at least MIN_CHUNK columns
MIN_CHUNK = 4096


@triton.jit
def _bins(keys):
    return ((keys ^ SIGN) >> (32 - HIST_BITS)) & (NUM_BINS - 1)


@triton.jit
def _histogram(row_ptr, stride_col, first, last, BLOCK: tl.constexpr):
    """Histogram of the top key bits of columns ``[first, last)``."""
    hist = tl.zeros([NUM_BINS], dtype=tl.int32)
    for start in range(first, last, BLOCK):
        _, keys, live = element_keys(row_ptr, stride_col, row_ptr, start, last, False, BLOCK)
        hist += tl.histogram(_bins(keys), NUM_BINS, mask=live)
    return hist


@triton.jit
def _threshold_bin(hist, n, kk):
    """The bin holding the ``kk``-th largest key, its element count and the count above it."""
    bin_ids = tl.arange(0, NUM_BINS)
    at_or_above = n - tl.cumsum(hist, axis=0) + hist  # elements in bins >= b
    threshold_bin = tl.sum((at_or_above >= kk).to(tl.int32), axis=0) - 1
    in_bin = tl.sum(tl.where(bin_ids == threshold_bin, hist, 0), axis=0)
    above_bin = tl.sum(tl.where(bin_ids == threshold_bin, at_or_above, 0), axis=0) - in_bin
    return threshold_bin, in_bin, above_bin


@triton.jit
def _split(row_ptr, stride_col, first, last, threshold_bin, written, listed, list_it, out_row, listed_ptr, table_row,
           block_size, HAS_TABLE: tl.constexpr, BLOCK: tl.constexpr):
    """Columns ``[first, last)``: bins above the threshold bin to slots ``written, ...``; with
    ``list_it``, the threshold bin's positions to list entries ``listed, ...``."""
    for start in range(first, last, BLOCK):
        positions, keys, live = element_keys(row_ptr, stride_col, row_ptr, start, last, False, BLOCK)
        bins = _bins(keys)
        above = live & (bins > threshold_bin)
        inside = live & (bins == threshold_bin) & flag_mask(bins, list_it)
        emit(out_row, written + tl.cumsum(above.to(tl.int32), axis=0) - 1, positions, above, table_row, block_size,
             HAS_TABLE)
        tl.store(listed_ptr + listed + tl.cumsum(inside.to(tl.int32), axis=0) - 1, positions, mask=inside)
        written += tl.sum(above.to(tl.int32), axis=0)
        listed += tl.sum(inside.to(tl.int32), axis=0)


@triton.jit
def _resolve(row_ptr, stride_col, n, kk, threshold_bin, in_bin, above_bin, capacity, out_row, listed_ptr, table_row,
             block_size, HAS_TABLE: tl.constexpr, BLOCK: tl.constexpr):
    """The exact threshold inside the threshold bin and the write of the rest of the selection:
    from the list when it held the bin, else over the row."""
    prefix = threshold_bin << (32 - HIST_BITS)
    if in_bin <= capacity:
        need = kk - above_bin
        threshold, gt = search(row_ptr, stride_col, listed_ptr, in_bin, prefix, n * 0, need, 32 - HIST_BITS - 4,
                               True, BLOCK)
        write_selection(row_ptr, stride_col, listed_ptr, in_bin, threshold, above_bin, above_bin + gt, need - gt,
                        out_row, table_row, block_size, True, HAS_TABLE, BLOCK)
    else:
        threshold, gt = search(row_ptr, stride_col, row_ptr, n, prefix, above_bin, kk, 32 - HIST_BITS - 4, False,
                               BLOCK)
        write_selection(row_ptr, stride_col, row_ptr, n, threshold, n * 0, gt, kk - gt, out_row, table_row,
                        block_size, False, HAS_TABLE, BLOCK)


@triton.jit
def _write_all(out_row, n, table_row, block_size, HAS_TABLE: tl.constexpr, BLOCK: tl.constexpr):
    """Every visible position, in column order (a row with at most ``k`` of them)."""
    for start in range(0, n, BLOCK):
        columns = start + tl.arange(0, BLOCK)
        emit(out_row, columns, columns, columns < n, table_row, block_size, HAS_TABLE)


@triton.jit
def _topk_radix_kernel(logits_ptr, lens_ptr, out_ptr, table_ptr, scratch_ptr, stride_row, stride_col, stride_lens_b,
                       stride_lens_j, stride_out, stride_table, width, k, block_size, capacity,
                       NEXT_N: tl.constexpr, LENS_2D: tl.constexpr, HAS_TABLE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    b, n, kk = row_setup(lens_ptr, row, stride_lens_b, stride_lens_j, width, k, NEXT_N, LENS_2D)
    row_ptr, out_row, table_row = row_addresses(logits_ptr, out_ptr, table_ptr, row, b, stride_row, stride_out,
                                                stride_table)
    listed_ptr = scratch_ptr + row.to(tl.int64) * capacity
    if n <= k:
        _write_all(out_row, n, table_row, block_size, HAS_TABLE, BLOCK)
    else:
        threshold_bin, in_bin, above_bin = _threshold_bin(_histogram(row_ptr, stride_col, 0, n, BLOCK), n, kk)
        _split(row_ptr, stride_col, 0, n, threshold_bin, n * 0, n * 0, in_bin <= capacity, out_row, listed_ptr,
               table_row, block_size, HAS_TABLE, BLOCK)
        tl.debug_barrier()  # the list is read back by other threads of the program
        _resolve(row_ptr, stride_col, n, kk, threshold_bin, in_bin, above_bin, capacity, out_row, listed_ptr,
                 table_row, block_size, HAS_TABLE, BLOCK)
    fill_tail(out_row, kk, k, BLOCK)


# ----------------------------------------------------------------------------- split rows
@triton.jit
def _chunk_histogram_kernel(logits_ptr, lens_ptr, total_ptr, suffix_ptr, stride_row, stride_col, stride_lens_b,
                            stride_lens_j, width, k, chunk, NEXT_N: tl.constexpr, LENS_2D: tl.constexpr,
                            SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    """A chunk's histogram, added into its row's (``total``, zeroed by the caller), and its suffix
    sums (elements of the chunk in bins ``>= b``), from which later chunks read their offsets."""
    row = tl.program_id(0)
    part = tl.program_id(1)
    _, n, _ = row_setup(lens_ptr, row, stride_lens_b, stride_lens_j, width, k, NEXT_N, LENS_2D)
    first = part * chunk
    hist = _histogram(logits_ptr + row.to(tl.int64) * stride_row, stride_col, first, tl.minimum(first + chunk, n),
                      BLOCK)
    bin_ids = tl.arange(0, NUM_BINS)
    tl.atomic_add(total_ptr + row.to(tl.int64) * NUM_BINS + bin_ids, hist)
    suffix = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
    tl.store(suffix_ptr + (row.to(tl.int64) * SPLIT + part) * NUM_BINS + bin_ids, suffix)


@triton.jit
def _row_threshold_bin(total_ptr, row, n, kk):
    return _threshold_bin(tl.load(total_ptr + row.to(tl.int64) * NUM_BINS + tl.arange(0, NUM_BINS)), n, kk)


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
        threshold_bin, in_bin, above_bin = _row_threshold_bin(total_ptr, row, n, kk)
        # the earlier chunks' elements above the threshold bin and in it: two of their suffix sums each
        parts = tl.arange(0, SPLIT)
        before = parts < part
        suffix = suffix_ptr + (row.to(tl.int64) * SPLIT + parts) * NUM_BINS
        at_bin = tl.load(suffix + threshold_bin, mask=before, other=0)
        past_bin = tl.load(suffix + threshold_bin + 1, mask=before & flag_mask(parts, threshold_bin + 1 < NUM_BINS),
                           other=0)
        first = part * chunk
        _split(row_ptr, stride_col, first, tl.minimum(first + chunk, n), threshold_bin, tl.sum(past_bin, axis=0),
               tl.sum(at_bin - past_bin, axis=0), in_bin <= capacity, out_row,
               scratch_ptr + row.to(tl.int64) * capacity, table_row, block_size, HAS_TABLE, BLOCK)


@triton.jit
def _chunk_resolve_kernel(logits_ptr, lens_ptr, out_ptr, table_ptr, total_ptr, scratch_ptr, stride_row, stride_col,
                          stride_lens_b, stride_lens_j, stride_out, stride_table, width, k, block_size, capacity,
                          NEXT_N: tl.constexpr, LENS_2D: tl.constexpr, HAS_TABLE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    b, n, kk = row_setup(lens_ptr, row, stride_lens_b, stride_lens_j, width, k, NEXT_N, LENS_2D)
    row_ptr, out_row, table_row = row_addresses(logits_ptr, out_ptr, table_ptr, row, b, stride_row, stride_out,
                                                stride_table)
    if n <= k:
        _write_all(out_row, n, table_row, block_size, HAS_TABLE, BLOCK)
    else:
        threshold_bin, in_bin, above_bin = _row_threshold_bin(total_ptr, row, n, kk)
        _resolve(row_ptr, stride_col, n, kk, threshold_bin, in_bin, above_bin, capacity, out_row,
                 scratch_ptr + row.to(tl.int64) * capacity, table_row, block_size, HAS_TABLE, BLOCK)
    fill_tail(out_row, kk, k, BLOCK)


def split_for(rows: int, width: int, sms: int) -> int:
    """Chunks per row: 1 when the rows fill the GPU, else enough (a power of two, at most
    ``MAX_SPLIT``, chunks of at least ``MIN_CHUNK`` columns) to approach one program per SM."""
    if rows >= SPLIT_ROWS_PER_SM * sms:
        return 1
    split = 1
    while split < MAX_SPLIT and rows * split * 2 <= sms and width // (split * 2) >= MIN_CHUNK:
        split *= 2
    return split


def launch(call: TopkCall, knobs: dict | None = None, split: int | None = None) -> None:
    """Select ``call``'s rows with ``knobs`` (``BLOCK``, ``num_warps``, ``split``: ``knobs.py``;
    absent ones take the device's defaults, ``split`` :func:`split_for`); ``split`` given
    here overrides the knob."""
    knobs = knobs or {}
    split = split or knobs.get("split")
    rows, width = call.logits.shape
    if rows == 0:
        return
    device = call.logits.device
    on_cpu = device.type == "cpu"
    if split is None:
        split = 1 if on_cpu else split_for(rows, width, torch.cuda.get_device_properties(device).multi_processor_count)
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
    total = torch.zeros((rows, 4096), dtype=torch.int32, device=device)
    suffix = torch.empty((rows, split, 4096), dtype=torch.int32, device=device)
    run(_chunk_histogram_kernel)[(rows, split)](
        call.logits, call.lengths, total, suffix, *strides, *lens[1:], width, call.k, chunk, SPLIT=split, **common)
    head = (call.logits, call.lengths, call.out, table, total)
    tail = (scratch, *strides, *lens[1:], call.out.stride(0), table.stride(0), width, call.k, call.block_size, capacity)
    has_table = call.block_table is not None
    run(_chunk_split_kernel)[(rows, split)](*head, suffix, *tail, chunk, HAS_TABLE=has_table, SPLIT=split, **common)
    run(_chunk_resolve_kernel)[(rows,)](*head, *tail, HAS_TABLE=has_table, **common)
