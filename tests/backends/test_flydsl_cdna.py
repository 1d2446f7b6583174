"""The ``flydsl`` backend (gfx942 / gfx950).

On a CPU machine: the package imports with and without flydsl and never imports it eagerly,
the backend refuses with the right reason (missing package, no ROCm runtime, arch, fp8
flavour, shapes), the launch path refuses before touching flydsl, the knob space is
consistent, and -- through the instruction-level emulator (``emulate.py``), which runs the
kernel's own code on NumPy lanes -- the kernel matches the reference over a random matrix.
On a ROCm gfx942/gfx950 GPU: the real kernel against the reference (skipped elsewhere).
"""

import dataclasses
import os
import subprocess
import sys
import types

import pytest
import torch

from op_cases import build, positional, random_case, reference_for
from paged_mqa_logits.backends.flydsl import backend as flydsl_backend
from paged_mqa_logits.backends.flydsl.backend import BACKEND, NOT_INSTALLED
from paged_mqa_logits.backends.flydsl.emulate import EmulationFault, emulate
from paged_mqa_logits.backends.flydsl.plan import CHUNK_KS, LDS_PER_CU, KernelPlan
from paged_mqa_logits.problem import Problem, derive_split_kv
from paged_mqa_logits.reference import check_logits
from paged_mqa_logits.validate import build_launch_args

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FP8 = {"gfx942": torch.float8_e4m3fnuz, "gfx950": torch.float8_e4m3fn}


def problem(arch="gfx950", *, heads=64, next_n=2, kv_block_size=64, fp8=None, device_type="cuda", head_dim=128,
            hypothetical=False, batch=8, context=4096):
    fp8 = fp8 or {"gfx942": "fnuz"}.get(arch, "fn")
    return Problem(arch, 256, batch, next_n, heads, head_dim, kv_block_size, True, context, True, fp8, device_type,
                   8192, hypothetical=hypothetical)


def _python(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                            env=dict(os.environ, PYTHONPATH=REPO))
    assert result.returncode == 0, result.stderr
    return result.stdout


# ============================================================================ import safety
def test_importing_the_package_never_imports_flydsl():
    out = _python("import sys, paged_mqa_logits, paged_mqa_logits.backends.flydsl_cdna as m\n"
                  "from paged_mqa_logits.backends import get\n"
                  "assert get('flydsl') is m.BACKEND\n"
                  "print(sorted(n for n in sys.modules if n == 'flydsl' or n.startswith('flydsl.')))")
    assert out.strip() == "[]"


def test_without_flydsl_the_package_imports_and_the_backend_says_why():
    out = _python("import sys\n"
                  "sys.modules['flydsl'] = None  # import flydsl now fails, as if not installed\n"
                  "import paged_mqa_logits\n"
                  "from paged_mqa_logits.backends import why_not\n"
                  "from paged_mqa_logits.problem import Problem\n"
                  "p = Problem('gfx950', 256, 8, 2, 64, 128, 64, True, None, True, 'fn', 'cuda', 8192)\n"
                  "print(why_not('flydsl', p))")
    assert out.strip() == NOT_INSTALLED


def test_missing_flydsl_reason_in_process(monkeypatch):
    monkeypatch.setitem(sys.modules, "flydsl", None)
    assert not flydsl_backend.flydsl_installed()
    assert BACKEND.unsupported(problem()) == NOT_INSTALLED
    assert BACKEND.unsupported(problem(hypothetical=True)) is None  # explain / --only-table: shapes only


# ============================================================================ reasons
def test_reasons_on_this_machine():
    if getattr(torch.version, "hip", None) and torch.cuda.is_available():
        pytest.skip("this machine has a ROCm runtime; the refusal path is for machines without one")
    if not flydsl_backend.flydsl_installed():
        pytest.skip("flydsl is not installed: the missing-package reason comes first (tested above)")
    reason = BACKEND.unsupported(problem())
    assert reason is not None and reason.startswith("no ROCm runtime"), reason
    assert BACKEND.unsupported(problem(device_type="cpu")).startswith("no ROCm runtime")


