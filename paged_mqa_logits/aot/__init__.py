"""Ahead-of-time kernel cache: build, on a machine with no GPU, the Triton/Gluon binaries the
tuned table can pick, so that a fresh process finds them instead of JIT-compiling.

One small module per concern, in import order (each imports only those above it):

* the run-time half -- the cache directories, their manifests and the read-only overlay on
  Triton's file cache -- is ``triton_internals.cache_overlay`` (the backend registry imports
  it, and it touches Triton's cache internals);
* :mod:`.launches` -- recording the kernels a backend's ``launch`` would run on a target, on
  meta tensors (warm-up uses it to predict what it compiles);
* :mod:`.precompile` -- compiling those kernels (plus launcher stubs) into a cache directory;
* :mod:`.verify` -- launching a cache's kernels through the real JIT on a simulated device;
* :mod:`.cli` -- ``python -m paged_mqa_logits.kernel_cache``, the CLI the CMake target runs.

This ``__init__`` imports none of them: the CLI loads them.
"""
