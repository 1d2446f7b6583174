"""The balanced schedule (``paged_mqa_logits/schedule.py``): the plain Python model, and the
portable Triton kernel's device-side share computation run through the interpreter against it.

The model is what every GPU kernel's device code implements (Gluon: ``common.balanced_share``,
Triton: ``triton_portable._balanced_share``, FlyDSL: its plan); the H200 runs check the Gluon
one numerically (tests/backends/test_schedule_gpu.py).
"""

from __future__ import annotations

import random

import pytest
import torch

from paged_mqa_logits import schedule
from paged_mqa_logits.schedule import Segment, locate, program_segments, share, split_segments, tile_counts


def _ragged_counts(rng: random.Random, batch: int, zero_fraction: float = 0.3) -> list[int]:
    return [0 if rng.random() < zero_fraction else rng.randint(1, 40) for _ in range(batch)]


CASES = [
    ([5], 1), ([5], 7), ([0, 0, 3, 0], 4), ([1] * 17, 5), ([100, 0, 0, 1, 0, 37], 9),
    ([0, 0, 0], 3), ([3, 3, 3], 100),
]


@pytest.mark.parametrize("counts, programs", CASES + [
    (_ragged_counts(random.Random(seed), batch), programs)
    for seed, (batch, programs) in enumerate([(8, 3), (64, 132), (200, 264), (1024, 528), (33, 1), (7, 1000)])])
def test_every_item_is_covered_exactly_once_and_shares_differ_by_at_most_one(counts, programs):
    seen: dict[tuple[int, int], int] = {}
    sizes = []
    for p in range(programs):
        segments = program_segments(counts, p, programs)
        sizes.append(sum(s.stop_tile - s.first_tile for s in segments))
        for seg in segments:
            assert counts[seg.seq] > 0, "a segment in a zero-length sequence"
            assert 0 <= seg.first_tile < seg.stop_tile <= counts[seg.seq]
            for tile in range(seg.first_tile, seg.stop_tile):
                seen[(seg.seq, tile)] = seen.get((seg.seq, tile), 0) + 1
        # a program walks its sequences in order, at most one segment per sequence
        assert [s.seq for s in segments] == sorted({s.seq for s in segments})
    expected = {(b, t) for b, n in enumerate(counts) for t in range(n)}
    assert set(seen) == expected and all(v == 1 for v in seen.values())
    assert max(sizes) - min(sizes) <= 1, "shares must be equal within one tile"
    assert sum(sizes) == sum(counts)


def test_a_share_may_end_inside_a_sequence_and_the_next_begins_there():
    counts = [10, 10]
    assert program_segments(counts, 0, 3) == [Segment(0, 0, 6)]
    assert program_segments(counts, 1, 3) == [Segment(0, 6, 10), Segment(1, 0, 3)]
    assert program_segments(counts, 2, 3) == [Segment(1, 3, 10)]


