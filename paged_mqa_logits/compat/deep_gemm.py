"""DeepGEMM's paged MQA-logits API on top of this package's op.

Replace ``from deep_gemm import fp8_paged_mqa_logits, get_paged_mqa_logits_metadata`` with
``from paged_mqa_logits.compat.deep_gemm import ...``; arguments and return values follow
DeepGEMM's Python API:

* ``get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms)`` returns an
  ``[num_sms + 1, 2]`` int32 schedule;
* ``fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta,
  max_context_len, clean_logits=False, logits_dtype=torch.float32, indices=None)`` allocates
  and returns ``[B * next_n, max_context_len]`` logits of ``logits_dtype`` from fp8 or MXFP4
  queries and keys (``q = (q_fp, q_sf)``, ``q_sf`` ``None`` for fp8);
* ``fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta,
  max_context_len, clean_logits=False, indices=None)``, the legacy name: fp8, float32 logits.

Differences, all supersets of what DeepGEMM accepts: 1-D ``context_lens`` are served too (see
docs/CONTRACT.md for the row visibility of both layouts), ``clean_logits=True`` works with
either layout, every ``block_kv`` the op supports is accepted, MXFP4 and varlen ``indices``
are served on every device (DeepGEMM serves them on sm_100/sm_120 only), and the op's
dispatcher picks the kernel (on any GPU the package serves, or on CPU tensors).
"""

from __future__ import annotations

import math

import torch

from ..problem import SUPPORTED_KV_BLOCK_SIZES
from ..signature import OP
from ..torch_op import paged_mqa_logits
from .. import validate
from ..validate import MAX_MODEL_LEN_EXPECTED, PagedMQAArgumentError, max_model_len_rule

__all__ = ["get_paged_mqa_logits_metadata", "fp8_fp4_paged_mqa_logits", "fp8_paged_mqa_logits", "SPLIT_KV"]

#: tokens per schedule segment; DeepGEMM's split on sm_90 / sm_100
SPLIT_KV = 256
#: the largest ``num_sms`` the metadata accepts (an SM count; the schedule has one row per SM)
MAX_NUM_SMS = 1 << 16
#: DeepGEMM pads each logits row to a multiple of this many bytes (and of SPLIT_KV columns)
ROW_ALIGNMENT_BYTES = 1024

#: DeepGEMM's names of the op's arguments, where they differ (the rest share the op's name)
OP_NAMES = {"q": "q_fp8", "block_table": "kv_indices", "max_context_len": "max_model_len"}

#: the op's argument names -> DeepGEMM's (an error names what the caller passed); the op's
#: ``KVBlockSize`` is read from ``kv_cache``, ``q_scale`` is the second half of DeepGEMM's ``q``
_ARGUMENT_NAMES = {**{ours: theirs for theirs, ours in OP_NAMES.items()}, "KVBlockSize": "kv_cache",
                   "q_scale": "q"}


