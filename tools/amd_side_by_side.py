"""Our gfx942 / gfx950 kernels next to AITER's Gluon kernel, compiled for the same targets on the
same shapes, with the cycle estimate of ``tools/cdna_cycles.py``. No GPU needed.

For each arch and shape of the grid (H 32/64, next_n 1/2/3/4/8, KVBlockSize 1 / 16 / 64 with
and without Preshuffle where it exists) it compiles:

* **ours**: every kernel our dispatch picks for the shape at the tables' batches (1 ... 256;
  ``configs/gfx*_tuned.csv`` rows, else the arch's default): Gluon ``mfma`` or FlyDSL;
* **AITER's** Gluon kernel (``--aiter PATH``, a local checkout; nothing of it is copied here),
  through ``tools/aiter_gluon_compile.py`` under ``--aiter-python`` (the interpreter of the
  Triton that revision compiles with), at ChunkK 128/256 x WavePerEU 1/2/4; vLLM's default is
  ChunkK 256 / WavePerEU 2. Its kernel serves one query row per program whatever next_n, so
  one compile serves every next_n of a shape.

Per kernel (one CSV row): VGPRs / AGPRs / SGPRs, scratch, LDS, the waves per SIMD its resources
allow, and per 64 keys of a sequence (every query row, all heads): MFMA count and kind, VMEM
instructions and bytes, LDS instructions, VALU / SALU counts, ``s_waitcnt`` s of the loop; the
estimate: cycles per loop iteration, one wave alone, the bound, and cycles per 64 keys.

Usage (docs/VERIFICATION.md): ``PYTHONPATH=. python tools/amd_side_by_side.py --aiter
/path/to/aiter --aiter-python /path/to/venv/bin/python --csv benchmarks/amd/side_by_side.csv``;
``--sample`` compiles only :data:`SAMPLE` (ours), what CI runs; ``--update-tables CSV`` writes a
report's estimates into the provenance of every gfx942 / gfx950 table row (``table.CycleEstimate``).
``--head-sum-tensor CSV`` compiles the ``HeadSum=tensor`` twin of every Gluon pick on the archs
that offer it (``mfma.TENSOR_HEAD_SUM_ARCHS``) and puts those rows (``who`` :data:`TENSOR_WHO`)
into the report ``CSV`` in place of its previous ones; the comparison with AITER stays on the picks.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import cdna_cycles
from paged_mqa_logits import dispatch, table
from paged_mqa_logits.arch import ARCH_SPECS
from paged_mqa_logits.backends.flydsl import build as flydsl_build
from paged_mqa_logits.backends.flydsl.backend import BACKEND as FLYDSL
from paged_mqa_logits.backends.gluon import common, mfma
from paged_mqa_logits.aot.compile import amd_resources, compile_specs
from paged_mqa_logits.problem import Target

MFMA = mfma.VARIANT
ARCHS = ("gfx942", "gfx950")
HEADS = (32, 64)
NEXT_NS = (1, 2, 3, 4, 8)
LAYOUTS = ((1, False), (16, False), (16, True), (64, False), (64, True))  # (KVBlockSize, Preshuffle)
BATCHES = (1, 8, 32, 64, 128, 256)
AITER_CHUNKS = (128, 256)
AITER_WAVES = (1, 2, 4)
AITER_DEFAULT = (256, 2)
#: the CI sample: a few of our kernels, both backends and both MFMA kinds among them
SAMPLE = (("gfx950", 64, 2, 64, True, 1), ("gfx942", 32, 1, 1, False, 1), ("gfx950", 32, 4, 64, True, 256))
#: ``who`` of a pick's HeadSum=tensor twin (not a pick: the default head sum is fp32)
TENSOR_WHO = "ours-tensor"
SHAPE_COLUMNS = ("arch", "heads", "next_n", "kv_block_size", "preshuffle")
COLUMNS = ("arch", "heads", "next_n", "kv_block_size", "preshuffle", "kernel", "who", "backend", "knobs",
           "batches", "ok", "vgprs", "agprs", "sgprs", "scratch", "lds", "waves", "mfma_kind", "mfma", "vmem",
           "vmem_bytes", "lds_ops", "valu", "salu", "waitcnt", "iteration", "single_wave", "bound",
           "cycles_per_64_keys", "error")


@dataclass(frozen=True)
class Shape:
    arch: str
    heads: int
    next_n: int
    kv_block_size: int
    preshuffle: bool

    def fields(self) -> dict:
        return {"heads": self.heads, "next_n": self.next_n, "kv_block_size": self.kv_block_size,
                "preshuffle": self.preshuffle, "lens_2d": True}

    def problem(self, batch: int = 64):
        fields = dict(self.fields(), batch=batch, cu_num=ARCH_SPECS[self.arch].usual_cu_num)
        return common.problem_for(self.arch, MFMA.fp8[self.arch], fields)


def grid(archs=ARCHS) -> list[Shape]:
    return [Shape(a, h, n, kv_block_size, pre) for a in archs for h in HEADS for n in NEXT_NS for kv_block_size, pre in LAYOUTS]


# ----------------------------------------------------------------------------- our picks
def our_picks(shape: Shape, batches=BATCHES) -> dict[tuple, tuple[str, dict, list[int]]]:
    """``(backend, resolved knobs, batches)`` per distinct kernel our dispatch picks."""
    picks: dict[tuple, tuple[str, dict, list[int]]] = {}
    for batch in batches:
        problem = shape.problem(batch)
        choice = dispatch.decide(problem, target=Target.described(shape.arch, problem.cu_num))
        if choice.backend == "gluon":
            knobs = MFMA.knobs(problem, choice.config)
        elif choice.backend == "flydsl":
            knobs = {**FLYDSL.default_config(problem), **choice.config}
        else:
            raise ValueError(f"{shape}: the dispatch picks {choice.backend}, which this tool does not compile")
        key = (choice.backend,) + tuple(sorted(knobs.items()))
        picks.setdefault(key, (choice.backend, knobs, []))[2].append(batch)
    return picks


def compile_ours(shape: Shape, backend: str, knobs: dict, out: str):
    """The compile record of one of our kernels (Gluon through Triton, FlyDSL itself)."""
    if backend == "gluon":
        return compile_specs(MFMA.compile_specs(shape.arch, [dict(shape.fields(), **knobs)]), out, progress=False)[0]
    plan = FLYDSL.plan(shape.problem(), {k: v for k, v in knobs.items() if k in FLYDSL.knobs})
    return flydsl_build.compile_plans(shape.arch, [plan], out, progress=False)[0]


# ----------------------------------------------------------------------------- AITER
def aiter_kernels(shape: Shape) -> list[dict]:
    """AITER's Gluon kernels for ``shape`` (next_n aside), as ``aiter_gluon_compile`` requests."""
    tag = f"aiter_{shape.arch}_h{shape.heads}_bs{shape.kv_block_size}{'p' if shape.preshuffle else ''}"
    return [{"name": f"{tag}_ck{chunk}_w{waves}", "heads": shape.heads, "chunk_k": chunk, "waves": waves,
             "kv_block_size": shape.kv_block_size, "preshuffle": int(shape.preshuffle),
             "aligned16": int(shape.kv_block_size * 132 % 16 == 0)}
            for chunk in AITER_CHUNKS for waves in AITER_WAVES]


