"""The ``flydsl`` backend object: what it serves, its knobs, and the guarded launch.

Importing this module never imports flydsl (nor does anything else in the package at import
time): the kernel modules are imported on the first launch or compile.

Safety rule: launching a FlyDSL kernel without ``COMPILE_ONLY`` on a machine without a ROCm
runtime aborts the whole process (it is not an exception). So :meth:`unavailable` refuses a
target unless a ROCm GPU of its arch is really present (``torch.version.hip``, a visible device,
its ``gcnArchName`` -- never the ``PAGED_MQA_LOGITS_ARCH`` override), and :meth:`launch`
re-checks for the tensors it is given before touching flydsl.

Knobs (CSV columns): ``ChunkK`` (tokens per LDS stage: 64 or 128), ``WavePerEU`` (the occupancy
target; the kernel runs one wave per SIMD, so this is also workgroups per CU), ``Schedule``
(``balanced``, the default: a persistent grid of ``CUs x WavePerEU`` workgroups sharing the
batch's work evenly, computed in the kernel from the device lengths; ``split``: ``SplitKV``
workgroups per sequence), ``SplitKV`` (``split`` only; 0 = :func:`derive_split_kv` with
``ctas_per_cu = WavePerEU``, from the CU count, batch and the context hint -- host-only, no
sync), ``Mfma`` (gfx950: ``f8f6f4``, the default, the scaled 16x16x128 MFMA with neutral
scales; ``fp8``, the plain 16x16x32 one -- gfx942 has only ``fp8``) and ``WaveRoles``
(``uniform``, the default: 4 waves that each copy and score; ``split``: 8 waves, 4 that only
copy the next stage into LDS and 4 that only score; ``WavePerEU`` even, see ``plan.WAVE_ROLES``).

Formats: fp8 or MXFP4 queries and keys, fp32 or bf16 logits. MXFP4 runs on gfx950's scaled MFMA
with e2m1 operands (``Mfma=f8f6f4``), or widened to fp8 for the plain MFMA (``Mfma=fp8``: the
only kind on gfx942; shapes whose every configuration would spill registers are declined, so
dispatch falls through); see ``plan.KV_FORMAT_MFMA``.
"""

from __future__ import annotations

import importlib

import torch

from ...arch import native_fp8
from ...problem import KV_FORMATS, LOGITS_DTYPES, LaunchArgs, Problem, ShapeKey, Target
from ...schedule import BALANCED, SCHEDULES, derive_split_kv, persistent_programs
from ..base import MAX_SPLIT_KV, check_knob_space, formats_unsupported
from . import build
from .plan import ARCHS, CHUNK_KS, KV_FORMAT_MFMA, MFMA_KINDS, WAVE_PER_EUS, WAVE_ROLES, KernelPlan
from .toolchain import NOT_INSTALLED, flydsl_installed

def rocm_runtime_problem(arch: str) -> str | None:
    """Why this process cannot run a ROCm kernel for ``arch`` (``None`` = it can)."""
    if not getattr(torch.version, "hip", None):
        return "no ROCm runtime: this torch is not a ROCm build (torch.version.hip is unset)"
    if not torch.cuda.is_available():
        return "no ROCm runtime: torch sees no ROCm GPU"
    device_arch = torch.cuda.get_device_properties(torch.cuda.current_device()).gcnArchName.split(":")[0]
    if device_arch != arch:
        return f"the ROCm device is {device_arch}, not {arch}"
    return None


