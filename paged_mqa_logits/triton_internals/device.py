"""The device Triton's JIT launches on: the current GPU's target, or one simulated device on
which a backend's real launch path runs with no GPU.

Inside :func:`simulated_device`, ``kernel[grid](...)`` goes through the real JIT: it binds the
arguments, specialises them exactly as on a GPU (CPU tensors carry dtype, address alignment
and storage size like device tensors), looks up its in-memory and on-disk caches, compiles for
the simulated target on a miss, and "launches" by recording the grid, the compiled kernel and
the arguments: binaries are never loaded and nothing executes. The ahead-of-time cache's
verification and the compile tests' launch checks both run on it.

Triton internals touched: ``triton.runtime.driver`` (``driver._active`` saved and restored
around ``set_active``; the driver protocol the stand-in implements: ``get_current_target``,
``get_current_device``, ``get_current_stream``, ``get_active_torch_device``, ``launcher_cls``,
``utils.load_binary``, ``utils.get_device_properties``), ``triton.compiler.compiler``
(``max_shared_mem``, cached from the stand-in and cleared afterwards), and what
:mod:`.launchers` touches. Verified on Triton 3.6.0 and 3.9.0.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from .launchers import clear_libcuda_caches, cuda_launcher_class, intercepted_builds, libcuda_dir, per_kernel_launchers
from .specialise import fresh_jit_caches


def _runtime_driver():
    from triton.runtime.driver import driver

    return driver


def current_target():
    """The target the JIT compiles for on this process's current GPU."""
    return _runtime_driver().active.get_current_target()


def current_device():
    return _runtime_driver().active.get_current_device()


@dataclass
class Launch:
    """One kernel launch on a simulated device."""

    grid: tuple
    kernel_name: str
    metadata: object  # the compiled kernel's metadata
    args: tuple  # the runtime arguments, as the launcher receives them


def _recording_launcher(launches: list):
    class RecordingLauncher:
        """Appends each launch to ``launches`` instead of running it."""

        def __init__(self, src, metadata):
            self.name = metadata.name
            self.metadata = metadata

        def __call__(self, gx, gy, gz, stream, function, packed_metadata, launch_metadata, enter_hook, exit_hook,
                     *args):
            launches.append(Launch((gx, gy, gz), self.name, self.metadata, args))

    return RecordingLauncher


class SimulatedDriver:
    """Just enough of a Triton GPU driver for ``JITFunction.run`` to go through its whole path
    (specialise, look up the caches, compile, "load", build the launcher, launch) with no GPU."""

    def __init__(self, target, launcher_cls):
        self.target = target
        self.launcher_cls = launcher_cls
        self.utils = _SimulatedUtils()

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")


@dataclass(frozen=True)
class SimulatedTensorMap:
    """What a simulated device hands a kernel for a TMA descriptor argument: the fields the
    real driver would encode, after the same checks (nothing reads it; launches do not run)."""

    global_address: int
    elem_size: int
    box: tuple
    shape: tuple
    strides: tuple  # in elements, outermost first; the innermost is 1


#: cuTensorMapEncodeTiled's limits: rank, box extent per dimension, alignment of the global
#: address and of every byte stride but the innermost
_TMA_MAX_RANK, _TMA_MAX_BOX, _TMA_ALIGN = 5, 256, 16


