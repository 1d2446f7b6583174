"""Compile-only builds of the FlyDSL kernel for gfx942 and gfx950 on a machine without a GPU,
checked like every cross-compiled kernel (``paged_mqa_logits.aot.compile.check_records``: native fp8
MFMA, no scratch/spills, LDS within the chip, VGPRs for the WavePerEU occupancy), plus what the
ISA must show for this design (LDS DMA of the right width, ds_read_b128 of the keys, barriers,
no readfirstlane waterfall loop around any buffer load,
exactly the MFMA the ``Mfma`` knob names: gfx942 only ``v_mfma_f32_16x16x32_fp8_fp8``, gfx950
``f8f6f4`` only ``v_mfma_scale_f32_16x16x128_f8f6f4``).

Covered here: every candidate (ChunkK x WavePerEU x Mfma) of the balanced schedule for the two
most register-hungry shapes, next_n=1 and a padded-row shape (next_n 5), the split schedule's
candidates for the hungriest shape, and each cache/length layout. The whole knob space (a
second or two per kernel) is ``python -m paged_mqa_logits compile --backend flydsl --arch ARCH``.
Needs ``pip install flydsl==0.5.0``; skipped (with the reason) without it.
"""

import os
import re
import subprocess
import sys

import pytest

from compile_matrix import SIZES, of_size
from paged_mqa_logits.backends.flydsl import build
from paged_mqa_logits.backends.flydsl.backend import BACKEND, NOT_INSTALLED, flydsl_installed
from paged_mqa_logits.aot.compile import check_records, compile_all
from paged_mqa_logits.schedule import SCHEDULES


def _plans(problem, configs):
    return [BACKEND.plan(problem, config) for config in configs]

ARCHS = ("gfx942", "gfx950")


def _require_flydsl():
    if not flydsl_installed():
        pytest.skip(NOT_INSTALLED)


def _selection(arch):
    """The balanced candidates of (h64, next_n 8), (h64, next_n 3), (h64, next_n 5) and (h32,
    next_n 1), the split candidates of (h64, next_n 8) and one kernel per cache/length layout;
    the split wave roles for (h64, next_n 8) and (h32, next_n 1) only (their stage body is the
    uniform one's, branched by role)."""
    plans = {}
    for heads, next_n, schedules in ((64, 8, ("balanced", "split")), (64, 3, ("balanced",)), (64, 5, ("balanced",)),
                                     (32, 1, ("balanced",))):
        problem = build._problem(arch, heads, next_n, 64, True, True)
        configs = [c for c in BACKEND.candidates(problem) if c["Schedule"] in schedules
                   and (c["WaveRoles"] == "uniform" or next_n in (1, 8))]
        for plan in _plans(problem, configs):
            plans[plan.name] = plan
    for kv_block_size, preshuffle, lens_2d, next_n in ((16, False, False, 2), (32, True, False, 5), (128, False, True, 4),
                                                       (256, True, True, 1)):
        problem = build._problem(arch, 64, next_n, kv_block_size, preshuffle, lens_2d)
        # balanced where the layout allows it at ChunkK 128 (<= 2 blocks per stage), else split
        plan = next(plan for plan in _plans(problem, [{"ChunkK": 128, "WavePerEU": 2, "Schedule": schedule}
                                                                for schedule in SCHEDULES])
                    if plan.config_error() is None)
        plans[plan.name] = plan
    assert all(plan.config_error() is None for plan in plans.values())
    return list(plans.values())


#: the only MFMA each (arch, Mfma) may contain
EXPECTED_MFMA = {("gfx942", "fp8"): ["v_mfma_f32_16x16x32_fp8_fp8"],
                 ("gfx950", "fp8"): ["v_mfma_f32_16x16x32_fp8_fp8"],
                 ("gfx950", "f8f6f4"): ["v_mfma_scale_f32_16x16x128_f8f6f4"]}


def _plan_knobs(plan) -> dict:
    return {k: v for k, v in vars(plan).items() if k != "arch"}


def _selected(arch, size):
    """:func:`_selection` (the slow set) or its covering sample, every schedule, MFMA and wave
    role combination included (the default run)."""
    return of_size(_selection(arch), size, knobs_of=_plan_knobs, together=(("schedule", "mfma", "wave_roles"),))


