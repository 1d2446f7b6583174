"""Every difference between the Triton releases the package supports, in one module.

The package runs on Triton 3.6 through 3.9 (users do not choose: their torch pins it). Nothing
else in the package or its tests touches Triton internals or version-specific Gluon names; they
import them from here. Plain public API (``triton.jit``, ``triton.language``, the core of
``triton.experimental.gluon.language``, ``triton.knobs``) is used directly.

What differs, and where it is handled:

* Gluon: ``async_copy.async_copy_global_to_shared`` is ``async_copy.async_load`` from 3.8 on
  (3.9 keeps the old name only to raise); ``gl.thread_barrier`` is ``gl.barrier`` from 3.7 on;
  ``GluonASTSource`` is also exported by ``triton.experimental.gluon`` from 3.9 on. Kernels use
  :data:`async_copy`, :data:`thread_barrier`, :data:`fence_async_shared`,
  :data:`warpgroup_mma`, :data:`warpgroup_mma_wait`, :data:`mma_v2` from here.
* The JIT: ``JITFunction.run`` adds ``fpsan_homomorphic_casts`` to the options from 3.9 on and
  a custom-pipeline entry to the specialisation from 3.7 on; :func:`jit_specialisation`
  computes exactly what the running version's ``run`` computes.
* Launchers: 3.6 builds one C launcher stub per kernel signature (``make_launcher``); from
  3.7 on one generic launcher lives in the driver's utils module, and from 3.8 on that module's
  cache key includes its library directories (so it can only be prebuilt where the real
  ``libcuda`` is installed). See :func:`per_kernel_launchers`, :func:`prebuild_launcher`,
  :func:`prebuild_driver_utils`.
* PTX: from 3.9 on the wheel's newer ``ptxas`` (``ptxas-blackwell``) also assembles sm_90 and
  the PTX version follows it; :func:`ptxas_for` names the assembler Triton uses for an arch.
* AMD code generation: from 3.7 on the compiler needs more VGPRs for the same gfx942/gfx950
  kernel than the 3.6 compiler the CDNA register estimate was calibrated on:
  :data:`AMD_VGPR_MARGIN`.

Importing this module does not import Triton (the package's import stays light); names are
resolved on first use.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import os
import re
import sys
import types
import warnings

#: Triton minor versions the package is tested with, oldest and newest (CI runs both)
TESTED_TRITON = ((3, 6), (3, 9))
#: distributions that install the ``triton`` package (upstream wheels; PyTorch's ROCm builds)
TRITON_DISTRIBUTIONS = ("triton", "pytorch-triton-rocm", "pytorch-triton")


# ============================================================================ versions
def parse_version(text: str) -> tuple[int, int]:
    """``(major, minor)`` of a version string such as ``3.9.0`` or ``3.6.0+git1234``."""
    match = re.match(r"\s*(\d+)\.(\d+)", text or "")
    if match is None:
        raise ValueError(f"not a Triton version: {text!r}")
    return int(match.group(1)), int(match.group(2))


def installed_version() -> str | None:
    """The Triton version of this environment, without importing Triton when it is not yet
    imported (``None`` when none is installed)."""
    module = sys.modules.get("triton")
    if module is not None and getattr(module, "__version__", None):
        return module.__version__
    from importlib import metadata

    for dist in TRITON_DISTRIBUTIONS:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def version() -> tuple[int, int]:
    """``(major, minor)`` of the imported Triton (imports it)."""
    import triton

    return parse_version(triton.__version__)


def tested_range_text() -> str:
    (lo_major, lo_minor), (hi_major, hi_minor) = TESTED_TRITON
    return f"{lo_major}.{lo_minor} to {hi_major}.{hi_minor}"


def is_tested(text: str) -> bool:
    return TESTED_TRITON[0] <= parse_version(text) <= TESTED_TRITON[1]


_WARNED_UNTESTED = False


def warn_if_untested(text: str | None = None) -> bool:
    """Warn (once per process) when the installed Triton is outside :data:`TESTED_TRITON`.
    Returns whether this call warned."""
    global _WARNED_UNTESTED
    if _WARNED_UNTESTED:
        return False
    text = text if text is not None else installed_version()
    if text is None:
        return False
    try:
        tested = is_tested(text)
    except ValueError:
        tested = False
    if tested:
        return False
    _WARNED_UNTESTED = True
    warnings.warn(f"paged_mqa_logits is tested with Triton {tested_range_text()}; this environment has Triton "
                  f"{text}: kernels may fail to compile or compile differently", RuntimeWarning, stacklevel=3)
    return True


# ============================================================================ names
def _gluon_async_copy():
    """The cp.async entry points under one stable set of names (a module object, so that Gluon
    resolves ``async_copy.<name>`` in a kernel like the real module)."""
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as real

    shim = types.ModuleType(f"{__name__}.async_copy",
                            "Gluon cp.async entry points (global -> shared copies, commit and wait groups).")
    # 3.8 renamed async_copy_global_to_shared to async_load (same arguments); 3.9 keeps the old
    # name as a stub that raises, so the new name must win.
    shim.async_copy_global_to_shared = getattr(real, "async_load", None) or real.async_copy_global_to_shared
    shim.commit_group = real.commit_group
    shim.wait_group = real.wait_group
    shim.mbarrier_arrive = real.mbarrier_arrive
    return shim


def _gluon_tma():
    """The Hopper TMA entry points under one stable set of names (see :func:`_gluon_async_copy`)."""
    from triton.experimental.gluon.language.nvidia.hopper import tma as real

    shim = types.ModuleType(f"{__name__}.tma", "Gluon TMA entry points (tensor-descriptor copies).")
    # 3.8 renamed async_copy_global_to_shared to async_load (same leading arguments)
    shim.async_copy_global_to_shared = getattr(real, "async_load", None) or real.async_copy_global_to_shared
    return shim


def _gluon_thread_barrier():
    from triton.experimental.gluon import language as gl

    # 3.7 replaced thread_barrier() by barrier(*, cluster=False); both sync the CTA.
    return getattr(gl, "barrier", None) or gl.thread_barrier


def _gluon_ast_source():
    from triton.experimental import gluon

    if hasattr(gluon, "GluonASTSource"):  # public from 3.9 on
        return gluon.GluonASTSource
    from triton.experimental.gluon._runtime import GluonASTSource

    return GluonASTSource


def _attribute(module: str, name: str):
    return lambda: getattr(importlib.import_module(module), name)


_HOPPER = "triton.experimental.gluon.language.nvidia.hopper"
_LAZY = {
    # Gluon
    "async_copy": _gluon_async_copy,
    "tma": _gluon_tma,
    "TensorDescriptor": _attribute("triton.experimental.gluon.nvidia.hopper", "TensorDescriptor"),
    "thread_barrier": _gluon_thread_barrier,
    "fence_async_shared": _attribute(_HOPPER, "fence_async_shared"),
    "warpgroup_mma": _attribute(_HOPPER, "warpgroup_mma"),
    "warpgroup_mma_wait": _attribute(_HOPPER, "warpgroup_mma_wait"),
    "mma_v2": _attribute("triton.experimental.gluon.language.nvidia.ampere", "mma_v2"),
    "GluonASTSource": _gluon_ast_source,
    # compiler and runtime
    "ASTSource": _attribute("triton.compiler.compiler", "ASTSource"),
    "GPUTarget": _attribute("triton.backends.compiler", "GPUTarget"),
    "make_backend": _attribute("triton.compiler.compiler", "make_backend"),
    "CUDABackend": _attribute("triton.backends.nvidia.compiler", "CUDABackend"),
    "HIPBackend": _attribute("triton.backends.amd.compiler", "HIPBackend"),
    "JITFunction": _attribute("triton.runtime.jit", "JITFunction"),
    "InterpretedFunction": _attribute("triton.runtime.interpreter", "InterpretedFunction"),
    "FileCacheManager": _attribute("triton.runtime.cache", "FileCacheManager"),
    #: ``specialize_impl(backend_cls, value, is_const, specialize_value, align)`` -> (type, attr)
    "specialize_impl": _attribute("triton._C.libtriton", "native_specialize_impl"),
    "AMD_VGPR_MARGIN": lambda: _amd_vgpr_margin(version()),
}

__all__ = sorted(_LAZY) + [
    "TESTED_TRITON", "parse_version", "installed_version", "version", "is_tested", "warn_if_untested",
    "cache_invalidating_env", "compile_cache_hash", "jit_binder", "jit_specialisation", "current_target",
    "current_device", "active_driver", "simulated_driver", "per_kernel_launchers", "cuda_launcher_class",
    "libcuda_dirs", "build_shared_library", "prebuild_launcher", "prebuild_driver_utils", "nvidia_tool",
    "ptxas_for", "link_hsaco", "interpreter_language_extras", "amdgcn_from_llvm_ir",
]


def __getattr__(name: str):
    loader = _LAZY.get(name)
    if loader is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = loader()
    globals()[name] = value  # resolved once
    return value


def _amd_vgpr_margin(triton_version: tuple[int, int]) -> int:
    """VGPRs per lane the gfx942/gfx950 kernels need beyond ``cdna.vgpr_estimate`` (calibrated
    on the Triton 3.6 compiler): the smallest margin with which every knob set the estimate
    admits compiles without scratch (checked by tests/backends/gluon/test_compile_cdna.py)."""
    if triton_version <= (3, 6):
        return 0
    if triton_version <= (3, 8):
        return 17
    return 33


# ============================================================================ compiling
def cache_invalidating_env() -> dict:
    """The environment variables Triton keys its caches on, with their current values."""
    from triton._C.libtriton import get_cache_invalidating_env_vars

    return dict(get_cache_invalidating_env_vars())


def compile_cache_hash(src, backend, options) -> str:
    """The directory name ``triton.compile`` files ``src`` under for ``backend`` / ``options``
    (with the current cache-invalidating env vars)."""
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.runtime.cache import get_cache_key

    key = get_cache_key(src, backend, options, env_vars=get_cache_invalidating_env_vars())
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def jit_binder(fn, backend):
    """The JIT's argument binder of ``fn`` for ``backend`` (what ``create_binder`` builds)."""
    from triton.runtime.jit import create_function_from_signature

    return create_function_from_signature(fn.signature, fn.params, backend)


