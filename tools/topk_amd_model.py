"""An issue-and-bandwidth estimate of exact top-k on gfx942 / gfx950: our ``triton_radix`` and
``triton_sample`` kernels (cross-compiled here, their hot loops counted from the AMDGCN ISA)
against AITER's HIP ``top_k_per_row_decode`` (its per-element work counted by reading its
source; it is not compiled here). No AMD GPU is available: every number this writes is an **estimate, not a
measurement**.

``python tools/topk_amd_model.py [--out benchmarks/amd/topk_estimate.csv]``

The model, per pass over a row (every pass reads the visible fp32 row, 4 bytes an element):

* **memory**: ``bytes / min(HBM bandwidth, active CUs x 64 B/clock)`` (the chip's peak HBM
  bandwidth and clock: ``paged_mqa_logits/arch.py``; the CU's vector-memory path:
  ``tools/cdna_cycles.py``); the second read of a row is charged to HBM too (no cache credit,
  the same for both kernels);
* **issue**: the loop's busiest pipe (VALU, SALU, LDS, VMEM; ``cdna_cycles.profile``'s rules,
  all four SIMDs of a CU running the loop) per element, times the elements, over the active CUs;
* a pass costs the larger of the two; the output write (4 bytes a slot) is added. What follows
  the full reads (both kernels resolve the threshold bucket from a short list) is left out.
  ``triton_radix`` is charged three reads of every row (coarse histogram, fine histogram, split:
  :func:`radix_loops`), ``triton_sample`` one (its compaction: :func:`sample_loops`; its seed and
  list finish are left out, though on sm_90 they add about half as many instructions again at 128k
  columns and more at 8k), AITER's two.

Active CUs: AITER's decode path runs one 1024-thread block per row (``min(rows, CUs)``); ours runs
``rows x split`` programs (``triton_radix.split_for``), one per CU at its occupancy.

AITER's kernel, as read from its source: 12-bit digits on both parts (3 passes of 12, 12 and 8
bits), one block per row; pass 0 reads the row and adds every element's digit into an LDS
histogram (one ``ds_add_u32`` per element); pass 1 reads the row again, keeps the elements whose
12-bit prefix is the threshold bucket's (histogramming their next digit and compacting them)
and writes those above it; the last pass reads only the compacted bucket. So it reads a row
twice; ours reads it twice where its 256-bin coarse bucket fits its list, else three times. Its per-element instruction counts (:data:`AITER_PASSES`) are counted
from the source's operations, with 16-byte loads (``dwordx4``, four elements a lane).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cdna_cycles import ISSUE, LANES, SIMDS_PER_CU, VMEM_BYTES_PER_CLOCK, profile  # noqa: E402

from paged_mqa_logits.arch import ARCH_SPECS  # noqa: E402

MODEL = "topk-amd-1"
ARCHS = ("gfx942", "gfx950")
ROWS = (64, 128, 256, 512, 1024)
CONTEXTS = (8192, 16384, 32768, 65536, 131072)
K = 2048
BYTES = 4  # an fp32 logit, an int32 slot


@dataclass(frozen=True)
class PassCost:
    """One pass over a row: SIMD clocks of its busiest pipe per element (all four SIMDs busy)."""

    name: str
    clocks_per_element: float
    bound: str  # the busiest pipe

    @classmethod
    def of_counts(cls, name: str, valu: float, lds: float, vmem_x4: float, salu: float = 0.0) -> "PassCost":
        """From wave instructions per 64 elements (one element a lane): VALU, SALU, 4-byte LDS
        accesses and 16-byte loads, at ``cdna_cycles``' pipe prices."""
        pipes = {"valu": ISSUE * valu, "salu": ISSUE * salu,
                 "lds": SIMDS_PER_CU * max(2, 4 * LANES // 128) * lds,
                 "vmem": SIMDS_PER_CU * max(LANES // 16, 16 * LANES // VMEM_BYTES_PER_CLOCK) * vmem_x4}
        bound = max(pipes, key=pipes.get)
        return cls(name, pipes[bound] / LANES, bound)

    @classmethod
    def of_loop(cls, name: str, lines: list[str], elements: int) -> "PassCost":
        """From a loop of the ISA that handles ``elements`` elements per wave and iteration."""
        p = profile(lines)
        bound = max(p.pipes, key=p.pipes.get)
        return cls(name, p.pipes[bound] / elements, bound)


#: AITER's two full passes, wave instructions per 64 elements (module docstring): pass 0 maps
#: the float to its order key (sign test, select, xor: 3), extracts the digit (``v_bfe_u32``: 1)
#: and adds it to the LDS histogram (1 ``ds_add_u32``); pass 1 maps the key (3), masks and
#: compares the prefix (3), extracts the digit (1) and branches (1); a quarter of a ``dwordx4``
#: and about one VALU of address and loop arithmetic per element in each
AITER_PASSES = (PassCost.of_counts("histogram", valu=5, lds=1, vmem_x4=0.25),
                PassCost.of_counts("filter", valu=9, lds=0, vmem_x4=0.25))


@dataclass(frozen=True)
class Estimate:
    us: float
    bound: str  # "hbm", "cu-bandwidth" or the issue bound of the slowest pass


def estimate(passes, arch: str, rows: int, n: int, k: int, active_cus: int) -> Estimate:
    """Microseconds of ``passes`` over ``rows`` rows of ``n`` visible fp32 logits (module docstring)."""
    spec = ARCH_SPECS[arch]
    clock = spec.clock_mhz * 1e6
    cus = min(active_cus, spec.usual_cu_num)
    bandwidth = min(spec.hbm_gbps * 1e9, cus * VMEM_BYTES_PER_CLOCK * clock)
    memory_bound = "hbm" if bandwidth == spec.hbm_gbps * 1e9 else "cu-bandwidth"
    total, worst = 0.0, (0.0, "")
    for p in passes:
        memory = rows * n * BYTES / bandwidth
        issue = rows * n * p.clocks_per_element / (SIMDS_PER_CU * cus * clock)
        seconds, bound = (memory, memory_bound) if memory >= issue else (issue, f"{p.name}:{p.bound}")
        total += seconds
        worst = max(worst, (seconds, bound))
    total += rows * k * BYTES / (spec.hbm_gbps * 1e9)
    return Estimate(total * 1e6, worst[1])


# ----------------------------------------------------------------------------- our kernel's ISA
def radix_loops(arch: str) -> tuple[tuple[PassCost, ...], dict]:
    """Our three full passes from the cross-compiled ``triton_radix`` kernel's ISA: the coarse
    histogram loop (the first loop that loads and adds into LDS), the fine one (the next such
    loop) and the split loop (the first later loop that loads and stores); with the compile
    record's facts. The fine pass runs only where the coarse bin overflows the list: the model
    charges it to every row (the long rows' usual case, and the slower one)."""
    from paged_mqa_logits.aot.compile import _amd_blocks
    from paged_mqa_logits.top_k import triton_radix

    isa, record = _compile_radix(arch)
    loops = _loops(_amd_blocks(isa))
    elements = triton_radix.BLOCK // triton_radix.NUM_WARPS
    hists = [i for i, body in enumerate(loops) if _has(body, "global_load") and _has(body, "ds_add")][:2]
    split = next(i for i, body in enumerate(loops) if i > hists[1] and _has(body, "global_load")
                 and _has(body, "global_store"))
    facts = {"vgprs": record.vgprs, "occupancy": record.occupancy, "histogram_instructions": len(loops[hists[0]]),
             "fine_histogram_instructions": len(loops[hists[1]]), "split_instructions": len(loops[split]),
             "elements_per_wave_iteration": elements}
    return (PassCost.of_loop("histogram", loops[hists[0]], elements),
            PassCost.of_loop("fine_histogram", loops[hists[1]], elements),
            PassCost.of_loop("split", loops[split], elements)), facts


def _has(body: list[str], prefix: str) -> bool:
    return any(line.startswith(prefix) for line in body)


def _loops(blocks) -> list[list[str]]:
    """Each loop's own instructions (nested loops' left out), in the order the loops start."""
    import re

    index = {label: i for i, (label, _) in enumerate(blocks) if label}
    spans = set()
    for i, (_, lines) in enumerate(blocks):
        for line in lines:
            parts = line.split()
            if re.match(r"^s_(cbranch_\w+|branch)$", parts[0]) and len(parts) > 1 and index.get(parts[1], i + 1) <= i:
                spans.add((index[parts[1]], i))
    out = []
    for first, last in sorted(spans):
        nested = {b for f, l in spans if first <= f and l <= last and (f, l) != (first, last) for b in range(f, l + 1)}
        out.append([x for b in range(first, last + 1) if b not in nested for x in blocks[b][1]])
    return out


def sample_loops(arch: str) -> tuple[tuple[PassCost, ...], dict]:
    """``triton_sample``'s one full pass, its compaction (the first loop that loads and stores),
    from its cross-compiled ISA at its GPU defaults (four elements a lane a stripe, 64 lanes a wave);
    its seed and finish run on the sample and the short list and are left out, as the resolution
    after the full reads is for the others."""
    from paged_mqa_logits.aot.compile import _amd_blocks
    from paged_mqa_logits.top_k import triton_sample

    warps, block = triton_sample.NUM_WARPS, triton_sample.BLOCK
    columns = triton_sample.LANE_ELEMENTS * 64 * warps
    isa, record = _compile(triton_sample._topk_sample_kernel, arch, warps,
                           {"BLOCK": block, "STRIPES": max(1, block // columns), "LIST_BLOCK": columns,
                            "REGISTER_LIST": triton_sample.REGISTER_LIST,
                            "ROW": triton_sample.held_row_for(block, 131072, columns),
                            "PREFETCH": triton_sample.prefetch_for(arch), "IN_PLACE": triton_sample.in_place_for(arch),
                            "LIST_IN_PLACE": triton_sample.list_in_place_for(arch, 2048, 131072), "LISTS": True})
    loops = _loops(_amd_blocks(isa))
    compaction = next(body for body in loops if _has(body, "global_load") and _has(body, "global_store"))
    elements = block // warps
    facts = {"vgprs": record.vgprs, "compaction_instructions": len(compaction), "elements_per_wave_iteration": elements}
    return (PassCost.of_loop("compaction", compaction, elements),), facts


def _compile_radix(arch: str):
    from paged_mqa_logits.top_k import triton_radix

    return _compile(triton_radix._topk_radix_kernel, arch, triton_radix.NUM_WARPS, {"BLOCK": triton_radix.BLOCK})


def _compile(kernel, arch: str, num_warps: int, constexprs: dict):
    """A top-k kernel's ISA for ``arch`` (one query a sequence, no page table) and its compile record."""
    import inspect
    import tempfile

    from paged_mqa_logits.aot.compile import compile_spec
    from paged_mqa_logits.backends.base import CompileSpec

    order = list(inspect.signature(kernel.fn).parameters)
    pointers = ("logits_ptr", "lens_ptr", "out_ptr", "table_ptr", "scratch_ptr", "entries_ptr")
    constexprs = {"NEXT_N": 1, "LENS_2D": False, "HAS_TABLE": False, **constexprs}
    signature = {name: "*fp32" if name == "logits_ptr" else "*i64" if name == "entries_ptr" else
                 "*i32" if name in pointers else
                 "constexpr" if name in constexprs else "i32" for name in order}
    spec = CompileSpec(name=f"topk_{kernel.__name__.strip('_')}_{arch}", backend="topk", arch=arch, knobs={},
                       fn=kernel, signature=signature, constexprs=constexprs,
                       options={"num_warps": num_warps, "waves_per_eu": 1}, gluon=False)
    with tempfile.TemporaryDirectory() as out:
        record = compile_spec(spec, out)
        if not record.ok:
            raise RuntimeError(f"{spec.name}: {record.error}")
        with open(os.path.join(out, spec.name + ".amdgcn")) as f:
            return f.read(), record


# ----------------------------------------------------------------------------- the table
COLUMNS = ("arch", "cu_num", "rows", "context", "k", "ours_us", "ours_bound", "aiter_us", "aiter_bound",
           "speedup_vs_aiter", "sample_us", "sample_bound", "sample_speedup_vs_aiter")


def table(ours: dict[str, tuple], rows=ROWS, contexts=CONTEXTS, k: int = K, sample: dict[str, tuple] | None = None
          ) -> list[dict]:
    """Estimated rows for every arch of ``ours`` (arch -> our passes) at every rows x context; with
    ``sample`` (arch -> ``triton_sample``'s passes), its estimate too (the same split rule)."""
    from paged_mqa_logits.top_k.triton_radix import split_for

    out = []
    for arch, passes in ours.items():
        cus = ARCH_SPECS[arch].usual_cu_num
        for n in contexts:
            for r in rows:
                mine = estimate(passes, arch, r, n, k, r * split_for(r, n, cus))
                theirs = estimate(AITER_PASSES, arch, r, n, k, r)
                row = {"arch": arch, "cu_num": cus, "rows": r, "context": n, "k": k,
                       "ours_us": round(mine.us, 2), "ours_bound": mine.bound, "aiter_us": round(theirs.us, 2),
                       "aiter_bound": theirs.bound, "speedup_vs_aiter": round(theirs.us / mine.us, 3)}
                if sample:
                    one_read = estimate(sample[arch], arch, r, n, k, r * split_for(r, n, cus))
                    row.update(sample_us=round(one_read.us, 2), sample_bound=one_read.bound,
                               sample_speedup_vs_aiter=round(theirs.us / one_read.us, 3))
                out.append(row)
    return out


def header(facts: dict[str, dict]) -> list[str]:
    lines = [f"# ESTIMATE, NOT A MEASUREMENT: model {MODEL} (tools/topk_amd_model.py), {datetime.date.today()}; "
             "no AMD GPU ran anything",
             "# inputs: peak HBM bandwidth and clock of paged_mqa_logits/arch.py (" + "; ".join(
                 f"{a} {ARCH_SPECS[a].hbm_gbps} GB/s {ARCH_SPECS[a].clock_mhz} MHz {ARCH_SPECS[a].usual_cu_num} CUs"
                 for a in facts) + "); pipe prices of tools/cdna_cycles.py",
             "# ours: triton_radix cross-compiled, its coarse and fine histogram and split loops counted from the "
             "ISA, three reads of every row (" + "; ".join(
                 f"{a}: {f['histogram_instructions']}, {f['fine_histogram_instructions']} and "
                 f"{f['split_instructions']} instructions per "
                 f"{f['elements_per_wave_iteration']} elements a wave, {f['vgprs']} VGPRs" for a, f in facts.items())
             + ")",
             "# sample: triton_sample cross-compiled, its compaction loop counted from the ISA, one read of every row "
             "(seed and list finish left out) (" + "; ".join(
                 f"{a}: {f['sample']['compaction_instructions']} instructions per "
                 f"{f['sample']['elements_per_wave_iteration']} elements a wave, {f['sample']['vgprs']} VGPRs"
                 for a, f in facts.items() if "sample" in f) + ")",
             "# aiter: top_k_per_row_decode counted from its source (one 1024-thread block a row, 12-bit digits, "
             "two full reads); every row sees the full context (uniform lengths)"]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/amd/topk_estimate.csv")
    a = parser.parse_args(argv)
    ours, facts, sample = {}, {}, {}
    for arch in ARCHS:
        ours[arch], facts[arch] = radix_loops(arch)
        sample[arch], facts[arch]["sample"] = sample_loops(arch)
    rows = table(ours, sample=sample)
    from paged_mqa_logits.files import atomic_write

    with atomic_write(a.out, newline="") as f:
        for line in header(facts):
            f.write(line + "\n")
        f.write(",".join(COLUMNS) + "\n")
        for r in rows:
            f.write(",".join(str(r.get(c, "")) for c in COLUMNS) + "\n")
    for r in rows:
        print(",".join(str(r.get(c, "")) for c in COLUMNS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
