"""``triton_radix`` backend: a histogram-first exact top-k for GPUs (CPU tensors run it through
the interpreter, for the tests).

One program per row, over the row twice instead of nine times:

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
write them all without reading the row. Not yet split across programs: a batch of few long rows
leaves SMs idle.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..triton_internals.interpreter import interpreted
from .triton_select import SIGN, element_keys, emit, fill_tail, lens_strides, row_setup, search, write_selection
from .validate import TopkCall

BLOCK = 1024
CPU_BLOCK = 64
#: threshold-bin candidates a row may list (int32 positions in the scratch buffer)
CAPACITY = 8192
HIST_BITS = tl.constexpr(12)
NUM_BINS = tl.constexpr(4096)
NUM_WARPS = 8


@triton.jit
def _bins(keys):
    return ((keys ^ SIGN) >> (32 - HIST_BITS)) & (NUM_BINS - 1)


@triton.jit
def _topk_radix_kernel(logits_ptr, lens_ptr, out_ptr, table_ptr, scratch_ptr, stride_row, stride_col, stride_lens_b,
                       stride_lens_j, stride_out, stride_table, width, k, block_size, capacity,
                       NEXT_N: tl.constexpr, LENS_2D: tl.constexpr, HAS_TABLE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    b, n, kk = row_setup(lens_ptr, row, stride_lens_b, stride_lens_j, width, k, NEXT_N, LENS_2D)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    out_row = out_ptr + row.to(tl.int64) * stride_out
    table_row = table_ptr + b.to(tl.int64) * stride_table
    listed_ptr = scratch_ptr + row.to(tl.int64) * capacity
    zero = n * 0
    if n <= k:  # every visible position is selected: nothing to read
        for start in range(0, n, BLOCK):
            columns = start + tl.arange(0, BLOCK)
            emit(out_row, columns, columns, columns < n, table_row, block_size, HAS_TABLE)
    else:
        hist = tl.zeros([NUM_BINS], dtype=tl.int32)
        for start in range(0, n, BLOCK):
            _, keys, live = element_keys(row_ptr, stride_col, row_ptr, start, n, False, BLOCK)
            hist += tl.histogram(_bins(keys), NUM_BINS, mask=live)
        bin_ids = tl.arange(0, NUM_BINS)
        at_or_above = n - tl.cumsum(hist, axis=0) + hist  # elements in bins >= b
        threshold_bin = tl.sum((at_or_above >= kk).to(tl.int32), axis=0) - 1
        in_bin = tl.sum(tl.where(bin_ids == threshold_bin, hist, 0), axis=0)
        above_bin = tl.sum(tl.where(bin_ids == threshold_bin, at_or_above, 0), axis=0) - in_bin
        prefix = threshold_bin << (32 - HIST_BITS)
        if in_bin <= capacity:
            written = zero
            listed = zero
            for start in range(0, n, BLOCK):
                positions, keys, live = element_keys(row_ptr, stride_col, row_ptr, start, n, False, BLOCK)
                bins = _bins(keys)
                above = live & (bins > threshold_bin)
                inside = live & (bins == threshold_bin)
                emit(out_row, written + tl.cumsum(above.to(tl.int32), axis=0) - 1, positions, above, table_row,
                     block_size, HAS_TABLE)
                tl.store(listed_ptr + listed + tl.cumsum(inside.to(tl.int32), axis=0) - 1, positions, mask=inside)
                written += tl.sum(above.to(tl.int32), axis=0)
                listed += tl.sum(inside.to(tl.int32), axis=0)
            tl.debug_barrier()  # the list is read back by other threads of the program
            need = kk - above_bin
            threshold, gt = search(row_ptr, stride_col, listed_ptr, in_bin, prefix, zero, need, 32 - HIST_BITS - 4,
                                   True, BLOCK)
            write_selection(row_ptr, stride_col, listed_ptr, in_bin, threshold, above_bin, above_bin + gt, need - gt,
                            out_row, table_row, block_size, True, HAS_TABLE, BLOCK)
        else:
            threshold, gt = search(row_ptr, stride_col, row_ptr, n, prefix, above_bin, kk, 32 - HIST_BITS - 4, False,
                                   BLOCK)
            write_selection(row_ptr, stride_col, row_ptr, n, threshold, zero, gt, kk - gt, out_row, table_row,
                            block_size, False, HAS_TABLE, BLOCK)
    fill_tail(out_row, kk, k, BLOCK)


def launch(call: TopkCall) -> None:
    rows, width = call.logits.shape
    if rows == 0:
        return
    on_cpu = call.logits.device.type == "cpu"
    kernel = interpreted(_topk_radix_kernel) if on_cpu else _topk_radix_kernel
    capacity = max(1, min(CAPACITY, width))
    scratch = torch.empty((rows, capacity), dtype=torch.int32, device=call.logits.device)
    table = call.block_table if call.block_table is not None else call.lengths  # never read without one
    options = {} if on_cpu else {"num_warps": NUM_WARPS}
    kernel[(rows,)](
        call.logits, call.lengths, call.out, table, scratch, call.logits.stride(0), call.logits.stride(1),
        *lens_strides(call.lengths), call.out.stride(0), table.stride(0), width, call.k, call.block_size, capacity,
        NEXT_N=call.next_n, LENS_2D=call.lens_2d, HAS_TABLE=call.block_table is not None,
        BLOCK=CPU_BLOCK if on_cpu else BLOCK, **options,
    )