def test_locate_and_share_follow_the_device_formulas():
    counts = [0, 3, 0, 2, 4]
    cum = [0, 3, 3, 5, 9]  # inclusive prefix sums
    for item in range(sum(counts)):
        seq = sum(c <= item for c in cum)
        before = max([c for c in cum if c <= item], default=0)
        assert locate(counts, item) == (seq, item - before)
    with pytest.raises(IndexError):
        locate(counts, 9)
    # 64-bit products: total * program passes 2^31 on large chips
    assert share(3_000_000, 1000, 1056) == (3_000_000 * 1000 // 1056, 3_000_000 * 1001 // 1056)


def test_tile_counts_and_split_segments():
    assert tile_counts([0, 1, 64, 65, -3], 64) == [0, 1, 1, 2, 0]
    assert split_segments([10], 0, 0, 3) == [Segment(0, 0, 3)]
    assert split_segments([10], 0, 2, 3) == [Segment(0, 6, 10)]
    assert split_segments([1], 0, 1, 4) == []
    assert schedule.persistent_programs(132, 3) == 396 and schedule.persistent_programs(0, 2) == 2


# ----------------------------------------------------------------------------- device code on CPU
triton = pytest.importorskip("triton")
tl = triton.language

from paged_mqa_logits.triton_internals.interpreter import interpreted  # noqa: E402
from paged_mqa_logits.backends.triton_portable import _balanced_share  # noqa: E402


@triton.jit
def _shares_kernel(lens_ptr, out_ptr, batch, stride_lens_b, stride_lens_j, max_model_len, max_blocks,
                   NEXT_N: tl.constexpr, LENS_2D: tl.constexpr, KV_BLOCK_SIZE: tl.constexpr, CHUNK: tl.constexpr):
    """Each program stores the ``(start, stop, seq, tile)`` the op's kernel would start from."""
    p = tl.program_id(0)
    start, stop, seq, tile = _balanced_share(lens_ptr, batch, stride_lens_b, stride_lens_j, max_model_len, max_blocks,
                                             p, tl.num_programs(0), NEXT_N, LENS_2D, KV_BLOCK_SIZE, CHUNK)
    tl.store(out_ptr + p * 4 + 0, start)
    tl.store(out_ptr + p * 4 + 1, stop)
    tl.store(out_ptr + p * 4 + 2, seq)
    tl.store(out_ptr + p * 4 + 3, tile)


def device_shares(lens: torch.Tensor, programs: int, next_n: int, max_model_len: int, max_blocks: int,
                  kv_block_size: int, chunk: int) -> list[tuple[int, int, int, int]]:
    out = torch.full((programs, 4), -1, dtype=torch.int32)
    stride_j = lens.stride(1) if lens.dim() == 2 else 1
    interpreted(_shares_kernel)[(programs,)](lens, out, lens.shape[0], lens.stride(0), stride_j, max_model_len,
                                             max_blocks, NEXT_N=next_n, LENS_2D=lens.dim() == 2, KV_BLOCK_SIZE=kv_block_size,
                                             CHUNK=chunk)
    return [tuple(int(v) for v in row) for row in out.tolist()]


def expected_shares(ends: list[int], programs: int, chunk: int) -> list[tuple[int, int, int, int]]:
    counts = tile_counts(ends, chunk)
    out = []
    for p in range(programs):
        start, stop = share(sum(counts), p, programs)
        seq, tile = locate(counts, start) if start < stop else (None, None)
        out.append((start, stop, seq, tile))
    return out


@pytest.mark.parametrize("batch, programs, lens_2d", [(5, 3, True), (600, 7, False), (1030, 11, True)])
def test_triton_device_share_matches_the_model(batch, programs, lens_2d):
    """Batches past one scan block (512 sequences), zero-length and negative rows, lengths
    past ``max_model_len`` and the table width: the kernel's prefix sum agrees with the model."""
    rng = random.Random(batch)
    next_n, chunk, kv_block_size, max_model_len, max_blocks = 3, 64, 16, 5000, 200  # table width 3200 tokens
    seq_lens = [0 if rng.random() < 0.25 else rng.randint(1, 6000) for _ in range(batch)]
    if lens_2d:
        rows = [[max(n - next_n + j + 1, 0) if rng.random() > 0.1 else -5 for j in range(next_n)] for n in seq_lens]
        lens = torch.tensor(rows, dtype=torch.int32)
        seq_lens = [max(max(r), 0) for r in rows]
    else:
        lens = torch.tensor(seq_lens, dtype=torch.int32)
    ends = [min(n, max_model_len, max_blocks * kv_block_size) for n in seq_lens]
    got = device_shares(lens, programs, next_n, max_model_len, max_blocks, kv_block_size, chunk)
    want = expected_shares(ends, programs, chunk)
    for (start, stop, seq, tile), (w_start, w_stop, w_seq, w_tile) in zip(got, want):
        assert (start, stop) == (w_start, w_stop)
        if start < stop:
            assert (seq, tile) == (w_seq, w_tile)
