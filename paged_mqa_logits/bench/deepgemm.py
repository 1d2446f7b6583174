"""DeepGEMM's paged MQA logits on the same inputs, for same-run comparisons (imported only when
the ``deep_gemm`` package is present): ``fp8_paged_mqa_logits`` for fp8 inputs and fp32 logits,
``fp8_fp4_paged_mqa_logits`` (with ``logits_dtype``) for bf16 logits and MXFP4 inputs."""

from __future__ import annotations

from typing import Callable

import torch

from .shapes import Shape
from .workload import Workload

#: next_n values DeepGEMM's kernel serves directly; others are timed flattened to next_n 1
DEEPGEMM_NEXT_N = (1, 2, 4)


def deepgemm_available() -> str | None:
    """``None`` if ``deep_gemm`` can be imported, else why not."""
    try:
        import deep_gemm  # noqa: F401
    except Exception as exc:
        return f"deep_gemm is not importable ({type(exc).__name__}: {exc})"
    return None


def deepgemm_unsupported(shape: Shape, arch: str) -> str | None:
    if arch != "sm_90" and not arch.startswith("sm_10"):
        return f"DeepGEMM's paged MQA logits targets sm_90/sm_100, not {arch}"
    key = shape.shape_key
    if key.kv_format == "fp4" and arch == "sm_90":
        return "DeepGEMM serves MXFP4 on sm_100/sm_120 only: fp4 has no DeepGEMM peer on sm_90"
    if key.preshuffle or key.kv_block_size not in (32, 64) or key.heads not in (32, 64):
        return "DeepGEMM serves plain (not preshuffled) caches with KVBlockSize 32/64 and H 32/64"
    missing = deepgemm_available()
    if missing is None and _needs_fp8_fp4_entry(shape):
        import deep_gemm

        if not hasattr(deep_gemm, "fp8_fp4_paged_mqa_logits"):
            return "this DeepGEMM has no fp8_fp4_paged_mqa_logits (needed for bf16 logits and MXFP4)"
    return missing


def _needs_fp8_fp4_entry(shape: Shape) -> bool:
    return shape.shape_key.kv_format != "fp8" or shape.shape_key.logits_dtype != "fp32"


def deepgemm_runner(inputs: dict, next_n: int, slots: int, flatten: bool = False) -> Callable[[], torch.Tensor]:
    """DeepGEMM on our inputs (the same co-packed uint8 cache layouts): ``fp8_paged_mqa_logits``,
    or ``fp8_fp4_paged_mqa_logits`` with the inputs' logits dtype and ``(q, q_sf)`` where the
    logits are bf16 or the inputs MXFP4.

    ``get_paged_mqa_logits_metadata(context_lens_2d, block_kv, slots)`` is computed once, outside
    the timed calls, as an engine does once per decode step. Recent DeepGEMM takes 2-D lengths
    only and, on sm_90 at next_n = 4, schedules one task per 2-SM cluster (``slots =
    num_sms // 2``; :func:`_deepgemm_calls` tries both slot counts). The call allocates and
    returns its own ``[B*next_n, max_model_len]`` logits; positions a row does not see are
    unspecified there, so only the valid positions are checked.

    ``flatten``: vLLM's sm_90 path for next_n DeepGEMM does not serve: ``B*next_n`` requests of
    next_n 1 (q as ``[B*next_n, 1, H, D]``, lengths ``[B*next_n, 1]``, block-table rows
    repeated, built once outside the timed calls), the same logits row for row.
    """
    import deep_gemm

    lens = inputs["context_lens"]
    if lens.dim() == 1:  # the 1-D form, expanded to vLLM's 2-D layout (same visibility)
        offsets = torch.arange(next_n, device=lens.device, dtype=torch.int32) - (next_n - 1)
        lens = (lens[:, None] + offsets[None, :]).clamp_min(0).to(torch.int32)
    lens = lens.contiguous()
    q, q_sf, kv, w, table, mml = (inputs["q_fp8"].contiguous(), inputs["q_scale"], inputs["kv_cache"],
                                  inputs["weights"], inputs["kv_indices"], inputs["max_model_len"])
    if flatten:
        b, n, h, d = q.shape
        q = q.reshape(b * n, 1, h, d)
        q_sf = None if q_sf is None else q_sf.reshape(b * n, 1, h)
        lens = lens.reshape(b * n, 1).contiguous()
        table = table.repeat_interleave(n, dim=0).contiguous()
    schedule = deep_gemm.get_paged_mqa_logits_metadata(lens, inputs["kv_block_size"], slots)
    logits_dtype = inputs["out_logits"].dtype
    if q_sf is None and logits_dtype == torch.float32:
        def run() -> torch.Tensor:
            return deep_gemm.fp8_paged_mqa_logits(q, kv, w, lens, table, schedule, mml, False)
    else:
        q_in = (q if q_sf is None else q.view(torch.float4_e2m1fn_x2), None if q_sf is None else q_sf.contiguous())

        def run() -> torch.Tensor:
            return deep_gemm.fp8_fp4_paged_mqa_logits(q_in, kv, w, lens, table, schedule, mml, False, logits_dtype)

    return run


def deepgemm_flattens(shape: Shape) -> bool:
    """Whether DeepGEMM is timed flattened to next_n 1 for this shape (see the module docstring)."""
    return shape.shape_key.next_n not in DEEPGEMM_NEXT_N


def deepgemm_calls(workload: Workload) -> list[Callable[[], torch.Tensor]]:
    sms = torch.cuda.get_device_properties(workload.device).multi_processor_count
    flatten = deepgemm_flattens(workload.shape)
    tries = [sms // 2, sms] if workload.shape.shape_key.next_n == 4 else [sms]
    error = None
    for slots in tries:
        try:
            calls = [deepgemm_runner(inp, workload.shape.shape_key.next_n, slots, flatten) for inp in workload.inputs]
            calls[0]()
            torch.cuda.synchronize(workload.device)
            return calls
        except RuntimeError as exc:  # a schedule sized for the other DeepGEMM version
            error = exc
    raise error
