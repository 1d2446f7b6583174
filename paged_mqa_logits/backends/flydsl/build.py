"""Compile FlyDSL kernels for gfx942 / gfx950 on a machine without a GPU.

FlyDSL's compile-only mode is steered by process-global environment variables (``COMPILE_ONLY``,
``ARCH``, ``FLYDSL_GPU_ARCH``) and caches the target arch, so every arch is compiled in child
processes (``python -m paged_mqa_logits.backends.flydsl.build``) with its own environment:

* ``COMPILE_ONLY=1``: trace, lower and link, never create an execution engine or launch;
* ``ARCH`` and ``FLYDSL_GPU_ARCH``: the target (FlyDSL's own arch query would answer gfx942);
* ``ROCM_PATH``: FlyDSL links the code object with ``$ROCM_PATH/llvm/bin/ld.lld``. Without a
  ROCm install we point it at a temporary directory holding a stand-in ``ld.lld`` that calls
  Triton's in-process linker (``triton_internals.toolchain.link_hsaco``), for the compile only;
* ``FLYDSL_DEBUG_DUMP_ASM=1`` + ``FLYDSL_DUMP_DIR``: FlyDSL writes the final ISA.

Per kernel the child writes ``<name>.hsaco`` (the code object, taken from the compiled module's
``gpu.binary``), ``<name>.s`` (the ISA) and ``<name>.json`` (the :class:`CompileRecord`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict

from ... import triton_internals
from ...arch import native_fp8, normalise_arch
from ...files import atomic_write
from ...problem import KV_FORMATS, Problem, ShapeKey
from ..base import CompileRecord
from .plan import ARCHS, HEADS, KV_BLOCK_SIZES, LDS_PER_CU, KernelPlan
from .toolchain import NOT_INSTALLED, flydsl_installed

BACKEND_NAME = "flydsl"
MAX_WORKERS = 4

# ============================================================================ what to compile
def _problem(arch: str, heads: int, next_n: int, kv_block_size: int, preshuffle: bool, lens_2d: bool,
             kv_format: str = "fp8", logits_dtype: str = "fp32"):
    shape_key = ShapeKey(heads=heads, head_dim=128, kv_block_size=kv_block_size, preshuffle=preshuffle, batch=1,
                         next_n=next_n, kv_format=kv_format, logits_dtype=logits_dtype)
    return Problem(arch, 0, shape_key, None, lens_2d, native_fp8(arch), 8192)


def knob_space(backend, arch: str) -> list[KernelPlan]:
    """Every candidate (ChunkK x WavePerEU x Schedule x Mfma) of the canonical layout (KVBlockSize 64, Preshuffle,
    2-D lengths) for heads 32/64 and next_n 1..8, plus each cache/length layout (KVBlockSize
    16..256, plain and Preshuffle, 1-D and 2-D) with the default knobs for two shapes; each for
    every query/key format ``arch`` serves; and bf16 logits with the default knobs for every
    (format, heads, next_n) of the canonical layout (they change only the store). ``backend``
    is the flydsl backend object, whose ``plan`` realises a config."""
    plans: dict[str, KernelPlan] = {}
    for kv_format in KV_FORMATS:
        if backend.unsupported(_problem(arch, 64, 1, 64, True, True, kv_format)) is not None:
            continue
        for heads in HEADS:
            for next_n in range(1, 9):
                problem = _problem(arch, heads, next_n, 64, True, True, kv_format)
                for plan in (backend.plan(problem, config) for config in backend.candidates(problem)):
                    plans[plan.name] = plan
                bf16 = _problem(arch, heads, next_n, 64, True, True, kv_format, "bf16")
                if backend.unsupported(bf16) is None:
                    plan = backend.plan(bf16, backend.default_config(bf16))
                    plans[plan.name] = plan
        for heads, next_n in ((64, 1), (32, 3)):
            for kv_block_size in KV_BLOCK_SIZES:
                for preshuffle in (True, False):
                    for lens_2d in (True, False):
                        problem = _problem(arch, heads, next_n, kv_block_size, preshuffle, lens_2d, kv_format)
                        plan = backend.plan(problem, backend.default_config(problem))
                        plans[plan.name] = plan
    return list(plans.values())


def config_plans(backend, arch: str, configs: list[dict]) -> list[KernelPlan]:
    """The plans of table configs (row fields merged with the row's knobs) for ``arch``, in both
    length layouts (the table does not key on them)."""
    plans: dict[str, KernelPlan] = {}
    for config in configs:
        knobs = {k: v for k, v in config.items() if k in backend.knobs}
        for lens_2d in (True, False):
            problem = _problem(arch, config["heads"], config["next_n"], config["kv_block_size"],
                               bool(config["preshuffle"]), lens_2d, config.get("kv_format") or "fp8",
                               config.get("logits_dtype") or "fp32")
            if backend.unsupported(problem) is None:
                plan = backend.plan(problem, knobs)
                plans[plan.name] = plan
    return list(plans.values())


# ============================================================================ checks
def occupancy(arch: str, vgprs: int, lds_bytes: int, waves_per_simd: int = 1) -> int:
    """Waves per SIMD this kernel can reach: VGPRs (512 per lane, granules of 8) and LDS
    (``waves_per_simd`` waves per SIMD per workgroup: workgroups per CU x that)."""
    by_vgprs = 512 // max(8, (vgprs + 7) // 8 * 8)
    by_lds = LDS_PER_CU[arch] // lds_bytes * waves_per_simd if lds_bytes else 8
    return max(0, min(8, by_vgprs, by_lds))


def parse_isa(arch: str, text: str, waves_per_simd: int = 1) -> dict:
    """Resources from the ISA text's kernel metadata (``.vgpr_count`` & co.); ``waves_per_simd``:
    waves of one workgroup on each SIMD (for the LDS limit on occupancy)."""

    def first_int(pattern):
        match = re.search(pattern, text, re.M)
        return int(match.group(1)) if match else None

    num_vgpr = first_int(r"\.num_vgpr,\s*(\d+)")
    num_agpr = first_int(r"\.num_agpr,\s*(\d+)") or 0
    vgpr_count = first_int(r"^\s*\.vgpr_count:\s*(\d+)") or 0
    # gfx90a+: AGPRs follow the arch VGPRs (aligned to 4) in one 512-entry file
    unified = ((num_vgpr or 0) + 3) // 4 * 4 + num_agpr if num_agpr else (num_vgpr or 0)
    vgprs = max(vgpr_count, unified)
    lds = first_int(r"^\s*\.group_segment_fixed_size:\s*(\d+)")
    spills = (first_int(r"^\s*\.vgpr_spill_count:\s*(\d+)") or 0) + (first_int(r"^\s*\.sgpr_spill_count:\s*(\d+)") or 0)
    return {
        "vgprs": vgprs,
        "agprs": num_agpr,
        "sgprs": first_int(r"^\s*\.sgpr_count:\s*(\d+)"),
        "lds_bytes": lds,
        "scratch_bytes": first_int(r"^\s*\.private_segment_fixed_size:\s*(\d+)"),
        "spill_count": spills,
        "occupancy": occupancy(arch, vgprs, lds or 0, waves_per_simd),
        "mma_instructions": sorted(set(re.findall(r"\bv_mfma_\w+", text))),
    }


# ============================================================================ parent side
def _linker_stand_in(directory: str) -> str | None:
    """``ROCM_PATH`` to use for the link: ``None`` if a real ``ld.lld`` is installed, else a
    directory with a stand-in ``llvm/bin/ld.lld`` calling Triton's in-process linker."""
    root = os.environ.get("ROCM_PATH") or "/opt/rocm"
    if os.access(os.path.join(root, "llvm", "bin", "ld.lld"), os.X_OK):
        return None
    bin_dir = os.path.join(directory, "llvm", "bin")
    os.makedirs(bin_dir, exist_ok=True)
    script = os.path.join(bin_dir, "ld.lld")
    with open(script, "w") as f:
        f.write(f"#!{sys.executable}\nINTERNALS_DIR = {_INTERNALS_DIR!r}\n" + _STAND_IN_SOURCE)
    os.chmod(script, 0o755)
    return directory


#: the package's Triton internals package; the stand-in loads it by path (it imports nothing else
#: of the package), since importing the package would import torch for every link
_INTERNALS_DIR = os.path.dirname(os.path.abspath(triton_internals.__file__))
_STAND_IN_SOURCE = '''"""ld.lld stand-in for FlyDSL compile-only builds: ld.lld -shared IN.o -o OUT.hsaco."""
import importlib
import importlib.util
import os
import sys

spec = importlib.util.spec_from_file_location("paged_mqa_logits_triton_internals",
                                              os.path.join(INTERNALS_DIR, "__init__.py"),
                                              submodule_search_locations=[INTERNALS_DIR])
sys.modules[spec.name] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sys.modules[spec.name])
toolchain = importlib.import_module(spec.name + ".toolchain")

args, inputs, output = sys.argv[1:], [], None
i = 0
while i < len(args):
    if args[i] == "-o":
        output, i = args[i + 1], i + 2
        continue
    if not args[i].startswith("-"):
        inputs.append(args[i])
    i += 1
if output is None or len(inputs) != 1:
    sys.exit(f"ld.lld stand-in: expected `-shared IN.o -o OUT`, got {args}")
toolchain.link_hsaco(inputs[0], output)
'''


def compile_plans(arch: str, plans: list[KernelPlan], out_dir: str | None, workers: int | None = None,
                  progress: bool = True) -> list[CompileRecord]:
    """Compile ``plans`` for ``arch`` in child processes (up to ``workers`` in parallel)."""
    if arch not in ARCHS:
        raise ValueError(f"flydsl compiles for {'/'.join(ARCHS)}, not {arch}")
    if not flydsl_installed():
        raise RuntimeError(NOT_INSTALLED)
    if not plans:
        return []
    workers = max(1, min(workers or os.cpu_count() or 1, MAX_WORKERS, len(plans)))
    with tempfile.TemporaryDirectory(prefix="flydsl_build_") as tmp:
        target = out_dir or os.path.join(tmp, "out")
        os.makedirs(target, exist_ok=True)
        env = dict(os.environ, COMPILE_ONLY="1", ARCH=arch, FLYDSL_GPU_ARCH=arch, FLYDSL_DEBUG_DUMP_ASM="1",
                   FLYDSL_RUNTIME_ENABLE_CACHE="0")
        rocm = _linker_stand_in(os.path.join(tmp, "rocm"))
        if rocm is not None:
            env["ROCM_PATH"] = rocm
        # the workers import this package from where this process found it
        package_root = os.path.dirname(importlib.util.find_spec("paged_mqa_logits").submodule_search_locations[0])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        procs = []
        for w in range(workers):
            spec = os.path.join(tmp, f"plans{w}.json")
            with open(spec, "w") as f:
                json.dump([asdict(p) for p in plans[w::workers]], f)
            cmd = [sys.executable, "-m", "paged_mqa_logits.backends.flydsl.build", "--worker", spec, "--out", target,
                   "--dump", os.path.join(tmp, f"dump{w}")]
            # stderr to a file, not a pipe: LLVM's warnings would fill a pipe nobody reads yet
            log = open(os.path.join(tmp, f"worker{w}.log"), "w+")
            procs.append((subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=log, text=True), log))
        records: dict[str, CompileRecord] = {}
        failures: list[str] = []
        lock = threading.Lock()

        def collect(proc, log):
            for line in proc.stdout:
                if not line.startswith("{"):
                    continue
                record = CompileRecord(**json.loads(line))
                with lock:
                    records[record.name] = record
                    if progress:
                        print(f"[{len(records)}/{len(plans)}] {record.name}: {'ok' if record.ok else 'FAILED'} "
                              f"({record.seconds}s)", file=sys.stderr, flush=True)
            if proc.wait() != 0:
                log.seek(0)
                with lock:
                    failures.append(log.read()[-4000:])
            log.close()

        readers = [threading.Thread(target=collect, args=pair) for pair in procs]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join()
        for plan in plans:  # a worker that died takes its remaining kernels with it
            if plan.name not in records:
                records[plan.name] = CompileRecord(plan.name, BACKEND_NAME, arch, _knobs(plan), False,
                                                   error="worker failed: " + " | ".join(failures)[-2000:])
        out = [records[p.name] for p in plans]
        if out_dir is None:
            for record in out:
                record.binary = record.isa = None
        return out


