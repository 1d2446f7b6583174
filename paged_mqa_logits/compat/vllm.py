"""vLLM's ``top_k_per_row_decode`` on top of :func:`paged_mqa_logits.topk`.

Replace ``ops.top_k_per_row_decode(...)`` with
``paged_mqa_logits.compat.vllm.top_k_per_row_decode(...)``: same arguments, same writes. Row
``r`` of the first ``num_rows`` rows (element strides ``stride0``, ``stride1``) belongs to
sequence ``r // next_n`` and sees positions ``p < seq_lens[b] - next_n + r % next_n + 1`` (or
``p < seq_lens[b, j]`` for 2-D ``seq_lens``); ``topk_indices[r]`` receives its ``topk_tokens``
largest positions, unsorted, and ``-1`` after the row's last position when it has fewer.
"""

from __future__ import annotations

import torch

from .topk_rows import per_row_decode

__all__ = ["top_k_per_row_decode"]

_NAMES = {"lengths": "seq_lens", "out": "topk_indices", "indices": "topk_indices", "k": "topk_tokens"}


def top_k_per_row_decode(logits: torch.Tensor, next_n: int, seq_lens: torch.Tensor, topk_indices: torch.Tensor,
                         num_rows: int, stride0: int, stride1: int, topk_tokens: int) -> None:
    """Write each row's ``topk_tokens`` largest visible positions into ``topk_indices`` (vLLM's op)."""
    per_row_decode("paged_mqa_logits.compat.vllm", _NAMES, logits, next_n, seq_lens, topk_indices, num_rows,
                   stride0, stride1, topk_tokens)
