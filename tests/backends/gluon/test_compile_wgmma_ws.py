"""CPU CI for the sm_90 warp-specialised ``wgmma_ws`` kernel (backends/gluon/wgmma_ws.py):
every candidate of the benchmark grid's shapes (H 32/64 x next_n 1-4, KVBlockSize 64) and the
default of other code paths (KVBlockSize 1/16 Preshuffle, 1-D lengths, next_n 5 and 8 at H 32)
and a cache block stride / q rows that are not 16-byte aligned (4-byte copies, plain-load Q)
is cross-compiled for sm_90 and inspected against what the host side
(backends/gluon/wgmma_ws.py) assumes; the rest of the host side is tested without
compiling in test_wgmma_ws_host.py.

Each kernel must compile; hold fp8 wgmmas of exactly its row groups' widths; fork into a
consumer and a producer partition with the register split the host assumes (``setmaxnreg``);
hand tiles over with per-thread ``cp.async.mbarrier.arrive.noinc``; not spill; and let
``CtasPerSM`` programs share an SM (registers and shared memory).
"""

from __future__ import annotations

import os
import re

import pytest

pytest.importorskip("triton.experimental.gluon")

from compile_matrix import SIZES, of_size  # noqa: E402
from headsum_code import tensor_head_sum_loops  # noqa: E402
from sm90_calibration import ptxas_logs  # noqa: E402
from paged_mqa_logits.backends.gluon import common  # noqa: E402
from paged_mqa_logits.backends.gluon import wgmma as wg  # noqa: E402
from paged_mqa_logits.backends.gluon import wgmma_ws as ws  # noqa: E402
from paged_mqa_logits.backends.gluon.kernels.wgmma import row_groups  # noqa: E402
from paged_mqa_logits.aot.compile import check_records, compile_specs  # noqa: E402
from paged_mqa_logits.problem import Problem  # noqa: E402
from test_wgmma_ws_host import ARCH, WS, problem  # noqa: E402


def fields_of(p: Problem) -> dict:
    key = p.shape_key
    return dict(heads=key.heads, next_n=key.next_n, kv_block_size=key.kv_block_size, preshuffle=key.preshuffle,
                lens_2d=p.lens_2d)


#: shapes whose every candidate compiles (the multi-consumer and TMA ones included); the other
#: grid shapes compile their single-consumer cp.async candidates
FULL_SHAPES = ((64, 2), (32, 4))


def ci_matrix() -> list[dict]:
    configs = []
    for heads, next_n in ((h, n) for h in (32, 64) for n in (1, 2, 3, 4)):
        p = problem(heads, next_n)
        configs += [dict(fields_of(p), **c) for c in WS.candidates(p)
                    if (heads, next_n) in FULL_SHAPES or (c["Consumers"] == 1 and c["KeyCopy"] == "gather")]
    others = [problem(64, 2, 1), problem(64, 2, 16, True), problem(32, 4, lens_2d=False), problem(32, 5),
              problem(32, 8)]
    configs += [dict(fields_of(p), **WS.default_config(p)) for p in others]
    # the 4-byte key copies and the plain-load Q path; there KeyCopy=tma falls back to the gather
    for key_copy in ("gather", "tma"):
        configs.append(dict(fields_of(problem(64, 2)), **{**WS.default_config(problem(64, 2)), "KeyCopy": key_copy},
                            block_stride_pad=4, q_misaligned=1))
    # TMA boxes of 16-token cache blocks (four per 64-token tile); none for a preshuffled cache
    for p in (problem(64, 2, 16), problem(64, 2, 64, True)):
        configs.append(dict(fields_of(p), **{**WS.default_config(p), "KeyCopy": "tma"}))
    # two consumers per tile of one row group: the second frees its slots unscored
    configs.append(dict(fields_of(problem(64, 1)), **{**WS.default_config(problem(64, 1)), "ChunkK": 64,
                                                       "CtasPerSM": 2, "num_stages": 4, "Consumers": 2, "RowSplit": 2}))
    return configs


@pytest.fixture(scope="module", params=SIZES)
def compiled(request, tmp_path_factory):
    out_dir = str(tmp_path_factory.mktemp("wgmma_ws_sm90"))
    # the sample keeps a TMA copy of each chunk and cache block size
    configs = of_size(ci_matrix(), request.param, together=(("KeyCopy", "ChunkK", "kv_block_size"),
                                                            ("HeadSum", "ChunkK", "RowSplit", "heads")))
    records = compile_specs(WS.compile_specs(ARCH, configs), out_dir, jobs=min(2, os.cpu_count() or 1),
                            progress=False)
    logs = ptxas_logs(records)
    return list(zip(configs, records, logs))


def test_matrix_covers_every_knob_value():
    configs = ci_matrix()
    assert {c["HeadSum"] for c in configs} == {"fp32", "tensor"}
    assert {c["CtasPerSM"] for c in configs} == {1, 2, 3}
    assert {c["Consumers"] for c in configs} == {1, 2, 3, 4}
    assert {c["RowSplit"] for c in configs} == {1, 2}
    assert {c["KeyCopy"] for c in configs} == {"gather", "tma"}
    assert {c["ChunkK"] for c in configs} == {64, 128}
    assert {c["RowsPerMMA"] for c in configs} >= {1, 2, 4, 8}