def compile_aiter(aiter: str, python: str, arch: str, kernels: list[dict], out: str) -> dict[str, dict]:
    """Results by name. The compiler may abort the process on a kernel: that one is recorded as
    failed and the rest compile in a fresh process."""
    helper = os.path.join(os.path.dirname(os.path.abspath(__file__)), "aiter_gluon_compile.py")
    results: dict[str, dict] = {}
    todo = list(kernels)
    while todo:
        request = json.dumps({"aiter": aiter, "arch": arch, "out": out, "kernels": todo})
        run = subprocess.run([python, helper], input=request, capture_output=True, text=True)
        for line in run.stdout.splitlines():
            result = json.loads(line)
            results[result["name"]] = result
        todo = [k for k in todo if k["name"] not in results]
        if todo and run.returncode != 0:
            tail = (run.stderr.strip().splitlines() or ["no message"])[-1]
            results[todo[0]["name"]] = {"name": todo[0]["name"], "ok": False, "isa": None,
                                        "error": f"compiler aborted (exit {run.returncode}): {tail[:200]}"}
            todo = todo[1:]
        elif todo:
            raise RuntimeError(f"{helper} stopped early without an error: {run.stderr[-500:]}")
    return results


# ----------------------------------------------------------------------------- one report row
def resources_of(record) -> dict:
    """The resource columns of one of our compile records."""
    return {"vgprs": record.vgprs, "agprs": record.agprs, "sgprs": record.sgprs, "scratch": record.scratch_bytes,
            "lds": record.lds_bytes or 0}


def triton_resources(isa_text: str, dynamic_lds: int) -> dict:
    """The resource columns of a Triton-compiled kernel, from its ISA (LDS: the larger of the
    static size and Triton's dynamic allocation)."""
    res = amd_resources(isa_text)
    return {"vgprs": res["vgprs"], "agprs": res["agprs"], "sgprs": res["sgprs"], "scratch": res["scratch_bytes"],
            "lds": max(dynamic_lds or 0, res["lds_bytes"] or 0)}


