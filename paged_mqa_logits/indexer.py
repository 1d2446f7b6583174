"""The indexer step in one call: the logits op (``clean_logits=False``), then the exact top-k of
every row with the same lengths: :func:`indexer_topk`, registered as
``torch.ops.paged_mqa_logits.indexer_topk`` (docs/TOPK.md, "The indexer step").

Both ops' validators run once, before anything is written (the logits op's
``validate.build_launch_args``, the top-k's ``top_k.validate.check_call`` on the rows the logits
op writes), with the errors naming this call's arguments; then the two launches, neither reading
a device value, so a step is capturable in a CUDA graph after a warm-up. The op writes both
outputs in place and returns nothing (``torch.compile`` functionalises it); its fake writes
nothing."""

from __future__ import annotations

import torch

from .errors import PagedMQAArgumentError, renamed
from .op import check_options, launch as launch_logits
from .problem import LaunchArgs
from .signature import NO_HINT
from .torch_op import NAMESPACE, must_use_op
from .top_k.op import check_backend, launch as launch_topk
from .top_k.validate import MAX_K, TopkCall, check_call, overlaps
from .validate import (FP4_TYPES, FP8_TYPES, MAX_MODEL_LEN, build_launch_args, check_no_overlap, fail, host_int,
                       tensor)

SCHEMA = ("indexer_topk(Tensor q_fp8, Tensor kv_cache, Tensor weights, Tensor context_lens, Tensor kv_indices, "
          "int max_model_len, int k, Tensor(a!) out_logits, Tensor(b!) out, bool Preshuffle=False, "
          "int KVBlockSize=1, Tensor? block_table=None, int block_size=1, int context_hint=-1, "
          "Tensor? q_scale=None, str? logits_backend=None, str? topk_backend=None) -> ()")

#: the logits op's and the top-k op's argument names as this call spells them
LOGITS_NAMES = {"backend": "logits_backend"}
TOPK_NAMES = {"logits": "out_logits", "lengths": "context_lens", "backend": "topk_backend"}


def check_topk(args: LaunchArgs, k, out, block_table, block_size, topk_backend) -> TopkCall:
    """The top-k half of a step whose logits call ``args`` is validated: the top-k op's checks on
    the rows the logits op writes (``out_logits[:B*next_n, :visible width]``), then that neither
    output shares memory with what the other half reads."""
    rows, next_n = args.problem.rows, args.problem.shape_key.next_n
    try:
        check_backend(topk_backend)
        call = check_call(args.out[:rows, :args.visible_width], args.context_lens, next_n, k, out, block_table,
                          block_size)
    except PagedMQAArgumentError as error:
        raise renamed(error, TOPK_NAMES) from None
    if block_table is not None:  # the logits are written before the top-k reads the table
        check_no_overlap(args.out, rows, args.max_model_len, [("block_table", block_table)])
    for name, t in (("q_fp8", args.q), ("kv_cache", args.kv_cache), ("weights", args.weights),
                    ("kv_indices", args.block_table), ("q_scale", args.q_scale)):
        if t is not None and overlaps(call.out, t):
            fail("out", f"memory that no input shares (it overlaps `{name}`)", "an aliasing tensor")
    return call


def run(q_fp8, kv_cache, weights, context_lens, kv_indices, max_model_len, k, out_logits, out, Preshuffle=False,
        KVBlockSize=1, block_table=None, block_size=1, context_hint=None, q_scale=None, logits_backend=None,
        topk_backend=None) -> None:
    """Validate one step (both halves, before anything is written) and launch it: the op's
    implementation on every device."""
    args = build_launch_args(q_fp8, kv_cache, weights, out_logits, context_lens, kv_indices, max_model_len,
                             Preshuffle, KVBlockSize, context_hint, q_scale)
    call = check_topk(args, k, out, block_table, block_size, topk_backend)
    try:
        launch_logits(args, backend=logits_backend)  # a bad backend raises before the launch writes
    except PagedMQAArgumentError as error:
        raise renamed(error, LOGITS_NAMES) from None
    launch_topk(call, topk_backend)


def _implementation(q_fp8, kv_cache, weights, context_lens, kv_indices, max_model_len, k, out_logits, out,
                    Preshuffle=False, KVBlockSize=1, block_table=None, block_size=1, context_hint=NO_HINT,
                    q_scale=None, logits_backend=None, topk_backend=None) -> None:
    run(q_fp8, kv_cache, weights, context_lens, kv_indices, max_model_len, k, out_logits, out, Preshuffle,
        KVBlockSize, block_table, block_size, None if context_hint == NO_HINT else context_hint, q_scale,
        logits_backend, topk_backend)


def _fake(*args, **kwargs) -> None:
    return None


# A fragment of the logits op's namespace, as the top-k op's
_LIB = torch.library.Library(NAMESPACE, "FRAGMENT")
_LIB.define(SCHEMA)
_LIB.impl("indexer_topk", _implementation, "CompositeExplicitAutograd")
torch.library.register_fake(f"{NAMESPACE}::indexer_topk", _fake, lib=_LIB)
op = torch.ops.paged_mqa_logits.indexer_topk.default


