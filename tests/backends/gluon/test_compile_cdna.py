"""CPU CI for the gfx942 / gfx950 ``mfma`` variant (backends/gluon/cdna.py): every candidate of
a representative problem set is cross-compiled and must pass ``compile.check_records``; the ISA
parsing is checked on real compiler output; the real launch path (JIT binding, specialisation,
grid) runs against a stand-in driver.

Compile matrix (:func:`ci_matrix`; under Triton 3.6 gfx942 97 kernels, gfx950 220, about 55 s of
wall time on 2 cores from a cold Triton cache; later compilers need more VGPRs, so ``cdna.fits``
admits fewer WavePerEU 4 knob sets: ``_triton_compat.AMD_VGPR_MARGIN``): **every candidate** (ChunkK 64/128/256 x WavePerEU 1/2/4 x
per-row with Q in VGPRs / per-row with Q in LDS / shared-KV, x both MFMA kinds on gfx950, each
with Prefetch where it fits else without, as admitted by ``cdna.fits``) of five shapes chosen so
that every code-generating constexpr takes each of its values at least once:

=====  =====  =========  =========  =======  ===================================================
heads  next_n block      Preshuffle lengths  why
=====  =====  =========  =========  =======  ===================================================
64     1      64         yes        2-D      the DeepSeek decode case; no ReuseKV candidates
32     8      64         no         2-D      GLM heads, widest row loop (8 rows per program)
64     3      16         yes        1-D      odd next_n, 1-D lengths, 16-token tiles of blocks
32     2      1          no         2-D      one token per block: 132-byte blocks, 4-byte gathers
64     8      256        no         1-D      blocks larger than every ChunkK, 8 staged rows
=====  =====  =========  =========  =======  ===================================================

plus the 64-bit (``global_load``) cache path once per MFMA kind. Batch, context and CU count
change only host-side numbers (grid, SplitKV), never the kernel, so they are not varied.
"""

from __future__ import annotations

import dataclasses
import os
import re

import pytest
import torch

pytest.importorskip("triton.experimental.gluon")

from fake_gpu import compiled_kernels, fake_gpu  # noqa: E402
from paged_mqa_logits._triton_compat import GPUTarget  # noqa: E402
from paged_mqa_logits.backends.gluon import BACKEND, cdna, common  # noqa: E402
from paged_mqa_logits.compile import (  # noqa: E402
    amd_resources, check_records, compile_spec, compile_specs, max_waves_per_simd)
from paged_mqa_logits.op import build_launch_args  # noqa: E402
from paged_mqa_logits.reference import make_inputs  # noqa: E402

ARCHS = ("gfx942", "gfx950")
SHAPES = (
    dict(heads=64, next_n=1, kv_block_size=64, preshuffle=True, lens_2d=True),
    dict(heads=32, next_n=8, kv_block_size=64, preshuffle=False, lens_2d=True),
    dict(heads=64, next_n=3, kv_block_size=16, preshuffle=True, lens_2d=False),
    dict(heads=32, next_n=2, kv_block_size=1, preshuffle=False, lens_2d=True),
    dict(heads=64, next_n=8, kv_block_size=256, preshuffle=False, lens_2d=False),
)


def ci_matrix(arch: str) -> list[dict]:
    configs = []
    for shape in SHAPES:
        problem = common.problem_for(arch, cdna.FP8[arch], shape)
        configs += [dict(shape, **cand) for cand in cdna.candidates(problem)]
    for kind in cdna.MFMA_KINDS[arch]:
        configs.append(dict(SHAPES[0], next_n=2, ChunkK=128, WavePerEU=2, ReuseKV=1, QInLDS=1, Mfma=kind,
                            kv_32bit=False))
    return configs


@pytest.fixture(scope="module", params=ARCHS)
def compiled(request, tmp_path_factory):
    arch = request.param
    specs = cdna.compile_specs(arch, ci_matrix(arch))
    out_dir = str(tmp_path_factory.mktemp(f"cdna_{arch}"))
    records = compile_specs(specs, out_dir, jobs=min(2, os.cpu_count() or 1), progress=False)
    total = sum(r.seconds or 0 for r in records)
    print(f"\n{arch}: {len(records)} kernels, {total:.1f}s of compile time")
    return arch, specs, records


def test_every_candidate_compiles_and_passes_the_checks(compiled):
    arch, specs, records = compiled
    assert len({s.name for s in specs}) == len(specs), "spec names must be unique"
    problems = check_records(records)
    assert not problems, "\n".join(problems)