@pytest.fixture(scope="module", params=SIZES)
def compiled(request, tmp_path_factory):
    """Both archs, compiled once for the module (each arch in its own child processes)."""
    _require_flydsl()
    out = {}
    for arch in ARCHS:
        directory = tmp_path_factory.mktemp(arch)
        plans = _selected(arch, request.param)
        out[arch] = (build.compile_plans(arch, plans, str(directory), progress=False), directory, plans)
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_kernels_compile_and_pass_the_checks(compiled, arch):
    records, _, plans = compiled[arch]
    assert len(records) == len(plans) and len(_selection(arch)) >= 12
    assert check_records(records) == []
    for record in records:
        assert record.backend == "flydsl" and record.arch == arch
        assert record.mma_instructions == EXPECTED_MFMA[arch, record.knobs["Mfma"]], record.name
        assert record.options["waves_per_eu"] == record.knobs["WavePerEU"]
    assert {(r.knobs["Schedule"], r.knobs["Mfma"], r.knobs["WaveRoles"]) for r in records} == {
        (schedule, mfma, roles) for (a, mfma) in EXPECTED_MFMA if a == arch for schedule in ("balanced", "split")
        for roles in ("uniform", "split")}
    for record in records:
        assert record.options["num_warps"] == {"uniform": 4, "split": 8}[record.knobs["WaveRoles"]]


@pytest.mark.parametrize("arch", ARCHS)
def test_files_and_isa(compiled, arch):
    records, directory, plans = compiled[arch]
    dma = {"gfx942": r"buffer_load_dword v\d+, s\[\d+:\d+\], s\d+ offen lds",
           "gfx950": r"buffer_load_dwordx4 v\d+, s\[\d+:\d+\], s\d+ offen lds"}[arch]
    for record in records:
        assert os.path.dirname(record.binary) == str(directory)
        with open(record.binary, "rb") as f:
            binary = f.read()
        assert binary[:4] == b"\x7fELF" and record.name.encode() in binary
        assert os.path.exists(os.path.join(directory, record.name + ".json"))
        with open(record.isa) as f:
            isa = f.read()
        assert re.search(rf'\.amdgcn_target "amdgcn-amd-amdhsa-[a-z]*-{arch}', isa)
        assert re.search(dma, isa), "the keys must reach LDS by DMA of this arch's width"
        assert "ds_read_b128" in isa and "s_barrier" in isa
        assert "scratch_" not in isa
        # every buffer descriptor is uniform (SGPRs): a VGPR one makes LLVM wrap each load in a
        # v_readfirstlane waterfall loop, which ends in s_cbranch_execnz (the balanced
        # schedule's lengths scan had one around every lengths load)
        assert "s_cbranch_execnz" not in isa, f"{record.name}: a waterfall loop"
        plan = next(p for p in plans if p.name == record.name)
        assert record.lds_bytes == plan.lds_bytes
        # the instruction mix: one stage's copies in the prologue and one in the loop, and one
        # stage's MFMAs of the wave (no copy of the stage body, no MFMA on a padding slot)
        copies = re.findall(r"^\s*buffer_load_dword\S* .* lds$", isa, re.M)
        assert len(copies) == 2 * plan.dma_tiles_per_wave * plan.dma_per_tile, record.name
        mfmas = re.findall(r"^\s*v_mfma", isa, re.M)
        assert len(mfmas) == plan.rows_per_wave * plan.tiles_per_wave * plan.m_tiles * plan.k_steps, record.name
        if plan.wave_roles == "split":  # copies and MFMAs on different sides of the role branch
            assert not [block for block in basic_blocks(isa) if any(" lds" in l and l.startswith("buffer_load")
                                                                    for l in block)
                        and any(l.startswith("v_mfma") for l in block)], record.name


def basic_blocks(isa: str) -> list[list[str]]:
    """The ISA's instructions split at labels and branches."""
    blocks, current = [], []
    for line in isa.splitlines():
        line = line.strip()
        if re.match(r"\.LBB\d+_\d+:", line) or line.startswith(("s_cbranch", "s_branch")):
            blocks.append(current)
            current = []
        elif line and not line.startswith((".", ";")):
            current.append(line)
    return blocks + [current]


