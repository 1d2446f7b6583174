"""CPU CI for the sm_90 ``wgmma_fp4_pipes`` kernel (backends/gluon/kernels/hopper_fp4_pipes.py),
cross-compiled for sm_90 and inspected against what its host side (backends/gluon/
hopper_fp4_pipes.py) assumes: fp8 wgmmas of each consumer's row-group widths (the pipes
consumers), the widening's ``PRMT`` in every producer's tile loop, the register split
(``setmaxnreg``), the mbarrier counts of the protocol (one release arrive per producer on
*full* and on Q *full*, every consumer thread on *empty* and Q *empty*), one arrive per
producer warpgroup after its named barrier, no local memory in the kernel on Triton 3.6 (in
any producer or consumer tile loop above all), shared memory within the host's estimate.

The default run compiles a sample covering the team shapes, both schedules, the overlapped
consumers, uneven row groups and KVBlockSize 32; ``-m slow`` compiles the whole compile matrix.
"""

from __future__ import annotations

import os
import re
import sys

import pytest

pytest.importorskip("triton.experimental.gluon")

from paged_mqa_logits.aot import sass  # noqa: E402
from paged_mqa_logits.aot.compile import compile_specs  # noqa: E402
from paged_mqa_logits.backends.gluon import hopper_fp4_pipes as fpp  # noqa: E402
from paged_mqa_logits.backends.gluon import hopper_pipes as hp  # noqa: E402
from paged_mqa_logits.backends.gluon import hopper_wgmma as wg  # noqa: E402
from paged_mqa_logits.triton_internals.toolchain import nvidia_tool  # noqa: E402

import triton  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sm90_calibration import CALIBRATED, problems_off_calibration  # noqa: E402

VARIANT = fpp.VARIANT
ARCH = "sm_90"


def _config(heads, next_n, consumers, split, rows, stages, schedule="balanced", ctas=1, **fields):
    shape = dict(heads=heads, next_n=next_n, kv_block_size=fields.pop("kv_block_size", 64), preshuffle=False,
                 lens_2d=fields.pop("lens_2d", True))
    return dict(shape, variant=VARIANT.name, ChunkK=64, Consumers=consumers, RowSplit=split, CtasPerSM=ctas,
                RowsPerMMA=rows, num_stages=stages, Schedule=schedule, SplitKV=0, num_warps=4, **fields)


SAMPLE = [
    _config(64, 2, 2, 1, 2, 3),  # two teams, two producers
    _config(64, 4, 2, 2, 2, 4),  # one team of a consumer pair
    _config(64, 2, 1, 1, 2, 4, ctas=2),  # one consumer, two programs per SM
    _config(32, 1, 2, 1, 1, 3, schedule="split", kv_block_size=32, lens_2d=False),
    _config(32, 3, 2, 1, 2, 3, logits_dtype="bf16"),  # uneven row groups (2 + 1 rows), bf16 logits
    _config(32, 1, 2, 1, 1, 4, Overlap=1),  # overlapped consumers
]


def _compiled(configs, tmp_path_factory):
    out_dir = str(tmp_path_factory.mktemp("fp4_pipes_sm90"))
    records = compile_specs(VARIANT.compile_specs(ARCH, configs), out_dir, jobs=min(2, os.cpu_count() or 1),
                            progress=False)
    return list(zip(configs, records))


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    return _compiled(SAMPLE, tmp_path_factory)


def _loops_without_dispatch(code, opcode):
    """Innermost loops holding ``opcode``, less the workers' dispatch loop (its span takes in the
    CTA-wide barrier 1 every partition meets at its start and end)."""
    return [loop for loop in sass.innermost_loops_with(code, opcode)
            if not any(re.fullmatch(r"BAR\.SYNC\S*\s+0x1\s*;?", i.text.strip()) for i in loop)]


def _innermost(found):
    """The loops of ``found`` that overlap no shorter loop of ``found``."""
    spans = [(lp[0].address, lp[-1].address) for lp in found]
    return [lp for lp, (a, b) in zip(found, spans)
            if not any(b2 - a2 < b - a and a2 <= b and a <= b2 for a2, b2 in spans)]


