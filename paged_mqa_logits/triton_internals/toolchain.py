"""The toolchains behind Triton's compiles, reached without a GPU: NVIDIA's tools, AMDGCN from
LLVM IR, the AMD linker, and how much more the AMD compiler of each release needs.

What differs between releases:

* PTX: from 3.9 on the wheel's newer ``ptxas`` (``ptxas-blackwell``) also assembles sm_90 and
  the PTX version follows it; :func:`ptxas_for` names the assembler Triton uses for an arch.
* AMD code generation: from 3.7 on the compiler needs more VGPRs for the same gfx942/gfx950
  kernel than the 3.6 compiler the CDNA register estimate was calibrated on:
  :data:`AMD_VGPR_MARGIN`.
* AMDGCN from LLVM IR: through the bundled LLVM's ``translate_to_asm`` up to 3.8 (3.8 added
  one flag), through the AMD backend's ``make_amdgcn`` stage from 3.9 on.

Triton internals touched: ``triton.backends.nvidia.compiler.get_ptxas``,
``triton.backends.amd.compiler.HIPBackend.make_amdgcn``, ``triton._C.libtriton`` (``llvm``,
``amd.link_hsaco``, ``amd.TARGET_TRIPLE``); ``triton.knobs.nvidia`` tool knobs. Verified on
Triton 3.6.0 and 3.9.0.
"""

from __future__ import annotations

import os

from .version import version

def amd_vgpr_margin(triton_version: tuple[int, int]) -> int:
    """VGPRs per lane the gfx942/gfx950 kernels need beyond ``mfma.vgpr_estimate`` (calibrated
    on the Triton 3.6 compiler): the smallest margin with which every knob set the estimate
    admits compiles without scratch (checked by tests/backends/gluon/test_compile_mfma.py)."""
    if triton_version <= (3, 6):
        return 0
    if triton_version <= (3, 8):
        return 17
    return 33


def __getattr__(name: str):
    if name == "AMD_VGPR_MARGIN":  # the running Triton's margin (imports Triton)
        value = globals()[name] = amd_vgpr_margin(version())
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
