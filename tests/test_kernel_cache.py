"""The ahead-of-time kernel cache, proven on CPU: the specialisation and cache keys recorded on
meta tensors equal the ones Triton's real JIT computes for a launch on an sm_90 / gfx950 device
(simulated driver), the JIT finds the precompiled binaries (and CUDA launcher stubs) instead of
compiling, and the run-time lookup rule (env var, defaults, overlay) behaves as documented."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from paged_mqa_logits.aot.launches import gpu_target, launches_of, meta_launch_args
from paged_mqa_logits.aot.verify import VerifyResult, simulated_device, verify
from paged_mqa_logits.triton_internals import cache_overlay as overlay
from paged_mqa_logits import reload_tuned_table
from paged_mqa_logits.triton_internals.compiler import cache_invalidating_env
from paged_mqa_logits.triton_internals.launchers import per_kernel_launchers
from paged_mqa_logits.problem import LOGITS_DTYPES, Problem
from paged_mqa_logits.aot.warmup import warm_inputs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the sm_90 TMA row: its keys go by TMA descriptor, which a launch builds on the host
TINY_TABLE = """\
arch,cu_num,heads,head_dim,kv_block_size,preshuffle,batch,next_n,kv_format,logits_dtype,context,backend,ChunkK,WavePerEU,SplitKV,num_warps,num_stages,Consumers,CtasPerSM,KeyCopy,RowSplit,RowsPerMMA,Schedule,variant,us,provenance
sm_90,132,64,128,64,0,2,1,,,any,triton,64,,0,4,3,,,,,,,,,prior:test
sm_90,132,32,128,64,0,4,1,,,any,gluon,128,,,4,2,1,2,tma,,1,balanced,wgmma_ws,,prior:test
sm_90,132,64,128,32,0,4,2,,,any,gluon,64,,0,4,2,4,1,tma,1,2,balanced,wgmma_pipes,,prior:test
gfx950,256,64,128,64,1,2,1,,,any,triton,64,,0,4,2,,,,,,,,,prior:test
sm_90,132,64,128,64,0,2,1,fp4,bf16,any,triton,64,,0,4,3,,,,,,,,,prior:test
gfx950,256,64,128,64,1,2,1,fp4,fp32,any,triton,64,,0,4,2,,,,,,,,,prior:test
"""


@pytest.fixture
def tiny_table(tmp_path, monkeypatch):
    path = tmp_path / "tiny_tuned.csv"
    path.write_text(TINY_TABLE)
    monkeypatch.setenv("PAGED_MQA_LOGITS_CONFIGS", str(path))
    reload_tuned_table()
    return str(path)


@pytest.fixture
def clean_activation():
    overlay.deactivate()
    yield
    overlay.deactivate()


def valid_manifest(files: dict) -> dict:
    """What precompile writes, minus the kernels: this process's Triton, Python and env."""
    import sysconfig

    import triton

    return {"triton_version": triton.__version__, "python_ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
            "cache_invalidating_env": cache_invalidating_env(), "kernels": [], "files": files}


def _problem(arch, **kw):
    fields = dict(arch=arch, cu_num=132 if arch == "sm_90" else 256, batch=3, next_n=2, heads=64, head_dim=128,
                  kv_block_size=64, preshuffle=arch != "sm_90", context=None, lens_2d=True,
                  fp8="fn", max_model_len=512)
    fields.update(kw)
    return Problem.from_record(fields)