def measure(isa_text: str, arch: str, waves_asked: int, heads: int, next_n: int, res: dict) -> dict:
    """The report's resource, per-64-keys and estimate columns of one compiled kernel."""
    allowed = flydsl_build.occupancy(arch, res["vgprs"], res["lds"], 1)
    waves = min(waves_asked, allowed) if waves_asked else allowed
    loop = cdna_cycles.hot_loop(isa_text)
    prof = cdna_cycles.profile(loop)
    est = cdna_cycles.estimate(prof, waves, heads, next_n)
    per = est.scale  # loop iterations per 64 keys x next_n rows
    counts = prof.counts
    return {**res, "waves": waves,
            "mfma_kind": "+".join(sorted(prof.mfma_kinds)), "mfma": round(counts.get("mfma", 0) * per, 2),
            "vmem": round(counts.get("vmem", 0) * per, 2), "vmem_bytes": round(prof.vmem_bytes * per),
            "lds_ops": round(counts.get("lds", 0) * per, 2), "valu": round(counts.get("valu", 0) * per, 1),
            "salu": round((counts.get("salu", 0) + counts.get("smem", 0)) * per, 1),
            "waitcnt": round(prof.waitcnts * per, 2), "iteration": round(est.cycles_per_iteration),
            "single_wave": round(prof.single_wave), "bound": est.bound,
            "cycles_per_64_keys": round(est.cycles_per_64_keys)}


def row(shape: Shape, kernel: str, who: str, backend: str, knobs: dict, batches, ok: bool, isa: str | None,
        waves: int, resources, error: str | None = None) -> dict:
    """One report row; ``resources`` is a dict, or a function of the ISA text giving one."""
    out = {"arch": shape.arch, "heads": shape.heads, "next_n": shape.next_n, "kv_block_size": shape.kv_block_size,
           "preshuffle": int(shape.preshuffle), "kernel": kernel, "who": who, "backend": backend,
           "knobs": " ".join(f"{k}={v}" for k, v in sorted(knobs.items())), "batches": " ".join(map(str, batches)),
           "ok": int(ok), "error": error or ""}
    if ok:
        with open(isa) as f:
            text = f.read()
        res = resources(text) if callable(resources) else resources
        out.update(measure(text, shape.arch, waves, shape.heads, shape.next_n, res))
    return {c: out.get(c, "") for c in COLUMNS}


# ----------------------------------------------------------------------------- the run
def our_rows(shapes: list[Shape], out: str, jobs: int, batches=BATCHES, head_sum_tensor: bool = False) -> list[dict]:
    """Compile every pick of ``shapes`` (Gluon in ``jobs`` processes, FlyDSL in its own) and
    return their report rows; with ``head_sum_tensor``, the ``HeadSum=tensor`` twins of the
    Gluon picks instead (rows of :data:`TENSOR_WHO`)."""
    work = [(shape, backend, dict(knobs, HeadSum="tensor") if head_sum_tensor else knobs, used) for shape in shapes
            for backend, knobs, used in our_picks(shape, batches).values()
            if not head_sum_tensor or backend == "gluon"]
    who = TENSOR_WHO if head_sum_tensor else "ours"
    records = {}
    for arch in sorted({s.arch for s, *_ in work}):
        gluon = [(i, w) for i, w in enumerate(work) if w[0].arch == arch and w[1] == "gluon"]
        specs = MFMA.compile_specs(arch, [dict(s.fields(), **k) for _, (s, _, k, _) in gluon])
        for (i, _), record in zip(gluon, compile_specs(specs, out, jobs=jobs, progress=False)):
            records[i] = record
        fly = [(i, w) for i, w in enumerate(work) if w[0].arch == arch and w[1] == "flydsl"]
        plans = [FLYDSL.plan(s.problem(), {k: v for k, v in kn.items() if k in FLYDSL.knobs}) for _, (s, _, kn, _) in fly]
        if plans:
            for (i, _), record in zip(fly, flydsl_build.compile_plans(arch, plans, out, progress=False)):
                records[i] = record
    rows = []
    for i, (shape, backend, knobs, used) in enumerate(work):
        r = records[i]
        rows.append(row(shape, r.name, who, backend, knobs, used, r.ok, r.isa, int(knobs.get("WavePerEU") or 0),
                        resources_of(r), r.error))
    return rows


