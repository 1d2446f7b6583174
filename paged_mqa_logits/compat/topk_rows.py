"""What AITER's and vLLM's ``top_k_per_row_decode`` share: a strided view of the logits rows,
the engines' argument names in errors, and the write into the caller's ``indices``."""

from __future__ import annotations

import torch

from ..errors import PagedMQAArgumentError, renamed
from ..top_k import topk


def per_row_decode(entry: str, names: dict, logits, next_n, seq_lens, indices, num_rows, stride0, stride1, k,
                   backend=None) -> torch.Tensor:
    """Top-k of rows ``logits[r, :]`` (``r < num_rows``, element strides ``stride0``/``stride1``) into
    ``indices[:num_rows]``; ``names`` maps the op's argument names to the entry point's."""

    def fail(name, expected, got):
        raise PagedMQAArgumentError(f"{entry}: argument `{names.get(name, name)}`: expected {expected}, got {got}")

    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        fail("logits", "a 2-D torch.Tensor", getattr(logits, "shape", type(logits).__name__))
    for name, value in (("num_rows", num_rows), ("stride0", stride0), ("stride1", stride1), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "num_rows" else 1):
            fail(name, "an int >= 0" if name == "num_rows" else "an int >= 1", repr(value))
    width = logits.shape[1]
    if num_rows > logits.shape[0]:
        fail("num_rows", f"<= logits.shape[0]={logits.shape[0]}", num_rows)
    if num_rows and (stride0, stride1) != tuple(logits.stride()):
        # any strides are served, as long as they address only the tensor's own elements
        last = logits.storage_offset() + (num_rows - 1) * stride0 + max(width - 1, 0) * stride1
        if last >= logits.untyped_storage().nbytes() // logits.element_size():
            fail("stride0", "strides that stay inside `logits`' storage", f"({stride0}, {stride1})")
    rows = logits.as_strided((num_rows, width), (stride0, stride1), logits.storage_offset())
    if not isinstance(indices, torch.Tensor) or indices.dim() != 2 or indices.shape[1] != k \
            or indices.shape[0] < num_rows:
        fail("indices", f"a 2-D tensor of shape [>= num_rows={num_rows}, k={k}]",
             tuple(indices.shape) if isinstance(indices, torch.Tensor) else type(indices).__name__)
    if isinstance(seq_lens, torch.Tensor) and seq_lens.dim() == 2:
        next_n = None if next_n == seq_lens.shape[1] else next_n
    try:
        return topk(rows, seq_lens, k, next_n=next_n, out=indices[:num_rows], backend=backend)
    except PagedMQAArgumentError as error:
        raise renamed(error, names, entry) from None