@pytest.mark.parametrize("kwargs, expected", [
    (dict(arch="sm_90", fp8="fn"), "gfx942/gfx950, not sm_90"),
    (dict(arch="cpu", fp8="fn"), "gfx942/gfx950, not cpu"),
    (dict(arch="gfx942", fp8="fn"), "e4m3fnuz natively"),
    (dict(arch="gfx950", fp8="fnuz"), "e4m3fn natively"),
    (dict(heads=48), "heads must be one of (32, 64)"),
    (dict(heads=16), "heads must be one of (32, 64)"),
    (dict(kv_block_size=1), "kv_block_size must be one of"),
    (dict(next_n=9), "next_n must be in 1..8"),
    (dict(head_dim=64), "head_dim must be 128"),
])
def test_unsupported_shapes_and_archs(kwargs, expected):
    # hypothetical: judged on arch and shape only, whatever this machine has
    assert expected in BACKEND.unsupported(problem(hypothetical=True, **kwargs))


def _fake_rocm(monkeypatch, arch_name):
    monkeypatch.setattr(torch.version, "hip", "6.4.0", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(gcnArchName=arch_name))
    monkeypatch.setattr(flydsl_backend, "flydsl_installed", lambda: True)


def test_rocm_runtime_of_the_right_arch_is_required(monkeypatch):
    _fake_rocm(monkeypatch, "gfx942:sramecc+:xnack-")
    assert BACKEND.unsupported(problem("gfx942")) is None
    # an arch override (PAGED_MQA_LOGITS_ARCH) must never make a gfx942 run a gfx950 kernel
    assert BACKEND.unsupported(problem("gfx950")) == "the ROCm device is gfx942, not gfx950"
    monkeypatch.setattr(torch.version, "hip", None)
    assert "not a ROCm build" in BACKEND.unsupported(problem("gfx942"))


def test_launch_refuses_without_a_rocm_runtime_before_touching_flydsl(monkeypatch):
    if getattr(torch.version, "hip", None) and torch.cuda.is_available():
        pytest.skip("this machine has a ROCm runtime")
    monkeypatch.delitem(sys.modules, "paged_mqa_logits.backends.flydsl.kernel", raising=False)
    inp = build(random_case(3, heads=(64,)))
    args = build_launch_args(*positional(inp))
    args = dataclasses.replace(args, problem=dataclasses.replace(args.problem, arch="gfx950", device_type="cuda"))
    with pytest.raises(RuntimeError, match="flydsl backend cannot launch"):
        BACKEND.launch(args, {})
    assert "paged_mqa_logits.backends.flydsl.kernel" not in sys.modules


def test_dispatch_never_picks_flydsl_where_it_cannot_run():
    from paged_mqa_logits import dispatch

    if getattr(torch.version, "hip", None) and torch.cuda.is_available():
        pytest.skip("this machine has a ROCm runtime")
    choice = dispatch.choose(problem("gfx950", batch=64, next_n=4))
    assert choice.backend != "flydsl"


# ============================================================================ knobs
@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_knob_space(arch):
    assert BACKEND.knobs == ("ChunkK", "WavePerEU", "SplitKV")
    for heads in (32, 64):
        for next_n in range(1, 9):
            p = problem(arch, heads=heads, next_n=next_n, hypothetical=True)
            candidates = BACKEND.candidates(p)
            assert candidates and BACKEND.default_config(p) in candidates
            for config in candidates:
                plan = BACKEND.plan(p, config)
                assert plan.config_error() is None and config["SplitKV"] == 0
                assert plan.lds_bytes * plan.wave_per_eu <= LDS_PER_CU[arch]
            assert {c["ChunkK"] for c in candidates} == set(CHUNK_KS)
    # gfx942's 64 KiB of LDS: a 2 x 16 KiB double buffer allows two workgroups per CU, not three
    assert KernelPlan("gfx942", 32, 1, 64, True, True, 128, 3).config_error().startswith("ChunkK=128 needs 32768 B")
    assert KernelPlan("gfx950", 32, 1, 64, True, True, 128, 4).config_error() is None
    assert BACKEND.candidates(problem("sm_90", fp8="fn", hypothetical=True)) == []


def test_split_count_follows_the_knobs():
    p = problem("gfx950", batch=4, context=32768)
    plan = BACKEND.plan(p, {"ChunkK": 64, "WavePerEU": 3})
    assert BACKEND.split_count(p, plan, {"SplitKV": 7}) == 7
    assert BACKEND.split_count(p, plan, {"SplitKV": 0}) == derive_split_kv(256, 4, 32768, 64, ctas_per_cu=3)
    short = dataclasses.replace(p, context=100)  # never more splits than chunks
    assert BACKEND.split_count(short, plan, {}) == 2


