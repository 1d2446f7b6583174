"""DeepGEMM's paged MQA-logits API on top of this package's op.

Replace ``from deep_gemm import fp8_paged_mqa_logits, get_paged_mqa_logits_metadata`` with
``from paged_mqa_logits.compat.deep_gemm import ...``; arguments and return values follow
DeepGEMM's Python API:

* ``get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms)`` returns an
  ``[num_sms + 1, 2]`` int32 schedule;
* ``fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta,
  max_context_len, clean_logits=False)`` allocates and returns ``[B * next_n,
  max_context_len]`` float32 logits.

Differences, all supersets of what DeepGEMM accepts: 1-D ``context_lens`` are served too (see
docs/CONTRACT.md for the row visibility of both layouts), ``clean_logits=True`` works with
either layout, every ``block_kv`` the op supports is accepted, and the op's dispatcher picks
the kernel (on any GPU the package serves, or on CPU tensors). Varlen scheduling
(``indices``) is not implemented and is rejected.
"""

from __future__ import annotations

import torch

from ..problem import SUPPORTED_KV_BLOCK_SIZES
from ..signature import OP
from ..torch_op import paged_mqa_logits
from .. import validate
from ..validate import MAX_MODEL_LEN_EXPECTED, PagedMQAArgumentError, max_model_len_rule

__all__ = ["get_paged_mqa_logits_metadata", "fp8_paged_mqa_logits", "SPLIT_KV"]

#: tokens per schedule segment; DeepGEMM's split on sm_90 / sm_100
SPLIT_KV = 256
#: the largest ``num_sms`` the metadata accepts (an SM count; the schedule has one row per SM)
MAX_NUM_SMS = 1 << 16

#: DeepGEMM's names of the op's arguments, where they differ (the rest share the op's name)
OP_NAMES = {"q": "q_fp8", "block_table": "kv_indices", "max_context_len": "max_model_len"}

#: the op's argument names -> DeepGEMM's (an error names what the caller passed); the op's
#: ``KVBlockSize`` is read from ``kv_cache``
_ARGUMENT_NAMES = {**{ours: theirs for theirs, ours in OP_NAMES.items()}, "KVBlockSize": "kv_cache"}


def _fail(name: str, expected: str, got) -> None:
    raise PagedMQAArgumentError(f"paged_mqa_logits.compat.deep_gemm: argument `{name}`: expected {expected}, got {got}")


def _no_indices(indices) -> None:
    if indices is not None:
        _fail("indices", "None (varlen scheduling is not implemented)", f"a {type(indices).__name__}")


def _sequence_lengths(context_lens: torch.Tensor) -> torch.Tensor:
    """``[B]`` int64 length of the work of each sequence: ``L_b`` for 1-D lengths, the longest
    row's length for 2-D lengths (docs/CONTRACT.md)."""
    lens = context_lens.long().clamp_min(0)
    return lens if lens.dim() == 1 else lens.amax(dim=1)


