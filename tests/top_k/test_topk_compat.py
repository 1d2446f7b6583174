"""AITER's and vLLM's ``top_k_per_row_decode`` on CPU: the engines' row rules, strides, padding,
AITER's stable order and the engines' argument names in errors."""

from __future__ import annotations

import pytest
import torch

from paged_mqa_logits import PagedMQAArgumentError
from paged_mqa_logits.compat import aiter, vllm

from topk_cases import assert_exact


def _rows(batch=3, next_n=2, width=120, seed=0):
    g = torch.Generator().manual_seed(seed)
    storage = torch.randn(batch * next_n, width + 8, generator=g)  # padded rows: stride0 > width
    logits = storage[:, :width]
    seq_lens = torch.tensor([120, 3, 60][:batch], dtype=torch.int32)
    return logits, seq_lens


@pytest.mark.parametrize("entry", ["vllm", "aiter"])
def test_decode_rows(entry):
    logits, seq_lens = _rows()
    k = 16
    indices = torch.full((6, k), 7, dtype=torch.int32)
    if entry == "vllm":
        vllm.top_k_per_row_decode(logits, 2, seq_lens, indices, 6, logits.stride(0), logits.stride(1), k)
    else:
        assert aiter.top_k_per_row_decode(logits, 2, seq_lens, indices, 6, logits.stride(0), 1, k) is indices
    assert_exact(indices, logits, seq_lens, 2, k)
    assert bool((indices[2, 2:] == -1).all())  # sequence 1, row 0 sees positions 0 and 1 only


def test_num_rows_leaves_the_rest_untouched():
    logits, seq_lens = _rows(batch=1, next_n=1)
    indices = torch.full((3, 8), 7, dtype=torch.int32)
    vllm.top_k_per_row_decode(logits[:1], 1, seq_lens[:1], indices, 1, logits.stride(0), 1, 8)
    assert bool((indices[1:] == 7).all())
    assert_exact(indices[:1], logits[:1], seq_lens[:1], 1, 8)


def test_aiter_stable_order():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.5, 2.0, 3.0]])
    seq_lens = torch.tensor([6], dtype=torch.int32)
    indices = torch.empty(1, 4, dtype=torch.int32)
    aiter.top_k_per_row_decode(logits, 1, seq_lens, indices, 1, 6, 1, k=4, stable=True)
    assert indices.tolist() == [[1, 2, 5, 4]]
    indices = torch.empty(1, 8, dtype=torch.int32)
    aiter.top_k_per_row_decode(logits, 1, torch.tensor([3], dtype=torch.int32), indices, 1, 6, 1, k=8, stable=True)
    assert indices.tolist() == [[1, 2, 0, -1, -1, -1, -1, -1]]


@pytest.mark.parametrize("call, argument", [
    (lambda l, s, i: vllm.top_k_per_row_decode(l, 2, s.long(), i, 6, l.stride(0), 1, 16), "seq_lens"),
    (lambda l, s, i: vllm.top_k_per_row_decode(l, 2, s, i[:, :8], 6, l.stride(0), 1, 16), "topk_indices"),
    (lambda l, s, i: vllm.top_k_per_row_decode(l, 2, s, i, 7, l.stride(0), 1, 16), "num_rows"),
    (lambda l, s, i: vllm.top_k_per_row_decode(l, 2, s, i, 6, 10**6, 1, 16), "stride0"),
    (lambda l, s, i: aiter.top_k_per_row_decode(l, 2, s.long(), i, 6, l.stride(0), 1, 16), "seqLens"),
    (lambda l, s, i: aiter.top_k_per_row_decode(l, 2, s, i, 6, l.stride(0), 1, 16, stable=1), "stable"),
    (lambda l, s, i: aiter.top_k_per_row_decode(l, 2, s, i, 6, l.stride(0), 1, 16, workspace=3), "workspace"),
])
def test_errors_name_the_engines_argument(call, argument):
    logits, seq_lens = _rows()
    indices = torch.zeros(6, 16, dtype=torch.int32)
    with pytest.raises(PagedMQAArgumentError, match=f"argument `{argument}`"):
        call(logits, seq_lens, indices)
    assert bool((indices == 0).all())
