"""The error bound of ``HeadSum=tensor`` (docs/CONTRACT.md), on the arithmetic's model
(``reference.tensor_head_sum``): ``|ours - exact| <= 2^-8 * sum_h |w_h| relu(s_h)`` for adversarial
scores and weights; the GPU kernel is held to the same bound in
tests/backends/gluon/test_headsum_gpu.py."""

from __future__ import annotations

import pytest
import torch

from paged_mqa_logits.reference import tensor_head_sum

BOUND = 2.0 ** -8


def _exact(scores: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return (scores.double().relu() * weights.double()).sum(-1)


def _magnitude(scores: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return (scores.double().relu() * weights.double().abs()).sum(-1)


def _adversarial(heads: int, tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores over 2^-30..2^30 of both signs, weights of both signs over 2^-20..2^20, rows whose
    terms nearly cancel, scores just above and below bf16 rounding ties."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(tokens, heads, generator=gen) * torch.exp2(torch.randint(-30, 31, (tokens, heads),
                                                                               generator=gen).float())
    weights = torch.randn(heads, generator=gen) * torch.exp2(torch.randint(-20, 21, (heads,), generator=gen).float())
    ties = (1 + torch.arange(tokens).float()[:, None] * 2.0 ** -8 + 2.0 ** -9).expand(tokens, heads)
    scores[: tokens // 4] = ties[: tokens // 4] * torch.where(torch.rand(tokens // 4, heads, generator=gen) < 0.5,
                                                              1.0, 1 + 2.0 ** -20)
    cancel = weights.clone()
    cancel[heads // 2:] = -cancel[: heads - heads // 2]
    return scores, weights if seed % 2 else cancel


@pytest.mark.parametrize("heads", (32, 64))
@pytest.mark.parametrize("seed", range(6))
def test_bound_holds_on_adversarial_inputs(heads, seed):
    scores, weights = _adversarial(heads, 512, seed)
    err = (tensor_head_sum(scores, weights).double() - _exact(scores, weights)).abs()
    assert bool((err <= BOUND * _magnitude(scores, weights) + 1e-300).all()), float(
        (err / _magnitude(scores, weights)).max())


def test_bound_is_tight_enough_to_catch_a_coarser_rounding():
    """The same arithmetic with the scores rounded to fp8 e4m3 instead (2^-4) breaks the bound: the
    check can fail."""
    scores, weights = _adversarial(64, 512, 1)
    coarse = scores.relu().to(torch.float8_e4m3fn).float()
    err = (tensor_head_sum(coarse, weights).double() - _exact(scores, weights)).abs()
    assert not bool((err <= BOUND * _magnitude(scores, weights)).all())


def test_zero_and_negative_scores_contribute_nothing():
    scores = torch.tensor([[-3.0, 0.0, -0.0, -1e30]])
    assert float(tensor_head_sum(scores, torch.tensor([1.0, 2.0, 3.0, 4.0]))) == 0.0