def simulated_tensor_map(global_address, swizzle, elem_size, elem_type, block_size, shape, strides, padding):
    """The simulated driver's ``fill_tma_descriptor`` (the signature of Triton's NVIDIA driver
    utility, which per-kernel launchers call for every tensor-descriptor argument): checks what
    the CUDA driver would refuse to encode and returns a :class:`SimulatedTensorMap`."""
    box, shape, strides = tuple(block_size), tuple(shape), tuple(strides)
    if not 1 <= len(box) <= _TMA_MAX_RANK or len(shape) != len(box) or len(strides) != len(box):
        raise ValueError(f"TMA descriptor: rank 1..{_TMA_MAX_RANK} with box, shape and strides of one rank, "
                         f"got box {box}, shape {shape}, strides {strides}")
    if global_address % _TMA_ALIGN:
        raise ValueError(f"TMA descriptor: global address {global_address:#x} is not {_TMA_ALIGN}-byte aligned")
    if any(not 1 <= b <= _TMA_MAX_BOX for b in box):
        raise ValueError(f"TMA descriptor: box {box} has an extent outside 1..{_TMA_MAX_BOX}")
    if strides[-1] != 1 or any(s * elem_size % _TMA_ALIGN for s in strides[:-1]):
        raise ValueError(f"TMA descriptor: strides {strides} (elements of {elem_size} bytes) must end in 1 with "
                         f"the others multiples of {_TMA_ALIGN} bytes")
    return SimulatedTensorMap(global_address, elem_size, box, shape, strides)


class _SimulatedUtils:
    def load_binary(self, name, binary, shared, device):
        # (module, function, n_regs, n_spills, max threads) with no module handle: a kernel
        # collected after the real driver is back must not ask that driver (there may be none)
        # to unload it
        return None, 1, 0, 0, 1024

    def get_device_properties(self, device):
        # no shared-memory limit here: the compile checks decide what fits
        return {"max_shared_mem": 1 << 30, "multiprocessor_count": 1}

    fill_tma_descriptor = staticmethod(simulated_tensor_map)


@contextlib.contextmanager
def _active_driver(stand_in):
    """Make ``stand_in`` Triton's active driver for the duration (restoring the previous one,
    including "not chosen yet")."""
    driver = _runtime_driver()
    saved = driver._active
    driver.set_active(stand_in)
    try:
        yield
    finally:
        driver._active = saved


class LauncherStubMissing(RuntimeError):
    """A launch on a simulated device needed a C launcher stub the cache does not hold."""


@dataclass
class LauncherStubs:
    """The per-signature CUDA launcher stubs (Triton 3.6) launches on a simulated device met."""

    found: int = 0  # loaded from the current Triton cache
    missing: list[str] = field(default_factory=list)  # would have been built (the launch raised)


@contextlib.contextmanager
def simulated_device(target, jit_functions=(), *, launcher_stubs: LauncherStubs | None = None):
    """Make ``target`` (a ``GPUTarget``) the current device; yields the list of :class:`Launch`
    records. ``jit_functions`` start with empty in-memory caches, restored afterwards, so
    kernels compiled here never leak into other callers.

    With ``launcher_stubs`` and a Triton that builds a C launcher stub per kernel signature
    (3.6), CUDA launches go through Triton's real launcher class: the stub is looked up in the
    current cache (``found``) or recorded as ``missing`` and the launch raises
    :class:`LauncherStubMissing`; such launches are not recorded. Driver C modules are never
    built or loaded on a simulated device."""
    from triton import knobs
    from triton.compiler import compiler

    launches: list[Launch] = []
    stubs = launcher_stubs if launcher_stubs is not None else LauncherStubs()

    class NoOpLauncherModule:
        @staticmethod
        def launch(*args, **kwargs):
            return None

    def load_module(name, path):
        stubs.found += 1
        return NoOpLauncherModule

    def refuse_build(name, src, srcdir, *args, **kwargs):
        stubs.missing.append(name)
        raise LauncherStubMissing(name)

    real_launchers = launcher_stubs is not None and target.backend == "cuda" and per_kernel_launchers()
    # HIP stubs need the local HIP runtime; from Triton 3.7 on the generic launcher lives in
    # the driver utils the stand-in replaces
    launcher_cls = cuda_launcher_class() if real_launchers else _recording_launcher(launches)
    with knobs.nvidia.scope(), fresh_jit_caches(jit_functions), _active_driver(SimulatedDriver(target, launcher_cls)):
        if real_launchers:
            knobs.nvidia.libcuda_path = libcuda_dir()  # the stub's cache key holds it
        try:
            with intercepted_builds(load_module, refuse_build):
                yield launches
        finally:
            # cached per process from the stand-in; the real driver must look again
            compiler.max_shared_mem.cache_clear()
            clear_libcuda_caches()
