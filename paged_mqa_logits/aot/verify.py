"""Verifying a precompiled cache on a CPU machine: launch every kernel of its manifest through
the real Triton JIT on a simulated device of its arch and report what was loaded from the cache
and what would have been compiled or built."""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass, field

import torch
from triton import knobs

from ..backends import registry
from ..problem import LOGITS_DTYPES, Problem
from ..triton_internals import device
from ..triton_internals.device import LauncherStubMissing, LauncherStubs
from .warmup import warm_inputs
from .launches import gpu_target, launches_of, meta_launch_args
from ..triton_internals.cache_overlay import ENV_CACHE, ManifestError, activate, cache_dirs, deactivate, read_manifest

# ============================================================================ verifying
@dataclass
class VerifyResult:
    """What the real JIT did when launching each manifest kernel on a simulated device."""

    kernels: int = 0
    disk_hits: int = 0  # kernels the JIT loaded from the cache
    compiled: list[str] = field(default_factory=list)  # kernels the JIT had to compile (misses)
    launchers_found: int = 0
    launchers_built: list[str] = field(default_factory=list)  # launcher stubs it would have built
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.compiled and not self.errors and self.disk_hits == self.kernels

    def describe(self) -> str:
        text = (f"verify: {self.disk_hits}/{self.kernels} kernels found by the JIT in the cache, "
                f"{len(self.compiled)} compiled, {self.launchers_found} launcher stub(s) found, "
                f"{len(self.launchers_built)} would be built -> {'OK' if self.ok else 'FAIL'}")
        return "\n".join([text] + [f"  compiled: {c}" for c in self.compiled]
                         + [f"  launcher built: {c}" for c in self.launchers_built] + [f"  ERROR: {e}" for e in self.errors])


@contextlib.contextmanager
def simulated_device(target, result: VerifyResult, jit_functions=()):
    """Run Triton launches as on a ``target`` GPU: cache lookups are real, binaries are not
    loaded and nothing executes. Per-kernel CUDA launcher stubs (Triton 3.6) are looked up for
    real; the ones found and the builds refused instead are counted in ``result``.
    ``jit_functions`` start with empty in-memory caches (restored afterwards)."""
    stubs = LauncherStubs()
    try:
        with device.simulated_device(target, jit_functions, launcher_stubs=stubs):
            yield
    finally:
        result.launchers_found += stubs.found
        result.launchers_built += stubs.missing


def verify(directory: str | None = None, *, archs=None) -> VerifyResult:
    """Launch every kernel listed in a cache's manifest through the real Triton JIT on a
    simulated device of its arch, with Triton's own cache dir empty and the precompiled cache as
    the only overlay, and report what was found and what would have been compiled or built."""
    result = VerifyResult()
    dirs = [os.path.realpath(directory)] if directory else cache_dirs()
    try:
        manifest = read_manifest(dirs[0]) if dirs else None
    except ManifestError as exc:
        result.errors.append(str(exc))
        return result
    if not manifest:
        result.errors.append(f"no manifest in {dirs or 'any kernel cache dir'}")
        return result
    entries = [k for k in manifest["kernels"] if archs is None or k["arch"] in archs]

    def listener(src, metadata, metadata_group, times, cache_hit):
        if cache_hit:
            result.disk_hits += 1
        else:
            result.compiled.append(f"{metadata['name']} for {metadata['target']}")

    with tempfile.TemporaryDirectory() as empty, knobs.cache.scope(), knobs.compilation.scope():
        deactivate()
        saved_env = os.environ.get(ENV_CACHE)
        os.environ[ENV_CACHE] = os.pathsep.join(dirs)
        knobs.cache.dir = empty
        knobs.compilation.listener = listener
        try:
            activate()
            for entry in entries:
                problem = Problem.from_record(entry["problem"])
                target = gpu_target(entry["arch"])
                rows = entry.get("workspace_rows", problem.rows)  # untouched memory: only its size matters
                workspace = torch.empty((rows, problem.max_model_len),
                                        dtype=LOGITS_DTYPES[problem.shape_key.logits_dtype])
                args = warm_inputs(problem, device="cpu", workspace=workspace, validate=False)
                backend = registry.get(entry["backend"])
                result.kernels += 1
                # the JIT functions this launch uses start with an empty in-memory cache
                kernels = [launch.kernel for launch in launches_of(entry["backend"], meta_launch_args(args),
                                                                   entry["config"], target)]
                with simulated_device(target, result, kernels):
                    try:
                        backend.launch(args, entry["config"])
                    except LauncherStubMissing:
                        pass
                    except Exception as exc:
                        result.errors.append(f"{entry['arch']} {entry['backend']} {entry['kernel']}: {type(exc).__name__}: {exc}")
        finally:
            if saved_env is None:
                os.environ.pop(ENV_CACHE, None)
            else:
                os.environ[ENV_CACHE] = saved_env
            deactivate()
    # A kernel entry may launch more than one JIT function; count hits per entry at most once.
    result.disk_hits = min(result.disk_hits, result.kernels)
    return result