def test_only_table_compiles_what_the_table_names(monkeypatch, tmp_path):
    _require_flydsl()
    from paged_mqa_logits import table

    rows = [({"heads": 32, "next_n": 2, "kv_block_size": 64, "preshuffle": True, "batch": 64, "context": None},
             "flydsl", {"ChunkK": 128, "WavePerEU": 2}),
            ({"heads": 64, "next_n": 1, "kv_block_size": 64, "preshuffle": True, "batch": 1, "context": None},
             "gluon", {"ChunkK": 256, "WavePerEU": 4})]
    monkeypatch.setattr(table, "table_configs", lambda arch: rows)
    records = compile_all("flydsl", "gfx950", str(tmp_path), only_table=True)
    assert sorted(r.name for r in records) == ["flydsl_gfx950_h32_n2_kb64_shuf_1d_ck128_w2_balanced_f8f6f4",
                                               "flydsl_gfx950_h32_n2_kb64_shuf_2d_ck128_w2_balanced_f8f6f4"]
    assert check_records(records) == []


def test_fp4_kernels_compile_for_gfx950(tmp_path):
    """MXFP4 kernels: the scaled MFMA on e2m1 A and B (``cbsz:4 blgp:4``, 4-VGPR operands), one
    per (row, tile, 16 heads) of the wave's stage, half-width DMA and key reads, and the usual
    checks (no spills, occupancy), under both schedules and both wave roles."""
    _require_flydsl()
    plans = []
    for heads, next_n, knobs in ((64, 8, {"ChunkK": 64, "WavePerEU": 2}),
                                 (32, 1, {"ChunkK": 128, "WavePerEU": 4, "WaveRoles": "split"}),
                                 (64, 3, {"ChunkK": 128, "WavePerEU": 2, "Schedule": "split"})):
        problem = build._problem("gfx950", heads, next_n, 64, next_n != 3, True, "fp4")
        plans.append(BACKEND.plan(problem, knobs))
    plans.append(BACKEND.plan(build._problem("gfx950", 64, 2, 16, False, False, "fp4"), {"Schedule": "split"}))
    records = build.compile_plans("gfx950", plans, str(tmp_path), progress=False)
    assert check_records(records) == []
    for record, plan in zip(records, plans):
        assert record.ok and record.mma_instructions == ["v_mfma_scale_f32_16x16x128_f8f6f4"], record.name
        with open(record.isa) as f:
            isa = f.read()
        mfmas = re.findall(r"^\s*v_mfma\S* v\[\d+:\d+\], v\[(\d+):(\d+)\], .*$", isa, re.M)
        assert len(mfmas) == plan.rows_per_wave * plan.tiles_per_wave * plan.m_tiles, record.name
        assert all(int(hi) - int(lo) == 3 for lo, hi in mfmas)  # 16 bytes of e2m1 codes per lane
        assert all("cbsz:4 blgp:4" in line for line in re.findall(r"^\s*v_mfma.*$", isa, re.M))
        copies = re.findall(r"^\s*buffer_load_dwordx4 .* lds$", isa, re.M)
        assert len(copies) == 2 * plan.dma_tiles_per_wave * plan.dma_per_tile, record.name
        assert record.lds_bytes == plan.lds_bytes == 2 * plan.chunk_k * 64