class FlyDSLBackend:
    name = "flydsl"
    knobs = ("ChunkK", "WavePerEU", "SplitKV", "Schedule", "Mfma", "WaveRoles")
    #: allowed values per knob (what fits a shape is judged by :meth:`KernelPlan.config_error`)
    KNOB_SPACE = {"ChunkK": CHUNK_KS, "WavePerEU": WAVE_PER_EUS, "SplitKV": range(0, MAX_SPLIT_KV + 1),
                  "Schedule": SCHEDULES, "Mfma": tuple(dict.fromkeys(k for kinds in MFMA_KINDS.values() for k in kinds)),
                  "WaveRoles": WAVE_ROLES}

    def check_config(self, config: dict, problem: Problem | None = None) -> str | None:
        """The knob space, then the plan's own check on ``problem`` (or on the typical shape,
        64 heads, next_n 1, 64-token blocks, of either arch: accepted if one accepts)."""
        error = check_knob_space(self.name, config, self.KNOB_SPACE)
        if error is not None:
            return error
        if problem is not None and problem.arch not in ARCHS:
            return f"flydsl runs on {', '.join(ARCHS)}, not {problem.arch}"
        problems = [problem] if problem is not None else [
            Problem(arch=a, cu_num=0, shape_key=ShapeKey(heads=64, head_dim=128, kv_block_size=64, preshuffle=False,
                                                         batch=1, next_n=1),
                    context=None, lens_2d=True, fp8=native_fp8(a), max_model_len=131072) for a in ARCHS]
        errors = []
        for p in problems:
            plan = self.plan(p, config)
            if plan.problem_error() is not None:  # a shape it does not serve: dispatch skips the row
                return None
            error = plan.config_error()
            if error is None:
                return None
            errors.append(f"{p.arch}: {error}")
        return "flydsl config " + "; ".join(errors)

    # ------------------------------------------------------------------ what it serves
    def unsupported(self, problem: Problem) -> str | None:
        if problem.arch not in ARCHS:
            return f"flydsl kernels are built for gfx942/gfx950, not {problem.arch}"
        formats = formats_unsupported("flydsl", problem, kv_formats=KV_FORMATS, logits_dtypes=tuple(LOGITS_DTYPES))
        if formats is not None:
            return formats
        # an MXFP4 call has no fp8 flavour of its own (``problem.fp8`` is the chip's)
        key = problem.shape_key
        if key.kv_format == "fp8" and problem.fp8 != native_fp8(problem.arch):
            return (f"{problem.arch} computes fp8 e4m3{native_fp8(problem.arch)} natively; the inputs are "
                    f"e4m3{problem.fp8}")
        if key.head_dim != 128:
            return f"head_dim must be 128, got {key.head_dim}"
        plan = self.plan(problem, {})
        error = plan.problem_error()
        if error is None and key.kv_format == "fp4" and not self.candidates(problem):  # widened, widest shapes
            return f"no {problem.arch} kernel configuration fits: {plan.config_error()}"
        return error

    def unavailable(self, target: Target) -> str | None:
        if not flydsl_installed():
            return NOT_INSTALLED
        if target.device_type != "cuda":
            return f"no ROCm runtime: the tensors are on {target.device_type}"
        return rocm_runtime_problem(target.arch)

    def plan(self, problem: Problem, config: dict) -> KernelPlan:
        knobs = {**self.default_config(problem), **{k: v for k, v in config.items() if v is not None}}
        return self._bare_plan(problem, knobs)

    # ------------------------------------------------------------------ knobs
    def candidates(self, problem: Problem) -> list[dict]:
        if problem.arch not in ARCHS:
            return []
        out = []
        for roles in WAVE_ROLES:
            for schedule in SCHEDULES:
                for mfma in MFMA_KINDS[problem.arch]:
                    for chunk_k in CHUNK_KS:
                        for wave_per_eu in WAVE_PER_EUS:
                            config = {"ChunkK": chunk_k, "WavePerEU": wave_per_eu, "SplitKV": 0,
                                      "Schedule": schedule, "Mfma": mfma, "WaveRoles": roles}
                            if self.plan(problem, config).config_error() is None:
                                out.append(config)
        return out

    def default_config(self, problem: Problem) -> dict:
        """ChunkK 64, the arch's first MFMA (gfx950: the scaled one), uniform wave roles (no
        GPU has run the split roles: they are a tuner candidate), the balanced schedule where
        the cache layout allows it (else split) and the highest occupancy (up to 4 workgroups
        per CU) the shape fits."""
        kinds = [k for k in MFMA_KINDS.get(problem.arch, ("fp8",))
                 if k in KV_FORMAT_MFMA.get(problem.shape_key.kv_format, ())]
        base = {"ChunkK": 64, "SplitKV": 0, "Mfma": (kinds or ["fp8"])[0],
                "WaveRoles": WAVE_ROLES[0]}
        for schedule in SCHEDULES:
            for wave_per_eu in sorted(WAVE_PER_EUS, reverse=True):
                config = {**base, "Schedule": schedule, "WavePerEU": wave_per_eu}
                if problem.arch not in ARCHS or self._bare_plan(problem, config).config_error() is None:
                    return config
        return {**base, "Schedule": BALANCED, "WavePerEU": 1}

    def _bare_plan(self, problem: Problem, config: dict) -> KernelPlan:
        key = problem.shape_key
        return KernelPlan(arch=problem.arch, heads=key.heads, next_n=key.next_n,
                          kv_block_size=key.kv_block_size, preshuffle=key.preshuffle,
                          lens_2d=problem.lens_2d, chunk_k=int(config["ChunkK"]), wave_per_eu=int(config["WavePerEU"]),
                          schedule=str(config["Schedule"]), mfma=str(config["Mfma"]),
                          wave_roles=str(config.get("WaveRoles", WAVE_ROLES[0])), kv_format=key.kv_format,
                          logits_dtype=key.logits_dtype)

    def grid_x(self, problem: Problem, plan: KernelPlan, config: dict) -> int:
        """Workgroups along x. Balanced: one resident wave of them, ``CUs x`` workgroups per CU
        (``WavePerEU``: the kernel runs one wave per SIMD, or two with ``WaveRoles=split``).
        Split: ``SplitKV`` per sequence if set, else the host rule with that many workgroups
        per CU."""
        if plan.schedule == BALANCED:
            return persistent_programs(problem.cu_num, plan.workgroups_per_cu)
        splits = int(config.get("SplitKV") or 0)
        if splits > 0:
            return splits
        return derive_split_kv(max(problem.cu_num, 1), problem.shape_key.batch, problem.work_context, plan.chunk_k,
                               ctas_per_cu=plan.workgroups_per_cu)

    # ------------------------------------------------------------------ launch
    def launch(self, args: LaunchArgs, config: dict) -> None:
        problem = args.problem
        reason = self.unsupported(problem) or self.unavailable(args.target)
        if reason is not None:  # never start a FlyDSL launch that could abort the process
            raise RuntimeError(f"flydsl backend cannot launch: {reason}")
        plan = self.plan(problem, config)
        error = plan.config_error()
        if error is not None:
            raise ValueError(f"flydsl config {config}: {error}")
        from .kernel import launch_plan  # imports flydsl

        launch_plan(plan, args, self.grid_x(problem, plan, config))

    def compile_records(self, arch: str, out_dir: str | None, configs: list[dict] | None = None) -> list:
        """Build this backend's kernels for ``arch`` without a GPU, in child processes (see
        ``build.py``): the whole knob space, or the given table configs."""
        # the optional package first: without it every build worker would fail on its own (the
        # ImportError names it, and the CLI names the extra that installs it)
        importlib.import_module("flydsl")
        return build.compile_records(self, arch, out_dir, configs)


BACKEND = FlyDSLBackend()
