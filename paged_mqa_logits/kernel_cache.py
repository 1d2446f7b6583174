"""Deprecated alias of the ahead-of-time package: ``python -m paged_mqa_logits.kernel_cache``
(the precompile CLI, which the CMake target and ``python -m paged_mqa_logits precompile`` run)
and the names scripts and notebooks have imported from here.

New code imports from where each name lives: :mod:`paged_mqa_logits.aot` (launches, precompile,
verify, cli) and ``triton_internals.cache_overlay``. This module defines nothing of its own;
``tests/test_kernel_cache.py`` checks that every name here is the one of its home module.
"""

from __future__ import annotations

import sys

from .aot.cli import PROG, main
from .aot.launches import (KernelLaunch, arch_of_target, current_target, gpu_target, launches_of,
                           meta_launch_args, meta_mirror, record_launches)
from .triton_internals.cache_overlay import (ENV_CACHE, MANIFEST, ManifestError, activate, cache_dirs, cache_files, deactivate,
                          default_dirs, file_matches, read_manifest, sha256_of, untrusted_reason,
                          write_manifest_atomically)
from .aot.precompile import (DEFAULT_CU_NUM, PrecompileSummary, build_driver_utils, build_launcher, compile_launch,
                             precompile)
from .backends.registry import TRITON_BACKENDS
from .aot.verify import VerifyResult, simulated_device, verify
from .cli import run

__all__ = ["ENV_CACHE", "MANIFEST", "ManifestError", "activate", "cache_dirs", "cache_files", "deactivate",
           "default_dirs", "file_matches", "read_manifest", "sha256_of", "untrusted_reason", "write_manifest_atomically",
           "TRITON_BACKENDS", "KernelLaunch", "arch_of_target", "current_target", "gpu_target", "launches_of",
           "meta_launch_args", "meta_mirror", "record_launches", "DEFAULT_CU_NUM", "PrecompileSummary",
           "build_driver_utils", "build_launcher", "compile_launch", "precompile", "VerifyResult",
           "simulated_device", "verify", "main"]

if __name__ == "__main__":
    sys.exit(run(PROG, main, sys.argv[1:]))
