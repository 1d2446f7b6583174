"""The JIT's view of a launch, computed without a GPU: its argument binder, the specialisation
and cache key ``JITFunction.run`` computes, the same specialisation for stand-in arguments,
and the JIT's per-device kernel cache.

* :func:`recording_jit_launches`: while active, every JIT launch hands its specialisation for
  a chosen target to a callback instead of compiling (what ``JITFunction.run`` computes, up to
  its compile call: :func:`jit_specialisation`);
* :func:`specialise`: ``(signature, constexprs, attrs)`` of a kernel for runtime arguments that
  may be :class:`StandIn` objects (compile specs without tensors);
* :func:`runtime_parameters`, :func:`fresh_jit_caches`, :func:`in_jit_cache`,
  :func:`compiled_kernels`: the kernel's parameter list and its in-memory cache.

What differs between releases: ``JITFunction.run`` adds ``fpsan_homomorphic_casts`` to the
options from 3.9 on and a custom-pipeline entry to the specialisation from 3.7 on.

Triton internals touched: ``triton.runtime.jit`` (``JITFunction.run`` replaced while recording,
``create_function_from_signature``, ``compute_cache_key``, ``JITFunction._pack_args``,
``.params``, ``.device_caches``, ``.create_binder``), ``triton._C.libtriton``
(``native_specialize_impl``). Verified on Triton 3.6.0 and 3.9.0.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

from . import compiler
from .version import version


@dataclass(frozen=True)
class JitSpecialisation:
    """One launch as ``JITFunction.run`` specialises it, up to its compile call."""

    jit_key: str  # the JIT's in-memory cache key (``compute_cache_key``)
    options: object  # the backend's parsed options
    signature: dict
    constexprs: dict
    attrs: dict


def jit_binder(fn, backend):
    """The JIT's argument binder of ``fn`` for ``backend`` (what ``create_binder`` builds)."""
    from triton.runtime.jit import create_function_from_signature

    return create_function_from_signature(fn.signature, fn.params, backend)


def jit_specialisation(fn, backend, binder, args: tuple, kwargs: dict) -> JitSpecialisation:
    """The specialisation ``JITFunction.run`` of the running Triton computes for
    ``fn[grid](*args, **kwargs)``. ``kwargs`` is completed in place with the options ``run`` adds."""
    from triton import knobs
    from triton.runtime.jit import compute_cache_key

    kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    if hasattr(knobs.compilation, "fpsan_homomorphic_casts"):  # 3.9: an option of every backend
        kwargs["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
    bound_args, specialization, options = binder(*args, **kwargs)
    hook = knobs.runtime.add_stages_inspection_hook
    if hook is not None and version() >= (3, 7):  # 3.7: custom pipelines key the JIT cache
        _, stages_hash = hook()
        specialization.append(f'("custom_pipeline", {stages_hash})')
    jit_key = compute_cache_key({}, specialization, options)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound_args, specialization, options)
    return JitSpecialisation(jit_key, options, signature, constexprs, attrs)


_RECORD_LOCK = threading.Lock()


@contextlib.contextmanager
def recording_jit_launches(target, on_launch):
    """While active, every ``JITFunction`` launch (any thread) calls ``on_launch(kernel,
    specialisation)`` (a :class:`JitSpecialisation` for ``target``) instead of compiling or
    launching. The JIT's own binder computes it, so tensors may be meta tensors and no GPU is
    needed. One recording at a time per process (``JITFunction.run`` is replaced meanwhile)."""
    from triton.runtime.jit import JITFunction

    backend = compiler.make_backend(target)
    binders: dict[int, object] = {}

    def recording_run(self, *args, grid, warmup, **kwargs):
        binder = binders.get(id(self))
        if binder is None:
            binder = binders[id(self)] = jit_binder(self, backend)
        on_launch(self, jit_specialisation(self, backend, binder, args, kwargs))
        return None

    with _RECORD_LOCK:
        original = JITFunction.run
        JITFunction.run = recording_run
        try:
            yield
        finally:
            JITFunction.run = original


class StandIn:
    """A tensor stand-in for compile specs: what the JIT's specialisation looks at (dtype,
    16-byte alignment of the address, and on AMD whether it spans less than 2 GiB)."""

    def __init__(self, dtype, nbytes: int, aligned: bool = True):
        self.dtype = dtype
        self._nbytes = nbytes
        self._address = 1 << 20 if aligned else (1 << 20) + 4

    def data_ptr(self) -> int:
        return self._address

    def ptr_range(self) -> int:
        return self._nbytes


def runtime_parameters(fn) -> list[str]:
    """Names of ``fn``'s parameters that are not ``constexpr``, in order (what a launch passes
    positionally before the constexprs)."""
    return [p.name for p in fn.params if not p.is_constexpr]


def specialise(fn, runtime_args: tuple, constexprs: dict, backend_cls) -> tuple[dict, dict, dict]:
    """``(signature, constexprs, attrs)`` exactly as the JIT builds them when ``fn`` is launched
    with ``runtime_args`` (values or :class:`StandIn`) and ``constexprs``: ints equal to 1
    become constexprs, 16-divisible ints and 16-aligned pointers get ``tt.divisibility``,
    AMD pointers spanning < 2 GiB get ``tt.pointer_range``; parameters in the kernel's
    ``do_not_specialize`` keep their plain type."""
    from triton._C.libtriton import native_specialize_impl

    runtime_names = runtime_parameters(fn)
    if len(runtime_names) != len(runtime_args):
        raise ValueError(f"{fn.__name__} takes {len(runtime_names)} runtime arguments, got {len(runtime_args)}")
    values = dict(zip(runtime_names, runtime_args), **constexprs)
    signature, consts, attrs = {}, {}, {}
    for index, param in enumerate(fn.params):
        value = values[param.name]
        if param.is_constexpr:
            signature[param.name], consts[param.name] = "constexpr", value
            continue
        kind, attr = native_specialize_impl(backend_cls, value, False, not param.do_not_specialize,
                                            not param.do_not_specialize_on_alignment)
        if kind == "constexpr":
            signature[param.name], consts[param.name] = "constexpr", attr
            continue
        signature[param.name] = kind
        if isinstance(attr, str) and attr:
            attrs[(index,)] = backend_cls.parse_attr(attr)
    assert list(signature) == [p.name for p in fn.params]
    return signature, consts, attrs


@contextlib.contextmanager
def fresh_jit_caches(kernels):
    """Each of ``kernels`` starts with an empty in-memory JIT cache (every device); what was
    cached before is put back afterwards, and what was compiled meanwhile is dropped."""
    saved = {id(kernel): (kernel, dict(kernel.device_caches)) for kernel in kernels}
    for kernel, _ in saved.values():
        kernel.device_caches.clear()
    try:
        yield
    finally:
        for kernel, caches in saved.values():
            kernel.device_caches.clear()
            kernel.device_caches.update(caches)


def in_jit_cache(kernel, device, jit_key: str) -> bool:
    """Whether ``kernel``'s in-memory JIT cache of ``device`` holds ``jit_key``."""
    caches = getattr(kernel, "device_caches", {})
    return device in caches and jit_key in caches[device][0]


def compiled_kernels(kernel) -> list:
    """The ``CompiledKernel`` objects in ``kernel``'s in-memory JIT cache, every device."""
    return [compiled for cache in kernel.device_caches.values() for compiled in cache[0].values()]
