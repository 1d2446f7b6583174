"""The compiled code of ``HeadSum=tensor`` in an sm_90 wgmma kernel, checked the same way for
every variant that runs it (``wgmma_pipes``, ``wgmma_ws``): the head-sum wgmma in the PTX, and in
each consumer's tile loop of the SASS one ``F2FP.RELU.BF16.F32.PACK_AB`` per two of its scores,
none of the fp32 head sum's max, fused multiply-adds or shuffles, no local memory."""

from __future__ import annotations

import re

from paged_mqa_logits.aot import sass
from paged_mqa_logits.backends.gluon import wgmma as wg


def tensor_head_sum_loops(record, problem, knobs: dict, tile_tokens: int) -> list:
    """Check ``record`` (a compiled ``HeadSum=tensor`` kernel of ``problem`` with ``knobs``, tiles
    of ``tile_tokens``) and return the consumers' tile loops it found (both wgmma kinds in them)."""
    groups = wg.problem_row_groups(problem, knobs["RowsPerMMA"])
    columns = max(8, 2 * groups[0][1])  # a hi and a lo column per row, at least wgmma's smallest N
    ptx = open(record.isa).read()
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{columns}k16\.f32\.bf16\.bf16 "
                     r"\{[^}]*\}, \{%r\d+,\s*%r\d+,\s*%r\d+,\s*%r\d+\}", ptx), record.name  # A: 4 registers
    code = sass.parse(open(record.isa[: -len(".ptx")] + ".sass").read())
    # a consumer's scores per thread and tile: its groups' columns x tile tokens over 128 threads
    scores = sum(n for _, n in groups[0::knobs["RowSplit"]]) * problem.shape_key.heads * tile_tokens // 128
    loops = [loop for loop in sass.innermost_loops_with(code, "QGMMA")
             if any(i.opcode.startswith("HGMMA") for i in loop)]
    for loop in loops:
        ops = [i.opcode for i in loop]
        assert sum(o.startswith("F2FP.RELU.BF16.F32.PACK_AB") for o in ops) == scores // 2, record.name
        assert not any(o.startswith(("FMNMX", "SHFL", "FFMA")) for o in ops), (record.name, sorted(set(ops)))
        assert not sass.local_memory(loop), record.name
    return loops
