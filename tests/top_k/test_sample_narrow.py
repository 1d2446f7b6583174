"""``triton_sample.narrow`` (the seed's and the finish's search) on CPU through the interpreter: the key it
returns has its count in the window asked for, or, where ties leave no key in the window, is the largest key
with at least ``rank_low``; its count is the count of keys at or above it; with ``bracket``'s first probes
or without them. The probes cut the rounds where the values look normal."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from paged_mqa_logits.top_k.triton_sample import (  # noqa: E402
    bracket,
    narrow,
    normal_quantile,
    search_keys,
)
from paged_mqa_logits.triton_internals.interpreter import interpreted  # noqa: E402

ROWS, COLUMNS = 16, 64


@triton.jit
def _narrow_kernel(values_ptr, out_ptr, count, rank_low, rank_high, PROBES: tl.constexpr, ROWS: tl.constexpr,
                   COLUMNS: tl.constexpr):
    entries = tl.arange(0, ROWS)[:, None] * COLUMNS + tl.arange(0, COLUMNS)[None, :]
    live = entries < count
    x = tl.load(values_ptr + entries, mask=live, other=0.0).to(tl.float32)
    keys = search_keys(x, live, values_ptr)
    low, high, probe_low, probe_high = bracket(keys, x, live, count, (rank_low + rank_high) // 2, values_ptr, PROBES)
    threshold, above, rounds = narrow(keys, low, count, high, count * 0, rank_low, rank_high, probe_low, probe_high)
    tl.store(out_ptr, threshold.to(tl.int32))
    tl.store(out_ptr + 1, above.to(tl.int32))
    tl.store(out_ptr + 2, rounds.to(tl.int32))


@triton.jit
def _quantile_kernel(p_ptr, out_ptr, N: tl.constexpr):
    tl.store(out_ptr + tl.arange(0, N), normal_quantile(tl.load(p_ptr + tl.arange(0, N))))


def _narrow(values: torch.Tensor, count: int, rank_low: int, rank_high: int, probes: bool) -> tuple[int, int, int]:
    out = torch.zeros(3, dtype=torch.int32)
    interpreted(_narrow_kernel)[(1,)](values, out, count, rank_low, rank_high, PROBES=probes, ROWS=ROWS,
                                      COLUMNS=COLUMNS)
    return int(out[0]), int(out[1]), int(out[2])


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


@pytest.mark.parametrize("probes", [True, False], ids=["probes", "no_probes"])
@pytest.mark.parametrize("kind", ["normal", "outlier", "ties", "constant", "specials"])
@pytest.mark.parametrize("count, rank_low, rank_high", [(1024, 300, 375), (1024, 256, 256), (700, 699, 699),
                                                        (1024, 1024, 1024), (1000, 1, 1), (512, 40, 50)])
def test_narrow_finds_a_key_in_the_window(kind, count, rank_low, rank_high, probes):
    g = torch.Generator().manual_seed(count + rank_low)
    values = _rows(kind, g)
    threshold, above, _ = _narrow(values, count, rank_low, rank_high, probes)
    live = _keys(values)[:count].long()
    assert above == int((live >= threshold).sum())
    assert above >= rank_low
    if above > rank_high:  # ties: no key has a count in the window, so none above this one has rank_low
        assert int((live > threshold).sum()) < rank_low, (threshold, above)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_probes_take_fewer_rounds_on_normal_rows(dtype):
    """Standard-normal rows, the held row's exact search (rank 256 of 1024): the probes start from about a tenth
    of the keys; without them the first rounds halve the signs and exponents (the numpy model in
    ``bracket``'s docstring: about half the rounds on such rows). A probe that never steered, or steered
    wrong (for bf16 rows: a probe left in the fp32 key space while the keys are searched on their high 16
    bits), takes as many rounds as none."""
    with_probes, without = [], []
    for seed in range(6):
        values = torch.randn(ROWS * COLUMNS, generator=torch.Generator().manual_seed(seed)).to(dtype)
        with_probes.append(_narrow(values, 1024, 256, 256, True))
        without.append(_narrow(values, 1024, 256, 256, False))
        keys = _keys(values)
        if dtype == torch.bfloat16:
            keys = keys >> 16  # search_keys: a bf16 row is searched on its keys' high 16 bits
        # the same selection (the keys at or above either threshold): the probes steer only
        assert torch.equal(keys >= with_probes[-1][0], keys >= without[-1][0])
        assert with_probes[-1][1] == without[-1][1] == int((keys >= without[-1][0]).sum())
    assert sum(r[2] for r in with_probes) <= 0.7 * sum(r[2] for r in without), (with_probes, without)


def test_probes_either_side_of_zero_are_not_used():
    """A row of twice the rank, the target at the mean: the probes would lie either side of zero and leave a
    bracket across the sign, so ``bracket`` returns them equal and the search runs as without them, round for
    round."""
    for seed in range(3):
        values = torch.randn(ROWS * COLUMNS, generator=torch.Generator().manual_seed(seed))
        values -= values.median()  # the 512th largest of 1024 at zero
        assert _narrow(values, 1024, 512, 512, True) == _narrow(values, 1024, 512, 512, False)


def test_normal_quantile():
    p = torch.tensor([0.0, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 1.0, 0.3, 0.6, 0.8, 0.95, 0.05])
    out = torch.zeros_like(p)
    interpreted(_quantile_kernel)[(1,)](p, out, N=p.numel())
    normal = torch.distributions.Normal(0.0, 1.0)
    inside = (p >= 0.01) & (p <= 0.99)
    assert torch.allclose(out[inside], normal.icdf(p[inside]), atol=0.004)
    assert torch.allclose(out[[1, 9]], normal.icdf(p[[1, 9]]), atol=0.05)
    assert out[0] < -4.5 and out[10] > 4.5 and bool(torch.isfinite(out).all())
