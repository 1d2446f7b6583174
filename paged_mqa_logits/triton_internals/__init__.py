"""The one home of everything that touches Triton's internals or differs between releases.

The package runs on Triton 3.6 and newer and is tested on 3.6 and 3.9 (users do not choose:
their torch pins it). Only the modules of this package import Triton's private modules
(``triton._C``, ``triton.runtime.*``, ``triton.compiler.*``, ``triton.backends.*``,
``triton.experimental.gluon._runtime``), read or replace private attributes, or patch Triton
objects; everything else imports the names below (``tests/triton_internals/test_boundary.py``
enforces it). Plain public API (``triton.jit``,
``triton.compile``, ``triton.language``, the core of ``triton.experimental.gluon.language``,
``triton.knobs``) is used directly elsewhere.

One module per concern, each verified on Triton 3.6.0 and 3.9.0:

* :mod:`.version`: the tested range, version parsing, the untested-version warning;
* :mod:`.gluon_api`: Gluon kernel-language entry points whose names changed between releases;
* :mod:`.compiler`: targets, backends, compile sources and the on-disk compile cache's keys;
* :mod:`.specialise`: the JIT's binder and specialisation (computed without a GPU), stand-in
  arguments, the JIT's in-memory kernel cache and parameter list;
* :mod:`.launchers`: the C modules Triton's driver builds with gcc (launcher stubs,
  ``cuda_utils``), ``libcuda``;
* :mod:`.device`: the current device, and one simulated device on which the real launch path
  runs with no GPU;
* :mod:`.toolchain`: ``ptxas``, AMDGCN from LLVM IR, the AMD linker, per-version codegen margins;
* :mod:`.interpreter`: interpreter twins of ``@triton.jit`` kernels for CPU tensors;
* :mod:`.layouts`: Gluon layouts as linear layouts on the host (which bits land where);
* :mod:`.lazy`: the first-use name resolution the other modules share;
* :mod:`.cache_overlay`: the precompiled-kernel cache directories, their manifests and the
  read-only overlay on Triton's file cache (the run-time half of ``aot/``).

Importing this package or any of its modules does not import Triton (the package's import
stays light); Triton is imported on first use. It imports nothing from the rest of
``paged_mqa_logits``, so a script can load it by path without importing torch.
"""
