"""``explain``: what dispatch would pick for a problem, with no GPU and no tensors; for the
logits op (:func:`explain`) and for the top-k op (:func:`explain_topk`).

A problem is described by the quantities the op's arguments carry, stated as numbers (``batch``,
``next_n``, ``heads``, ``head_dim`` for ``q_fp8``'s shape, ``arch`` and ``cu_num`` for its
device, ``kv_block_size`` for ``KVBlockSize``, ...): the keywords of :func:`describe_problem`
and :func:`explain` are those :data:`paged_mqa_logits.signature.OP` declares.
"""

from __future__ import annotations

import inspect

from . import arch as arch_mod
from . import dispatch, table
from .errors import PagedMQAArgumentError
from .problem import SHAPE_KEY_COLUMNS, Problem, ShapeKey, Target, TopkKey
from .signature import OP
from .top_k.backends import TopkChoice, decide
from .top_k.validate import MAX_K
from .validate import arch_rule, check_problem, logits_dtype_rule, next_n_rule

#: the keywords of a described problem, with the described call's defaults
DESCRIPTION = OP.description()
_NAMES = {name: f"`{name}`" for name in DESCRIPTION.parameters}
#: the quantities the op's rules judge (``check_problem``'s parameters)
_RULED = tuple(name for name in inspect.signature(check_problem).parameters if name in DESCRIPTION.parameters)
_TARGET = ("arch", "cu_num")


def known_archs() -> set[str]:
    """Archs a problem may be described for: the arch table's and those the tuned tables name."""
    return set(arch_mod.USUAL_CU_NUM) | {row.arch for row in table.table().values()}


def describe_problem(**description) -> Problem:
    """The :class:`~paged_mqa_logits.problem.Problem` a call with these properties has, after
    the op's argument rules (:class:`~paged_mqa_logits.PagedMQAArgumentError` names the
    keyword that breaks one; ``arch`` must be one of :func:`known_archs`).

    A problem holds no device: :func:`explain` judges it on the described target of its chip
    (:meth:`~paged_mqa_logits.problem.Target.described`), so a CPU machine can ask what a
    gfx950 with 256 CUs would run.
    """
    bound = DESCRIPTION.bind(**description)
    bound.apply_defaults()
    values = dict(bound.arguments, arch=arch_mod.normalise_arch(bound.arguments["arch"]))
    check_problem(**{name: values[name] for name in _RULED}, names=_NAMES, prefix="paged_mqa_logits.explain: ",
                  known_archs=known_archs())
    shape_key = ShapeKey(**{name: values.pop(name) for name in SHAPE_KEY_COLUMNS})
    target = Target.described(*(values.pop(name) for name in _TARGET))
    values["max_model_len"] = values["max_model_len"] or values["context"] or 32768
    return Problem.of(shape_key, target, **values)


def explain(**description) -> dispatch.Choice:
    """The :class:`~paged_mqa_logits.dispatch.Choice` a call with these properties gets on a
    described ``arch`` with ``cu_num`` CUs, judged on arch and shapes only, not on what this
    machine could launch (the keywords and their rules are :func:`describe_problem`'s)."""
    problem = describe_problem(**description)
    return dispatch.decide(problem, target=Target.described(problem.arch, problem.cu_num))


# the keywords are signature.OP's quantities: their signature, and their docs
describe_problem.__signature__ = explain.__signature__ = DESCRIPTION
describe_problem.__doc__ += "\n" + OP.quantities_doc()


def check_topk(*, arch: str, cu_num: int, batch: int, next_n: int, context: int, k: int, logits_dtype: str = "fp32",
               names: dict[str, str] | None = None, prefix: str = "paged_mqa_logits.explain: ") -> None:
    """The top-k op's rules (``top_k/validate.py``) on a described call: each violation raises
    :class:`~paged_mqa_logits.PagedMQAArgumentError` naming the argument (as ``names`` calls it),
    the expected and the actual value."""
    names = names or {}
    rules = [("arch", arch_rule(arch, known_archs()), arch),
             ("cu_num", None if cu_num >= (0 if arch == "cpu" else 1) else "an int >= 1", cu_num),
             ("batch", None if batch >= 1 else "an int >= 1", batch), ("next_n", next_n_rule(next_n), next_n),
             ("context", None if context >= 1 else "an int >= 1 (the row width)", context),
             ("k", None if 1 <= k <= MAX_K else f"an int in 1..{MAX_K}", k),
             ("logits_dtype", logits_dtype_rule(logits_dtype), repr(logits_dtype))]
    for field, expected, got in rules:
        if expected is not None:
            raise PagedMQAArgumentError(f"{prefix}argument {names.get(field, f'`{field}`')}: expected {expected}, "
                                        f"got {got}")


def explain_topk(*, arch: str, cu_num: int, batch: int, next_n: int = 1, context: int, k: int = 2048,
                 logits_dtype: str = "fp32") -> TopkChoice:
    """The :class:`~paged_mqa_logits.top_k.backends.TopkChoice` (backend, knobs, rule, source) a
    ``paged_mqa_logits.topk`` call over ``batch * next_n`` rows of width ``context`` gets on a
    described ``arch`` with ``cu_num`` CUs, after the op's rules (:func:`check_topk`)."""
    arch = arch_mod.normalise_arch(arch)
    check_topk(arch=arch, cu_num=cu_num, batch=batch, next_n=next_n, context=context, k=k, logits_dtype=logits_dtype)
    return decide(arch, cu_num, TopkKey(rows=batch * next_n, k=k, logits_dtype=logits_dtype), context)
