"""Host-side helpers every ``gluon`` variant shares (no device code: that is ``kernels/device.py`` and
the kernel modules).

* the schedule a config runs (``Schedule``, its default per arch) and the shape rules every
  Gluon kernel has (:func:`shape_reason`);
* the runtime arguments of a launch (:func:`kernel_arguments`: every Gluon kernel takes the
  same ones, in the same order) and their compile-time stand-ins (:func:`typical_arguments`,
  of ``triton_internals.specialise.StandIn``);
* compile configs: the problem a config describes, spec names, the
  representative problem set the compile matrices cover.
"""

from __future__ import annotations

import torch

from ...problem import LOGITS_DTYPES, Problem, ShapeKey, kv_fits_32bit  # noqa: F401  (the 32-bit cache rule; launchers use it from here)
from ...schedule import BALANCED, BALANCED_MIN_BATCH, SCHEDULES, SPLIT  # noqa: F401  (the variants' spelling)
from ...triton_internals.specialise import StandIn

#: ``HeadSum``: the weighted ReLU head sum in fp32 instructions (default), or on the tensor cores
#: (sm_90 wgmma, gfx950 MFMA) from scores rounded to bf16: docs/CONTRACT.md states its error bound
HEAD_SUMS = ("fp32", "tensor")


def default_schedule(problem) -> str:
    """The schedule of a config that does not name one. sm_90: ``balanced`` from
    ``schedule.BALANCED_MIN_BATCH`` sequences on, ``split`` below (measured on the H200, see
    there). CDNA: ``split``, which the shipped priors were chosen for: the balanced body costs
    the MFMA kernel 24 VGPRs and its key prefetch at WavePerEU 4 (static proxies, no MI300/MI355X
    measurement yet); ``balanced`` is a tuner candidate there. Tuned rows name their schedule."""
    if problem.arch == "sm_90" and problem.shape_key.batch >= BALANCED_MIN_BATCH:
        return BALANCED
    return SPLIT


def schedule_of(problem, config: dict) -> str:
    """The ``Schedule`` knob (``balanced`` / ``split``), its default when unset."""
    value = config.get("Schedule")
    if value is None:
        return default_schedule(problem)
    if value not in SCHEDULES:
        raise ValueError(f"Schedule must be one of {', '.join(SCHEDULES)}, got {value!r}")
    return value


def shape_reason(problem, archs: tuple[str, ...], fp8_by_arch: dict[str, str]) -> str | None:
    """Why the register-MMA kernel cannot serve ``problem`` on these archs (``None``: it can)."""
    if problem.arch not in archs:
        return f"arch {problem.arch} is not one of {', '.join(archs)}"
    if problem.fp8 != fp8_by_arch[problem.arch]:
        return f"{problem.arch} computes in fp8 e4m3{fp8_by_arch[problem.arch]}, got e4m3{problem.fp8}"
    key = problem.shape_key
    if key.head_dim != 128:
        return f"head_dim must be 128, got {key.head_dim}"
    h = key.heads
    if h < 16 or h & (h - 1):
        return f"heads must be a power of two >= 16 (tensor shapes are powers of two), got {h}"
    if key.preshuffle and key.kv_block_size % 16:
        return f"Preshuffle needs kv_block_size % 16 == 0, got {key.kv_block_size}"
    return None


def config_key(config: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in config.items() if v is not None))


def kernel_arguments(args, num_splits: int) -> tuple:
    """Runtime (non-constexpr) arguments of every Gluon kernel, in order."""
    q, kv, w, out, lens, table = args.q, args.kv_cache, args.weights, args.out, args.context_lens, args.block_table
    # 1-D lengths have no j stride; 1 keeps the same specialisation as contiguous 2-D lengths.
    stride_lens_j = lens.stride(1) if lens.dim() == 2 else 1
    return (
        q, kv.view(q.dtype), kv.view(torch.float32), w, out, lens, table,
        q.stride(0), q.stride(1), q.stride(2), kv.stride(0), w.stride(0), out.stride(0),
        lens.stride(0), stride_lens_j, table.stride(0),
        args.max_model_len, args.max_blocks, num_splits, args.problem.shape_key.batch, args.num_blocks,
    )


