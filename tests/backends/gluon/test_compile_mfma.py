"""CPU CI for the gfx942 / gfx950 ``mfma`` variant (backends/gluon/mfma.py): every candidate of
a representative problem set is cross-compiled and must pass ``compile.check_records``; the ISA
parsing is checked on real compiler output; the real launch path (JIT binding, specialisation,
grid) runs on a simulated device.

Compile matrix (:func:`ci_matrix`; under Triton 3.6 gfx942 359 kernels, 46 of them ``KeyLoad=lds``,
gfx950 778 with 104 (``LDS_PER_SHAPE``: every ``lds`` candidate of one plain shape, a few of the
others; ``tools/cdna_key_loads.py`` compiles all of them); later compilers need more VGPRs, so ``MFMA.admits``
admits fewer WavePerEU 4 knob sets: ``triton_internals.toolchain.AMD_VGPR_MARGIN``): **every candidate** (ChunkK 64/128/256 x WavePerEU 1/2/4 x
per-row with Q in VGPRs / per-row with Q in LDS / shared-KV, x both MFMA kinds on gfx950, x both
schedules, each with the two-tile prefetch where it fits, else the one-tile prefetch, else none, and for plain caches all of that again
with ``KeyLoad=lds``, as admitted by ``MFMA.admits``) of five shapes chosen so
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

plus, for the DeepSeek decode shape (the first), every candidate of every other cache layout
(``mfma.KV_LAYOUTS``: block strides padded by 4 and by 16 bytes, a base pointer 4 bytes off
16-byte alignment, the 64-bit ``global_load`` path packed and padded), each offered by
``MFMA.candidates`` for that layout: the selection sees the real stride, alignment and 32/64-bit
flag, so a knob set that would spill on a layout is not offered for it. Batch, context and CU
count change only host-side numbers (grid, SplitKV), never the kernel, so they are not varied.
"""

from __future__ import annotations

import dataclasses
import os
import re

import pytest
import torch

pytest.importorskip("triton.experimental.gluon")

from compile_matrix import for_archs, of_size  # noqa: E402
from paged_mqa_logits.triton_internals.compiler import GPUTarget  # noqa: E402
from paged_mqa_logits.triton_internals.device import simulated_device  # noqa: E402
from paged_mqa_logits.triton_internals.specialise import compiled_kernels  # noqa: E402
from paged_mqa_logits.triton_internals.toolchain import AMD_VGPR_MARGIN  # noqa: E402
from paged_mqa_logits.backends.gluon import BACKEND, cdna_keys, common, mfma  # noqa: E402
from paged_mqa_logits.backends.gluon.kernels.register_mma import (  # noqa: E402
    register_mma_logits_kernel, register_mma_logits_kernel_key_layout)
from paged_mqa_logits.aot.compile import amd_loop_instructions, amd_resources, check_records, compile_specs  # noqa: E402
from paged_mqa_logits.op import build_launch_args  # noqa: E402
from paged_mqa_logits.reference import make_inputs  # noqa: E402

MFMA = mfma.VARIANT

ARCHS = ("gfx942", "gfx950")
SHAPES = (
    dict(heads=64, next_n=1, kv_block_size=64, preshuffle=True, lens_2d=True),
    dict(heads=32, next_n=8, kv_block_size=64, preshuffle=False, lens_2d=True),
    dict(heads=64, next_n=3, kv_block_size=16, preshuffle=True, lens_2d=False),
    dict(heads=32, next_n=2, kv_block_size=1, preshuffle=False, lens_2d=True),
    dict(heads=64, next_n=8, kv_block_size=256, preshuffle=False, lens_2d=False),
)


#: ``KeyLoad=lds`` candidates compiled per shape: every one of the plain 64-token-block shape
#: (they span every ChunkK and WavePerEU), the first few elsewhere (the lds twins cost as much
#: compile time as the direct candidates and share their code paths but the key load)
LDS_PER_SHAPE = {1: None}
LDS_ELSEWHERE = 4


def ci_matrix(arch: str) -> list[dict]:
    configs = []
    for index, shape in enumerate(SHAPES):
        problem = common.problem_for(arch, MFMA.fp8[arch], shape)
        candidates = MFMA.candidates(problem)
        direct = [c for c in candidates if c.get("KeyLoad") != "lds"]
        lds = [c for c in candidates if c.get("KeyLoad") == "lds"]
        configs += [dict(shape, **cand) for cand in direct + lds[:LDS_PER_SHAPE.get(index, LDS_ELSEWHERE)]]
    configs += layout_matrix(arch)
    return configs


