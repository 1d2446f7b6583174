"""Precompiling: build, on a machine with no GPU, the Triton/Gluon binaries the tuned table can
pick, into a Triton cache directory that a fresh process finds instead of JIT-compiling.

The cache *is* Triton's own on-disk cache format, filled with exactly the entries the run-time
JIT will look up: every launch :func:`~paged_mqa_logits.aot.warmup.warmup` would make is recorded
(:mod:`.launches`) and compiled with ``triton.compile`` for its target. The C modules the driver
would otherwise build with gcc on the first call are prebuilt too: the per-signature launcher
stubs of Triton 3.6 (later versions have one generic launcher) and ``cuda_utils`` (from Triton
3.8 on only where the real ``libcuda`` is installed: its cache key includes the libcuda
directory). Build the cache in the environment that will run it (the CMake ``precompile``
target); ``triton_internals.cache_overlay`` describes the run-time rule and :mod:`.verify` proves a cache.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sysconfig
import time
from dataclasses import dataclass, field

import torch
import triton
from tqdm import tqdm
from triton import knobs

from .. import dispatch
from ..arch import ARCH_SPECS
from ..table import loaded_files
from ..triton_internals.compiler import cache_invalidating_env
from ..triton_internals.launchers import prebuild_driver_utils, prebuild_launcher
from ..triton_internals import interpreter
from ..triton_internals.version import installed_version
from .warmup import WARMUP_DEFAULT_MAX_MODEL_LEN, enumerate_calls, table_families, warm_inputs
from ..backends.registry import TRITON_BACKENDS
from .launches import KernelLaunch, arch_of_target, gpu_target, launches_of
from ..triton_internals.cache_overlay import (read_manifest_or_empty, cache_files, restrict_to_owner,
                                              write_manifest_atomically)

#: CU/SM count assumed for families the table does not describe (only dispatch reads it)
DEFAULT_CU_NUM = {name: spec.usual_cu_num for name, spec in ARCH_SPECS.items()}


# ============================================================================ precompiling
@contextlib.contextmanager
def _writing_to(out_dir: str):
    """Point Triton's cache writes at ``out_dir`` (plain file manager) for the duration.
    (Setting a knob also sets its env var; ``scope()`` restores both.)"""
    with knobs.cache.scope():
        knobs.cache.dir = out_dir
        knobs.cache.manager_class = None
        yield


def compile_launch(launch: KernelLaunch, out_dir: str):
    """``triton.compile`` exactly as ``JITFunction._do_compile`` would, filed in ``out_dir``."""
    with _writing_to(out_dir), interpreter.compiling():
        return triton.compile(launch.source(), target=launch.target, options=launch.options.__dict__)


def build_launcher(compiled, out_dir: str) -> bool:
    """Prebuild, into ``out_dir``, the C launcher stub the driver builds on a kernel's first
    launch (Triton 3.6 builds one per kernel signature; later versions have none). Returns
    whether a new one was built.

    The HIP stub embeds the path of the HIP runtime it will dlopen, so it can only be prebuilt
    where that runtime is installed (the AMD machine or image itself); elsewhere this raises.
    The CUDA stub links against the real ``libcuda`` where installed, else against an empty
    placeholder (the real driver resolves the symbols when it is loaded on a GPU machine).
    """
    with _writing_to(out_dir):
        return prebuild_launcher(compiled)


def build_driver_utils(target, out_dir: str) -> bool:
    """Prebuild ``cuda_utils`` (built once per machine on the first Triton use) into ``out_dir``.
    ROCm's ``hip_utils`` embeds the path of the local HIP runtime, so it is left to the machine."""
    if target.backend != "cuda":
        return False
    with _writing_to(out_dir):
        return prebuild_driver_utils(target)


