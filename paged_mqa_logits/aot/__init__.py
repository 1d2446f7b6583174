"""Ahead-of-time kernel cache: build, on a machine with no GPU, the Triton/Gluon binaries the
tuned table can pick, so that a fresh process finds them instead of JIT-compiling.

Every way of building kernels before a call needs them lives here: :mod:`.warmup` (compile on
this device), :mod:`.precompile` (into a cache directory, no GPU), :mod:`.compile` (cross-compile
a backend's candidates and check their ISA, with :mod:`.sass`). One small module per concern, in
import order (each imports only those above it):

* the run-time half -- the cache directories, their manifests and the read-only overlay on
  Triton's file cache -- is ``triton_internals.cache_overlay`` (the backend registry imports
  it, and it touches Triton's cache internals);
* :mod:`.sass` -- loops and local-memory traffic of NVIDIA SASS, for :mod:`.compile`'s checks;
* :mod:`.compile` -- ``python -m paged_mqa_logits compile``: a backend's compile specs built
  for an arch and judged (native fp8 MMA, no spills, occupancy, LDS);
* :mod:`.launches` -- recording the kernels a backend's ``launch`` would run on a target, on
  meta tensors (warm-up uses it to predict what it compiles);
* :mod:`.warmup` -- :func:`paged_mqa_logits.warmup`: a problem family's kernels compiled on the
  current device, with synthetic calls;
* :mod:`.precompile` -- compiling those kernels (plus launcher stubs) into a cache directory;
* :mod:`.verify` -- launching a cache's kernels through the real JIT on a simulated device;
* :mod:`.cli` -- the precompile CLI (``python -m paged_mqa_logits precompile``, which the CMake
  ``precompile`` target runs).

This ``__init__`` imports none of them: the CLI loads them.
"""
