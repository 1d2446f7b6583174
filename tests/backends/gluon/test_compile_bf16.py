"""CPU CI for bf16 logits in every gluon kernel family: each family cross-compiles with a bf16
output for every arch it targets, beside the fp32 twin of one of its configs, and the ISA shows
the one rounding at the store:

* sm_90: ``cvt.rn.bf16.f32`` (or its x2 form) in the PTX, ``F2FP.BF16.F32`` and 16-bit global
  stores (``STG.E.U16``) in the SASS;
* gfx950: ``v_cvt_pk_bf16_f32`` and 16-bit stores (``*_store_short*``);
* gfx942 (no bf16 convert instruction): the round-to-nearest-even sequence, ``v_bfe_u32 x, v,
  16, 1`` (the bit that breaks a tie) added with ``0x7fff`` by ``v_add3_u32``, ``v_cmp_o_f32``
  keeping NaN a NaN, and 16-bit stores.

The fp32 twins have none of these. Every kernel passes ``check_records`` (no spills or local
memory, native fp8 MMA, shared memory within the chip; off Triton 3.6, on which the sm_90 register
splits are calibrated, hot-loop spills are reported instead: ``sm90_calibration.py``). The configs cover every store path of
each family: wgmma's whole-tile, row-group and half-tile epilogues, the consumer-team kernel's
overlapped and plain consumers (with its ``-inf`` tail), register MMA with Q in registers and in
shared memory.
"""

from __future__ import annotations

import os
import sys
import re

import pytest

pytest.importorskip("triton.experimental.gluon")

from paged_mqa_logits.aot.compile import compile_specs  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sm90_calibration import problems_off_calibration  # noqa: E402
from paged_mqa_logits.backends.gluon import BACKEND, common, variants  # noqa: E402

SHAPES = (dict(heads=64, next_n=2, kv_block_size=64, preshuffle=False, lens_2d=True),
          dict(heads=64, next_n=3, kv_block_size=32, preshuffle=False, lens_2d=False))
#: knobs whose store path the defaults of SHAPES miss: the first candidate of the first shape
#: with them, else its default with them
EXTRA_PATHS = {"wgmma": ({"ChunkK": 128, "RowsPerMMA": 2}, {"RowsPerMMA": 1}),
               "wgmma_ws": ({"KeyCopy": "tma"},),
               "wgmma_pipes": ({"Overlap": 1},),
               "mma_v2": ({"ChunkK": 64, "num_warps": 4, "ReuseKV": 0, "QInLDS": 0},),
               "mfma": ({"QInLDS": 1, "ReuseKV": 1},)}
ARCH_VARIANTS = [(arch, v) for v in variants() for arch in v.archs]


def bf16_configs(variant, arch: str) -> list[dict]:
    """The defaults of :data:`SHAPES` and the variant's :data:`EXTRA_PATHS` (bf16 logits)."""
    out = []
    for shape in SHAPES:
        fields = dict(shape, logits_dtype="bf16")
        out.append(dict(fields, **variant.default_config(variant.spec_problem(arch, fields))))
    fields = dict(SHAPES[0], logits_dtype="bf16")
    problem = variant.spec_problem(arch, fields)
    candidates = variant.candidates(problem)
    for knobs in EXTRA_PATHS.get(variant.name, ()):
        chosen = next((c for c in candidates if all(c.get(k) == v for k, v in knobs.items())),
                      dict(variant.default_config(problem), **knobs))
        assert variant.check_config(chosen, problem) is None, (variant.name, chosen)
        out.append(dict(fields, **chosen))
    return out