def get_paged_mqa_logits_metadata(context_lens: torch.Tensor, block_kv: int, num_sms: int, indices=None) -> torch.Tensor:
    """An even split of the batch's key segments over ``num_sms`` workers, in DeepGEMM's format.

    Each sequence is cut into ``ceil(len / 256)`` segments; worker ``i`` starts at row ``i`` of
    the result, ``(sequence, segment within it)``, and the last row is ``(B, 0)``. The segments are
    dealt out as evenly as integers allow (the first workers get one segment fewer when the
    count does not divide). Computed with device ops: no host synchronisation.

    :func:`fp8_paged_mqa_logits` accepts this tensor (or DeepGEMM's) and ignores its contents:
    the op balances ragged batches itself, with the knobs the tuned table picks. It exists so an
    engine's metadata step keeps working unchanged.
    """
    _no_indices(indices)
    if not isinstance(context_lens, torch.Tensor) or context_lens.dtype != torch.int32 or context_lens.dim() not in (1, 2):
        got = (f"{context_lens.dim()}-D {str(context_lens.dtype).replace('torch.', '')} tensor"
               if isinstance(context_lens, torch.Tensor) else type(context_lens).__name__)
        _fail("context_lens", "a 1-D [B] or 2-D [B, next_n] int32 tensor", got)
    if isinstance(block_kv, bool) or not isinstance(block_kv, int) or block_kv not in SUPPORTED_KV_BLOCK_SIZES:
        _fail("block_kv", "one of " + ", ".join(map(str, SUPPORTED_KV_BLOCK_SIZES)), block_kv)
    if isinstance(num_sms, bool) or not isinstance(num_sms, int) or not 1 <= num_sms <= MAX_NUM_SMS:
        _fail("num_sms", f"an int in 1..{MAX_NUM_SMS} (a GPU's SM count)", num_sms)

    device = context_lens.device
    batch = context_lens.shape[0]
    meta = torch.zeros((num_sms + 1, 2), dtype=torch.int32, device=device)
    meta[num_sms, 0] = batch
    if batch == 0:
        return meta
    segments = (_sequence_lengths(context_lens) + SPLIT_KV - 1) // SPLIT_KV  # [B]
    ends = torch.cumsum(segments, 0)  # exclusive end of each sequence's segments
    total = ends[-1]
    per_worker, remainder = total // num_sms, total % num_sms
    worker = torch.arange(num_sms, device=device)
    pivot = num_sms - remainder
    starts = worker * per_worker + (worker - pivot).clamp_min(0)
    seq = torch.searchsorted(ends, starts, right=True).clamp_max(batch - 1)
    first = torch.where(seq > 0, ends[(seq - 1).clamp_min(0)], torch.zeros_like(seq))
    offset = starts - first
    count = segments[seq]
    # a worker past the last segment (total < num_sms, or the end itself) lands on the last
    # sequence; as in DeepGEMM its segment index wraps, it has no work
    meta[:num_sms, 0] = (seq + torch.where(count > 0, offset // count.clamp_min(1), 0)).to(torch.int32)
    meta[:num_sms, 1] = torch.where(count > 0, offset % count.clamp_min(1), 0).to(torch.int32)
    return meta


def fp8_paged_mqa_logits(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    schedule_meta: torch.Tensor,
    max_context_len: int,
    clean_logits: bool = False,
    indices=None,
) -> torch.Tensor:
    """Logits ``[B * next_n, max_context_len]`` float32 of the sparse-attention indexer.

    Args:
        q: ``[B, next_n, H, D]`` fp8 (e4m3fn; e4m3fnuz on gfx942).
        kv_cache: ``[num_blocks, block_kv, 1, D + 4]`` uint8, keys then fp32 scales per block.
        weights: ``[B * next_n, H]`` float32.
        context_lens: ``[B, next_n]`` (DeepGEMM's layout) or ``[B]`` int32.
        block_table: ``[B, max_blocks]`` int32.
        schedule_meta: an ``[N + 1, 2]`` int32 tensor from :func:`get_paged_mqa_logits_metadata`
            (or DeepGEMM's); checked for shape and dtype, otherwise unused.
        max_context_len: columns of the result.
        clean_logits: ``True``: every position a row does not see is ``-inf``. ``False``: those
            positions are unspecified (the result is allocated with ``torch.empty`` and only
            visible positions are written), as in DeepGEMM.

    Returns:
        A new tensor, as DeepGEMM's: a view of the first ``max_context_len`` columns of a
        buffer whose rows are padded to a multiple of 256 columns (``stride(0)`` is the
        padded width; the last dimension is contiguous).
    """
    op_arguments = OP.select({OP_NAMES.get(name, name): value for name, value in locals().items()})
    _no_indices(indices)
    if not isinstance(schedule_meta, torch.Tensor) or schedule_meta.dtype != torch.int32 or schedule_meta.dim() != 2 \
            or schedule_meta.shape[1] != 2:
        got = (f"shape {tuple(schedule_meta.shape)} {str(schedule_meta.dtype).replace('torch.', '')}"
               if isinstance(schedule_meta, torch.Tensor) else type(schedule_meta).__name__)
        _fail("schedule_meta", "an [N + 1, 2] int32 tensor (get_paged_mqa_logits_metadata's result)", got)
    if not isinstance(kv_cache, torch.Tensor) or kv_cache.dim() != 4:
        got = f"shape {tuple(kv_cache.shape)}" if isinstance(kv_cache, torch.Tensor) else type(kv_cache).__name__
        _fail("kv_cache", "a 4-D [num_blocks, block_kv, 1, D + 4] uint8 tensor", got)
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        _fail("q", "a 4-D [B, next_n, H, D] fp8 tensor", f"shape {tuple(q.shape)}" if isinstance(q, torch.Tensor) else type(q).__name__)
    if isinstance(max_context_len, bool) or not isinstance(max_context_len, int) \
            or max_model_len_rule(max_context_len) is not None:
        _fail("max_context_len", MAX_MODEL_LEN_EXPECTED, max_context_len)
    rows = q.shape[0] * q.shape[1]
    padded = -(-max_context_len // SPLIT_KV) * SPLIT_KV
    try:
        # every input checked before the result is allocated: a bad call costs no memory (the
        # op then checks the call with the allocated result)
        validate.build_launch_args(q, kv_cache, weights, torch.empty((rows, 0), dtype=torch.float32, device=q.device),
                                   context_lens, block_table, 0, False, kv_cache.shape[1])
        logits = torch.empty((rows, padded), dtype=torch.float32, device=q.device)[:, :max_context_len]
        paged_mqa_logits(**op_arguments, out_logits=logits, Preshuffle=False, KVBlockSize=kv_cache.shape[1])
    except PagedMQAArgumentError as exc:
        raise PagedMQAArgumentError(_in_deep_gemm_names(str(exc))) from None
    return logits


def _in_deep_gemm_names(message: str) -> str:
    for ours, theirs in _ARGUMENT_NAMES.items():
        message = message.replace(f"argument `{ours}`", f"argument `{theirs}`")
    return message