def aiter_rows(shapes: list[Shape], aiter: str, python: str, out: str) -> list[dict]:
    rows = []
    for arch in sorted({s.arch for s in shapes}):
        kernels = {k["name"]: k for s in shapes if s.arch == arch for k in aiter_kernels(s)}
        results = compile_aiter(aiter, python, arch, list(kernels.values()), out)
        for shape in (s for s in shapes if s.arch == arch):
            for k in aiter_kernels(shape):
                r = results[k["name"]]
                rows.append(row(shape, k["name"], "aiter", "aiter-gluon", {"ChunkK": k["chunk_k"], "WavePerEU": k["waves"]},
                                (), r["ok"], r.get("isa"), k["waves"],
                                lambda text, lds=r.get("lds_bytes", 0): triton_resources(text, lds), r.get("error")))
    return rows


def comparison(rows: list[dict]) -> list[dict]:
    """Per shape: our worst pick, AITER's default (ChunkK 256 / WavePerEU 2) and AITER's best
    (the lowest estimate of its compiled kernels without scratch: spills cost what the estimate
    does not see)."""
    by_shape: dict[tuple, dict] = {}
    for r in rows:
        if not int(r["ok"]) or r["who"] == TENSOR_WHO:
            continue
        key = tuple(r[c] for c in SHAPE_COLUMNS)
        entry = by_shape.setdefault(key, {"ours": [], "aiter": [], "aiter_default": None})
        cycles = float(r["cycles_per_64_keys"])
        if r["who"] == "ours":
            entry["ours"].append(cycles)
            continue
        if r["knobs"] == f"ChunkK={AITER_DEFAULT[0]} WavePerEU={AITER_DEFAULT[1]}":
            entry["aiter_default"] = cycles  # what vLLM runs, spilled or not (the estimate omits the spills)
        if not int(r["scratch"] or 0):
            entry["aiter"].append(cycles)
    out = []
    for key, e in sorted(by_shape.items()):
        if e["ours"] and e["aiter"]:
            out.append(dict(zip(SHAPE_COLUMNS, key),
                            ours=max(e["ours"]), aiter_best=min(e["aiter"]), aiter_default=e["aiter_default"]))
    return out


def geomean(values) -> float:
    values = list(values)
    product = 1.0
    for v in values:
        product *= v
    return product ** (1 / len(values)) if values else float("nan")


def summary(rows: list[dict]) -> list[str]:
    lines = []
    comp = comparison(rows)
    for arch in ARCHS:
        mine = [c for c in comp if c["arch"] == arch]
        if not mine:
            continue
        best = [c["ours"] / c["aiter_best"] for c in mine]
        default = [c["ours"] / c["aiter_default"] for c in mine if c["aiter_default"]]
        lines.append(f"{arch}: {len(mine)} shapes; ours / AITER best: geomean {geomean(best):.3f}, worst "
                     f"{max(best):.3f}, {sum(b > 1 for b in best)} above 1; ours / AITER default: geomean "
                     f"{geomean(default):.3f}, worst {max(default):.3f}, {sum(d > 1 for d in default)} above 1")
    for arch, pairs in tensor_pairs(rows).items():
        ratios = [tensor / pick for pick, tensor in pairs]
        lines.append(f"{arch}: {len(pairs)} Gluon picks; HeadSum=tensor / fp32 cycles per 64 keys: geomean "
                     f"{geomean(ratios):.3f}, best {min(ratios):.3f}, worst {max(ratios):.3f}")
    return lines


def tensor_pairs(rows: list[dict]) -> dict[str, list[tuple[float, float]]]:
    """Per arch, (pick, its HeadSum=tensor twin) cycles per 64 keys of every compiled pair."""
    key = lambda r, knobs: tuple(str(r[c]) for c in SHAPE_COLUMNS) + (knobs,)
    picks = {key(r, r["knobs"]): float(r["cycles_per_64_keys"]) for r in rows
             if r["who"] == "ours" and r["backend"] == "gluon" and int(r["ok"])}
    out: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        if r["who"] == TENSOR_WHO and int(r["ok"]):
            pick = picks.get(key(r, " ".join(k for k in r["knobs"].split() if k != "HeadSum=tensor")))
            if pick is not None:
                out.setdefault(r["arch"], []).append((pick, float(r["cycles_per_64_keys"])))
    return out