def test_kernels_compile_without_spills(compiled):
    problems = check_records([record for _, record, _ in compiled])
    assert not problems, "\n".join(problems)
    for _, record, log in compiled:
        spills = [int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", log)]
        assert spills and not any(spills), f"{record.name}: spills:\n{log}"
        assert "serialized" not in log, f"{record.name}: ptxas serialised the wgmmas:\n{log}"


def test_partitions_and_handover(compiled):
    for cfg, record, _ in compiled:
        ptx = open(record.isa).read()
        p = common.problem_for(ARCH, "fn", cfg)
        knobs = WS.knobs(p, cfg)
        chunk, rows, ctas, consumers, split = (knobs[k] for k in ("ChunkK", "RowsPerMMA", "CtasPerSM", "Consumers",
                                                                  "RowSplit"))
        wgmmas = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k32\.f32\.e4m3\.e4m3", ptx)
        groups = row_groups(cfg["next_n"], min(rows, wg._pow2_floor(cfg["next_n"])))
        assert set(wgmmas) == {str(n * cfg["heads"]) for _, n in groups}, record.name
        # every row group of a tile is scored once per team of RowSplit consumers: a split
        # consumer issues only its own groups' wgmmas (4 k-steps per 64 tokens each)
        assert len(wgmmas) == consumers // split * len(groups) * chunk // 64 * 4, (record.name, len(wgmmas))
        assert f".maxnreg {ws.max_registers(ctas, consumers)}" in ptx, record.name
        regs = {int(r) for r in re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)}
        assert {ws.PRODUCER_REGS[chunk], ws.consumer_registers(chunk, ctas, consumers)} <= regs, (record.name, regs)
        # each partition (every consumer, and the producer) syncs its own warpgroup on a named
        # barrier of its own: a consumer's barrier never waits for another consumer
        barriers = set(re.findall(r"\bbar\.sync\s+(\d+),\s*128;", ptx))
        assert len(barriers) == consumers + 1, (record.name, barriers)
        assert "cp.async.mbarrier.arrive.noinc.shared.b64" in ptx, record.name
        assert re.search(r"mbarrier\.try_wait\.parity", ptx), record.name


def test_keys_by_tma_where_the_cache_allows(compiled):
    """``KeyCopy=tma``: one TMA box per cache block of a tile, a byte-count arrive on the full
    barrier (which then expects the producer's 128 cp.async arrivals plus that one); a
    preshuffled or unaligned cache gathers instead."""
    seen = set()
    for cfg, record, _ in compiled:
        ptx = open(record.isa).read()
        p = common.problem_for(ARCH, "fn", cfg)
        knobs = WS.knobs(p, cfg)
        chunk = knobs["ChunkK"]
        box = ws.key_box(p, knobs["KeyCopy"], chunk, 4 if cfg.get("block_stride_pad") else 16)
        # (Triton 3.9 spells the state spaces shared::cta where 3.6 wrote shared::cluster / shared)
        boxes = re.findall(r"cp\.async\.bulk\.tensor\.3d\.shared::(?:cluster|cta)\.global\.mbarrier::complete_tx::bytes",
                           ptx)
        inits = set(re.findall(r"mbarrier\.init\.shared::cta\.b64 \[%r\d+\], (\d+);", ptx))
        if box:
            seen.add((cfg["kv_block_size"], chunk // box))
            assert len(boxes) == chunk // box, (record.name, len(boxes))
            assert re.search(rf"mbarrier\.arrive\.expect_tx\.shared(?:::cta)?\.b64 _, \[%r\d+\], {chunk * 128};", ptx), \
                record.name
            assert inits == {str(ws.PRODUCER_WARPS * 32 + 1), str(knobs["RowSplit"])}, (record.name, inits)
        else:
            assert not boxes and "expect_tx" not in ptx, record.name
            assert inits == {str(ws.PRODUCER_WARPS * 32), str(knobs["RowSplit"])}, (record.name, inits)
    assert {(64, 1), (64, 2), (16, 4)} <= seen, seen


def test_programs_per_sm_fit(compiled):
    """``CtasPerSM`` programs of 8 warps at ``maxnreg`` fill at most the register file, and
    their shared memory (plus the driver's 1 KB each) fits an SM."""
    for cfg, record, _ in compiled:
        knobs = WS.knobs(common.problem_for(ARCH, "fn", cfg), cfg)
        ctas, consumers = knobs["CtasPerSM"], knobs["Consumers"]
        threads = (consumers * ws.NUM_WARPS + ws.PRODUCER_WARPS) * 32
        assert ctas * threads * ws.max_registers(ctas, consumers) <= wg.SM_REGISTERS, record.name
        assert ctas * (record.lds_bytes + 1024) <= wg.SM_SHARED_BYTES, (record.name, record.lds_bytes)


def test_tensor_head_sum_replaces_the_fp32_epilogue(compiled):
    """``HeadSum=tensor``: in every consumer's tile loop, one ``F2FP.RELU.BF16.F32.PACK_AB`` per two
    of its scores and its head-sum wgmmas (bf16, N = a hi and a lo column per row, A from four
    registers), and none of the fp32 head sum's max, fused multiply-adds or shuffles; no local
    memory."""
    checked = 0
    for cfg, record, _ in compiled:
        if cfg.get("HeadSum") != "tensor":
            continue
        p = common.problem_for(ARCH, "fn", cfg)
        k = WS.knobs(p, cfg)
        loops = tensor_head_sum_loops(record, p, k, k["ChunkK"])
        assert len(loops) == k["Consumers"], (record.name, len(loops))
        checked += 1
    assert checked >= 4
