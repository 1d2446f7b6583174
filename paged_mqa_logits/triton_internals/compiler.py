"""What ``triton.compile`` takes and where it files its output: targets, backends, compile
sources and the on-disk cache.

* :data:`GPUTarget`, :data:`make_backend`, :data:`CUDABackend`, :data:`HIPBackend`: the
  target an arch compiles for and the backend that compiles it;
* :data:`ASTSource`, :data:`GluonASTSource`: a kernel specialised for one signature, ready to
  compile (``GluonASTSource`` is exported by ``triton.experimental.gluon`` from 3.9 on, and
  lives in its private ``_runtime`` module before);
* :data:`FileCacheManager`, :func:`cache_invalidating_env`, :func:`compile_cache_hash`: the
  on-disk cache the JIT and ``triton.compile`` share, and the key a compile is filed under;
* :func:`order_independent_cache_keys`: a kernel's cache key that does not depend on which
  kernels of the process computed theirs first (a precompiled cache is keyed in one order and
  looked up in another).

Triton internals touched: ``triton.runtime.jit.DependenciesFinder._update_hash`` (wrapped),
``triton.compiler.compiler`` (``ASTSource``, ``make_backend``),
``triton.backends.compiler`` / ``.nvidia.compiler`` / ``.amd.compiler``,
``triton.experimental.gluon._runtime`` (before 3.9), ``triton.runtime.cache``
(``FileCacheManager``, ``get_cache_key``), ``triton._C.libtriton``
(``get_cache_invalidating_env_vars``). Verified on Triton 3.6.0 and 3.9.0.
"""

from __future__ import annotations

import functools
import hashlib
import importlib

from .lazy import attribute, module_getattr


def _gluon_ast_source():
    gluon = importlib.import_module("triton.experimental.gluon")
    if hasattr(gluon, "GluonASTSource"):  # public from 3.9 on
        return gluon.GluonASTSource
    return importlib.import_module("triton.experimental.gluon._runtime").GluonASTSource


_LAZY = {
    "GPUTarget": attribute("triton.backends.compiler", "GPUTarget"),
    "make_backend": attribute("triton.compiler.compiler", "make_backend"),
    "CUDABackend": attribute("triton.backends.nvidia.compiler", "CUDABackend"),
    "HIPBackend": attribute("triton.backends.amd.compiler", "HIPBackend"),
    "ASTSource": attribute("triton.compiler.compiler", "ASTSource"),
    "GluonASTSource": _gluon_ast_source,
    "FileCacheManager": attribute("triton.runtime.cache", "FileCacheManager"),
}

__all__ = sorted(_LAZY) + ["cache_invalidating_env", "compile_cache_hash", "order_independent_cache_keys"]


__getattr__ = module_getattr(__name__, globals(), _LAZY)


def cache_invalidating_env() -> dict:
    """The environment variables Triton keys its caches on, with their current values."""
    from triton._C.libtriton import get_cache_invalidating_env_vars

    return dict(get_cache_invalidating_env_vars())


def compile_cache_hash(src, backend, options) -> str:
    """The directory name ``triton.compile`` files ``src`` under for ``backend`` / ``options``
    (with the current cache-invalidating env vars)."""
    from triton.runtime.cache import get_cache_key

    key = get_cache_key(src, backend, options, env_vars=cache_invalidating_env())
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def order_independent_cache_keys() -> None:
    """Make a ``@jit`` function's cache key the same whatever was keyed before it (idempotent).

    A function's key includes the constexpr globals its callees use, merged from each callee
    *before* the callee's own key is computed: a callee not yet keyed in this process brings
    none, one keyed earlier (for another kernel) brings its own. So the key of a kernel depended
    on which kernels the process keyed first, and a cache precompiled in one order missed when
    an engine launched kernels in another. Computing the callee's key first makes every key the
    one it would be with its callees keyed (the content is unchanged)."""
    from triton.runtime.jit import DependenciesFinder

    original = getattr(DependenciesFinder, "_update_hash", None)
    if original is None or getattr(original, "callees_keyed_first", False):
        return

    @functools.wraps(original)
    def _update_hash(self, func):
        func.cache_key  # noqa: B018 - computes the callee's key and with it its used globals
        return original(self, func)

    _update_hash.callees_keyed_first = True
    DependenciesFinder._update_hash = _update_hash