@pytest.mark.parametrize("arch", ["sm_90", "gfx950"])
@pytest.mark.parametrize("lens_2d", [True, False])
@pytest.mark.parametrize("kv_format,logits_dtype", [("fp8", "fp32"), ("fp4", "bf16")])
def test_recorded_keys_equal_the_keys_of_a_real_jit_launch(arch, lens_2d, kv_format, logits_dtype):
    """Meta-tensor recording vs Triton's own JIT.run on real tensors of a simulated device."""
    from triton import knobs

    from paged_mqa_logits import backends
    from paged_mqa_logits.triton_internals.compiler import ASTSource, compile_cache_hash, make_backend

    target = gpu_target(arch)
    problem = _problem(arch, lens_2d=lens_2d, batch=1 if lens_2d else 3, kv_format=kv_format,
                       logits_dtype=logits_dtype)
    config = {"ChunkK": 64, "SplitKV": 0, "num_warps": 4, "num_stages": 3}
    workspace = torch.empty((problem.rows, 512), dtype=LOGITS_DTYPES[logits_dtype])
    real = warm_inputs(problem, device="cpu", workspace=workspace, validate=False)
    recorded = launches_of("triton", meta_launch_args(real), config, target)
    assert len(recorded) == 1

    seen = []

    def hook(*, key, repr, fn, compile, is_manual_warmup, already_compiled):
        seen.append((key, compile))
        return True  # the JIT then skips compiling and launching

    kernel = recorded[0].kernel
    knobs.runtime.jit_cache_hook = hook
    try:
        with simulated_device(target, VerifyResult(), [kernel]):
            backends.get("triton").launch(real, config)
    finally:
        knobs.runtime.jit_cache_hook = None
    (jit_key, compile_args), = seen
    assert recorded[0].jit_key == jit_key
    # the on-disk key triton.compile would file the JIT's kernel under, from the JIT's own data
    backend = make_backend(target)
    jit_options = json.loads(compile_args["specialization_data"])["options"]
    jit_options = backend.parse_options({k: tuple(v) if isinstance(v, list) else v for k, v in jit_options.items()})
    src = ASTSource(kernel, compile_args["signature"], compile_args["constants"], compile_args["configs"][0])
    assert recorded[0].disk_key() == compile_cache_hash(src, backend, jit_options)


def test_meta_inputs_specialise_like_real_inputs():
    for problem in (_problem("sm_90"), _problem("gfx942", fp8="fnuz", lens_2d=False, batch=1, next_n=1),
                    _problem("gfx950", kv_block_size=16, max_model_len=100),
                    _problem("sm_90", kv_format="fp4", logits_dtype="bf16")):
        dtype = LOGITS_DTYPES[problem.shape_key.logits_dtype]
        real = warm_inputs(problem, device="cpu", validate=False,
                           workspace=torch.empty((problem.rows + 2, problem.max_model_len), dtype=dtype))
        meta = warm_inputs(problem, device="meta",
                           workspace=torch.empty((problem.rows + 2, problem.max_model_len), dtype=dtype, device="meta"))
        names = ("q", "kv_cache", "weights", "out", "context_lens", "block_table")
        for name in names + (("q_scale",) if problem.shape_key.kv_format == "fp4" else ()):
            a, b = getattr(meta_launch_args(real), name), getattr(meta, name)
            assert (a.dtype, a.shape, a.stride(), a.storage_offset(), a.untyped_storage().nbytes()) == \
                   (b.dtype, b.shape, b.stride(), b.storage_offset(), b.untyped_storage().nbytes()), name


def _cli(*args, env=None):
    """The CLI in a fresh process: compiling must not share a process with the Triton interpreter
    the CPU tests run (it leaves triton.language patched; see triton_internals/interpreter.py)."""
    done = subprocess.run([sys.executable, "-m", "paged_mqa_logits", "precompile", *args], capture_output=True,
                          text=True, cwd=REPO, env=dict(os.environ, **(env or {})))
    return done.returncode, done.stdout + done.stderr