def test_matrix_covers_every_knob_value(compiled):
    arch, _, records = compiled
    seen = {k: {r.knobs[k] for r in records} for k in ("ChunkK", "WavePerEU", "ReuseKV", "QInLDS", "Prefetch", "Mfma",
                                                         "kv_32bit", "heads", "preshuffle", "lens_2d")}
    assert seen["ChunkK"] == {64, 128, 256} and seen["WavePerEU"] == {1, 2, 4} and seen["Prefetch"] == {0, 1}
    assert seen["ReuseKV"] == {0, 1} and seen["QInLDS"] == {0, 1} and seen["kv_32bit"] == {True, False}
    assert seen["Mfma"] == set(cdna.MFMA_KINDS[arch])
    assert seen["heads"] == {32, 64} and seen["preshuffle"] == {True, False} and seen["lens_2d"] == {True, False}


def test_mfma_instructions_match_the_knob(compiled):
    arch, _, records = compiled
    expected = {("gfx942", "fp8"): r"v_mfma_f32_(32x32x16|16x16x32)_fp8_fp8",
                ("gfx950", "fp8"): r"v_mfma_f32_(32x32x16|16x16x32)_fp8_fp8",
                ("gfx950", "f8f6f4"): r"v_mfma_scale_f32_(32x32x64|16x16x128)_f8f6f4"}
    for r in records:
        pattern = expected[(arch, r.knobs["Mfma"])]
        assert r.mma_instructions, r.name
        assert all(re.fullmatch(pattern, m) for m in r.mma_instructions), (r.name, r.mma_instructions)
        # 32x32 tiles whenever a wave gets 32+ tokens (ChunkK >= 128), else 16x16
        assert ("32x32" in r.mma_instructions[0]) == (r.knobs["ChunkK"] >= 128), r.name


def test_loads_are_buffer_loads_and_16_bytes_wide(compiled):
    """Keys come in as buffer_load_dwordx4 (global_load for the 64-bit cache path) whenever the
    block stride is a 16-byte multiple; only 132-byte blocks (kv_block_size 1) use dwords."""
    arch, _, records = compiled
    for r in records:
        isa = open(r.isa).read()
        ops = set(re.findall(r"^\t((?:buffer|global)_load_\w+)", isa, re.M))
        wide = "buffer_load_dwordx4" if r.knobs["kv_32bit"] else "global_load_dwordx4"
        if r.knobs["kv_block_size"] % 4 == 0:
            assert wide in ops, (r.name, ops)
        assert "buffer_load_dword" in ops, (r.name, ops)  # block table and scales


def test_lds_use_matches_the_staging_knob(compiled):
    _, _, records = compiled
    for r in records:
        rows = r.knobs["next_n"] if r.knobs["ReuseKV"] else 1
        if r.knobs["QInLDS"]:
            assert r.lds_bytes >= rows * r.knobs["heads"] * 132, r.name
        else:
            assert r.lds_bytes == 0, r.name


# ----------------------------------------------------------------------------- ISA parsing
@pytest.fixture(scope="module")
def one_kernel(tmp_path_factory):
    cfg = dict(heads=64, next_n=2, kv_block_size=64, preshuffle=True, ChunkK=128, WavePerEU=2, ReuseKV=1, QInLDS=1)
    spec = cdna.compile_specs("gfx942", [cfg])[0]
    record = compile_spec(spec, str(tmp_path_factory.mktemp("one")))
    return record, open(record.isa).read()


def _yaml(isa: str, key: str) -> int:
    return int(re.search(rf"^\s+\.{key}:\s+(\d+)", isa, re.M).group(1))


def test_amd_resources_agree_with_the_code_object_metadata(one_kernel):
    record, isa = one_kernel
    res = amd_resources(isa)
    assert res["vgprs"] == _yaml(isa, "vgpr_count")  # TotalNumVgprs: arch VGPRs + AGPRs
    assert res["sgprs"] == _yaml(isa, "sgpr_count")
    assert res["scratch_bytes"] == _yaml(isa, "private_segment_fixed_size") == 0
    assert res["spill_count"] == _yaml(isa, "vgpr_spill_count") + _yaml(isa, "sgpr_spill_count") == 0
    assert res["occupancy"] == 2  # waves_per_eu=2 caps the occupancy at exactly 2
    assert res["mma_instructions"] == ["v_mfma_f32_32x32x16_fp8_fp8"]
    assert record.lds_bytes == 2 * 64 * 132  # two staged rows: fp8 Q + fp32 weights (dynamic LDS)
    assert os.path.getsize(record.binary) > 0 and record.binary.endswith(".hsaco")


