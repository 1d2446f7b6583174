"""The op as a registered torch operator: ``torch.ops.paged_mqa_logits.paged_mqa_logits``.

Its schema (:data:`SCHEMA`) is derived from the declaration of the op's arguments,
:data:`paged_mqa_logits.signature.OP`: ``out_logits`` is mutated in place and nothing is
returned, so ``torch.compile`` functionalises it with ``auto_functionalized`` and writes back into
the caller's buffer; ``context_hint=-1`` stands for "no hint" (``None`` in Python); ``config`` is
a JSON object of knobs (only with ``backend``).

The fake (meta) implementation writes nothing and returns nothing: the op's only output is the
in-place write. Validation runs in the real implementation, before anything is written.

:func:`paged_mqa_logits` here is the public entry point. It calls the registered op whenever
anything is tracing or intercepting torch calls (``torch.compile``/dynamo, ``make_fx``/export,
a ``TorchDispatchMode`` or ``TorchFunctionMode``, tensor subclasses such as FakeTensor); plain
eager calls take the direct path, which runs the very same implementation without the
dispatcher's ~3 us. Set ``PAGED_MQA_LOGITS_EAGER_VIA_OP=1`` (or :data:`EAGER_VIA_OP`) to route
eager calls through the op as well. Either way each check runs once per call. Graph capture
needs nothing special: the launch never synchronises and compiles nothing once
:func:`paged_mqa_logits.warmup` has run.
"""

from __future__ import annotations

import contextvars
import os
from typing import NamedTuple

import torch

from . import op as _op
from .problem import LaunchArgs
from .signature import NO_HINT, OP, OpSignature
from .errors import env_flag

NAMESPACE = "paged_mqa_logits"
SCHEMA = OP.schema()

#: route eager calls through the dispatcher too (tracing and modes always go through it)
EAGER_VIA_OP = env_flag("PAGED_MQA_LOGITS_EAGER_VIA_OP", os.environ.get("PAGED_MQA_LOGITS_EAGER_VIA_OP"))


def define(library: torch.library.Library, signature: OpSignature, implementation) -> torch._ops.OpOverload:
    """Define ``signature``'s op in ``library``: ``implementation(values)`` (the call's Python
    values by argument name) serves every device, and a fake that writes nothing stands in for
    it under tracing. Returns the op."""
    library.define(signature.schema())

    def kernel(*args, **kwargs) -> None:
        implementation(signature.decode(args, kwargs))

    def fake(*args, **kwargs) -> None:
        return None

    kernel.__signature__ = fake.__signature__ = signature.implementation
    # CompositeExplicitAutograd: one kernel for every device (CPU, CUDA, ROCm); the backend
    # picks the device-specific launch. No autograd formula: logits feed a top-k, not a backward.
    library.impl(signature.name, kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{library.ns}::{signature.name}", fake, lib=library)
    return getattr(getattr(torch.ops, library.ns), signature.name).default


class _HandedOver(NamedTuple):
    """A call the entry point hands to the registered op, with what it checked (the options)
    and built (``args``, if anything) for it: the implementation does not do them again."""

    values: dict
    args: LaunchArgs | None


_HANDED_OVER: contextvars.ContextVar[_HandedOver | None] = contextvars.ContextVar("handed_over", default=None)


def _implementation(values: dict) -> None:
    handed_over = _HANDED_OVER.get()
    if handed_over is not None and OP.same_call(handed_over.values, values):
        _op.run(values, handed_over.args, options_checked=True)
    else:
        _op.run(values)


# A plain Library definition rather than @torch.library.custom_op: the latter's Python wrapper
# costs ~40 us per eager call on CPU, the plain dispatcher path ~3 us (measured, torch 2.13).
_LIB = torch.library.Library(NAMESPACE, "DEF")
op = define(_LIB, OP, _implementation)


def must_use_op(out_logits) -> bool:
    """True when a direct call would be invisible to whatever is watching torch calls (the
    indexer step's entry point asks it too, of the logits buffer it writes)."""
    return (
        EAGER_VIA_OP
        or type(out_logits) is not torch.Tensor  # FakeTensor, FunctionalTensor, other subclasses
        or torch._C._len_torch_dispatch_stack() > 0  # make_fx, FakeTensorMode, other dispatch modes
        or torch._C._is_torch_function_mode_enabled()  # TorchFunctionMode (incl. `with torch.device(..)`)
    )


def call(values: dict, args: LaunchArgs | None = None) -> torch.Tensor:
    """Run one call given by argument name (every argument of :data:`signature.OP`) on the path
    the caller's context needs (the registered op, or the direct eager implementation); returns
    ``out_logits``. ``args``: the call validated already, by a wrapper that needed its problem."""
    out_logits = values["out_logits"]
    compiling = torch.compiler.is_compiling()
    if not compiling and not must_use_op(out_logits):
        return _op.run(values, args)
    # checked before crossing the schema, where -1 means "no hint" and anything but a str config
    # or a bool clean_logits would fail with the dispatcher's error instead of the op's
    _op.check_options(values["context_hint"], values["clean_logits"], values["backend"], values["config"])
    positional, keywords = OP.encode(values)
    if compiling:  # the graph's run of the op checks again: this check ran while tracing
        op(*positional, **keywords)
        return out_logits
    token = _HANDED_OVER.set(_HandedOver(values, args))
    try:
        op(*positional, **keywords)
    finally:
        _HANDED_OVER.reset(token)
    return out_logits


def paged_mqa_logits(
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
    q_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """FP8 (or MXFP4) paged MQA logits, written into ``out_logits`` (returned). Same contract and arguments
    as :func:`paged_mqa_logits.op.paged_mqa_logits_eager`; works under ``torch.compile(fullgraph=True)``
    and inside CUDA/HIP graph capture."""
    # Spelled out for readers and tools: upstream's positional order, the keywords vLLM passes.
    # tests/test_signature.py keeps the parameters and the forwarded names equal to signature.OP.
    # Named one by one, not as locals(): torch 2.11's Dynamo cannot trace locals(), and this
    # function runs inside torch.compile(fullgraph=True).
    return call(dict(q_fp8=q_fp8, kv_cache=kv_cache, weights=weights, out_logits=out_logits, context_lens=context_lens,
                     kv_indices=kv_indices, max_model_len=max_model_len, Preshuffle=Preshuffle, KVBlockSize=KVBlockSize,
                     context_hint=context_hint, clean_logits=clean_logits, backend=backend, config=config,
                     q_scale=q_scale))


paged_mqa_logits.__doc__ += "\n\n" + (_op.paged_mqa_logits_eager.__doc__ or "")

__all__ = ["paged_mqa_logits", "op", "SCHEMA", "EAGER_VIA_OP", "NO_HINT", "call", "define", "must_use_op"]
