"""The ``flydsl`` backend (gfx942 / gfx950).

On a CPU machine: the package imports with and without flydsl and never imports it eagerly,
the backend refuses with the right reason (a problem: arch, fp8 flavour, shapes; a target:
missing package, no ROCm runtime), the launch path refuses before touching flydsl, the knob space is
consistent, and -- through the instruction-level emulator (``emulate.py``), which runs the
kernel's own code on NumPy lanes -- the kernel matches the reference over a random matrix and
on widely ragged batches under both schedules; the balanced schedule's stores cover every logit
exactly once in the segments ``paged_mqa_logits.schedule`` prescribes, it follows lengths
changed in place, and no MFMA runs on a padding row.
On a ROCm gfx942/gfx950 GPU: the real kernel against the reference (skipped elsewhere).
"""

import dataclasses
import os
import random
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

from op_cases import build, positional, random_case, reference_for
from paged_mqa_logits.backends.flydsl import backend as flydsl_backend
from paged_mqa_logits.backends.flydsl.backend import BACKEND, NOT_INSTALLED
from paged_mqa_logits.backends.flydsl.emulate import EmulationFault, emulate
from paged_mqa_logits.backends.flydsl.plan import CHUNK_KS, LDS_PER_CU, MFMA_KINDS, WAVE_ROLES, KernelPlan
from paged_mqa_logits.backends import why_not
from paged_mqa_logits.problem import Problem, ShapeKey, Target
from paged_mqa_logits.schedule import derive_split_kv
from paged_mqa_logits import schedule
from paged_mqa_logits.reference import check_logits, row_lengths
from paged_mqa_logits.validate import build_launch_args

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FP8 = {"gfx942": torch.float8_e4m3fnuz, "gfx950": torch.float8_e4m3fn}


def problem(arch="gfx950", *, heads=64, next_n=2, kv_block_size=64, fp8=None, head_dim=128, batch=8, context=4096):
    fp8 = fp8 or {"gfx942": "fnuz"}.get(arch, "fn")
    key = ShapeKey(heads=heads, head_dim=head_dim, kv_block_size=kv_block_size, preshuffle=True, batch=batch,
                   next_n=next_n)
    return Problem(arch, 256, key, context, True, fp8, 8192)


def target(arch="gfx950", device_type="cuda"):
    return Target(arch, 256, device_type)


def _python(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                            env=dict(os.environ, PYTHONPATH=REPO))
    assert result.returncode == 0, result.stderr
    return result.stdout


# ============================================================================ import safety
def test_importing_the_package_never_imports_flydsl():
    out = _python("import sys, paged_mqa_logits, paged_mqa_logits.backends.flydsl as m\n"
                  "from paged_mqa_logits.backends import get\n"
                  "assert get('flydsl') is m.BACKEND\n"
                  "print(sorted(n for n in sys.modules if n == 'flydsl' or n.startswith('flydsl.')))")
    assert out.strip() == "[]"


def test_without_flydsl_the_package_imports_and_the_backend_says_why():
    out = _python("import sys\n"
                  "sys.modules['flydsl'] = None  # import flydsl now fails, as if not installed\n"
                  "import paged_mqa_logits\n"
                  "from paged_mqa_logits.backends import why_not\n"
                  "from paged_mqa_logits.problem import Problem, ShapeKey\n"
                  "key = ShapeKey(heads=64, head_dim=128, kv_block_size=64, preshuffle=True, batch=8, next_n=2)\n"
                  "p = Problem('gfx950', 256, key, None, True, 'fn', 8192)\n"
                  "print(why_not('flydsl', p))")
    assert out.strip() == NOT_INSTALLED


def test_missing_flydsl_reason_in_process(monkeypatch):
    monkeypatch.setitem(sys.modules, "flydsl", None)
    assert not flydsl_backend.flydsl_installed()
    assert BACKEND.unsupported(problem()) is None and BACKEND.unavailable(target()) == NOT_INSTALLED
    assert why_not("flydsl", problem()) == NOT_INSTALLED  # the problem's chip, present
    assert why_not("flydsl", problem(), Target.described("gfx950", 256)) is None  # explain / --only-table


# ============================================================================ reasons
def test_reasons_on_this_machine():
    if getattr(torch.version, "hip", None) and torch.cuda.is_available():
        pytest.skip("this machine has a ROCm runtime; the refusal path is for machines without one")
    if not flydsl_backend.flydsl_installed():
        pytest.skip("flydsl is not installed: the missing-package reason comes first (tested above)")
    reason = BACKEND.unavailable(target())
    assert reason is not None and reason.startswith("no ROCm runtime"), reason
    assert BACKEND.unavailable(target(device_type="cpu")) == "no ROCm runtime: the tensors are on cpu"


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
    # judged on arch and shape only, whatever this machine has
    assert expected in BACKEND.unsupported(problem(**kwargs))


