"""CPU CI for the sm_90 ``wgmma_fp4`` kernel (backends/gluon/kernels/wgmma_fp4.py): cross-compiled
for sm_90 and inspected, as test_compile_wgmma.py does for the fp8 kernel.

Matrix (``V.compile_matrix``): every candidate and the default of H 32/64 x next_n 1/2/3/4 x
KVBlockSize 32/64, the default with bf16 logits, the default at KVBlockSize 1/16/128/256; the
default run compiles a covering sample (every knob value, every heads x next_n, every block size
and logits dtype), ``-m slow`` all of it.

Each kernel must: compile; contain fp8 ``wgmma.mma_async ... m64nNk32.f32.e4m3.e4m3`` for exactly
the N of its row groups and no register MMA; widen with ``prmt`` (the table lookups) in its SASS;
not touch local memory in its tile loop (``sm90_calibration``: spills reported off the
calibrated Triton) and, on it, not at all; fit shared memory as estimated; and reach at least
the programs per SM the split rule sizes the grid for.
"""

from __future__ import annotations

import os
import re

import pytest

pytest.importorskip("triton.experimental.gluon")

from compile_matrix import SIZES, of_size  # noqa: E402
from headsum_code import tensor_head_sum_loops  # noqa: E402
from sm90_calibration import CALIBRATED, problems_off_calibration, ptxas_logs  # noqa: E402
from paged_mqa_logits.aot.compile import LDS_LIMIT_BYTES, compile_specs  # noqa: E402
from paged_mqa_logits.backends.gluon import common, wgmma_fp4 as h4  # noqa: E402
from paged_mqa_logits.backends.gluon import wgmma as wg  # noqa: E402
from paged_mqa_logits.backends.gluon.kernels.wgmma import row_groups  # noqa: E402

V = h4.VARIANT
ARCH = "sm_90"


def sample_knobs(config: dict) -> dict:
    return {k: config.get(k) for k in ("heads", "next_n", "kv_block_size", "logits_dtype", "ChunkK", "RowsPerMMA",
                                       "Schedule", "HeadSum")}


@pytest.fixture(scope="module", params=SIZES)
def compiled(request, tmp_path_factory):
    """(config, spec, record, ptxas log, SASS) for every kernel of the matrix's sample / all of it."""
    out_dir = str(tmp_path_factory.mktemp("wgmma_fp4_sm90"))
    configs = of_size(V.compile_matrix(ARCH), request.param, knobs_of=sample_knobs, together=(("heads", "next_n"),))
    specs = V.compile_specs(ARCH, configs)
    records = compile_specs(specs, out_dir, jobs=min(2, os.cpu_count() or 1), progress=False)
    logs = ptxas_logs(records)
    sass = [open(r.isa[:-len(".ptx")] + ".sass").read() if r.ok and os.path.exists(r.isa[:-len(".ptx")] + ".sass")
            else "" for r in records]
    return list(zip(configs, specs, records, logs, sass))


def test_matrix_covers_the_brief():
    configs = V.compile_matrix(ARCH)
    assert {c["next_n"] for c in configs} == {1, 2, 3, 4}
    assert {c["heads"] for c in configs} == {32, 64}
    assert {c["kv_block_size"] for c in configs} == {1, 16, 32, 64, 128, 256}
    assert {c.get("logits_dtype", "fp32") for c in configs} == {"fp32", "bf16"}
    assert {c["ChunkK"] for c in configs} == {64, 128}
    assert {c["Schedule"] for c in configs} == {"split", "balanced"}
    assert {c["HeadSum"] for c in configs} == {"fp32", "tensor"}


def test_kernels_compile_without_spills(compiled):
    problems = problems_off_calibration([record for _, _, record, _, _ in compiled])
    assert not problems, "\n".join(problems)


def test_fp8_wgmma_of_the_row_group_widths(compiled):
    for cfg, spec, record, _, _ in compiled:
        ptx = open(record.isa).read()
        found = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k32\.f32\.e4m3\.e4m3", ptx))
        groups = row_groups(cfg["next_n"], spec.constexprs["ROWS_PER_MMA"])
        assert found == {str(rows * cfg["heads"]) for _, rows in groups}, record.name
        assert not re.search(r"\bmma\.sync", ptx), f"{record.name}: register MMA in the wgmma kernel"


def test_the_widening_is_prmt_table_lookups(compiled):
    for _, _, record, _, sass in compiled:
        assert sass, f"{record.name}: no SASS"
        assert re.search(r"\bQGMMA\b", sass), f"{record.name}: no fp8 wgmma in the SASS"
        assert len(re.findall(r"\bPRMT\b", sass)) >= 4, f"{record.name}: the widening's prmt lookups are missing"


def test_no_local_memory(compiled):
    for _, _, record, log, _ in compiled:
        assert "Used" in log, f"{record.name}: no ptxas report:\n{log}"
        assert "serialized" not in log, f"{record.name}: ptxas serialised the wgmmas:\n{log}"
        spills = [int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", log)]
        if CALIBRATED:
            assert spills and not any(spills), f"{record.name}: spills:\n{log}"


def test_shared_memory_and_occupancy_as_estimated(compiled):
    for cfg, _, record, _, _ in compiled:
        p = V.spec_problem(ARCH, cfg)
        est = h4.resources(p, cfg["ChunkK"], cfg["RowsPerMMA"], cfg.get("HeadSum", "fp32"))
        smem = record.lds_bytes
        assert smem <= LDS_LIMIT_BYTES[ARCH]
        assert abs(smem - est["smem"]) <= 1024, f"{record.name}: shared {smem}, estimated {est['smem']}"
        if common.schedule_of(p, cfg) == common.BALANCED:
            continue  # the persistent grid is sized from the compiled kernel itself
        regs = -(-record.vgprs // 8) * 8
        actual = min(wg.SM_REGISTERS // (regs * 128), wg.SM_SHARED_BYTES // (smem + 1024))
        assert actual >= est["ctas_per_sm"], (f"{record.name}: {record.vgprs} registers and {smem} B shared allow "
                                              f"{actual} programs per SM, the split rule assumes {est['ctas_per_sm']}")


def test_tensor_head_sum_replaces_the_fp32_epilogue(compiled):
    """``HeadSum=tensor``: the tile loop packs the scores with ``F2FP.RELU.BF16.F32.PACK_AB`` into the
    head-sum wgmmas and issues none of the fp32 head sum's max, fused multiply-adds or shuffles, so
    the warpgroup's issue slots go to the widening (``headsum_code``)."""
    checked = 0
    for cfg, spec, record, _, _ in compiled:
        if cfg.get("HeadSum") != "tensor":
            continue
        p = V.spec_problem(ARCH, cfg)
        k = dict(V.knobs(p, cfg), RowSplit=1)
        assert len(tensor_head_sum_loops(record, p, k, k["ChunkK"])) == 1, record.name
        checked += 1
    assert checked >= 1
