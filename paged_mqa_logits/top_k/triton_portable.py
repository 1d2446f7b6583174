"""``triton`` backend: one exact radix select per row in plain Triton (any Triton GPU; CPU tensors
run the same source through the interpreter).

One program per row. Each fp32 logit maps to an int32 key whose signed order is the floats'
order (negative floats have their magnitude bits flipped; NaN of either sign becomes the largest
key, above +inf). The k-th largest key ``T`` is found four bits at a time, from the top: a pass
over the row counts, for the 16 candidates that extend the bits known so far, how many keys are
``>=`` each; the largest candidate still counting ``>= kk`` (``kk = min(k, visible)``) fixes the
next four bits. Eight passes find ``T`` exactly, and the same counts give ``gt``, the number of
keys strictly above ``T``. A last pass writes the ``gt`` positions above ``T`` to slots
``[0, gt)`` and the first ``kk - gt`` positions equal to ``T`` after them, in column order, then
``-1`` up to ``k``. Columns at or past a row's length are masked off every load.

All arithmetic is int32 (keys, counts, positions), so the interpreter computes what GPUs do.
Nine reads of the row make this the portable floor, not the fast path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..triton_internals.interpreter import interpreted
from .validate import TopkCall

#: columns one step of a pass reads
BLOCK = 512
CPU_BLOCK = 64
#: the smallest int32, the key order's bottom (as a signed bias for unsigned prefixes)
SIGN = tl.constexpr(-2147483648)
RADIX_BITS = tl.constexpr(4)


@triton.jit
def _order_keys(x):
    """int32 keys ordered as the fp32 values ``x``, NaN above +inf."""
    bits = x.to(tl.int32, bitcast=True)
    keys = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return tl.where(x != x, 0x7FFFFFFF, keys)


@triton.jit
def _row_keys(row_ptr, columns, n, stride_col):
    visible = columns < n
    x = tl.load(row_ptr + columns.to(tl.int64) * stride_col, mask=visible, other=0.0).to(tl.float32)
    return _order_keys(x), visible


@triton.jit
def _topk_row_kernel(logits_ptr, lens_ptr, out_ptr, table_ptr, stride_row, stride_col, stride_lens_b, stride_lens_j,
                     stride_out, stride_table, width, k, block_size,
                     NEXT_N: tl.constexpr, LENS_2D: tl.constexpr, HAS_TABLE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    b = row // NEXT_N
    j = row % NEXT_N
    if LENS_2D:
        n = tl.load(lens_ptr + b * stride_lens_b + j * stride_lens_j)
    else:
        n = tl.load(lens_ptr + b * stride_lens_b) - NEXT_N + 1 + j
    n = tl.minimum(tl.maximum(n, 0), width)
    kk = tl.minimum(n, k)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    digits = tl.arange(0, 16)

    # the k-th largest key, four bits a pass; `prefix` holds its bits as an unsigned pattern
    prefix = n * 0
    gt = n * 0
    for r in tl.static_range(32 // RADIX_BITS):
        shift: tl.constexpr = 32 - RADIX_BITS * (r + 1)
        candidates = (prefix | (digits << shift)) ^ SIGN  # signed keys of the 16 extensions
        counts = tl.zeros([16], dtype=tl.int32)
        for start in range(0, n, BLOCK):
            keys, visible = _row_keys(row_ptr, start + tl.arange(0, BLOCK), n, stride_col)
            hit = (keys[:, None] >= candidates[None, :]) & visible[:, None]
            counts += tl.sum(hit.to(tl.int32), axis=0)
        digit = tl.sum((counts >= kk).to(tl.int32), axis=0) - 1  # counts fall with the digit; digit 0 always holds
        above = tl.sum(tl.where(digits == digit + 1, counts, 0), axis=0)
        gt = tl.where(digit < 15, above, gt)  # keys above the chosen digit's range
        prefix = prefix | (digit << shift)
    threshold = prefix ^ SIGN
    ties = kk - gt

    out_row = out_ptr + row.to(tl.int64) * stride_out
    written_gt = n * 0
    written_ties = n * 0
    for start in range(0, n, BLOCK):
        columns = start + tl.arange(0, BLOCK)
        keys, visible = _row_keys(row_ptr, columns, n, stride_col)
        is_gt = visible & (keys > threshold)
        is_tie = visible & (keys == threshold)
        rank_gt = written_gt + tl.cumsum(is_gt.to(tl.int32), axis=0) - 1
        rank_tie = written_ties + tl.cumsum(is_tie.to(tl.int32), axis=0) - 1
        take_tie = is_tie & (rank_tie < ties)
        slot = tl.where(is_gt, rank_gt, gt + rank_tie)
        value = columns
        if HAS_TABLE:
            block = tl.load(table_ptr + b.to(tl.int64) * stride_table + columns // block_size, mask=is_gt | take_tie,
                            other=0)
            value = block * block_size + columns % block_size
        tl.store(out_row + slot, value, mask=is_gt | take_tie)
        written_gt += tl.sum(is_gt.to(tl.int32), axis=0)
        written_ties += tl.sum(is_tie.to(tl.int32), axis=0)
    for start in range(0, k, BLOCK):
        slots = start + tl.arange(0, BLOCK)
        tl.store(out_row + slots, tl.full([BLOCK], -1, tl.int32), mask=(slots >= kk) & (slots < k))


def launch(call: TopkCall) -> None:
    rows, width = call.logits.shape
    if rows == 0:
        return
    on_cpu = call.logits.device.type == "cpu"
    kernel = interpreted(_topk_row_kernel) if on_cpu else _topk_row_kernel
    lens = call.lengths
    lens_strides = (lens.stride(0), lens.stride(1) if lens.dim() == 2 else 0)
    table = call.block_table if call.block_table is not None else lens  # never read without one
    kernel[(rows,)](
        call.logits, lens, call.out, table, call.logits.stride(0), call.logits.stride(1), *lens_strides,
        call.out.stride(0), table.stride(0), width, call.k, call.block_size,
        NEXT_N=call.next_n, LENS_2D=call.lens_2d, HAS_TABLE=call.block_table is not None,
        BLOCK=CPU_BLOCK if on_cpu else BLOCK,
    )