def typical_arguments(problem, *, kv_32bit: bool = True, num_splits: int = 2) -> tuple:
    """Stand-ins for what :func:`kernel_arguments` passes on a typical vLLM call of ``problem``:
    contiguous q / weights / lengths, packed cache blocks, an output of ``problem.logits_dtype``
    as wide as ``max_model_len`` (its pointer type is what tells the fp32 and bf16 kernels
    apart) and a block table as wide as the output."""
    fp8 = torch.float8_e4m3fnuz if problem.fp8 == "fnuz" else torch.float8_e4m3fn
    key = problem.shape_key
    b, n, h, d, kv_block_size = key.batch, key.next_n, key.heads, key.head_dim, key.kv_block_size
    width = problem.max_model_len
    max_blocks = -(-width // kv_block_size)
    block_bytes = kv_block_size * (d + 4)
    cache_bytes = (1 << 30) if kv_32bit else (1 << 33)
    rows = b * n
    logits = LOGITS_DTYPES[key.logits_dtype]
    return (
        StandIn(fp8, b * n * h * d), StandIn(fp8, cache_bytes), StandIn(torch.float32, cache_bytes),
        StandIn(torch.float32, rows * h * 4), StandIn(logits, rows * width * logits.itemsize),
        StandIn(torch.int32, rows * 4), StandIn(torch.int32, b * max_blocks * 4),
        n * h * d, h * d, d, block_bytes, h, width,
        n if problem.lens_2d else 1, 1, max_blocks,
        width, max_blocks, num_splits, b, cache_bytes // block_bytes,
    )


# ----------------------------------------------------------------------------- compile specs
#: problem fields a compile config may set (the rest take typical values)
PROBLEM_FIELDS = ("heads", "next_n", "kv_block_size", "preshuffle", "lens_2d", "logits_dtype")


def problem_for(arch: str, fp8: str, fields: dict):
    """The :class:`Problem` a compile config describes: ``fields`` (see :data:`PROBLEM_FIELDS`) over
    typical values (64 heads, next_n 1, 64-token blocks, 2-D lengths, 128k positions, fp32 logits)."""
    shape_key = ShapeKey(heads=int(fields.get("heads", 64)), head_dim=128,
                         kv_block_size=int(fields.get("kv_block_size", 64)),
                         preshuffle=bool(fields.get("preshuffle", False)), batch=int(fields.get("batch") or 64),
                         next_n=int(fields.get("next_n", 1)),
                         logits_dtype=fields.get("logits_dtype") or "fp32")
    return Problem(
        arch=arch, cu_num=int(fields.get("cu_num") or 0), shape_key=shape_key, context=fields.get("context"),
        lens_2d=bool(fields.get("lens_2d", True)), fp8=fp8, max_model_len=int(fields.get("max_model_len") or 131072),
    )


def problem_fields(problem) -> dict:
    return {name: getattr(problem if name == "lens_2d" else problem.shape_key, name) for name in PROBLEM_FIELDS}


def spec_name(backend: str, variant: str, arch: str, problem, knobs: dict, kv_32bit: bool) -> str:
    """Filesystem-safe unique name: backend_variant_arch_shape_knobs."""
    key = problem.shape_key
    shape = (f"h{key.heads}_n{key.next_n}_bs{key.kv_block_size}{'p' if key.preshuffle else ''}"
             f"_{'l2' if problem.lens_2d else 'l1'}{'' if kv_32bit else '_kv64'}"
             f"{'_bf16' if key.logits_dtype == 'bf16' else ''}")
    knob_text = "_".join(f"{k}{v}" for k, v in sorted(knobs.items()) if k != "variant")
    return f"{backend}_{variant}_{arch}_{shape}_{knob_text}"


def representative_problems(arch: str) -> list[dict]:
    """Shapes whose candidates ``compile`` builds by default (and CI by subsets of it).

    What changes the generated code is: heads (operand and reduction sizes), next_n (rows per
    program with ReuseKV, the 2-D length loop), kv_block_size (block-table index math:
    1 / power-of-two sizes below, equal to and above ChunkK), Preshuffle (key offsets) and
    1-D vs 2-D lengths; the knobs multiply these. Batch, context and CU count only change
    host-side numbers (grid, SplitKV), never the kernel.
    """
    out = []
    for heads in (32, 64):
        for next_n in (1, 2, 4, 8):
            out.append({"heads": heads, "next_n": next_n, "kv_block_size": 64, "preshuffle": True, "lens_2d": True})
        out.append({"heads": heads, "next_n": 3, "kv_block_size": 64, "preshuffle": False, "lens_2d": False})
    for kv_block_size, pre in ((1, False), (16, True), (16, False), (128, True), (256, False)):
        out.append({"heads": 64, "next_n": 2, "kv_block_size": kv_block_size, "preshuffle": pre, "lens_2d": True})
    return out


def candidate_matrix(arch: str, fp8: str, candidates) -> list[dict]:
    """Every candidate (``candidates(problem)``) of every :func:`representative_problems` shape,
    as compile configs (problem fields + knobs)."""
    out = []
    for fields in representative_problems(arch):
        problem = problem_for(arch, fp8, fields)
        out += [dict(fields, **cand) for cand in candidates(problem)]
    return out


def deduplicated_matrix(variant, arch: str, heads=(32, 64), next_ns=(1, 2, 3, 4), kv_block_sizes=(32, 64)) -> list[dict]:
    """Every candidate and the default of ``variant`` for heads x next_n x KVBlockSize (plain
    cache, 2-D lengths), and the default with bf16 logits, as compile configs; one per kernel
    (``variant.kernel_key`` with the logits dtype), so shapes that build the same kernel
    compile it once. Serves the variants whose problems come from ``variant.spec_problem``."""
    out, seen = [], set()
    for h in heads:
        for next_n in next_ns:
            for kv_block_size in kv_block_sizes:
                fields = {"heads": h, "next_n": next_n, "kv_block_size": kv_block_size, "preshuffle": False,
                          "lens_2d": True}
                problem = variant.spec_problem(arch, fields)
                default = variant.default_config(problem)
                configs = [dict(fields, **c) for c in variant.candidates(problem) + [default]]
                configs.append(dict(fields, logits_dtype="bf16", **default))
                for cfg in configs:
                    key = (cfg.get("logits_dtype", "fp32"), variant.kernel_key(problem, cfg))
                    if key not in seen:
                        seen.add(key)
                        out.append(cfg)
    return out
