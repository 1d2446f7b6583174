"""``triton`` backend: one exact radix select per row in plain Triton (any Triton GPU; CPU tensors
run the same source through the interpreter).

One program per row: eight passes find the k-th largest key four bits at a time
(``triton_select.search``), a last pass writes the positions above it, then the first tied ones
(``write_selection``), then ``-1`` up to ``k``. Columns at or past a row's length are masked off
every load. Nine reads of the row make this the portable floor; ``triton_radix`` is the fast path.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..triton_internals.interpreter import interpreted
from .knobs import SPACES
from .triton_select import fill_tail, lens_strides, row_addresses, row_setup, search, write_selection
from .validate import TopkCall

#: elements one step of a pass reads (the [BLOCK, 16] comparison of a search round): the
#: defaults of ``knobs.py``, on a GPU and for CPU tensors
BLOCK = SPACES["triton"].gpu["BLOCK"]
CPU_BLOCK = SPACES["triton"].cpu["BLOCK"]


@triton.jit
def _topk_row_kernel(logits_ptr, lens_ptr, out_ptr, table_ptr, stride_row, stride_col, stride_lens_b, stride_lens_j,
                     stride_out, stride_table, width, k, block_size,
                     NEXT_N: tl.constexpr, LENS_2D: tl.constexpr, HAS_TABLE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    b, n, kk = row_setup(lens_ptr, row, stride_lens_b, stride_lens_j, width, k, NEXT_N, LENS_2D)
    row_ptr, out_row, table_row = row_addresses(logits_ptr, out_ptr, table_ptr, row, b, stride_row, stride_out,
                                                stride_table)
    threshold, gt = search(row_ptr, stride_col, row_ptr, n, n * 0, n * 0, kk, 28, False, BLOCK)
    write_selection(row_ptr, stride_col, row_ptr, n, threshold, n * 0, gt, kk - gt, out_row, table_row, block_size,
                    False, HAS_TABLE, BLOCK)
    fill_tail(out_row, kk, k, BLOCK)


def launch(call: TopkCall, knobs: dict | None = None) -> None:
    """Select ``call``'s rows with ``knobs`` (``BLOCK``, ``num_warps``: ``knobs.py``; absent ones
    take the device's defaults)."""
    knobs = knobs or {}
    rows, width = call.logits.shape
    if rows == 0:
        return
    on_cpu = call.logits.device.type == "cpu"
    block = knobs.get("BLOCK") or (CPU_BLOCK if on_cpu else BLOCK)
    options = {} if on_cpu or "num_warps" not in knobs else {"num_warps": knobs["num_warps"]}
    kernel = interpreted(_topk_row_kernel) if on_cpu else _topk_row_kernel
    table = call.block_table if call.block_table is not None else call.lengths  # never read without one
    kernel[(rows,)](
        call.logits, call.lengths, call.out, table, call.logits.stride(0), call.logits.stride(1),
        *lens_strides(call.lengths), call.out.stride(0), table.stride(0), width, call.k, call.block_size,
        NEXT_N=call.next_n, LENS_2D=call.lens_2d, HAS_TABLE=call.block_table is not None,
        BLOCK=block, **options,
    )
