"""AITER's ``deepgemm_fp8_paged_mqa_logits`` and ``top_k_per_row_decode`` on top of this package's ops.

Replace ``from aiter.ops.triton.pa_mqa_logits import deepgemm_fp8_paged_mqa_logits`` with
``from paged_mqa_logits.compat.aiter import deepgemm_fp8_paged_mqa_logits``. The arguments,
their defaults and the out-parameter convention are AITER's; the result is written into
``out_logits`` (returned, where AITER returns a kernel cache key that callers ignore).

Knobs. Left at their defaults, ``ChunkK``, ``TotalCuCount`` and ``WavePerEU`` leave the choice
to the tuned table (the dispatcher picks backend and knobs per problem). Passed explicitly (any
value, the default's value included), they are honoured as AITER does, on the backend the
dispatcher picks for the call:

* ``ChunkK`` -> ``ChunkK`` (tokens per tile);
* ``WavePerEU`` -> ``WavePerEU`` (occupancy target of the CDNA kernels);
* ``TotalCuCount`` and ``WavePerEU`` -> ``SplitKV``, AITER's split count
  ``((max(1, TotalCuCount // (B * next_n)) + 4) // 5 * 5) * WavePerEU``, with
  ``TotalCuCount=None`` meaning the device's CU count, as upstream.

Only the knobs that backend (for Gluon: the variant that runs) reads are passed (the torch
backend reads none; the portable Triton kernel reads ``ChunkK`` and ``SplitKV``), and explicit
knobs always run: a value outside what that backend's kernels take is clamped to the nearest
one they do (``SplitKV`` to 1024: AITER's formula gives 1220 at ``WavePerEU=4``, one row, 304
CUs), and where the clamped set is still not one its kernels combine (say a ``ChunkK`` the
variant's tiles cannot take with its other knobs), ``ChunkK``, then every upstream knob, is
left to the table. ``VarCtxSchedule`` (AITER's schedule for ragged batches) is accepted and
unused: the op balances ragged batches itself.

``top_k_per_row_decode`` runs :func:`paged_mqa_logits.topk` with the rows, lengths and output of
vLLM's op of that name (:mod:`paged_mqa_logits.compat.vllm`); ``stable=True`` orders each row by
descending logit, equal logits by ascending position; ``workspace`` is accepted and unused (the
op needs none).
"""

from __future__ import annotations

import torch

from .. import backends, dispatch, torch_op, validate
from ..arch import detect
from ..signature import OP
from ..torch_op import paged_mqa_logits
from ..validate import PagedMQAArgumentError
from ..top_k.torch_ref import sort_by_value
from .topk_rows import per_row_decode

__all__ = ["deepgemm_fp8_paged_mqa_logits", "top_k_per_row_decode", "aiter_knobs", "served_config"]


class _Default(int):
    """An upstream default value that remembers it was not passed by the caller."""


DEFAULT_CHUNK_K = _Default(256)
DEFAULT_WAVE_PER_EU = _Default(2)


def _fail(name: str, expected: str, got) -> None:
    raise PagedMQAArgumentError(f"paged_mqa_logits.compat.aiter: argument `{name}`: expected {expected}, got {got}")


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        _fail(name, "an int >= 1", value)
    return int(value)


