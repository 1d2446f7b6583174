"""``explain``: what dispatch would pick for a problem, with no GPU and no tensors."""

from __future__ import annotations

from . import dispatch
from .arch import normalise_arch
from .problem import HEAD_DIM, Problem


def explain(
    *,
    arch: str,
    cu_num: int,
    batch: int,
    next_n: int,
    heads: int,
    head_dim: int = HEAD_DIM,
    kv_block_size: int = 64,
    preshuffle: bool = False,
    context: int | None = None,
    lens_2d: bool = True,
    max_model_len: int | None = None,
) -> dispatch.Choice:
    """The :class:`~paged_mqa_logits.dispatch.Choice` a call with these properties gets.

    The problem is described as if its tensors lived on a GPU of ``arch`` (``cpu`` for CPU
    tensors), so a CPU machine can ask what a gfx950 with 256 CUs would run.
    """
    arch = normalise_arch(arch)
    problem = Problem(
        arch=arch, cu_num=cu_num, batch=batch, next_n=next_n, heads=heads, head_dim=head_dim,
        kv_block_size=kv_block_size, preshuffle=preshuffle, context=context, lens_2d=lens_2d,
        fp8="fnuz" if arch == "gfx942" else "fn", device_type="cpu" if arch == "cpu" else "cuda",
        max_model_len=max_model_len or context or 32768, hypothetical=True,
    )
    return dispatch._decide(problem)
