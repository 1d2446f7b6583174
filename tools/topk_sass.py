"""Instructions per element of the top-k kernels' passes over a row, counted in their sm_90 SASS
(cross-compiled here; no GPU needed): the numbers docs/TOPK.md and the kernels' docstrings quote.

``python tools/topk_sass.py``

Each kernel is compiled as a JIT launch of a k 2048 call specialises it: the logits, output and
scratch pointers 16-byte aligned, the row stride a multiple of 16, the column stride 1, one query a
sequence, no page table. Every loop (a backward branch's span, nested loops' instructions counted
in each loop that holds them) is listed with its instructions, whether it loads (``LDG``) and
stores (``STG``) global memory, and its instructions per element: the loop's instructions over the
elements a thread handles per iteration (``BLOCK / (32 num_warps)``), the count docs/TOPK.md uses.
A loop whose step is not ``BLOCK`` (the list search's ``[BLOCK, 16]`` rounds, the fill,
``narrow``'s rounds) is listed all the same; the passes over the row are the loops the docstrings
name. ``triton_sample``'s seed, register finish and held row are also compiled alone: their
instructions outside ``narrow``'s round loop, and a round's, per element a thread reads of a row of 8k,
32k and 128k (the held row: of its own length; the seed's rounds are the first loop listed for the kernel).
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from paged_mqa_logits.aot import sass  # noqa: E402
from paged_mqa_logits.aot.compile import compile_spec  # noqa: E402
from paged_mqa_logits.backends.base import CompileSpec  # noqa: E402
from paged_mqa_logits.top_k import triton_radix, triton_sample  # noqa: E402

#: parameters a JIT launch sees 16-divisible (pointers, the row stride) or equal to 1 (column stride)
_ALIGNED = ("logits_ptr", "out_ptr", "scratch_ptr", "entries_ptr", "row_ptr", "stride_row", "stride_out")
#: pointers that are not int32 ones
_POINTER_TYPES = {"logits_ptr": "*fp32", "row_ptr": "*fp32", "entries_ptr": "*i64"}
_ONE = ("stride_col",)


def compile_sm90(kernel, constexprs: dict, num_warps: int) -> tuple[list[sass.Instruction], object]:
    """The kernel's SASS as a launch specialises it (module docstring), and its compile record."""
    order = list(inspect.signature(kernel.fn).parameters)
    constexprs = dict(constexprs, **{name: 1 for name in _ONE if name in order})
    signature = {name: "constexpr" if name in constexprs else _POINTER_TYPES[name] if name in _POINTER_TYPES else
                 "*i32" if name.endswith("_ptr") else "i32" for name in order}
    attrs = {(order.index(name),): [["tt.divisibility", 16]] for name in _ALIGNED if name in order}
    spec = CompileSpec(name="topk_sass", backend="topk", arch="sm_90", knobs={}, fn=kernel, signature=signature,
                       constexprs=constexprs, options={"num_warps": num_warps}, gluon=False, attrs=attrs)
    with tempfile.TemporaryDirectory() as out:
        record = compile_spec(spec, out)
        if not record.ok:
            raise RuntimeError(record.error)
        with open(os.path.join(out, spec.name + ".sass")) as f:
            return sass.parse(f.read()), record


def loop_rows(code: list[sass.Instruction], elements_per_thread: float) -> list[str]:
    rows = []
    for loop in sass.loops(code):
        ops = {i.opcode.split(".")[0] for i in loop}
        memory = "+".join(op for op in ("LDG", "STG", "BAR") if op in ops) or "-"
        rows.append(f"  loop at {loop[0].address:#07x}: {len(loop):5d} instructions, {memory:11s} "
                    f"{len(loop) / elements_per_thread:7.2f} per element")
    return rows


@triton.jit
def _seed_only(row_ptr, out_ptr, n, kk):
    tl.store(out_ptr, triton_sample.seed_threshold(row_ptr, 1, n, kk))


@triton.jit
def _finish_only(row_ptr, entries_ptr, out_ptr, kk, count, REGISTER_LIST: tl.constexpr, COLUMNS: tl.constexpr,
                 IN_PLACE: tl.constexpr):
    triton_sample._finish_in_registers(row_ptr, kk, count, out_ptr, entries_ptr, out_ptr, 1, False, REGISTER_LIST,
                                       COLUMNS, IN_PLACE)


@triton.jit
def _held_only(row_ptr, out_ptr, n, kk, ROW: tl.constexpr, COLUMNS: tl.constexpr, IN_PLACE: tl.constexpr):
    triton_sample.select_held_row(row_ptr, 1, n, kk, out_ptr, out_ptr, 1, False, ROW, COLUMNS, IN_PLACE)