def jit_specialisation(fn, backend, binder, args: tuple, kwargs: dict):
    """``(jit_key, options, signature, constexprs, attrs)`` exactly as ``JITFunction.run`` of the
    running Triton computes them for ``fn[grid](*args, **kwargs)``, up to its compile call.
    ``kwargs`` is completed in place with the options ``run`` adds."""
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
    return jit_key, options, signature, constexprs, attrs


# ============================================================================ drivers
def _runtime_driver():
    from triton.runtime.driver import driver

    return driver


def current_target():
    """The target the JIT compiles for on this process's current GPU."""
    return _runtime_driver().active.get_current_target()


def current_device():
    return _runtime_driver().active.get_current_device()


@contextlib.contextmanager
def active_driver(stand_in):
    """Make ``stand_in`` Triton's active driver for the duration (restoring the previous one,
    including "not chosen yet")."""
    driver = _runtime_driver()
    saved = driver._active
    driver.set_active(stand_in)
    try:
        yield
    finally:
        driver._active = saved


@contextlib.contextmanager
def simulated_driver(stand_in, *, on_module_load, on_module_build, libcuda_dir: str | None = None):
    """Run Triton's launch path on ``stand_in`` with no GPU: driver C modules found in the cache
    are handed to ``on_module_load(name, path)`` (its return value is the "loaded" module)
    instead of being loaded, and builds of missing ones go to ``on_module_build(name, ...)``
    (which may raise) instead of gcc. ``libcuda_dir``: where launcher links look for libcuda."""
    import triton.runtime.build as build
    from triton import knobs
    from triton.compiler import compiler

    saved = (build._load_module_from_path, build._build)
    with knobs.nvidia.scope(), active_driver(stand_in):
        if libcuda_dir is not None:
            knobs.nvidia.libcuda_path = libcuda_dir
        build._load_module_from_path, build._build = on_module_load, on_module_build
        try:
            yield
        finally:
            build._load_module_from_path, build._build = saved
            # cached per process from the stand-in; the real driver must look again
            compiler.max_shared_mem.cache_clear()
            _clear_libcuda_caches()