def rounding_found(arch: str, isa_path: str) -> list[str]:
    """The bf16 rounding and 16-bit output stores ``arch``'s ISA shows (empty: none)."""
    isa = open(isa_path).read()
    if arch == "sm_90":
        found = re.findall(r"cvt\.rn\.bf16(?:x2)?\.f32", isa)
        sass_path = os.path.splitext(isa_path)[0] + ".sass"
        if os.path.exists(sass_path):
            sass = open(sass_path).read()
            found += re.findall(r"F2FP\.BF16\.F32\S*", sass) + re.findall(r"STG\.E\S*\.U16", sass)
        return found
    stores = re.findall(r"\b\w+_store_short\w*", isa)
    if arch == "gfx950":
        return re.findall(r"v_cvt_pk_bf16_f32", isa) + stores
    rne = [m for m in ("v_add3_u32", "v_cmp_o_f32") if m in isa] if re.search(r"v_bfe_u32 v\d+, v\d+, 16, 1", isa) else []
    return rne + stores


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """``[(arch, variant, config, spec, record)]``: the bf16 configs of every family and arch,
    and the fp32 twin of each one's first config."""
    out_dir = str(tmp_path_factory.mktemp("gluon_bf16"))
    rows = []
    for arch, variant in ARCH_VARIANTS:
        configs = bf16_configs(variant, arch)
        configs.append(dict(configs[0], logits_dtype="fp32"))
        rows += [(arch, variant, cfg, variant.compile_spec(arch, cfg)) for cfg in configs]
    records = compile_specs([spec for *_, spec in rows], out_dir, jobs=min(2, os.cpu_count() or 1), progress=False)
    return [row + (record,) for row, record in zip(rows, records)]


def test_every_family_compiles_bf16_logits_for_each_of_its_archs(compiled):
    assert {(arch, v.name) for arch, v, cfg, *_ in compiled if cfg["logits_dtype"] == "bf16"} == {
        (arch, v.name) for arch, v in ARCH_VARIANTS}
    assert {v.name for _, v in ARCH_VARIANTS} >= {"wgmma", "wgmma_ws", "wgmma_pipes", "mma_v2", "mfma"}
    problems = problems_off_calibration([record for *_, record in compiled])
    assert not problems, "\n".join(problems)


def test_the_output_pointer_type_and_name_follow_the_logits_dtype(compiled):
    names = [spec.name for *_, spec, _ in compiled]
    assert len(set(names)) == len(names)
    for _, _, cfg, spec, record in compiled:
        bf16 = cfg["logits_dtype"] == "bf16"
        assert spec.signature["out_ptr"] == ("*bf16" if bf16 else "*fp32"), spec.name
        assert ("_bf16" in spec.name) == bf16, spec.name
        assert record.knobs["logits_dtype"] == cfg["logits_dtype"]


def test_the_isa_rounds_once_at_a_16_bit_store(compiled):
    for arch, _, cfg, _, record in compiled:
        found = rounding_found(arch, record.isa)
        if cfg["logits_dtype"] == "fp32":
            assert not found, f"{record.name}: bf16 rounding or 16-bit stores in an fp32 kernel: {set(found)}"
            continue
        expected = {"sm_90": {"cvt.rn", "F2FP.BF16", "STG.E"}, "gfx950": {"v_cvt_pk_bf16_f32", "_store_short"},
                    "gfx942": {"v_add3_u32", "v_cmp_o_f32", "_store_short"}}[arch]
        missing = {e for e in expected if not any(e in f for f in found)}
        assert not missing, f"{record.name}: no {missing} in the ISA (found {set(found)})"


def test_table_rows_of_bf16_logits_build_bf16_kernels():
    """``compile --only-table``: a bf16 row and an fp32 row of one shape and knobs are two kernels."""
    knobs = BACKEND.default_config(common.problem_for("sm_90", "fn", SHAPES[0]))
    row = dict(SHAPES[0], arch="sm_90", cu_num=132, batch=8, context=None, kv_format="fp8", **knobs)
    specs = BACKEND.compile_specs("sm_90", [dict(row, logits_dtype="fp32"), dict(row, logits_dtype="bf16")])
    assert [s.signature["out_ptr"] for s in specs] == ["*fp32", "*bf16"]
