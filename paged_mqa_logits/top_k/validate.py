"""Host-side validation of one top-k call; every error names the argument, the expected and the
actual value (the logits op's :class:`~paged_mqa_logits.errors.PagedMQAArgumentError`), raised
before ``out`` is touched. Nothing here reads a device value: the checks are shapes, dtypes,
devices, strides and host ints, so a call inside CUDA-graph capture never synchronises."""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..problem import MAX_NEXT_N
from ..validate import byte_span, fail, host_int, last_dim_contiguous, tensor, next_n_rule

#: the largest k a call may ask for (DeepSeek-V3.2 asks 2048; 512 and 1024 are the other sizes seen)
MAX_K = 4096
LOGITS_DTYPES = (torch.float32, torch.bfloat16)


class TopkCall(NamedTuple):
    """A validated call: ``rows = batch * next_n`` rows of ``logits`` are selected from."""

    logits: torch.Tensor
    lengths: torch.Tensor
    next_n: int
    k: int
    out: torch.Tensor
    block_table: torch.Tensor | None
    block_size: int

    @property
    def rows(self) -> int:
        return self.out.shape[0]

    @property
    def lens_2d(self) -> bool:
        return self.lengths.dim() == 2


def _same_device(name: str, t: torch.Tensor, device: torch.device) -> None:
    if t.device != device:
        fail(name, f"a tensor on {device} (the device of `logits`)", f"a tensor on {t.device}")


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the byte extents of ``a`` and ``b`` (from their first to their last element) meet."""
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    span_a, span_b = byte_span(a), byte_span(b)
    return span_a is not None and span_b is not None and span_a[0] < span_b[1] and span_b[0] < span_a[1]


def check_call(logits, lengths, next_n, k, out, block_table=None, block_size=1) -> TopkCall:
    """Validate a call (``out`` already allocated) and return it as a :class:`TopkCall`."""
    logits = tensor("logits", logits, LOGITS_DTYPES, (2,))
    device = logits.device
    lengths = tensor("lengths", lengths, (torch.int32,), (1, 2))
    _same_device("lengths", lengths, device)
    k = host_int("k", k, 1, MAX_K)
    if lengths.dim() == 2:
        if next_n is not None and next_n != lengths.shape[1]:
            fail("next_n", f"None or lengths.shape[1]={lengths.shape[1]} for 2-D lengths", next_n)
        next_n = lengths.shape[1]
    elif next_n is None:
        next_n = 1
    next_n = host_int("next_n", next_n, 1)
    if next_n_rule(next_n) is not None:
        fail("next_n", f"an int in 1..{MAX_NEXT_N}", next_n)
    rows = lengths.shape[0] * next_n
    if logits.shape[0] != rows:
        fail("logits", f"{rows} rows (batch {lengths.shape[0]} x next_n {next_n})", f"shape {tuple(logits.shape)}")
    out = tensor("out", out, (torch.int32,), (2,))
    _same_device("out", out, device)
    if tuple(out.shape) != (rows, k):
        fail("out", f"shape [rows={rows}, k={k}]", f"shape {tuple(out.shape)}")
    last_dim_contiguous("out", out)
    if rows > 1 and k > 1 and abs(out.stride(0)) < k:
        fail("out", f"rows that do not overlap (stride(0) >= k={k})", f"stride(0) {out.stride(0)}")
    block_size = host_int("block_size", block_size, 1)
    inputs = [("logits", logits), ("lengths", lengths)]
    if block_table is not None:
        block_table = tensor("block_table", block_table, (torch.int32,), (2,))
        _same_device("block_table", block_table, device)
        if block_table.shape[0] != lengths.shape[0]:
            fail("block_table", f"{lengths.shape[0]} rows (one per sequence)", f"shape {tuple(block_table.shape)}")
        covered = block_table.shape[1] * block_size
        if covered < logits.shape[1]:
            fail("block_table", f"blocks covering every column of `logits` (shape[1] * block_size >= "
                  f"{logits.shape[1]})", f"{block_table.shape[1]} blocks of {block_size}")
        last_dim_contiguous("block_table", block_table)
        inputs.append(("block_table", block_table))
    elif block_size != 1:
        fail("block_size", "1 without a `block_table`", block_size)
    for name, t in inputs:
        if overlaps(out, t):
            fail("out", f"memory that no input shares (it overlaps `{name}`)", "an aliasing tensor")
    return TopkCall(logits, lengths, next_n, k, out, block_table, block_size)