def test_fp4_is_served_natively_on_gfx950_and_widened_where_it_fits():
    fp4 = {arch: dataclasses.replace(problem(arch),
                                     shape_key=dataclasses.replace(problem(arch).shape_key, kv_format="fp4"))
           for arch in ("gfx942", "gfx950")}
    assert BACKEND.unsupported(fp4["gfx950"]) is None and BACKEND.unsupported(fp4["gfx942"]) is None
    # an MXFP4 call is judged without an fp8 flavour (its problem carries the chip's)
    assert BACKEND.unsupported(dataclasses.replace(fp4["gfx950"], fp8="fnuz")) is None
    assert {c["Mfma"] for c in BACKEND.candidates(fp4["gfx950"])} == {"f8f6f4", "fp8"}
    assert {c["Mfma"] for c in BACKEND.candidates(fp4["gfx942"])} == {"fp8"}
    assert BACKEND.default_config(fp4["gfx950"])["Mfma"] == "f8f6f4"
    assert BACKEND.default_config(fp4["gfx942"])["Mfma"] == "fp8"
    plan = BACKEND.plan(fp4["gfx950"], {})
    assert plan.name.endswith("_fp4") and plan.stage_bytes == 64 * 64 and plan.tile_bytes == 1024
    # widened, the widest shapes need more registers than a SIMD has: declined, so dispatch falls through
    wide = dataclasses.replace(fp4["gfx942"], shape_key=dataclasses.replace(fp4["gfx942"].shape_key, next_n=8))
    assert BACKEND.unsupported(wide).startswith("no gfx942 kernel configuration fits: heads=64, next_n=8")
    assert BACKEND.unsupported(dataclasses.replace(wide, arch="gfx950")) is None  # the scaled MFMA fits
    assert BACKEND.plan(problem(), {}).stage_bytes == 64 * 128


def _fake_rocm(monkeypatch, arch_name):
    monkeypatch.setattr(torch.version, "hip", "6.4.0", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(gcnArchName=arch_name))
    monkeypatch.setattr(flydsl_backend, "flydsl_installed", lambda: True)


def test_rocm_runtime_of_the_right_arch_is_required(monkeypatch):
    _fake_rocm(monkeypatch, "gfx942:sramecc+:xnack-")
    assert BACKEND.unavailable(target("gfx942")) is None and why_not("flydsl", problem("gfx942")) is None
    # an arch override (PAGED_MQA_LOGITS_ARCH) must never make a gfx942 run a gfx950 kernel
    assert BACKEND.unavailable(target("gfx950")) == "the ROCm device is gfx942, not gfx950"
    assert why_not("flydsl", problem("gfx950")) == "the ROCm device is gfx942, not gfx950"
    monkeypatch.setattr(torch.version, "hip", None)
    assert "not a ROCm build" in BACKEND.unavailable(target("gfx942"))


def test_launch_refuses_without_a_rocm_runtime_before_touching_flydsl(monkeypatch):
    if getattr(torch.version, "hip", None) and torch.cuda.is_available():
        pytest.skip("this machine has a ROCm runtime")
    monkeypatch.delitem(sys.modules, "paged_mqa_logits.backends.flydsl.kernel", raising=False)
    inp = build(random_case(3, heads=(64,)))
    args = build_launch_args(*positional(inp))
    args = dataclasses.replace(args, problem=dataclasses.replace(args.problem, arch="gfx950"))
    assert BACKEND.unsupported(args.problem) is None  # refused for where the tensors are
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
    assert BACKEND.knobs == ("ChunkK", "WavePerEU", "SplitKV", "Schedule", "Mfma", "WaveRoles")
    for heads in (32, 64):
        for next_n in range(1, 9):
            p = problem(arch, heads=heads, next_n=next_n)
            candidates = BACKEND.candidates(p)
            default = BACKEND.default_config(p)
            assert candidates and default in candidates
            assert default["Schedule"] == "balanced" and default["Mfma"] == MFMA_KINDS[arch][0]
            assert default["WaveRoles"] == "uniform"
            for config in candidates:
                plan = BACKEND.plan(p, config)
                assert plan.config_error() is None and config["SplitKV"] == 0
                assert plan.lds_bytes * plan.workgroups_per_cu <= LDS_PER_CU[arch]
            uniform = [c for c in candidates if c["WaveRoles"] == "uniform"]
            assert {c["ChunkK"] for c in uniform} == set(CHUNK_KS)
            # the tuner sees both schedules and, on gfx950, both MFMAs for every (ChunkK, WavePerEU)
            shapes = {(c["ChunkK"], c["WavePerEU"]) for c in uniform}
            assert len(uniform) == len(shapes) * len(schedule.SCHEDULES) * len(MFMA_KINDS[arch])
            # and the split roles wherever two waves per SIMD fit (even WavePerEU; half the
            # workgroups per CU, so never less LDS room than the uniform kernel's)
            split = {tuple(sorted({**c, "WaveRoles": "uniform"}.items())) for c in candidates if c["WaveRoles"] == "split"}
            assert split and all(dict(c)["WavePerEU"] % 2 == 0 for c in split)
            def roles_spill(c):  # two 64-head row slots and two tile groups per stage
                plan = BACKEND.plan(p, c)
                return plan.rows_per_wave * heads >= 128 and plan.reduce_groups > 1

            assert {tuple(sorted(c.items())) for c in uniform if c["WavePerEU"] % 2 == 0
                    and not roles_spill(c)} <= split
            assert not any(roles_spill(dict(c)) for c in split)
    # gfx942's 64 KiB of LDS: a 2 x 16 KiB double buffer allows two workgroups per CU, not three
    assert KernelPlan("gfx942", 32, 1, 64, True, True, 128, 3).config_error().startswith("ChunkK=128 needs 32768 B")
    assert KernelPlan("gfx950", 32, 1, 64, True, True, 128, 4).config_error() is None
    assert BACKEND.candidates(problem("sm_90", fp8="fn")) == []
    assert "Mfma must be one of ('fp8',) on gfx942" in KernelPlan("gfx942", 32, 1, 64, True, True, 64, 1,
                                                                  mfma="f8f6f4").config_error()
    assert "Schedule must be one of" in KernelPlan("gfx950", 32, 1, 64, True, True, 64, 1, "greedy").config_error()
    assert "WavePerEU=3 is not a multiple" in KernelPlan("gfx950", 32, 1, 64, True, True, 64, 3,
                                                         wave_roles="split").config_error()
    assert "WaveRoles must be one of" in KernelPlan("gfx950", 32, 1, 64, True, True, 64, 2,
                                                    wave_roles="half").config_error()
    # gfx942 ChunkK 128 at 4 waves per SIMD: two 32 KiB workgroups with split roles, four without
    assert KernelPlan("gfx942", 32, 1, 64, True, True, 128, 4, wave_roles="split").config_error() is None


