"""``explain``: what dispatch would pick for a problem, with no GPU and no tensors."""

from __future__ import annotations

from . import arch as arch_mod
from . import dispatch, table
from .problem import HEAD_DIM, Problem, ShapeKey, Target
from .validate import check_problem

_NAMES = {field: f"`{field}`" for field in ("arch", "cu_num", "batch", "next_n", "heads", "head_dim",
                                            "kv_block_size", "context")}


def known_archs() -> set[str]:
    """Archs a problem may be described for: the arch table's and those the tuned tables name."""
    return set(arch_mod.USUAL_CU_NUM) | {row.arch for row in table.table().values()}


def describe_problem(
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
) -> Problem:
    """The :class:`~paged_mqa_logits.problem.Problem` a call with these properties has, after
    the op's argument rules (:class:`~paged_mqa_logits.PagedMQAArgumentError` names the
    keyword that breaks one; ``arch`` must be one of :func:`known_archs`).

    A problem holds no device: :func:`explain` judges it on the described target of its chip
    (:meth:`~paged_mqa_logits.problem.Target.described`), so a CPU machine can ask what a
    gfx950 with 256 CUs would run.
    """
    arch = arch_mod.normalise_arch(arch)
    check_problem(arch=arch, cu_num=cu_num, batch=batch, next_n=next_n, heads=heads, head_dim=head_dim,
                  kv_block_size=kv_block_size, preshuffle=preshuffle, context=context, names=_NAMES,
                  prefix="paged_mqa_logits.explain: ", known_archs=known_archs())
    shape_key = ShapeKey(heads=heads, head_dim=head_dim, kv_block_size=kv_block_size, preshuffle=preshuffle,
                         batch=batch, next_n=next_n)
    return Problem.of(shape_key, Target.described(arch, cu_num), context=context, lens_2d=lens_2d,
                      max_model_len=max_model_len or context or 32768)


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
    """The :class:`~paged_mqa_logits.dispatch.Choice` a call with these properties gets on a
    described ``arch`` with ``cu_num`` CUs, judged on arch and shapes only, not on what this
    machine could launch (the arguments and their rules are :func:`describe_problem`'s)."""
    problem = describe_problem(
        arch=arch, cu_num=cu_num, batch=batch, next_n=next_n, heads=heads, head_dim=head_dim,
        kv_block_size=kv_block_size, preshuffle=preshuffle, context=context, lens_2d=lens_2d,
        max_model_len=max_model_len)
    return dispatch.decide(problem, target=Target.described(problem.arch, problem.cu_num))
