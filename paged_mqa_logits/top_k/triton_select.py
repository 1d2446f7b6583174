"""The Triton pieces the top-k kernels are built from (``triton_portable``, ``triton_radix``,
``triton_sample``): key mapping, the list search and write, and the rows' prologue (:func:`open_row`).

Keys: each fp32 logit maps to an int32 whose signed order is the floats' order (negative floats
have their magnitude bits flipped; NaN of either sign becomes the largest key, above +inf).
Prefixes of the k-th largest key are kept as *unsigned* bit patterns (``key ^ SIGN``), so the
search fixes bits from the top, four at a time: for the 16 extensions of the bits known so far a
pass counts how many elements have a key ``>=`` each; the largest extension still counting
``>= kk`` fixes the next four bits, and the count of the one above it is the number of elements
strictly above the final threshold. All arithmetic is int32, so the interpreter computes what
GPUs do.

An element set is either a row's first ``count`` columns or, with ``USE_INDEX``, ``count``
positions listed at ``idx_ptr`` (the candidates a histogram pass compacted).
"""

from __future__ import annotations

import triton
import triton.language as tl

#: the smallest int32: turns an unsigned prefix into a signed key and back
SIGN = tl.constexpr(-2147483648)


@triton.jit
def order_keys(x):
    """int32 keys ordered as the fp32 values ``x``, NaN above +inf."""
    bits = x.to(tl.int32, bitcast=True)
    keys = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return tl.where(x != x, 0x7FFFFFFF, keys)


@triton.jit
def flag_mask(like, flag):
    """A scalar flag as a bool mask shaped like ``like``: ``tensor & scalar`` would do on a GPU, but
    Triton 3.9's interpreter turns a bool tensor ``&`` a bool scalar into an int32 array, which its
    masked loads and stores refuse."""
    return (like * 0 + flag.to(tl.int32)) != 0


@triton.jit
def element_keys(row_ptr, stride_col, idx_ptr, start, count, USE_INDEX: tl.constexpr, BLOCK: tl.constexpr):
    """Positions, keys and liveness of elements ``[start, start + BLOCK)`` of the set."""
    offsets = start + tl.arange(0, BLOCK)
    live = offsets < count
    if USE_INDEX:
        positions = tl.load(idx_ptr + offsets, mask=live, other=0)
    else:
        positions = offsets
    x = tl.load(row_ptr + positions.to(tl.int64) * stride_col, mask=live, other=0.0).to(tl.float32)
    return positions, order_keys(x), live