def _check(cfg, record):
    ptx = open(record.isa).read()
    p = VARIANT.spec_problem(ARCH, cfg)
    k = VARIANT.knobs(p, cfg)
    consumers, split, ctas = k["Consumers"], k["RowSplit"], k["CtasPerSM"]
    teams = consumers // split
    groups = wg.problem_row_groups(p, k["RowsPerMMA"])
    wgmmas = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k32\.f32\.e4m3\.e4m3", ptx)
    assert sorted(set(wgmmas)) == sorted({str(n * p.shape_key.heads) for _, n in groups}), record.name
    sites = 4 if k["Overlap"] else 1
    assert len(wgmmas) == teams * len(groups) * 4 * sites, (record.name, len(wgmmas))
    # the register split
    assert f".maxnreg {fpp.max_registers(ctas, consumers, split)}" in ptx, record.name
    regs = {int(r) for r in re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)}
    assert set(fpp.register_split(ctas, consumers, split)) <= regs, (record.name, regs)
    # the protocol's barrier counts: full and Q full take the producer's one release arrive;
    # empty every thread of the team's consumers, Q empty every consumer thread
    inits = re.findall(r"mbarrier\.init\.shared::cta\.b64 \[%r\d+\], (\d+);", ptx)
    slots = teams * k["num_stages"]
    assert sorted(inits) == sorted(["1"] * (slots + 2) + [str(128 * split)] * slots + [str(128 * consumers)] * 2), \
        (record.name, inits)
    # a producer's arrive on full comes from one thread after its warpgroup's named barrier
    arrives = re.findall(r"bar\.sync \t(\d+), 128;\s*\n(?:\s*(?://|\.loc).*\n)*\s*@%p\d+ mbarrier\.arrive\.shared", ptx)
    assert len(arrives) >= teams and "0" not in arrives, (record.name, arrives)
    # the producers' tile loops widen (PRMT); neither they nor the consumers' touch local memory
    code = sass.parse(open(record.isa[: -len(".ptx")] + ".sass").read())
    # (bf16 logits: the consumers' stores pack with PRMT too; a producer's loop has no wgmma)
    producers = [loop for loop in _loops_without_dispatch(code, "PRMT") if not any(i.opcode.startswith("QGMMA")
                                                                                  for i in loop)]
    consumers_loops = _loops_without_dispatch(code, "QGMMA")
    # (with bf16 logits the producers' -inf tail loops pack with a few PRMT too, and a rotated
    # layout can make one overlap a widening loop, which then is not the innermost PRMT loop: a
    # widening loop is the innermost of the loops with at least the 32 PRMT of a tile's eight
    # words per thread, four per word)
    widening = _innermost([loop for loop in sass.loops(code) if sum(i.opcode.startswith("PRMT") for i in loop) >= 32
                           and not any(i.opcode.startswith("QGMMA") for i in loop)])
    assert len(widening) >= teams, (record.name, len(widening), len(producers))
    assert len(consumers_loops) >= teams * min(split, len(groups)), (record.name, len(consumers_loops))
    # ... nor anything else: the producers' register share covers the per-sequence Q widening
    if CALIBRATED:
        assert not sass.local_memory(code), (record.name, len(sass.local_memory(code)))
    for loop in producers + widening + consumers_loops:
        spills = sass.local_memory(loop)
        if CALIBRATED:
            assert not spills, (record.name, [i.text for i in spills])
        elif spills:
            print(f"\n{record.name}: {len(spills)} local loads/stores in a tile loop under Triton {triton.__version__}")


def test_sample_compiles_and_checks(sample):
    problems = problems_off_calibration([record for _, record in sample])
    assert not problems, "\n".join(problems)
    assert all(record.ok for _, record in sample)
    for cfg, record in sample:
        _check(cfg, record)


def test_sample_configs_are_candidates_or_fit():
    """The sample is made of configs the host admits (what the tuner could pick)."""
    for cfg in SAMPLE:
        p = VARIANT.spec_problem(ARCH, cfg)
        assert VARIANT.admits(p, cfg), cfg


def test_shared_memory_within_the_estimate(sample):
    """At least the pipes' buffers (``hopper_pipes.shared_bytes``), at most the host's estimate
    with the compiler's scratch (``hopper_fp4_pipes.shared_bytes``), and ``CtasPerSM`` programs
    fit an SM."""
    for cfg, record in sample:
        p = VARIANT.spec_problem(ARCH, cfg)
        k = VARIANT.knobs(p, cfg)
        buffers = hp.shared_bytes(p, k["num_stages"], k["Consumers"], k["RowSplit"])
        estimate = fpp.shared_bytes(p, k["num_stages"], k["Consumers"], k["RowSplit"])
        assert buffers <= record.lds_bytes <= estimate, (record.name, record.lds_bytes, estimate)
        assert k["CtasPerSM"] * (record.lds_bytes + 1024) <= wg.SM_SHARED_BYTES, record.name


@pytest.mark.slow
def test_the_compile_matrix_compiles_and_checks(tmp_path_factory):
    if nvidia_tool("cuobjdump") is None:
        pytest.skip("no cuobjdump in this Triton wheel: the SASS checks need it")
    compiled = _compiled(VARIANT.compile_matrix(ARCH), tmp_path_factory)
    problems = problems_off_calibration([record for _, record in compiled])
    assert not problems, "\n".join(problems)
    for cfg, record in compiled:
        _check(cfg, record)
