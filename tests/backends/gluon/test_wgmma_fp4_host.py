"""The host side of the sm_90 ``wgmma_fp4`` variant (backends/gluon/wgmma_fp4.py), without a
GPU: the widening's torch model (the kernel runs its formulas bit for bit) checked exhaustively
against the MXFP4 format (paged_mqa_logits/fp4.py), the exponent-spread bound both ways, the
scale folding against the exact reference in float64, and the variant's support rules,
candidates, dispatch and launch arguments. The kernel is cross-compiled in
test_compile_wgmma_fp4.py."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("triton.experimental.gluon")

import torch  # noqa: E402

from paged_mqa_logits import dispatch  # noqa: E402
from paged_mqa_logits.backends.gluon import BACKEND, wgmma_fp4 as h4, variants  # noqa: E402
from paged_mqa_logits.backends.gluon.kernels import wgmma_fp4 as k4  # noqa: E402
from paged_mqa_logits.fp4 import E2M1_VALUES, dequantize_fp4, e2m1_values, ue8m0_words  # noqa: E402
from paged_mqa_logits.problem import Problem, Target  # noqa: E402
from paged_mqa_logits.reference import (FP4_DTYPE, calc_diff, make_inputs, reference_logits,  # noqa: E402
                                        unpack_kv_cache)
from test_wgmma_host import meta_launch_args, problem as fp8_problem, recorded_launches  # noqa: E402

V = h4.VARIANT
SPREADS = range(0, k4.E4M3_SPREAD_LIMIT + 1)  # shifts s = 6 - spread in -8..6


def problem(heads=64, next_n=1, kv_block_size=64, preshuffle=False, lens_2d=True, batch=32, logits_dtype="fp32",
            **overrides) -> Problem:
    p = fp8_problem(heads, next_n, kv_block_size, preshuffle, lens_2d, batch, **overrides)
    key = dataclasses.replace(p.shape_key, kv_format="fp4", logits_dtype=logits_dtype)
    return dataclasses.replace(p, shape_key=key)


def e4m3_values(words: torch.Tensor) -> torch.Tensor:
    """float32 values of the four e4m3 bytes of each 32-bit word (int64 tensor) -> [..., 4]."""
    as_bytes = torch.stack([(words >> (8 * i)) & 0xFF for i in range(4)], dim=-1).to(torch.uint8)
    return as_bytes.view(torch.float8_e4m3fn).float()


# ----------------------------------------------------------------------------- the widening
def test_prmt_model_follows_the_ptx_definition():
    a, b = torch.tensor(0x33221100), torch.tensor(0xF7665544)
    assert int(h4.prmt(a, b, torch.tensor(0x3210))) == 0x33221100
    assert int(h4.prmt(a, b, torch.tensor(0x4567))) == 0x445566F7
    assert int(h4.prmt(a, b, torch.tensor(0x000F))) == 0x000000FF  # byte 7 = 0xF7: top bit copied
    assert int(h4.prmt(a, b, torch.tensor(0x0009))) == 0x00000000  # byte 1 = 0x11: top bit 0


@pytest.mark.parametrize("spread", SPREADS)
def test_table_words_are_the_e4m3_bytes_of_every_magnitude(spread):
    low, high = h4.e4m3_table_words(torch.tensor(spread))
    got = torch.cat((e4m3_values(low), e4m3_values(high)))
    assert torch.equal(got, torch.tensor(E2M1_VALUES) * 2.0 ** (6 - spread)), spread


@pytest.mark.parametrize("spread", SPREADS)
def test_every_code_at_every_nibble_widens_exactly(spread):
    """Every code (both signs) at each of a word's eight nibbles, the others random: the two
    output words hold e4m3 bytes of exactly ``e2m1 * 2^(6 - spread)`` in element order."""
    gen = torch.Generator().manual_seed(spread)
    codes = torch.randint(0, 16, (16 * 8, 8), generator=gen)
    for code in range(16):
        for position in range(8):
            codes[code * 8 + position, position] = code
    words = sum(codes[:, i].long() << (4 * i) for i in range(8))
    low, high = h4.e4m3_table_words(torch.tensor(spread))
    first, second = h4.widen_word(words, low, high)
    got = torch.cat((e4m3_values(first), e4m3_values(second)), dim=-1)
    assert torch.equal(got, e2m1_values(codes) * 2.0 ** (6 - spread))


def test_the_kernel_reads_the_constants_the_model_is_checked_with():
    asm = k4._WIDEN_ASM.value
    assert f"{k4.SIGN_LOW_SELECTOR:#06x};" in asm and f"{k4.SIGN_HIGH_SELECTOR:#06x};" in asm
    assert "shl.b32 shifted, $2, 4;" in asm  # the low nibbles' sign bits moved to their bytes' top bit
    assert asm.count("prmt.b32") == 4 and "and.b32 sel, $2, 0x77777777;" in asm  # 3-bit magnitudes
    assert "shr.u32 hi, sel, 16;" in asm  # codes 4-7: the selector's high half
    assert (k4._LOW_12.value, k4._LOW_13.value, k4._LOW_14.value, k4._HIGH_14.value) == (
        k4.SUBNORMAL_LOW_WORDS[12], k4.SUBNORMAL_LOW_WORDS[13], k4.SUBNORMAL_LOW_WORDS[14], k4.SUBNORMAL_HIGH_WORDS[14])


def rows_with_exponents(exponents: list[list[int]], seed: int = 0):
    """Packed rows of random codes (every group holding nonzero codes) with the given exponents."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(1, 16, (len(exponents), 128), generator=gen)
    codes[codes == 8] = 1
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    return packed, ue8m0_words(torch.tensor(exponents))