def test_precompile_then_the_jit_finds_every_kernel_and_launcher(tiny_table, tmp_path, clean_activation):
    out = str(tmp_path / "cache")
    code, log = _cli("--arch", "sm_90;gfx950", "--out", out, "--max-model-len", "512", "--no-fallbacks", "--quiet",
                     "--verify")
    assert code == 0, log
    manifest = overlay.read_manifest(out)
    assert manifest["targets"] == ["gfx950", "sm_90"]
    assert manifest["files"] and all(overlay.sha256_of(os.path.join(out, rel)) == sha for rel, sha in manifest["files"].items())
    assert not any(name.endswith(".tmp") for name in os.listdir(out))
    assert {k["arch"] for k in manifest["kernels"]} == {"sm_90", "gfx950"}
    formats = {(k["arch"], k["problem"]["shape_key"]["kv_format"], k["problem"]["shape_key"]["logits_dtype"])
               for k in manifest["kernels"]}
    assert {("sm_90", "fp4", "bf16"), ("gfx950", "fp4", "fp32"), ("sm_90", "fp8", "fp32")} <= formats
    assert f"verify: {len(manifest['kernels'])}/{len(manifest['kernels'])} kernels found by the JIT" in log

    result = verify(out)  # in this process too: loading from the cache compiles nothing
    assert result.ok, result.describe()
    assert result.disk_hits == len(manifest["kernels"])
    if per_kernel_launchers():  # Triton 3.6's CUDA launcher stubs (HIP stubs need the local HIP runtime)
        assert result.launchers_found >= 1

    # relocatable: the group files' absolute paths of the build dir are not needed
    moved = str(tmp_path / "installed" / "kernel_cache")
    shutil.move(out, moved)
    assert verify(moved).ok

    # a manifest written while problems repeated their key's fields flat and carried their
    # target's device type and ``hypothetical`` still verifies: those keys are ignored
    old = overlay.read_manifest(moved)
    for entry in old["kernels"]:
        assert "device_type" not in entry["problem"] and "hypothetical" not in entry["problem"]
        entry["problem"].update(entry["problem"].pop("shape_key"), device_type="cuda", hypothetical=True)
    overlay.write_manifest_atomically(moved, old)
    assert verify(moved).ok

    # a cache-invalidating env var that differs from build time makes every kernel miss (the
    # verification can fail); fresh process, since a miss compiles
    probe = f"from paged_mqa_logits.aot.verify import verify; print(verify({moved!r}).describe())"
    stale = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO,
                           env=dict(os.environ, TRITON_DEFAULT_FP_FUSION="0"))
    n = len(manifest["kernels"])
    assert f"verify: 0/{n} kernels found by the JIT in the cache, {n} compiled" in stale.stdout, stale.stdout + stale.stderr
    assert "FAIL" in stale.stdout


def test_lookup_rule_env_defaults_and_off(tmp_path, monkeypatch, clean_activation):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    monkeypatch.setenv(overlay.ENV_CACHE, os.pathsep.join([str(a), str(tmp_path / "missing"), str(b)]))
    assert overlay.cache_dirs() == [str(a), str(b)]
    monkeypatch.setenv(overlay.ENV_CACHE, "off")
    assert overlay.cache_dirs() == []
    monkeypatch.delenv(overlay.ENV_CACHE)
    monkeypatch.setattr(overlay, "default_dirs", lambda: [str(tmp_path / "nope"), str(b)])
    assert overlay.cache_dirs() == [str(b)]


def test_a_cache_built_by_another_triton_or_python_is_skipped(tmp_path, monkeypatch, clean_activation, caplog):
    (tmp_path / "manifest.json").write_text(json.dumps(
        {"triton_version": "0.0.0", "python_ext_suffix": ".cpython-39-x86_64-linux-gnu.so", "kernels": [],
         "files": {}}))
    monkeypatch.setenv(overlay.ENV_CACHE, str(tmp_path))
    assert overlay.activate() == []
    assert "not used" in caplog.text


def test_activate_overlays_without_touching_the_users_cache(tmp_path, monkeypatch, clean_activation):
    from triton import knobs

    monkeypatch.setenv(overlay.ENV_CACHE, str(tmp_path))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "user"))
    overlay.write_manifest_atomically(str(tmp_path), valid_manifest({}))
    assert overlay.activate() == [str(tmp_path)]
    assert knobs.cache.manager_class.precompiled_dirs == [str(tmp_path)]
    assert knobs.cache.dir == str(tmp_path / "user")  # writes still go to the user's cache dir
    overlay.deactivate()
    assert knobs.cache.manager_class is None

    class Mine:  # a user-installed cache manager wins
        pass

    knobs.cache.manager_class = Mine
    try:
        assert overlay.activate() == []
        assert knobs.cache.manager_class is Mine
    finally:
        del knobs.cache.manager_class


def test_a_relative_xdg_cache_home_is_ignored(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert overlay.default_dirs()[-1] == str(tmp_path / "xdg" / "paged_mqa_logits" / "kernel_cache")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert overlay.default_dirs()[-1] == str(tmp_path / ".cache" / "paged_mqa_logits" / "kernel_cache")


def test_precompile_help_names_the_command_it_is_run_as():
    code, log = _cli("--help")
    assert code == 0 and log.startswith("usage: python -m paged_mqa_logits precompile "), log