def layout_matrix(arch: str) -> list[dict]:
    """Every candidate of the first shape on every non-packed cache layout."""
    configs = []
    for layout in mfma.KV_LAYOUTS:
        if layout == "packed":
            continue
        problem = mfma.layout_problem(common.problem_for(arch, MFMA.fp8[arch], SHAPES[0]), {"layout": layout})
        configs += [dict(SHAPES[0], **cand, layout=layout) for cand in MFMA.candidates(problem)]
    return configs


@pytest.fixture(scope="module", params=for_archs(ARCHS))
def compiled(request, tmp_path_factory):
    arch, size = request.param
    # the sample keeps every ChunkK and WavePerEU of the LDS key load too
    specs = MFMA.compile_specs(arch, of_size(ci_matrix(arch), size,
                                             together=(("KeyLoad", "ChunkK"), ("KeyLoad", "WavePerEU"))))
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
                                                         "kv_32bit", "heads", "preshuffle", "lens_2d", "layout")}
    assert seen["layout"] == set(mfma.KV_LAYOUTS)
    assert seen["ChunkK"] == {64, 128, 256} and seen["WavePerEU"] == {1, 2, 4} and seen["Prefetch"] == {0, 1, 2}
    assert seen["ReuseKV"] == {0, 1} and seen["QInLDS"] == {0, 1} and seen["kv_32bit"] == {True, False}
    assert seen["Mfma"] == set(mfma.MFMA_KINDS[arch])
    assert seen["heads"] == {32, 64} and seen["preshuffle"] == {True, False} and seen["lens_2d"] == {True, False}
    lds = [r.knobs for r in records if r.knobs.get("KeyLoad") == "lds"]
    assert lds and not any(k["preshuffle"] for k in lds)
    assert {k["ChunkK"] for k in lds} == {64, 128, 256} and {k["WavePerEU"] for k in lds} == {1, 2, 4}