def widened_values(packed, scale) -> torch.Tensor:
    """float64 values the kernel scores: e4m3 * 2^(M - 133)."""
    wide, top = h4.widen_to_e4m3(packed, scale)
    return wide.view(torch.float8_e4m3fn).double() * h4.scale_of_exponent(top).double()[..., None]


def test_spread_up_to_the_limit_is_exact():
    limit = k4.E4M3_SPREAD_LIMIT
    exponents = [[127, 127 - limit, 120, 127 - limit + 1], [1, 1, 1, 1], [250, 250 - limit, 246, 236],
                 [140, 127, 127 - 0, 140 - limit], [7, 6, 20, 20 - limit]]
    packed, scale = rows_with_exponents(exponents)
    assert torch.equal(widened_values(packed, scale), dequantize_fp4(packed, scale).double())


def test_spread_past_the_limit_reads_as_zero():
    """The documented bound (docs/CONTRACT.md): a group more than 14 binades below its row's
    largest exponent is not widened exactly (it reads as zero); the other groups are."""
    limit = k4.E4M3_SPREAD_LIMIT
    packed, scale = rows_with_exponents([[127, 127 - limit - 1, 127, 127], [200, 130, 200, 200 - limit]])
    got, exact = widened_values(packed, scale), dequantize_fp4(packed, scale).double()
    assert not torch.equal(got, exact)
    assert torch.equal(got[0, 32:64], torch.zeros(32, dtype=torch.float64))
    assert torch.equal(got[1, 32:64], torch.zeros(32, dtype=torch.float64))
    assert torch.equal(got[0, :32], exact[0, :32]) and torch.equal(got[0, 64:], exact[0, 64:])
    assert torch.equal(got[1, 96:], exact[1, 96:])


def test_row_factor_is_exact_for_every_exponent():
    top = torch.arange(256)
    assert torch.equal(h4.scale_of_exponent(top).double(), 2.0 ** (top.double() - 133))


