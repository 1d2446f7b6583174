"""The op: validate once -> problem key -> dispatch -> launch."""

from __future__ import annotations

import torch

from . import backends, dispatch
from .problem import LaunchArgs, row_lengths
from . import validate
from .validate import PagedMQAArgumentError, build_launch_args

__all__ = ["paged_mqa_logits", "build_launch_args", "launch", "PagedMQAArgumentError"]


def paged_mqa_logits_eager(
    q_fp8: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    out_logits: torch.Tensor,
    context_lens: torch.Tensor,
    kv_indices: torch.Tensor,
    max_model_len: int,
    Preshuffle: bool = False,
    KVBlockSize: int = 1,
    *,
    context_hint: int | None = None,
    clean_logits: bool = False,
    backend: str | None = None,
    config: dict | None = None,
) -> torch.Tensor:
    """FP8 paged MQA logits of the sparse-attention indexer, written into ``out_logits``.

    ``logits[b*next_n + j, p] = kv_scale[b, p] * sum_h weights[b*next_n + j, h] *
    relu(dot(q_fp8[b, j, h, :], K[b, p, :]))`` in fp32 (``relu`` = IEEE maxNum with 0) for every
    position ``p`` the row sees (``p < row_len(b, j)``, ``p < max_model_len``); see ``problem.py``
    for ``row_len``. Block ids a sequence walks must lie in ``[0, num_blocks)`` (checked on CPU,
    and on devices with ``PAGED_MQA_LOGITS_CHECK=1``; unchecked ones are clamped).

    Args:
        q_fp8: ``[B, next_n, H, D]`` fp8 e4m3 (fn; fnuz on gfx942), D = 128, next_n 1..8.
        kv_cache: ``[num_blocks, KVBlockSize, 1, D + 4]`` uint8, keys then fp32 scales per block
            (the same bytes fp8-typed, and KVBlockSize-1 rows padded to 144 bytes, are accepted).
        weights: ``[B * next_n, H]`` float32.
        out_logits: ``[>= B * next_n, >= max_model_len]`` float32, written in place.
        context_lens: ``[B]`` or ``[B, next_n]`` int32.
        kv_indices: ``[B, max_blocks]`` int32 block table.
        max_model_len: columns ``>= max_model_len`` are never written.
        Preshuffle: key bytes stored in 16x16 tiles (requires ``KVBlockSize % 16 == 0``).
        KVBlockSize: tokens per cache block.
        context_hint: host-side longest context of the batch; used only to pick tuned knobs.
        clean_logits: set columns ``[valid_end, max_model_len)`` of every row to ``-inf``.
        backend, config: force a backend (and its knobs) instead of the tuned table; an
            explicitly forced backend that cannot serve the call raises instead of falling back.

    Returns:
        ``out_logits``. Positions a row does not see are left as passed (unless cleaning).
    """
    check_options(context_hint, clean_logits, backend, config)
    args = build_launch_args(
        q_fp8, kv_cache, weights, out_logits, context_lens, kv_indices, max_model_len,
        Preshuffle, KVBlockSize, context_hint,
    )
    _launch(args, backend, config, clean_logits)
    return out_logits


def check_options(context_hint, clean_logits, backend, config) -> None:
    """:func:`validate.check_options` against the registered backends."""
    validate.check_options(context_hint, clean_logits, backend, config, backends.names())


def launch(args: LaunchArgs, *, backend: str | None = None, config: dict | None = None, clean_logits: bool = False) -> None:
    """Dispatch validated arguments; the path shared by the op, the bench and the tuner.

    Dispatched calls fall back down the chain when the chosen backend's launch raises (see
    :func:`dispatch.record_failure`), except during CUDA graph capture, where the error
    propagates (a fallback would record a different graph than the one warmed up). A forced
    ``backend`` raises its errors as they are; its ``config`` must pass ``check_config``.
    """
    check_options(None, clean_logits, backend, config)
    _launch(args, backend, config, clean_logits)


def _launch(args: LaunchArgs, backend: str | None, config: dict | None, clean_logits: bool) -> None:
    if args.problem.rows == 0 or args.max_model_len == 0:
        return
    if backend is None:
        _launch_dispatched(args)
    else:
        reason = backends.why_not(backend, args.problem, args.target)
        if reason is not None:
            raise PagedMQAArgumentError(f"paged_mqa_logits: argument `backend`: {backend!r} cannot serve this call: {reason}")
        chosen = backends.get(backend)
        if config is None:
            knobs = chosen.default_config(args.problem)
        else:
            error = backends.check_config(backend, config, args.problem)
            if error is not None:
                raise PagedMQAArgumentError(f"paged_mqa_logits: argument `config`: {error}")
            knobs = config
        chosen.launch(args, knobs)
    if clean_logits:
        clean(args)


#: errors that say nothing about the backend (bad input, a transient lack of memory): raised, never
#: remembered as the backend's failure
_NOT_A_BACKEND_FAILURE = (PagedMQAArgumentError, MemoryError, torch.OutOfMemoryError)


def _launch_dispatched(args: LaunchArgs) -> None:
    """Launch the dispatched choice; on a compile or launch error fall back down the chain
    (each failed choice is remembered, so the loop ends when the chain is exhausted)."""
    problem, target = args.problem, args.target
    choice = dispatch.choose(problem, target)
    while True:
        try:
            backends.get(choice.backend).launch(args, choice.config)
            return
        except _NOT_A_BACKEND_FAILURE:
            raise
        except Exception as exc:
            if dispatch.capturing(args.target):
                raise
            dispatch.record_failure(problem, choice, exc, target)
            try:
                choice = dispatch.choose(problem, target)
            except RuntimeError as exhausted:  # every link of the chain has failed
                raise exhausted from exc


def clean(args: LaunchArgs) -> None:
    """Set ``[valid_end, max_model_len)`` of every row to ``-inf``; no host sync."""
    rows, width = args.problem.rows, args.max_model_len
    valid_end = row_lengths(args.context_lens, args.problem.next_n).reshape(-1).clamp_max(args.visible_width)
    target = args.out[:rows, :width]
    cols = torch.arange(width, device=target.device)
    target.masked_fill_(cols[None, :] >= valid_end[:, None], float("-inf"))
