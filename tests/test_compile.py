"""The cross-compilation driver (``paged_mqa_logits/aot/compile.py``), on its own: ISA and PTX
parsing, the checks CI applies to every record, which configs it builds, and the one summary
line ``python -m paged_mqa_logits compile`` ends with. (Each backend's compile matrix is
checked by its own tests under tests/backends/.)"""

from __future__ import annotations

import dataclasses
import os
import re

import pytest

pytest.importorskip("triton.experimental.gluon")

from paged_mqa_logits import __main__ as pml_cli  # noqa: E402
from paged_mqa_logits.aot import compile as compile_mod  # noqa: E402
from paged_mqa_logits import table  # noqa: E402
from paged_mqa_logits.backends.gluon import mfma  # noqa: E402
from paged_mqa_logits.aot.compile import (  # noqa: E402
    CompileRecord, amd_hot_loop, amd_loop_instructions, amd_resources, backend_specs, check_records, compile_spec, max_waves_per_simd,
    ptx_mma_instructions, sass_mma_instructions, summary_line, summary_table, table_kernel_configs, target)


# ----------------------------------------------------------------------------- ISA parsing
@pytest.fixture(scope="module")
def one_kernel(tmp_path_factory):
    cfg = dict(heads=64, next_n=2, kv_block_size=64, preshuffle=True, ChunkK=128, WavePerEU=2, ReuseKV=1, QInLDS=1,
               Schedule="split")
    spec = mfma.VARIANT.compile_specs("gfx942", [cfg])[0]
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


def test_loop_instructions_are_the_tile_loops(one_kernel):
    """The parser's hot loop is the tile loop: per 32-token wave tile, 2 rows x 2 head tiles of 32 x
    8 k-steps of 16 dims = 32 MFMAs, and nothing of the kernel's prologue or end."""
    _, isa = one_kernel
    loop = amd_loop_instructions(isa)
    assert loop["v_mfma_f32_32x32x16_fp8_fp8"] == 2 * 2 * 8
    assert loop.get("s_endpgm", 0) == 0 and loop.get("s_load_dwordx2", 0) == 0
    assert amd_loop_instructions("\ts_endpgm\n") == {}


def test_the_hot_loop_is_found_from_backward_branches_without_its_nested_loops():
    """A loop is a backward branch's target up to the branch (LLVM's loop comments are not needed:
    FlyDSL's ISA has none); an outer loop does not count the blocks of the loop nested in it, so
    the innermost loop of the MFMAs wins over the loop around it, and the code after the loops
    (a pipelined last tile) is no loop's."""
    isa = ("\ts_load_dwordx2 s[0:1], s[0:1], 0x0\n"
           ".LBB0_2:\n"
           "\tv_mfma_f32_32x32x16_fp8_fp8 a[0:15], v[0:1], v[2:3], 0\n"
           ".LBB0_3:\n"
           "\tv_mfma_f32_32x32x16_fp8_fp8 a[0:15], v[0:1], v[2:3], a[0:15]\n"
           "\tv_mfma_f32_32x32x16_fp8_fp8 a[0:15], v[0:1], v[2:3], a[0:15]\n"
           "\ts_waitcnt vmcnt(0) lgkmcnt(0)\n"
           "\ts_cbranch_scc1 .LBB0_3\n"
           "; %bb.4:\n"
           "\ts_barrier\n"
           "\ts_cbranch_vccnz .LBB0_2\n"
           ".LBB0_5:\n"
           "\tv_mfma_f32_32x32x16_fp8_fp8 a[0:15], v[0:1], v[2:3], a[0:15]\n"
           "\tv_mfma_f32_32x32x16_fp8_fp8 a[0:15], v[0:1], v[2:3], a[0:15]\n"
           "\tv_mfma_f32_32x32x16_fp8_fp8 a[0:15], v[0:1], v[2:3], a[0:15]\n"
           "\ts_cbranch_scc0 .LBB0_7\n"
           ".LBB0_7:\n"
           "\ts_endpgm\n")
    assert amd_loop_instructions(isa) == {"v_mfma_f32_32x32x16_fp8_fp8": 2, "s_waitcnt vmcnt(0)": 1,
                                          "s_waitcnt lgkmcnt(0)": 1, "s_cbranch_scc1": 1}
    assert amd_hot_loop(isa)[-1] == "s_cbranch_scc1 .LBB0_3"


def test_ptx_and_sass_matrix_instructions_are_found_once_each():
    ptx = """
    mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%f1}, {%r1}, {%r2}, {%f1};
    @%p1 wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {%f2}, %rd1, %rd2, p, 1, 1;
    mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%f3}, {%r3}, {%r4}, {%f3};
    wgmma.fence.sync.aligned;
    """
    assert ptx_mma_instructions(ptx) == ["mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"]
    sass = "/*0a40*/  HMMA.16816.F32 R4, R8, R12, R4 ;\n/*0a50*/  HMMA.16816.F32 R8, R8, R14, R8 ;\n" \
           "/*0b00*/  QGMMA.64x64x32.F32.E4M3.E4M3 R24, gdesc[UR4], R24 ;"
    assert sass_mma_instructions(sass) == ["HMMA.16816.F32", "QGMMA.64x64x32.F32.E4M3.E4M3"]


