"""Cross-compilation driver: build kernels for a target with no GPU present.

``python -m paged_mqa_logits compile --backend gluon|flydsl --arch gfx942|gfx950|sm90``
compiles every candidate of a backend's knob space (or only the configs the tuned table can
pick) and writes, per kernel, the binary, the ISA/PTX text and a resources record.

The driver asks the backend, through the registry, for what to build (``backends/base.py``):
a :class:`~paged_mqa_logits.backends.base.SpecCompiled` backend (Gluon) returns
``CompileSpec`` s that are compiled here with Triton; a
:class:`~paged_mqa_logits.backends.base.SelfCompiled` backend (FlyDSL) builds its own kernels
and returns ``CompileRecord`` s. Either way every kernel ends as a ``CompileRecord`` that
:func:`check_records` judges.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

import triton

from ..arch import ARCH_SPECS, normalise_arch, triton_target
from ..backends import registry
from ..backends.base import CompileRecord, CompileSpec, SelfCompiled, SpecCompiled
from ..cli import ArgumentParser, CliError
from ..files import atomic_write
from ..problem import HEAD_DIM, Problem, ShapeKey, Target
from ..validate import arch_rule
from .sass import hot_loop_spills
from ..triton_internals.compiler import ASTSource, GluonASTSource
from ..triton_internals import interpreter
from ..triton_internals.toolchain import nvidia_tool
from .. import table

ARCHS = ("gfx942", "gfx950", "sm_90")
#: LDS / shared-memory limit of each cross-compilation arch, as CI checks it (a view of
#: ``arch.ARCH_SPECS``; kernel modules read it from here or from the spec)
LDS_LIMIT_BYTES = {arch: ARCH_SPECS[arch].lds_bytes for arch in ARCHS}
#: VGPRs are allocated in blocks of 8 per lane on gfx90a/gfx942/gfx950 (arch VGPRs and AGPRs
#: come from one 512-entry file per SIMD lane)
VGPR_GRANULE = 8

__all__ = ["ARCHS", "CompileRecord", "CompileSpec", "LDS_LIMIT_BYTES", "amd_hot_loop", "amd_loop_instructions", "backend_specs",
           "check_records", "compile_all", "compile_spec", "compile_specs", "main", "summary_line", "summary_table"]


def target(arch: str):
    if arch not in ARCHS:
        raise ValueError(f"no cross-compilation target for arch {arch!r}; known: {', '.join(ARCHS)}")
    return triton_target(arch)


# ----------------------------------------------------------------------------- ISA parsing
def _field(text: str, pattern: str) -> int | None:
    m = re.search(pattern, text, re.MULTILINE)
    return int(m.group(1)) if m else None


def amd_resources(isa: str) -> dict:
    """Resources and MFMA mnemonics from AMDGPU assembly (``asm["amdgcn"]``).

    ``vgprs`` is ``TotalNumVgprs`` (arch VGPRs + AGPRs, what occupancy is computed from);
    ``spill_count`` is VGPR + SGPR spills; ``lds_bytes`` the static LDS of the workgroup."""
    vgpr_spills = _field(isa, r"\.vgpr_spill_count:\s+(\d+)") or 0
    sgpr_spills = _field(isa, r"\.sgpr_spill_count:\s+(\d+)") or 0
    lds = _field(isa, r"; LDSByteSize: (\d+) bytes")
    if lds is None:
        lds = _field(isa, r"\.group_segment_fixed_size:\s+(\d+)")
    return {
        "vgprs": _field(isa, r"; TotalNumVgprs: (\d+)") or _field(isa, r"; NumVgprs: (\d+)"),
        "arch_vgprs": _field(isa, r"; NumVgprs: (\d+)"),
        "agprs": _field(isa, r"; NumAgprs: (\d+)") or 0,
        "sgprs": _field(isa, r"\.sgpr_count:\s+(\d+)") or _field(isa, r"; NumSgprs: (\d+)"),
        "lds_bytes": lds,
        "scratch_bytes": _field(isa, r"; ScratchSize: (\d+)"),
        "spill_count": vgpr_spills + sgpr_spills,
        "occupancy": _field(isa, r"; Occupancy: (\d+)"),
        "mma_instructions": sorted(set(re.findall(r"^\s+(v_mfma\w*)", isa, re.MULTILINE))),
    }


def _amd_blocks(isa: str) -> list[tuple[str | None, list[str]]]:
    """``(label, instruction lines)`` of the first function's basic blocks, in order (comments
    stripped; a block no branch targets is only named in a comment, ``; %bb.4:``)."""
    blocks: list[tuple[str | None, list[str]]] = [(None, [])]
    for line in isa.splitlines():
        label = re.match(r"^(\.LBB\w+|; %bb\.\d+):", line)
        if label:
            blocks.append((label.group(1), []))
            continue
        if line.startswith(".Lfunc_end"):
            break
        m = re.match(r"^\t([a-z_][\w]*)(\s.*)?$", line)
        if m and not m.group(1).startswith("."):
            blocks[-1][1].append(line.split(";")[0].strip())
    return blocks


def amd_hot_loop(isa: str) -> list[str]:
    """Instruction lines of the hottest loop of AMDGPU assembly: a loop is the blocks from a
    backward branch's target to the branch, less the blocks of the loops nested in it; the
    hottest holds the most MFMAs (the smaller on a tie). Found from the branches alone, so it
    reads LLVM's output with or without its loop comments (Triton's and FlyDSL's ISA alike).
    Empty when no loop holds an MFMA."""
    blocks = _amd_blocks(isa)
    index = {label: i for i, (label, _) in enumerate(blocks) if label}
    loops = set()
    for i, (_, lines) in enumerate(blocks):
        for line in lines:
            parts = line.split()
            if re.match(r"^s_(cbranch_\w+|branch)$", parts[0]) and len(parts) > 1 and index.get(parts[1], i + 1) <= i:
                loops.add((index[parts[1]], i))
    best, best_key = [], None
    for first, last in loops:
        nested = {b for f, l in loops if first <= f and l <= last and (f, l) != (first, last) for b in range(f, l + 1)}
        body = [x for b in range(first, last + 1) if b not in nested for x in blocks[b][1]]
        key = (sum(x.startswith("v_mfma") for x in body), -len(body))
        if key[0] and (best_key is None or key > best_key):
            best, best_key = body, key
    return best


def amd_loop_instructions(isa: str) -> dict[str, int]:
    """Mnemonic counts of the hottest loop of AMDGPU assembly (:func:`amd_hot_loop`);
    ``s_waitcnt`` is counted per operand (``s_waitcnt vmcnt(0)``, ``s_waitcnt lgkmcnt(0)``, ...).
    Empty when the kernel has no loop with an MFMA."""
    counts: dict[str, int] = {}
    for line in amd_hot_loop(isa):
        name, _, operands = line.partition(" ")
        for key in ([f"s_waitcnt {w}" for w in operands.split()] if name == "s_waitcnt" else [name]):
            counts[key] = counts.get(key, 0) + 1
    return counts


def ptx_mma_instructions(ptx: str) -> list[str]:
    """Distinct ``mma.sync`` / ``wgmma.mma_async`` instructions of a PTX text."""
    return sorted(set(re.findall(r"^\s*((?:wgmma\.mma_async|mma)\.[\w.]+)", ptx, re.MULTILINE)))


def sass_mma_instructions(sass: str) -> list[str]:
    return sorted(set(re.findall(r"\b((?:HMMA|HGMMA|QGMMA|IMMA|QMMA)\.[\w.]+)", sass)))


def nvidia_resources(cubin_path: str) -> dict:
    """Registers, shared and stack/local bytes per thread from ``cuobjdump --dump-resource-usage``
    (the Triton wheel ships it), plus the SASS text (``cuobjdump -sass``) when it works."""
    out: dict = {}
    tool = nvidia_tool("cuobjdump")
    if tool is None:
        return out
    usage = subprocess.run([tool, "--dump-resource-usage", cubin_path], capture_output=True, text=True)
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", usage.stdout)
    if m:
        reg, stack, shared, local = map(int, m.groups())
        out.update(vgprs=reg, scratch_bytes=stack + local, shared_static=shared)
    sass = subprocess.run([tool, "-sass", cubin_path], capture_output=True, text=True)
    if sass.returncode == 0 and sass.stdout:
        out["sass"] = sass.stdout
    return out


# ----------------------------------------------------------------------------- compiling
def compile_spec(spec: CompileSpec, out_dir: str | None) -> CompileRecord:
    """Compile one spec for its arch; write binary, ISA and record under ``out_dir`` (if any)."""
    record = CompileRecord(name=spec.name, backend=spec.backend, arch=spec.arch, knobs=dict(spec.knobs), ok=False,
                           options=dict(spec.options))
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    start = time.perf_counter()
    try:
        source_cls = GluonASTSource if spec.gluon else ASTSource
        src = source_cls(spec.fn, spec.signature, spec.constexprs, spec.attrs)
        with interpreter.compiling():
            kernel = triton.compile(src, target=target(spec.arch), options=dict(spec.options))
    except Exception as exc:
        record.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
        record.seconds = round(time.perf_counter() - start, 2)
        if out_dir:
            record.write(out_dir)
        return record
    record.seconds = round(time.perf_counter() - start, 2)
    record.ok = True
    asm = kernel.asm
    work_dir = out_dir or tempfile.mkdtemp(prefix="pml_compile_")
    stem = os.path.join(work_dir, spec.name)
    if spec.arch.startswith("gfx"):
        isa = asm["amdgcn"]
        for key, value in amd_resources(isa).items():
            if hasattr(record, key):
                setattr(record, key, value)
        # Triton allocates LDS dynamically: the ISA's LDSByteSize is only the static part.
        record.lds_bytes = max(record.lds_bytes or 0, int(kernel.metadata.shared or 0))
        _write(stem + ".amdgcn", isa)
        _write(stem + ".hsaco", asm["hsaco"])
        record.isa, record.binary = stem + ".amdgcn", stem + ".hsaco"
    else:
        ptx = asm["ptx"]
        _write(stem + ".ptx", ptx)
        _write(stem + ".cubin", asm["cubin"])
        record.isa, record.binary = stem + ".ptx", stem + ".cubin"
        res = nvidia_resources(stem + ".cubin")
        record.vgprs = res.get("vgprs")
        record.scratch_bytes = res.get("scratch_bytes")
        # spills are judged where they cost: local memory in the matrix loops (from the SASS;
        # without it, any local memory counts)
        record.spill_count = None if record.scratch_bytes is None else int(record.scratch_bytes > 0)
        record.lds_bytes = max(res.get("shared_static", 0), int(kernel.metadata.shared or 0))
        record.mma_instructions = ptx_mma_instructions(ptx)
        if "sass" in res:
            _write(stem + ".sass", res["sass"])
            record.mma_instructions += sass_mma_instructions(res["sass"])
            if record.scratch_bytes:
                record.spill_count = hot_loop_spills(res["sass"])
    if out_dir:
        record.write(out_dir)
    else:
        record.isa = record.binary = None
        shutil.rmtree(work_dir, ignore_errors=True)
    return record


def _write(path: str, data) -> None:
    with atomic_write(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)


_POOL_SPECS: list[CompileSpec] = []


def _compile_index(index: int, out_dir: str | None) -> CompileRecord:
    return compile_spec(_POOL_SPECS[index], out_dir)


def compile_specs(specs: list[CompileSpec], out_dir: str | None, *, jobs: int = 1,
                  progress: bool = True) -> list[CompileRecord]:
    """Compile ``specs`` (in ``jobs`` forked processes when > 1), in order."""
    global _POOL_SPECS
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    records: list[CompileRecord | None] = [None] * len(specs)

    def report(i: int, rec: CompileRecord) -> None:
        records[i] = rec
        if progress:
            done = sum(r is not None for r in records)
            status = "ok" if rec.ok else "FAILED"
            print(f"[{done}/{len(specs)}] {rec.name}: {status} ({rec.seconds:.1f}s)", file=sys.stderr, flush=True)

    if jobs <= 1 or len(specs) <= 1:
        for i, spec in enumerate(specs):
            report(i, compile_spec(spec, out_dir))
        return records
    _POOL_SPECS = specs  # inherited by the forked workers; jitted functions do not pickle
    try:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            futures = {pool.submit(_compile_index, i, out_dir): i for i in range(len(specs))}
            for future in as_completed(futures):
                report(futures[future], future.result())
    finally:
        _POOL_SPECS = []
    return records


def table_kernel_configs(backend: str, arch: str) -> list[dict]:
    """The tuned table's configs for ``backend`` on ``arch``: each row's problem fields (those
    set) merged with its knobs, what a backend's compile capability builds from."""
    return [dict({k: v for k, v in fields.items() if v is not None}, **knobs)
            for fields, name, knobs in table.table_configs(arch) if name == backend]


