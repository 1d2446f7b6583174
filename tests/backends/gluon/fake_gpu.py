"""A stand-in Triton driver: run a backend's real launch path on a machine without a GPU.

Inside :func:`fake_gpu`, ``kernel[grid](...)`` goes through the real JIT: it binds the
arguments, specialises them exactly as on a GPU (CPU tensors carry dtype, address alignment
and storage size like device tensors), compiles for ``target`` and "launches" by recording the
grid, the compiled kernel and the arguments instead of running anything.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import dataclass

import torch

from paged_mqa_logits._triton_compat import active_driver


@dataclass
class Launch:
    grid: tuple
    kernel_name: str
    metadata: object
    args: tuple


@contextlib.contextmanager
def fake_gpu(target, jit_functions):
    """Make ``target`` (a ``GPUTarget``) the current device for ``jit_functions``; yields the
    list of :class:`Launch` records. The functions' per-device caches are swapped out and
    restored, so kernels compiled here never leak into other tests."""
    launches: list[Launch] = []

    class Launcher:
        def __init__(self, src, metadata):
            self.name = metadata.name
            self.metadata = metadata

        def __call__(self, gx, gy, gz, stream, function, packed_metadata, launch_metadata, enter_hook, exit_hook,
                     *args):
            launches.append(Launch((gx, gy, gz), self.name, self.metadata, args))

    class Utils:
        def load_binary(self, name, kernel, shared, device):
            # module, function, n_regs, n_spills, max threads; no module handle, so that a kernel
            # collected after the real driver is back is not unloaded through it
            return None, object(), 0, 0, 1024

        def get_device_properties(self, device):
            return {"max_shared_mem": 1 << 20, "multiprocessor_count": 1}

    class Driver:
        utils = Utils()
        launcher_cls = Launcher

        def get_current_target(self):
            return target

        def get_current_device(self):
            return 0

        def get_current_stream(self, device):
            return 0

        def get_active_torch_device(self):
            return torch.device("cpu")

    saved_caches = [(fn, fn.device_caches) for fn in jit_functions]
    for fn in jit_functions:
        fn.device_caches = defaultdict(fn.create_binder)
    try:
        with active_driver(Driver()):
            yield launches
    finally:
        for fn, caches in saved_caches:
            fn.device_caches = caches


def compiled_kernels(jit_function) -> list:
    """Kernels the JIT compiled for the fake device (call inside :func:`fake_gpu`)."""
    return [k for cache in jit_function.device_caches.values() for k in cache[0].values()]