def _clear_libcuda_caches() -> None:
    from triton.backends.nvidia import driver as nv

    nv.libcuda_dirs.cache_clear()
    if hasattr(nv, "library_dirs"):
        nv.library_dirs.cache_clear()


def per_kernel_launchers() -> bool:
    """Whether this Triton builds a C launcher stub per kernel signature (3.6; from 3.7 on one
    generic launcher lives in the driver's utils module)."""
    from triton.backends.nvidia import driver as nv

    return hasattr(nv, "make_launcher")


def cuda_launcher_class():
    from triton.backends.nvidia import driver as nv

    return nv.CudaLauncher


def libcuda_dirs() -> list[str]:
    """Directories holding the real ``libcuda.so.1`` (raises where there is none)."""
    from triton.backends.nvidia import driver as nv

    nv.libcuda_dirs.cache_clear()
    return nv.libcuda_dirs()


def build_shared_library(name: str, src_path: str, out_dir: str) -> str:
    """Compile one C file into a shared library with the compiler Triton uses; returns its path."""
    from triton.runtime.build import _build

    return _build(name, src_path, out_dir, [], [], [], [])


@contextlib.contextmanager
def _unloaded_builds(built: list):
    """Triton's driver-module builders, filing into the current cache without loading."""
    import triton.runtime.build as build

    saved = (build._load_module_from_path, build._build)

    def record_build(name, *args, **kwargs):
        built.append(name)
        return saved[1](name, *args, **kwargs)

    build._load_module_from_path, build._build = (lambda name, path: None), record_build
    try:
        yield build
    finally:
        build._load_module_from_path, build._build = saved