def test_widened_fp4_kernels_compile_for_gfx942(tmp_path):
    """MXFP4 on gfx942 (no scaled MFMA): the codes widened to e4m3fnuz by a byte table
    (``v_perm_b32``), four plain fp8 MFMAs per (row, tile, 16 heads) -- one per group -- and each
    group's exponents folded in by ``v_ldexp_f32``; no spills at the knobs the plan admits."""
    _require_flydsl()
    plans = [BACKEND.plan(build._problem("gfx942", heads, next_n, 64, preshuffle, True, "fp4"), knobs)
             for heads, next_n, preshuffle, knobs in (
                 (32, 4, True, {"ChunkK": 64, "WavePerEU": 1}),
                 (64, 2, False, {"ChunkK": 64, "WavePerEU": 1, "Schedule": "split"}),
                 (32, 1, True, {"ChunkK": 64, "WavePerEU": 2, "WaveRoles": "split"}))]
    assert all(plan.config_error() is None and plan.mfma == "fp8" for plan in plans)
    records = build.compile_plans("gfx942", plans, str(tmp_path), progress=False)
    assert check_records(records) == []
    for record, plan in zip(records, plans):
        assert record.ok and record.mma_instructions == ["v_mfma_f32_16x16x32_fp8_fp8"], record.name
        with open(record.isa) as f:
            isa = f.read()
        mfmas = re.findall(r"^\s*v_mfma", isa, re.M)
        assert len(mfmas) == plan.rows_per_wave * plan.tiles_per_wave * plan.m_tiles * 4, record.name
        assert "v_perm_b32" in isa and "v_ldexp_f32" in isa, record.name
        assert re.search(r"^\s*ds_read2?(st64)?_b32 ", isa, re.M), record.name  # 4-byte key reads (paired)
        assert record.lds_bytes == plan.lds_bytes == 2 * plan.chunk_k * 64


@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_logits_kernels_compile(arch, tmp_path):
    """bf16 logits: the stores are 2-byte ``buffer_store_short`` (no 4-byte store of logits), for
    fp8 on both archs and fp4 on gfx950, and the kernels pass the usual checks."""
    _require_flydsl()
    formats = ("fp8", "fp4") if arch == "gfx950" else ("fp8",)
    plans = [BACKEND.plan(build._problem(arch, 64, 2, 64, True, True, kv_format, "bf16"), {"ChunkK": 64})
             for kv_format in formats]
    records = build.compile_plans(arch, plans, str(tmp_path), progress=False)
    assert check_records(records) == []
    for record in records:
        assert record.ok and record.name.endswith("_bf16"), record.name
        with open(record.isa) as f:
            isa = f.read()
        assert re.search(r"^\s*buffer_store_short ", isa, re.M), record.name
        assert not re.search(r"^\s*buffer_store_dword ", isa, re.M), record.name


def test_knob_space_covers_every_candidate():
    for arch in ARCHS:
        names = {plan.name for plan in build.knob_space(BACKEND, arch)}
        for heads in (32, 64):
            for next_n in range(1, 9):
                for kv_format in ("fp8", "fp4"):
                    problem = build._problem(arch, heads, next_n, 64, True, True, kv_format)
                    for config in BACKEND.candidates(problem):
                        assert BACKEND.plan(problem, config).name in names
        assert any(name.endswith("_fp4") for name in names)
        assert any(name.endswith("_bf16") for name in names)
        layouts = {re.search(r"_kb(\d+)_(shuf|plain)_(1d|2d)_", n).groups() for n in names}
        assert len(layouts) == 5 * 2 * 2  # every block size x cache layout x length layout


def test_the_linker_stand_in(tmp_path, monkeypatch):
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "no-rocm-here"))
    root = build._linker_stand_in(str(tmp_path / "rocm"))
    linker = os.path.join(root, "llvm", "bin", "ld.lld")
    assert os.access(linker, os.X_OK)
    result = subprocess.run([linker, "-shared", "a.o", "b.o", "-o", "x.hsaco"], capture_output=True, text=True)
    assert result.returncode != 0 and "expected `-shared IN.o -o OUT`" in result.stderr
    real = tmp_path / "real" / "llvm" / "bin"
    real.mkdir(parents=True)
    (real / "ld.lld").write_text("#!/bin/sh\n")
    (real / "ld.lld").chmod(0o755)
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "real"))
    assert build._linker_stand_in(str(tmp_path / "unused")) is None  # a real ld.lld is used as is


@pytest.mark.slow
def test_compile_cli(tmp_path):
    """``python -m paged_mqa_logits compile --backend flydsl --only-table`` on the shipped table."""
    _require_flydsl()
    result = subprocess.run([sys.executable, "-m", "paged_mqa_logits", "compile", "--backend", "flydsl", "--arch",
                             "gfx942", "--only-table", "--out", str(tmp_path)], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "CHECK FAILED" not in result.stdout