# ----------------------------------------------------------------------------- checks
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
        "no scratch size": dict(scratch_bytes=None),
    }
    for needle, change in cases.items():
        bad = dataclasses.replace(record, **change)
        messages = check_records([bad])
        assert any(needle in m for m in messages), (needle, messages)


def _sm90_record(**change) -> CompileRecord:
    record = CompileRecord(name="k", backend="gluon", arch="sm_90", knobs={}, ok=True, vgprs=128, scratch_bytes=0,
                           spill_count=0, lds_bytes=48 * 1024,
                           mma_instructions=["mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32", "HMMA.16816.F32"])
    return dataclasses.replace(record, **change)


def test_check_records_on_sm90_judges_the_ptx_not_the_sass():
    """sm_90 has no fp8 ``mma.sync`` unit (ptxas lowers it to HMMA): the PTX instruction is
    what must be fp8; SASS mnemonics alone never count."""
    assert check_records([_sm90_record()]) == []
    assert any("register spills" in m for m in check_records([_sm90_record(scratch_bytes=24, spill_count=1)]))
    # local memory outside the matrix loops (a warp-specialised producer's) is no spill that costs
    assert check_records([_sm90_record(scratch_bytes=24, spill_count=0)]) == []
    assert any("no native fp8" in m for m in check_records([_sm90_record(mma_instructions=["HMMA.16816.F32"])]))
    assert any("shared memory" in m for m in check_records([_sm90_record(lds_bytes=300 * 1024)]))


def test_vgpr_budget_formula():
    assert [max_waves_per_simd(v) for v in (1, 64, 128, 129, 136, 256, 257, 512)] == [8, 8, 4, 3, 3, 2, 1, 1]


# ----------------------------------------------------------------------------- what gets built
def test_only_table_builds_the_table_rows_of_the_backend():
    configs = table_kernel_configs("gluon", "gfx942")
    rows = [(fields, knobs) for fields, name, knobs in table.table_configs("gfx942") if name == "gluon"]
    assert configs and len(configs) == len(rows)
    for config, (fields, knobs) in zip(configs, rows):
        assert config == dict({k: v for k, v in fields.items() if v is not None}, **knobs)
    specs = backend_specs("gluon", "gfx942", only_table=True)
    assert specs and all(s.arch == "gfx942" and s.backend == "gluon" for s in specs)
    assert len({s.name for s in specs}) == len(specs) <= len(configs)  # rows of one kernel build once


def test_unknown_targets_and_backends_that_cannot_compile_are_named():
    with pytest.raises(ValueError, match="no cross-compilation target for arch 'gfx90a'"):
        target("gfx90a")
    with pytest.raises(ValueError, match="backend 'torch' cannot be cross-compiled"):
        backend_specs("torch", "gfx942")


# ----------------------------------------------------------------------------- the summary
def _record(name, ok, mma=("v_mfma_f32_16x16x32_fp8_fp8",)):
    return CompileRecord(name=name, backend="gluon", arch="gfx942", knobs={}, ok=ok, error=None if ok else "boom",
                         mma_instructions=list(mma), vgprs=64, scratch_bytes=0, spill_count=0, seconds=1.0)


@pytest.mark.parametrize("records,rc,summary", [
    ([_record("a", True), _record("b", True)], 0, "2/2 kernels built, 0 checks failed"),
    ([_record("a", True), _record("b", False)], 1, "1/2 kernels built, 1 checks failed"),
    ([_record("a", True, mma=("v_mfma_f32_16x16x16_f16",))], 1, "1/1 kernels built, 1 checks failed"),
    ([], 0, "0/0 kernels built, 0 checks failed"),
])
def test_compile_ends_with_one_summary_line_matching_its_status(capsys, monkeypatch, records, rc, summary):
    monkeypatch.setattr(compile_mod, "compile_all", lambda *a, **k: records)
    got = pml_cli.main(["compile", "--backend", "gluon", "--arch", "gfx942"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert got == rc and last.startswith("compile: ") and summary in last
    assert last.endswith("OK" if rc == 0 else "FAILED")
    assert last == summary_line(records, check_records(records))


def test_summary_table_has_one_line_per_kernel_with_its_error_or_instructions():
    lines = summary_table([_record("good", True), _record("bad", False)]).splitlines()
    assert len(lines) == 4 and lines[0].startswith("kernel")
    assert lines[2].startswith("good") and lines[2].endswith("v_mfma_f32_16x16x32_fp8_fp8")
    assert lines[3].startswith("bad") and " NO " in lines[3] and lines[3].endswith("boom")