def test_grid_follows_the_knobs():
    p = problem("gfx950", batch=4, context=32768)
    split = BACKEND.plan(p, {"ChunkK": 64, "WavePerEU": 3, "Schedule": "split"})
    assert BACKEND.grid_x(p, split, {"SplitKV": 7}) == 7
    assert BACKEND.grid_x(p, split, {"SplitKV": 0}) == derive_split_kv(256, 4, 32768, 64, ctas_per_cu=3)
    short = dataclasses.replace(p, context=100)  # never more splits than chunks
    assert BACKEND.grid_x(short, split, {}) == 2
    # balanced: one resident wave of workgroups, whatever the batch and lengths
    balanced = BACKEND.plan(p, {"ChunkK": 64, "WavePerEU": 3})
    assert balanced.schedule == "balanced"
    assert BACKEND.grid_x(p, balanced, {}) == BACKEND.grid_x(short, balanced, {"SplitKV": 7}) == 256 * 3
    # split wave roles: two waves of a workgroup per SIMD, so half the workgroups per CU
    roles = BACKEND.plan(p, {"ChunkK": 64, "WavePerEU": 4, "WaveRoles": "split"})
    assert (roles.threads, roles.workgroups_per_cu, BACKEND.grid_x(p, roles, {})) == (512, 2, 256 * 2)
    split_roles = BACKEND.plan(p, {"ChunkK": 64, "WavePerEU": 2, "Schedule": "split", "WaveRoles": "split"})
    assert BACKEND.grid_x(p, split_roles, {}) == derive_split_kv(256, 4, 32768, 64, ctas_per_cu=1)


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
def _launch_args(inp, arch, cu_num=8):
    args = build_launch_args(*positional(inp), q_scale=inp["q_scale"])
    return dataclasses.replace(args, problem=dataclasses.replace(args.problem, arch=arch, cu_num=cu_num))


def _emulated(case, arch, config, grid_x=None, cu_num=8, trace_stores=False):
    """Build ``case`` (its ``kv_format`` / ``logits_dtype`` too), emulate ``config``'s kernel on
    it and check the output against the reference."""
    inp = build(case, fp8_dtype=FP8[arch])
    args = _launch_args(inp, arch, cu_num)
    plan = BACKEND.plan(args.problem, config)
    before = inp["out_logits"].clone()
    stats = emulate(plan, args, grid_x or BACKEND.grid_x(args.problem, plan, config), trace_stores=trace_stores)
    return inp, check_logits(inp["out_logits"], before, reference_for(inp)), plan, stats


