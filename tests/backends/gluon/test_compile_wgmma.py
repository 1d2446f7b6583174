"""CPU CI for the sm_90 ``wgmma`` kernel (backends/gluon/wgmma.py): every kernel the
candidate set can launch is cross-compiled for sm_90 and inspected, and the host side's
resource estimates (backends/gluon/wgmma.py) are checked against what ptxas did;
the rest of the host side is tested without compiling in test_wgmma_host.py.

Compile matrix (~65 kernels, ~1 minute on 2 cores):

* **every candidate and the default** of the benchmark grid's shapes: H 32/64 x next_n 1/2/4,
  KVBlockSize 64, plain cache, 2-D lengths (what the tuner times);
* **the default config** of every other code path: next_n 3, 5, 6, 7, 8 (uneven row groups,
  many groups) for H 32/64; KVBlockSize 1, 16, 32, 128, 256, plain and Preshuffle (16+);
  1-D lengths; H 16 and 128; a cache block stride that is not 16-byte aligned (4-byte
  cp.async path) with q rows that are not 16-byte aligned (plain-load Q path).

Each kernel must: compile; contain fp8 ``wgmma.mma_async ... m64nNk32.f32.e4m3.e4m3`` for exactly
the N of its row groups and no other MMA; not spill (no stack/local memory); not have its
wgmmas serialised by ptxas (``ptxas -v`` warns when registers run short); fit shared memory;
and reach at least the programs per SM that ``SplitKV = 0`` sizes the grid for.
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
from paged_mqa_logits.backends.gluon.kernels.wgmma import row_groups  # noqa: E402
from paged_mqa_logits.aot.compile import LDS_LIMIT_BYTES, check_records, compile_specs  # noqa: E402
from paged_mqa_logits.problem import Problem  # noqa: E402
from test_wgmma_host import ARCH, WG, problem  # noqa: E402


def shape_fields(p: Problem) -> dict:
    key = p.shape_key
    return dict(heads=key.heads, next_n=key.next_n, kv_block_size=key.kv_block_size, preshuffle=key.preshuffle,
                lens_2d=p.lens_2d)


def ci_matrix() -> list[dict]:
    """The compile configs of the module docstring, one per distinct kernel."""
    configs = []
    for heads in (32, 64):
        for next_n in (1, 2, 4):
            p = problem(heads, next_n)
            configs += [dict(shape_fields(p), **c) for c in WG.candidates(p) + [WG.default_config(p)]]
    others = [problem(h, n) for h in (32, 64) for n in (3, 5, 6, 7, 8)]
    others += [problem(64, 2, kv_block_size, pre) for kv_block_size in (1, 16, 32, 128, 256) for pre in (False, True) if not pre or kv_block_size % 16 == 0]
    others += [problem(32, 3, lens_2d=False), problem(64, 4, 16, True, lens_2d=False), problem(16, 4), problem(128, 2)]
    configs += [dict(shape_fields(p), **WG.default_config(p)) for p in others]
    configs.append(dict(shape_fields(problem(64, 2)), **WG.default_config(problem(64, 2)), block_stride_pad=4,
                        q_misaligned=1))
    out, seen = [], set()
    for cfg in configs:
        key = tuple(sorted((k, v) for k, v in cfg.items() if k != "SplitKV"))  # SplitKV: host only
        if key not in seen:
            seen.add(key)
            out.append(cfg)
    return out


@pytest.fixture(scope="module", params=SIZES)
def compiled(request, tmp_path_factory):
    """(config, spec, record, ptxas log) for every kernel of :func:`ci_matrix`."""
    out_dir = str(tmp_path_factory.mktemp("wgmma_sm90"))
    configs = of_size(ci_matrix(), request.param)
    specs = WG.compile_specs(ARCH, configs)
    records = compile_specs(specs, out_dir, jobs=min(2, os.cpu_count() or 1), progress=False)
    logs = ptxas_logs(records)
    return list(zip(configs, specs, records, logs))


def test_matrix_covers_every_knob_value():
    configs = ci_matrix()
    assert {c["ChunkK"] for c in configs} >= {64, 128}
    assert {c["RowsPerMMA"] for c in configs} >= {1, 2, 4, 8}
    assert {c["num_stages"] for c in configs} >= {3, 4, 6}
    assert {c["kv_block_size"] for c in configs} == {1, 16, 32, 64, 128, 256}
    assert {c["next_n"] for c in configs} == set(range(1, 9))
    assert {(c["preshuffle"], c["lens_2d"]) for c in configs} == {(False, True), (True, True), (False, False),
                                                                   (True, False)}


def test_kernels_compile_without_spills(compiled):
    problems = check_records([record for _, _, record, _ in compiled])
    assert not problems, "\n".join(problems)


def test_wgmma_fp8_of_the_row_group_widths(compiled):
    for cfg, spec, record, _ in compiled:
        ptx = open(record.isa).read()
        found = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k32\.f32\.e4m3\.e4m3", ptx))
        groups = row_groups(cfg["next_n"], spec.constexprs["ROWS_PER_MMA"])
        assert found == {str(rows * cfg["heads"]) for _, rows in groups}, record.name
        assert not re.search(r"\bmma\.sync", ptx), f"{record.name}: register MMA in the wgmma kernel"


def test_wgmma_not_serialised_and_no_local_memory(compiled):
    for _, _, record, log in compiled:
        assert "Used" in log, f"{record.name}: no ptxas report:\n{log}"
        assert "serialized" not in log, f"{record.name}: ptxas serialised the wgmmas:\n{log}"
        spills = [int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", log)]
        assert spills and not any(spills), f"{record.name}: spills:\n{log}"


def test_occupancy_at_least_what_the_split_rule_assumes(compiled):
    """Split: the grid is sized by :func:`wg.resources`' estimate, which must never promise
    more programs per SM than the compiled kernel allows. (Balanced: the grid is sized from the
    compiled kernel itself, see the next test.)"""
    for cfg, _, record, _ in compiled:
        p = common.problem_for(ARCH, "fn", cfg)
        if common.schedule_of(p, cfg) == common.BALANCED:
            continue
        est = wg.resources(p, cfg["ChunkK"], cfg["RowsPerMMA"], cfg["num_stages"], cfg.get("HeadSum", "fp32"))
        regs = -(-record.vgprs // 8) * 8
        smem = record.lds_bytes
        assert smem <= LDS_LIMIT_BYTES[ARCH]
        assert abs(smem - est["smem"]) <= 1024, f"{record.name}: shared {smem}, estimated {est['smem']}"
        actual = min(wg.SM_REGISTERS // (regs * 128), wg.SM_SHARED_BYTES // (smem + 1024))
        assert actual >= est["ctas_per_sm"], (f"{record.name}: {record.vgprs} registers and {smem} B shared allow "
                                              f"{actual} programs per SM, the split rule assumes {est['ctas_per_sm']}")


def test_balanced_grid_follows_the_compiled_kernels_occupancy(compiled):
    """The persistent grid is one wave: SMs x the programs the compiled kernel's registers and
    shared memory let an SM hold (or ``CtasPerSM`` when set)."""
    class Compiled:  # what Triton's CompiledKernel exposes once loaded
        def __init__(self, regs, shared):
            self.n_regs, self.metadata = regs, type("Metadata", (), {"shared": shared})()

        def _init_handles(self):
            pass

    p = problem(batch=64)
    cfg = dict(WG.default_config(p), Schedule="balanced")
    assert wg.resident_programs(Compiled(151, 50712)) == 3  # 152 regs x 128 threads: 3 per 64K
    assert wg.resident_programs(Compiled(96, 50712)) == 4  # then shared memory: 228K / 51.7K
    assert WG.grid(p, cfg, Compiled(151, 50712)) == ((132 * 3, 1), 1)
    assert WG.grid(p, dict(cfg, CtasPerSM=2), Compiled(151, 50712)) == ((132 * 2, 1), 1)
    assert WG.grid(p, dict(cfg, Schedule="split")) == ((WG.num_splits(p, cfg), 64), WG.num_splits(p, cfg))
    for cfg, _, record, _ in compiled:  # every balanced kernel is resident at least once per SM
        if cfg.get("Schedule") == "balanced":
            assert wg.resident_programs(Compiled(record.vgprs, record.lds_bytes)) >= 1, record.name


def test_row_groups():
    assert row_groups(7, 4) == ((0, 4), (4, 2), (6, 1))
    assert row_groups(8, 2) == ((0, 2), (2, 2), (4, 2), (6, 2))
    assert row_groups(3, 8) == ((0, 2), (2, 1))
    assert row_groups(1, 4) == ((0, 1),)


def test_tensor_head_sum_replaces_the_fp32_epilogue(compiled):
    """``HeadSum=tensor``: in the tile loop one ``F2FP.RELU.BF16.F32.PACK_AB`` per two scores and
    the head-sum wgmmas, none of the fp32 head sum's max, fused multiply-adds or shuffles; no local
    memory (``headsum_code``, as for ``wgmma_ws`` and ``wgmma_pipes``)."""
    checked = 0
    for cfg, _, record, _ in compiled:
        if cfg.get("HeadSum") != "tensor":
            continue
        p = common.problem_for(ARCH, "fn", cfg)
        k = dict(WG.knobs(p, cfg), RowSplit=1)
        assert len(tensor_head_sum_loops(record, p, k, k["ChunkK"])) == 1, record.name
        checked += 1
    assert checked >= 1  # the sample holds one (the slow set every candidate)