def kernel_math(inp: dict) -> torch.Tensor:
    """The kernel's arithmetic in float64 on the widened operands: scores of e4m3 Q and K, ReLU,
    times (weight x head factor), summed over heads, times the token factor; ``-inf`` where
    the reference has it."""
    q, q_scale = inp["q_fp8"], inp["q_scale"]
    batch, next_n, heads, _ = q.shape
    bs = inp["kv_block_size"]
    keys, words = unpack_kv_cache(inp["kv_cache"], kv_block_size=bs, preshuffle=False, fp8_dtype=FP4_DTYPE)
    q_wide, q_top = h4.widen_to_e4m3(q, q_scale)
    k_wide, k_top = h4.widen_to_e4m3(keys, words)
    qv = q_wide.view(torch.float8_e4m3fn).double()  # [B, n, H, 128]
    kv = k_wide.view(torch.float8_e4m3fn).double()  # [blocks, bs, 128]
    weights = inp["weights"].double().view(batch, next_n, heads) * h4.scale_of_exponent(q_top).double()
    width = inp["max_model_len"]
    out = torch.empty(batch * next_n, width, dtype=torch.float64)
    table = inp["kv_indices"].clamp_min(0).long()
    for b in range(batch):
        tokens = torch.arange(width)
        pages = table[b, tokens // bs]
        k = kv[pages, tokens % bs]  # [width, 128]
        factor = h4.scale_of_exponent(k_top[pages, tokens % bs]).double()
        scores = torch.einsum("nhd,td->nht", qv[b], k).clamp_min(0)
        out[b * next_n:(b + 1) * next_n] = torch.einsum("nht,nh->nt", scores, weights[b]) * factor
    return out


@pytest.mark.parametrize("next_n,heads,bs", [(1, 32, 64), (3, 64, 32)])
def test_scale_folding_matches_the_exact_reference(next_n, heads, bs):
    lens = [150, 70, 1]
    inp = make_inputs(3, next_n, heads, lens, kv_block_size=bs, kv_format="fp4", seed=next_n, max_model_len=160)
    ref = reference_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"],
                           inp["max_model_len"], kv_block_size=bs, q_scale=inp["q_scale"])
    exact = kernel_math(inp)
    visible = torch.isfinite(ref)
    assert calc_diff(exact[visible], ref[visible].double()) < 1e-12
    # per logit: within fp32 accumulation rounding of the exact value
    assert torch.allclose(exact[visible], ref[visible].double(), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- the variant
def test_it_is_registered_and_serves_fp4_only():
    assert V in variants()
    assert V.unsupported(problem()) is None
    assert V.unsupported(problem(logits_dtype="bf16")) is None
    assert "fp4" in V.unsupported(fp8_problem()) and "fp8" in V.unsupported(fp8_problem())
    for other in variants():
        if "fp4" not in other.kv_formats:  # the fp8 variants decline it 
            assert "fp4" in other.unsupported(problem()), other.name
    assert "preshuffled" in V.unsupported(problem(preshuffle=True))
    assert "arch" in V.unsupported(dataclasses.replace(problem(), arch="gfx950", fp8="fn"))
    assert BACKEND.unsupported(problem()) is None
    assert BACKEND.default_config(problem())["variant"] == V.name


def test_the_dispatcher_picks_it_for_fp4_on_sm_90_without_a_table_row():
    p = problem(batch=3, next_n=3, heads=32)
    choice = dispatch.choose(p, Target.present("sm_90", 132))
    assert choice.backend == "gluon" and choice.config.get("variant", V.name) == V.name, choice
    pre = problem(preshuffle=True)
    assert dispatch.choose(pre, Target.present("sm_90", 132)).backend == "triton"  # declined: falls through


@pytest.mark.parametrize("heads,next_n", [(32, 1), (64, 1), (32, 2), (64, 2), (32, 4), (64, 4), (64, 3)])
def test_default_and_candidates_fit_and_are_few(heads, next_n):
    p = problem(heads=heads, next_n=next_n)
    default = V.default_config(p)
    assert V.check_config(default, p) is None and V.admits(p, default)
    candidates = V.candidates(p)
    fp32 = [c for c in candidates if c["HeadSum"] == "fp32"]
    assert 1 <= len(fp32) <= 8 and default["HeadSum"] == "fp32"
    # each fp32 setting at most once more with the head sum on the tensor cores, where it fits
    tensor = [dict(c, HeadSum="fp32") for c in candidates if c["HeadSum"] == "tensor"]
    assert len(fp32) + len(tensor) == len(candidates) and all(c in fp32 for c in tensor)
    assert all(V.admits(p, c) and V.check_config(c, p) is None for c in candidates)
    assert V.check_config(dict(default, num_stages=3), p) is not None  # no ring: no such knob


@pytest.mark.parametrize("heads,next_n,rows,chunk,admitted", [
    (64, 1, 1, 64, True), (64, 1, 1, 128, True), (64, 2, 2, 64, True), (32, 4, 4, 64, True),
    (64, 2, 2, 128, False),  # 128 accumulators, 64 packed, the prefetched words: past 255 registers
    (64, 4, 4, 64, False),  # one 256-column group: the same
])
def test_tensor_head_sum_fits_the_prefetch_registers(heads, next_n, rows, chunk, admitted):
    """``HeadSum=tensor`` is admitted where ``wgmma``'s tensor rule holds with the prefetched words'
    registers beside it, and the kernel gets ``HEAD_SUM``."""
    p = problem(heads=heads, next_n=next_n)
    config = {"ChunkK": chunk, "RowsPerMMA": rows, "Schedule": "balanced", "HeadSum": "tensor"}
    assert V.admits(p, config) is admitted
    assert V.constexprs(p, config)["HEAD_SUM"] == 1
    assert V.constexprs(p, dict(config, HeadSum="fp32"))["HEAD_SUM"] == 0


def meta_fp4_launch_args(p: Problem, block_pad: int = 0):
    args = meta_launch_args(p)
    key = p.shape_key
    block_bytes = key.kv_block_size * 68 + block_pad
    kv = torch.empty(50 * block_bytes, dtype=torch.uint8, device="meta").as_strided(
        (50, key.kv_block_size, 1, 68), (block_bytes, 68, 68, 1))
    q = torch.empty(key.batch, key.next_n, key.heads, 64, dtype=torch.uint8, device="meta")
    q_scale = torch.empty(key.batch, key.next_n, key.heads, dtype=torch.int32, device="meta")
    return dataclasses.replace(args, q=q, kv_cache=kv, q_scale=q_scale)


@pytest.mark.parametrize("schedule", ["split", "balanced"])
def test_launch_passes_the_query_exponents(schedule):
    p = problem(heads=32, next_n=2, kv_block_size=32)
    config = dict(V.default_config(p), Schedule=schedule)
    launch = recorded_launches(V, meta_fp4_launch_args(p, block_pad=4), config)[-1]  # (balanced: after a warm-up)
    assert launch["CHUNK"] == config["ChunkK"] and launch["KV_BLOCK_SIZE"] == 32
    assert launch["BALANCED"] == (schedule == "balanced")
    assert launch["signature"]["q_scale_ptr"] == "*i32" and launch["signature"]["q_ptr"] == "*u8"


def test_an_fp4_table_row_naming_no_variant_compiles_with_it():
    row = {"heads": 64, "next_n": 2, "kv_block_size": 64, "kv_format": "fp4", "ChunkK": 64, "RowsPerMMA": 2}
    (spec,) = BACKEND.compile_specs("sm_90", [row])
    assert spec.knobs["variant"] == V.name and spec.fn is V.kernel
    (fp8_spec,) = BACKEND.compile_specs("sm_90", [dict(row, kv_format="fp8", num_stages=4)])
    assert fp8_spec.knobs["variant"] == "wgmma"