def prebuild_launcher(compiled, libcuda_dir: str) -> bool:
    """Build the per-signature C launcher stub ``compiled`` needs into the current Triton cache
    (3.6; later versions have none: returns False). True if it was not there yet.

    The HIP stub embeds the path of the HIP runtime it will dlopen, so it can only be built
    where that runtime is installed; elsewhere this raises."""
    if not per_kernel_launchers():
        return False
    src, metadata = compiled.src, compiled.metadata
    constants = {((src.fn.arg_names.index(k),) if isinstance(k, str) else k): v for k, v in src.constants.items()}
    signature = dict(src.signature.items())
    tensordesc_meta = getattr(metadata, "tensordesc_meta", None)
    built: list = []
    with _unloaded_builds(built) as build:
        if metadata.target.backend == "cuda":
            from triton.backends.nvidia import driver as nv

            build.compile_module_from_src(nv.make_launcher(constants, signature, tensordesc_meta), "__triton_launcher",
                                          [nv.libdevice_dir, libcuda_dir], nv.include_dirs, nv.libraries)
        else:
            from triton.backends.amd import driver as amd

            build.compile_module_from_src(amd.make_launcher(constants, signature, metadata.warp_size, tensordesc_meta),
                                          "__triton_launcher", [], amd.include_dirs, [])
    return bool(built)


def prebuild_driver_utils(target, libcuda_dir: str, libcuda_is_real: bool) -> bool:
    """Build the CUDA driver's utils module (built once per machine on first use) into the
    current Triton cache; True if it was not there yet. ROCm's embeds the local HIP runtime's
    path: never prebuilt (False)."""
    if target.backend != "cuda":
        return False
    from triton.backends.nvidia import driver as nv

    built: list = []
    src_path = os.path.join(nv.dirname, "driver.c")
    with _unloaded_builds(built) as build:
        if hasattr(build, "compile_module_from_file"):
            # 3.8: the cache key includes the library dirs, i.e. where libcuda is on the machine
            if not libcuda_is_real:
                raise RuntimeError(f"Triton {'.'.join(map(str, version()))} keys cuda_utils on the libcuda "
                                   "directory, and this machine has no libcuda")
            build.compile_module_from_file(src_path, "cuda_utils", [nv.libdevice_dir, libcuda_dir], nv.include_dirs,
                                           nv.libraries)
        else:
            with open(src_path) as f:
                build.compile_module_from_src(f.read(), "cuda_utils", [nv.libdevice_dir, libcuda_dir], nv.include_dirs,
                                              nv.libraries)
    return bool(built)


# ============================================================================ toolchains
def nvidia_tool(name: str) -> str | None:
    """Path of an NVIDIA tool Triton uses (``cuobjdump``, ``nvdisasm``, ``ptxas``,
    ``ptxas-blackwell``: the wheel's copy unless a ``TRITON_*_PATH`` variable overrides it), or
    None if it is not there."""
    from triton import knobs

    tool = getattr(knobs.nvidia, name.replace("-", "_"), None)
    try:
        path = tool.path if tool is not None else None
    except Exception:  # a knob that cannot resolve its tool
        path = None
    return path if path and os.path.exists(path) else None


def ptxas_for(capability: int) -> str | None:
    """The ``ptxas`` Triton assembles sm_``capability`` PTX with (its PTX version follows it):
    the wheel's CUDA 12 ``ptxas`` for sm_90 up to 3.8, ``ptxas-blackwell`` from 3.9 on."""
    from triton.backends.nvidia.compiler import get_ptxas

    path = get_ptxas(capability).path
    return path if path and os.path.exists(path) else None