def _compiler(backend: str):
    chosen = registry.get(backend)
    if chosen is None:
        raise ValueError(f"the {backend} backend is not importable: {registry.load_error(backend)}")
    if not isinstance(chosen, (SpecCompiled, SelfCompiled)):
        raise ValueError(f"backend {backend!r} cannot be cross-compiled (it offers neither compile_specs "
                         f"nor compile_records)")
    return chosen


def compile_archs(backend: str) -> list[str]:
    """The GPU archs of :data:`~paged_mqa_logits.arch.ARCH_SPECS` ``backend`` serves, judged on
    the DeepSeek decode shape (the archs ``compile --arch`` takes)."""
    shape = ShapeKey(heads=64, head_dim=HEAD_DIM, kv_block_size=64, preshuffle=False, batch=1, next_n=1)
    out = []
    for arch, spec in ARCH_SPECS.items():
        target = Target.described(arch, spec.usual_cu_num)
        if spec.warp_size and registry.why_not(backend, Problem.of(shape, target, max_model_len=4096), target) is None:
            out.append(arch)
    return out


def backend_specs(backend: str, arch: str, only_table: bool = False) -> list[CompileSpec]:
    """Specs of ``backend`` for ``arch``: its whole compile matrix, or with ``only_table`` the
    configs the tuned table can pick on ``arch``."""
    chosen = _compiler(backend)
    if not isinstance(chosen, SpecCompiled):
        raise ValueError(f"backend {backend!r} has no compile specs ({backend} compiles itself)")
    return chosen.compile_specs(arch, table_kernel_configs(backend, arch) if only_table else None)


