"""Static comparison of the CDNA ``mfma`` kernel's two key paths for plain caches (``KeyLoad``
``direct`` vs ``lds``, ``paged_mqa_logits/backends/gluon/cdna_keys.py``), by cross-compiling
for gfx942 / gfx950 (no GPU needed).

For each representative problem (H 32/64; next_n 1 with per-row programs, next_n 2/4 with
shared-KV programs; kv_block_size 64 and 1; plain cache, 2-D lengths, split schedule, the
arch's default MFMA) and each (ChunkK, WavePerEU) that is a candidate for both paths, it
prints one line per path:

* the tile loop's instructions (``compile.amd_loop_instructions``): vector-memory loads by
  width (``x4`` = ``buffer_load_dwordx4``, ``dw`` = ``buffer_load_dword``, ``ub`` =
  ``buffer_load_ubyte``, ``gl`` = ``global_load_*``), ``ds_write`` / ``ds_read``, MFMAs,
  ``s_waitcnt vmcnt(0)`` and ``s_barrier``;
* cache lines of 64 / 128 bytes one 16-byte key load of a wave touches
  (``cdna_keys.cache_lines_per_load``; 16-byte-aligned caches only, ``-`` otherwise), and
  key loads per tile and wave;
* VGPRs (arch + AGPRs), scratch bytes, LDS bytes and the compiler's occupancy
  (``compile.amd_resources``).

Usage: ``PYTHONPATH=. python tools/cdna_key_loads.py [--arch gfx942 gfx950] [--jobs 2] [--quick]``
(``--quick``: H 64 only, next_n 1 and 4).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from triton.experimental.gluon import language as gl

from paged_mqa_logits.backends.gluon import cdna_keys, common, mfma
from paged_mqa_logits.aot.compile import amd_loop_instructions, amd_resources, compile_specs

MFMA = mfma.VARIANT


def problems(quick: bool) -> list[dict]:
    out = []
    for heads in (64,) if quick else (32, 64):
        for next_n in (1, 4) if quick else (1, 2, 4):
            for block in (64, 1):
                out.append(dict(heads=heads, next_n=next_n, kv_block_size=block, preshuffle=False, lens_2d=True))
    return out


def configs(arch: str, shape: dict) -> list[dict]:
    """Pairs of configs (direct, lds) with the same ChunkK / WavePerEU, both candidates."""
    problem = common.problem_for(arch, MFMA.fp8[arch], shape)
    reuse = 1 if shape["next_n"] > 1 else 0
    chosen = {}
    for cand in MFMA.candidates(problem):
        if cand["Schedule"] != "split" or cand["ReuseKV"] != reuse or cand["Mfma"] != mfma.MFMA_KINDS[arch][0]:
            continue
        key = (cand["ChunkK"], cand["WavePerEU"], cand.get(cdna_keys.KNOB, cdna_keys.DIRECT))
        chosen.setdefault(key, dict(shape, **cand))  # the first: Q in VGPRs when offered
    pairs = []
    for (chunk, waves, key_load), cfg in sorted(chosen.items()):
        if key_load == cdna_keys.DIRECT and (chunk, waves, cdna_keys.LDS) in chosen:
            pairs += [cfg, chosen[(chunk, waves, cdna_keys.LDS)]]
    return pairs


def row(arch: str, cfg: dict, record) -> str:
    isa = open(record.isa).read()
    loop = amd_loop_instructions(isa)
    res = amd_resources(isa)
    key_load = cfg.get(cdna_keys.KNOB, cdna_keys.DIRECT)
    loads = {"x4": sum(n for k, n in loop.items() if k.startswith("buffer_load_dwordx4")),
             "dw": loop.get("buffer_load_dword", 0), "ub": loop.get("buffer_load_ubyte", 0),
             "gl": sum(n for k, n in loop.items() if k.startswith("global_load"))}
    ds_write = sum(n for k, n in loop.items() if k.startswith("ds_write"))
    ds_read = sum(n for k, n in loop.items() if k.startswith("ds_read"))
    mfma_ops = sum(n for k, n in loop.items() if k.startswith("v_mfma"))
    problem = common.problem_for(arch, MFMA.fp8[arch], cfg)
    operand = gl.DotOperandLayout(1, mfma.mfma_layout(arch, cfg["heads"], cfg["ChunkK"], cfg["Mfma"]), 16)
    if problem.kv_aligned16:
        lines = "/".join(str(cdna_keys.cache_lines_per_load(operand, key_load, cfg["ChunkK"], size))
                         for size in (64, 128))
    else:
        lines = "-"
    return (f"{arch:7} {cfg['heads']:>3} {cfg['next_n']:>2} {cfg['kv_block_size']:>3} {cfg['ChunkK']:>4} "
            f"{cfg['WavePerEU']:>2} {key_load:6} {record.knobs['QInLDS']:>2} {record.knobs['Prefetch']:>2} | "
            f"{loads['x4']:>3} {loads['dw']:>3} {loads['ub']:>4} {loads['gl']:>3} {ds_write:>3} {ds_read:>3} "
            f"{mfma_ops:>4} {loop.get('s_waitcnt vmcnt(0)', 0):>3} {loop.get('s_barrier', 0):>3} | {lines:>6} | "
            f"{res['vgprs']:>4} {res['scratch_bytes']:>3} {record.lds_bytes:>6} {res['occupancy']:>3}")


HEADER = ("arch      H  n  bs    K  W KeyLoad Q PF |  x4  dw   ub  gl dsw dsr mfma vm0 bar | ln64/128 | "
          "vgpr scr    lds occ")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", nargs="+", default=["gfx942", "gfx950"])
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=None, help="keep the ISA here (default: a temporary directory)")
    args = parser.parse_args(argv)
    out_dir = args.out or tempfile.mkdtemp(prefix="cdna_key_loads_")
    print(HEADER)
    for arch in args.arch:
        cfgs = [cfg for shape in problems(args.quick) for cfg in configs(arch, shape)]
        records = compile_specs(MFMA.compile_specs(arch, cfgs), out_dir, jobs=args.jobs, progress=False)
        for cfg, record in zip(cfgs, records):
            print(row(arch, cfg, record) if record.ok else f"{record.name}: {record.error}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