def test_check_records_flags_each_violation(one_kernel):
    record, _ = one_kernel
    assert check_records([record]) == []
    cases = {
        "failed to compile": dict(ok=False, error="boom"),
        "scratch": dict(scratch_bytes=16),
        "register spills": dict(spill_count=3),
        "no native fp8": dict(mma_instructions=["v_mfma_f32_32x32x8_f16"]),
        "non-fp8 MFMA": dict(mma_instructions=["v_mfma_f32_32x32x16_fp8_fp8", "v_mfma_f32_32x32x8_f16"]),
        "waves/SIMD": dict(vgprs=257),
        "compiler occupancy": dict(occupancy=1),
        "per CU": dict(lds_bytes=40 * 1024),
        "LDS/shared memory": dict(lds_bytes=70 * 1024, knobs=dict(record.knobs, WavePerEU=None)),
    }
    for needle, change in cases.items():
        bad = dataclasses.replace(record, **change)
        messages = check_records([bad])
        assert any(needle in m for m in messages), (needle, messages)


def test_vgpr_budget_formula():
    assert [max_waves_per_simd(v) for v in (1, 64, 128, 129, 136, 256, 257, 512)] == [8, 8, 4, 3, 3, 2, 1, 1]


# ----------------------------------------------------------------------------- host side
@pytest.mark.parametrize("arch", ARCHS)
def test_candidates_fit_and_default_is_a_candidate(arch):
    for shape in SHAPES:
        p = common.problem_for(arch, cdna.FP8[arch], shape)
        cands = cdna.candidates(p)
        assert cands and all(cdna.fits(p, c) and c["variant"] == "mfma" for c in cands)
        assert cdna.default_config(p) in cands
        assert len({common.config_key(c) for c in cands}) == len(cands)
        assert BACKEND.candidates(p) == cands  # the only gluon variant on AMD


def test_unsupported_reasons():
    p = common.problem_for("gfx942", "fnuz", {})
    assert cdna.unsupported(p) is None and BACKEND.unsupported(p) is None
    assert "e4m3fnuz" in cdna.unsupported(dataclasses.replace(p, fp8="fn"))
    assert "e4m3fn" in cdna.unsupported(common.problem_for("gfx950", "fnuz", {}))
    assert "power of two" in cdna.unsupported(dataclasses.replace(p, heads=48))
    assert "sm_90" in cdna.unsupported(common.problem_for("sm_90", "fn", {}))
    cpu = dataclasses.replace(p, device_type="cpu", hypothetical=False)
    assert "GPU" in BACKEND.unsupported(cpu) and "GPU" in cdna.unsupported(cpu)


def test_split_rule_uses_wave_per_eu_and_row_groups():
    p = common.problem_for("gfx950", "fn", dict(next_n=4, batch=8, cu_num=256, context=65536))
    per_row = cdna.num_splits(p, {"ChunkK": 128, "WavePerEU": 4, "ReuseKV": 0})
    shared = cdna.num_splits(p, {"ChunkK": 128, "WavePerEU": 4, "ReuseKV": 1})
    assert per_row == 32 and shared == 128  # 256 CUs x 4 programs over 32 / 8 (sequence, row group)s
    assert cdna.num_splits(p, {"ChunkK": 128, "WavePerEU": 4, "SplitKV": 5}) == 5


@pytest.mark.parametrize("arch", ARCHS)
def test_launch_path_binds_specialises_and_compiles(arch):
    """BACKEND.launch on real tensors: the JIT specialises them, compiles for the arch and
    'launches' one grid of (sequence x split x row group) programs with the right arguments."""
    fp8 = torch.float8_e4m3fnuz if arch == "gfx942" else torch.float8_e4m3fn
    inputs = make_inputs(3, 2, 64, [100, 0, 37], kv_block_size=16, preshuffle=True, fp8_dtype=fp8, seed=1)
    args = build_launch_args(inputs["q_fp8"], inputs["kv_cache"], inputs["weights"], inputs["out_logits"],
                             inputs["context_lens"], inputs["kv_indices"], inputs["max_model_len"], True, 16)
    args.problem = dataclasses.replace(args.problem, arch=arch, cu_num=304, device_type="cuda")
    config = {"variant": "mfma", "ChunkK": 64, "WavePerEU": 2, "SplitKV": 3, "ReuseKV": 0}
    kernel = common.register_mma_logits_kernel
    with fake_gpu(GPUTarget("hip", arch, 64), [kernel]) as launches:
        BACKEND.launch(args, config)
        BACKEND.launch(args, config)  # second call: cached plan, cached kernel
        kernels = compiled_kernels(kernel)
    assert len(launches) == 2 and len(kernels) == 1
    launch = launches[0]
    assert launch.grid == (3 * 3 * 2, 1, 1)  # batch x SplitKV x next_n row groups
    assert launch.metadata.num_warps == 4 and launch.metadata.waves_per_eu == 2
    runtime = common.kernel_arguments(args, 3)
    assert launch.args[:len(runtime)][7:] == runtime[7:]  # strides, lengths, splits in order
    res = amd_resources(kernels[0].asm["amdgcn"])
    assert res["scratch_bytes"] == 0 and res["mma_instructions"]