def aiter_knobs(*, chunk_k: int, wave_per_eu: int, total_cu_count: int, batch: int, next_n: int) -> dict:
    """The knob set AITER's function runs with, in the table's column names."""
    rows = max(1, batch * next_n)
    split_kv = (max(1, total_cu_count // rows) + 4) // 5 * 5 * wave_per_eu
    return {"ChunkK": chunk_k, "WavePerEU": wave_per_eu, "SplitKV": split_kv}


def _knob_space(backend, problem, config: dict) -> dict:
    """Knob -> allowed values of the backend (the gluon variant, for gluon) that runs ``config``."""
    variant = getattr(backend, "variant", None)
    if variant is not None:
        return dict(variant(problem, config).knob_space)
    return dict(getattr(backend, "KNOB_SPACE", {}))


def _nearest_allowed(value: int, allowed):
    """``value`` clamped into ``allowed`` (a ``range`` or a tuple): the nearest allowed int, ties
    to the smaller; ``value`` itself when ``allowed`` holds no ints."""
    if isinstance(allowed, range):
        return min(max(value, allowed.start), allowed.stop - 1)
    numbers = [a for a in allowed if type(a) is int]
    return min(numbers, key=lambda a: (abs(a - value), a)) if numbers else value


def served_config(backend_name: str, problem, tuned: dict, upstream: dict) -> dict:
    """``tuned`` with the ``upstream`` knobs the backend reads, each clamped into its allowed
    values; if the backend refuses that combination, without ``ChunkK``, then without any."""
    backend = backends.get(backend_name)
    space = _knob_space(backend, problem, tuned)
    fitted = {k: _nearest_allowed(v, space[k]) for k, v in upstream.items() if k in space}
    for attempt in (fitted, {k: v for k, v in fitted.items() if k != "ChunkK"}):
        config = {**tuned, **attempt}
        if backends.check_config(backend_name, config, problem) is None:
            return config
    return dict(tuned)


def deepgemm_fp8_paged_mqa_logits(
    q_fp8: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    out_logits: torch.Tensor,
    context_lens: torch.Tensor,
    kv_indices: torch.Tensor,
    max_model_len: int,
    Preshuffle: bool = False,
    KVBlockSize: int = 1,
    ChunkK: int = DEFAULT_CHUNK_K,
    TotalCuCount: int | None = None,
    WavePerEU: int = DEFAULT_WAVE_PER_EU,
    VarCtxSchedule: torch.Tensor | None = None,
) -> torch.Tensor:
    """Write the logits into ``out_logits`` (AITER's convention) and return it.

    The tensors and ``Preshuffle``/``KVBlockSize`` are the op's (docs/CONTRACT.md): positions a
    row does not see are left as passed, so pre-fill ``out_logits`` with ``-inf`` as AITER's
    callers do. The knob arguments are described in the module docstring.
    """
    op_arguments = OP.select(locals())  # the op's arguments among AITER's, by name
    explicit = not (isinstance(ChunkK, _Default) and isinstance(WavePerEU, _Default) and TotalCuCount is None)
    if VarCtxSchedule is not None and not isinstance(VarCtxSchedule, torch.Tensor):
        _fail("VarCtxSchedule", "None or a torch.Tensor", type(VarCtxSchedule).__name__)
    if not explicit:
        return paged_mqa_logits(**op_arguments)

    chunk_k = _positive_int("ChunkK", ChunkK)
    wave_per_eu = _positive_int("WavePerEU", WavePerEU)
    args = validate.build_launch_args(**op_arguments)
    kv_block_size = args.problem.shape_key.kv_block_size
    if chunk_k % kv_block_size and kv_block_size % chunk_k:
        _fail("ChunkK", f"a multiple or a divisor of KVBlockSize={kv_block_size}", chunk_k)
    if TotalCuCount is None:
        total_cu_count = detect(q_fp8.device).cu_num or 1
    else:
        total_cu_count = _positive_int("TotalCuCount", TotalCuCount)
    problem = args.problem
    choice = dispatch.choose(problem, args.target)
    knobs = aiter_knobs(chunk_k=chunk_k, wave_per_eu=wave_per_eu, total_cu_count=total_cu_count,
                        batch=problem.shape_key.batch, next_n=problem.shape_key.next_n)
    config = served_config(choice.backend, problem, dict(choice.config), knobs)
    # the call validated above is not validated again (where the op's run can reuse it)
    return torch_op.call(OP.complete(dict(op_arguments, backend=choice.backend, config=config)), args)


_TOPK_NAMES = {"lengths": "seqLens", "out": "indices", "num_rows": "numRows"}


def top_k_per_row_decode(logits: torch.Tensor, next_n: int, seqLens: torch.Tensor, indices: torch.Tensor,
                         numRows: int, stride0: int, stride1: int, k: int = 2048, stable: bool = False, *,
                         workspace: torch.Tensor | None = None) -> torch.Tensor:
    """Each row's ``k`` largest visible positions into ``indices`` (returned); see the module docstring."""
    if not isinstance(stable, bool):
        _fail("stable", "a bool", repr(stable))
    if workspace is not None and not isinstance(workspace, torch.Tensor):
        _fail("workspace", "None or a torch.Tensor", type(workspace).__name__)
    out = per_row_decode("paged_mqa_logits.compat.aiter", _TOPK_NAMES, logits, next_n, seqLens, indices, numRows,
                         stride0, stride1, k)
    if stable and numRows:
        rows = logits.as_strided((numRows, logits.shape[1]), (stride0, stride1), logits.storage_offset())
        out.copy_(sort_by_value(out, rows))
    return indices