def compile_all(backend: str, arch: str, out_dir: str | None, only_table: bool = False, progress: bool = True,
                jobs: int = 1) -> list[CompileRecord]:
    """Compile every candidate (or every table config) of ``backend`` for ``arch``."""
    arch = normalise_arch(arch)
    chosen = _compiler(backend)
    configs = table_kernel_configs(backend, arch) if only_table else None
    if isinstance(chosen, SpecCompiled):
        return compile_specs(chosen.compile_specs(arch, configs), out_dir, jobs=jobs, progress=progress)
    return chosen.compile_records(arch, out_dir, configs)


# ----------------------------------------------------------------------------- checks
def _native_fp8_mma(arch: str, mnemonic: str) -> bool:
    if arch == "gfx942":
        return mnemonic.startswith("v_mfma") and "fp8" in mnemonic
    if arch == "gfx950":
        return mnemonic.startswith("v_mfma") and ("fp8" in mnemonic or "f8f6f4" in mnemonic)
    if arch == "sm_90":
        return ("mma" in mnemonic and "e4m3" in mnemonic) and not mnemonic.startswith(("HMMA", "HGMMA", "QGMMA"))
    return False


def max_waves_per_simd(vgprs: int) -> int:
    """Waves a SIMD can host with ``vgprs`` (arch VGPRs + AGPRs) per lane: 512 registers per lane,
    allocated in blocks of 8, at most 8 waves: ``min(8, 512 // roundup(vgprs, 8))``."""
    granted = -(-max(vgprs, 1) // VGPR_GRANULE) * VGPR_GRANULE
    return min(8, 512 // granted)


def _head_sum_mma(record: CompileRecord, mnemonic: str) -> bool:
    """The bf16 MFMA a ``HeadSum=tensor`` kernel runs its weighted head sum on."""
    return record.knobs.get("HeadSum") == "tensor" and mnemonic.startswith("v_mfma_f32_") and "bf16" in mnemonic


def check_records(records: list[CompileRecord]) -> list[str]:
    """The checks CI applies to every compiled kernel; one message per violation (empty: all good).

    * every kernel compiled;
    * its matrix instructions are native fp8: ``v_mfma_*fp8*`` (gfx942), fp8 or ``f8f6f4``
      MFMA (gfx950), ``mma.sync``/``wgmma`` on e4m3 (sm_90, from the PTX), and no other MFMA
      but the bf16 head-sum MFMA of ``HeadSum=tensor``;
    * no spills: on AMD no scratch at all; on NVIDIA no local memory traffic inside the loops
      that issue matrix instructions (``sass.hot_loop_spills``; a warp-specialised kernel's
      producer warps, given few registers so its consumers get more, may keep some elsewhere);
    * AMD: the VGPRs allow the occupancy ``WavePerEU`` asks for
      (:func:`max_waves_per_simd` >= WavePerEU), and so does the compiler's own ``Occupancy``
      (which also accounts for LDS and SGPRs);
    * LDS / shared memory within the chip's limit (:data:`LDS_LIMIT_BYTES`).
    """
    problems = []
    for r in records:
        if not r.ok:
            problems.append(f"{r.name}: failed to compile: {r.error}")
            continue
        mmas = [m for m in r.mma_instructions if not m.startswith(("HMMA", "HGMMA", "QGMMA", "IMMA", "QMMA"))]
        if not any(_native_fp8_mma(r.arch, m) for m in mmas):
            problems.append(f"{r.name}: no native fp8 matrix instruction for {r.arch} (found {mmas or 'none'})")
        elif r.arch.startswith("gfx") and not all(_native_fp8_mma(r.arch, m) or _head_sum_mma(r, m) for m in mmas):
            problems.append(f"{r.name}: non-fp8 MFMA in the ISA: {[m for m in mmas if not _native_fp8_mma(r.arch, m)]}")
        if r.scratch_bytes is None:
            problems.append(f"{r.name}: the compiler reported no scratch size")
        elif r.scratch_bytes and r.arch.startswith("gfx"):
            problems.append(f"{r.name}: {r.scratch_bytes} bytes of scratch per lane (spills)")
        if r.spill_count:
            problems.append(f"{r.name}: {r.spill_count} register spills")
        waves = r.knobs.get("WavePerEU")
        if r.arch.startswith("gfx") and waves:
            if r.vgprs is None or max_waves_per_simd(r.vgprs) < int(waves):
                problems.append(f"{r.name}: {r.vgprs} VGPRs allow {max_waves_per_simd(r.vgprs or 512)} waves/SIMD, "
                                f"WavePerEU asks for {waves}")
            if r.occupancy is not None and r.occupancy < int(waves):
                problems.append(f"{r.name}: compiler occupancy {r.occupancy} < WavePerEU {waves}")
            # WavePerEU waves on each of the CU's 4 SIMDs = that many waves / num_warps programs,
            # whose LDS (dynamic, so not in the compiler's occupancy) must fit the CU together.
            programs = -(-int(waves) * 4 // int(r.options.get("num_warps", 4)))
            limit = LDS_LIMIT_BYTES.get(r.arch)
            if limit is not None and (r.lds_bytes or 0) * programs > limit:
                problems.append(f"{r.name}: {programs} programs x {r.lds_bytes} B of LDS > {limit} B per CU")
        limit = LDS_LIMIT_BYTES.get(r.arch)
        if limit is not None and (r.lds_bytes or 0) > limit:
            problems.append(f"{r.name}: {r.lds_bytes} bytes of LDS/shared memory > {limit}")
    return problems


def summary_table(records: list[CompileRecord]) -> str:
    """One line per kernel: registers (AMD: VGPRs incl. AGPRs), AGPRs, SGPRs, LDS / shared bytes,
    scratch bytes per lane, spills, waves per SIMD, compile seconds, matrix instructions."""
    def cell(value, width):
        return f"{'-' if value is None else value:>{width}}"

    head = (f"{'kernel':<100} {'ok':>3} {'vgpr':>5} {'agpr':>5} {'sgpr':>5} {'lds':>7} {'scr':>5} {'spl':>4} "
            f"{'occ':>4} {'sec':>5}  mma")
    lines = [head, "-" * len(head)]
    for r in records:
        lines.append(f"{r.name:<100} {'yes' if r.ok else 'NO':>3} {cell(r.vgprs, 5)} {cell(r.agprs, 5)} "
                     f"{cell(r.sgprs, 5)} {cell(r.lds_bytes, 7)} {cell(r.scratch_bytes, 5)} {cell(r.spill_count, 4)} "
                     f"{cell(r.occupancy, 4)} {cell(r.seconds, 5)}  "
                     f"{','.join(r.mma_instructions) if r.ok else r.error}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = ArgumentParser(prog="python -m paged_mqa_logits compile",
                       description="Cross-compile a backend's candidates for an arch (no GPU needed); ends with one "
                                   "summary line, exit status 1 if any kernel fails to compile or a check fails.")
    p.add_argument("--backend", required=True, choices=("gluon", "flydsl"))
    p.add_argument("--arch", required=True, help="gfx942, gfx950 or sm90")
    p.add_argument("--out", default=None, help="directory for binaries, ISA text and resource records "
                                               "(default: none, only the summary)")
    p.add_argument("--only-table", action="store_true", help="only the configs the tuned table can pick")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compile processes")
    a = p.parse_args(argv)
    if a.jobs < 1:
        raise CliError(f"argument --jobs: expected an int >= 1, got {a.jobs}")
    targets = compile_archs(a.backend)
    expected = arch_rule(normalise_arch(a.arch), targets)
    if expected is not None:
        raise CliError(f"argument --arch: expected {expected}, got {a.arch}")
    records = compile_all(a.backend, a.arch, a.out, only_table=a.only_table, jobs=a.jobs)
    if records:
        print(summary_table(records))
    problems = check_records(records)
    for line in problems:
        print(f"CHECK FAILED: {line}")
    print(summary_line(records, problems))
    return 1 if problems else 0


def summary_line(records: list[CompileRecord], problems: list[str]) -> str:
    """The last line of ``compile``: what was built and how many checks failed (a kernel that
    did not compile counts as a failed check, so ``checks failed`` is 0 exactly on success)."""
    built = sum(r.ok for r in records)
    seconds = sum(r.seconds or 0 for r in records)
    verdict = "OK" if not problems else "FAILED"
    return (f"compile: {built}/{len(records)} kernels built, {len(problems)} checks failed, "
            f"{seconds:.1f}s of compile time -> {verdict}")