def compile_records(backend, arch: str, out_dir: str | None, configs: list[dict] | None = None) -> list[CompileRecord]:
    """Compile every candidate of the knob space (``configs`` ``None``) or the given table
    configs for ``arch`` without a GPU. See :func:`knob_space` / :func:`config_plans`."""
    arch = normalise_arch(arch)
    plans = knob_space(backend, arch) if configs is None else config_plans(backend, arch, configs)
    return compile_plans(arch, plans, out_dir)


def _knobs(plan: KernelPlan) -> dict:
    return {"ChunkK": plan.chunk_k, "WavePerEU": plan.wave_per_eu, "SplitKV": 0, "Schedule": plan.schedule,
            "Mfma": plan.mfma, "WaveRoles": plan.wave_roles}


# ============================================================================ child side
def _code_object(ir_text: str) -> bytes:
    """The ELF code object inside a compiled module's ``gpu.binary``."""
    from flydsl._mlir import ir
    from flydsl._mlir.dialects import gpu
    from flydsl.compiler.jit_function import _create_mlir_context

    with _create_mlir_context():
        module = ir.Module.parse(ir_text)
        for op in module.body.operations:
            if op.operation.name == "gpu.binary":
                return bytes(gpu.ObjectAttr(op.attributes["objects"][0]).object)
    raise RuntimeError("compiled module has no gpu.binary")