def amdgcn_from_llvm_ir(llvm_ir: str, arch: str) -> str:
    """AMDGCN assembly of an LLVM IR module for ``arch``, through the LLVM bundled with Triton
    and the calls its AMD backend makes for the ``amdgcn`` stage (no GPU needed). For checking
    what LLVM itself emits for an intrinsic. The module must define one ``amdgpu_kernel``.

    Triton 3.6-3.8: the bundled LLVM's ``translate_to_asm`` (their ``make_amdgcn`` stage also
    dumps MIR and a scheduling DAG, which aborts on a hand-written module); 3.8 added one flag
    to that call. Triton 3.9 moved AMD code generation into a separate library, reached through
    the backend's own ``make_amdgcn`` stage."""
    if version() < (3, 9):
        from triton._C.libtriton import amd, llvm

        llvm.init_targets()
        flags = (False, False) if version() < (3, 8) else (False, False, False)
        return llvm.translate_to_asm(llvm_ir, amd.TARGET_TRIPLE, arch, "", [], *flags)
    from triton.backends.amd.compiler import HIPBackend
    from triton.backends.compiler import GPUTarget

    backend = HIPBackend(GPUTarget("hip", arch, 64))
    return HIPBackend.make_amdgcn(llvm_ir, {}, backend.parse_options({}))


def link_hsaco(object_path: str, hsaco_path: str) -> None:
    """Link an AMDGPU object into a code object with Triton's in-process ``ld.lld``."""
    from triton._C.libtriton import amd

    amd.link_hsaco(object_path, hsaco_path)


# ============================================================================ interpreter
@contextlib.contextmanager
def interpreter_language_extras(extras: dict):
    """While active, whenever the interpreter patches a ``triton.language`` module for an
    interpreted call it also sets ``extras`` (name -> object) on it, and restores them with
    its own patches."""
    import triton.runtime.interpreter as interpreter

    original = interpreter._patch_lang_core

    @functools.wraps(original)
    def patch_lang_core(lang, scope):
        original(lang, scope)
        for name, value in extras.items():
            scope.set_attr(lang, name, value)

    interpreter._patch_lang_core = patch_lang_core
    try:
        yield
    finally:
        interpreter._patch_lang_core = original


#: fp8 bit patterns that are NaN (e4m3fn: S.1111.111; e4m3fnuz: the negative zero pattern)
_FP8_NAN = {"fp8e4nv": (0x7F, 0xFF), "fp8e4b8": (0x80,)}


@contextlib.contextmanager
def interpreter_gpu_float_semantics():
    """While active, the interpreter computes floats as the GPUs do: ``maxnum``/``minnum`` are
    IEEE maxNum/minNum (a NaN operand yields the other one; the interpreter's ``np.maximum``
    propagates NaN), and fp8 NaNs stay NaN when widened (its bit arithmetic turns e4m3fn NaN
    into 480, e4m3fnuz NaN into 0)."""
    import numpy as np
    import triton.runtime.interpreter as interpreter

    builder = interpreter.InterpreterBuilder
    saved = (interpreter._convert_float, builder.create_maxnumf, builder.create_minnumf)
    original_convert = saved[0]

    def convert_float(input, input_dtype, output_dtype, rounding_mode):
        out = original_convert(input, input_dtype, output_dtype, rounding_mode)
        nans = _FP8_NAN.get(getattr(input_dtype, "name", ""))
        if nans and output_dtype.is_floating() and output_dtype.primitive_bitwidth > 8:
            bits = np.frombuffer(input.tobytes(), dtype=np.uint8).reshape(input.shape)
            float_type = {16: np.float16, 32: np.float32, 64: np.float64}[output_dtype.primitive_bitwidth]
            values = out.view(float_type).copy()
            values[np.isin(bits, nans)] = np.nan
            out = values.view(out.dtype)
        return out

    def maxnum(self, lhs, rhs):
        return self.binary_op(lhs, rhs, np.fmax)

    def minnum(self, lhs, rhs):
        return self.binary_op(lhs, rhs, np.fmin)

    interpreter._convert_float, builder.create_maxnumf, builder.create_minnumf = convert_float, maxnum, minnum
    try:
        yield
    finally:
        interpreter._convert_float, builder.create_maxnumf, builder.create_minnumf = saved