@pytest.mark.parametrize("seed", range(24))
def test_emulated_kernel_matches_reference(seed):
    arch = ("gfx942", "gfx950")[seed % 2]
    case = random_case(700 + seed, heads=(32, 64), kv_block_sizes=(16, 32, 64, 128, 256), max_context=400)
    roles = WAVE_ROLES[seed // 3 % 2]
    config = {"ChunkK": CHUNK_KS[seed // 2 % 2], "WavePerEU": 2 if roles == "split" else 1,
              "Schedule": schedule.SCHEDULES[seed // 4 % 2], "Mfma": MFMA_KINDS[arch][seed // 8 % len(MFMA_KINDS[arch])],
              "WaveRoles": roles}
    # split: the derived split count, one split, three; balanced: 8 CUs x 1, a single program, 3 programs
    inp, check, _, _ = _emulated(case, arch, config, grid_x=(None, 1, 3)[seed % 3])
    assert check.ok, f"{arch} {case} {config}: {check.describe()}"


@pytest.mark.parametrize("seed", range(10))
def test_emulated_widened_fp4_kernel_matches_reference(seed):
    """MXFP4 widened to the chip's fp8 for the plain MFMA (gfx942, and gfx950 with Mfma=fp8), the
    exponents folded into each group's fp32 sums, against the exact fp4 reference; over the
    random matrix restricted to the shapes it serves."""
    arch = ("gfx942", "gfx950")[seed % 2]
    case = dict(random_case(850 + seed, heads=(32, 64), kv_block_sizes=(16, 32, 64, 128, 256), max_context=400),
                kv_format="fp4")
    roles = WAVE_ROLES[seed // 4 % 2]  # split roles: WavePerEU 2, half the registers
    case["next_n"] = min(case["next_n"], (4 if case["heads"] == 32 else 2) // (2 if roles == "split" else 1))
    config = {"ChunkK": 64, "WavePerEU": 2 if roles == "split" else 1, "Schedule": schedule.SCHEDULES[seed // 2 % 2],
              "Mfma": "fp8", "WaveRoles": roles}
    inp, check, plan, stats = _emulated(case, arch, config, grid_x=(None, 1, 3)[seed % 3])
    assert plan.config_error() is None, plan.config_error()
    assert check.ok, f"{case} {config}: {check.describe()}"
    assert set(stats.mfma) <= {"v_mfma_f32_16x16x32_fp8_fp8"}


def test_widening_maps_every_e2m1_code_to_the_chips_fp8():
    """The widening (a v_perm_b32 byte table, the sign moved to bit 7 except on zero) turns each
    of the 16 codes, in either nibble of any byte, into the fp8 byte of the same value (e2m1's
    -0 to +0: 0x80 is NaN in e4m3fnuz); the even codes land in the low word."""
    from paged_mqa_logits.backends.flydsl.algorithm import KernelBody
    from paged_mqa_logits.backends.flydsl.emulate import EmulatedOps, _Memory
    from paged_mqa_logits.fp4 import e2m1_values, pack_e2m1

    for arch in ("gfx942", "gfx950"):
        plan = KernelPlan(arch, 32, 1, 64, True, True, 64, 1, mfma="fp8", kv_format="fp4")
        ops = EmulatedOps(plan, _Memory(), 0, 0)
        body = KernelBody(plan, ops, {})
        codes = torch.randint(0, 16, (4, 64, 8), generator=torch.Generator().manual_seed(3), dtype=torch.uint8)
        codes[0, 0] = torch.arange(8, dtype=torch.uint8)
        codes[0, 1] = torch.arange(8, 16, dtype=torch.uint8)
        words = pack_e2m1(codes).contiguous().view(torch.int32)[..., 0].numpy()
        widened = body._widen_e2m1(words)  # [wave, lane, 8] bytes
        expected = e2m1_values(torch.cat((codes[..., 0::2], codes[..., 1::2]), dim=-1))
        assert torch.equal(torch.from_numpy(np.ascontiguousarray(widened)).view(FP8[arch]).float(), expected), arch
        assert not (widened == 0x80).any()  # zero is 0x00 on both chips


@pytest.mark.parametrize("seed", range(10))
def test_emulated_fp4_kernel_matches_reference(seed):
    """MXFP4 queries and keys on gfx950's scaled MFMA (e2m1 operands, the exponents as its e8m0
    block scales) against the exact fp4 reference, over the random matrix (block sizes, both
    cache layouts, padded block strides, 1-D/2-D lengths, next_n 1..8) and every knob."""
    case = dict(random_case(800 + seed, heads=(32, 64), kv_block_sizes=(16, 32, 64, 128, 256), max_context=400),
                kv_format="fp4")
    roles = WAVE_ROLES[seed // 3 % 2]
    config = {"ChunkK": CHUNK_KS[seed % 2], "WavePerEU": 2 if roles == "split" else 1,
              "Schedule": schedule.SCHEDULES[seed // 2 % 2], "WaveRoles": roles}
    inp, check, plan, stats = _emulated(case, "gfx950", config, grid_x=(None, 1, 3)[seed % 3])
    assert inp["q_scale"] is not None and plan.kv_format == "fp4" and plan.mfma == "f8f6f4"
    assert check.ok, f"{case} {config}: {check.describe()}"
    assert set(stats.mfma) <= {"v_mfma_scale_f32_16x16x128_f8f6f4"}


@pytest.mark.parametrize("arch, mfma", [("gfx950", "f8f6f4"), ("gfx942", "fp8")])
def test_emulated_fp4_kernel_uses_every_exponent(arch, mfma):
    """Exponents far from 127 in q and k (each group its own): a kernel that dropped, swapped or
    misplaced one group's exponent (q's or k's) would be off by powers of two, not rounding."""
    case = _ragged_case(12, 4, 2, True, max_context=150, heads=64, kv_block_size=32)
    inp = build(dict(case, kv_format="fp4"))
    gen = torch.Generator().manual_seed(1)
    q_scale = inp["q_scale"]
    q_scale.copy_(torch.randint(117, 138, (*q_scale.shape, 4), generator=gen, dtype=torch.uint8).view(torch.int32)[..., 0])
    cache = inp["kv_cache"]
    blocks, kv_block_size, stride = cache.shape[0], cache.shape[1], cache.stride(0)
    words = cache.as_strided((blocks, kv_block_size * 4), (stride, 1), cache.storage_offset() + kv_block_size * 64)
    words.copy_(torch.randint(117, 138, words.shape, generator=gen, dtype=torch.uint8))
    args = _launch_args(inp, arch)
    plan = BACKEND.plan(args.problem, {"ChunkK": 64, "WavePerEU": 1, "Mfma": mfma})
    assert plan.config_error() is None
    before = inp["out_logits"].clone()
    emulate(plan, args, BACKEND.grid_x(args.problem, plan, {}))
    check = check_logits(inp["out_logits"], before, reference_for(inp))
    assert check.ok, check.describe()


@pytest.mark.parametrize("arch, kv_format, config", [
    ("gfx942", "fp8", {"ChunkK": 64}), ("gfx950", "fp8", {"ChunkK": 128, "Mfma": "fp8", "Schedule": "split"}),
    ("gfx950", "fp8", {"ChunkK": 64, "WavePerEU": 2, "WaveRoles": "split"}),
    ("gfx950", "fp4", {"ChunkK": 128}), ("gfx950", "fp4", {"ChunkK": 64, "Schedule": "split"}),
    ("gfx942", "fp4", {"ChunkK": 64, "WavePerEU": 1}),
])
def test_emulated_bf16_logits_are_the_fp32_logits_rounded_once(arch, kv_format, config):
    """bf16 logits: the same kernel's fp32 result rounded to nearest even at the store (bit for
    bit), every visible position written exactly once and nothing else (2-byte stores bounded
    by the row), and the reference's bf16 logits matched."""
    case = dict(_ragged_case(21, 6, 3, True, max_context=300, heads=64, kv_block_size=32), kv_format=kv_format)
    outs = {}
    for logits_dtype in (torch.float32, torch.bfloat16):
        inp, check, plan, stats = _emulated(dict(case, logits_dtype=logits_dtype), arch, config, trace_stores=True)
        assert check.ok, f"{logits_dtype}: {check.describe()}"
        assert plan.logits_dtype == {torch.float32: "fp32", torch.bfloat16: "bf16"}[logits_dtype]
        out = inp["out_logits"]
        counts = torch.zeros(out.shape[0], out.stride(0), dtype=torch.int32)
        for elements in stats.stores.values():
            np.add.at(counts.numpy(), np.divmod(elements, out.stride(0)), 1)
        visible = _visible_rows(inp, plan)
        assert torch.equal(counts, (torch.arange(out.stride(0))[None, :] < visible[:, None]).int())
        outs[logits_dtype] = (out, visible)
    (fp32, visible), (bf16, _) = outs[torch.float32], outs[torch.bfloat16]
    mask = torch.arange(fp32.shape[1])[None, :] < visible[:, None]
    assert mask.any()
    assert torch.equal(bf16[mask].view(torch.int16), fp32[mask].to(torch.bfloat16).view(torch.int16))


def _ragged_case(seed, batch, next_n, lens_2d, max_context, heads=32, kv_block_size=32, empty=0.3):
    """Contexts spread over [1, max_context] with zero-length sequences (a fraction ``empty``)
    between long ones."""
    rng = random.Random(seed)
    lens = [0 if rng.random() < empty else rng.randint(1, max_context) for _ in range(batch)]
    lens[rng.randrange(batch)] = max_context  # at least one sequence at the maximum
    return dict(batch=batch, next_n=next_n, heads=heads, context_lens=lens, kv_block_size=kv_block_size,
                preshuffle=seed % 2 == 0, lens_2d=lens_2d, max_model_len=max_context + 7,
                table_row_pad=seed % 3, out_row_pad=seed % 2, seed=seed)


def _visible_ends(inp, plan):
    """``visible_end`` of every sequence as the schedule model defines it."""
    lens = inp["context_lens"]
    seq_len = lens.clamp(min=0) if lens.dim() == 1 else lens.amax(dim=1).clamp(min=0)
    width = inp["kv_indices"].shape[1] * plan.kv_block_size
    return [min(int(n), inp["max_model_len"], width) for n in seq_len]


def _visible_rows(inp, plan):
    """Visible length of every row of the output (its padding rows: 0), reference semantics."""
    visible = row_lengths(inp["context_lens"], plan.next_n).reshape(-1)
    visible = visible.clamp(max=min(inp["max_model_len"], inp["kv_indices"].shape[1] * plan.kv_block_size))
    padded = torch.zeros(inp["out_logits"].shape[0], dtype=torch.int64)
    padded[:visible.numel()] = visible
    return padded


@pytest.mark.parametrize("arch, next_n, lens_2d, chunk_k", [
    ("gfx950", 1, False, 64), ("gfx942", 2, True, 128), ("gfx950", 3, True, 64), ("gfx942", 5, False, 128),
    ("gfx950", 8, False, 128),
])
def test_balanced_schedule_covers_every_logit_once_in_the_model_segments(arch, next_n, lens_2d, chunk_k):
    """Instrumented stores: every (row, position) a row may see is written exactly once, nothing
    else is, and the tiles each workgroup stores are exactly ``schedule.program_segments``."""
    case = _ragged_case(11 * next_n + chunk_k, 64, next_n, lens_2d, max_context=400)
    config = {"ChunkK": chunk_k, "WavePerEU": 1, "Mfma": MFMA_KINDS[arch][0]}
    inp, check, plan, stats = _emulated(case, arch, config, cu_num=5, trace_stores=True)
    assert check.ok, check.describe()
    out = inp["out_logits"]
    row_stride = out.stride(0)
    counts = torch.zeros(out.shape[0], row_stride, dtype=torch.int32)
    stages = schedule.tile_counts(_visible_ends(inp, plan), chunk_k)
    num_programs = BACKEND.grid_x(_launch_args(inp, arch, 5).problem, plan, config)
    assert len(stats.stores) == num_programs == 5
    for (program, y), elements in stats.stores.items():
        assert y == 0
        rows, positions = np.divmod(elements, row_stride)
        np.add.at(counts.numpy(), (rows, positions), 1)
        walked = {}
        for row, position in zip(rows // next_n, positions // chunk_k):
            walked.setdefault(int(row), set()).add(int(position))
        expected = schedule.program_segments(stages, program, num_programs)
        assert [(s.seq, s.first_tile, s.stop_tile) for s in expected] == [
            (seq, min(tiles), max(tiles) + 1) for seq, tiles in sorted(walked.items())]
        assert all(len(tiles) == max(tiles) - min(tiles) + 1 for tiles in walked.values())
    visible = _visible_rows(inp, plan)
    expected_counts = (torch.arange(row_stride)[None, :] < visible[:, None]).int()
    assert torch.equal(counts, expected_counts)


def test_balanced_schedule_on_a_batch_of_1024():
    """1024 sequences (16 per lane in the kernel's length scan, 4 rounds), 90% of them empty."""
    case = _ragged_case(3, 1024, 2, True, max_context=200, heads=32, kv_block_size=32, empty=0.9)
    inp, check, plan, _ = _emulated(case, "gfx950", {"ChunkK": 64, "WavePerEU": 2}, cu_num=3)
    assert check.ok, check.describe()


def test_split_schedule_walks_the_model_split_segments():
    case = _ragged_case(5, 6, 4, False, max_context=500)
    config = {"ChunkK": 64, "WavePerEU": 1, "Schedule": "split"}
    inp, check, plan, stats = _emulated(case, "gfx942", config, grid_x=3, trace_stores=True)
    assert check.ok, check.describe()
    stages = schedule.tile_counts(_visible_ends(inp, plan), 64)
    row_stride = inp["out_logits"].stride(0)
    for (split, seq), elements in stats.stores.items():
        tiles = sorted({int(t) for t in (elements % row_stride) // 64})
        assert all(int(r) // 4 == seq for r in elements // row_stride)
        expected = schedule.split_segments(stages, seq, split, 3)
        assert [(s.first_tile, s.stop_tile) for s in expected] == ([(tiles[0], tiles[-1] + 1)] if tiles else [])


def test_balanced_schedule_follows_lengths_changed_in_place():
    """Graph replay: the same launch (grid, arguments) after the lengths tensor is rewritten."""
    case = dict(_ragged_case(8, 12, 2, False, max_context=300), context_lens=[300] * 12)  # blocks for 300 each
    inp = build(case, fp8_dtype=FP8["gfx950"])
    args = _launch_args(inp, "gfx950")
    plan = BACKEND.plan(args.problem, {"ChunkK": 64, "WavePerEU": 1})
    grid_x = BACKEND.grid_x(args.problem, plan, {})
    for lens in ([300, 0, 0, 17, 250, 1, 0, 300, 64, 65, 2, 9], [0] * 11 + [300], [5] * 12):
        inp["context_lens"].copy_(torch.tensor(lens, dtype=torch.int32))
        inp["out_logits"].fill_(float("nan"))
        before = inp["out_logits"].clone()
        emulate(plan, args, grid_x)
        check = check_logits(inp["out_logits"], before, reference_for(inp))
        assert check.ok, f"{lens}: {check.describe()}"


@pytest.mark.parametrize("schedule_name", schedule.SCHEDULES)
@pytest.mark.parametrize("width", [0, 1, 3])
def test_table_loads_stay_inside_the_row(schedule_name, width):
    """A block table narrower than the lengths (positions past ``width`` blocks are invisible)
    and a zero-width one: the emulator faults on any ``s_buffer_load`` past its descriptor, so
    passing means the kernel issues no table (or lengths) load outside the row, including for
    the stages past the end it prepares but never copies."""
    case = dict(_ragged_case(6, 5, 3, True, max_context=300, heads=32, kv_block_size=32, empty=0.2),
                table_row_pad=0)
    inp = build(case, fp8_dtype=FP8["gfx942"])
    inp["kv_indices"] = inp["kv_indices"][:, :width]
    args = _launch_args(inp, "gfx942")
    config = {"ChunkK": 64, "WavePerEU": 1, "Schedule": schedule_name}
    plan = BACKEND.plan(args.problem, config)
    before = inp["out_logits"].clone()
    emulate(plan, args, BACKEND.grid_x(args.problem, plan, config))
    check = check_logits(inp["out_logits"], before, reference_for(inp))
    assert check.ok, check.describe()


@pytest.mark.parametrize("arch, next_n, mfma, roles", [("gfx950", 3, "f8f6f4", "uniform"), ("gfx942", 5, "fp8", "uniform"),
                                                       ("gfx950", 7, "fp8", "uniform"), ("gfx950", 8, "f8f6f4", "uniform"),
                                                       ("gfx942", 3, "fp8", "split"), ("gfx950", 6, "f8f6f4", "split")])
def test_no_mfma_runs_on_padding_rows(arch, next_n, mfma, roles):
    """MFMAs issued = stages x real rows x 16-token tiles x 16-head tiles x k-steps: next_n 3
    and 5..7, which leave some waves' last row slot empty, issue none for those slots; the
    scaled MFMA needs a quarter of the plain one's; split wave roles issue the same MFMAs."""
    case = _ragged_case(4, 5, next_n, True, max_context=200, heads=64)
    config = {"ChunkK": 64, "WavePerEU": 2 if roles == "split" else 1, "Mfma": mfma, "WaveRoles": roles}
    inp, check, plan, stats = _emulated(case, arch, config)
    assert check.ok, check.describe()
    stages = sum(schedule.tile_counts(_visible_ends(inp, plan), 64))
    per_stage = next_n * plan.tiles_per_stage * plan.m_tiles * plan.k_steps
    assert plan.k_steps == {"fp8": 4, "f8f6f4": 1}[mfma]
    mnemonic = {"fp8": "v_mfma_f32_16x16x32_fp8_fp8", "f8f6f4": "v_mfma_scale_f32_16x16x128_f8f6f4"}[mfma]
    assert dict(stats.mfma) == {mnemonic: stages * per_stage}
    # 3, 5, 7 have padding slots (some waves skip theirs); 8 has none (the count is the same rule)
    assert (plan.rows_per_wave * plan.row_groups > next_n) == (next_n != 8)


@pytest.mark.parametrize("arch, schedule_name, chunk_k", [("gfx942", "balanced", 64), ("gfx950", "split", 128),
                                                          ("gfx950", "balanced", 128)])
def test_split_wave_roles(arch, schedule_name, chunk_k):
    """``WaveRoles=split``: 8 waves; waves 4..7 issue every LDS copy and no MFMA, waves 0..3 every
    MFMA and no copy; the copies are those of the uniform kernel (same count per stage, split
    the same way among the 4 waves of the role), the MFMAs too, and the logits match the
    reference (for balanced: each written once, in the model's segments)."""
    case = _ragged_case(9, 7, 4, True, max_context=400, heads=64, kv_block_size=64)
    counts = {}
    for roles in WAVE_ROLES:
        config = {"ChunkK": chunk_k, "WavePerEU": 2, "Schedule": schedule_name, "WaveRoles": roles}
        # the same grid for both (split roles would derive half the workgroups per CU)
        inp, check, plan, stats = _emulated(case, arch, config, grid_x=5, trace_stores=True)
        assert check.ok, f"{roles}: {check.describe()}"
        counts[roles] = stats
        assert plan.waves == (8 if roles == "split" else 4)
    split, uniform = counts["split"], counts["uniform"]
    for kind in ("mfma", "lds_dma"):
        mine = range(4) if kind == "mfma" else range(4, 8)
        assert all(split.by_wave[kind, w] == 0 for w in range(8) if w not in mine), kind
        assert [split.by_wave[kind, w] for w in mine] == [uniform.by_wave[kind, w] for w in range(4)], kind
        assert sum(split.by_wave[kind, w] for w in mine) > 0
    assert split.mfma == uniform.mfma
    assert split.stores.keys() == uniform.stores.keys()
    for ids in split.stores:
        assert np.array_equal(np.sort(split.stores[ids]), np.sort(uniform.stores[ids]))


def test_emulated_scaled_mfma_applies_its_scales():
    """The emulator's scaled MFMA is a real model of the instruction: scale bytes 127 +- k scale
    the product by 2^(+-k), so a kernel passing wrong scales would fail the reference checks."""
    from paged_mqa_logits.backends.flydsl.emulate import EmulatedOps, _Memory

    ops = EmulatedOps(KernelPlan("gfx950", 32, 1, 64, True, True, 64, 1, mfma="f8f6f4"), _Memory(), 0, 0)
    one = torch.ones(1, dtype=torch.float8_e4m3fn).view(torch.uint8).item()
    parts = [np.full((4, 64, 8), one, np.uint8) for _ in range(4)]
    neutral = ops.mfma_scaled(parts, parts, ops.zero_acc(), 127, 127)
    assert np.all(neutral == 128)  # 128 dims of 1 x 1
    assert np.all(ops.mfma_scaled(parts, parts, ops.zero_acc(), 128, 125) == 64)
    assert dict(ops.stats.mfma) == {"v_mfma_scale_f32_16x16x128_f8f6f4": 8}


def test_emulated_scaled_mfma_on_fp4_operands():
    """The fp4 model of the scaled MFMA: 32 e2m1 codes per lane, low nibble first, lane quarter
    ``g`` holding K block ``g``, each lane's codes scaled by its own e8m0 byte (255: NaN)."""
    from paged_mqa_logits.backends.flydsl.emulate import EmulatedOps, _Memory
    from paged_mqa_logits.fp4 import pack_e2m1

    ops = EmulatedOps(KernelPlan("gfx950", 32, 1, 64, True, True, 64, 1, mfma="f8f6f4", kv_format="fp4"),
                      _Memory(), 0, 0)
    codes = torch.zeros(4, 64, 32, dtype=torch.uint8)
    codes[..., 0], codes[..., 31] = 2, 0xB  # 1.0 first and -1.5 last: the nibble order matters
    packed = pack_e2m1(codes).numpy()  # [wave, lane, 16]
    parts = [packed[..., :8], packed[..., 8:]]
    quarter = np.arange(64) // 16
    scale_a = np.broadcast_to(127 + quarter, (4, 64)).astype(np.int32)  # group g: 2^g
    ones = np.full((4, 64), 127 | 0x5500, np.int32)  # only byte 0 counts
    acc = ops.mfma_scaled(parts, parts, ops.zero_acc(), scale_a, ones, operand_format="fp4")
    assert np.all(acc == (1 + 1.5 ** 2) * (1 + 2 + 4 + 8))
    with np.errstate(invalid="ignore"):
        nan = ops.mfma_scaled(parts, parts, ops.zero_acc(), scale_a, np.full((4, 64), 255, np.int32),
                              operand_format="fp4")
    assert np.isnan(nan).all()


def test_emulator_faults_on_a_barrier_in_wave_divergent_code():
    from paged_mqa_logits.backends.flydsl.emulate import EmulatedOps, _Memory

    ops = EmulatedOps(KernelPlan("gfx950", 32, 3, 64, True, True, 64, 1), _Memory(), 0, 0)
    wave = ops.uniform(ops.shr(ops.thread_id(), 6))
    with pytest.raises(EmulationFault, match="barrier"):
        ops.if_then(ops.lt(wave, 2), ops.wait_vm_and_barrier)
    ops.if_then(ops.lt(wave, 4), ops.wait_vm_and_barrier)  # taken by every wave: fine


def test_emulated_1d_and_2d_lengths_are_bit_identical():
    case = dict(batch=3, next_n=3, heads=32, context_lens=[90, 41, 3], kv_block_size=32, preshuffle=False,
                max_model_len=100, table_row_pad=2, seed=5)
    outs = []
    for lens_2d in (False, True):
        inp, check, _, _ = _emulated(dict(case, lens_2d=lens_2d), "gfx950", {"ChunkK": 64})
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

    case = random_case(900 + seed, heads=(32, 64), kv_block_sizes=(16, 32, 64, 128, 256), max_context=3000)
    config = {"ChunkK": CHUNK_KS[seed % 2], "WavePerEU": 1 + seed % 2, "SplitKV": (0, 1, 5)[seed % 3]}
    check = run_and_check(paged_mqa_logits, build(case, device="cuda", fp8_dtype=FP8[arch]), backend="flydsl",
                          config=config)
    assert check.ok, f"{case} {config}: {check.describe()}"