def _check_host_options(context_hint, logits_backend, topk_backend) -> None:
    """The options, checked before they cross the schema (where a wrong type fails with the
    dispatcher's error instead of one naming the argument)."""
    try:
        check_options(context_hint, False, logits_backend, None)
    except PagedMQAArgumentError as error:
        raise renamed(error, LOGITS_NAMES) from None
    try:
        check_backend(topk_backend)
    except PagedMQAArgumentError as error:
        raise renamed(error, TOPK_NAMES) from None


def indexer_topk(q_fp8: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                 kv_indices: torch.Tensor, max_model_len: int, k: int = 2048, *, Preshuffle: bool = False,
                 KVBlockSize: int = 1, out_logits: torch.Tensor | None = None, out: torch.Tensor | None = None,
                 block_table: torch.Tensor | None = None, block_size: int = 1, context_hint: int | None = None,
                 q_scale: torch.Tensor | None = None, return_logits: bool = False, logits_backend: str | None = None,
                 topk_backend: str | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """One decode step of the sparse-attention indexer: the logits of
    :func:`paged_mqa_logits.paged_mqa_logits` (``clean_logits=False``), then the positions of the
    ``k`` largest visible logits of each row (:func:`paged_mqa_logits.topk`, exact as a set).

    Shapes (``B`` sequences, ``next_n`` query tokens each, ``H`` heads; ``rows = B * next_n``):

    * ``q_fp8`` ``[B, next_n, H, 128]`` fp8 (``[B, next_n, H, 64]`` packed MXFP4 with ``q_scale``
      ``[B, next_n, H]`` int32), ``kv_cache`` ``[num_blocks, KVBlockSize, 1, 132]`` uint8 (68 in
      MXFP4), ``weights`` ``[rows, H]`` fp32, ``kv_indices`` ``[B, max_blocks]`` int32: the logits
      op's arguments, same contract (docs/CONTRACT.md); ``Preshuffle``, ``KVBlockSize`` and
      ``context_hint`` too.
    * ``context_lens`` int32 ``[B]`` (row ``j`` of sequence ``b`` sees ``p <= L_b - next_n + j``) or
      ``[B, next_n]`` (row ``j`` sees ``p < lens[b, j]``): the one set of lengths both halves use;
      ``next_n`` is ``q_fp8.shape[1]``.
    * ``out_logits`` fp32 or bf16 ``[>= rows, >= max_model_len]``, written as the logits op
      writes it (positions a row does not see left as they were); allocated
      (``[rows, max_model_len]`` fp32, unwritten positions unspecified) when ``None``.
    * ``out`` int32 ``[rows, k]``, allocated when ``None``: row ``r`` gets its ``min(k, n)``
      largest visible positions, unsorted, then ``-1``; a row sees ``n = min(its length,
      max_model_len, max_blocks * KVBlockSize)`` positions, exactly those the logits op wrote.
    * ``block_table`` int32 ``[B, >= visible width / block_size]`` (and ``block_size``): each
      selected position ``p`` written as ``block_table[b, p // block_size] * block_size + p %
      block_size`` (the top-k op's page-table transform).

    ``k`` in ``1..4096``. Returns ``out``, or ``(out, out_logits)`` with ``return_logits``.
    ``logits_backend`` / ``topk_backend`` force one backend of each op (default: the tuned
    tables' picks). A bad argument raises ``PagedMQAArgumentError`` naming it before anything
    is written; nothing reads a device value back, so the step can be captured in a CUDA graph
    (and replayed after the lengths change in place) once it has run outside capture."""
    if out_logits is None or out is None:
        q = tensor("q_fp8", q_fp8, FP8_TYPES + FP4_TYPES, (4,))
        rows = q.shape[0] * q.shape[1]
        if out_logits is None:
            width = host_int("max_model_len", max_model_len, 0, MAX_MODEL_LEN)
            out_logits = torch.empty((rows, width), dtype=torch.float32, device=q.device)
        if out is None:
            out = torch.empty((rows, host_int("k", k, 1, MAX_K)), dtype=torch.int32, device=q.device)
    if torch.compiler.is_compiling() or must_use_op(out_logits) or type(out) is not torch.Tensor:
        _check_host_options(context_hint, logits_backend, topk_backend)
        op(q_fp8, kv_cache, weights, context_lens, kv_indices, max_model_len, k, out_logits, out, Preshuffle,
           KVBlockSize, block_table, block_size, NO_HINT if context_hint is None else context_hint, q_scale,
           logits_backend, topk_backend)
    else:
        run(q_fp8, kv_cache, weights, context_lens, kv_indices, max_model_len, k, out_logits, out, Preshuffle,
            KVBlockSize, block_table, block_size, context_hint, q_scale, logits_backend, topk_backend)
    return (out, out_logits) if return_logits else out


__all__ = ["indexer_topk", "op", "run", "check_topk", "SCHEMA"]