@triton.jit
def search(row_ptr, stride_col, idx_ptr, count, prefix, gt, kk, FIRST_SHIFT: tl.constexpr,
           USE_INDEX: tl.constexpr, BLOCK: tl.constexpr):
    """The ``kk``-th largest key of the set, given its bits above ``FIRST_SHIFT + 4`` (``prefix``,
    unsigned) and ``gt``, the count of elements above the prefix's range. Returns the threshold
    (a signed key) and the count of elements strictly above it."""
    digits = tl.arange(0, 16)
    for r in tl.static_range((FIRST_SHIFT + 4) // 4):
        shift = FIRST_SHIFT - 4 * r
        candidates = (prefix | (digits << shift)) ^ SIGN
        counts = tl.zeros([16], dtype=tl.int32)
        for start in range(0, count, BLOCK):
            _, keys, live = element_keys(row_ptr, stride_col, idx_ptr, start, count, USE_INDEX, BLOCK)
            hit = (keys[:, None] >= candidates[None, :]) & live[:, None]
            counts += tl.sum(hit.to(tl.int32), axis=0)
        digit = tl.sum((counts >= kk).to(tl.int32), axis=0) - 1  # counts fall with the digit; digit 0 holds
        above = tl.sum(tl.where(digits == digit + 1, counts, 0), axis=0)
        gt = tl.where(digit < 15, above, gt)
        prefix = prefix | (digit << shift)
    return prefix ^ SIGN, gt


@triton.jit
def store(pointers, values, mask, IN_PLACE: tl.constexpr = False):
    """``tl.store(pointers, values, mask=mask)`` of 32- or 64-bit integers; with ``IN_PLACE`` (NVIDIA GPUs
    only: PTX, not for the interpreter nor AMD) each thread stores the elements it holds. Triton gives every
    load and store a layout of its own, chosen for coalescing: where the slots are data-dependent (a
    selection's, a compaction's list) no layout coalesces them, and the pointers, values and mask went
    through shared memory to reach it (for a held row of 8192, 64 of the 83 shared stores and 4 barriers of
    the sm_90 SASS). Inline PTX keeps the layout the values have."""
    if IN_PLACE:
        if values.dtype.primitive_bitwidth == 64:
            tl.inline_asm_elementwise(
                "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p st.global.b64 [$1], $2; mov.b32 $0, 0; }", "=r,l,l,r",
                [pointers.to(tl.int64, bitcast=True), values, mask.to(tl.int32)], dtype=tl.int32, is_pure=False,
                pack=1)
        else:
            tl.inline_asm_elementwise(
                "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p st.global.b32 [$1], $2; mov.b32 $0, 0; }", "=r,l,r,r",
                [pointers.to(tl.int64, bitcast=True), values, mask.to(tl.int32)], dtype=tl.int32, is_pure=False,
                pack=1)
    else:
        tl.store(pointers, values, mask=mask)


@triton.jit
def emit(out_row, slots, positions, mask, table_row, block_size, HAS_TABLE: tl.constexpr,
         IN_PLACE: tl.constexpr = False):
    """Store ``positions`` (page-table transformed with ``HAS_TABLE``) at ``slots``, with ``IN_PLACE`` from
    the registers that hold them (:func:`store`; the page table's loads too)."""
    value = positions
    if HAS_TABLE:
        entries = table_row + positions // block_size
        if IN_PLACE:
            block = tl.inline_asm_elementwise(
                "{ .reg .pred p; setp.ne.b32 p, $2, 0; mov.b32 $0, 0; @p ld.global.b32 $0, [$1]; }", "=r,l,r",
                [entries.to(tl.int64, bitcast=True), mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
        else:
            block = tl.load(entries, mask=mask, other=0)
        value = block * block_size + positions % block_size
    store(out_row + slots, value, mask, IN_PLACE)


@triton.jit
def write_selection(row_ptr, stride_col, idx_ptr, count, threshold, slot_gt, slot_tie, ties, out_row, table_row,
                    block_size, USE_INDEX: tl.constexpr, HAS_TABLE: tl.constexpr, BLOCK: tl.constexpr):
    """Elements above ``threshold`` to ``slot_gt, slot_gt + 1, ...`` and the first ``ties`` equal to
    it to ``slot_tie, ...``, each in set order."""
    written_gt = slot_gt
    written_ties = count * 0
    for start in range(0, count, BLOCK):
        positions, keys, live = element_keys(row_ptr, stride_col, idx_ptr, start, count, USE_INDEX, BLOCK)
        is_gt = live & (keys > threshold)
        is_tie = live & (keys == threshold)
        rank_tie = written_ties + tl.cumsum(is_tie.to(tl.int32), axis=0) - 1
        take = is_gt | (is_tie & (rank_tie < ties))
        slots = tl.where(is_gt, written_gt + tl.cumsum(is_gt.to(tl.int32), axis=0) - 1, slot_tie + rank_tie)
        emit(out_row, slots, positions, take, table_row, block_size, HAS_TABLE)
        written_gt += tl.sum(is_gt.to(tl.int32), axis=0)
        written_ties += tl.sum(is_tie.to(tl.int32), axis=0)


@triton.jit
def fill_tail(out_row, kk, k, BLOCK: tl.constexpr):
    """``-1`` in slots ``[kk, k)``."""
    for start in range(0, k, BLOCK):
        slots = start + tl.arange(0, BLOCK)
        tl.store(out_row + slots, tl.full([BLOCK], -1, tl.int32), mask=(slots >= kk) & (slots < k))


@triton.jit
def row_setup(lens_ptr, row, stride_lens_b, stride_lens_j, width, k, NEXT_N: tl.constexpr, LENS_2D: tl.constexpr):
    """Sequence of the row, its visible length ``n`` (clamped into ``[0, width]``) and ``min(k, n)``."""
    b = row // NEXT_N
    j = row % NEXT_N
    if LENS_2D:
        n = tl.load(lens_ptr + b * stride_lens_b + j * stride_lens_j)
    else:
        n = tl.load(lens_ptr + b * stride_lens_b) - NEXT_N + 1 + j
    n = tl.minimum(tl.maximum(n, 0), width)
    return b, n, tl.minimum(n, k)


@triton.jit
def row_addresses(logits_ptr, out_ptr, table_ptr, row, b, stride_row, stride_out, stride_table):
    """The row's logits, its output row and its sequence's block-table row."""
    return (logits_ptr + row.to(tl.int64) * stride_row, out_ptr + row.to(tl.int64) * stride_out,
            table_ptr + b.to(tl.int64) * stride_table)


@triton.jit
def write_all(out_row, n, table_row, block_size, HAS_TABLE: tl.constexpr, BLOCK: tl.constexpr):
    """Every visible position, in column order (a row with at most ``k`` of them)."""
    for start in range(0, n, BLOCK):
        columns = start + tl.arange(0, BLOCK)
        emit(out_row, columns, columns, columns < n, table_row, block_size, HAS_TABLE)


@triton.jit
def open_row(logits_ptr, lens_ptr, out_ptr, table_ptr, scratch_ptr, row, stride_row, stride_lens_b, stride_lens_j,
             stride_out, stride_table, width, k, block_size, capacity, NEXT_N: tl.constexpr, LENS_2D: tl.constexpr,
             HAS_TABLE: tl.constexpr, BLOCK: tl.constexpr):
    """The prologue ``triton_radix``'s and ``triton_sample``'s one-program-a-row kernels share: the row's
    visible length ``n``, ``kk = min(k, n)``, its logits, output and block-table rows and its scratch list
    (``capacity`` entries); slots ``[kk, k)`` get ``-1`` (first: fewer values then live across a kernel's
    passes) and a row with ``n <= k`` is written whole here, so the caller selects only when ``n > k``."""
    b, n, kk = row_setup(lens_ptr, row, stride_lens_b, stride_lens_j, width, k, NEXT_N, LENS_2D)
    row_ptr, out_row, table_row = row_addresses(logits_ptr, out_ptr, table_ptr, row, b, stride_row, stride_out,
                                                stride_table)
    fill_tail(out_row, kk, k, BLOCK)
    if n <= k:
        write_all(out_row, n, table_row, block_size, HAS_TABLE, BLOCK)
    return n, kk, row_ptr, out_row, table_row, scratch_ptr + row.to(tl.int64) * capacity


def lens_strides(lengths) -> tuple[int, int]:
    return lengths.stride(0), lengths.stride(1) if lengths.dim() == 2 else 0