def _fail(name: str, expected: str, got) -> None:
    raise PagedMQAArgumentError(f"paged_mqa_logits.compat.deep_gemm: argument `{name}`: expected {expected}, got {got}")


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

    With varlen ``indices`` (``[B]`` int32, next_n 1) every row is split as a sequence of its own.

    :func:`fp8_fp4_paged_mqa_logits` accepts this tensor (or DeepGEMM's) and ignores its
    contents: the op balances ragged batches itself, with the knobs the tuned table picks. It
    exists so an engine's metadata step keeps working unchanged.
    """
    if not isinstance(context_lens, torch.Tensor) or context_lens.dtype != torch.int32 or context_lens.dim() not in (1, 2):
        got = (f"{context_lens.dim()}-D {str(context_lens.dtype).replace('torch.', '')} tensor"
               if isinstance(context_lens, torch.Tensor) else type(context_lens).__name__)
        _fail("context_lens", "a 1-D [B] or 2-D [B, next_n] int32 tensor", got)
    if indices is not None:
        got = _indices_error(indices, context_lens.shape[0], context_lens.device)
        if got is not None:
            _fail("indices", f"a [B={context_lens.shape[0]}] int32 tensor on {context_lens.device} (the request of "
                             "each row)", got)
        if context_lens.dim() == 2 and context_lens.shape[1] != 1:
            _fail("indices", "None when next_n > 1 (varlen rows are requests of next_n 1)",
                  f"next_n {context_lens.shape[1]}")
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


def fp8_fp4_paged_mqa_logits(
    q,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    schedule_meta: torch.Tensor,
    max_context_len: int,
    clean_logits: bool = False,
    logits_dtype: torch.dtype = torch.float32,
    indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logits ``[B * next_n, max_context_len]`` of ``logits_dtype`` of the sparse-attention indexer,
    from fp8 or MXFP4 queries and keys.

    Args:
        q: ``(q_fp, q_sf)``: ``q_fp`` ``[B, next_n, H, D]`` fp8 (e4m3fn; e4m3fnuz on gfx942) with
            ``q_sf`` ``None``, or ``[B, next_n, H, D / 2]`` packed fp4 (uint8 or
            float4_e2m1fn_x2) with ``q_sf`` ``[B, next_n, H]`` int32 ue8m0 exponents (MXFP4). A
            bare fp8 tensor is read as ``(q, None)``.
        kv_cache: ``[num_blocks, block_kv, 1, D + 4]`` uint8, keys then fp32 scales per block
            (fp8); ``[num_blocks, block_kv, 1, D / 2 + 4]``, packed keys then int32 exponent
            words per block (MXFP4).
        weights: ``[B * next_n, H]`` float32.
        context_lens: ``[B, next_n]`` (DeepGEMM's layout) or ``[B]`` int32.
        block_table: ``[B, max_blocks]`` int32.
        schedule_meta: an ``[N + 1, 2]`` int32 tensor from :func:`get_paged_mqa_logits_metadata`
            (or DeepGEMM's); checked for shape and dtype, otherwise unused.
        max_context_len: columns of the result.
        clean_logits: ``True``: every position a row does not see is ``-inf``. ``False``: those
            positions are unspecified (the result is allocated with ``torch.empty`` and only
            visible positions are written), as in DeepGEMM.
        logits_dtype: ``torch.float32`` or ``torch.bfloat16`` (the fp32 logit rounded once).
        indices: varlen batches (``next_n`` 1): ``[B]`` int32, the request of each row of ``q``;
            a request is a run of equal adjacent ids, and every row of a run reads its keys
            through the block-table row of the run's first row, as DeepGEMM does. Each row keeps
            its own length. The rows are gathered on the device (no synchronisation).

    Returns:
        A new tensor, as DeepGEMM's: a view of the first ``max_context_len`` columns of a
        buffer whose rows are padded to a multiple of 256 columns and of 1024 bytes
        (``stride(0)`` is the padded width; the last dimension is contiguous).
    """
    q_fp, q_sf = q if isinstance(q, tuple) else (q, None)
    op_arguments = OP.select({OP_NAMES.get(name, name): value for name, value in locals().items()})
    op_arguments.update(q_fp8=q_fp, q_scale=q_sf)
    if not isinstance(schedule_meta, torch.Tensor) or schedule_meta.dtype != torch.int32 or schedule_meta.dim() != 2 \
            or schedule_meta.shape[1] != 2:
        got = (f"shape {tuple(schedule_meta.shape)} {str(schedule_meta.dtype).replace('torch.', '')}"
               if isinstance(schedule_meta, torch.Tensor) else type(schedule_meta).__name__)
        _fail("schedule_meta", "an [N + 1, 2] int32 tensor (get_paged_mqa_logits_metadata's result)", got)
    if not isinstance(kv_cache, torch.Tensor) or kv_cache.dim() != 4:
        got = f"shape {tuple(kv_cache.shape)}" if isinstance(kv_cache, torch.Tensor) else type(kv_cache).__name__
        _fail("kv_cache", "a 4-D [num_blocks, block_kv, 1, D + 4 (fp8) or D / 2 + 4 (fp4)] uint8 tensor", got)
    if not isinstance(q_fp, torch.Tensor) or q_fp.dim() != 4:
        _fail("q", "a 4-D [B, next_n, H, D] fp8 tensor or a (q_fp4 [B, next_n, H, D / 2], q_sf [B, next_n, H]) "
                   "tuple", f"shape {tuple(q_fp.shape)}" if isinstance(q_fp, torch.Tensor) else type(q_fp).__name__)
    if isinstance(max_context_len, bool) or not isinstance(max_context_len, int) \
            or max_model_len_rule(max_context_len) is not None:
        _fail("max_context_len", MAX_MODEL_LEN_EXPECTED, max_context_len)
    if logits_dtype not in (torch.float32, torch.bfloat16):
        _fail("logits_dtype", "torch.float32 or torch.bfloat16", logits_dtype)
    if indices is not None:
        op_arguments["kv_indices"] = _request_table_rows(indices, q_fp, block_table)
    rows = q_fp.shape[0] * q_fp.shape[1]
    alignment = math.lcm(SPLIT_KV, ROW_ALIGNMENT_BYTES // logits_dtype.itemsize)
    padded = -(-max_context_len // alignment) * alignment
    try:
        # every input checked before the result is allocated: a bad call costs no memory (the
        # op then checks the call with the allocated result)
        validate.build_launch_args(q_fp, kv_cache, weights, torch.empty((rows, 0), dtype=logits_dtype,
                                                                         device=q_fp.device),
                                   context_lens, op_arguments["kv_indices"], 0, False, kv_cache.shape[1],
                                   q_scale=q_sf)
        logits = torch.empty((rows, padded), dtype=logits_dtype, device=q_fp.device)[:, :max_context_len]
        paged_mqa_logits(**op_arguments, out_logits=logits, Preshuffle=False, KVBlockSize=kv_cache.shape[1])
    except PagedMQAArgumentError as exc:
        raise PagedMQAArgumentError(_in_deep_gemm_names(str(exc))) from None
    return logits


def fp8_paged_mqa_logits(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    schedule_meta: torch.Tensor,
    max_context_len: int,
    clean_logits: bool = False,
    indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """DeepGEMM's legacy name: :func:`fp8_fp4_paged_mqa_logits` with an fp8 ``q`` tensor and
    float32 logits ``[B * next_n, max_context_len]``."""
    if isinstance(q, tuple):
        _fail("q", "an fp8 tensor (fp4 goes through fp8_fp4_paged_mqa_logits)", "a tuple")
    return fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
                                    clean_logits, torch.float32, indices)


def _indices_error(indices, rows: int, device) -> str | None:
    """What is wrong with varlen ``indices`` for ``rows`` rows of q on ``device`` (``None``: fine)."""
    if not isinstance(indices, torch.Tensor):
        return type(indices).__name__
    if indices.dtype != torch.int32 or tuple(indices.shape) != (rows,):
        return f"shape {tuple(indices.shape)} {str(indices.dtype).replace('torch.', '')}"
    if indices.device != device:
        return f"a tensor on {indices.device}"
    return None


def _request_table_rows(indices, q: torch.Tensor, block_table) -> torch.Tensor:
    """The block table varlen rows read: row ``r`` of ``block_table`` replaced by the row of the
    first row of ``r``'s request (the run of equal ``indices`` it is in). Device ops only."""
    if q.shape[1] != 1:
        _fail("indices", "None when next_n > 1 (varlen rows are requests of next_n 1)", f"next_n {q.shape[1]}")
    got = _indices_error(indices, q.shape[0], q.device)
    if got is not None:
        _fail("indices", f"a [B={q.shape[0]}] int32 tensor on {q.device} (the request of each row of q)", got)
    if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2 or block_table.shape[0] != q.shape[0]:
        return block_table  # the op names what is wrong with it
    row = torch.arange(q.shape[0], device=q.device)
    starts = torch.ones_like(row, dtype=torch.bool)
    starts[1:] = indices[1:] != indices[:-1]
    first = torch.cummax(torch.where(starts, row, 0), dim=0).values
    return block_table.index_select(0, first)


def _in_deep_gemm_names(message: str) -> str:
    for ours, theirs in _ARGUMENT_NAMES.items():
        message = message.replace(f"argument `{ours}`", f"argument `{theirs}`")
    return message
