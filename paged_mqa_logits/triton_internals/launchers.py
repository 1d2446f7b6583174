"""The C modules Triton's driver builds with gcc on a machine's first launches, built ahead of
time or looked up without building, and the ``libcuda`` they link against.

What differs between releases: 3.6 builds one C launcher stub per kernel signature
(``make_launcher``); from 3.7 on one generic launcher lives in the driver's utils module
(``cuda_utils`` / ``hip_utils``), and from 3.8 on that module's cache key includes its library
directories (so it can only be prebuilt where the real ``libcuda`` is installed).

Triton internals touched: ``triton.runtime.build`` (``_build``, ``_load_module_from_path``,
``compile_module_from_src`` / ``_from_file``; the first two are replaced while a build is
intercepted), ``triton.backends.nvidia.driver`` / ``triton.backends.amd.driver``
(``make_launcher``, ``CudaLauncher``, ``libcuda_dirs``, ``library_dirs``, include and
library lists). Verified on Triton 3.6.0 and 3.9.0.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from .version import version


def per_kernel_launchers() -> bool:
    """Whether this Triton builds a C launcher stub per kernel signature (3.6; from 3.7 on one
    generic launcher lives in the driver's utils module)."""
    from triton.backends.nvidia import driver as nv

    return hasattr(nv, "make_launcher")


def cuda_launcher_class():
    """The CUDA driver's launcher class (3.6: it builds or loads its signature's C stub)."""
    from triton.backends.nvidia import driver as nv

    return nv.CudaLauncher


def libcuda_dirs() -> list[str]:
    """Directories holding the real ``libcuda.so.1`` (raises where there is none)."""
    from triton.backends.nvidia import driver as nv

    nv.libcuda_dirs.cache_clear()
    return nv.libcuda_dirs()


def clear_libcuda_caches() -> None:
    """Forget the libcuda directories Triton found (cached per process), so that the next
    lookup reads ``knobs.nvidia.libcuda_path`` and the machine again."""
    from triton.backends.nvidia import driver as nv

    nv.libcuda_dirs.cache_clear()
    if hasattr(nv, "library_dirs"):
        nv.library_dirs.cache_clear()


def build_shared_library(name: str, src_path: str, out_dir: str) -> str:
    """Compile one C file into a shared library with the compiler Triton uses; returns its path."""
    from triton.runtime.build import _build

    return _build(name, src_path, out_dir, [], [], [], [])


_STUB_LIBCUDA: str | None = None


def libcuda_dir() -> str:
    """Where a launcher link finds ``libcuda.so.1``: the real one when installed, else an empty
    stub (only a link-time placeholder: the real driver resolves the symbols when the
    stub-linked launcher is loaded on a GPU machine), built once per process in a temporary
    directory that is removed when the process exits."""
    global _STUB_LIBCUDA

    try:
        return libcuda_dirs()[0]
    except Exception:
        pass
    if _STUB_LIBCUDA is None:
        stub = tempfile.mkdtemp(prefix="paged_mqa_libcuda_stub_")
        atexit.register(shutil.rmtree, stub, ignore_errors=True)
        src = os.path.join(stub, "stub.c")
        Path(src).write_text("/* link-time placeholder for libcuda.so.1 */\n")
        built = build_shared_library("libcuda_stub", src, stub)
        os.replace(built, os.path.join(stub, "libcuda.so.1"))
        _STUB_LIBCUDA = stub
    return _STUB_LIBCUDA


@contextlib.contextmanager
def intercepted_builds(on_module_load, on_module_build):
    """While active, a driver C module Triton finds in its cache is handed to
    ``on_module_load(name, path)`` (its return value is the "loaded" module) instead of being
    loaded, and a build of a missing one goes to ``on_module_build(name, src, srcdir, ...)``
    (which may raise) instead of gcc."""
    import triton.runtime.build as build

    saved = (build._load_module_from_path, build._build)
    build._load_module_from_path, build._build = on_module_load, on_module_build
    try:
        yield build
    finally:
        build._load_module_from_path, build._build = saved


@contextlib.contextmanager
def _unloaded_builds(built: list):
    """Triton's driver-module builders, filing into the current cache without loading."""
    import triton.runtime.build as build

    real_build = build._build

    def record_build(name, *args, **kwargs):
        built.append(name)
        return real_build(name, *args, **kwargs)

    with intercepted_builds(lambda name, path: None, record_build) as patched:
        yield patched


def prebuild_launcher(compiled) -> bool:
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
    if metadata.target.backend == "cuda":
        from triton.backends.nvidia import driver as nv

        library_dirs = [nv.libdevice_dir, libcuda_dir()]
        with _unloaded_builds(built) as build:
            build.compile_module_from_src(nv.make_launcher(constants, signature, tensordesc_meta), "__triton_launcher",
                                          library_dirs, nv.include_dirs, nv.libraries)
    else:
        from triton.backends.amd import driver as amd

        with _unloaded_builds(built) as build:
            build.compile_module_from_src(amd.make_launcher(constants, signature, metadata.warp_size, tensordesc_meta),
                                          "__triton_launcher", [], amd.include_dirs, [])
    return bool(built)


def prebuild_driver_utils(target) -> bool:
    """Build the CUDA driver's utils module (built once per machine on first use) into the
    current Triton cache; True if it was not there yet. ROCm's embeds the local HIP runtime's
    path: never prebuilt (False)."""
    if target.backend != "cuda":
        return False
    from triton.backends.nvidia import driver as nv

    libcuda = libcuda_dir()
    library_dirs = [nv.libdevice_dir, libcuda]
    built: list = []
    src_path = os.path.join(nv.dirname, "driver.c")
    with _unloaded_builds(built) as build:
        if hasattr(build, "compile_module_from_file"):
            # 3.8: the cache key includes the library dirs, i.e. where libcuda is on the machine
            if libcuda == _STUB_LIBCUDA:
                raise RuntimeError(f"Triton {'.'.join(map(str, version()))} keys cuda_utils on the libcuda "
                                   "directory, and this machine has no libcuda")
            build.compile_module_from_file(src_path, "cuda_utils", library_dirs, nv.include_dirs, nv.libraries)
        else:
            with open(src_path) as f:
                build.compile_module_from_src(f.read(), "cuda_utils", library_dirs, nv.include_dirs, nv.libraries)
    return bool(built)