def test_key_loads_issue_what_they_claim(compiled):
    """In the tile loop, per wave (``T = ChunkK / 4`` tokens): ``KeyLoad=lds`` gathers the keys with
    ``T/8`` 16-byte loads (aligned caches), writes them to LDS with ``T/8`` ``ds_write_b128``, reads
    them back with at least as many ``ds_read_b128`` and has a barrier; ``direct`` gathers as many
    16-byte loads and writes nothing to LDS (with Q in VGPRs it reads nothing from LDS either).
    The two-tile loop (``Prefetch=2``) does all of it twice per iteration."""
    _, _, records = compiled
    for r in records:
        loop = amd_loop_instructions(open(r.isa).read())
        tile_loads = r.knobs["ChunkK"] // 4 // 8 * (2 if r.knobs["Prefetch"] == 2 else 1)
        wide = "buffer_load_dwordx4" if r.knobs["kv_32bit"] else "global_load_dwordx4"
        writes = sum(n for k, n in loop.items() if k.startswith("ds_write"))
        reads = sum(n for k, n in loop.items() if k.startswith("ds_read"))
        if r.knobs["kv_aligned16"]:
            assert loop.get(wide) == tile_loads, (r.name, loop.get(wide))
        if r.knobs.get("KeyLoad") == "lds":
            assert loop.get("ds_write_b128") == writes == tile_loads, (r.name, loop)
            assert loop.get("ds_read_b128", 0) >= tile_loads and loop.get("s_barrier", 0) >= 1, (r.name, loop)
        else:
            assert writes == 0, (r.name, loop)
            assert r.knobs["QInLDS"] or reads == 0, (r.name, loop)


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
    base and the block stride are 16-byte multiples; 132-byte blocks (kv_block_size 1), strides
    padded by 4 bytes and unaligned bases use dwords."""
    arch, _, records = compiled
    for r in records:
        isa = open(r.isa).read()
        ops = set(re.findall(r"^\t((?:buffer|global)_load_\w+)", isa, re.M))
        wide = "buffer_load_dwordx4" if r.knobs["kv_32bit"] else "global_load_dwordx4"
        assert r.knobs["kv_aligned16"] == (r.knobs["kv_block_size"] % 4 == 0 and r.knobs["layout"] not in (
            "pad4", "unaligned", "kv64_pad4")), r.name
        if r.knobs["kv_aligned16"]:
            assert wide in ops, (r.name, ops)
        assert "buffer_load_dword" in ops, (r.name, ops)  # block table and scales


#: LDS the balanced schedule's length scan may add: the cross-wave scratch of its reductions
SCAN_SCRATCH_BYTES = 64


def test_lds_use_matches_the_staging_knob(compiled):
    _, _, records = compiled
    for r in records:
        rows = r.knobs["next_n"] if r.knobs["ReuseKV"] else 1
        scan = SCAN_SCRATCH_BYTES if r.knobs["Schedule"] == "balanced" else 0
        staged = rows * r.knobs["heads"] * 132 if r.knobs["QInLDS"] else 0
        staged += cdna_keys.lds_bytes(r.knobs["ChunkK"], r.knobs.get("KeyLoad", "direct"))
        assert staged <= r.lds_bytes <= staged + scan + (staged // 8), r.name


# ----------------------------------------------------------------------------- host side
@pytest.mark.parametrize("arch", ARCHS)
def test_candidates_fit_and_default_is_a_candidate(arch):
    for shape in SHAPES:
        p = common.problem_for(arch, MFMA.fp8[arch], shape)
        cands = MFMA.candidates(p)
        assert cands and all(MFMA.admits(p, c) and c["variant"] == "mfma" for c in cands)
        assert MFMA.default_config(p) in cands
        assert len({common.config_key(c) for c in cands}) == len(cands)
        assert BACKEND.candidates(p) == cands  # the only gluon variant on AMD


def test_unsupported_reasons():
    p = common.problem_for("gfx942", "fnuz", {})
    assert MFMA.unsupported(p) is None and BACKEND.unsupported(p) is None
    assert "e4m3fnuz" in MFMA.unsupported(dataclasses.replace(p, fp8="fn"))
    assert "e4m3fn" in MFMA.unsupported(common.problem_for("gfx950", "fnuz", {}))
    assert "power of two" in MFMA.unsupported(dataclasses.replace(p, shape_key=dataclasses.replace(p.shape_key,
                                                                                                  heads=48)))
    assert "sm_90" in MFMA.unsupported(common.problem_for("sm_90", "fn", {}))
    cpu = common.problem_for("cpu", "fnuz", {})
    assert "GPU" in BACKEND.unsupported(cpu) and "gfx942" in MFMA.unsupported(cpu)


def test_split_rule_uses_wave_per_eu_and_row_groups():
    p = common.problem_for("gfx950", "fn", dict(next_n=4, batch=8, cu_num=256, context=65536))
    per_row = MFMA.num_splits(p, {"ChunkK": 128, "WavePerEU": 4, "ReuseKV": 0})
    shared = MFMA.num_splits(p, {"ChunkK": 128, "WavePerEU": 4, "ReuseKV": 1})
    assert per_row == 32 and shared == 128  # 256 CUs x 4 programs over 32 / 8 (sequence, row group)s
    assert MFMA.num_splits(p, {"ChunkK": 128, "WavePerEU": 4, "SplitKV": 5}) == 5


@pytest.mark.parametrize("arch", ARCHS)
def test_launch_path_binds_specialises_and_compiles(arch):
    """BACKEND.launch on real tensors: the JIT specialises them, compiles for the arch and
    'launches' one grid of (sequence x split x row group) programs with the right arguments."""
    fp8 = torch.float8_e4m3fnuz if arch == "gfx942" else torch.float8_e4m3fn
    inputs = make_inputs(3, 2, 64, [100, 0, 37], kv_block_size=16, preshuffle=True, fp8_dtype=fp8, seed=1)
    args = build_launch_args(inputs["q_fp8"], inputs["kv_cache"], inputs["weights"], inputs["out_logits"],
                             inputs["context_lens"], inputs["kv_indices"], inputs["max_model_len"], True, 16)
    args.problem = dataclasses.replace(args.problem, arch=arch, cu_num=304)
    config = {"variant": "mfma", "ChunkK": 64, "WavePerEU": 2, "SplitKV": 3, "ReuseKV": 0, "Schedule": "split"}
    kernel = register_mma_logits_kernel
    with simulated_device(GPUTarget("hip", arch, 64), [kernel]) as launches:
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


@pytest.mark.parametrize("arch", ARCHS)
def test_balanced_launch_is_one_persistent_wave_per_row_group(arch):
    """``Schedule=balanced``: CUs x WavePerEU programs per row group, whatever the batch and
    the lengths (the kernel divides the work itself), and the same kernel for every batch."""
    fp8 = torch.float8_e4m3fnuz if arch == "gfx942" else torch.float8_e4m3fn
    config = {"variant": "mfma", "ChunkK": 64, "WavePerEU": 2, "ReuseKV": 0, "Schedule": "balanced"}
    kernel = register_mma_logits_kernel
    with simulated_device(GPUTarget("hip", arch, 64), [kernel]) as launches:
        for batch, lens in ((3, [100, 0, 37]), (5, [1, 2, 3, 4, 900])):
            inputs = make_inputs(batch, 2, 64, lens, kv_block_size=16, fp8_dtype=fp8, seed=1)
            args = build_launch_args(inputs["q_fp8"], inputs["kv_cache"], inputs["weights"], inputs["out_logits"],
                                     inputs["context_lens"], inputs["kv_indices"], inputs["max_model_len"], False, 16)
            args.problem = dataclasses.replace(args.problem, arch=arch, cu_num=304)
            BACKEND.launch(args, config)
        kernels = compiled_kernels(kernel)
    assert [launch.grid for launch in launches] == [(304 * 2 * 2, 1, 1)] * 2  # CUs x WavePerEU x row groups
    assert len(kernels) == 1
    assert amd_resources(kernels[0].asm["amdgcn"])["scratch_bytes"] == 0


# ----------------------------------------------------------------------------- cache layouts
def test_launch_args_record_the_cache_layout():
    """What selection sees of the cache: the real block stride, the base alignment, 32/64 bits."""
    def problem_of(**kwargs):
        inputs = make_inputs(2, 1, 64, [70, 9], kv_block_size=64, seed=2, **kwargs)
        return build_launch_args(inputs["q_fp8"], inputs["kv_cache"], inputs["weights"], inputs["out_logits"],
                                 inputs["context_lens"], inputs["kv_indices"], inputs["max_model_len"], False,
                                 64).problem

    packed = problem_of()
    assert (packed.kv_block_stride, packed.kv_aligned16, packed.kv_32bit) == (0, True, True)
    pad4, pad16 = problem_of(block_stride_pad=4), problem_of(block_stride_pad=16)
    assert pad4.kv_block_stride == 64 * 132 + 4 and not pad4.kv_aligned16
    assert pad16.kv_block_stride == 64 * 132 + 16 and pad16.kv_aligned16
    assert not dataclasses.replace(packed, kv_base_aligned=False).kv_aligned16


def _layout(arch, layout, **shape):
    return mfma.layout_problem(common.problem_for(arch, MFMA.fp8[arch], dict(SHAPES[0], **shape)), {"layout": layout})


@pytest.mark.parametrize("arch", ARCHS)
def test_selection_uses_the_real_cache_layout(arch, monkeypatch):
    """Knob sets that fit a packed cache but spilled on the compiled layouts are not offered
    there (ChunkK 256 / WavePerEU 2 with prefetch: 4-byte gathers on a stride padded by 4 or an
    unaligned base; WavePerEU 4 with Q in VGPRs: 64-bit addresses past 2 GiB), and a row naming
    only ChunkK / WavePerEU resolves to a setting that fits the layout. The figures are Triton
    3.6's register allocation (later compilers' margin removes more knob sets on every layout)."""
    monkeypatch.setattr(mfma, "AMD_VGPR_MARGIN", 0)
    wide = {"ChunkK": 256, "WavePerEU": 2, "QInLDS": 0, "Prefetch": 1}
    assert MFMA.admits(_layout(arch, "packed"), wide) and MFMA.admits(_layout(arch, "pad16"), wide)
    for layout in ("pad4", "unaligned", "kv64_pad4"):
        problem = _layout(arch, layout)
        assert not MFMA.admits(problem, wide), layout
        assert wide not in [{k: c[k] for k in wide} for c in MFMA.candidates(problem)]
    w4 = {"ChunkK": 128, "WavePerEU": 4, "QInLDS": 0, "Prefetch": 1}
    assert MFMA.admits(_layout(arch, "packed"), w4) and not MFMA.admits(_layout(arch, "kv64"), w4)
    resolved = MFMA.knobs(_layout(arch, "kv64"), {"ChunkK": 128, "WavePerEU": 4})
    assert MFMA.admits(_layout(arch, "kv64"), {"ChunkK": 128, "WavePerEU": 4, "QInLDS": resolved["QInLDS"],
                                               "Prefetch": resolved["Prefetch"]})


@pytest.mark.parametrize("arch", ARCHS)
def test_layout_matrix_covers_every_chunk_and_occupancy_it_can(arch):
    """Every (ChunkK, WavePerEU) of the packed candidates is compiled on every layout, unless no
    Q/prefetch setting of it fits that layout (then it is not a candidate there)."""
    packed = {(c["ChunkK"], c["WavePerEU"]) for c in MFMA.candidates(_layout(arch, "packed"))}
    matrix = layout_matrix(arch)
    for layout in mfma.KV_LAYOUTS:
        if layout == "packed":
            continue
        problem = _layout(arch, layout)
        compiled = {(c["ChunkK"], c["WavePerEU"]) for c in matrix if c["layout"] == layout}
        for chunk, waves in packed - compiled:
            assert not any(MFMA.admits(problem, {"ChunkK": chunk, "WavePerEU": waves, "QInLDS": q, "Prefetch": pf})
                           for q in (0, 1) for pf in mfma.PREFETCHES if pf != 2 or not q), (layout, chunk, waves)
        assert {chunk for chunk, _ in compiled} == {64, 128, 256}, layout


# ----------------------------------------------------------------------------- KeyLoad
def _plain(arch, **shape):
    return common.problem_for(arch, MFMA.fp8[arch], dict(dict(SHAPES[1], preshuffle=False), **shape))


@pytest.mark.parametrize("arch", ARCHS)
def test_key_load_candidates_and_fit(arch):
    """``lds`` candidates exist for plain caches only; the direct candidates come first and are
    the ones without the knob; LDS per CU and VGPRs count the conversion."""
    plain, pre = _plain(arch), _plain(arch, preshuffle=True)
    cands = MFMA.candidates(plain)
    direct = [c for c in cands if "KeyLoad" not in c]
    assert cands[:len(direct)] == direct and any(c.get("KeyLoad") == "lds" for c in cands)
    assert not any("KeyLoad" in c for c in MFMA.candidates(pre))
    # Q staged in LDS (8448 B) plus 16 KiB of conversion scratch, x 4 programs: over gfx942's 64 KiB
    staged = {"ChunkK": 128, "WavePerEU": 4, "QInLDS": 1, "Prefetch": 0, "ReuseKV": 0}
    assert cdna_keys.lds_bytes(128, "lds") == cdna_keys.lds_bytes(256, "lds") == 16 * 1024
    assert (mfma.lds_bytes(1, 64, 1) + 16 * 1024) * 4 > 64 * 1024
    p64 = _plain(arch, heads=64, next_n=1)
    assert MFMA.admits(p64, staged) and MFMA.admits(p64, dict(staged, KeyLoad="lds")) == (arch == "gfx950")
    small = {"ChunkK": 128, "WavePerEU": 4, "QInLDS": 0, "Prefetch": 1, "ReuseKV": 0}
    assert not MFMA.admits(p64, dict(small, KeyLoad="lds"))  # spilled (measured)
    # the direct twin fits under Triton 3.6's compiler; later ones need a VGPR margin it lacks
    assert MFMA.admits(p64, small) == (AMD_VGPR_MARGIN == 0)


def test_key_load_knob_errors():
    plain, pre = _plain("gfx942"), _plain("gfx942", preshuffle=True)
    message = MFMA.check_config({"KeyLoad": "shared"}, plain)
    assert "KeyLoad" in message and "direct, lds" in message and "'shared'" in message
    message = MFMA.check_config({"KeyLoad": "lds"}, pre)
    assert "KeyLoad='lds'" in message and "Preshuffle" in message
    assert MFMA.check_config({"KeyLoad": "lds"}, plain) is None and MFMA.check_config({"KeyLoad": "lds"}) is None
    assert MFMA.check_config({"KeyLoad": "direct"}, pre) is None
    with pytest.raises(ValueError, match="KeyLoad"):
        MFMA.constexprs(pre, {"KeyLoad": "lds"}, True)


def test_cache_lines_per_key_load():
    """One 16-byte key load of a wave: the MFMA operand layout touches 32 rows x 32 bytes (32x32
    tiles) or 16 x 64 (16x16); the gather layout 8 whole 128-byte rows."""
    from triton.experimental.gluon import language as gl

    for chunk, direct in ((64, (16, 16)), (128, (32, 32)), (256, (32, 32))):
        operand = gl.DotOperandLayout(1, mfma.mfma_layout("gfx942", 64, chunk, "fp8"), 16)
        assert tuple(cdna_keys.cache_lines_per_load(operand, "direct", chunk, size) for size in (64, 128)) == direct
        assert tuple(cdna_keys.cache_lines_per_load(operand, "lds", chunk, size) for size in (64, 128)) == (16, 8)


@pytest.mark.parametrize("arch", ARCHS)
def test_key_load_picks_the_kernel_with_the_key_atoms(arch):
    """``KeyLoad=lds`` launches and compiles the entry point that takes ``KEY_LAYOUT`` /
    ``KEY_OPERAND``; ``direct`` the kernel without them, whose parameters are as before the knob."""
    fp8 = torch.float8_e4m3fnuz if arch == "gfx942" else torch.float8_e4m3fn
    inputs = make_inputs(2, 1, 64, [300, 45], kv_block_size=64, fp8_dtype=fp8, seed=3)
    args = build_launch_args(inputs["q_fp8"], inputs["kv_cache"], inputs["weights"], inputs["out_logits"],
                             inputs["context_lens"], inputs["kv_indices"], inputs["max_model_len"], False, 64)
    args.problem = dataclasses.replace(args.problem, arch=arch, cu_num=304)
    config = {"variant": "mfma", "ChunkK": 64, "WavePerEU": 2, "SplitKV": 2, "ReuseKV": 0, "QInLDS": 0,
              "Schedule": "split", "KeyLoad": "lds"}
    kernels = [register_mma_logits_kernel, register_mma_logits_kernel_key_layout]
    with simulated_device(GPUTarget("hip", arch, 64), kernels) as launches:
        BACKEND.launch(args, config)
        direct, lds = (compiled_kernels(kernel) for kernel in kernels)
    assert len(launches) == 1 and not direct and len(lds) == 1
    assert amd_resources(lds[0].asm["amdgcn"])["scratch_bytes"] == 0
    assert "ds_write_b128" in amd_loop_instructions(lds[0].asm["amdgcn"])
    spec = MFMA.compile_spec(arch, dict(SHAPES[1], **config))
    assert spec.fn is register_mma_logits_kernel_key_layout and "KeyLoadlds" in spec.name
    spec = MFMA.compile_spec(arch, dict(SHAPES[1], **dict(config, KeyLoad="direct")))
    assert spec.fn is register_mma_logits_kernel and "KeyLoad" not in spec.name and "KEY_LAYOUT" not in spec.signature


@pytest.mark.parametrize("arch", ARCHS)
def test_two_tile_prefetch_drops_the_per_tile_register_copies(arch, tmp_path):
    """``Prefetch=2`` scores two tiles per loop iteration from alternating registers: the loop holds
    twice the one-tile loop's MFMAs and key loads, no more register copies (``v_mov_b32``) than the
    one-tile loop has for one tile (which copies the prefetched keys where LLVM does not coalesce
    them: gfx950 19 -> 2 here), and fewer instructions per tile."""
    shape = dict(heads=32, next_n=1, kv_block_size=64, preshuffle=True, lens_2d=True)
    knobs = {"ChunkK": 128, "WavePerEU": 4, "QInLDS": 0, "ReuseKV": 0, "Schedule": "split", "SplitKV": 0,
             "Mfma": mfma.MFMA_KINDS[arch][0]}
    problem = common.problem_for(arch, MFMA.fp8[arch], shape)
    assert MFMA.knobs(problem, knobs)["Prefetch"] == 2  # the preferred setting where it fits
    one, two = compile_specs(MFMA.compile_specs(arch, [dict(shape, **knobs, Prefetch=p) for p in (1, 2)]),
                             str(tmp_path), progress=False)
    assert not check_records([one, two])
    loops = [amd_loop_instructions(open(r.isa).read()) for r in (one, two)]
    mfmas, loads, moves = ([sum(n for k, n in loop.items() if k.startswith(prefix)) for loop in loops]
                           for prefix in ("v_mfma", "buffer_load_dwordx4", "v_mov_b32"))
    assert mfmas[1] == 2 * mfmas[0] and loads[1] == 2 * loads[0] == 2 * 128 // 4 // 8
    assert moves[1] <= moves[0]
    assert sum(loops[1].values()) < 2 * sum(loops[0].values())
