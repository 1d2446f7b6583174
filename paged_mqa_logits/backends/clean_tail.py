"""``clean_logits``' ``-inf`` for the kernels that do not write it themselves.

Each query row ``r`` gets ``out[r, valid_end_r:max_model_len] = -inf`` and nothing before
``valid_end_r`` is touched: a uniform batch (no tail to write) costs one small launch instead
of a pass over the whole output, and a ragged batch writes only its tails, the bytes a fused
kernel writes too. The visible lengths are read on the device, so the call never syncs and is
captured in CUDA graphs. CPU tensors run the same kernel through the Triton interpreter.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..triton_internals.interpreter import interpreted
from .triton_portable import row_lengths

#: columns one program writes per step
BLOCK = 1024
#: programs per row: enough for a small batch to spread its long tails over the chip, few
#: enough that a big batch does not launch programs with nothing to write
TARGET_PROGRAMS = 1024
MAX_PARTS_PER_ROW = 64


@triton.jit
def clean_tail_kernel(out_ptr, lens_ptr, stride_out, stride_lens_b, stride_lens_j, width, visible_width,
                      NEXT_N: tl.constexpr, LENS_2D: tl.constexpr, BLOCK: tl.constexpr):
    """Program ``(r, part)`` writes ``-inf`` to blocks ``part, part + parts, ...`` of row
    ``r``'s tail; a row's visible length is the portable kernel's (the op's row rule)."""
    row = tl.program_id(0)
    part = tl.program_id(1)
    parts = tl.num_programs(1)
    b = row // NEXT_N
    j = row % NEXT_N
    seq_len = tl.load(lens_ptr + b.to(tl.int64) * stride_lens_b)  # 1-D: the sequence's length (2-D: unused)
    valid = row_lengths(lens_ptr, b.to(tl.int64), seq_len, j, stride_lens_b, stride_lens_j, NEXT_N, LENS_2D)
    valid = tl.minimum(valid, visible_width)
    row_ptr = out_ptr + row.to(tl.int64) * stride_out
    minus_inf = tl.full([BLOCK], float("-inf"), tl.float32)  # the store converts it to the logits dtype
    for first in range(valid + part * BLOCK, width, parts * BLOCK):
        cols = first + tl.arange(0, BLOCK)
        tl.store(row_ptr + cols, minus_inf, mask=cols < width)


def clean_tail(args) -> None:
    """``-inf`` over ``[valid_end, max_model_len)`` of every row of ``args.out``
    (``args``: the call's ``LaunchArgs``)."""
    rows, width = args.problem.rows, args.max_model_len
    if rows == 0 or width == 0:
        return
    lens = args.context_lens
    lens_2d = lens.dim() == 2
    parts = max(1, min(MAX_PARTS_PER_ROW, TARGET_PROGRAMS // rows, triton.cdiv(width, BLOCK)))
    kernel = interpreted(clean_tail_kernel) if args.out.device.type == "cpu" else clean_tail_kernel
    kernel[(rows, parts)](args.out, lens, args.out.stride(0), lens.stride(0), lens.stride(1) if lens_2d else 0,
                          width, args.visible_width, NEXT_N=args.problem.shape_key.next_n, LENS_2D=lens_2d,
                          BLOCK=BLOCK)