def table_estimates(rows: list[dict]) -> dict[tuple, table.CycleEstimate]:
    """The estimate of every (arch, heads, kv_block_size, preshuffle, next_n, batch) a report's
    rows of ours cover: our pick at that batch against AITER's default and best for the shape."""
    aiter = {tuple(c[k] for k in SHAPE_COLUMNS): c for c in comparison(rows)}
    out = {}
    for r in rows:
        if r["who"] != "ours" or not int(r["ok"]):
            continue
        shape = tuple(r[k] for k in SHAPE_COLUMNS)
        other = aiter.get(shape, {})
        for batch in str(r["batches"]).split():
            out[(r["arch"], int(r["heads"]), int(r["kv_block_size"]), int(r["preshuffle"]), int(r["next_n"]),
                 int(batch))] = table.CycleEstimate(
                cdna_cycles.MODEL, round(float(r["cycles_per_64_keys"])), _cycles(other.get("aiter_default")),
                _cycles(other.get("aiter_best")), r["bound"])
    return out


def _cycles(value) -> int | None:
    return None if value is None else round(float(value))


def update_tables(paths: list[str], estimates: dict[tuple, table.CycleEstimate]) -> int:
    """Rewrite each table's gfx942 / gfx950 rows with their estimate after the row's own origin
    (comments kept). A row without an estimate is an error: the report must cover the table."""
    changed = 0
    for path in paths:
        with open(path) as f:
            comments = [line[2:].rstrip("\n") for line in f if line.startswith("# ")]
        rows = table.parse_file(path)
        updated = []
        for row in rows:
            if row.arch in ARCHS:
                key = (row.arch, row.shape_key.heads, row.shape_key.kv_block_size, int(row.shape_key.preshuffle),
                       row.shape_key.next_n, row.shape_key.batch)
                if key not in estimates:
                    raise ValueError(f"{row.source}: the report has no estimate for {key}")
                origin = table.CycleEstimate.strip(row.provenance).removesuffix(";").strip()
                text = estimates[key].text()
                provenance = text if not origin else f"{origin}; {text}"
                changed += provenance != row.provenance
                row = dataclasses.replace(row, provenance=provenance)
            updated.append(row)
        table.TableWriter.for_rows(updated).write(path, updated, comments)
    return changed


def write_csv(path: str, rows: list[dict]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", nargs="+", default=list(ARCHS), choices=ARCHS)
    parser.add_argument("--aiter", help="a local AITER checkout (without it: ours only)")
    parser.add_argument("--aiter-python", default=sys.executable,
                        help="interpreter with the Triton that AITER revision compiles with")
    parser.add_argument("--sample", action="store_true", help="only the fixed CI sample of our kernels")
    parser.add_argument("--csv", help="write the report here")
    parser.add_argument("--out", help="keep ISA and binaries here (default: a temporary directory)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--head-sum-tensor", metavar="CSV", help="compile the HeadSum=tensor twins of the Gluon "
                                                                   "picks and replace that report's twin rows")
    parser.add_argument("--update-tables", metavar="CSV", help="write this report's estimates into the shipped "
                                                                 "gfx942 / gfx950 tables and exit")
    args = parser.parse_args(argv)
    if args.update_tables:
        with open(args.update_tables) as f:
            estimates = table_estimates(list(csv.DictReader(f)))
        paths = [os.path.join(table.shipped_config_dir(), f"{arch}_tuned.csv") for arch in args.arch]
        print(f"{update_tables(paths, estimates)} provenances changed")
        return 0
    out = args.out or tempfile.mkdtemp(prefix="amd_side_by_side_")
    if args.head_sum_tensor:
        archs = [a for a in args.arch if a in mfma.TENSOR_HEAD_SUM_ARCHS]
        twins = our_rows(grid(archs), out, args.jobs, head_sum_tensor=True)
        with open(args.head_sum_tensor) as f:
            rows = [r for r in csv.DictReader(f) if not (r["who"] == TENSOR_WHO and r["arch"] in archs)] + twins
        write_csv(args.head_sum_tensor, rows)
        for line in summary(rows):
            print(line)
        return 0 if all(int(r["ok"]) for r in twins) else 1
    if args.sample:
        rows = []
        for arch, heads, next_n, block, pre, batch in SAMPLE:
            if arch in args.arch:
                rows += our_rows([Shape(arch, heads, next_n, block, pre)], out, args.jobs, (batch,))
    else:
        shapes = grid(args.arch)
        rows = our_rows(shapes, out, args.jobs)
        if args.aiter:
            rows += aiter_rows(shapes, args.aiter, args.aiter_python, out)
    if args.csv:
        write_csv(args.csv, rows)
    writer = csv.DictWriter(sys.stdout, COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    for line in summary(rows):
        print(line)
    return 0 if all(int(r["ok"]) for r in rows if r["who"] == "ours") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
