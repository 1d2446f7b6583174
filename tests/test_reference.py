"""The reference itself, checked against an independent per-element implementation that reads
the cache bytes with the offset formulas of docs/CONTRACT.md directly."""

import math

import pytest
import torch

from paged_mqa_logits.reference import (
    FP8_MAX, calc_diff, make_inputs, pack_kv_cache, quantize_fp8, reference_logits,
    shuffle_block_keys, unpack_kv_cache, unshuffle_block_keys,
)


def naive_logits(inp):
    """Loop over rows and positions; byte offsets straight from docs/CONTRACT.md."""
    q, kv, w = inp["q_fp8"], inp["kv_cache"], inp["weights"]
    lens, table, mml = inp["context_lens"], inp["kv_indices"], inp["max_model_len"]
    kv_block_size, pre = inp["kv_block_size"], inp["preshuffle"]
    batch, next_n, heads, d = q.shape
    flat = kv.as_strided((kv.shape[0] * kv.stride(0),), (1,), kv.storage_offset())
    out = torch.full((batch * next_n, mml), float("-inf"), dtype=torch.float64)
    for b in range(batch):
        for j in range(next_n):
            if lens.dim() == 1:
                row_len = max(int(lens[b]) - next_n + j + 1, 0)
            else:
                row_len = max(int(lens[b, j]), 0)
            for p in range(min(row_len, mml, table.shape[1] * kv_block_size)):
                blk, t = int(table[b, p // kv_block_size]), p % kv_block_size
                base = blk * kv.stride(0)
                dims = torch.arange(d)
                if pre:
                    offs = (t // 16) * 16 * d + (dims // 16) * 256 + (t % 16) * 16 + dims % 16
                else:
                    offs = t * d + dims
                key = flat[base + offs].view(q.dtype).double()
                scale = flat[base + kv_block_size * d + 4 * t: base + kv_block_size * d + 4 * t + 4].view(torch.float32).double()
                scores = q[b, j].double() @ key * scale
                out[b * next_n + j, p] = (scores.relu() * w[b * next_n + j].double()).sum()
    return out


@pytest.mark.parametrize("kv_block_size,pre,lens_2d,next_n", [(16, True, True, 3), (1, False, False, 2), (32, False, True, 1), (64, True, False, 4)])
def test_reference_matches_naive(kv_block_size, pre, lens_2d, next_n):
    inp = make_inputs(2, next_n, 16, [37, 70], kv_block_size=kv_block_size, preshuffle=pre, lens_2d=lens_2d,
                      max_model_len=64, block_stride_pad=8, table_row_pad=2, seed=3)
    ref = reference_logits(inp["q_fp8"], inp["kv_cache"], inp["weights"], inp["context_lens"], inp["kv_indices"],
                           inp["max_model_len"], kv_block_size=kv_block_size, preshuffle=pre)
    naive = naive_logits(inp)
    assert torch.equal(torch.isfinite(ref), torch.isfinite(naive))
    valid = torch.isfinite(naive)
    assert calc_diff(ref[valid], naive[valid]) < 1e-10


def test_shuffle_formula_and_roundtrip():
    kv_block_size, d = 32, 128
    keys = torch.randint(0, 256, (3, kv_block_size, d), dtype=torch.uint8)
    shuffled = shuffle_block_keys(keys).reshape(3, -1)
    for t, dim in [(0, 0), (5, 17), (16, 127), (31, 64), (17, 15)]:
        offset = (t // 16) * 16 * d + (dim // 16) * 256 + (t % 16) * 16 + dim % 16
        assert torch.equal(shuffled[:, offset], keys[:, t, dim])
    assert torch.equal(unshuffle_block_keys(shuffle_block_keys(keys)), keys)
    with pytest.raises(ValueError, match="multiples of 16"):
        shuffle_block_keys(torch.zeros(1, 8, d, dtype=torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e4m3fnuz])
@pytest.mark.parametrize("pre", [False, True])
def test_pack_unpack_roundtrip(dtype, pre):
    x = torch.randn(5, 16, 128)
    x_fp8, scale = quantize_fp8(x, dtype)
    assert (scale > 0).all()
    assert x_fp8.float().abs().max() <= FP8_MAX[dtype]
    assert calc_diff(x_fp8.float() * scale[..., None], x) < 1e-3
    cache = pack_kv_cache(x_fp8, scale, preshuffle=pre, block_stride=16 * 132 + 64)
    assert cache.shape == (5, 16, 1, 132) and cache.stride(0) == 16 * 132 + 64
    keys, scales = unpack_kv_cache(cache, kv_block_size=16, preshuffle=pre, fp8_dtype=dtype)
    assert torch.equal(keys.view(torch.uint8), x_fp8.view(torch.uint8))
    assert torch.equal(scales, scale)
    with pytest.raises(ValueError, match="block_stride"):
        pack_kv_cache(x_fp8, scale, block_stride=16 * 132 - 4)


def test_make_inputs_honest_footprint():
    inp = make_inputs(3, 1, 16, [64, 65, 1], kv_block_size=32, seed=1)
    table = inp["kv_indices"]
    used = [table[0, :2], table[1, :3], table[2, :1]]
    ids = torch.cat(used)
    assert len(set(ids.tolist())) == ids.numel() == inp["kv_cache"].shape[0]  # one distinct block per token group
    assert (table[0, 2:] == -1).all() and (table[2, 1:] == -1).all()


def test_calc_diff():
    x = torch.randn(100)
    assert calc_diff(x, x) == pytest.approx(0, abs=1e-12)
    assert calc_diff(x, -x) == pytest.approx(2)
    assert calc_diff(torch.zeros(3), torch.zeros(3)) == 0.0
    assert math.isfinite(calc_diff(x, x * 1.01))


def test_reference_of_an_empty_batch_is_empty_rows_of_the_full_width():
    inp = make_inputs(1, 2, 16, [10], kv_block_size=16, max_model_len=32)
    ref = reference_logits(inp["q_fp8"][:0], inp["kv_cache"], inp["weights"][:0], inp["context_lens"][:0],
                           inp["kv_indices"][:0], 32, kv_block_size=16)
    assert ref.shape == (0, 32) and ref.dtype == torch.float32


@pytest.mark.parametrize("kv_format", ["fp8", "fp4"])
def test_make_inputs_draws_a_large_cache_in_chunks(monkeypatch, kv_format):
    """A cache past ``KEY_CHUNK_ELEMENTS`` is drawn and quantised a chunk at a time: same layout
    as one draw, every block its own keys (the draws go on from chunk to chunk), and the op's
    reference agrees with an independent float64 computation on it."""
    from paged_mqa_logits import reference
    whole = make_inputs(2, 1, 16, [96, 64], kv_block_size=32, seed=3, kv_format=kv_format)
    monkeypatch.setattr(reference, "KEY_CHUNK_ELEMENTS", 2 * 32 * 128)  # two blocks a chunk, 5 blocks
    chunked = make_inputs(2, 1, 16, [96, 64], kv_block_size=32, seed=3, kv_format=kv_format)
    cache = chunked["kv_cache"]
    assert (cache.shape, cache.stride(), cache.dtype) == (whole["kv_cache"].shape, whole["kv_cache"].stride(),
                                                          whole["kv_cache"].dtype)
    blocks = cache.view(cache.shape[0], -1)
    assert len({bytes(b.tolist()) for b in blocks}) == cache.shape[0]


def test_the_bench_builds_batch_4096_at_32k_within_an_h200():
    """The bench's largest default shape (64 heads, next_n 4, batch 4096, 32k) fits beside its
    build transient on a 141 GB GPU: the keys are no longer drawn all at once in float32."""
    from paged_mqa_logits.bench.shapes import Shape
    from paged_mqa_logits.bench.workload import _copy_footprint
    shape = Shape.of(64, 4, 4096, 32768)
    persistent, transient = _copy_footprint(shape, [32768] * 4096)
    assert persistent + transient < 120 * 2**30
