"""The op: validate once -> problem key -> dispatch -> launch."""

from __future__ import annotations

import inspect
from collections.abc import Mapping

import torch

from . import backends, dispatch
from .problem import LaunchArgs, row_lengths
from . import validate
from .signature import OP, getter
from .validate import PagedMQAArgumentError, build_launch_args

__all__ = ["paged_mqa_logits_eager", "run", "build_launch_args", "launch", "PagedMQAArgumentError"]


#: the arguments that steer the launch; every other argument describes the call and is a
#: parameter of ``validate.build_launch_args`` (tests/test_signature.py checks that none is missing)
LAUNCH_OPTIONS = ("backend", "config")
#: what ``build_launch_args`` takes from a call, in its parameters' order
_DESCRIBING = getter(inspect.signature(validate.build_launch_args).parameters)


def run(values: Mapping, args: LaunchArgs | None = None, *, options_checked: bool = False) -> torch.Tensor:
    """The eager implementation of one call given by argument name (every argument of
    :data:`signature.OP`): check the launch options, validate the call into :class:`LaunchArgs`,
    dispatch and launch; returns ``out_logits``. Each check runs once per call: ``args`` is the
    call validated already (a wrapper that needed its problem first), ``options_checked`` says
    the caller checked the options (the entry point does before handing a call to the torch op).
    ``context_hint`` is checked with the call, by ``build_launch_args``."""
    backend, config, clean_logits = values["backend"], values["config"], values["clean_logits"]
    if not options_checked:
        check_options(None, clean_logits, backend, config)
    if args is None:
        args = validate.build_launch_args(*_DESCRIBING(values))
    _launch(args, backend, config)
    return values["out_logits"]


def paged_mqa_logits_eager(*args, **kwargs) -> torch.Tensor:
    """FP8 paged MQA logits of the sparse-attention indexer, written into ``out_logits`` and
    returned.

    ``logits[b*next_n + j, p] = kv_scale[b, p] * sum_h weights[b*next_n + j, h] *
    relu(dot(q_fp8[b, j, h, :], K[b, p, :]))`` in fp32 (``relu`` = IEEE maxNum with 0) for every
    position ``p`` the row sees (``p < row_len(b, j)``, ``p < max_model_len``); see ``problem.py``
    for ``row_len``. Positions a row does not see are left as passed (unless cleaning). Block ids
    a sequence walks must lie in ``[0, num_blocks)`` (checked on CPU, and on devices with
    ``PAGED_MQA_LOGITS_CHECK=1``; unchecked ones are clamped).
    """
    return run(OP.bind(args, kwargs))


# the arguments are signature.OP's: its signature, and its docs below the contract
paged_mqa_logits_eager.__signature__ = OP.python
paged_mqa_logits_eager.__doc__ += "\n" + OP.arguments_doc()


def check_options(context_hint, clean_logits, backend, config) -> None:
    """:func:`validate.check_options` against the registered backends."""
    validate.check_options(context_hint, clean_logits, backend, config, backends.names())


def launch(args: LaunchArgs, *, backend: str | None = None, config: dict | None = None) -> None:
    """Dispatch validated arguments (``args.clean_logits`` decided with them); the path shared by
    the op, the bench and the tuner.

    Dispatched calls fall back down the chain when the chosen backend's launch raises (see
    :func:`dispatch.record_failure`), except during CUDA graph capture, where the error
    propagates (a fallback would record a different graph than the one warmed up). A forced
    ``backend`` raises its errors as they are; its ``config`` must pass ``check_config``.
    """
    check_options(None, args.clean_logits, backend, config)
    _launch(args, backend, config)


def _launch(args: LaunchArgs, backend: str | None, config: dict | None) -> None:
    """Launch the chosen kernel; with ``args.clean_logits``, the tail kernel after it unless the
    chosen kernel writes the tails itself (:func:`backends.kernel_writes_tails`)."""
    if args.problem.rows == 0 or args.max_model_len == 0:
        return
    if backend is None:
        chosen, knobs = _launch_dispatched(args)
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
    if args.clean_logits and not backends.kernel_writes_tails(chosen, args.problem, knobs):
        clean(args)


#: errors that say nothing about the backend (bad input, a transient lack of memory): raised, never
#: remembered as the backend's failure
_NOT_A_BACKEND_FAILURE = (PagedMQAArgumentError, MemoryError, torch.OutOfMemoryError)


def _launch_dispatched(args: LaunchArgs) -> tuple[backends.Backend, dict]:
    """Launch the dispatched choice; on a compile or launch error fall back down the chain
    (each failed choice is remembered, so the loop ends when the chain is exhausted). Returns
    the backend and the knobs that ran."""
    problem, target = args.problem, args.target
    choice = dispatch.choose(problem, target)
    while True:
        try:
            chosen = backends.get(choice.backend)
            chosen.launch(args, choice.config)
            return chosen, choice.config
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
    """Set ``[valid_end, max_model_len)`` of every row to ``-inf``; no host sync. On a GPU one
    kernel writes only the tails (:mod:`.backends.clean_tail`); CPU tensors take a masked fill."""
    if args.out.device.type != "cpu":
        from .backends.clean_tail import clean_tail  # Triton loads with the first GPU call, not with the package

        clean_tail(args)
        return
    rows, width = args.problem.rows, args.max_model_len
    valid_end = row_lengths(args.context_lens, args.problem.shape_key.next_n).reshape(-1).clamp_max(args.visible_width)
    target = args.out[:rows, :width]
    cols = torch.arange(width, device=target.device)
    target.masked_fill_(cols[None, :] >= valid_end[:, None], float("-inf"))
