"""CMake entry point on a CPU machine: configure with GPU_TARGETS, build `precompile` (a tiny
table keeps it fast), and check that a fresh process of the package finds and uses the cache;
in the slow set, the same over the shipped tables for every arch."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE = """\
arch,cu_num,heads,head_dim,kv_block_size,preshuffle,batch,next_n,context,backend,ChunkK,WavePerEU,SplitKV,num_warps,num_stages,us,provenance
sm_90,132,64,128,64,0,2,1,any,triton,64,,0,4,3,,prior:test
gfx950,256,32,128,64,1,2,2,any,triton,32,,0,4,2,,prior:test
"""


@pytest.fixture(scope="module")
def cmake():
    exe = shutil.which("cmake")
    if exe is None:
        pytest.skip("cmake is not installed")
    return exe


def _run(cmd, **kw):
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_configure_precompile_and_the_package_uses_the_cache(cmake, tmp_path):
    table = tmp_path / "tiny_tuned.csv"
    table.write_text(TABLE)
    build, cache = tmp_path / "build", tmp_path / "kernel_cache"
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton_cache"))
    env.pop("PAGED_MQA_LOGITS_KERNEL_CACHE", None)
    _run([cmake, "-S", REPO, "-B", str(build), "-DGPU_TARGETS=sm_90;gfx950", f"-DPython3_EXECUTABLE={sys.executable}",
          f"-DPAGED_MQA_LOGITS_KERNEL_CACHE_DIR={cache}", "-DPAGED_MQA_LOGITS_MAX_MODEL_LEN=2048",
          f"-DPAGED_MQA_LOGITS_CONFIGS={table}", "-DPAGED_MQA_LOGITS_LENS=2d", "-DPAGED_MQA_LOGITS_FALLBACKS=OFF"],
         env=env)
    log = _run([cmake, "--build", str(build), "--target", "precompile"], env=env)
    assert "verify: 2/2 kernels found by the JIT in the cache, 0 compiled" in log, log

    manifest = json.loads((cache / "manifest.json").read_text())
    assert {k["arch"] for k in manifest["kernels"]} == {"sm_90", "gfx950"}
    assert manifest["tables"] == [str(table)]

    # A fresh process finds the cache through the documented variable and loads from it.
    probe = (
        "from paged_mqa_logits.triton_internals import cache_overlay\n"
        "from paged_mqa_logits.aot.verify import verify\n"
        "dirs = cache_overlay.activate()\n"
        "from triton import knobs\n"
        "print('dirs', dirs, 'overlay', knobs.cache.manager_class.__name__)\n"
        "r = verify()\n"
        "print(r.describe())\n"
    )
    out = _run([sys.executable, "-c", probe], cwd=REPO, env=dict(env, PAGED_MQA_LOGITS_KERNEL_CACHE=str(cache)))
    assert f"dirs ['{cache}'] overlay PrecompiledOverlayCacheManager" in out
    assert "0 compiled" in out and "-> OK" in out

    targets = _run([cmake, "--build", str(build), "--target", "help"])
    assert "tune" in targets and "precompile" in targets
    tests = _run(["ctest", "-N"], cwd=str(build)) if shutil.which("ctest") else "Test #1: pytest"
    assert "Test #1: pytest" in tests


@pytest.mark.slow
def test_the_shipped_tables_precompile_and_verify_for_every_arch(cmake, tmp_path):
    """The documented ahead-of-time path over the shipped tables, as an engine's build runs it:
    every kernel their rows (and the fallback chains) can pick, for every arch, compiles and is
    then found in the cache by the JIT on a simulated device of its arch (TMA-descriptor
    kernels included)."""
    build, cache = tmp_path / "build", tmp_path / "kernel_cache"
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton_cache"))
    for name in ("PAGED_MQA_LOGITS_KERNEL_CACHE", "PAGED_MQA_LOGITS_CONFIGS", "AITER_CONFIG_PAGED_MQA_LOGITS"):
        env.pop(name, None)
    _run([cmake, "-S", REPO, "-B", str(build), "-DGPU_TARGETS=gfx942;gfx950;sm_90",
          f"-DPython3_EXECUTABLE={sys.executable}", f"-DPAGED_MQA_LOGITS_KERNEL_CACHE_DIR={cache}"], env=env)
    log = _run([cmake, "--build", str(build), "--target", "precompile"], env=env)
    verdict = re.search(r"verify: (\d+)/(\d+) kernels found by the JIT in the cache, 0 compiled, .* -> OK", log)
    assert verdict and verdict.group(1) == verdict.group(2), log[-3000:]
    manifest = json.loads((cache / "manifest.json").read_text())
    assert {k["arch"] for k in manifest["kernels"]} == {"gfx942", "gfx950", "sm_90"}
    shipped = sorted(os.path.join(REPO, "configs", name) for name in os.listdir(os.path.join(REPO, "configs"))
                     if name.endswith("_tuned.csv"))
    assert sorted(manifest["tables"]) == shipped