def _outside_and_round(code: list[sass.Instruction]) -> tuple[int, int]:
    """A search-only kernel's instructions outside its loops, and its longest loop's (``narrow``'s round, the only
    loop of the finish and the held row)."""
    loops = sass.loops(code)
    return len(code) - sum(len(loop) for loop in loops), max(len(loop) for loop in loops)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--block", type=int, default=triton_sample.BLOCK, help="triton_sample's BLOCK")
    parser.add_argument("--warps", type=int, default=triton_sample.NUM_WARPS, help="triton_sample's num_warps")
    parser.add_argument("--register-list", type=int, default=triton_sample.REGISTER_LIST,
                        help="triton_sample's REGISTER_LIST (the launcher's pick for k 2048 at 32k-160k columns)")
    parser.add_argument("--width", type=int, default=131072,
                        help="the row width the launch is for: rows up to min(8192, BLOCK, width) are held whole")
    a = parser.parse_args(argv)
    common = {"NEXT_N": 1, "LENS_2D": False, "HAS_TABLE": False}
    warps = triton_radix.NUM_WARPS
    code, record = compile_sm90(triton_radix._topk_radix_kernel, dict(common, BLOCK=triton_radix.BLOCK), warps)
    print(f"triton_radix (BLOCK {triton_radix.BLOCK}, {warps} warps, {record.vgprs} registers): the coarse "
          "histogram, the fine one and the split pass are the first three loops that load")
    print("\n".join(loop_rows(code, triton_radix.BLOCK / (32 * warps))))
    warps, block = a.warps, a.block
    in_place = triton_sample.in_place_for("sm_90")
    columns = triton_sample.LANE_ELEMENTS * 32 * warps
    row = triton_sample.held_row_for(block, a.width, columns)
    constexprs = dict(common, BLOCK=block, STRIPES=max(1, block // columns), LIST_BLOCK=columns,
                      REGISTER_LIST=a.register_list, ROW=row, PREFETCH=triton_sample.prefetch_for("sm_90"),
                      IN_PLACE=in_place, LIST_IN_PLACE=triton_sample.list_in_place_for("sm_90", 2048, a.width),
                      LISTS=a.width > row)
    code, record = compile_sm90(triton_sample._topk_sample_kernel, constexprs, warps)
    print(f"triton_sample (BLOCK {block}, {warps} warps, {record.vgprs} registers, local memory "
          f"{record.scratch_bytes} bytes): in order, the seed's search round (no load), the compaction (the "
          "first loop that loads and stores), the register finish's search round (no "
          f"load), then the list search and write and triton_radix's fallback; loops stepping {columns} at a time "
          "read at "
          f"{columns / block:.3g}x, a search round over {a.register_list} held entries is "
          f"{a.register_list / (32 * warps):.0f} entries a thread")
    print("\n".join(loop_rows(code, block / (32 * warps))))
    code, _ = compile_sm90(_seed_only, {}, warps)
    threads = 32 * warps
    straight = len(code) - sum(len(loop) for loop in sass.loops(code))
    print(f"triton_sample's seed alone: {straight} instructions a thread outside its search loop; per element "
          "of a row of " + ", ".join(f"{n // 1024}k: {straight * threads / n:.2f}" for n in (8192, 32768, 131072)))
    finish_constexprs = {"REGISTER_LIST": a.register_list, "COLUMNS": columns, "IN_PLACE": in_place}
    straight, round_ = _outside_and_round(compile_sm90(_finish_only, finish_constexprs, warps)[0])
    print(f"triton_sample's register finish alone ({a.register_list} entries): {straight} instructions a thread "
          f"outside its loops, {round_} a search round; per element of a row of "
          + ", ".join(f"{n // 1024}k: {straight * threads / n:.2f} + {round_ * threads / n:.2f} a round"
                      for n in (8192, 32768, 131072)))
    held_constexprs = {"ROW": row, "COLUMNS": columns, "IN_PLACE": in_place}
    straight, round_ = _outside_and_round(compile_sm90(_held_only, held_constexprs, warps)[0])
    print(f"triton_sample's held row alone ({row} positions): {straight} instructions a thread outside its loop "
          f"(its load, the bracket and the first-round probes, the first round, the scans and the write), {round_} "
          f"a search round; per element of a row of {row}: {straight * threads / row:.2f} + "
          f"{round_ * threads / row:.2f} a round")
    return 0


if __name__ == "__main__":
    sys.exit(main())