def _placeholder_args(plan: KernelPlan) -> tuple:
    """CPU tensors of the right dtypes and ranks: under COMPILE_ONLY nothing is launched, only
    the (shape-independent) specialisation is compiled."""
    import torch

    u8, f32, i32 = torch.uint8, torch.float32, torch.int32
    logits = torch.bfloat16 if plan.logits_dtype == "bf16" else f32
    tensors = (torch.zeros(1, 1, 1, 16, dtype=u8), torch.zeros(1, 1, 1, 16, dtype=u8), torch.zeros(1, 4, dtype=f32),
               torch.zeros(1, 4, dtype=logits), torch.zeros(1, 1, dtype=i32), torch.zeros(1, 1, dtype=i32),
               torch.zeros(1, 1, 1, dtype=i32))
    return tensors + (1,) * 15


def _compile_one(plan: KernelPlan, out_dir: str, dump_dir: str) -> CompileRecord:
    from .kernel import launcher

    record = CompileRecord(plan.name, BACKEND_NAME, plan.arch, _knobs(plan), False,
                           options={"waves_per_eu": plan.wave_per_eu, "num_warps": plan.waves})
    os.environ["FLYDSL_DUMP_DIR"] = dump = os.path.join(dump_dir, plan.name)
    start = time.perf_counter()
    try:
        launch = launcher(plan)
        launch(*_placeholder_args(plan))
        binary = _code_object(launch._last_compiled[1]._ir_text)
        isa_files = [os.path.join(root, f) for root, _, files in os.walk(dump) for f in files if f.endswith(".s")]
        if not isa_files:
            raise RuntimeError(f"FlyDSL wrote no ISA under {dump}")
        with open(isa_files[0]) as f:
            isa = f.read()
    except Exception as exc:  # one bad kernel must not hide the others
        record.error = f"{type(exc).__name__}: {exc}"[-4000:]
        record.seconds = round(time.perf_counter() - start, 2)
        return record
    record.seconds = round(time.perf_counter() - start, 2)
    record.binary = os.path.join(out_dir, plan.name + ".hsaco")
    record.isa = os.path.join(out_dir, plan.name + ".s")
    with atomic_write(record.binary, "wb") as f:
        f.write(binary)
    with atomic_write(record.isa) as f:
        f.write(isa)
    for key, value in parse_isa(plan.arch, isa, plan.waves_per_simd).items():
        setattr(record, key, value)
    record.ok = True
    record.write(out_dir)
    return record


def _worker(spec: str, out_dir: str, dump_dir: str) -> None:
    with open(spec) as f:
        plans = [KernelPlan(**p) for p in json.load(f)]
    for plan in plans:
        if os.environ.get("ARCH") != plan.arch or os.environ.get("COMPILE_ONLY") != "1":
            raise SystemExit("build worker: run through compile_plans (COMPILE_ONLY=1, ARCH=<plan arch>)")
        record = _compile_one(plan, out_dir, dump_dir)
        print(json.dumps(asdict(record)), flush=True)
    shutil.rmtree(dump_dir, ignore_errors=True)


def main(argv=None) -> int:
    """Internal worker entry (``compile_plans`` runs it); the user-facing command is
    ``python -m paged_mqa_logits compile --backend flydsl --arch gfx942|gfx950``."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--worker", metavar="PLANS_JSON", required=True, help="compile the plans in this file")
    parser.add_argument("--out", required=True, help="directory for .hsaco/.s/.json")
    parser.add_argument("--dump", required=True, help="FlyDSL dump directory of this worker")
    args = parser.parse_args(argv)
    _worker(args.worker, args.out, args.dump)
    return 0


if __name__ == "__main__":
    sys.exit(main())
