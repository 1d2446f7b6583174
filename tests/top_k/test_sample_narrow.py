"""``triton_sample.narrow`` (the seed's and the finish's search) on CPU through the interpreter: the key it
returns has its count in the window asked for, or, where ties leave no key in the window, is the largest key
with at least ``rank_low``; its count is the count of keys at or above it."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from paged_mqa_logits.top_k.triton_sample import bracket, narrow  # noqa: E402
from paged_mqa_logits.top_k.triton_select import SIGN  # noqa: E402
from paged_mqa_logits.triton_internals.interpreter import interpreted  # noqa: E402

ROWS, COLUMNS = 16, 64


@triton.jit
def _narrow_kernel(keys_ptr, out_ptr, count, rank_low, rank_high, ROWS: tl.constexpr, COLUMNS: tl.constexpr):
    entries = tl.arange(0, ROWS)[:, None] * COLUMNS + tl.arange(0, COLUMNS)[None, :]
    live = entries < count
    keys = tl.where(live, tl.load(keys_ptr + entries, mask=live, other=0), SIGN)
    low, high = bracket(keys, live)
    threshold, above = narrow(keys, low, count, high, count * 0, rank_low, rank_high)
    tl.store(out_ptr, threshold.to(tl.int32))
    tl.store(out_ptr + 1, above.to(tl.int32))


def _keys(values: torch.Tensor) -> torch.Tensor:
    bits = values.float().view(torch.int32)
    keys = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return torch.where(torch.isnan(values), torch.full_like(keys, 0x7FFFFFFF), keys)


def _rows(kind: str, g: torch.Generator) -> torch.Tensor:
    n = ROWS * COLUMNS
    if kind == "normal":
        return torch.randn(n, generator=g)
    if kind == "outlier":  # one huge key: the interpolation's first guesses land far too low
        x = torch.randn(n, generator=g)
        x[5] = 1e30
        return x
    if kind == "ties":  # few distinct values: only the bracket's halving ends the search
        return torch.randint(0, 6, (n,), generator=g).float()
    if kind == "constant":
        return torch.full((n,), -0.25)
    if kind == "specials":  # NaN (the largest key), infinities and signed zeros among normal values
        x = torch.randn(n, generator=g)
        x[:40] = float("nan")
        x[40:80] = float("inf")
        x[80:200] = float("-inf")
        x[200:260] = -0.0
        x[260:300] = 0.0
        return x
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["normal", "outlier", "ties", "constant", "specials"])
@pytest.mark.parametrize("count, rank_low, rank_high", [(1024, 300, 375), (1024, 256, 256), (700, 699, 699),
                                                        (1024, 1024, 1024), (1000, 1, 1), (512, 40, 50)])
def test_narrow_finds_a_key_in_the_window(kind, count, rank_low, rank_high):
    g = torch.Generator().manual_seed(count + rank_low)
    keys = _keys(_rows(kind, g)).to(torch.int32)
    out = torch.zeros(2, dtype=torch.int32)
    interpreted(_narrow_kernel)[(1,)](keys, out, count, rank_low, rank_high, ROWS=ROWS, COLUMNS=COLUMNS)
    live = keys[:count].long()
    threshold, above = int(out[0]), int(out[1])
    assert above == int((live >= threshold).sum())
    assert above >= rank_low
    if above > rank_high:  # ties: no key has a count in the window, so none above this one has rank_low
        assert int((live > threshold).sum()) < rank_low, (threshold, above)
