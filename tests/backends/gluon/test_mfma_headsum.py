"""``HeadSum=tensor`` of the gfx950 ``mfma`` variant (backends/gluon/mfma.py, kernels/mfma.py;
decision and numbers in docs/AMD_HEADSUM.md): the weighted head sum as a bf16 MFMA.

CPU only. The arithmetic: the kernel's ReLU on packed bf16 bits equals rounding the ReLU'd fp32
score, for every bf16 pattern and the fp32 values around its rounding boundaries; its model
(K-block partial sums, hi/lo rows) keeps ``|err| <= 2^-8 * sum_h |w| relu(s)`` on adversarial
rows. The code: every shape the variant serves (heads 32/64, next_n 1-8, every block size,
Preshuffle, both MFMA kinds, every ChunkK, per-row and shared-KV programs) cross-compiles for
gfx950 without scratch; the hot loop carries the packed converts, the packed ReLU and the bf16
MFMAs (a quarter / eighth of the score MFMA's multiply-adds on 32x32 / 16x16 tiles), no fp32
ReLU, and no more LDS traffic than the fp32 head sum's. gfx942 rejects the knob.
"""

from __future__ import annotations

import os
import re

import pytest
import torch

pytest.importorskip("triton.experimental.gluon")

from paged_mqa_logits.aot.compile import amd_loop_instructions, check_records, compile_specs  # noqa: E402
from paged_mqa_logits.backends.gluon.variant import KnobError  # noqa: E402
from paged_mqa_logits.backends.gluon import common, mfma  # noqa: E402
from paged_mqa_logits.reference import tensor_head_sum  # noqa: E402

MFMA = mfma.VARIANT
ARCH = "gfx950"
BOUND = 2.0 ** -8


# ----------------------------------------------------------------------------- the arithmetic
def packed_relu(scores: torch.Tensor) -> torch.Tensor:
    """The kernel's ``relu_bf16``: round to bf16, then max with 0 as 16-bit integers."""
    return scores.to(torch.bfloat16).view(torch.int16).clamp(min=0).view(torch.bfloat16)


def mfma_head_sum_model(scores: torch.Tensor, weights: torch.Tensor, k_block: int) -> torch.Tensor:
    """``[T, H]`` scores, ``[H]`` weights -> ``[T]`` as the kernel sums: per row (hi, lo) an fp32
    chain over K blocks of ``k_block`` heads (one MFMA each), the two rows added last."""
    relu = packed_relu(scores).float()
    hi = weights.float().to(torch.bfloat16).float()
    lo = (weights.float() - hi).to(torch.bfloat16).float()
    rows = []
    for part in (hi, lo):
        acc = torch.zeros(scores.shape[0])
        for k in range(0, scores.shape[1], k_block):
            acc = acc + (relu[:, k:k + k_block] * part[k:k + k_block]).sum(-1)
        rows.append(acc)
    return rows[0] + rows[1]


