"""The simulated device (paged_mqa_logits/triton_internals/device.py): the real launch path
binds, specialises, compiles for the simulated target and records the launch; Triton 3.6's
per-signature CUDA launcher stubs are looked up in the cache when asked."""

import pytest
import torch

from kernels import scale_kernel
from paged_mqa_logits.triton_internals import device
from paged_mqa_logits.triton_internals.compiler import GPUTarget
from paged_mqa_logits.triton_internals.launchers import per_kernel_launchers
from paged_mqa_logits.triton_internals.specialise import compiled_kernels


def test_a_launch_compiles_for_the_target_and_is_recorded(tmp_path):
    from triton import knobs

    src, dst = torch.ones(64), torch.zeros(64)
    before = compiled_kernels(scale_kernel)
    with knobs.cache.scope():
        knobs.cache.dir = str(tmp_path)
        for target, isa in ((GPUTarget("cuda", 90, 32), "ptx"), (GPUTarget("hip", "gfx942", 64), "amdgcn")):
            with device.simulated_device(target, [scale_kernel]) as launches:
                assert device.current_target() == target and device.current_device() == 0
                scale_kernel[(2, 1)](src, dst, 64, 64, 1, BLOCK=32)
                scale_kernel[(3,)](src, dst, 64, 64, 1, BLOCK=32)  # the JIT's cache: no second compile
                kernels = compiled_kernels(scale_kernel)
            assert [launch.grid for launch in launches] == [(2, 1, 1), (3, 1, 1)]
            assert launches[0].kernel_name == "scale_kernel" and launches[0].metadata.target == target
            assert launches[0].args[:3] == (src, dst, 64)
            assert len(kernels) == 1 and isa in kernels[0].asm
            assert compiled_kernels(scale_kernel) == before  # nothing leaks out of the device
    assert torch.all(dst == 0)  # nothing ran


def test_launcher_stubs_are_looked_up_in_the_cache(tmp_path):
    from triton import knobs

    stubs = device.LauncherStubs()
    src, dst = torch.ones(64), torch.zeros(64)
    with knobs.cache.scope():
        knobs.cache.dir = str(tmp_path)  # an empty cache: no stub to find
        with device.simulated_device(GPUTarget("cuda", 90, 32), [scale_kernel], launcher_stubs=stubs) as launches:
            try:
                scale_kernel[(1,)](src, dst, 64, 64, 1, BLOCK=32)
                missing = None
            except device.LauncherStubMissing as exc:
                missing = str(exc)
    if per_kernel_launchers():  # 3.6: the launch needs its signature's stub, which is not cached
        assert missing == "__triton_launcher" and stubs.missing == ["__triton_launcher"] and not launches
    else:  # one generic launcher, in the driver utils the simulated device replaces
        assert missing is None and stubs.missing == [] and len(launches) == 1
    assert stubs.found == 0


def test_the_simulated_driver_builds_tma_descriptors_with_the_cuda_drivers_checks():
    from triton.runtime.driver import driver

    with device.simulated_device(GPUTarget("cuda", 90, 32)):
        fill = driver.active.utils.fill_tma_descriptor
        ok = fill(0x1000, 128, 1, 0, [1, 64, 128], [10, 64, 128], [8448, 128, 1], 0)
        assert ok.box == (1, 64, 128) and ok.strides == (8448, 128, 1)
        for address, box, strides, what in ((0x1004, [1, 64, 128], [8448, 128, 1], "aligned"),
                                            (0x1000, [1, 512, 128], [8448, 128, 1], "box"),
                                            (0x1000, [1, 64, 128], [8452, 128, 1], "strides")):
            with pytest.raises(ValueError, match=what):
                fill(address, 128, 1, 0, box, [10, 64, 128], strides, 0)
