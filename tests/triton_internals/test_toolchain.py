"""The toolchains (paged_mqa_logits/triton_internals/toolchain.py): the ptxas Triton assembles
with, and the AMD register margin of the running compiler."""

import subprocess

import pytest

from paged_mqa_logits.triton_internals import toolchain
from paged_mqa_logits.triton_internals.compiler import ASTSource, GPUTarget
from paged_mqa_logits.triton_internals.version import version


def test_ptxas_for_sm_90_accepts_the_ptx_triton_emits(tmp_path):
    """The PTX version Triton picks follows the ptxas it assembles with; that ptxas must take
    Triton's own sm_90 PTX (3.9 emits PTX 9.x, which the wheel's CUDA 12 ptxas refuses)."""
    import triton
    import triton.language as tl

    ptxas = toolchain.ptxas_for(90)
    if ptxas is None:
        pytest.skip("the Triton wheel carries no ptxas")

    @triton.jit
    def copy_kernel(src, dst):
        tl.store(dst + tl.arange(0, 32), tl.load(src + tl.arange(0, 32)))

    src = ASTSource(copy_kernel, {"src": "*fp32", "dst": "*fp32"}, {}, {})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    (tmp_path / "k.ptx").write_text(ptx)
    done = subprocess.run([ptxas, "--gpu-name=sm_90a", str(tmp_path / "k.ptx"), "-o", str(tmp_path / "k.cubin")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_amd_vgpr_margin_is_the_running_compilers():
    assert [toolchain.amd_vgpr_margin(v) for v in ((3, 6), (3, 7), (3, 8), (3, 9))] == [0, 17, 17, 33]
    assert toolchain.AMD_VGPR_MARGIN == toolchain.amd_vgpr_margin(version())
    with pytest.raises(AttributeError, match="no_such_name"):
        toolchain.no_such_name  # noqa: B018
