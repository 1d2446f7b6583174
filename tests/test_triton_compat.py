"""The Triton compatibility layer (paged_mqa_logits/_triton_compat.py): the supported-range
warning, version parsing, and the version-specific names resolving to what the running Triton
provides."""

import subprocess
import sys
import warnings

import pytest

from paged_mqa_logits import _triton_compat as compat


def test_parse_version():
    assert compat.parse_version("3.9.0") == (3, 9)
    assert compat.parse_version("3.6.0+git1234abcd") == (3, 6)
    assert compat.parse_version("3.10.1rc2") == (3, 10)
    with pytest.raises(ValueError, match="not a Triton version"):
        compat.parse_version("nightly")


@pytest.mark.parametrize("text, tested", [("3.5.1", False), ("3.6.0", True), ("3.7.1", True), ("3.9.0", True),
                                          ("3.10.0", False), ("4.0.0", False)])
def test_tested_range(text, tested):
    assert compat.is_tested(text) is tested


def test_an_untested_triton_warns_once_naming_both_versions(monkeypatch):
    import triton

    monkeypatch.setattr(compat, "_WARNED_UNTESTED", False)
    monkeypatch.setattr(triton, "__version__", "3.10.0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert compat.warn_if_untested() is True
        assert compat.warn_if_untested() is False
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "3.10.0" in message and compat.tested_range_text() in message and "3.6 to 3.9" in message


def test_a_tested_triton_does_not_warn(monkeypatch):
    import triton

    monkeypatch.setattr(compat, "_WARNED_UNTESTED", False)
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compat.warn_if_untested() is False


def test_importing_the_package_warns_once_under_an_untested_triton():
    """In a fresh process whose Triton claims 3.10: one warning, however often it is imported."""
    probe = ("import warnings; warnings.simplefilter('always')\n"
             "import triton; triton.__version__ = '3.10.0'\n"
             "with warnings.catch_warnings(record=True) as caught:\n"
             "    warnings.simplefilter('always')\n"
             "    import paged_mqa_logits\n"
             "    import importlib; importlib.reload(paged_mqa_logits)\n"
             "print([str(w.message) for w in caught if 'tested with Triton' in str(w.message)])\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.count("tested with Triton 3.6 to 3.9") == 1 and "Triton 3.10.0" in out, out


def test_the_package_import_does_not_import_triton():
    out = subprocess.run([sys.executable, "-c", "import sys, paged_mqa_logits; print('triton' in sys.modules)"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_gluon_names_resolve_to_the_running_versions_builtins():
    gl = pytest.importorskip("triton.experimental.gluon.language")
    from triton.experimental.gluon.language.nvidia.ampere import async_copy

    major_minor = compat.version()
    copy = compat.async_copy.async_copy_global_to_shared
    assert copy.__name__ == ("async_load" if major_minor >= (3, 8) else "async_copy_global_to_shared")
    assert copy is getattr(async_copy, copy.__name__)
    assert compat.thread_barrier is (gl.barrier if major_minor >= (3, 7) else gl.thread_barrier)
    for name in ("async_copy_global_to_shared", "commit_group", "wait_group"):
        assert getattr(getattr(compat.async_copy, name), "__triton_builtin__", False), name
    for name in ("fence_async_shared", "warpgroup_mma", "warpgroup_mma_wait", "mma_v2", "thread_barrier"):
        assert getattr(getattr(compat, name), "__triton_builtin__", False), name


def test_unknown_names_raise_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        compat.no_such_name  # noqa: B018


def test_per_kernel_launchers_only_before_3_7():
    assert compat.per_kernel_launchers() is (compat.version() < (3, 7))


def test_ptxas_for_sm_90_accepts_the_ptx_triton_emits(tmp_path):
    """The PTX version Triton picks follows the ptxas it assembles with; that ptxas must take
    Triton's own sm_90 PTX (3.9 emits PTX 9.x, which the wheel's CUDA 12 ptxas refuses)."""
    import triton
    import triton.language as tl

    ptxas = compat.ptxas_for(90)
    if ptxas is None:
        pytest.skip("the Triton wheel carries no ptxas")

    @triton.jit
    def copy_kernel(src, dst):
        tl.store(dst + tl.arange(0, 32), tl.load(src + tl.arange(0, 32)))

    src = compat.ASTSource(copy_kernel, {"src": "*fp32", "dst": "*fp32"}, {}, {})
    ptx = triton.compile(src, target=compat.GPUTarget("cuda", 90, 32)).asm["ptx"]
    (tmp_path / "k.ptx").write_text(ptx)
    done = subprocess.run([ptxas, "--gpu-name=sm_90a", str(tmp_path / "k.ptx"), "-o", str(tmp_path / "k.cubin")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