def test_packed_relu_is_the_rounded_relu_around_every_rounding_boundary():
    """Every non-NaN bf16 pattern, with the fp32 low halves that round down, tie, and round up;
    the values are equal and never negative."""
    high = torch.arange(-32768, 32768, dtype=torch.int32)
    low = torch.tensor([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=torch.int32)
    values = ((high[:, None] << 16) | low[None, :]).reshape(-1).view(torch.float32)
    values = values[~values.isnan() & ~values.to(torch.bfloat16).isnan()]
    ours = packed_relu(values)
    expected = values.relu().to(torch.bfloat16)
    assert bool((ours.float() == expected.float()).all())  # bit for bit but the sign of relu(-0): +0 here
    assert int(ours.view(torch.int16).min()) == 0


def _rows(heads: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixed-sign weights across 2^-24..2^24 (some rows cancelling), scores across 2^-40..2^40 with
    runs of huge and tiny values, bf16 ties and their neighbours, exact zeros and negatives."""
    gen = torch.Generator().manual_seed(seed)
    tokens = 256
    magnitude = torch.exp2(torch.randint(-40, 41, (tokens, heads), generator=gen).float())
    scores = torch.randn(tokens, heads, generator=gen) * magnitude
    scores[:32] = 1 + (2 * torch.randint(0, 128, (32, heads), generator=gen).float() + 1) * 2.0 ** -9
    scores[32:64] = scores[:32] * (1 + 2.0 ** -22)
    scores[64:96, ::2] = 2.0 ** 38
    scores[64:96, 1::2] = 2.0 ** -38
    scores[96:128] = -scores[96:128].abs()
    weights = torch.randn(heads, generator=gen) * torch.exp2(torch.randint(-24, 25, (heads,), generator=gen).float())
    if seed % 2:
        weights[heads // 2:] = -weights[:heads // 2] * (1 + 2.0 ** -12)
    return scores, weights


@pytest.mark.parametrize("heads", (32, 64))
@pytest.mark.parametrize("k_block", (8, 16, 32))
@pytest.mark.parametrize("seed", range(4))
def test_model_keeps_the_bound_on_adversarial_rows(heads, k_block, seed):
    scores, weights = _rows(heads, seed)
    exact = (scores.double().relu() * weights.double()).sum(-1)
    magnitude = (scores.double().relu() * weights.double().abs()).sum(-1)
    ours = mfma_head_sum_model(scores, weights, k_block).double()
    assert bool(((ours - exact).abs() <= BOUND * magnitude).all()), float(((ours - exact).abs() / magnitude).max())
    # the blocked chain differs from the reference model only by fp32 summation order: within
    # H * 2^-24 of the magnitude (not of the result, which may cancel)
    reference = tensor_head_sum(scores, weights).double()
    assert bool(((ours - reference).abs() <= heads * 2.0 ** -24 * magnitude).all())


# ----------------------------------------------------------------------------- the code
SHAPES = [dict(heads=h, next_n=n, kv_block_size=64, preshuffle=True, lens_2d=True) for h in (32, 64) for n in range(1, 9)]
SHAPES += [dict(heads=h, next_n=n, kv_block_size=b, preshuffle=False, lens_2d=lens) for h, n, b, lens in
           ((64, 1, 1, True), (32, 2, 16, False), (64, 3, 256, True), (32, 4, 64, False))]
#: the shape whose every (ChunkK, ReuseKV / QInLDS, Mfma) combination is compiled
SPREAD = dict(heads=64, next_n=4, kv_block_size=64, preshuffle=True, lens_2d=True)


def tensor(config: dict) -> dict:
    return dict(config, HeadSum="tensor")


def headsum_matrix() -> list[dict]:
    configs = []
    for shape in SHAPES:
        problem = common.problem_for(ARCH, MFMA.fp8[ARCH], shape)
        configs.append(dict(shape, **tensor(MFMA.default_config(problem))))
    problem = common.problem_for(ARCH, MFMA.fp8[ARCH], SPREAD)
    seen = set()
    for cand in MFMA.candidates(problem):
        key = (cand["ChunkK"], cand["ReuseKV"], cand["QInLDS"], cand["Mfma"], cand.get("KeyLoad"))
        if key not in seen and cand["Schedule"] == common.SPLIT:
            seen.add(key)
            configs.append(dict(SPREAD, **tensor(cand)))
    return configs


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    configs = headsum_matrix()
    twins = [{k: v for k, v in c.items() if k != "HeadSum"} for c in configs if c["next_n"] == 4]
    out = str(tmp_path_factory.mktemp("cdna_headsum"))
    specs = MFMA.compile_specs(ARCH, configs + twins)
    records = compile_specs(specs, out, jobs=min(2, os.cpu_count() or 1), progress=False)
    return records[:len(configs)], records[len(configs):]


def test_every_tensor_head_sum_kernel_compiles_and_passes_the_checks(compiled):
    tensor_records, fp32_records = compiled
    assert not check_records(tensor_records + fp32_records), "\n".join(check_records(tensor_records + fp32_records))
    assert {r.knobs["HeadSum"] for r in tensor_records} == {"tensor"}
    assert not any("HeadSum" in r.knobs for r in fp32_records)
    covered = {(r.knobs["heads"], r.knobs["next_n"]) for r in tensor_records}
    assert covered >= {(h, n) for h in (32, 64) for n in range(1, 9)}
    assert {r.knobs["ChunkK"] for r in tensor_records} == {64, 128, 256}
    assert {r.knobs["Mfma"] for r in tensor_records} == {"fp8", "f8f6f4"}
    assert {r.knobs["kv_block_size"] for r in tensor_records} == {1, 16, 64, 256}


def _loop(record) -> dict[str, int]:
    with open(record.isa) as f:
        return amd_loop_instructions(f.read())


def _macs(loop: dict[str, int], pattern: str) -> int:
    total = 0
    for name, count in loop.items():
        m = re.search(r"_(\d+)x(\d+)x(\d+)", name)
        if m and re.search(pattern, name):
            total += count * int(m.group(1)) * int(m.group(2)) * int(m.group(3))
    return total


def test_hot_loop_runs_the_head_sum_on_the_matrix_cores(compiled):
    for r in compiled[0]:
        loop = _loop(r)
        tile = 32 if r.knobs["ChunkK"] >= 128 else 16
        assert loop.get("v_cvt_pk_bf16_f32") and loop.get("v_pk_max_i16"), (r.name, loop)
        assert not any(name.startswith("v_max_f32") for name in loop), (r.name, loop)
        # W [TILE, H] @ relu(S) [H, T] per row and tile: TILE / head_dim of the score product
        assert _macs(loop, "bf16") * 128 == _macs(loop, "fp8|f8f6f4") * tile, (r.name, loop)
        # one convert and one ReLU per two scores; programs reading Q and the weights from LDS per
        # tile also split the weights per tile (with Q in registers the split is hoisted)
        if r.knobs["QInLDS"]:
            assert loop["v_cvt_pk_bf16_f32"] > loop["v_pk_max_i16"], (r.name, loop)
        else:
            assert loop["v_cvt_pk_bf16_f32"] == loop["v_pk_max_i16"], (r.name, loop)


def test_head_sum_adds_no_lds_traffic(compiled):
    tensor_records, fp32_records = compiled
    fp32 = {r.name: _loop(r) for r in fp32_records}
    for r in tensor_records:
        twin = fp32.get(r.name.replace("_HeadSumtensor", ""))
        if twin is None:
            continue
        lds = lambda loop: sum(c for n, c in loop.items() if n.startswith("ds_"))
        assert lds(_loop(r)) <= lds(twin), (r.name, _loop(r), twin)


def test_gfx942_and_unknown_values_are_rejected():
    for arch, value, expected in (("gfx942", "tensor", "fp32 on gfx942"), (ARCH, "bf16", "one of")):
        problem = common.problem_for(arch, MFMA.fp8[arch], SPREAD)
        with pytest.raises(KnobError, match=expected):
            MFMA.knobs(problem, {"HeadSum": value})


def test_fp32_stays_the_default_and_keeps_its_names():
    problem = common.problem_for(ARCH, MFMA.fp8[ARCH], SPREAD)
    config = MFMA.default_config(problem)
    assert "HeadSum" not in MFMA.knobs(problem, config)
    assert MFMA.knobs(problem, tensor(config))["HeadSum"] == "tensor"
    assert not any("HeadSum" in c for c in MFMA.candidates(problem))


def test_the_sm90_twin_atom_compiles_into_the_register_mma_body(tmp_path, monkeypatch):
    """``kernels/mma_v2.py: mma_bf16_head_sum``, what the H100 / H200 run of the body's
    ``HEAD_SUM`` path uses (tests/backends/gluon/test_register_headsum_gpu.py): Q staged and in
    registers, a bf16 ``mma.sync`` besides the fp8 one, the packed bf16 convert, no local memory."""
    from paged_mqa_logits.backends.gluon import mma_v2
    from paged_mqa_logits.backends.gluon.kernels.mma_v2 import mma_bf16_head_sum

    monkeypatch.setattr(mma_v2.MmaV2Variant, "head_sum", lambda self, problem, knobs: mma_bf16_head_sum)
    shape = dict(heads=64, next_n=4, kv_block_size=64, preshuffle=False, lens_2d=True)
    configs = [dict(shape, ChunkK=64, num_warps=4, SplitKV=0, ReuseKV=1, QInLDS=1, Prefetch=0, Schedule="split"),
               dict(shape, ChunkK=64, num_warps=4, SplitKV=1, ReuseKV=0, QInLDS=0, Prefetch=1, Schedule="split")]
    records = compile_specs(mma_v2.VARIANT.compile_specs("sm_90", configs), str(tmp_path), jobs=1, progress=False)
    assert not check_records(records), check_records(records)
    for r in records:
        text = open(r.isa[:-4] + ".sass").read()
        assert re.search(r"HMMA\.16816\.F32\.BF16", text), r.name
        assert "F2FP.BF16.F32.PACK_AB" in text, r.name
        assert not re.search(r"\b(STL|LDL)\b", text), r.name