@dataclass
class PrecompileSummary:
    out_dir: str
    targets: list[str]
    problems: int = 0  # problem keys enumerated
    kernels: list[dict] = field(default_factory=list)  # one per distinct compiled kernel
    launchers: int = 0  # launcher stubs built (new)
    skipped: list[str] = field(default_factory=list)  # (backend, why) that have nothing to precompile
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def describe(self) -> str:
        lines = [f"precompiled {len(self.kernels)} kernel(s) for {', '.join(self.targets)} "
                 f"({self.problems} problem keys, {self.launchers} launcher stub(s)) into {self.out_dir} "
                 f"in {self.seconds:.1f} s"]
        for k in self.kernels:
            knobs = ", ".join(f"{a}={b}" for a, b in sorted(k["config"].items())) or "defaults"
            lines.append(f"  {k['arch']:7s} {k['backend']:6s} {k['kernel']} [{knobs}] disk_key={k['disk_key'][:12]} "
                         f"({k['compile_s']:.1f} s)")
        lines += [f"  skipped: {s}" for s in self.skipped]
        lines += [f"  ERROR: {e}" for e in self.errors]
        return "\n".join(lines)


def precompile(
    archs,
    out_dir: str,
    *,
    families=None,
    max_model_len: int | None = None,
    batch_sizes=None,
    lens_2d=(True, False),
    include_fallbacks: bool = True,
    launchers: bool = True,
    progress: bool = True,
    only: dict | None = None,
    extra_families=None,
) -> PrecompileSummary:
    """Compile, for each arch, every kernel the tuned table (plus defaults and, optionally, the
    fallback chain's defaults) can launch for the table's problem families, specialised exactly
    like :func:`paged_mqa_logits.warmup` will launch them, into the Triton cache ``out_dir``.

    ``families``: explicit :class:`~paged_mqa_logits.aot.warmup.Family` list (default: one per
    (heads, kv_block_size, preshuffle, next_n, cu_num) found in the table for the arch, with
    batches ``1..max tuned batch``, the tuned contexts plus ``None`` as hints, ``lens_2d`` and
    ``max_model_len``; both override the family defaults when given). ``only`` restricts the
    table's families: ``{"heads": {64}, "next_n": {1, 2}, "kv_block_size": {64}, "preshuffle": {False}}``.
    ``extra_families`` are added for every arch whether or not the table has rows for them (a
    family with no rows precompiles the arch's default choices); ``cu_num=None`` takes
    :data:`DEFAULT_CU_NUM`.
    """
    started = time.perf_counter()
    os.makedirs(out_dir, exist_ok=True)
    dispatch.reset()
    targets = [gpu_target(a) for a in archs]
    summary = PrecompileSummary(out_dir=os.path.abspath(out_dir), targets=[arch_of_target(t) for t in targets])
    manifest = read_manifest_or_empty(out_dir)
    todo: list[tuple[KernelLaunch, object, int]] = []  # (launch, first call launching it, workspace rows)
    seen_keys: set[tuple] = set()
    for target in targets:
        arch = arch_of_target(target)
        fams = families if families is not None else table_families(
            arch, max_model_len=max_model_len or WARMUP_DEFAULT_MAX_MODEL_LEN, lens_2d=tuple(lens_2d))
        if families is None and batch_sizes is not None:
            fams = [dataclasses.replace(f, batch_sizes=tuple(batch_sizes)) for f in fams]
        if families is not None and max_model_len is not None:
            fams = [dataclasses.replace(f, max_model_len=max_model_len) for f in fams]
        fams = _select(fams, only or {})
        fams += [dataclasses.replace(f, cu_num=f.cu_num or DEFAULT_CU_NUM.get(arch, 0)) for f in extra_families or []]
        if not fams:
            summary.skipped.append(f"{arch}: no tuned rows match; name a family (heads, kv_block_size, preshuffle, "
                                   f"next_n) to precompile the defaults")
        # per family, like warmup(): one [largest rows, max_model_len] logits workspace
        calls = []
        for fam in fams:
            fam_calls = enumerate_calls(fam, arch=arch, cu_num=fam.cu_num or 0, hypothetical=True,
                                        include_fallbacks=include_fallbacks)
            rows = max((c.problem.rows for c in fam_calls), default=1)
            workspace = torch.empty((rows, fam.max_model_len), dtype=fam.workspace_dtype, device="meta")
            calls += [(c, workspace) for c in fam_calls]
        summary.problems += len({c.problem for c, _ in calls})
        bar = tqdm(calls, desc=f"specialise {arch}", unit="call", disable=not progress, leave=False)
        for call, workspace in bar:
            if call.backend not in TRITON_BACKENDS:
                note = f"{call.backend} on {arch}: no Triton kernels (nothing to precompile)"
                if note not in summary.skipped:
                    summary.skipped.append(note)
                continue
            args = warm_inputs(call.problem, device="meta", workspace=workspace)
            try:
                recorded = launches_of(call.backend, args, call.config, target)
            except Exception as exc:  # a backend that cannot be specialised on meta tensors
                summary.errors.append(f"{arch} {call.backend} {call.config}: {type(exc).__name__}: {exc}")
                continue
            for launch in recorded:
                ident = (arch, id(launch.kernel), launch.jit_key)
                if ident not in seen_keys:
                    seen_keys.add(ident)
                    todo.append((launch, call, workspace.shape[0]))
    for launch, call, workspace_rows in tqdm(todo, desc="compile", unit="kernel", disable=not progress):
        arch, backend_name, config = arch_of_target(launch.target), call.backend, call.config
        t0 = time.perf_counter()
        try:
            compiled = compile_launch(launch, out_dir)
        except Exception as exc:
            summary.errors.append(f"{arch} {backend_name} {launch.name} {config}: {type(exc).__name__}: {exc}")
            continue
        if launchers:
            try:
                summary.launchers += int(build_launcher(compiled, out_dir))
            except Exception as exc:  # e.g. HIP stubs embed the local HIP runtime's path
                note = f"launcher stubs for {arch}: not prebuilt, built on first launch ({type(exc).__name__}: {exc})"
                if note not in summary.skipped:
                    summary.skipped.append(note)
        summary.kernels.append({
            "arch": arch, "backend": backend_name, "kernel": launch.name, "config": dict(config),
            "kind": call.kind, "jit_key": launch.jit_key, "disk_key": compiled.hash,
            "compile_s": time.perf_counter() - t0, "problem": dataclasses.asdict(call.problem),
            "workspace_rows": workspace_rows,
        })
    if launchers:
        for target in targets:
            try:
                summary.launchers += int(build_driver_utils(target, out_dir))
            except Exception as exc:  # only a first-use speed-up: Triton builds it itself if absent
                summary.skipped.append(f"cuda_utils for {arch_of_target(target)}: not prebuilt ({type(exc).__name__}: {exc})")
    summary.seconds = time.perf_counter() - started
    _write_manifest(out_dir, manifest, summary)
    return summary


def _select(families, only: dict):
    out = []
    for fam in families:
        if any(k in only and getattr(fam, k) not in only[k] for k in ("heads", "kv_block_size", "preshuffle")):
            continue
        next_n = tuple(n for n in fam.next_n if "next_n" not in only or n in only["next_n"])
        if next_n:
            out.append(dataclasses.replace(fam, next_n=next_n))
    return out


def _write_manifest(out_dir: str, manifest: dict, summary: PrecompileSummary) -> None:
    restrict_to_owner(out_dir)  # what the run-time trusts: nobody else can write the cache
    entries = {(k["arch"], k["disk_key"]): k for k in manifest.get("kernels", [])}
    entries.update({(k["arch"], k["disk_key"]): k for k in summary.kernels})
    manifest.update({
        "triton_version": installed_version(),
        "python_ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
        "cache_invalidating_env": cache_invalidating_env(),
        "tables": loaded_files(),
        "targets": sorted(set(manifest.get("targets", [])) | set(summary.targets)),
        "kernels": sorted(entries.values(), key=lambda k: (k["arch"], k["backend"], k["kernel"], k["disk_key"])),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "files": cache_files(out_dir),
    })
    write_manifest_atomically(out_dir, manifest)