def test_work_split_covers_every_row_and_tile():
    for next_n in range(1, 9):
        for chunk_k in CHUNK_KS:
            plan = KernelPlan("gfx950", 64, next_n, 64, True, True, chunk_k, 1)
            rows = {rg + plan.row_groups * r for rg in range(plan.row_groups) for r in range(plan.rows_per_wave)}
            assert {j for j in rows if j < next_n} == set(range(next_n))
            assert plan.row_groups * plan.token_groups == 4
            assert plan.tiles_per_wave * plan.token_groups == plan.tiles_per_stage
            assert plan.reduce_group * plan.reduce_groups == plan.tiles_per_wave


# ============================================================================ the kernel, emulated
def _emulated(case, arch, config, splits=None):
    inp = build(case, fp8_dtype=FP8[arch])
    args = build_launch_args(*positional(inp))
    p = dataclasses.replace(args.problem, arch=arch, cu_num=8, device_type="cuda")
    args = dataclasses.replace(args, problem=p)
    plan = BACKEND.plan(p, config)
    before = inp["out_logits"].clone()
    emulate(plan, args, splits or BACKEND.split_count(p, plan, config))
    return inp, check_logits(inp["out_logits"], before, reference_for(inp))


@pytest.mark.parametrize("seed", range(24))
def test_emulated_kernel_matches_reference(seed):
    arch = ("gfx942", "gfx950")[seed % 2]
    case = random_case(700 + seed, heads=(32, 64), block_sizes=(16, 32, 64, 128, 256), max_context=400)
    config = {"ChunkK": CHUNK_KS[seed // 2 % 2], "WavePerEU": 1}
    inp, check = _emulated(case, arch, config, splits=(None, 1, 3)[seed % 3])
    assert check.ok, f"{arch} {case} {config}: {check.describe()}"


def test_emulated_1d_and_2d_lengths_are_bit_identical():
    case = dict(batch=3, next_n=3, heads=32, context_lens=[90, 41, 3], kv_block_size=32, preshuffle=False,
                max_model_len=100, table_row_pad=2, seed=5)
    outs = []
    for lens_2d in (False, True):
        inp, check = _emulated(dict(case, lens_2d=lens_2d), "gfx950", {"ChunkK": 64})
        assert check.ok, check.describe()
        outs.append(inp["out_logits"])
    assert torch.equal(outs[0].view(torch.int32), outs[1].view(torch.int32))


def test_emulator_faults_on_a_wild_access():
    """The emulator is strict: a kernel reading past its tensors fails loudly, not silently."""
    from paged_mqa_logits.backends.flydsl.emulate import EmulatedOps, _Memory

    memory = _Memory()
    base = memory.tensor_address(torch.zeros(16, dtype=torch.uint8))
    ops = EmulatedOps(KernelPlan("gfx950", 32, 1, 64, True, True, 64, 1), memory, 0, 0)
    with pytest.raises(EmulationFault):
        ops.global_load_f32(ops.add(ops.base_address(base), 64))


# ============================================================================ on a ROCm GPU
def _rocm_arch():
    if not (getattr(torch.version, "hip", None) and torch.cuda.is_available()):
        return None
    return torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(12))
def test_gpu_kernel_matches_reference(seed):
    arch = _rocm_arch()
    if arch not in ("gfx942", "gfx950"):
        pytest.skip(f"needs a ROCm gfx942/gfx950 GPU (this machine: {arch or 'no ROCm GPU'})")
    if not flydsl_backend.flydsl_installed():
        pytest.skip(NOT_INSTALLED)
    from paged_mqa_logits import paged_mqa_logits
    from op_cases import run_and_check

    case = random_case(900 + seed, heads=(32, 64), block_sizes=(16, 32, 64, 128, 256), max_context=3000)
    config = {"ChunkK": CHUNK_KS[seed % 2], "WavePerEU": 1 + seed % 2, "SplitKV": (0, 1, 5)[seed % 3]}
    check = run_and_check(paged_mqa_logits, build(case, device="cuda", fp8_dtype=FP8[arch]), backend="flydsl",
                          config=config)
    assert check.ok, f"{case} {config}: {check.describe()}"
